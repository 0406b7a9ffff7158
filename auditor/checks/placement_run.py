"""Judging placement needs only metadata and where bookies are, which the live walk with the
rack sources and a snapshot with its rack map both supply; one driver judges records from
either.

The placement check's driver: walk every ledger, judge closed ones, report and maybe mark.

Only metadata is needed (no bookie is asked anything), so the walk's pipelined
ZooKeeper reads are the whole cost. Rack sources are loaded once, before the
walk, so a broken source stops the check before any verdict rather than
halfway; locations are cached per bookie, so memory follows the number of
bookies, not of ledgers.

`PlacementRun` (the drivers' one shape: see `auditor.checks`) judges records
whatever their source: `run_placement_check` feeds it the live walk and the
rack sources, a scan of a snapshot its rows and rack map.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from auditor.checks.context import CheckContext
from auditor.checks.findings import Category, Check, CheckReport, LedgerOutcome, Violation
from auditor.checks.placement import (
    LedgerPlacement,
    PlacementPolicy,
    PolicyKind,
    analyse_ledger,
    policy_kind,
    skip_reason,
)
from auditor.checks.progress import Progress
from auditor.checks.recorder import LogLine, RunRecorder
from auditor.config import BookKeeperConfig
from auditor.errors import FormatError
from auditor.metadata.registry import all_known_bookies
from auditor.metadata.walk import LedgerRecord
from auditor.topology.locations import region_of
from auditor.topology.racks import open_rack_resolver

__all__ = [
    "Locate",
    "MarkFn",
    "PlacementRun",
    "cluster_regions",
    "placement_policy",
    "run_placement_check",
]

Locate = Callable[[Iterable[str]], Awaitable[dict[str, str]]]
MarkFn = Callable[[CheckReport, int], Awaitable[object]]


async def _known_bookies(ctx: CheckContext) -> frozenset[str]:
    """Registered bookies plus every cookie (cookies outlive their bookies)."""
    registered = await ctx.registered()
    return registered.available | await all_known_bookies(ctx.store, ctx.root)


def cluster_regions(
    known: frozenset[str], locations: dict[str, str], default: str
) -> frozenset[str]:
    """Known regions of the cluster's bookies, down ones included.

    A region whose bookies are all down still counts: ensembles placed there
    were meant to span it, and they must not look fine just because it is away.
    """
    regions = {region_of(locations.get(b, default)) for b in known}
    return frozenset(r for r in regions if r is not None)


def placement_policy(
    bk: BookKeeperConfig, known: frozenset[str], locations: dict[str, str]
) -> PlacementPolicy:
    """The configured policy; region-aware learns the cluster's regions from `known`."""
    policy = PlacementPolicy.from_config(bk)
    if policy_kind(bk.ensemblePlacementPolicy) is PolicyKind.REGIONAWARE:
        regions = cluster_regions(known, locations, policy.default_location)
        policy = PlacementPolicy.from_config(bk, cluster_regions=regions)
    return policy


def _segment_lines(found: LedgerPlacement, category: Category, rec: LedgerRecord) -> list[LogLine]:
    """One "placement violation" line per deciding segment."""
    lines: list[LogLine] = []
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
        lines.append(("placement violation", fields))
    return lines


class PlacementRun:
    """Judges ledger records against one policy; records come from the live walk or a
    snapshot, locations from the rack sources or the snapshot's rack map: that is the
    whole difference between the two."""

    def __init__(
        self,
        recorder: RunRecorder,
        policy: PlacementPolicy,
        locate: Locate,
        *,
        mark: MarkFn | None = None,
    ) -> None:
        self.recorder = recorder
        self.policy = policy
        self.locate = locate
        #: Marks not-adhering ledgers (`repairedPlacementPolicyNotAdheringBookieEnabled`).
        self.mark = mark

    async def judge(self, rec: LedgerRecord) -> LedgerOutcome:
        """One ledger: judged, skipped or invalid (recorded once); marked when asked to."""
        recorder, md, version = self.recorder, rec.metadata, rec.znode_version
        if md is None:
            return recorder.metadata_invalid(rec)
        skip = skip_reason(md)
        if skip is not None:
            return recorder.skipped(rec.ledger_id, skip, version)
        found = analyse_ledger(md, self.policy, await self.locate(md.bookies()))
        category = found.category
        if category is None:
            return recorder.ok(rec.ledger_id, version)
        detail = found.detail() | {"metadata_version": version}
        outcome = recorder.violation(
            rec.ledger_id,
            version,
            [Violation(rec.ledger_id, category, None, detail)],
            lines=_segment_lines(found, category, rec),
        )
        if self.mark is not None and category is Category.PLACEMENT_NOT_ADHERING:
            try:
                await self.mark(recorder.report, rec.ledger_id)
            except FormatError as exc:
                # As upstream: a failed repair mark is logged and changes nothing else.
                recorder.log.error(
                    "could not mark not-adhering ledger under-replicated",
                    ledger_id=rec.ledger_id,
                    error=str(exc),
                )
        return outcome

    async def judge_all(
        self, records: AsyncIterator[LedgerRecord], *, tick: Callable[[int], None] = lambda _: None
    ) -> None:
        async for rec in records:
            tick(rec.ledger_id)
            await self.judge(rec)


async def run_placement_check(ctx: CheckContext) -> CheckReport:
    """Judges every segment of every closed ledger against the configured policy."""
    recorder = RunRecorder.for_context(ctx, Check.PLACEMENT)
    log = recorder.log
    bk = ctx.config.bookkeeper
    kind = policy_kind(bk.ensemblePlacementPolicy)
    resolver = await open_rack_resolver(ctx.store, ctx.root, ctx.config, log=ctx.log)
    for path, reason in resolver.problems:
        recorder.invalid_znode(path, reason, what="rack entry names no rack")
    # The known bookies in one go: one script batch up front, not one per ledger.
    known = await _known_bookies(ctx)
    policy = placement_policy(bk, known, await resolver.locations(sorted(known)))
    repair = bk.repairedPlacementPolicyNotAdheringBookieEnabled
    log.info(
        "placement check started",
        policy=kind.value,
        rack_sources=resolver.source_names,
        cluster_regions=sorted(policy.cluster_regions) if kind is PolicyKind.REGIONAWARE else None,
        repair=repair,
        mark=ctx.mark,
    )

    async def mark(report: CheckReport, ledger_id: int) -> object:
        return await ctx.mark_underreplicated(report, ledger_id, [])

    run = PlacementRun(recorder, policy, resolver.locations, mark=mark if repair else None)
    walker = ctx.walker()
    progress = Progress(
        log,
        str(Check.PLACEMENT),
        interval=ctx.config.checks.progress_interval,
        max_ledger_id=await walker.max_ledger_id(),
    )
    await run.judge_all(
        walker.ledgers(concurrency=ctx.config.checks.walk_window),
        tick=progress.tick,
    )
    report = recorder.finish(walker)
    log.info(
        "placement check finished",
        ledgers_checked=report.ledgers_checked,
        ledgers_skipped=dict(report.ledgers_skipped),
        counts=report.counts(),
        marked_underreplicated=len(report.marked_underreplicated),
    )
    return report
