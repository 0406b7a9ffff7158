"""The Pulsar audit runs whole in one process and split over a scan's partitions, so its
reading of Pulsar's tree, its observing of ledgers and its BP-34 confirmation are pieces
that either can put together.

Driving the Pulsar audit: Pulsar's references read, every ledger observed, candidates re-read.

The pieces, reusable by the scan (one partition walks an id range, the driver
merges and confirms):

* `verdicts_of(reports, marked)`: what the other checks said of each ledger
  (the replicas check's `no_replica` entry ranges, its and the placement
  check's violations, the under-replication marks) as `LedgerVerdicts`;
* `observe_ledgers(ctx, auditor, ...)`: walks `ctx`'s ledgers (its id range,
  if any) into a `PulsarAuditor`; a ledger whose metadata does not decode is
  observed too (with no owner and no age: never an orphan, never missing);
* `rechecks(...)` and `confirm_audit(...)`: BP-34 before any report: each
  candidate's owners (`Finding.reread`) are read again from Pulsar's tree and
  its ledger znode looked up again, then `pulsar_audit.confirm`;
* `report_of(...)`: the `CheckReport` (violations, Pulsar's bad znodes as
  invalid znodes, drops);
* `run_pulsar_audit(ctx, ...)`: the whole cluster, in process.

Where Pulsar's tree is: `checks.pulsar_metadata_zk` ("" = the cluster's own
ZooKeeper) under `checks.pulsar_root`. Nothing is written anywhere: the audit
neither marks nor deletes (an orphan comes with the command that would delete it).
The risk of a ledger (`analysis.risk`, a layer above) is handed in as `risk_of`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Set
from contextlib import asynccontextmanager
from dataclasses import dataclass

from auditor.checks.context import CheckContext
from auditor.checks.findings import (
    Category,
    Check,
    CheckReport,
    InvalidZnode,
    Violation,
    metadata_invalid,
)
from auditor.checks.progress import Progress
from auditor.checks.pulsar_audit import (
    DomainName,
    LedgerFact,
    LedgerVerdicts,
    PulsarAudit,
    PulsarAuditor,
    PulsarPartial,
    confirm,
    fact_of,
)
from auditor.checks.pulsar_audit import Recheck as Recheck
from auditor.checks.recorder import decode_error
from auditor.metadata.cluster import open_zookeeper_beside
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.pulsar.reader import read_managed_ledger, read_pulsar_refs, read_schema
from auditor.metadata.pulsar.refs import PulsarRefs
from auditor.metadata.walk import LedgerWalker, Walker
from auditor.store import MetadataStore

__all__ = [
    "PulsarSource",
    "RiskOf",
    "confirm_audit",
    "no_replica_ranges",
    "observe_ledgers",
    "observe_partition",
    "pulsar_source",
    "read_refs",
    "rechecks",
    "report_of",
    "run_pulsar_audit",
    "run_pulsar_check",
    "verdicts_of",
]

#: The failure domains whose single loss would hurt a ledger (given by `analysis.risk`).
RiskOf = Callable[[LedgerMetadata], tuple[DomainName, ...]]


# --- verdicts of the other checks ----------------------------------------------------------


def no_replica_ranges(v: Violation) -> tuple[tuple[int, int], ...]:
    """The entry ranges a replicas `no_replica` violation says have no copy (inclusive)."""
    return tuple((int(a), int(b)) for a, b in v.detail.get("worst_entries", ()))


def verdicts_of(
    reports: Iterable[CheckReport], marked: Set[int] = frozenset()
) -> dict[int, LedgerVerdicts]:
    """Per ledger, what the replicas and placement reports (and the marks) say of it.

    `no_replica` ranges are the `worst_entries` of the replicas check's
    `no_replica` violations (their copies found is 0). Ledgers with nothing
    said are absent (`LedgerVerdicts()` is the clean default).
    """
    no_replica: dict[int, tuple[tuple[int, int], ...]] = {}
    replicas: set[int] = set()
    unplaced: set[int] = set()
    for report in reports:
        for v in report.violations:
            if report.check is Check.REPLICAS and v.category is not Category.METADATA_INVALID:
                replicas.add(v.ledger_id)
                if v.category is Category.NO_REPLICA:
                    no_replica[v.ledger_id] = no_replica_ranges(v)
            elif report.check is Check.PLACEMENT and v.category in (
                Category.PLACEMENT_NOT_ADHERING,
                Category.PLACEMENT_SOFTLY_ADHERING,
            ):
                unplaced.add(v.ledger_id)
    out: dict[int, LedgerVerdicts] = {}
    for i in sorted(replicas | unplaced | set(marked)):
        out[i] = LedgerVerdicts(no_replica.get(i, ()), i in marked, i in replicas, i in unplaced)
    return out


# --- where Pulsar's tree is ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PulsarSource:
    """Pulsar's metadata store: a client of it and the root of Pulsar's tree in it."""

    store: MetadataStore
    root: str


@asynccontextmanager
async def pulsar_source(ctx: CheckContext) -> AsyncIterator[PulsarSource]:
    """The cluster's metadata store, or the ZooKeeper `checks.pulsar_metadata_zk` names
    (closed after)."""
    cfg = ctx.config.checks
    if not cfg.pulsar_metadata_zk:
        yield PulsarSource(ctx.store, cfg.pulsar_root)
        return
    store = open_zookeeper_beside(ctx.store, cfg.pulsar_metadata_zk, ctx.config.zk_timeout)
    await store.start()
    try:
        yield PulsarSource(store, cfg.pulsar_root)
    finally:
        await store.close()


async def read_refs(source: PulsarSource) -> PulsarRefs:
    return await read_pulsar_refs(source.store, source.root)


# --- observing ledgers --------------------------------------------------------------------


async def observe_ledgers(
    ctx: CheckContext,
    auditor: PulsarAuditor,
    verdicts: Mapping[int, LedgerVerdicts] | None = None,
    *,
    risk_of: RiskOf | None = None,
    invalid: list[Violation] | None = None,
) -> int:
    """Observes every ledger `ctx` walks (its `id_range`, if any); returns how many.

    A ledger whose metadata does not decode is observed as `LedgerFact(id)`:
    it exists, so a reference to it is not `missing`, and with no owner nor
    age it is never an orphan; its `metadata_invalid` violation is appended
    to `invalid` when given.
    """
    given = verdicts or {}
    # ZooKeeper's metadata, never the leader's index: the index keeps no custom metadata,
    # and Pulsar's owner keys are what make an unreferenced ledger an orphan.
    walker = LedgerWalker(ctx.store, ctx.root, ctx.manager, ctx.id_range)
    progress = Progress(
        ctx.log,
        str(Check.PULSAR),
        interval=ctx.config.checks.progress_interval,
        max_ledger_id=await walker.max_ledger_id(),
    )
    n = 0
    async for rec in walker.ledgers(concurrency=ctx.config.checks.walk_window):
        progress.tick(rec.ledger_id)
        n += 1
        md = rec.metadata
        said = given.get(rec.ledger_id)
        if md is None:
            # Open as far as we know: its size is what Pulsar recorded, if anything.
            auditor.observe(LedgerFact(rec.ledger_id, closed=False), said)
            if invalid is not None:
                invalid.append(
                    metadata_invalid(rec.ledger_id, rec.path, rec.znode_version, decode_error(rec))
                )
            continue
        domains = risk_of(md) if risk_of is not None else ()
        if domains:
            base = said or LedgerVerdicts()
            said = LedgerVerdicts(
                base.no_replica, base.marked, base.replicas_violation, base.unplaced, domains
            )
        auditor.observe(fact_of(md), said)
    return n


async def observe_partition(
    ctx: CheckContext,
    refs: PulsarRefs,
    *,
    now_ms: int,
    grace_ms: int,
    verdicts: Mapping[int, LedgerVerdicts] | None = None,
    risk_of: RiskOf | None = None,
) -> tuple[PulsarPartial, list[Violation]]:
    """One scan partition (`ctx.id_range`): its partial result (picklable, no refs) and
    its undecodable ledgers' `metadata_invalid` violations. The driver merges the
    partials into a `PulsarAuditor` on the same refs, `finish`es, `confirm_audit`s."""
    auditor = PulsarAuditor(refs, now_ms=now_ms, grace_ms=grace_ms)
    invalid: list[Violation] = []
    await observe_ledgers(ctx, auditor, verdicts, risk_of=risk_of, invalid=invalid)
    return auditor.partial(), invalid


# --- the re-check -------------------------------------------------------------------------


async def rechecks(audit: PulsarAudit, source: PulsarSource, walker: Walker) -> dict[int, Recheck]:
    """A fresh look at every candidate: its owners' references read again, its znode's existence."""
    mls: set[str] = set()
    schemas: set[str] = set()
    for f in audit.findings:
        m, s = f.reread()
        mls |= m
        schemas |= s
    fresh = PulsarRefs()
    for name in sorted(mls):
        fresh.merge(await read_managed_ledger(source.store, source.root, name))
    for schema_id in sorted(schemas):
        fresh.merge(await read_schema(source.store, source.root, schema_id))
    out: dict[int, Recheck] = {}
    for ledger_id in sorted({f.ledger_id for f in audit.findings}):
        exists = await walker.read(ledger_id) is not None
        out[ledger_id] = Recheck(exists, tuple(fresh.references(ledger_id)))
    return out


async def confirm_audit(audit: PulsarAudit, source: PulsarSource, walker: Walker) -> PulsarAudit:
    """`confirm` on fresh looks (BP-34: no report before a re-check)."""
    return confirm(audit, await rechecks(audit, source, walker))


# --- the report ---------------------------------------------------------------------------


def report_of(
    ctx: CheckContext,
    audit: PulsarAudit,
    refs: PulsarRefs,
    ledgers: int,
    invalid: Iterable[Violation] = (),
) -> CheckReport:
    """The check report of a confirmed audit: its violations (and the undecodable
    ledgers' `metadata_invalid`), Pulsar's bad znodes as invalid znodes, its drops."""
    report = ctx.new_report(Check.PULSAR)
    report.ledgers_checked = ledgers
    for v in [*audit.violations(), *invalid]:
        report.violations.append(v)
    for bad in refs.bad_znodes:
        report.invalid_znodes.append(InvalidZnode(bad.path, bad.reason))
    report.dropped.update(audit.dropped)
    report.finished_at = ctx.clock()
    return report


# --- the whole run ------------------------------------------------------------------------


async def run_pulsar_audit(
    ctx: CheckContext,
    *,
    verdicts: Mapping[int, LedgerVerdicts] | None = None,
    risk_of: RiskOf | None = None,
    grace_ms: int | None = None,
) -> tuple[CheckReport, PulsarAudit]:
    """The audit of the whole cluster (or `ctx.id_range`): the report and the rollups.

    `verdicts` come from the replicas and placement checks run before (see
    `verdicts_of`); without them `missing` covers ledgers without metadata only.
    """
    cfg = ctx.config.checks
    grace = int(cfg.pulsar_orphan_grace * 1000) if grace_ms is None else grace_ms
    async with pulsar_source(ctx) as source:
        refs = await read_refs(source)
        ctx.log.info(
            "pulsar audit started",
            referenced_ledgers=len(refs.refs),
            managed_ledgers=len(refs.managed_ledgers),
            schemas=len(refs.schemas),
            bad_znodes=len(refs.bad_znodes),
            orphan_grace_s=grace / 1000,
        )
        auditor = PulsarAuditor(refs, now_ms=int(ctx.clock() * 1000), grace_ms=grace)
        invalid: list[Violation] = []
        with ctx.reporting_progress(Check.PULSAR):
            ledgers = await observe_ledgers(
                ctx, auditor, verdicts, risk_of=risk_of, invalid=invalid
            )
        audit = await confirm_audit(auditor.finish(), source, ctx.walker())
    return finished(ctx, audit, refs, ledgers, invalid), audit


def finished(
    ctx: CheckContext,
    audit: PulsarAudit,
    refs: PulsarRefs,
    ledgers: int,
    invalid: Iterable[Violation] = (),
) -> CheckReport:
    """The confirmed audit as its report, and the line that says it ended (in process
    and on a scan's driver alike)."""
    report = report_of(ctx, audit, refs, ledgers, invalid)
    ctx.log.info(
        "pulsar audit finished",
        ledgers_checked=ledgers,
        counts=report.counts(),
        dropped=dict(audit.dropped),
        invalid_znodes=report.invalid_znodes.total,
    )
    return report


async def run_pulsar_check(ctx: CheckContext) -> CheckReport:
    """The runner's driver: the audit on metadata alone (no bookie asked, no risk)."""
    report, _ = await run_pulsar_audit(ctx)
    return report
