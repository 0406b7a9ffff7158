"""Placement and metadata questions (and what-if and risk) can be answered away from the
cluster, later and at no load on it, from a copy of every ledger's metadata that the live
checks' judging code can read as it reads the cluster.

A metadata snapshot: every ledger's metadata as Parquet, and the checks that run on it.

`bk-auditor snapshot` reads the ledgers through the same partitions as a scan
and writes DIR/ledgers/ (one row per ledger) and DIR/cluster.json (registered
and known bookies, and the rack location of every bookie any ensemble names,
resolved through the configured rack sources at snapshot time). The placement
and metadata checks then run on the snapshot with no cluster access: the same
judging code as the live checks, fed records rebuilt from rows and locations
from cluster.json, so a placement scan of a fresh snapshot equals the live one.

The ledger password is not stored: no check needs it, and a snapshot is a
file that travels.

Znodes the walk found where ledgers would be that name no valid ledger (a path
spelling an id beyond 2^63-1, `L` and the wrong count of digits) have no row:
cluster.json names them (`invalid_znodes`: every one counted, the first
`UNEXPECTED_KEPT` listed), and a scan of the snapshot names them in each
report, as a live scan does.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from auditor.checks.findings import (
    Check,
    CheckReport,
    InvalidZnode,
    InvalidZnodeLog,
    LedgerOutcome,
)
from auditor.checks.metadata_run import MetadataRun
from auditor.checks.placement_run import PlacementRun, placement_policy
from auditor.checks.progress import Progress
from auditor.checks.recorder import RunRecorder
from auditor.checks.tally import ViolationLog
from auditor.config import AuditorConfig
from auditor.errors import ConfigError, FormatError
from auditor.metadata.cluster import connect
from auditor.metadata.ledger_tree import UNEXPECTED_KEPT, IdRange
from auditor.metadata.model import DigestType, LedgerMetadata, LedgerState, Segment
from auditor.metadata.serde import LedgerMetadataFormatError
from auditor.metadata.walk import LedgerRecord
from auditor.scan.output import Column
from auditor.scan.partition import PartitionResult, ScanSpec
from auditor.scan.progress import PartitionProgress
from auditor.store import MetadataStore
from auditor.timefmt import iso_datetime

LEDGERS = "ledgers"
CLUSTER = "cluster.json"
SNAPSHOT_OUTPUT = (LEDGERS, CLUSTER)
FORMAT = 1
#: Checks that can run on a snapshot (the others need bookies or the marks).
SNAPSHOT_CHECKS = (Check.PLACEMENT, Check.METADATA)

LEDGER_COLUMNS: tuple[Column, ...] = (
    ("ledger_id", "long", False),
    ("path", "string", False),
    ("znode_version", "long", False),
    ("format_version", "int", True),
    ("state", "string", True),
    ("ensemble_size", "int", True),
    ("write_quorum", "int", True),
    ("ack_quorum", "int", True),
    ("last_entry_id", "long", True),
    ("length", "long", True),
    ("digest_type", "string", True),
    ("ctime", "long", True),
    ("ctime_stored", "bool", True),
    ("ctoken", "long", True),
    ("custom_metadata", "kv_list", True),
    ("segments", "segment_list", True),
    ("error", "string", True),
)

LedgerRow = tuple[Any, ...]


class SnapshotError(FormatError):
    """A snapshot directory that is missing parts or was not written by `snapshot`."""


def ledger_row(rec: LedgerRecord) -> LedgerRow:
    md = rec.metadata
    if md is None:
        reason = rec.error.reason if rec.error is not None else "metadata missing"
        return (rec.ledger_id, rec.path, rec.znode_version, *([None] * 13), reason)
    return (
        rec.ledger_id,
        rec.path,
        rec.znode_version,
        md.format_version,
        md.state.name,
        md.ensemble_size,
        md.write_quorum,
        md.ack_quorum,
        md.last_entry_id,
        md.length,
        md.digest_type.name if md.digest_type is not None else None,
        md.ctime,
        md.ctime_stored,
        md.ctoken,
        [{"key": k, "value": v} for k, v in md.custom_metadata],
        [{"first_entry_id": s.first_entry_id, "bookies": list(s.bookies)} for s in md.segments],
        None,
    )


def record_from_row(row: Mapping[str, Any]) -> LedgerRecord:
    """The record the live walk would have yielded for this ledger (password aside)."""
    ledger_id = int(row["ledger_id"])
    version = int(row["znode_version"])
    if row["error"] is not None:
        return LedgerRecord(
            ledger_id,
            row["path"],
            None,
            version,
            LedgerMetadataFormatError(ledger_id, str(row["error"])),
        )
    md = LedgerMetadata(
        ledger_id=ledger_id,
        format_version=int(row["format_version"]),
        ensemble_size=int(row["ensemble_size"]),
        write_quorum=int(row["write_quorum"]),
        ack_quorum=int(row["ack_quorum"]),
        state=LedgerState[row["state"]],
        segments=tuple(
            Segment(int(s["first_entry_id"]), tuple(s["bookies"])) for s in row["segments"]
        ),
        last_entry_id=int(row["last_entry_id"]),
        length=int(row["length"]),
        digest_type=DigestType[row["digest_type"]] if row["digest_type"] else None,
        ctime=int(row["ctime"]),
        ctime_stored=bool(row["ctime_stored"]),
        ctoken=int(row["ctoken"]) if row["ctoken"] is not None else None,
        custom_metadata=tuple(
            (str(kv["key"]), bytes(kv["value"])) for kv in row["custom_metadata"] or ()
        ),
    )
    return LedgerRecord(ledger_id, row["path"], md, version)


# --- taking a snapshot --------------------------------------------------------------


@dataclass
class SnapshotPart:
    """What one partition of a snapshot sends back: counts and the bookies it met."""

    ledgers: int = 0
    invalid: int = 0
    deleted: int = 0
    bookies: set[str] = field(default_factory=set)
    #: Invalid ledger znodes the walk kept (by path), and how many it found.
    invalid_znodes: list[InvalidZnode] = field(default_factory=list)
    invalid_znodes_total: int = 0


async def snapshot_range(
    spec: ScanSpec,
    id_range: IdRange,
    emit: Callable[[LedgerRow], None],
    progress: PartitionProgress | None = None,
) -> SnapshotPart:
    part = SnapshotPart()
    async with connect(spec.target) as (store, manager):
        from auditor.metadata.walk import LedgerWalker

        walker = LedgerWalker(store, spec.target.root, manager, id_range)
        ticks = Progress(
            structlog.get_logger("auditor.scan").bind(range=f"{id_range.lo}-{id_range.hi}"),
            "snapshot",
            interval=spec.config.checks.progress_interval,
            max_ledger_id=await walker.max_ledger_id(),
            on_progress=progress.tick if progress is not None else None,
        )
        async for rec in walker.ledgers(concurrency=spec.config.checks.walk_window):
            ticks.tick(rec.ledger_id)
            emit(ledger_row(rec))
            part.ledgers += 1
            if rec.metadata is None:
                part.invalid += 1
            else:
                part.bookies |= rec.metadata.bookies()
        part.deleted = walker.stats.deleted_during_walk
        part.invalid_znodes = [
            InvalidZnode(u.path, u.reason) for u in walker.stats.unexpected if u.invalid_ledger
        ]
        part.invalid_znodes_total = walker.stats.invalid_ledgers
    if progress is not None:
        progress.end_check(part.ledgers)
        progress.finish()
    return part


def invalid_znodes_of(parts: Iterable[SnapshotPart]) -> InvalidZnodeLog:
    """The parts' invalid ledger znodes together: all counted, the first UNEXPECTED_KEPT listed."""
    log = InvalidZnodeLog(limit=UNEXPECTED_KEPT)
    for p in parts:
        log.merge(InvalidZnodeLog(p.invalid_znodes, limit=0))
        log.count_unlisted(p.invalid_znodes_total - len(p.invalid_znodes))
    return log


@dataclass(frozen=True, slots=True)
class SnapshotCluster:
    """cluster.json: what the placement check needs besides the ledgers."""

    root: str
    manager: str
    taken_at: str
    writable: tuple[str, ...]
    readonly: tuple[str, ...]
    known: tuple[str, ...]
    locations: Mapping[str, str]
    rack_sources: tuple[str, ...]
    ledgers: int
    #: Invalid ledger znodes the snapshot's walk found (none in snapshots older than this).
    invalid_znodes: InvalidZnodeLog = field(default_factory=lambda: InvalidZnodeLog(limit=0))

    def with_invalid_znodes(self, found: InvalidZnodeLog) -> SnapshotCluster:
        return replace(self, invalid_znodes=found)

    def name_invalid_znodes(self, report: CheckReport) -> None:
        """Names the snapshot's invalid ledger znodes in a report of it, as a live walk would."""
        for z in self.invalid_znodes:
            report.invalid_znodes.append(z)
        report.invalid_znodes.count_unlisted(self.invalid_znodes.total - len(self.invalid_znodes))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "root": self.root,
            "manager": self.manager,
            "taken_at": self.taken_at,
            "bookies": {"writable": list(self.writable), "readonly": list(self.readonly)},
            "known_bookies": list(self.known),
            "locations": dict(sorted(self.locations.items())),
            "rack_sources": list(self.rack_sources),
            "ledgers": self.ledgers,
            "invalid_znodes": self.invalid_znodes.to_json(),
        }

    @staticmethod
    def load(directory: Path) -> SnapshotCluster:
        path = directory / CLUSTER
        if not (directory / LEDGERS).is_dir() or not path.is_file():
            raise SnapshotError(
                f"{directory} is not a complete snapshot (needs {LEDGERS}/ and {CLUSTER})"
            )
        try:
            doc = json.loads(path.read_text())
            if doc.get("format") != FORMAT:
                raise SnapshotError(f"{path}: unknown snapshot format {doc.get('format')!r}")
            return SnapshotCluster(
                root=str(doc["root"]),
                manager=str(doc["manager"]),
                taken_at=str(doc["taken_at"]),
                writable=tuple(doc["bookies"]["writable"]),
                readonly=tuple(doc["bookies"]["readonly"]),
                known=tuple(doc["known_bookies"]),
                locations={str(k): str(v) for k, v in doc["locations"].items()},
                rack_sources=tuple(doc["rack_sources"]),
                ledgers=int(doc["ledgers"]),
                invalid_znodes=InvalidZnodeLog.from_json(doc.get("invalid_znodes")),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SnapshotError(f"{path}: not a snapshot's cluster.json ({exc})") from exc


async def describe_cluster(
    store: MetadataStore,
    root: str,
    manager: str,
    config: AuditorConfig,
    seen: set[str],
    ledgers: int,
) -> SnapshotCluster:
    """Bookies and their locations, through the same sources the live check uses."""
    from auditor.metadata.registry import all_known_bookies, read_bookies
    from auditor.topology.racks import open_rack_resolver

    registered = await read_bookies(store, root)
    known = registered.available | await all_known_bookies(store, root)
    resolver = await open_rack_resolver(store, root, config)
    # Known bookies first, in one batch, as the live check does; then every other
    # bookie some ensemble names.
    locations = await resolver.locations(sorted(known))
    locations |= await resolver.locations(sorted(seen - known))
    return SnapshotCluster(
        root=root,
        manager=manager,
        taken_at=iso_datetime(datetime.now(UTC)),
        writable=tuple(sorted(registered.writable)),
        readonly=tuple(sorted(registered.readonly)),
        known=tuple(sorted(known)),
        locations=locations,
        rack_sources=tuple(resolver.source_names),
        ledgers=ledgers,
    )


# --- judging a snapshot ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SnapshotJudge:
    """What a partition judging snapshot rows needs (picklable)."""

    config: AuditorConfig
    checks: tuple[Check, ...]
    cluster: SnapshotCluster
    coverage: bool = True
    log_level: str = "WARNING"


async def _iterate(records: Iterable[LedgerRecord]) -> AsyncIterator[LedgerRecord]:
    for rec in records:
        yield rec


class SnapshotJudgement:
    """Judges batches of snapshot rows; reports accumulate across batches."""

    def __init__(self, job: SnapshotJudge, sink: Callable[[LedgerOutcome], None] | None) -> None:
        from auditor.logs import get_logger

        self.job = job
        log = get_logger().bind(source="snapshot")
        now = datetime.now(UTC).timestamp()
        limit = job.config.checks.max_violations_listed
        self.recorders = {
            c: RunRecorder(
                CheckReport(c, started_at=now, violations=ViolationLog(limit=limit)),
                log,
                sink,
                log_limit=job.config.checks.violation_log_limit,
            )
            for c in job.checks
        }
        cluster = job.cluster
        self.locations = dict(cluster.locations)
        known = frozenset(cluster.known)
        policy = placement_policy(
            job.config.bookkeeper,
            known,
            {b: loc for b, loc in self.locations.items() if b in known},
        )
        self.metadata = (
            MetadataRun(self.recorders[Check.METADATA])
            if Check.METADATA in self.recorders
            else None
        )
        self.placement = (
            PlacementRun(self.recorders[Check.PLACEMENT], policy, self._locate)
            if Check.PLACEMENT in self.recorders
            else None
        )

    async def _locate(self, bookies: Iterable[str]) -> dict[str, str]:
        return {b: self.locations[b] for b in bookies if b in self.locations}

    async def judge(self, rows: Iterable[Mapping[str, Any]]) -> None:
        records = [record_from_row(r) for r in rows]
        if self.metadata is not None:
            await self.metadata.judge_all(_iterate(records))
        if self.placement is not None:
            await self.placement.judge_all(_iterate(records))

    def result(self) -> PartitionResult:
        return PartitionResult(reports={c: r.finish() for c, r in self.recorders.items()})


def snapshot_checks(checks: Iterable[Check]) -> tuple[Check, ...]:
    wanted = tuple(checks)
    other = [str(c) for c in wanted if c not in SNAPSHOT_CHECKS]
    if other:
        raise ConfigError(
            f"a snapshot can only be judged by the placement and metadata checks, not {other[0]}"
        )
    return wanted
