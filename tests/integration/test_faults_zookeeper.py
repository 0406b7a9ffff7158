"""ZooKeeper faults under a running leader: unreachable past the session timeout (a
partition, through a proxy that can be cut).

A ZooKeeper server of this module's own is used, so no other test sees the
outage. The bookies register through a client with a long session, which
outlives the partition; the daemon's session is short.
Outcomes are exact: after the fault, the checks report the seeded faults and
nothing else, the same daemon leads (or leads again, with a new vote, when its
session expired), and marks are the ones the checks call for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from typing import Any

import pytest

from auditor.checks.findings import ALL_CHECKS, Check
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.testing.bookie import BookieEmulator
from auditor.testing.inprocess import fast_config, running
from auditor.testing.netproxy import TcpProxy
from auditor.testing.seeded import ROOT, build_seeded_cluster
from auditor.testing.zkserver import ZooKeeperServer
from auditor.zk import ZkClient, ZkUnavailableError

pytestmark = pytest.mark.slow

SESSION = 4.0
VOTES = f"{ROOT}/underreplication/auditorelection"


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
    own_zk: ZooKeeperServer, session: float, *sets: str, via: TcpProxy | None = None
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
        cfg = fast_config(
            daemon_hosts, "zk-faults:1", [f"daemon.zk_session_timeout={session}", *sets]
        )
        async with running(cfg, Metrics()) as daemon:
            d = daemon
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


Outcome = tuple[dict[str, int], list[tuple[int, str, str | None]]]


async def _children(zk: ZkClient, path: str) -> list[str]:
    """A listing once this client is back (its reconnect may lag the daemon's)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return await zk.get_children(path)
        except ZkUnavailableError:
            assert time.monotonic() < deadline, "the test's own client did not reconnect"
            await asyncio.sleep(0.5)


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


async def test_zookeeper_unreachable_longer_than_the_session_timeout(
    own_zk: ZooKeeperServer, info_logs: list[MutableMapping[str, Any]]
) -> None:
    _LOG[:] = [info_logs]
    host, port = own_zk.hosts.rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    await proxy.start()
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
    finally:
        await proxy.stop()
