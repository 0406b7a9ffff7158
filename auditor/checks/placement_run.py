"""The placement check's driver: walk every ledger, judge closed ones, report and maybe mark.

Only metadata is needed (no bookie is asked anything), so the walk's pipelined
ZooKeeper reads are the whole cost. Rack sources are loaded once, before the
walk, so a broken source stops the check before any verdict rather than
halfway; locations are cached per bookie, so memory follows the number of
bookies, not of ledgers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from auditor.checks.context import CheckContext
from auditor.checks.findings import (
    Category,
    Check,
    CheckReport,
    LedgerOutcome,
    Outcome,
    SkipReason,
    Violation,
    metadata_invalid,
)
from auditor.checks.placement import (
    LedgerPlacement,
    PlacementPolicy,
    PolicyKind,
    analyse_ledger,
    policy_kind,
    skip_reason,
)
from auditor.checks.progress import Progress
from auditor.config import BookKeeperConfig
from auditor.errors import FormatError
from auditor.metadata.registry import all_known_bookies
from auditor.metadata.walk import LedgerRecord
from auditor.topology.locations import region_of
from auditor.topology.racks import open_rack_resolver


async def _known_bookies(ctx: CheckContext) -> frozenset[str]:
    """Registered bookies plus every cookie (cookies outlive their bookies)."""
    registered = await ctx.registered()
    return registered.available | await all_known_bookies(ctx.zk, ctx.root)


def cluster_regions(
    known: frozenset[str], locations: dict[str, str], default: str
) -> frozenset[str]:
    """Known regions of the cluster's bookies, down ones included.

    A region whose bookies are all down still counts: ensembles placed there
    were meant to span it, and they must not look fine just because it is away.
    """
    regions = {region_of(locations.get(b, default)) for b in known}
    return frozenset(r for r in regions if r is not None)


def _invalid(rec: LedgerRecord) -> Violation:
    reason = rec.error.reason if rec.error is not None else "metadata missing"
    return metadata_invalid(rec.ledger_id, rec.path, rec.znode_version, reason)


def _log_placement(log: Any, found: LedgerPlacement, category: Category, rec: LedgerRecord) -> None:
    for seg in found.segments:
        v = seg.verdict
        fields: dict[str, Any] = {
            "ledger_id": found.ledger_id,
            "category": str(category),
            "policy": found.policy.value,
            "segment_first_entry": seg.first_entry_id,
            "ensemble": list(seg.ensemble),
            "write_quorum": found.write_quorum,
            "ack_quorum": found.ack_quorum,
            "adherence": v.adherence.name,
            "reason": v.reason,
            "metadata_version": rec.znode_version,
            "path": rec.path,
        }
        if v.window_start is not None:
            fields["window_start"] = v.window_start
            fields["window_bookies"] = list(v.window)
            fields["window_locations"] = list(v.window_locations)
        log.warning("placement violation", **fields)


def placement_policy(
    bk: BookKeeperConfig, known: frozenset[str], locations: dict[str, str]
) -> PlacementPolicy:
    """The configured policy; region-aware learns the cluster's regions from `known`."""
    policy = PlacementPolicy.from_config(bk)
    if policy_kind(bk.ensemblePlacementPolicy) is PolicyKind.REGIONAWARE:
        regions = cluster_regions(known, locations, policy.default_location)
        policy = PlacementPolicy.from_config(bk, cluster_regions=regions)
    return policy


Locate = Callable[[Iterable[str]], Awaitable[dict[str, str]]]
MarkFn = Callable[[CheckReport, int], Awaitable[object]]


async def judge_placement(
    records: AsyncIterator[LedgerRecord],
    policy: PlacementPolicy,
    locate: Locate,
    report: CheckReport,
    *,
    log: Any,
    outcome: Callable[[LedgerOutcome], None],
    mark: MarkFn | None,
    tick: Callable[[int], None] = lambda _: None,
) -> None:
    """The walk-independent part: judge each record, record the outcome, maybe mark.

    Records come from the live walk or from a snapshot; locations from the
    rack sources or from the snapshot's rack map; that is the whole difference.
    """
    for_check = Check.PLACEMENT
    async for rec in records:
        tick(rec.ledger_id)
        md = rec.metadata
        version = rec.znode_version
        if md is None:
            report.ledgers_checked += 1
            violation = _invalid(rec)
            log.warning(
                "metadata invalid",
                ledger_id=rec.ledger_id,
                category=str(Category.METADATA_INVALID),
                check=str(for_check),
                **violation.detail,
            )
            report.violations.append(violation)
            outcome(LedgerOutcome(for_check, rec.ledger_id, Outcome.VIOLATION, None, version))
            continue
        skip = skip_reason(md)
        if skip is not None:
            report.ledgers_skipped[str(skip)] += 1
            outcome(LedgerOutcome(for_check, rec.ledger_id, Outcome.SKIPPED, str(skip), version))
            continue
        report.ledgers_checked += 1
        found = analyse_ledger(md, policy, await locate(md.bookies()))
        category = found.category
        if category is None:
            outcome(LedgerOutcome(for_check, rec.ledger_id, Outcome.OK, None, version))
            continue
        _log_placement(log, found, category, rec)
        detail = found.detail() | {"metadata_version": version}
        report.violations.append(Violation(rec.ledger_id, category, None, detail))
        outcome(LedgerOutcome(for_check, rec.ledger_id, Outcome.VIOLATION, None, version))
        if mark is not None and category is Category.PLACEMENT_NOT_ADHERING:
            try:
                await mark(report, rec.ledger_id)
            except FormatError as exc:
                # As upstream: a failed repair mark is logged and changes nothing else.
                log.error(
                    "could not mark not-adhering ledger under-replicated",
                    ledger_id=rec.ledger_id,
                    error=str(exc),
                )


async def run_placement_check(ctx: CheckContext) -> CheckReport:
    """Judges every segment of every closed ledger against the configured policy."""
    report = ctx.new_report(Check.PLACEMENT)
    bk = ctx.config.bookkeeper
    kind = policy_kind(bk.ensemblePlacementPolicy)
    resolver = await open_rack_resolver(ctx.zk, ctx.root, ctx.config, log=ctx.log)
    # The known bookies in one go: one script batch up front, not one per ledger.
    known = await _known_bookies(ctx)
    policy = placement_policy(bk, known, await resolver.locations(sorted(known)))
    repair = bk.repairedPlacementPolicyNotAdheringBookieEnabled
    ctx.log.info(
        "placement check started",
        policy=kind.value,
        rack_sources=resolver.source_names,
        cluster_regions=sorted(policy.cluster_regions) if kind is PolicyKind.REGIONAWARE else None,
        repair=repair,
        mark=ctx.mark,
    )

    async def mark(report: CheckReport, ledger_id: int) -> object:
        return await ctx.mark_underreplicated(report, ledger_id, [])

    walker = ctx.walker()
    progress = Progress(
        ctx.log,
        str(Check.PLACEMENT),
        interval=ctx.config.checks.progress_interval,
        max_ledger_id=await walker.max_ledger_id(),
    )
    await judge_placement(
        walker.ledgers(concurrency=ctx.config.checks.ledger_concurrency),
        policy,
        resolver.locations,
        report,
        log=ctx.log,
        outcome=ctx.outcome,
        mark=mark if repair else None,
        tick=progress.tick,
    )
    if walker.stats.deleted_during_walk:
        report.ledgers_skipped[str(SkipReason.DELETED)] += walker.stats.deleted_during_walk
    report.finished_at = ctx.clock()
    ctx.log.info(
        "placement check finished",
        ledgers_checked=report.ledgers_checked,
        ledgers_skipped=dict(report.ledgers_skipped),
        counts=report.counts(),
        marked_underreplicated=len(report.marked_underreplicated),
    )
    return report
