"""The bulk scan on a real standalone Spark cluster, submitted as docs/spark.md tells an
operator to: `deploy/spark/submit.sh` (spark-submit in client mode) against a master and two
workers of their own processes, the project shipped in the archive of
`deploy/spark/pack-venv.sh` (`--archives ...#environment`), so the executors run only what
the job ships. `local[2]` (tests/integration/test_scan.py) hides all of that.

Every test uses the seeded cluster of the local[2] tests (one fault per category) and holds
the standalone scan against the in-process engine on the same cluster: summary, marks and
Parquet rows (and, for the first two, `check all`). Parity: a plain cluster, and a secured
one (ZooKeeper digest auth over mutual TLS, bookies that want TLS with our certificate,
all given to the driver by paths relative to its working directory). Faults: a Spark worker
killed (SIGKILL, with its executor and its Python workers) while a scan task runs on it, at
an observed point (the task of the last id range asking the gate bookie about a seeded
fault ledger, which holds every answer until the kill is done); speculation on, with that
task held by one slow answer, and a bookie the executors cannot reach; the driver killed
between stages, and the same scan run again into the same output directory.

The module is one unit of work for pytest-xdist (tests/xdist_groups.py): its cluster and
archive are made once, on one worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from auditor.bookie.tls import TLS_CONTEXT_FACTORY
from auditor.cli.main import main
from auditor.metadata.registry import available_path, service_info_bytes
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.testing.bookie import BookieEmulator
from auditor.testing.cli import bk
from auditor.testing.pki import Issued, issue, new_ca, server_context
from auditor.testing.seeded import EXPECTED, ROOT, build_seeded_cluster
from auditor.testing.sparkcluster import SparkStandalone, http_json
from auditor.testing.sparkvenv import PackedVenv, packed_venv
from auditor.testing.zkserver import (
    ServerTls,
    ZkTlsMaterial,
    ZooKeeperServer,
    free_port,
    make_tls_material,
)
from auditor.zk import ZkClient, ZkSecurity, parse_zk_auth

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SUBMIT = REPO / "deploy" / "spark" / "submit.sh"
#: Of one spark-submit, from JVM start to exit (s): a hung job must fail the test.
SUBMIT_TIMEOUT = 420.0
HEALTHY = 400
PARTITIONS = 6
SCANNED = ("placement", "replicas", "grace")
VOLATILE = {"age_s"}
#: The bookie client's back-off, told in a reason when a request found it waiting to
#: reconnect: how long it still had to wait is timing, in either engine.
BACKOFF = re.compile(r" \(next attempt in [0-9.]+s\)")


def _stable(detail: dict[str, Any]) -> str:
    """A violation's detail without what timing decides (its age, a back-off's wait)."""
    kept = {k: v for k, v in detail.items() if k not in VOLATILE}
    # in `reason`, or in an `unanswered` bookie's reason
    return BACKOFF.sub("", json.dumps(kept, sort_keys=True))


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
    conf: Sequence[str] = (),
    cwd: Path | None = None,
) -> Submitted:
    """`deploy/spark/submit.sh scan ...` as docs/spark.md has it, with this cluster's master
    and PySpark's own spark-submit, from a directory holding nothing of the project (`cwd`,
    made empty when not given). `conf`: more `spark-submit --conf KEY=VALUE`."""
    ui_port = free_port()
    log = out.with_suffix(".log")
    env = spark.env()  # no PYTHONPATH, no virtualenv of the test's
    more = "".join(f" --conf {c}" for c in conf)
    env.update(
        MASTER=spark.url,
        VENV_DIR=str(packed.directory),
        SPARK_SUBMIT=str(spark.home / "bin" / "spark-submit"),
        SUBMIT_OPTS=f"{SUBMIT_OPTS} --conf spark.ui.port={ui_port}{more}",
    )
    if cwd is None:
        cwd = out.parent / f"{out.name}-cwd"
        cwd.mkdir(exist_ok=True)
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
            _stable(v["detail"]),
        )
        for v in report["violations"]
    )


def _rows(out: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every coverage row and every violation row (evidence without its volatile keys)."""
    coverage = sorted(tuple(sorted(r.items())) for r in _table(out / "coverage"))
    violations = []
    for r in _table(out / "violations"):
        evidence = json.loads(r.pop("evidence"))
        stable = _stable(evidence) if isinstance(evidence, dict) else json.dumps(evidence)
        violations.append((*sorted(r.items()), stable))
    return coverage, sorted(violations, key=repr)


def _marks(out: Path, bookies: list[BookieEmulator]) -> list[tuple[int, list[int], bool]]:
    ids = {b.bookie_id: i for i, b in enumerate(bookies)}
    doc = json.loads((out / "marks.json").read_text())
    return [
        (m["ledger_id"], sorted(ids[b] for b in m["missing_replicas"]), m["marked"]) for m in doc
    ]


def _assert_same_reports(
    got: dict[str, Any], want: dict[str, Any], checks: Iterable[str], marked: bool = False
) -> None:
    """Two `check all --json` documents (a scan's summary.json is one) agree on `checks`."""
    for check in checks:
        a, b = got["reports"][check], want["reports"][check]
        assert a["counts"] == b["counts"], check
        assert _violations(a) == _violations(b), check
        assert a["ledgers_checked"] == b["ledgers_checked"], check
        assert a["ledgers_skipped"] == b["ledgers_skipped"], check
        assert a.get("coverage") == b.get("coverage"), check
        if not marked:
            assert a.get("marked_underreplicated") == b.get("marked_underreplicated"), check


async def _check_all(zk_hosts: str, settings: list[str], *extra: str) -> dict[str, Any]:
    """`bk-auditor check all --json` (a child process) on the same cluster and settings."""
    code, out, err = await bk(
        "check", "all", "--zk", zk_hosts, *_sets(settings), *extra, "--json", within=SUBMIT_TIMEOUT
    )
    assert code == 1, err[-3000:]
    doc: dict[str, Any] = json.loads(out)
    return doc


def _assert_equals_check_all(got: Path, check_all: dict[str, Any]) -> None:
    """The scan's summary holds, for every check it ran, what `check all` reports."""
    summary = json.loads((got / "summary.json").read_text())
    assert set(summary["reports"]) == {*SCANNED, "metadata"}
    shared = [c for c in summary["reports"] if c in check_all["reports"]]
    assert set(SCANNED) <= set(shared)
    _assert_same_reports(summary, check_all, shared)


def _assert_same_scan(
    got: Path, want: Path, bookies: list[BookieEmulator], marked: bool = False
) -> None:
    """The standalone scan's output equals the in-process one's: summary, marks, rows.
    `marked`: the standalone scan ran with `--mark` and the in-process one without."""
    g, w = (json.loads((d / "summary.json").read_text()) for d in (got, want))
    assert list(g["reports"]) == list(w["reports"])
    _assert_same_reports(g, w, g["reports"], marked)
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
    _assert_equals_check_all(got, await _check_all(zk_hosts, SETTINGS))
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


# --- a secured cluster: ZooKeeper digest auth over mutual TLS, bookies that want TLS ------

ZK_USER = "digest:alice:alice-secret"
#: A TLS connection costs the emulated bookies (in this process) far more than a plain
#: one: on a busy machine, one second was seen running out for answering bookies. The
#: silent bookie 7 is judged by `startTLSTimeoutSecs` (it never answers START_TLS).
SECURED_SETTINGS = [*SETTINGS[1:], "readEntryTimeout=10"]


@dataclass(frozen=True)
class Secured:
    """A ZooKeeper that takes only authenticated sessions (digest) and serves TLS with
    ssl.clientAuth=need; the bookies' CA and certificates; the client's files."""

    server: ZooKeeperServer
    zk_tls: ZkTlsMaterial
    bookie_ca: Issued
    bookie: Issued
    client: Issued


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    pki = tmp_path_factory.mktemp("secured-pki")
    material = make_tls_material(pki / "zk")
    ca = new_ca(pki, "bookie-ca")
    bookie = issue(pki, "bookie", ca, "bookie", ["IP:127.0.0.1", "DNS:localhost"])
    client = issue(pki, "auditor", ca, "auditor")
    server = ZooKeeperServer(require_auth=("digest",), tls=ServerTls(material, "need"))
    began = time.monotonic()
    server.start()
    _timed("secured ZooKeeper (digest, TLS need) start", time.monotonic() - began)
    try:
        yield Secured(server, material, ca, bookie, client)
    finally:
        server.destroy()


def _client_files(sec: Secured, directory: Path) -> dict[str, Path]:
    """The driver's files, as an operator keeps them: the credentials (mode 600), ZooKeeper's
    client properties, the bookies' CA, our certificate and key. The properties name the
    stores by paths relative to `directory`, the driver's working directory."""
    d = directory / "secrets"
    d.mkdir(parents=True)
    files = {
        "zk_ca": d / "zk-ca.pem",
        "zk_key_store": d / "zk-client.pem",
        "bookie_ca": d / "bookie-ca.pem",
        "cert": d / "auditor.pem",
        "key": d / "auditor.key",
    }
    shutil.copy(sec.zk_tls.ca.cert, files["zk_ca"])
    shutil.copy(sec.zk_tls.client_pem, files["zk_key_store"])
    shutil.copy(sec.bookie_ca.cert, files["bookie_ca"])
    shutil.copy(sec.client.cert, files["cert"])
    shutil.copy(sec.client.key, files["key"])
    auth = d / "zk-auth"
    auth.write_text(ZK_USER + "\n")
    auth.chmod(0o600)
    files["auth"] = auth
    props = d / "zk-client.properties"
    props.write_text(
        "zookeeper.client.secure=true\n"
        "zookeeper.ssl.trustStore.location=secrets/zk-ca.pem\n"
        "zookeeper.ssl.keyStore.location=secrets/zk-client.pem\n"
    )
    files["props"] = props
    return files


def _bookie_tls_keys(files: dict[str, Path], base: Path | None) -> list[str]:
    """Mutual bookie TLS as BookKeeper's client keys; paths relative to `base`, or absolute."""

    def at(key: str) -> str:
        return str(files[key].relative_to(base)) if base is not None else str(files[key])

    return [
        f"tlsProviderFactoryClass={TLS_CONTEXT_FACTORY}",
        "tlsTrustStoreType=PEM",
        f"tlsTrustStore={at('bookie_ca')}",
        "tlsClientAuthentication=true",
        "tlsKeyStoreType=PEM",
        f"tlsKeyStore={at('key')}",
        f"tlsCertificatePath={at('cert')}",
        "startTLSTimeoutSecs=2",  # the silent bookie 7 never answers START_TLS
    ]


@pytest.mark.timeout(600)  # spark-submit runs of up to SUBMIT_TIMEOUT each
async def test_a_secured_cluster_scans_the_same(
    secured: Secured,
    spark: SparkStandalone,
    packed: PackedVenv,
    jobs: list[Submitted],
    tmp_path: Path,
) -> None:
    """ZooKeeper wants digest credentials on a mutual-TLS port and every bookie wants TLS with
    our certificate. The driver is given them as an operator gives them, by files relative
    to its working directory; the executors (other processes, other directories) must
    scan with them all the same: the standalone scan equals the in-process engine and
    `check all`, given the same settings by absolute paths."""
    chroot = f"/t-{uuid.uuid4().hex[:12]}"
    auth = ZkSecurity(parse_zk_auth(ZK_USER))
    async with ZkClient(secured.server.hosts, timeout=10.0, security=auth) as root:
        await root.ensure_path(chroot)
    writer = ZkClient(f"{secured.server.hosts}{chroot}", timeout=10.0, security=auth)
    await writer.start()
    context = server_context(secured.bookie, client_ca=secured.bookie_ca)
    bookies = [
        BookieEmulator(writer, ledgers_root=ROOT, tls=context, tls_required=True) for _ in range(8)
    ]
    try:
        for b in bookies:
            await b.start()
        await build_seeded_cluster(writer, bookies, HEALTHY)
        await bookies[6].crash()
        bookies[7].pause()

        cwd = tmp_path / "driver"
        files = _client_files(secured, cwd)
        hosts = f"{secured.server.secure_hosts}{chroot}"
        tls_config = tmp_path / "zk-client-absolute.properties"
        tls_config.write_text(
            "zookeeper.client.secure=true\n"
            f"zookeeper.ssl.trustStore.location={files['zk_ca']}\n"
            f"zookeeper.ssl.keyStore.location={files['zk_key_store']}\n"
        )
        absolute = ["--zk-auth-file", str(files["auth"]), "--zk-tls-config", str(tls_config)]
        settings = [*SECURED_SETTINGS, *_bookie_tls_keys(files, None)]

        want = tmp_path / "asyncio"
        assert await _in_process(hosts, want, settings, *absolute) == 1
        check_all = await _check_all(hosts, settings, *absolute)

        got = tmp_path / "standalone"
        began = time.monotonic()
        relative = [
            "--zk-auth-file", "secrets/zk-auth", "--zk-tls-config", "secrets/zk-client.properties"
        ]  # fmt: skip
        job = await _submit(
            jobs, spark, packed, hosts, got, [*SECURED_SETTINGS, *_bookie_tls_keys(files, cwd)],
            *relative, cwd=cwd,
        )  # fmt: skip
        code = await job.wait()
        assert code == 1, job.log.read_text()[-3000:]
        _timed("standalone scan of the secured cluster", time.monotonic() - began)

        summary = json.loads((got / "summary.json").read_text())
        for check in SCANNED:
            assert summary["reports"][check]["counts"] == EXPECTED[check], check
        _assert_same_scan(got, want, bookies)
        _assert_equals_check_all(got, check_all)
        # Every answering bookie was spoken to over TLS only, with our certificate.
        for b in bookies[:6]:
            assert b.tls_failures == [], b.bookie_id
            assert b.tls_handshakes > 0, b.bookie_id
    finally:
        for b in bookies:
            await b.stop()
        await writer.close()


# --- faults: speculation, an unreachable bookie, the driver killed ------------------------

#: Speculative copies as soon as Spark may: half the stage done, a task slower than 1.5
#: times the median, checked every 100 ms; by time alone (Spark's efficiency rule would
#: let a task that reads as fast as the others run on).
SPECULATION = [
    "spark.speculation=true",
    "spark.speculation.interval=100ms",
    "spark.speculation.quantile=0.5",
    "spark.speculation.multiplier=1.5",
    "spark.speculation.minTaskRuntime=100ms",
    "spark.speculation.efficiency.enabled=false",
]
#: How long bookie 0 holds its first answer about a seeded fault ledger: far longer than
#: any task takes, far shorter than `readEntryTimeout` (KILL_SETTINGS).
SLOW_ANSWER = 90.0


def _event_log(directory: Path) -> list[dict[str, Any]]:
    """Every event of the Spark event logs in `directory` (JSON lines, uncompressed): Spark 4
    writes a directory per application, `eventlog_v2_APP/events_N_APP` (beside an empty
    `appstatus_APP` and Hadoop's `.NAME.crc` checksum files)."""
    events = []
    for path in sorted(directory.rglob("events_*")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return events


def _event_conf(directory: Path) -> list[str]:
    directory.mkdir()
    return [
        "spark.eventLog.enabled=true",
        f"spark.eventLog.dir={directory.as_uri()}",
        "spark.eventLog.compress=false",
    ]


def _jobs_by_description(events: list[dict[str, Any]]) -> dict[str, list[list[int]]]:
    """The scan's Spark jobs by their description (set by the engine: a stage's two jobs,
    computing it and writing its rows, share one), each as its stage ids, in order."""
    jobs: dict[str, list[list[int]]] = {}
    for e in events:
        if e["Event"] == "SparkListenerJobStart":
            what = e.get("Properties", {}).get("spark.job.description", "")
            jobs.setdefault(what, []).append([int(i) for i in e["Stage IDs"]])
    return jobs


def _slow_first_answer(bookie: BookieEmulator, first: int, seconds: float) -> asyncio.Event:
    """`bookie` answers its first request about a ledger from `first` up after `seconds`,
    everything else at once; the event says that request came."""
    came = asyncio.Event()

    def latency(request: pb.Request) -> float:
        if not came.is_set():
            for name in ("readRequest", "readLacRequest", "getListOfEntriesOfLedgerRequest"):
                if request.HasField(name) and getattr(request, name).ledgerId >= first:
                    came.set()
                    return seconds
        return 0.0

    bookie.set_latency(latency)
    return came


def _rechecked(log: str) -> list[int]:
    """How many ledgers each BP-34 re-check stage took up, from a scan driver's log."""
    return [
        int(n) for n in re.findall(r"re-checking potentially faulty ledgers.* ledgers=(\d+)", log)
    ]


async def _unreachable(zk: ZkClient, bookie: BookieEmulator) -> socket.socket:
    """`bookie` stays up and registered, but its registration names a port that refuses every
    connection (bound and never listening, so no one else takes it meanwhile), as a firewall
    rejecting the executors would: whoever resolves it (only the executors, in a Spark scan)
    gets `Connection refused`, the same way every time."""
    closed = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    closed.bind((bookie.host, 0))
    port = closed.getsockname()[1]
    await zk.set(available_path(ROOT, bookie.bookie_id), service_info_bytes(bookie.host, port))
    return closed


@pytest.mark.timeout(600)  # spark-submit runs of up to SUBMIT_TIMEOUT each
async def test_speculation_and_an_unreachable_bookie(
    zk: ZkClient,
    zk_hosts: str,
    seeded_answering: list[BookieEmulator],
    spark: SparkStandalone,
    packed: PackedVenv,
    jobs: list[Submitted],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Bookie 5 cannot be reached (its ledgers go to the BP-34 re-check, and are judged
    there as the in-process engine judges them under the same fault), and speculation is
    on with the last range's task held up by one slow answer of bookie 0: Spark runs a
    speculative copy of it, and the output is the in-process engine's all the same,
    every mark written once."""
    bookies = seeded_answering
    refusing = await _unreachable(zk, bookies[5])
    try:
        urm = UnderreplicationManager(zk, ROOT)
        before = {ur.ledger_id async for ur in urm.list_underreplicated()}
        want = tmp_path / "asyncio"
        capfd.readouterr()
        assert await _in_process(zk_hosts, want, KILL_SETTINGS) == 1
        rechecked = _rechecked(capfd.readouterr().err)
        replicas = json.loads((want / "summary.json").read_text())["reports"]["replicas"]
        lost = {
            v["ledger_id"] for v in replicas["violations"] if v["bookie"] == bookies[5].bookie_id
        }
        # Half the healthy ledgers are on bookie 5 (rings (1, 3, 5), (3, 5, 1), (5, 1, 3)):
        # each was re-checked once (BP-34) and is judged unavailable there.
        assert len(lost) >= HEALTHY // 2
        assert len(rechecked) == 1 and rechecked[0] >= len(lost)

        slow = _slow_first_answer(bookies[0], 3000, SLOW_ANSWER)
        events = tmp_path / "events"
        got = tmp_path / "standalone"
        began = time.monotonic()
        job = await _submit(
            jobs, spark, packed, zk_hosts, got, KILL_SETTINGS, "--mark",
            conf=[*SPECULATION, *_event_conf(events)],
        )  # fmt: skip
        code = await job.wait()
        _timed("standalone scan with speculation, bookie 5 unreachable", time.monotonic() - began)
        assert code == 1, job.log.read_text()[-3000:]
        assert slow.is_set()
    finally:
        bookies[0].set_latency(None)
        refusing.close()

    log = _event_log(events)
    jobs_run = _jobs_by_description(log)
    computed = jobs_run[f"scan of {PARTITIONS} id ranges"][0]  # the job computing the ranges
    starts = [
        e["Task Info"]
        for e in log
        if e["Event"] == "SparkListenerTaskStart" and e["Stage ID"] in computed
    ]
    ends = {
        e["Task Info"]["Task ID"]: e["Task End Reason"]["Reason"]
        for e in log
        if e["Event"] == "SparkListenerTaskEnd" and e["Stage ID"] in computed
    }
    # The held range's task got a speculative copy, which finished first; the original was
    # killed for it. (On a busy machine another task may be speculated too: no matter.)
    held = [t for t in starts if t["Index"] == PARTITIONS - 1]
    assert sorted((t["Speculative"], ends[t["Task ID"]]) for t in held) == [
        (False, "TaskKilled"),
        (True, "Success"),
    ], held
    # BP-34: the same ledgers as in process were looked at again, in a re-check stage.
    assert _rechecked(job.log.read_text()) == rechecked
    assert f"re-check 1 of {rechecked[0]} ledgers" in jobs_run, list(jobs_run)

    _assert_same_scan(got, want, bookies, marked=True)
    assert _marks(got, bookies) == [(3002, [0, 4], True), (3003, [3], True), (3004, [4], True)]
    after = {ur.ledger_id: ur async for ur in urm.list_underreplicated()}
    assert set(after) - before == {3002, 3003, 3004}
    assert all(after[i].znode_version == 0 for i in (3002, 3003, 3004))


async def _appears(path: Path, job: Submitted) -> None:
    """Returns once `path` exists (polled: a file another process writes), within
    SUBMIT_TIMEOUT."""
    async with asyncio.timeout(SUBMIT_TIMEOUT):
        while not await asyncio.to_thread(path.exists):
            assert job.proc.returncode is None, f"spark-submit exited early; see {job.log}"
            await asyncio.sleep(0.2)


def _no_application_running(spark: SparkStandalone, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while spark.status().get("activeapps"):
        assert time.monotonic() < deadline, spark.status()["activeapps"]
        time.sleep(0.2)


@pytest.mark.timeout(900)  # spark-submit runs of up to SUBMIT_TIMEOUT each
async def test_the_driver_killed_mid_scan_then_run_again(
    zk: ZkClient,
    zk_hosts: str,
    seeded: list[BookieEmulator],
    spark: SparkStandalone,
    packed: PackedVenv,
    jobs: list[Submitted],
    tmp_path: Path,
) -> None:
    """spark-submit (the driver) SIGKILLed after the first stage's coverage rows are written,
    while it waits out the BP-34 delay before re-checking the silent bookie's ledger:
    DIR holds nothing a reader takes for output (no summary, no marks, no dataset outside
    `_partial/`) and no mark is written; the same command run again, into the same DIR
    and without --overwrite, gives the whole result and writes every mark once."""
    urm = UnderreplicationManager(zk, ROOT)
    before = {ur.ledger_id async for ur in urm.list_underreplicated()}
    want = tmp_path / "asyncio"
    assert await _in_process(zk_hosts, want, SETTINGS) == 1

    got = tmp_path / "standalone"
    waiting = [s for s in SETTINGS if not s.startswith("checks.retry_delay=")]
    waiting.append("checks.retry_delay=600")
    began = time.monotonic()
    job = await _submit(jobs, spark, packed, zk_hosts, got, waiting, "--mark")
    # The scan stage's coverage rows committed; the driver now sleeps out the retry delay.
    await _appears(got / "_partial" / "coverage" / "_SUCCESS", job)
    job.kill()
    assert await asyncio.wait_for(job.proc.wait(), 60) == -signal.SIGKILL
    _timed("driver killed after the scan stage", time.monotonic() - began)
    await asyncio.to_thread(_no_application_running, spark)

    assert sorted(p.name for p in got.iterdir()) == ["_partial"]
    # A reader of DIR as a dataset finds nothing: '_partial' is skipped.
    assert ds.dataset(str(got), format="parquet").files == []
    assert {ur.ledger_id async for ur in urm.list_underreplicated()} == before

    began = time.monotonic()
    again = await _submit(jobs, spark, packed, zk_hosts, got, SETTINGS, "--mark")
    code = await again.wait()
    _timed("the same scan run again into the same DIR", time.monotonic() - began)
    assert code == 1, again.log.read_text()[-3000:]
    assert not (got / "_partial").exists()
    _assert_same_scan(got, want, seeded, marked=True)
    assert _marks(got, seeded) == [(3002, [0, 4], True), (3003, [3], True), (3004, [4], True)]
    after = {ur.ledger_id: ur async for ur in urm.list_underreplicated()}
    assert set(after) - before == {3002, 3003, 3004}
    assert all(after[i].znode_version == 0 for i in (3002, 3003, 3004))
