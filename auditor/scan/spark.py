"""A cluster too large for one process to check in good time can have its partitions spread
over a Spark cluster, each task running the same asyncio checks as the in-process engine.

The Spark engine: each partition is a Spark task running the checks with asyncio inside.

A stage is one `mapPartitions` over id ranges (or over ledger ids to re-check).
A task opens its own ZooKeeper session and bookie connections, runs the
partition on a fresh event loop and yields one small result (partial reports,
ids to retry, marks wanted) followed by its coverage rows. The stage's RDD is
persisted (memory, spilling to disk) so that collecting the results and
writing the coverage rows compute it once: a second computation would scan
the cluster again. Coverage never passes through the driver; violations do
(the summary lists them all, as `check --json` does).

Spark actions block, so they run in a worker thread under a job group of
their own: cancelling the scan (the daemon losing leadership) cancels the
Spark jobs too.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from auditor.checks.findings import LedgerOutcome
from auditor.errors import AuditorError
from auditor.metadata.ledger_tree import IdRange
from auditor.scan.anchor import anchored
from auditor.scan.engine import EngineOptions, EngineUnavailableError, chunks
from auditor.scan.output import (
    COVERAGE,
    COVERAGE_COLUMNS,
    VIOLATION_COLUMNS,
    VIOLATIONS,
    Column,
    CoverageRow,
    ViolationRow,
    coverage_row,
    partial,
    publish_datasets,
    spark_schema,
)
from auditor.scan.partition import (
    PartitionResult,
    ScanSpec,
    Sink,
    recheck,
    run_blocking,
    scan_range,
)
from auditor.scan.progress import StageTally
from auditor.scan.snapshot import (
    LEDGER_COLUMNS,
    LEDGERS,
    LedgerRow,
    SnapshotJudge,
    SnapshotJudgement,
    SnapshotPart,
    snapshot_range,
)

T = TypeVar("T")

#: How long closing waits for the jobs of a cancelled run to end before it stops the
#: session anyway (s).
CLOSE_WAIT = 60.0
RESULT = "result"
ROW = "row"

#: Settings for a quiet, self-contained local session; the user's `spark_conf` wins.
DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
}


def _range_task(spec: ScanSpec) -> Callable[[Iterable[IdRange]], Iterator[tuple[str, Any]]]:
    def task(ranges: Iterable[IdRange]) -> Iterator[tuple[str, Any]]:
        for r in ranges:
            rows: list[CoverageRow] = []
            sink = _row_sink(rows) if spec.coverage else None
            yield RESULT, run_blocking(scan_range(spec, r, sink), spec.log_level)
            for row in rows:
                yield ROW, row

    return task


def _recheck_task(
    spec: ScanSpec, attempt: int
) -> Callable[[Iterable[int]], Iterator[tuple[str, Any]]]:
    def task(ids: Iterable[int]) -> Iterator[tuple[str, Any]]:
        batch = list(ids)
        if not batch:
            return
        rows: list[CoverageRow] = []
        sink = _row_sink(rows) if spec.coverage else None
        yield RESULT, run_blocking(recheck(spec, batch, attempt, sink), spec.log_level)
        for row in rows:
            yield ROW, row

    return task


def _snapshot_task(spec: ScanSpec) -> Callable[[Iterable[IdRange]], Iterator[tuple[str, Any]]]:
    def task(ranges: Iterable[IdRange]) -> Iterator[tuple[str, Any]]:
        for r in ranges:
            rows: list[LedgerRow] = []
            yield RESULT, run_blocking(snapshot_range(spec, r, rows.append), spec.log_level)
            for row in rows:
                yield ROW, row

    return task


def _judge_task(job: SnapshotJudge) -> Callable[[Iterable[Any]], Iterator[tuple[str, Any]]]:
    def task(rows: Iterable[Any]) -> Iterator[tuple[str, Any]]:
        out: list[CoverageRow] = []
        judgement = SnapshotJudgement(job, _row_sink(out) if job.coverage else None)
        batch = [r.asDict(recursive=True) for r in rows]
        run_blocking(judgement.judge(batch), job.log_level)
        yield RESULT, judgement.result()
        for row in out:
            yield ROW, row

    return task


def _row_sink(rows: list[CoverageRow]) -> Sink:
    def add(o: LedgerOutcome) -> None:
        rows.append(coverage_row(o))

    return add


def _is_result(item: tuple[str, Any]) -> bool:
    return item[0] == RESULT


def _is_row(item: tuple[str, Any]) -> bool:
    return item[0] == ROW


def _payload(item: tuple[str, Any]) -> Any:
    return item[1]


def _new_group() -> str:
    return f"bk-auditor-{uuid.uuid4().hex[:12]}"


class SparkJobError(AuditorError):
    """A Spark job of the scan failed."""

    exit_code = 2


def _first_line(exc: BaseException) -> str:
    """The useful line of a Spark/Python worker failure (they carry whole tracebacks)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error:" in ln or "Exception:" in ln:
            return ln[:300]
    return (lines[0] if lines else type(exc).__name__)[:300]


def _uri(path: Path) -> str:
    """An explicit file: URI, so Hadoop does not resolve the path against fs.defaultFS
    (HDFS on a typical YARN setup) while the JSON files go to the driver's disk."""
    return path.resolve().as_uri()


def _quiet_logging() -> dict[str, str]:
    """Spark's log4j chatter down to errors, for sessions this process starts itself."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return {}  # under spark-submit the JVM is already up, with the user's logging
    path = Path(__file__).with_name("log4j2.properties")
    return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{path}"}


class SparkEngine:
    name = "spark"

    def __init__(self, options: EngineOptions, out: Path | None) -> None:
        try:
            from pyspark.sql import SparkSession
        except ImportError:
            raise EngineUnavailableError(
                "the Spark engine needs PySpark: pip install 'bookkeeper-auditor[spark]'"
            ) from None
        # Executors run this interpreter (and so this project) unless told otherwise.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        builder = SparkSession.builder.appName("bookkeeper-auditor-scan")
        # Under spark-submit the master comes from there; on its own, a local Spark.
        master = options.master
        if not master and "PYSPARK_GATEWAY_PORT" not in os.environ:
            master = "local[*]"
        if master:
            builder = builder.master(master)
        if master.startswith("local"):
            # A local session talks to itself only: no guessing which interface to bind.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        conf = {**DEFAULT_CONF, **_quiet_logging(), **dict(options.spark_conf)}
        if "PYSPARK_GATEWAY_PORT" in os.environ:
            # Under spark-submit the user's --conf decide; only theirs are applied.
            conf = dict(options.spark_conf)
        for key, value in conf.items():
            builder = builder.config(key, value)
        self.spark: Any = builder.getOrCreate()
        self.sc: Any = self.spark.sparkContext
        self.sc.setLogLevel("ERROR")
        self.out = out
        self._driver_rows: list[CoverageRow] = []
        self._coverage_written = False
        #: The stage being computed and its Spark job group (for `progress`).
        self._running: tuple[StageTally, str] | None = None
        #: The threads calling into Spark for a job, until their call returns.
        self._jobs: set[asyncio.Future[Any]] = set()

    def default_partitions(self) -> int:
        # A few tasks per core, so one slow range does not hold the whole stage.
        return 2 * int(self.sc.defaultParallelism)

    def concurrency(self, partitions: int) -> int:
        return max(1, min(partitions, int(self.sc.defaultParallelism)))

    @property
    def sink(self) -> Sink | None:
        return _row_sink(self._driver_rows) if self.out is not None else None

    def progress(self) -> StageTally | None:
        """The running stage from Spark's status tracker: tasks finished of the stage's
        first job (the one that computes it; the second reads its persisted partitions)."""
        running = self._running
        if running is None:
            return None
        tally, group = running
        try:
            tracker = self.sc.statusTracker()
            jobs = sorted(tracker.getJobIdsForGroup(group))
            info = tracker.getJobInfo(jobs[0]) if jobs else None
            done = 0
            for stage_id in info.stageIds if info is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += int(stage.numCompletedTasks)
        except Exception:  # a progress line is not worth failing the scan
            return tally
        tally.partitions_done = max(tally.partitions_done, min(done, tally.partitions))
        return tally

    async def _job(self, what: str, fn: Callable[[], T], group: str = "") -> T:
        group = group or _new_group()

        def work() -> T:
            self.sc.setJobGroup(group, what, interruptOnCancel=True)
            return fn()

        call = asyncio.ensure_future(asyncio.to_thread(work))
        self._jobs.add(call)
        call.add_done_callback(self._job_ended)
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            # The thread goes on until Spark ends the job: `close` waits for that.
            self.sc.cancelJobGroup(group)
            raise
        except Exception as exc:
            # A failed Spark job (executors without the project, a lost stage, ...)
            # is an operator's problem to fix, said in one line.
            raise SparkJobError(f"Spark job '{what}' failed: {_first_line(exc)}") from exc

    async def _stage(
        self, what: str, rdd: Any, dataset: str = COVERAGE, columns: Sequence[Column] = ()
    ) -> list[Any]:
        from pyspark import StorageLevel

        staged = rdd.persist(StorageLevel.MEMORY_AND_DISK)
        tally = StageTally(what, int(rdd.getNumPartitions()))
        group = _new_group()
        self._running = (tally, group)
        try:
            results: list[Any] = await self._job(
                what, lambda: staged.filter(_is_result).map(_payload).collect(), group
            )
            tally.partitions_done = tally.partitions
            if self.out is not None:
                rows = staged.filter(_is_row).map(_payload)
                await self._job(what, lambda: self._append(rows, dataset, columns))
            return results
        finally:
            self._running = None
            staged.unpersist()

    def _append(self, rows: Any, dataset: str, columns: Sequence[Column]) -> None:
        assert self.out is not None
        df = self.spark.createDataFrame(rows, spark_schema(columns or COVERAGE_COLUMNS))
        # Coverage grows by one append per stage (each with its own _SUCCESS): it stays
        # in DIR/_partial/ until the scan's last write. A snapshot's ledgers/ is one
        # append, which Spark's committer publishes whole.
        target = partial(self.out, dataset) if dataset == COVERAGE else self.out / dataset
        df.write.mode("append").parquet(_uri(target))
        if dataset == COVERAGE:
            self._coverage_written = True

    async def snapshot_ranges(self, spec: ScanSpec, ranges: list[IdRange]) -> list[SnapshotPart]:
        # Executors work in directories of their own: relative paths must not reach them.
        task = _snapshot_task(anchored(spec))
        rdd = self.sc.parallelize(ranges, len(ranges)).mapPartitions(task)
        return await self._stage(
            f"snapshot of {len(ranges)} id ranges", rdd, LEDGERS, LEDGER_COLUMNS
        )

    async def judge_snapshot(self, job: SnapshotJudge, directory: Path) -> list[PartitionResult]:
        frame = self.spark.read.parquet(_uri(directory / LEDGERS))
        rdd = frame.rdd.mapPartitions(_judge_task(job))
        return await self._stage(f"judge snapshot {directory}", rdd)

    async def scan_ranges(self, spec: ScanSpec, ranges: list[IdRange]) -> list[PartitionResult]:
        task = _range_task(anchored(spec))
        rdd = self.sc.parallelize(ranges, len(ranges)).mapPartitions(task)
        return await self._stage(f"scan of {len(ranges)} id ranges", rdd)

    async def recheck(
        self, spec: ScanSpec, ledger_ids: list[int], attempt: int, partitions: int
    ) -> list[PartitionResult]:
        parts = len(chunks(ledger_ids, partitions))
        task = _recheck_task(anchored(spec), attempt)
        rdd = self.sc.parallelize(ledger_ids, parts).mapPartitions(task)
        return await self._stage(f"re-check {attempt} of {len(ledger_ids)} ledgers", rdd)

    async def write_violations(self, rows: list[ViolationRow]) -> None:
        if self.out is None:
            return
        out = self.out

        def write() -> None:
            # The driver's own rows (the grace check) join the executors' coverage.
            if self._driver_rows or not self._coverage_written:
                df = self.spark.createDataFrame(self._driver_rows, spark_schema(COVERAGE_COLUMNS))
                df.coalesce(1).write.mode("append").parquet(_uri(partial(out, COVERAGE)))
                self._driver_rows.clear()
                self._coverage_written = True
            frame = self.spark.createDataFrame(rows, spark_schema(VIOLATION_COLUMNS))
            frame.coalesce(1).write.mode("overwrite").parquet(_uri(partial(out, VIOLATIONS)))
            publish_datasets(out)

        await self._job("write violations", write)

    def _job_ended(self, call: asyncio.Future[Any]) -> None:
        self._jobs.discard(call)
        if not call.cancelled():
            call.exception()  # a cancelled run's job fails; nobody awaits it any more

    async def close(self) -> None:
        """Stops the session once no call of ours into a job is left.

        A SparkContext stopped while a job's call is still in a thread can leave that
        call waiting for good (seen in the daemon's tests: the job of a run cancelled by
        lost leadership), and with it whatever joins the thread: the event loop's
        shutdown, the process's exit. So every job still running is cancelled, again
        each half second (a job submitted just after a cancellation escapes it), until
        the calls return, for at most `CLOSE_WAIT` seconds; then the session stops.
        """
        deadline = asyncio.get_running_loop().time() + CLOSE_WAIT
        while self._jobs and asyncio.get_running_loop().time() < deadline:
            self.sc.cancelAllJobs()
            await asyncio.wait(set(self._jobs), timeout=0.5)
        await asyncio.to_thread(self.spark.stop)
