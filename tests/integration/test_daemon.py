"""`bk-auditor run` as deployed: two daemons, one auditor, hand-overs, metrics.

Daemons run as real processes against the real ZooKeeper and emulated bookies;
leadership is observed the way BookKeeper observes it (the election path).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
import urllib.request
from collections.abc import AsyncIterator

from auditor.daemon.election import current_auditor, election_path
from auditor.metadata.records import CheckKind
from auditor.metadata.underreplication import UnderreplicationManager, ur_ledger_path
from auditor.testing.harness import test_cluster
from auditor.testing.watching import until_watched
from auditor.testing.zkserver import free_port
from auditor.zk import ZkClient

ROOT = "/ledgers"
SESSION = 4.0


class Daemon:
    def __init__(self, proc: asyncio.subprocess.Process, identity: str, api: int, metrics: int):
        self.proc, self.identity, self.api_port, self.metrics_port = proc, identity, api, metrics


@contextlib.asynccontextmanager
async def daemons(zk_hosts: str, names: list[str], *sets: str) -> AsyncIterator[list[Daemon]]:
    started: list[Daemon] = []
    try:
        for name in names:
            api, metrics = free_port(), free_port()
            identity = f"{name}:{api}"
            args = [
                "run", "--zk", zk_hosts,
                "--set", f"daemon.identity={identity}",
                "--set", f"daemon.zk_session_timeout={SESSION}",
                "--set", "api.host=127.0.0.1", "--set", f"api.port={api}",
                "--set", "metrics.host=127.0.0.1", "--set", f"metrics.port={metrics}",
                "--set", "logging.format=json",
                "--set", "auditorPeriodicBookieCheckInterval=3600",
                "--set", "auditorPeriodicCheckInterval=0",
                "--set", "auditorPeriodicPlacementPolicyCheckInterval=3600",
                "--set", "auditorReplicasCheckInterval=3600",
                "--set", "daemon.jitter=0",
                "--set", "readEntryTimeout=1",
                "--set", "checks.retry_delay=0.2",
                "--set", "worker.enabled=false",  # the auditor's marks stay observable
                *sets,
            ]  # fmt: skip
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "auditor", *args,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            started.append(Daemon(proc, identity, api, metrics))
        yield started
    finally:
        for d in started:
            if d.proc.returncode is None:
                d.proc.kill()
            await d.proc.wait()


async def leader_becomes(zk: ZkClient, candidates: set[str], within: float) -> str:
    """Waits, on watches, until BookKeeper's view of the auditor is one of `candidates`."""
    path = election_path(ROOT)

    async def look() -> tuple[str | None, asyncio.Event]:
        await zk.ensure_path(path)
        _, changed = await zk.get_children_watched(path)
        return await current_auditor(zk, ROOT), changed

    leader = await until_watched(
        look, candidates.__contains__, within, f"a leader among {candidates}"
    )
    assert leader is not None
    return leader


async def votes_reach(zk: ZkClient, n: int) -> None:
    path = election_path(ROOT)
    while True:
        children, changed = await zk.get_children_watched(path)
        if len(children) >= n:
            return
        await asyncio.wait_for(changed.wait(), 30)


async def ctime_written(zk: ZkClient, kind: CheckKind, within: float) -> int:
    urm = UnderreplicationManager(zk, ROOT)
    deadline = time.monotonic() + within
    while (ctime := await urm.get_check_ctime(kind)) < 0:
        assert time.monotonic() < deadline, f"{kind} never ran"
        stat, changed = await zk.exists_watched(f"{urm.base}/{kind.znode}")
        if stat is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), 1.0)
    return ctime


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


async def test_one_leader_sigkill_handover_resumes_schedules_and_metrics(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=10)
        await tc.bookies[2].crash()  # a lost bookie for the leader's start audit
        async with daemons(zk.hosts, ["alpha", "beta"]) as (a, b):
            ids = {a.identity, b.identity}
            first = await leader_becomes(zk, ids, 30)
            await votes_reach(zk, 2)  # both contend, one leads
            assert await current_auditor(zk, ROOT) == first
            leader, follower = (a, b) if first == a.identity else (b, a)
            # The leader's start audit marked the lost bookie's ledger.
            urm = UnderreplicationManager(zk, ROOT)
            mark = ur_ledger_path(urm.base, 1)
            while (await zk.exists(mark)) is None:
                stat, changed = await zk.exists_watched(mark)
                if stat is None:
                    await asyncio.wait_for(changed.wait(), 20)
            ur = await urm.get(1)
            assert ur is not None and ur.replicas == (tc.ids[2],)
            replicas_ctime = await ctime_written(zk, CheckKind.REPLICAS_CHECK, 30)
            # Metrics: every series, and the leader says so.
            text = await asyncio.to_thread(scrape, leader.metrics_port)
            for series in [
                "bookkeeper_auditor_violations_total",
                "bookkeeper_auditor_ledgers_in_violation",
                "bookkeeper_auditor_check_duration_seconds",
                "bookkeeper_auditor_check_runs_total",
                "bookkeeper_auditor_check_last_success_timestamp_seconds",
                "bookkeeper_auditor_is_leader",
                "bookkeeper_auditor_election_attempts_total",
                "bookkeeper_auditor_ledgers_marked_underreplicated_total",
                "bookkeeper_auditor_bookie_requests_total",
                "bookkeeper_auditor_retry_queue_ledgers",
                "bookkeeper_auditor_lost_bookies",
                "bookkeeper_auditor_underreplicated_ledgers",
            ]:
                assert series in text, series
            assert "bookkeeper_auditor_is_leader 1.0" in text
            follower_text = await asyncio.to_thread(scrape, follower.metrics_port)
            assert "bookkeeper_auditor_is_leader 0.0" in follower_text
            # Kill the leader without a goodbye: the follower leads within the
            # session timeout plus 5 s.
            t0 = time.monotonic()
            leader.proc.send_signal(signal.SIGKILL)
            assert await leader_becomes(zk, {follower.identity}, SESSION + 5) == follower.identity
            assert time.monotonic() - t0 <= SESSION + 5
            # It resumes the schedule from the stored ctime: no replicas run now
            # (the last one was moments ago and the interval is an hour).
            await asyncio.sleep(2)
            assert await urm.get_check_ctime(CheckKind.REPLICAS_CHECK) == replicas_ctime


async def test_sigterm_hands_over_within_5s_and_exits_0(zk: ZkClient) -> None:
    async with test_cluster(zk, 3), daemons(zk.hosts, ["gamma", "delta"]) as (a, b):
        first = await leader_becomes(zk, {a.identity, b.identity}, 30)
        leader, follower = (a, b) if first == a.identity else (b, a)
        await votes_reach(zk, 2)
        t0 = time.monotonic()
        leader.proc.send_signal(signal.SIGTERM)
        assert await leader_becomes(zk, {follower.identity}, 5) == follower.identity
        assert time.monotonic() - t0 < 5
        assert await asyncio.wait_for(leader.proc.wait(), 15) == 0
        assert len(await zk.get_children(election_path(ROOT))) == 1
