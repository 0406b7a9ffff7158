"""The in-process engine: the scan's partitions as tasks on this event loop.

Same partitions, same drivers, same output as the Spark engine; only the
place the partitions run differs. Coverage rows (and a snapshot's ledger
rows) stream into one Parquet file in batches, and a snapshot is judged a
batch at a time, so memory stays flat however many ledgers there are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from auditor.checks.findings import LedgerOutcome
from auditor.metadata.walk import IdRange
from auditor.scan.engine import chunks
from auditor.scan.output import (
    COVERAGE,
    COVERAGE_COLUMNS,
    VIOLATION_COLUMNS,
    VIOLATIONS,
    Column,
    ViolationRow,
    arrow_schema,
    arrow_table,
    coverage_row,
)
from auditor.scan.partition import PartitionResult, ScanSpec, Sink, recheck, scan_range
from auditor.scan.snapshot import (
    LEDGER_COLUMNS,
    LEDGERS,
    SnapshotJudge,
    SnapshotJudgement,
    SnapshotPart,
    snapshot_range,
)

#: Coverage rows buffered before a Parquet row group is written.
BATCH = 65536


class ParquetSink:
    """Rows to `DIR/<dataset>/part-00000.parquet`, a row group per batch."""

    def __init__(self, directory: Path, columns: Sequence[Column]) -> None:
        import pyarrow.parquet as pq

        directory.mkdir(parents=True, exist_ok=True)
        self.columns = columns
        self._writer: Any = pq.ParquetWriter(
            str(directory / "part-00000.parquet"), arrow_schema(columns)
        )
        self._rows: list[tuple[Any, ...]] = []

    def add(self, row: tuple[Any, ...]) -> None:
        self._rows.append(row)
        if len(self._rows) >= BATCH:
            self.flush()

    def add_outcome(self, outcome: LedgerOutcome) -> None:
        self.add(coverage_row(outcome))

    def flush(self) -> None:
        if self._rows:
            self._writer.write_table(arrow_table(self.columns, self._rows))
            self._rows = []

    def close(self) -> None:
        self.flush()
        self._writer.close()


class LocalEngine:
    name = "asyncio"

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self._coverage: ParquetSink | None = None

    def default_partitions(self) -> int:
        return 1

    def concurrency(self, partitions: int) -> int:
        return partitions

    @property
    def sink(self) -> Sink | None:
        if self.out is None:
            return None
        if self._coverage is None:
            self._coverage = ParquetSink(self.out / COVERAGE, COVERAGE_COLUMNS)
        return self._coverage.add_outcome

    async def snapshot_ranges(self, spec: ScanSpec, ranges: list[IdRange]) -> list[SnapshotPart]:
        assert self.out is not None
        rows = ParquetSink(self.out / LEDGERS, LEDGER_COLUMNS)
        try:
            return list(await asyncio.gather(*(snapshot_range(spec, r, rows.add) for r in ranges)))
        finally:
            rows.close()

    async def judge_snapshot(self, job: SnapshotJudge, directory: Path) -> list[PartitionResult]:
        import pyarrow.dataset as ds

        judgement = SnapshotJudgement(job, self.sink)
        dataset = ds.dataset(str(directory / LEDGERS), format="parquet")
        for batch in dataset.to_batches(batch_size=BATCH):
            await judgement.judge(batch.to_pylist())
        return [judgement.result()]

    async def scan_ranges(self, spec: ScanSpec, ranges: list[IdRange]) -> list[PartitionResult]:
        return list(await asyncio.gather(*(scan_range(spec, r, self.sink) for r in ranges)))

    async def recheck(
        self, spec: ScanSpec, ledger_ids: list[int], attempt: int, partitions: int
    ) -> list[PartitionResult]:
        return list(
            await asyncio.gather(
                *(
                    recheck(spec, part, attempt, self.sink)
                    for part in chunks(ledger_ids, partitions)
                )
            )
        )

    async def write_violations(self, rows: list[ViolationRow]) -> None:
        if self.out is None:
            return
        import pyarrow.parquet as pq

        _ = self.sink  # a scan without coverage rows still leaves an empty dataset

        (self.out / VIOLATIONS).mkdir(parents=True, exist_ok=True)
        pq.write_table(
            arrow_table(VIOLATION_COLUMNS, rows), str(self.out / VIOLATIONS / "part-00000.parquet")
        )

    async def close(self) -> None:
        if self._coverage is not None:
            self._coverage.close()
            self._coverage = None
