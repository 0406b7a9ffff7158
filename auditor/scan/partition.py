"""A Spark executor gets nothing from the driver but picklable values, yet must run the
checks' own drivers against one id range, on connections of its own; a partition is that
unit of work, the same when the in-process engine runs it.

One partition of a scan: its own ZooKeeper session and bookie connections, the checks' drivers.

This is what a Spark task (or the in-process engine) runs for one id range or one batch
of ledgers to re-check. It is the checks' own drivers, given a context restricted to the
range, with marks held back for the scan's driver and each ledger's outcome handed to a
sink (the coverage dataset). With the Pulsar audit in the scan, a range's partition
observes its ledgers against Pulsar's references (read once on the driver and shipped in
`ScanSpec.pulsar`) after its other checks, with their verdicts, and sends back a
`PulsarPartial`; the driver merges them, adds the referenced ids no partition saw and
re-checks the candidates (`auditor.scan.job`). Everything here is picklable or built
from picklable parts: Spark ships `ScanSpec` to the executors and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
from array import array
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from auditor.analysis.pulsar_run import ledger_domains
from auditor.checks.context import CheckContext, open_context
from auditor.checks.findings import Check, CheckReport, LedgerOutcome, PendingMark, Violation
from auditor.checks.metadata_run import run_metadata_check
from auditor.checks.placement_run import run_placement_check
from auditor.checks.progress import reporting_progress
from auditor.checks.pulsar_audit import PulsarAuditor, PulsarPartial
from auditor.checks.pulsar_audit_run import observe_partition, verdicts_of
from auditor.checks.replicas_run import ReplicasRun
from auditor.config import AuditorConfig
from auditor.metadata.cluster import ClusterTarget, connect
from auditor.metadata.ledger_tree import IdRange
from auditor.metadata.pulsar.refs import PulsarRefs
from auditor.scan.progress import PartitionProgress

#: Checks that walk the ledgers, so run per partition (grace reads only the marks
#: and runs once, on the scan's driver); the Pulsar pass last, on the others' verdicts.
PARTITIONED = (Check.METADATA, Check.PLACEMENT, Check.REPLICAS, Check.PULSAR)

Sink = Callable[[LedgerOutcome], None]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PulsarPass:
    """The Pulsar audit's inputs every partition shares: Pulsar's references and the
    under-replication marks (read once, on the scan's driver), the audit's clock and the
    orphans' grace (ms)."""

    refs: PulsarRefs
    now_ms: int
    grace_ms: int
    marked: frozenset[int] = frozenset()

    def auditor(self) -> PulsarAuditor:
        return PulsarAuditor(self.refs, now_ms=self.now_ms, grace_ms=self.grace_ms)


@dataclass(frozen=True, slots=True)
class ScanSpec:
    """What every partition needs to know, in one picklable value."""

    target: ClusterTarget
    config: AuditorConfig
    checks: tuple[Check, ...]
    #: Whether partitions report per-ledger outcomes (the coverage dataset).
    coverage: bool = True
    log_level: str = "WARNING"
    #: With `Check.PULSAR` in `checks`: what its pass needs (set by the scan's driver).
    pulsar: PulsarPass | None = None

    def with_bookie_cap(self, concurrent_partitions: int) -> ScanSpec:
        """The per-bookie request cap split across the partitions that run at once.

        Each partition has its own connections, so without this a job of N
        concurrent tasks would put N times the configured cap on every bookie.
        """
        checks = self.config.checks
        share = max(1, checks.bookie_max_in_flight // max(1, concurrent_partitions))
        return replace(
            self, config=replace(self.config, checks=replace(checks, bookie_max_in_flight=share))
        )


@dataclass
class PartitionResult:
    """What a partition sends back to the driver (small: no per-ledger rows)."""

    reports: dict[Check, CheckReport] = field(default_factory=dict)
    #: Replicas check: ledgers whose bookies did not answer, for the next retry stage.
    retry: list[int] = field(default_factory=list)
    marks: list[PendingMark] = field(default_factory=list)
    #: The Pulsar pass over the range (its first stage only; picklable, without the refs).
    pulsar: PulsarPartial | None = None
    #: The Pulsar pass's `metadata_invalid` violations (the range's undecodable ledgers).
    pulsar_invalid: list[Violation] = field(default_factory=list)


@asynccontextmanager
async def _partition_context(
    spec: ScanSpec, id_range: IdRange | None, sink: Sink | None
) -> AsyncIterator[tuple[CheckContext, PartitionResult]]:
    result = PartitionResult()
    async with (
        connect(spec.target) as (store, manager),
        open_context(store, spec.target.root, manager, spec.config, id_range=id_range) as ctx,
    ):
        ctx.on_ledger = sink if spec.coverage else None
        # Marks are always collected (marks.json lists them); only the driver writes.
        ctx.deferred_marks = result.marks
        yield ctx, result


def partitioned_checks(spec: ScanSpec) -> list[Check]:
    """The checks each first-stage partition runs, in the order it runs them."""
    return [c for c in PARTITIONED if c in spec.checks]


@contextmanager
def _reporting(progress: PartitionProgress | None) -> Iterator[None]:
    """The checks' progress hook set to `progress` (and left alone without one: a daemon's
    hook around an in-process scan keeps hearing from it)."""
    if progress is None:
        yield
        return
    with reporting_progress(progress.tick):
        yield
    progress.finish()


async def scan_range(
    spec: ScanSpec,
    id_range: IdRange,
    sink: Sink | None,
    progress: PartitionProgress | None = None,
) -> PartitionResult:
    """The first stage over one id range: every partitioned check, in turn."""
    async with _partition_context(spec, id_range, sink) as (ctx, result):
        with _reporting(progress):
            for check in partitioned_checks(spec):
                if check is Check.PULSAR:
                    if spec.pulsar is None:
                        raise ValueError("a scan with the Pulsar audit needs ScanSpec.pulsar")
                    p = spec.pulsar
                    result.pulsar, result.pulsar_invalid = await observe_partition(
                        ctx,
                        p.refs,
                        now_ms=p.now_ms,
                        grace_ms=p.grace_ms,
                        verdicts=verdicts_of(result.reports.values(), p.marked),
                        # each ledger's risk, as pulsar-audit joins it (the at-risk table)
                        risk_of=await ledger_domains(ctx),
                    )
                    if progress is not None:
                        progress.end_check(result.pulsar.ledgers_seen)
                    continue
                if check is Check.METADATA:
                    result.reports[check] = await run_metadata_check(ctx)
                elif check is Check.PLACEMENT:
                    result.reports[check] = await run_placement_check(ctx)
                else:
                    run = ReplicasRun(ctx)
                    await run.begin()
                    await run.first_pass()
                    result.retry = list(run.retry)
                    result.reports[check] = run.finish()
                if progress is not None:
                    report = result.reports[check]
                    progress.end_check(
                        report.ledgers_checked + sum(report.ledgers_skipped.values())
                    )
    return result


async def recheck(
    spec: ScanSpec,
    ledger_ids: Iterable[int],
    attempt: int,
    sink: Sink | None,
    progress: PartitionProgress | None = None,
) -> PartitionResult:
    """A retry stage of the replicas check over some of the ledgers that did not answer."""
    async with _partition_context(spec, None, sink) as (ctx, result):
        with _reporting(progress):
            run = ReplicasRun(ctx)
            await run.begin()
            await run.retry_pass(array("q", ledger_ids), attempt)
            result.retry = list(run.retry)
            result.reports[Check.REPLICAS] = run.finish()
    return result


def run_blocking(coro: Coroutine[Any, Any, T], log_level: str) -> T:
    """Runs a partition's coroutine on a fresh event loop (a Spark Python worker's thread)."""
    from auditor.logs import configure_logging

    configure_logging("json", level=log_level)
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    return asyncio.run(coro)
