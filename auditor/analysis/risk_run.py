"""The risk core needs every closed ledger's ensemble and where its bookies are, gathered
without asking any bookie, and the same judging has to run over the live cluster and over a
snapshot; that reading and loop are kept apart from the pure core.

The risk report's driver: walk the closed ledgers, locate their bookies, tally the risk.

Only metadata, the bookie registry and the rack sources are read; no bookie is
asked anything. In the daemon the walk reads the leader's metadata index
(`CheckContext.walker`), so a run costs no ZooKeeper read per ledger. The same
judging loop runs over a snapshot's rows (`auditor.analysis.whatif_run`), with
the snapshot's registry and locations.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Set

from auditor.analysis.risk import (
    DomainKey,
    LedgerRisk,
    RiskReport,
    ShapeRisk,
    WriteSets,
    domain_keys,
    place_of,
    shape_risk,
    write_sets,
)
from auditor.checks.context import CheckContext
from auditor.checks.findings import SkipReason
from auditor.checks.placement import skip_reason
from auditor.checks.placement_run import Locate
from auditor.metadata.registry import all_known_bookies
from auditor.metadata.walk import LedgerRecord
from auditor.topology.racks import open_rack_resolver_or_blind

#: Memoised answers kept at most (a few MB): enough for the ensembles in use at once.
MEMO = 16384


async def judge_risk(
    records: AsyncIterator[LedgerRecord],
    report: RiskReport,
    locate: Locate,
    available: Set[str],
) -> None:
    """Tallies every closed ledger of `records`; bookies not `available` are already gone."""
    lost: set[str] = set()
    unlocated: set[str] = set()
    #: Each bookie's failure domains, located once per run (bounded by the bookies).
    keys: dict[str, tuple[DomainKey, ...]] = {}
    #: Answers by (ack quorum, write sets): ledgers on the same bookies share them.
    memo: dict[tuple[int, WriteSets], ShapeRisk] = {}
    async for rec in records:
        md = rec.metadata
        if md is None:
            report.metadata_invalid += 1
            continue
        skip = skip_reason(md)
        if skip is not None:
            report.ledgers_skipped[str(skip)] += 1
            continue
        bookies = md.bookies()
        new = [b for b in bookies if b not in keys]
        if new:
            located = await locate(new)
            for b in new:
                place = place_of(located.get(b))
                keys[b] = domain_keys(b, place)
                if place.rack is None:
                    unlocated.add(b)
                if b not in available:
                    lost.add(b)
        shape = (md.ack_quorum, tuple(write_sets(md)))
        found = memo.get(shape)
        if found is None:
            if len(memo) >= MEMO:
                memo.clear()
            found = memo[shape] = shape_risk(shape[1], shape[0], keys.__getitem__, available)
        report.add(LedgerRisk(md.ledger_id, *found))
    report.lost_bookies = sorted(set(report.lost_bookies) | lost)
    report.unlocated_bookies = sorted(set(report.unlocated_bookies) | unlocated)


async def run_risk(ctx: CheckContext) -> RiskReport:
    """The risk of every closed ledger of the cluster of `ctx`, given today's bookies."""
    report = RiskReport(started_at=ctx.clock())
    resolver, report.racks_unreadable = await open_rack_resolver_or_blind(
        ctx.store, ctx.root, ctx.config, log=ctx.log
    )
    if report.racks_unreadable is not None:
        ctx.log.warning(
            "rack sources unreadable: every bookie unlocated", why=report.racks_unreadable
        )
    available = (await ctx.registered()).available
    known = available | await all_known_bookies(ctx.store, ctx.root)
    # The known bookies in one go (one script batch), as the placement check does.
    await resolver.locations(sorted(known))
    walker = ctx.walker()
    indexed = ctx.index is not None and ctx.index.ready.is_set()
    ctx.log.info(
        "risk report started",
        rack_sources=resolver.source_names,
        metadata="index" if indexed else str(ctx.store.kind),
    )
    await judge_risk(
        walker.ledgers(concurrency=ctx.config.checks.walk_window),
        report,
        resolver.locations,
        available,
    )
    if walker.stats.deleted_during_walk:
        report.ledgers_skipped[str(SkipReason.DELETED)] += walker.stats.deleted_during_walk
    report.finished_at = ctx.clock()
    ctx.log.info(
        "risk report finished",
        ledgers_checked=report.ledgers_checked,
        ledgers_at_risk={s.label: n for s, n in report.at_risk.counts.items()},
        domains_at_risk=report.domains_at_risk(),
        seconds=round(report.finished_at - report.started_at, 3),
    )
    return report
