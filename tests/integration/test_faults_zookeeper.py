"""ZooKeeper faults under a running leader: restarted in the middle of each check, and
unreachable past the session timeout (a partition, through a proxy that can be cut).

A ZooKeeper server of this module's own is used, so no other test sees the
outage. The bookies register through a client with a long session, which
outlives every outage here.
Outcomes are exact: after the fault, the checks report the seeded faults and
nothing else, the same daemon leads (or leads again, with a new vote, when its
session expired), and marks are the ones the checks call for.

Where a restart lands is not raced: the test freezes the server (SIGSTOP)
from inside the daemon's own log call that marks the chosen point of a check,
so the daemon's next ZooKeeper request meets a dead server whatever the load;
the frozen server is then killed and started again on its data, sessions
intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from kazoo.protocol.serialization import GetChildren, GetChildren2, GetData

from auditor.analysis.risk_run import run_risk
from auditor.api import LIVENESS, READINESS
from auditor.api.server import start_api_server
from auditor.checks.findings import ALL_CHECKS, Check
from auditor.daemon.metrics import Metrics
from auditor.daemon.scheduler import CTIME_KIND
from auditor.daemon.service import Daemon
from auditor.metadata import underreplication
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.bookie import BookieEmulator
from auditor.testing.inprocess import fast_config, running
from auditor.testing.leaks import assert_no_leaks, snapshot
from auditor.testing.netproxy import TcpProxy
from auditor.testing.observe import events_of
from auditor.testing.seeded import ROOT, build_seeded_cluster
from auditor.testing.zkserver import ZooKeeperServer
from auditor.zk import SessionState, ZkClient, ZkUnavailableError
from auditor.zk.multiread import MultiRead

pytestmark = pytest.mark.slow

SESSION = 4.0
VOTES = f"{ROOT}/underreplication/auditorelection"
T = TypeVar("T")


@pytest.fixture(scope="module")
def own_zk() -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


#: The running test's captured log, for failure messages.
_LOG: list[list[MutableMapping[str, Any]]] = []


async def _until(what: str, done: Callable[[], bool], within: float = 120) -> None:
    deadline = time.monotonic() + within
    while not done():
        events = _LOG[0] if _LOG else []
        recent = [(e["event"], e.get("check"), e.get("error")) for e in events[-20:]]
        assert time.monotonic() < deadline, f"not within {within}s: {what}; last events {recent}"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _leader(
    own_zk: ZooKeeperServer,
    session: float,
    *sets: str,
    via: TcpProxy | None = None,
    api: bool = False,
    first_round: bool = True,
) -> AsyncIterator[tuple[Daemon, ZkClient, list[BookieEmulator]]]:
    chroot = f"/f-{uuid.uuid4().hex[:8]}"
    hosts = f"{own_zk.hosts}{chroot}"
    daemon_hosts = f"{via.address}{chroot}" if via is not None else hosts
    async with ZkClient(own_zk.hosts, timeout=10) as root:
        await root.ensure_path(hosts[len(own_zk.hosts) :])
    # A long session for the bookies' registrations: they outlive every outage here.
    zk = ZkClient(hosts, timeout=30, session_timeout=60)
    await zk.start()
    bookies = [BookieEmulator(zk, ledgers_root=ROOT) for _ in range(8)]
    try:
        for b in bookies:
            await b.start()
        await build_seeded_cluster(zk, bookies, healthy=300)
        await bookies[6].crash()
        bookies[7].pause()
        # Reads time out after 4 s, not FAST's 1 s: the paused bookie still costs a timeout
        # per round, and a bookie that answers is never taken for a silent one on a machine
        # busy with other test workers (a 1 s bound was overrun there).
        cfg = fast_config(
            daemon_hosts,
            "zk-faults:1",
            [f"daemon.zk_session_timeout={session}", "readEntryTimeout=4", *sets],
        )
        async with running(cfg, Metrics(), api_factory=_api if api else None) as daemon:
            d = daemon
            if first_round:
                await _until(
                    "first round",
                    lambda: all(d.state.checks[c].last_finished for c in ALL_CHECKS),
                    120,
                )
            yield daemon, zk, bookies
    finally:
        bookies[7].resume()
        for b in bookies:
            if b.running:
                # After a ZooKeeper outage the registrations may be gone already.
                with contextlib.suppress(ZkUnavailableError):
                    await b.stop()
        await zk.close()


async def _api(control: Daemon) -> Any:
    return await start_api_server(control, host="127.0.0.1", port=0, token=None)


Outcome = tuple[dict[str, int], list[tuple[int, str, str | None]]]


async def _once_back(read: Callable[[], Awaitable[T]]) -> T:
    """`read` once the test's own client is back (its reconnect may lag the daemon's)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return await read()
        except ZkUnavailableError:
            assert time.monotonic() < deadline, "the test's own client did not reconnect"
            await asyncio.sleep(0.5)


async def _children(zk: ZkClient, path: str) -> list[str]:
    return await _once_back(lambda: zk.get_children(path))


def _work_changed(daemon: Daemon, work: object) -> Callable[[], bool]:
    return lambda: daemon.work is not work


def _either(a: Callable[[], bool], b: Callable[[], bool]) -> Callable[[], bool]:
    return lambda: a() or b()


def _finished_since(daemon: Daemon, check: Check, before: float | None) -> Callable[[], bool]:
    return lambda: daemon.state.checks[check].last_finished != before


def _more(logs: list[MutableMapping[str, Any]], event: str, n: int) -> Callable[[], bool]:
    return lambda: _count(logs, event) > n


def _count(logs: list[MutableMapping[str, Any]], event: str) -> int:
    return sum(1 for e in logs if e["event"] == event)


def _outcome(daemon: Daemon, check: Check) -> Outcome:
    report = daemon.state.checks[check].last_report
    assert report is not None, check
    found = sorted((v.ledger_id, str(v.category), v.bookie) for v in report.violations)
    return report.counts(), found


async def _rerun_until_ok(daemon: Daemon, check: Check) -> int:
    """Triggers `check` until a run completes (a run cut by the outage fails); returns runs."""
    for attempt in range(1, 4):
        # Elected is logged before the leader's work exists; triggers need the work.
        await _until("leader work", lambda: daemon.state.is_leader and daemon.work is not None)
        before = daemon.state.checks[check].last_finished
        work = daemon.work
        await daemon.trigger_check(check)
        finished = _finished_since(daemon, check, before)
        # A trigger belongs to one leadership: if the daemon stepped down and won again
        # meanwhile (a slow restart can cost the session), ask the new one.
        await _until(f"{check} run", _either(finished, _work_changed(daemon, work)))
        if finished() and daemon.state.checks[check].last_error is None:
            return attempt
    raise AssertionError(f"{check} kept failing: {daemon.state.checks[check].last_error}")


# --- a reconnect the server takes and never answers -----------------------------------------


async def test_an_unanswered_reconnect_costs_a_third_of_the_session_not_the_session(
    own_zk: ZooKeeperServer,
) -> None:
    """A server that takes a reconnect's connection and never answers its handshake (as a
    ZooKeeper that is still starting can): the client gives up on that connection after a
    third of its session timeout, connects again and resumes the same session; it does not
    wait out the whole session timeout and find the session expired."""
    session = 9.0
    host, port = own_zk.hosts.rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    await proxy.start()
    zk = ZkClient(proxy.address, timeout=10, session_timeout=session)
    try:
        await zk.start()
        before = zk.client_id
        mine = await zk.create(f"/held-{uuid.uuid4().hex[:8]}", ephemeral=True)
        async with contextlib.aclosing(zk.states()) as states:
            proxy.hold()
            assert await asyncio.wait_for(anext(states), 5) == SessionState.SUSPENDED
            await _until("a reconnect taken and held", lambda: proxy.held == 1, 10)
            held = time.monotonic()
            proxy.mend()
            assert await asyncio.wait_for(anext(states), session) == SessionState.CONNECTED
        # A third of the session (3 s) and kazoo's retry delay (under 2 s), not the session.
        assert time.monotonic() - held < session * 2 / 3
        assert (proxy.held, proxy.held_closed) == (1, 1)
        assert zk.client_id == before
        assert await zk.exists(mine) is not None  # its ephemeral node: the same session
    finally:
        await zk.close()
        await proxy.stop()


# --- ZooKeeper restarted in the middle of each check ---------------------------------------

#: The daemon's session in the restart test: longer than a loaded machine takes to start
#: the JVM again (a leader disconnected for a whole session steps down by itself), and
#: within the server's maxSessionTimeout.
RESTART_SESSION = 60.0
#: Ledgers a walk has judged when ZooKeeper goes: reads of most of the 308 are still to
#: be sent (the walk keeps at most `ledger_concurrency`, 100, in flight).
CUT_AT = 50
#: A health probe slower than this fails the test (the loop must stay responsive).
PROBE_LIMIT = 1.0

Point = Callable[[MutableMapping[str, Any]], bool]


def _judged(check: Check) -> Point:
    """The walk of `check` has judged CUT_AT ledgers (the test asks for a progress line
    per ledger)."""
    return lambda e: (
        e["event"] == "check progress"
        and e.get("check") == str(check)
        and e.get("ledgers_done") == CUT_AT
    )


def _logged(event: str, **fields: object) -> Point:
    return lambda e: e["event"] == event and all(e.get(k) == v for k, v in fields.items())


#: A read of a walk over the ledgers, past its start: a directory of ledgers or a ledger.
#: Not the marks' tree, which the daemon lists by itself to count the marks after every
#: run: a cut that saw only that listing unanswered killed the server before the walk's
#: next read, which then waited for the new connection and succeeded (seen once).
_LEDGER_READ = re.compile(r"^(?!.*/underreplication/).*/ledgers/\d{2}(?:/\d{4}(?:/L\d+)?)?$")

#: The grace check's reads: a mark, or a listing of a directory of marks. The daemon's
#: own count of the marks after a run lists those directories too; for this cut that is
#: told apart by nothing but time (the count is over long before the cut, in practice).
_MARK_READ = re.compile(r"/underreplication/ledgers(?:/[0-9a-f]{4}){0,4}(?:/urL\d+)?$")


@dataclass(frozen=True)
class Cut:
    """Where a check loses ZooKeeper: the line the daemon has just logged when the server
    freezes, and whether ZooKeeper reads of the run were still to come (then the run must
    fail, and a re-run find what the control run found)."""

    what: str
    check: Check
    at: Point
    fails: bool
    #: A line to wait for, the server still frozen, before it is restarted.
    frozen_until: str | None = None
    #: Whether the run that was cut stores its time (when it does not fail).
    stores_time: bool = True
    #: The check's own reads, one of which must be unanswered before the restart.
    reads: re.Pattern[str] = _LEDGER_READ


CUTS = [
    # Due, not started: the read of the auto-recovery flag fails; the run waits for
    # ZooKeeper and then runs (it is not dropped until the check's next turn).
    Cut(
        "placement, due",
        Check.PLACEMENT,
        _logged("check due", check="placement"),
        fails=False,
        frozen_until="cannot read whether auto-recovery is enabled; asking again when connected",
    ),
    Cut("bookies, mid-walk", Check.BOOKIES, _judged(Check.BOOKIES), fails=True),
    Cut("placement, mid-walk", Check.PLACEMENT, _judged(Check.PLACEMENT), fails=True),
    # Findings complete, then ZooKeeper away longer than a call's timeout (the owner
    # look-up and the write of the check's time wait for it in vain): the run reports
    # them all the same, without storing its time.
    Cut(
        "placement, walk done",
        Check.PLACEMENT,
        _logged("placement check finished"),
        fails=False,
        frozen_until="check time not stored",
        stores_time=False,
    ),
    Cut("replicas, mid-walk", Check.REPLICAS, _judged(Check.REPLICAS), fails=True),
    # Marks are read one by one in id order (the test sets one mark a batch); 3006's is past
    # the grace period, and 3007's (the ledger check marks it) comes after it.
    Cut(
        "grace, between two marks",
        Check.GRACE,
        _logged("violation", check="grace"),
        fails=True,
        reads=_MARK_READ,
    ),
    Cut("ledgers, mid-walk", Check.LEDGERS, _judged(Check.LEDGERS), fails=True),
]


class Tripwire:
    """A log processor that freezes the ZooKeeper server when the daemon logs a chosen line.

    It runs inside the daemon's own log call, so the server is stopped before
    the daemon takes its next step: where a check loses ZooKeeper is the
    test's choice, whatever the machine's load.
    """

    def __init__(self, server: ZooKeeperServer) -> None:
        self.server = server
        self.point: Point | None = None
        self.sprung = asyncio.Event()

    def arm(self, point: Point) -> None:
        self.point = point
        self.sprung.clear()

    def __call__(
        self, _logger: object, _method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        if self.point is not None and self.point(event):
            self.point = None
            assert self.server.proc is not None
            _freeze(self.server.proc.pid)
            self.sprung.set()
        return event


def _freeze(pid: int) -> None:
    """Stops a process and returns once every one of its threads is stopped.

    The stop signal takes effect asynchronously: a server thread running on the
    other core (or a sandbox's signal delivery) could still answer the daemon's
    next request if this returned at once.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while True:
        states = []
        for stat in glob.glob(f"/proc/{pid}/task/*/stat"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                with open(stat) as f:
                    text = f.read()
                states.append(text[text.rindex(")") + 2])
        if states and all(s in "tT" for s in states):
            return
        assert time.monotonic() < deadline, f"the server did not stop: {states}"
        time.sleep(0.001)


@pytest.fixture
def tripwire(
    own_zk: ZooKeeperServer, info_logs: list[MutableMapping[str, Any]]
) -> Iterator[Tripwire]:
    """A Tripwire ahead of `info_logs`' capture, for one test."""
    wire = Tripwire(own_zk)
    processors = structlog.get_config()["processors"]
    processors.insert(0, wire)
    try:
        yield wire
    finally:
        processors.remove(wire)
        if own_zk.proc is not None:  # never leave the module's server frozen
            os.kill(own_zk.proc.pid, signal.SIGCONT)


#: A walk's read from the top: the ledgers root, one of its directories, a ledger.
_WALK_READ = re.compile(r"/ledgers(?:/\d{2}(?:/\d{4}(?:/L\d+)?)?)?$")


def _check_read_unanswered(daemon: Daemon, reads: re.Pattern[str]) -> bool:
    """Whether one of the check's reads has gone to the frozen server, unanswered.

    Only such a read is sure to fail when the server is killed. The reads in flight when
    the server froze may all have been answered already, and reads sent after kazoo has
    seen the connection drop wait for the new connection and succeed: killed before the
    walk sent its next read, the server would cut nothing (seen once, on a loaded CI
    machine). Reads kazoo's own list of sent, unanswered requests (kazoo is pinned); with
    the server frozen only kazoo's thread appends to it.
    """
    assert isinstance(daemon.store, ZkClient)
    sent = list(daemon.store.kazoo._pending)
    return any(
        any(reads.search(path) for path in request.paths)
        if isinstance(request, MultiRead)
        else isinstance(request, GetData | GetChildren | GetChildren2)
        and reads.search(request.path)
        for request, _, _ in sent
    )


def _restart_frozen(server: ZooKeeperServer) -> None:
    """Kills the frozen server (nothing it holds is answered) and starts it on its data;
    sessions survive, as the server gives each a fresh timeout when it loads them."""
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait()
    server.proc = None
    server.start(timeout=120)


class Prober:
    """Health probes, one pair every 50 ms while it runs. While `restarting` (from the
    server's freeze until the daemon is connected again) each must answer within PROBE_LIMIT
    (a slower one fails `run`); the rest of the time, the checks' walks share the loop
    with the emulated bookies of this test, and a probe only has to answer."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.restarting = False
        self.slowest = 0.0
        self.during_restarts = 0
        self.seen: dict[str, set[int]] = {LIVENESS: set(), READINESS: set()}

    async def run(self) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                for service in self.seen:
                    measured = self.restarting
                    started = time.monotonic()
                    resp = await health.Check(
                        health_pb2.HealthCheckRequest(service=service),
                        timeout=PROBE_LIMIT if measured else 30,
                    )
                    if measured:
                        self.slowest = max(self.slowest, time.monotonic() - started)
                        self.during_restarts += 1
                    self.seen[service].add(resp.status)
                await asyncio.sleep(0.05)  # the probe rate, not a wait for an event


Marks = dict[int, tuple[tuple[str, ...], int]]


async def _marks(urm: UnderreplicationManager) -> Marks:
    """Every mark with its replicas and znode version (a mark written again bumps it)."""
    return {
        u.ledger_id: (tuple(sorted(u.replicas)), u.znode_version)
        async for u in urm.list_underreplicated()
    }


async def _ctime(urm: UnderreplicationManager, check: Check) -> int | None:
    kind = CTIME_KIND.get(check)
    return None if kind is None else await urm.get_check_ctime(kind)


@pytest.mark.timeout(900)
@pytest.mark.usefixtures("grpc_held")
async def test_zookeeper_restarted_in_the_middle_of_each_check(
    own_zk: ZooKeeperServer,
    tripwire: Tripwire,
    info_logs: list[MutableMapping[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each check loses ZooKeeper at a chosen point of its run (the server frozen, killed,
    started again): the run fails and a re-run finds exactly what a control run found, or,
    cut after its findings, it reports them; marks stay as they were; the same daemon leads
    throughout with the same vote; health probes answer within a second during every restart."""
    _LOG[:] = [info_logs]
    # Marks are read in batches of 250, a few ahead (issue 30: a hundred thousand marks), so
    # this cluster's handful would all be read before the first is judged. One mark a
    # batch, none ahead, keeps "between two marks" a cut between two of the grace check's
    # reads, as it is between two batches of a large cluster.
    monkeypatch.setattr(underreplication, "READ_BATCH", 1)
    monkeypatch.setattr(underreplication, "READS_IN_FLIGHT", 1)
    clean = snapshot()  # gRPC held up by `grpc_held` before this, until after the count
    async with _leader(
        own_zk,
        RESTART_SESSION,
        # Checks walk ZooKeeper (no index), so a restart cuts their reads mid-walk: the
        # walks read no further ahead than the ledgers they judge (else the cluster's
        # few thousand ledgers are read before the cut).
        "daemon.metadata_index=false",
        "checks.walk_read_ahead=1",
        "checks.progress_interval=0.000001",
        api=True,
    ) as (daemon, zk, _):
        [vote] = await zk.get_children(VOTES)
        urm = UnderreplicationManager(zk, ROOT)
        assert daemon.api is not None
        prober = Prober(daemon.api.port)
        probing = asyncio.ensure_future(prober.run())
        try:
            for cut in CUTS:
                check = cut.check
                # What a run finds now (earlier runs' marks make later runs skip those
                # ledgers); the run cut by the restart must end up the same.
                await _rerun_until_ok(daemon, check)
                control = _outcome(daemon, check)
                marks = await _once_back(lambda: _marks(urm))
                ctime = await _once_back(functools.partial(_ctime, urm, check))
                before = daemon.state.checks[check].last_finished
                held = _count(info_logs, cut.frozen_until) if cut.frozen_until else 0
                tripwire.arm(cut.at)
                await daemon.trigger_check(check)
                await asyncio.wait_for(tripwire.sprung.wait(), 60)
                prober.restarting = True
                if cut.frozen_until is not None:
                    await _until(cut.frozen_until, _more(info_logs, cut.frozen_until, held), 60)
                if cut.fails:
                    await _until(
                        f"{cut.what}: a read sent to the frozen server",
                        functools.partial(_check_read_unanswered, daemon, cut.reads),
                        60,
                    )
                await asyncio.to_thread(_restart_frozen, own_zk)
                await _until("reconnected", lambda: daemon.state.zk_connected)
                prober.restarting = False
                await _until(f"{cut.what}: the run ended", _finished_since(daemon, check, before))
                error = daemon.state.checks[check].last_error
                if cut.fails:
                    assert error is not None and "ZooKeeper" in error, (cut.what, error)
                    await _rerun_until_ok(daemon, check)
                else:
                    assert error is None, (cut.what, error)
                    # Findings whose time could not be stored stand all the same (a
                    # successor only runs the check sooner).
                    stored = await _once_back(functools.partial(_ctime, urm, check))
                    assert ctime is not None and stored is not None, cut.what
                    assert (stored > ctime) is cut.stores_time, (cut.what, stored, ctime)
                assert _outcome(daemon, check) == control, cut.what
                assert await _once_back(lambda: _marks(urm)) == marks, cut.what
                assert daemon.state.is_leader, cut.what
                assert not probing.done(), probing
        finally:
            probing.cancel()
            await asyncio.gather(probing, return_exceptions=True)
        # The session outlived every restart: never stepped down, the same vote.
        assert not any(e["event"] == "no longer the auditor" for e in info_logs)
        assert await _children(zk, VOTES) == [vote]
    assert prober.slowest < PROBE_LIMIT, prober.slowest
    assert prober.during_restarts >= 2 * len(CUTS), prober.during_restarts
    # Alive all along; not ready while ZooKeeper was away.
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    assert prober.seen == {LIVENESS: {serving}, READINESS: {serving, not_serving}}
    await assert_no_leaks(clean)


@pytest.mark.timeout(600)
async def test_zookeeper_restarted_under_a_leader_with_the_metadata_index(
    own_zk: ZooKeeperServer, tripwire: Tripwire, info_logs: list[MutableMapping[str, Any]]
) -> None:
    """With the metadata index (the default) a restart mid-walk costs the index its watch:
    the index is read again, and the next run waits for that and walks the reloaded index
    to exactly what a control run found; the same daemon leads throughout."""
    _LOG[:] = [info_logs]
    lost = "index watch lost; reading every ledger again"
    clean = snapshot()
    async with _leader(own_zk, RESTART_SESSION, "checks.progress_interval=0.000001") as (
        daemon,
        zk,
        _,
    ):
        [vote] = await zk.get_children(VOTES)
        check = Check.REPLICAS
        await _rerun_until_ok(daemon, check)
        control = _outcome(daemon, check)
        assert _last_started(info_logs, check)["metadata"] == "index"
        loads, gaps = _count(info_logs, "index loaded"), _count(info_logs, lost)
        before = daemon.state.checks[check].last_finished
        tripwire.arm(_judged(check))
        await daemon.trigger_check(check)
        await asyncio.wait_for(tripwire.sprung.wait(), 60)
        await asyncio.to_thread(_restart_frozen, own_zk)
        # The cut run read its ledgers from memory: it may fail (a read of a mark) or
        # complete; if it completes, with the control run's findings.
        await _until("the cut run ended", _finished_since(daemon, check, before))
        if daemon.state.checks[check].last_error is None:
            assert _outcome(daemon, check) == control
        await _until("the index lost its watch", _more(info_logs, lost, gaps))
        await _until("the index read again", _more(info_logs, "index loaded", loads))
        await _rerun_until_ok(daemon, check)
        assert _last_started(info_logs, check)["metadata"] == "index"
        assert _outcome(daemon, check) == control
        assert daemon.state.is_leader
        assert not any(e["event"] == "no longer the auditor" for e in info_logs)
        assert await _children(zk, VOTES) == [vote]
    await assert_no_leaks(clean)


@pytest.mark.timeout(600)
async def test_risk_report_cut_by_a_restart_runs_again_once_connected(
    own_zk: ZooKeeperServer, tripwire: Tripwire, info_logs: list[MutableMapping[str, Any]]
) -> None:
    """The leader's first risk report (walking ZooKeeper: no index) loses ZooKeeper as its
    walk starts: it runs again as soon as the daemon is connected, not an interval (an hour)
    later, and reports what an uncut run reports; the leadership and its vote stay."""
    _LOG[:] = [info_logs]
    retry = "ZooKeeper call failed; resuming when connected"
    clean = snapshot()
    tripwire.arm(_logged("risk report started"))
    async with _leader(
        own_zk, RESTART_SESSION, "daemon.metadata_index=false", first_round=False
    ) as (daemon, _, _):
        await asyncio.wait_for(tripwire.sprung.wait(), 120)
        await _until(
            "the risk walk's read sent to the frozen server",
            functools.partial(_check_read_unanswered, daemon, _WALK_READ),
            60,
        )
        await asyncio.to_thread(_restart_frozen, own_zk)
        await asyncio.wait_for(events_of(daemon).risk_reported.wait(), 120)
        cut = [e for e in info_logs if e["event"] == retry]
        assert [e["task"] for e in cut] == ["risk"], cut
        assert (
            _count(info_logs, "risk report started"),
            _count(info_logs, "risk report finished"),
        ) == (2, 1)
        assert daemon.risk_report is not None and daemon.work is not None
        # The control: the same core on the leader's own context, nothing cut.
        control = await run_risk(daemon.work.ctx)
        top = daemon.config.risk.top
        got, want = daemon.risk_report.to_json(top), control.to_json(top)
        for doc in (got, want):
            del doc["started_at"], doc["finished_at"]
        assert got == want
        assert got["ledgers_checked"] >= 300
        assert daemon.state.is_leader
        assert _count(info_logs, "elected auditor") == 1
        assert not any(e["event"] == "no longer the auditor" for e in info_logs)
        await _until(
            "first round", lambda: all(daemon.state.checks[c].last_finished for c in ALL_CHECKS)
        )
    await assert_no_leaks(clean)


def _last_started(logs: list[MutableMapping[str, Any]], check: Check) -> MutableMapping[str, Any]:
    return [e for e in logs if e["event"] == "check started" and e["check"] == str(check)][-1]


async def test_zookeeper_unreachable_longer_than_the_session_timeout(
    own_zk: ZooKeeperServer, info_logs: list[MutableMapping[str, Any]]
) -> None:
    _LOG[:] = [info_logs]
    host, port = own_zk.hosts.rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    await proxy.start()
    clean = snapshot()
    try:
        async with _leader(own_zk, SESSION, via=proxy) as (daemon, zk, _):
            control = {}
            for check in ALL_CHECKS:
                await _rerun_until_ok(daemon, check)
                control[check] = _outcome(daemon, check)
            [vote] = await zk.get_children(VOTES)
            elected = _count(info_logs, "elected auditor")
            # A partition: the server runs on and expires the daemon's session, which
            # takes the daemon's vote with it.
            gone, changed = await zk.exists_watched(f"{VOTES}/{vote}")
            assert gone is not None
            proxy.cut()
            await asyncio.wait_for(changed.wait(), SESSION * 4)
            assert await zk.exists(f"{VOTES}/{vote}") is None
            # Cut off for a whole session timeout, the daemon stopped acting as leader
            # by itself, before it could learn that its session was gone.
            await _until(
                "stepped down while cut off",
                _more(
                    info_logs,
                    "disconnected from ZooKeeper for a whole session timeout; stepping down",
                    0,
                ),
                within=SESSION * 4,
            )
            assert not daemon.state.is_leader
            proxy.mend()
            # Back on the network the daemon learns its session is gone, steps down,
            # and wins again with a new vote.
            await _until(
                "elected again",
                lambda: _count(info_logs, "elected auditor") > elected,
                within=60,
            )
            assert any(e["event"] == "no longer the auditor" for e in info_logs)
            now = await zk.get_children(VOTES)
            assert len(now) == 1 and now != [vote]
            # The stored check times say the checks ran recently, so the new leader
            # waits for their next turn; run them now and compare.
            for check in ALL_CHECKS:
                await _rerun_until_ok(daemon, check)
                assert _outcome(daemon, check) == control[check], check
        # Both sessions' tasks, connections and descriptors are gone (the proxy's own
        # listener was open before the count and closes after it).
        await assert_no_leaks(clean)
    finally:
        await proxy.stop()
