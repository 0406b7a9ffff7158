"""A scan must run without a Spark cluster too (the daemon's default, the CLI, the tests),
with the same partitions, drivers and output as on Spark; only the place they run differs.

The in-process engine: the scan's partitions as tasks on this event loop.

Coverage rows (and a snapshot's ledger rows) stream into one Parquet file in batches,
and a snapshot is judged a batch at a time, so memory stays flat however many ledgers
there are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from auditor.checks.findings import LedgerOutcome
from auditor.metadata.ledger_tree import IdRange
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
    partial,
    publish_datasets,
)
from auditor.scan.partition import (
    PartitionResult,
    ScanSpec,
    Sink,
    partitioned_checks,
    recheck,
    scan_range,
)
from auditor.scan.progress import PartitionProgress, StageTally, local_stage
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
        self._stage: StageTally | None = None

    def default_partitions(self) -> int:
        return 1

    def concurrency(self, partitions: int) -> int:
        return partitions

    @property
    def sink(self) -> Sink | None:
        if self.out is None:
            return None
        if self._coverage is None:
            self._coverage = ParquetSink(partial(self.out, COVERAGE), COVERAGE_COLUMNS)
        return self._coverage.add_outcome

    def progress(self) -> StageTally | None:
        return self._stage

    @contextmanager
    def _running(self, stage: StageTally) -> Iterator[list[PartitionProgress]]:
        self._stage = stage
        try:
            yield stage.parts or []
        finally:
            self._stage = None

    async def snapshot_ranges(self, spec: ScanSpec, ranges: list[IdRange]) -> list[SnapshotPart]:
        assert self.out is not None
        rows = ParquetSink(self.out / LEDGERS, LEDGER_COLUMNS)
        stage = local_stage(f"snapshot of {len(ranges)} id ranges", len(ranges))
        try:
            with self._running(stage) as parts:
                return list(
                    await asyncio.gather(
                        *(
                            snapshot_range(spec, r, rows.add, p)
                            for r, p in zip(ranges, parts, strict=True)
                        )
                    )
                )
        finally:
            rows.close()

    async def judge_snapshot(self, job: SnapshotJudge, directory: Path) -> list[PartitionResult]:
        import pyarrow.dataset as ds

        judgement = SnapshotJudgement(job, self.sink)
        dataset = ds.dataset(str(directory / LEDGERS), format="parquet")
        total = dataset.count_rows()
        with self._running(local_stage(f"judge snapshot {directory}", 1)) as (part,):
            done = 0
            for batch in dataset.to_batches(batch_size=BATCH):
                await judgement.judge(batch.to_pylist())
                done += batch.num_rows
                part.tick(done, total)
            part.finish()
        return [judgement.result()]

    async def scan_ranges(self, spec: ScanSpec, ranges: list[IdRange]) -> list[PartitionResult]:
        checks = len(partitioned_checks(spec))
        stage = local_stage(f"scan of {len(ranges)} id ranges", len(ranges), checks)
        with self._running(stage) as parts:
            return list(
                await asyncio.gather(
                    *(scan_range(spec, r, self.sink, p) for r, p in zip(ranges, parts, strict=True))
                )
            )

    async def recheck(
        self, spec: ScanSpec, ledger_ids: list[int], attempt: int, partitions: int
    ) -> list[PartitionResult]:
        batches = chunks(ledger_ids, partitions)
        stage = local_stage(f"re-check {attempt} of {len(ledger_ids)} ledgers", len(batches))
        with self._running(stage) as parts:
            return list(
                await asyncio.gather(
                    *(
                        recheck(spec, batch, attempt, self.sink, p)
                        for batch, p in zip(batches, parts, strict=True)
                    )
                )
            )

    async def write_violations(self, rows: list[ViolationRow]) -> None:
        if self.out is None:
            return
        import pyarrow.parquet as pq

        _ = self.sink  # a scan without coverage rows still leaves an empty dataset
        # Closed (its footer written) before it is published: the summary, written next,
        # must never stand beside a coverage file that cannot be read yet.
        assert self._coverage is not None
        self._coverage.close()
        self._coverage = None
        violations = partial(self.out, VIOLATIONS)
        violations.mkdir(parents=True, exist_ok=True)
        pq.write_table(arrow_table(VIOLATION_COLUMNS, rows), str(violations / "part-00000.parquet"))
        publish_datasets(self.out)

    async def close(self) -> None:
        if self._coverage is not None:
            self._coverage.close()
            self._coverage = None
