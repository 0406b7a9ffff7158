"""However many places its partitions run in, a scan must re-check silent bookies, write
marks and report once, and exactly as an in-process check does; that one driver lives here.

The scan's driver: plan, stage, retry, mark once, summarise; the same for every engine.

1. Plan id ranges from listings of the ledger tree (no ledger is read here).
2. Stage 1: every range runs the partitioned checks (metadata, placement,
   replicas) on the engine; results come back as partial reports, the ids of
   ledgers whose bookies did not answer, and the marks the checks want.
3. Retry stages: after `checks.retry_delay`, those ledgers are checked again
   (BP-34's delayed re-check), up to `checks.retry_attempts` times; what is
   still silent on the last attempt is judged then.
4. The grace check reads the marks here, once (they are few, and listing them
   from every partition would only multiply the same reads).
5. Marks are written once, from here, through the caller's context, so the
   daemon's fencing and `--mark` apply exactly as for an in-process check.
6. The Pulsar audit (`Check.PULSAR`): Pulsar's references are read here before
   stage 1 and shipped to every range in `ScanSpec.pulsar`; each range's
   partition observes its ledgers after its other checks (with their verdicts)
   and sends back a `PulsarPartial`. Here they are merged, the replicas
   check's entry losses found only by a retry stage are added, referenced ids
   no partition saw become `missing` or `dangling_cursor`, and every candidate
   is looked at again (BP-34) before the report. Nothing is written: Pulsar's
   tree is only read.

The reports are merged per check into the same `CheckReport` an in-process
`check` produces; only the place the partitions ran differs. Invalid znodes
(a corrupt mark, a ledger znode beyond 2^63-1) are in them too: each partition
names the ones of its range, the grace check the corrupt marks, a snapshot's
cluster.json the ones its walk found; `summary.json` lists them per report.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from auditor.checks.context import CheckContext
from auditor.checks.findings import Category, Check, CheckReport, PendingMark, Violation
from auditor.checks.grace_run import run_grace_check
from auditor.checks.owners_run import attach_owners
from auditor.checks.pulsar_audit import LedgerFact, PulsarAudit, losses
from auditor.checks.pulsar_audit_run import (
    confirm_audit,
    finished,
    no_replica_ranges,
    pulsar_source,
    read_refs,
)
from auditor.metadata.ledger_tree import IdRange
from auditor.scan.engine import Engine
from auditor.scan.output import (
    MARKS,
    SUMMARY,
    marks_document,
    summary_document,
    violation_rows,
    write_json,
)
from auditor.scan.partition import PartitionResult, PulsarPass, ScanSpec
from auditor.scan.progress import reporting_stages
from auditor.scan.ranges import plan_ranges
from auditor.scan.snapshot import (
    CLUSTER,
    SnapshotCluster,
    SnapshotJudge,
    describe_cluster,
    invalid_znodes_of,
)

#: The checks a scan can run, in the order its summary lists them.
SCAN_CHECKS = (Check.PLACEMENT, Check.REPLICAS, Check.GRACE, Check.METADATA, Check.PULSAR)


@dataclass
class ScanResult:
    reports: list[CheckReport]
    ranges: list[IdRange]
    marks: list[PendingMark] = field(default_factory=list)
    marked: set[int] = field(default_factory=set)
    #: The Pulsar audit's findings and rollups, when it ran.
    pulsar: PulsarAudit | None = None

    @property
    def has_violations(self) -> bool:
        return any(r.has_violations for r in self.reports)

    @property
    def has_findings(self) -> bool:
        """Violations or invalid znodes in some report: what makes `scan` exit 1."""
        return any(r.has_findings for r in self.reports)


def _absorb(
    results: list[PartitionResult],
    reports: dict[Check, CheckReport],
    marks: list[PendingMark],
    pulsar: list[PartitionResult] | None = None,
) -> list[int]:
    retry: list[int] = []
    for res in results:
        if pulsar is not None and res.pulsar is not None:
            pulsar.append(res)
        for check, part in res.reports.items():
            if check in reports:
                reports[check].merge(part)
            else:
                reports[check] = part
        retry.extend(res.retry)
        marks.extend(res.marks)
    return sorted(retry)


async def run_scan(
    ctx: CheckContext,
    engine: Engine,
    spec: ScanSpec,
    *,
    partitions: int,
    out: Path | None = None,
) -> ScanResult:
    """Runs `spec.checks` over the cluster of `ctx`; writes DIR's files when `out` is given."""
    log = ctx.log.bind(engine=engine.name)
    ranges = await plan_ranges(ctx.store, ctx.root, ctx.manager, partitions)
    spec = spec.with_bookie_cap(engine.concurrency(len(ranges)))
    log.info(
        "scan planned",
        checks=[str(c) for c in spec.checks],
        partitions=len(ranges),
        bookie_cap_per_partition=spec.config.checks.bookie_max_in_flight,
    )
    reports: dict[Check, CheckReport] = {}
    marks: list[PendingMark] = []
    partitioned = [c for c in spec.checks if c is not Check.GRACE]
    retry: list[int] = []
    checks_cfg = spec.config.checks
    pulsar_parts: list[PartitionResult] = []
    if Check.PULSAR in spec.checks:
        spec = replace(spec, pulsar=await _read_pulsar(ctx, spec))
    async with reporting_stages(log, engine.progress, checks_cfg.progress_interval):
        if partitioned:
            retry = _absorb(await engine.scan_ranges(spec, ranges), reports, marks, pulsar_parts)
        for attempt in range(1, checks_cfg.retry_attempts + 1):
            if not retry:
                break
            log.info(
                "re-checking potentially faulty ledgers after a delay",
                ledgers=len(retry),
                delay_s=checks_cfg.retry_delay,
                attempt=attempt,
            )
            # The delay is the point (BP-34): give a slow or restarting bookie time.
            await asyncio.sleep(checks_cfg.retry_delay)
            retry = _absorb(await engine.recheck(spec, retry, attempt, partitions), reports, marks)
    if Check.GRACE in spec.checks:
        previous = ctx.on_ledger
        ctx.on_ledger = engine.sink
        try:
            reports[Check.GRACE] = await run_grace_check(ctx)
        finally:
            ctx.on_ledger = previous
    audit: PulsarAudit | None = None
    if spec.pulsar is not None:
        reports[Check.PULSAR], audit = await _pulsar_result(
            ctx, spec.pulsar, pulsar_parts, reports.get(Check.REPLICAS)
        )
    result = ScanResult([reports[c] for c in SCAN_CHECKS if c in reports], ranges, marks)
    result.pulsar = audit
    for report in result.reports:
        # Owners of flagged ledgers only, read by the driver: partitions never hold them.
        await attach_owners(ctx, report)
    for m in marks:
        if await ctx.mark_underreplicated(reports[m.check], m.ledger_id, list(m.missing)):
            result.marked.add(m.ledger_id)
    if out is not None:
        await engine.write_violations(violation_rows(result.reports))
        write_json(out / MARKS, marks_document(marks, result.marked))
        write_json(out / SUMMARY, summary_document(result.reports, result.pulsar))
    log.info(
        "scan finished",
        counts={str(r.check): r.counts() for r in result.reports},
        marks_wanted=len(marks),
        marked=len(result.marked),
    )
    return result


async def _read_pulsar(ctx: CheckContext, spec: ScanSpec) -> PulsarPass:
    """Pulsar's references and the marks (under-replicated ledgers, as `pulsar-audit`
    counts them), read once here for every partition."""
    async with pulsar_source(ctx) as source:
        refs = await read_refs(source)
    marked = frozenset(await ctx.urm.marked_ids())
    grace_ms = int(spec.config.checks.pulsar_orphan_grace * 1000)
    ctx.log.info(
        "pulsar references read",
        referenced_ledgers=len(refs.refs),
        managed_ledgers=len(refs.managed_ledgers),
        schemas=len(refs.schemas),
        bad_znodes=len(refs.bad_znodes),
        orphan_grace_s=grace_ms / 1000,
    )
    return PulsarPass(refs, int(ctx.clock() * 1000), grace_ms, marked)


async def _pulsar_result(
    ctx: CheckContext,
    pulsar: PulsarPass,
    parts: list[PartitionResult],
    replicas: CheckReport | None,
) -> tuple[CheckReport, PulsarAudit]:
    """The partitions' Pulsar passes merged, completed and re-checked into the report."""
    auditor = pulsar.auditor()
    invalid: list[Violation] = []
    for part in parts:
        assert part.pulsar is not None
        auditor.merge(part.pulsar)
        invalid.extend(part.pulsar_invalid)
    ledgers = auditor.ledgers_seen
    # A ledger whose bookies answered only in a retry stage was observed without its
    # entry losses: the final replicas report has them (`pulsar-audit` runs on it).
    lost = {f.ledger_id for f in auditor.findings if f.category is Category.MISSING}
    if replicas is not None:
        for v in replicas.violations:
            if v.category is not Category.NO_REPLICA or v.ledger_id in lost:
                continue
            refs = pulsar.refs.references(v.ledger_id)
            ranges = no_replica_ranges(v)
            if refs and ranges:
                fact = LedgerFact(v.ledger_id, closed=False)
                auditor.findings.extend(losses(v.ledger_id, refs, fact, ranges))
    async with pulsar_source(ctx) as source:
        audit = await confirm_audit(auditor.finish(), source, ctx.walker())
    return finished(ctx, audit, pulsar.refs, ledgers, invalid), audit


async def run_snapshot(
    ctx: CheckContext, engine: Engine, spec: ScanSpec, *, partitions: int, out: Path
) -> SnapshotCluster:
    """Every ledger's metadata into DIR/ledgers/; cluster.json last (it marks completion)."""
    ranges = await plan_ranges(ctx.store, ctx.root, ctx.manager, partitions)
    async with reporting_stages(ctx.log, engine.progress, spec.config.checks.progress_interval):
        parts = await engine.snapshot_ranges(spec, ranges)
    seen: set[str] = set()
    for p in parts:
        seen |= p.bookies
    ledgers = sum(p.ledgers for p in parts)
    cluster = await describe_cluster(
        ctx.store, ctx.root, ctx.manager.value, spec.config, seen, ledgers
    )
    cluster = cluster.with_invalid_znodes(invalid_znodes_of(parts))
    write_json(out / CLUSTER, cluster.to_json())
    ctx.log.info(
        "snapshot written",
        ledgers=ledgers,
        invalid=sum(p.invalid for p in parts),
        invalid_ledger_znodes=cluster.invalid_znodes.total,
        deleted_during_walk=sum(p.deleted for p in parts),
        bookies=len(cluster.locations),
        partitions=len(ranges),
    )
    return cluster


async def run_scan_from_snapshot(
    engine: Engine, job: SnapshotJudge, directory: Path, out: Path | None
) -> ScanResult:
    """The placement and metadata checks over a snapshot: no cluster is contacted."""
    reports: dict[Check, CheckReport] = {}
    log = structlog.get_logger("auditor.scan").bind(engine=engine.name)
    async with reporting_stages(log, engine.progress, job.config.checks.progress_interval):
        _absorb(await engine.judge_snapshot(job, directory), reports, [])
    for report in reports.values():
        job.cluster.name_invalid_znodes(report)
    result = ScanResult([reports[c] for c in SCAN_CHECKS if c in reports], [])
    if out is not None:
        await engine.write_violations(violation_rows(result.reports))
        write_json(out / MARKS, marks_document([], set()))
        write_json(out / SUMMARY, summary_document(result.reports))
    return result
