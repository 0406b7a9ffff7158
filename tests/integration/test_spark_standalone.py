"""The bulk scan on a real standalone Spark cluster, submitted as docs/spark.md tells an
operator to: `deploy/spark/submit.sh` (spark-submit in client mode) against a master and two
workers of their own processes, the project shipped in the archive of
`deploy/spark/pack-venv.sh` (`--archives ...#environment`), so the executors run only what
the job ships. `local[2]` (tests/integration/test_scan.py) hides all of that.

Both tests use the seeded cluster of the local[2] tests (one fault per category) and hold
the standalone scan against the in-process engine on the same cluster: summary, marks and
Parquet rows. The second one kills a Spark worker (SIGKILL, with its executor and its Python
workers) while a scan task runs on it, at an observed point: the task of the last id range
asking the gate bookie about a seeded fault ledger, which holds every answer until the kill
is done.

The module is one unit of work for pytest-xdist (tests/xdist_groups.py): its cluster and
archive are made once, on one worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from auditor.cli.main import main
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.testing.bookie import BookieEmulator
from auditor.testing.seeded import EXPECTED, ROOT, build_seeded_cluster
from auditor.testing.sparkcluster import SparkStandalone, http_json
from auditor.testing.sparkvenv import PackedVenv, packed_venv
from auditor.testing.zkserver import free_port
from auditor.zk import ZkClient

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SUBMIT = REPO / "deploy" / "spark" / "submit.sh"
#: Of one spark-submit, from JVM start to exit (s): a hung job must fail the test.
SUBMIT_TIMEOUT = 420.0
HEALTHY = 400
PARTITIONS = 6
SCANNED = ("placement", "replicas", "grace")
VOLATILE = {"age_s"}
#: As the local[2] parity test (tests/integration/test_scan.py) sets them.
SETTINGS = [
    "readEntryTimeout=1",
    "checks.retry_delay=0.2",
    "checks.retry_attempts=1",
    "underreplicatedLedgerRecoveryGracePeriod=3600",
]
#: The worker-kill test holds one bookie's answers while it kills: they must not time out.
KILL_SETTINGS = [*SETTINGS[1:], "readEntryTimeout=120"]
#: What the job gets: one 512 MB executor of one core per worker, small heaps, C1 only.
SUBMIT_OPTS = " ".join(
    [
        "--driver-memory 512m",
        "--executor-memory 512m",
        "--conf spark.executor.cores=1",
        "--conf spark.cores.max=2",
        "--conf spark.default.parallelism=2",
        "--conf spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1",
        "--conf spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1",
        "--conf spark.ui.enabled=true",
    ]
)


def _timed(what: str, seconds: float) -> None:
    """One line per measured step, for the report (pytest -s, or the captured output)."""
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"spark-standalone: {what} {seconds:.1f} s (load {' '.join(load)})", file=sys.stderr)


@pytest.fixture(scope="session")
def packed() -> Iterator[PackedVenv]:
    """The archive of this checkout, packed once per dependency set and session."""
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    venv = packed_venv(REPO, python)
    _timed(f"pack-venv ({venv.how})", venv.seconds)
    try:
        yield venv
    finally:
        venv.release()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    cluster = SparkStandalone(workers=2, cores=1, base_dir=tmp_path_factory.mktemp("spark"))
    cluster.start()
    _timed("cluster start (master and 2 workers ALIVE)", cluster.start_seconds)
    try:
        yield cluster
    finally:
        cluster.destroy()


async def _seeded_bookies(zk: ZkClient, silent: bool) -> list[BookieEmulator]:
    bookies = [BookieEmulator(zk, ledgers_root=ROOT) for _ in range(8)]
    for b in bookies:
        await b.start()
    await build_seeded_cluster(zk, bookies, HEALTHY)
    await bookies[6].crash()
    if silent:
        bookies[7].pause()
    return bookies


@pytest.fixture
async def seeded(zk: ZkClient) -> AsyncIterator[list[BookieEmulator]]:
    """The local[2] tests' seeded cluster: bookie 6 crashed, bookie 7 silent."""
    bookies = await _seeded_bookies(zk, silent=True)
    try:
        yield bookies
    finally:
        for b in bookies:
            await b.stop()


@pytest.fixture
async def seeded_answering(zk: ZkClient) -> AsyncIterator[list[BookieEmulator]]:
    """The same without the silent bookie: the worker-kill test holds a bookie itself."""
    bookies = await _seeded_bookies(zk, silent=False)
    try:
        yield bookies
    finally:
        for b in bookies:
            await b.stop()


def _sets(settings: list[str]) -> list[str]:
    return [a for s in settings for a in ("--set", s)]


async def _in_process(zk_hosts: str, out: Path, settings: list[str], *extra: str) -> int:
    """The asyncio engine through the real CLI, off the loop (the bookies must answer)."""
    args = ["scan", "--engine", "asyncio", "--partitions", str(PARTITIONS), "--zk", zk_hosts]
    argv = [*args, *_sets(settings), *extra, "--out", str(out)]
    return await asyncio.to_thread(main, argv)


class Submitted:
    """One `submit.sh` run: its process, its UI port (the driver's REST API), its log."""

    def __init__(self, proc: asyncio.subprocess.Process, ui_port: int, log: Path) -> None:
        self.proc = proc
        self.ui_port = ui_port
        self.log = log

    async def wait(self) -> int:
        try:
            return await asyncio.wait_for(self.proc.wait(), SUBMIT_TIMEOUT)
        except TimeoutError:
            self.kill()
            await self.proc.wait()
            raise AssertionError(
                f"spark-submit ran over {SUBMIT_TIMEOUT:g}s; see {self.log}"
            ) from None

    def kill(self) -> None:
        """spark-submit's JVM and the Python driver it started (one process group)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def rest(self, path: str) -> Any:
        """The driver's monitoring REST API (`/api/v1/...`)."""
        return http_json(f"http://127.0.0.1:{self.ui_port}/api/v1/{path}")


@pytest.fixture
async def jobs() -> AsyncIterator[list[Submitted]]:
    """The test's spark-submit runs: one a failed test left running is killed."""
    started: list[Submitted] = []
    try:
        yield started
    finally:
        for job in started:
            job.kill()
            await asyncio.wait_for(job.proc.wait(), 30)


async def _submit(
    jobs: list[Submitted],
    spark: SparkStandalone,
    packed: PackedVenv,
    zk_hosts: str,
    out: Path,
    settings: list[str],
    *extra: str,
) -> Submitted:
    """`deploy/spark/submit.sh scan ...` as docs/spark.md has it, with this cluster's master
    and PySpark's own spark-submit, from a directory holding nothing of the project."""
    ui_port = free_port()
    log = out.with_suffix(".log")
    env = spark.env()  # no PYTHONPATH, no virtualenv of the test's
    env.update(
        MASTER=spark.url,
        VENV_DIR=str(packed.directory),
        SPARK_SUBMIT=str(spark.home / "bin" / "spark-submit"),
        SUBMIT_OPTS=f"{SUBMIT_OPTS} --conf spark.ui.port={ui_port}",
    )
    cwd = out.parent / f"{out.name}-cwd"
    cwd.mkdir()
    args = [
        "scan", "--engine", "spark", "--partitions", str(PARTITIONS), "--zk", zk_hosts,
        *_sets(settings), *extra, "--out", str(out),
    ]  # fmt: skip
    with log.open("wb") as f:
        proc = await asyncio.create_subprocess_exec(
            str(SUBMIT), *args, stdout=f, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True,
        )  # fmt: skip
    jobs.append(Submitted(proc, ui_port, log))
    return jobs[-1]


def _table(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ds.dataset(str(path), format="parquet").to_table().to_pylist()
    return rows


def _violations(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    return sorted(
        (
            v["ledger_id"],
            v["category"],
            v["bookie"],
            json.dumps({k: x for k, x in v["detail"].items() if k not in VOLATILE}, sort_keys=True),
        )
        for v in report["violations"]
    )


def _rows(out: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every coverage row and every violation row (evidence without its volatile keys)."""
    coverage = sorted(tuple(sorted(r.items())) for r in _table(out / "coverage"))
    violations = []
    for r in _table(out / "violations"):
        evidence = json.loads(r.pop("evidence"))
        if isinstance(evidence, dict):
            evidence = {k: v for k, v in evidence.items() if k not in VOLATILE}
        violations.append((*sorted(r.items()), json.dumps(evidence, sort_keys=True)))
    return coverage, sorted(violations, key=repr)


def _marks(out: Path, bookies: list[BookieEmulator]) -> list[tuple[int, list[int], bool]]:
    ids = {b.bookie_id: i for i, b in enumerate(bookies)}
    doc = json.loads((out / "marks.json").read_text())
    return [
        (m["ledger_id"], sorted(ids[b] for b in m["missing_replicas"]), m["marked"]) for m in doc
    ]


def _assert_same_scan(
    got: Path, want: Path, bookies: list[BookieEmulator], marked: bool = False
) -> None:
    """The standalone scan's output equals the in-process one's: summary, marks, rows.
    `marked`: the standalone scan ran with `--mark` and the in-process one without."""
    g, w = (json.loads((d / "summary.json").read_text()) for d in (got, want))
    assert list(g["reports"]) == list(w["reports"])
    for check in g["reports"]:
        a, b = g["reports"][check], w["reports"][check]
        assert a["counts"] == b["counts"], check
        assert _violations(a) == _violations(b), check
        assert a["ledgers_checked"] == b["ledgers_checked"], check
        assert a["ledgers_skipped"] == b["ledgers_skipped"], check
        assert a.get("coverage") == b.get("coverage"), check
        if not marked:
            assert a.get("marked_underreplicated") == b.get("marked_underreplicated"), check
    assert [(i, b, m or marked) for i, b, m in _marks(want, bookies)] == _marks(got, bookies)
    got_coverage, got_violations = _rows(got)
    want_coverage, want_violations = _rows(want)
    # No row twice (a task run again), none missing (a task lost).
    keys = [(dict(r)["ledger_id"], dict(r)["check"]) for r in got_coverage]
    assert len(keys) == len(set(keys))
    assert got_coverage == want_coverage
    assert got_violations == want_violations


def _shipped_environments(spark: SparkStandalone) -> list[Path]:
    # WORKER/work/APP/EXECUTOR/environment/bin/python
    """The archives Spark unpacked for executors, in the workers' work directories."""
    return sorted(
        p
        for w in spark.workers
        for p in (w.directory / "work").glob("app-*/*/environment/bin/python")
    )


async def test_standalone_scan_equals_the_in_process_engine(
    zk: ZkClient,
    zk_hosts: str,
    seeded: list[BookieEmulator],
    spark: SparkStandalone,
    packed: PackedVenv,
    jobs: list[Submitted],
    tmp_path: Path,
) -> None:
    before = set(_shipped_environments(spark))
    want = tmp_path / "asyncio"
    began = time.monotonic()
    assert await _in_process(zk_hosts, want, SETTINGS) == 1
    _timed(f"in-process scan of {HEALTHY + 8} ledgers", time.monotonic() - began)

    got = tmp_path / "standalone"
    began = time.monotonic()
    job = await _submit(jobs, spark, packed, zk_hosts, got, SETTINGS)
    code = await job.wait()
    assert code == 1, job.log.read_text()[-3000:]
    _timed(
        f"standalone scan of {HEALTHY + 8} ledgers (spark-submit to exit)", time.monotonic() - began
    )

    summary = json.loads((got / "summary.json").read_text())
    for check in SCANNED:
        assert summary["reports"][check]["counts"] == EXPECTED[check], check
    assert summary["reports"]["metadata"]["counts"] == {"metadata_invalid": 1}
    _assert_same_scan(got, want, seeded)
    assert _marks(got, seeded) == [(3002, [0, 4], False), (3003, [3], False), (3004, [4], False)]
    # Both workers ran executors, each from the archive the job shipped.
    shipped = set(_shipped_environments(spark)) - before
    assert len(shipped) == 2
    assert {p.parents[5] for p in shipped} == {w.directory for w in spark.workers}


def _gate(bookie: BookieEmulator, first: int) -> asyncio.Event:
    """Pauses `bookie` (its answers held, connections open) at its first request about a
    ledger with an id from `first` up; the event says it happened."""
    closed = asyncio.Event()

    def latency(request: pb.Request) -> float:
        if not closed.is_set():
            for name in ("readRequest", "readLacRequest", "getListOfEntriesOfLedgerRequest"):
                if request.HasField(name) and getattr(request, name).ledgerId >= first:
                    bookie.pause()
                    closed.set()
                    return 0.001  # held: the answer is due while paused
        return 0.0

    bookie.set_latency(latency)
    return closed


def _running_last_task(job: Submitted, partitions: int, timeout: float = 120.0) -> tuple[str, int]:
    """The executor running the scan stage's last task, and the tasks done by then, from the
    driver's REST API. The gate holds that task, so this only waits for the API to answer."""
    deadline = time.monotonic() + timeout
    seen = "no answer"
    while time.monotonic() < deadline:
        try:
            app = job.rest("applications")[0]["id"]
            for stage in job.rest(f"applications/{app}/stages?status=active"):
                if stage["numTasks"] != partitions:
                    continue
                where = f"applications/{app}/stages/{stage['stageId']}/{stage['attemptId']}"
                for t in job.rest(f"{where}/taskList?length={partitions * 4}"):
                    if t["index"] == partitions - 1 and t["status"] == "RUNNING":
                        return str(t["executorId"]), int(stage["numCompleteTasks"])
            seen = "the last task not running"
        except (OSError, KeyError, IndexError, ValueError) as exc:  # the UI is slow to answer
            seen = repr(exc)
        time.sleep(0.2)
    raise AssertionError(f"no running last task of the scan stage within {timeout:g}s: {seen}")


async def test_a_worker_killed_mid_scan(
    zk: ZkClient,
    zk_hosts: str,
    seeded_answering: list[BookieEmulator],
    spark: SparkStandalone,
    packed: PackedVenv,
    jobs: list[Submitted],
    tmp_path: Path,
) -> None:
    bookies = seeded_answering
    urm = UnderreplicationManager(zk, ROOT)
    before = {ur.ledger_id async for ur in urm.list_underreplicated()}
    want = tmp_path / "asyncio"
    assert await _in_process(zk_hosts, want, KILL_SETTINGS) == 1

    gate = _gate(bookies[0], 3000)
    got = tmp_path / "standalone"
    began = time.monotonic()
    job = await _submit(jobs, spark, packed, zk_hosts, got, KILL_SETTINGS, "--mark")
    try:
        waiting = asyncio.create_task(gate.wait())
        ended = asyncio.create_task(job.proc.wait())
        await asyncio.wait({waiting, ended}, timeout=SUBMIT_TIMEOUT, return_when="FIRST_COMPLETED")
        assert gate.is_set(), f"the scan never asked bookie 0 about 300x; see {job.log}"
        ended.cancel()
        executor, done = await asyncio.to_thread(_running_last_task, job, PARTITIONS)
        victim = next(
            i
            for i in range(len(spark.workers))
            if any(str(e["id"]) == executor for e in spark.worker_executors(i))
        )
        killed = await asyncio.to_thread(spark.kill_worker, victim)
        _timed(
            f"worker {victim} killed ({len(killed)} processes), {done}/{PARTITIONS} tasks done",
            time.monotonic() - began,
        )
    finally:
        bookies[0].set_latency(None)
        bookies[0].resume()
    code = await job.wait()
    _timed("standalone scan with a worker killed (spark-submit to exit)", time.monotonic() - began)
    spark.start_worker(spark.workers[victim])  # for the tests after this one
    assert code == 1, job.log.read_text()[-3000:]
    assert len(killed) >= 3  # the worker, its executor, the executor's Python daemon at least

    _assert_same_scan(got, want, bookies, marked=True)
    # Marks: written by the driver, once, after the task that ran again.
    assert _marks(got, bookies) == [(3002, [0, 4], True), (3003, [3], True), (3004, [4], True)]
    after = {ur.ledger_id: ur async for ur in urm.list_underreplicated()}
    assert set(after) - before == {3002, 3003, 3004}
    assert all(after[i].znode_version == 0 for i in (3002, 3003, 3004))
    await asyncio.to_thread(spark.wait_alive, len(spark.workers), 120.0)
