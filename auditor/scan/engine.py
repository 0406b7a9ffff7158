"""A scan's partitions may run in this process or on a Spark cluster, and its driver
(`auditor.scan.job`) must plan, retry, mark and summarise the same way whichever runs them;
it is written against this protocol only.

What a scan engine does: run partitions of the checks somewhere, keep their rows.

Two engines exist: in-process (`asyncio`) and Spark (`spark`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from auditor.errors import AuditorError
from auditor.metadata.ledger_tree import IdRange
from auditor.scan.options import ENGINES
from auditor.scan.output import ViolationRow
from auditor.scan.partition import PartitionResult, ScanSpec, Sink
from auditor.scan.progress import StageTally
from auditor.scan.snapshot import SnapshotJudge, SnapshotPart

T = TypeVar("T")


class EngineUnavailableError(AuditorError):
    """The engine asked for cannot run here (its optional packages are missing)."""

    exit_code = 2


class Engine(Protocol):
    name: str

    def default_partitions(self) -> int:
        """Partitions when the user gives none."""
        ...

    def concurrency(self, partitions: int) -> int:
        """How many of `partitions` run at once (the per-bookie cap is split by this)."""
        ...

    @property
    def sink(self) -> Sink | None:
        """Where the driver's own per-ledger outcomes go (the grace check's)."""
        ...

    async def scan_ranges(self, spec: ScanSpec, ranges: list[IdRange]) -> list[PartitionResult]: ...

    async def recheck(
        self, spec: ScanSpec, ledger_ids: list[int], attempt: int, partitions: int
    ) -> list[PartitionResult]: ...

    async def snapshot_ranges(self, spec: ScanSpec, ranges: list[IdRange]) -> list[SnapshotPart]:
        """Writes every ledger of the ranges as a row of DIR/ledgers/."""
        ...

    async def judge_snapshot(
        self, job: SnapshotJudge, directory: Path
    ) -> list[PartitionResult]: ...

    async def write_violations(self, rows: list[ViolationRow]) -> None: ...

    def progress(self) -> StageTally | None:
        """The stage running now, as far as the engine can see it (None between stages)."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class EngineOptions:
    name: str = "asyncio"
    #: Spark master URL; empty: `local[*]`, or whatever `spark-submit` was given.
    master: str = ""
    #: Extra Spark settings (`spark.executor.memory`, ...).
    spark_conf: Mapping[str, str] = field(default_factory=dict)


def chunks(items: Sequence[T], n: int) -> list[list[T]]:
    """`items` in at most `n` contiguous, non-empty parts of near-equal size."""
    n = max(1, min(n, len(items)))
    return [list(items[(i * len(items)) // n : ((i + 1) * len(items)) // n]) for i in range(n)]


def need_pyarrow(engine: str) -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise EngineUnavailableError(
            f"writing a scan's Parquet output ({engine} engine) needs pyarrow: "
            "pip install 'bookkeeper-auditor[scan]'"
        ) from None


def require(options: EngineOptions, *, parquet: bool) -> None:
    """Fails (one line, nothing written) when the engine's packages are missing."""
    if options.name not in ENGINES:
        raise EngineUnavailableError(
            f"unknown engine {options.name!r}; expected one of {', '.join(ENGINES)}"
        )
    if options.name == "spark":
        try:
            import pyspark  # noqa: F401
        except ImportError:
            raise EngineUnavailableError(
                "the Spark engine needs PySpark: pip install 'bookkeeper-auditor[spark]'"
            ) from None
    if parquet:
        need_pyarrow(options.name)
