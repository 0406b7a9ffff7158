"""The in-process engine: the scan's partitions as tasks on this event loop.

Same partitions, same drivers, same output as the Spark engine; only the
place the partitions run differs. Coverage rows stream into one Parquet file
in batches, so memory stays flat however many ledgers there are.
"""

from __future__ import annotations

import asyncio
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
    CoverageRow,
    ViolationRow,
    arrow_schema,
    arrow_table,
    coverage_row,
)
from auditor.scan.partition import PartitionResult, ScanSpec, Sink, recheck, scan_range

#: Coverage rows buffered before a Parquet row group is written.
BATCH = 65536


class CoverageWriter:
    """Coverage rows to `DIR/coverage/part-00000.parquet`, a row group per batch."""

    def __init__(self, out: Path) -> None:
        import pyarrow.parquet as pq

        (out / COVERAGE).mkdir(parents=True, exist_ok=True)
        self._writer: Any = pq.ParquetWriter(
            str(out / COVERAGE / "part-00000.parquet"), arrow_schema(COVERAGE_COLUMNS)
        )
        self._rows: list[CoverageRow] = []

    def add(self, outcome: LedgerOutcome) -> None:
        self._rows.append(coverage_row(outcome))
        if len(self._rows) >= BATCH:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            self._writer.write_table(arrow_table(COVERAGE_COLUMNS, self._rows))
            self._rows = []

    def close(self) -> None:
        self.flush()
        self._writer.close()


class LocalEngine:
    name = "asyncio"

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self._coverage = CoverageWriter(out) if out is not None else None

    def default_partitions(self) -> int:
        return 1

    def concurrency(self, partitions: int) -> int:
        return partitions

    @property
    def sink(self) -> Sink | None:
        return self._coverage.add if self._coverage is not None else None

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

        (self.out / VIOLATIONS).mkdir(parents=True, exist_ok=True)
        pq.write_table(
            arrow_table(VIOLATION_COLUMNS, rows), str(self.out / VIOLATIONS / "part-00000.parquet")
        )

    async def close(self) -> None:
        if self._coverage is not None:
            self._coverage.close()
            self._coverage = None
