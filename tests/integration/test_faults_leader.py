"""Faults on the leader's side: killed or expired while marking, ZooKeeper gone and back.

Exact outcomes: which ledgers end up marked (all of the lost bookie's, each
mark naming the bookie once), who leads, and that a leader without its
session writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator

import pytest

from auditor.daemon.config import load_daemon_config
from auditor.daemon.service import Daemon
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.cluster import make_metadata
from auditor.testing.harness import test_cluster
from auditor.testing.leaks import assert_no_leaks, snapshot
from auditor.testing.zkserver import ZooKeeperServer, expire_session
from auditor.zk import ZkClient
from tests.integration.test_daemon import ROOT, daemons, leader_becomes

pytestmark = pytest.mark.slow

LEDGERS = 1500


def _ledgers(ids: list[str], lost: str) -> Iterator[LedgerMetadata]:
    """Every ledger has the lost bookie in its ensemble, at varying positions."""
    others = [b for b in ids if b != lost]
    for lid in range(1, LEDGERS + 1):
        ensemble = [others[lid % 3], others[(lid + 1) % 3]]
        ensemble.insert(lid % 3, lost)
        yield make_metadata(lid, ensemble, write_quorum=2, last_entry_id=9, length=100)


async def _marks(zk: ZkClient) -> dict[int, list[str]]:
    urm = UnderreplicationManager(zk, ROOT)
    return {ur.ledger_id: list(ur.replicas) async for ur in urm.list_underreplicated()}


async def test_leader_killed_while_marking_a_lost_bookies_ledgers(zk: ZkClient) -> None:
    async with test_cluster(zk, 4) as tc:
        lost = tc.ids[3]
        await tc.cluster.write_ledgers(_ledgers(tc.ids, lost))
        await tc.bookies[3].crash()  # its cookie stays: a lost bookie
        urm = UnderreplicationManager(zk, ROOT)
        # A few marks at a time, so the kill lands in the middle of the marking.
        async with daemons(zk.hosts, ["a", "b"], "--set", "checks.ledger_concurrency=4") as ds:
            by_id = {d.identity: d for d in ds}
            first = await leader_becomes(zk, set(by_id), within=30)
            deadline = time.monotonic() + 60
            while (done := await urm.count_underreplicated()) < 50:
                assert time.monotonic() < deadline, "the leader never started marking"
                await asyncio.sleep(0.02)
            by_id[first].proc.send_signal(signal.SIGKILL)
            await by_id[first].proc.wait()
            killed_at = await urm.count_underreplicated()
            assert done <= killed_at < LEDGERS, "the kill came after the marking ended"
            second = await leader_becomes(zk, set(by_id) - {first}, within=30)
            assert second != first
            deadline = time.monotonic() + 90
            while await urm.count_underreplicated() < LEDGERS:
                assert time.monotonic() < deadline, "the new leader did not finish the marking"
                await asyncio.sleep(0.2)
        marks = await _marks(zk)
        # Every ledger of the lost bookie, none lost, and each mark names it exactly once
        # (the second leader re-marked what the first had done: a merge, not a duplicate).
        assert sorted(marks) == list(range(1, LEDGERS + 1))
        assert all(replicas == [lost] for replicas in marks.values())


async def test_a_leader_whose_session_expires_while_marking_comes_back_and_finishes(
    zk: ZkClient, zk_server: ZooKeeperServer
) -> None:
    async with test_cluster(zk, 4) as tc:
        lost = tc.ids[3]
        await tc.cluster.write_ledgers(_ledgers(tc.ids, lost))
        await tc.bookies[3].crash()
        urm = UnderreplicationManager(zk, ROOT)
        cfg = load_daemon_config(
            None,
            [
                f"daemon.zk={zk.hosts}",
                "daemon.identity=expiring:1",
                "worker.enabled=false",  # the auditor's leadership is what is tested
                "daemon.zk_session_timeout=4",
                "auditorPeriodicCheckInterval=0",
                "auditorPeriodicPlacementPolicyCheckInterval=0",
                "auditorReplicasCheckInterval=0",
                "checks.ledger_concurrency=4",
            ],
            env={},
        )
        clean = snapshot()
        daemon = Daemon(cfg, metrics=None)
        run = asyncio.ensure_future(daemon.run(signals=False))
        try:
            await leader_becomes(zk, {"expiring:1"}, within=30)
            votes = f"{ROOT}/underreplication/auditorelection"
            before = await zk.get_children(votes)
            deadline = time.monotonic() + 60
            while await urm.count_underreplicated() < 50:
                assert time.monotonic() < deadline, "the leader never started marking"
                await asyncio.sleep(0.02)
            zk_of_daemon = daemon.store
            assert isinstance(zk_of_daemon, ZkClient)
            client_id = zk_of_daemon.client_id
            assert client_id is not None
            await asyncio.to_thread(expire_session, zk_server.hosts, client_id)
            expired_at = await urm.count_underreplicated()
            assert expired_at < LEDGERS, "the expiry came after the marking ended"
            # The old vote went with the session; the daemon contends again with a new one.
            deadline = time.monotonic() + 60
            while (now := await zk.get_children(votes)) == before or not now:
                assert time.monotonic() < deadline, "the daemon did not vote again"
                await asyncio.sleep(0.1)
            assert set(now).isdisjoint(before)
            await leader_becomes(zk, {"expiring:1"}, within=30)
            deadline = time.monotonic() + 90
            while await urm.count_underreplicated() < LEDGERS:
                assert time.monotonic() < deadline, "the marking never completed"
                await asyncio.sleep(0.2)
        finally:
            daemon.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(run, 30)
        marks = await _marks(zk)
        assert sorted(marks) == list(range(1, LEDGERS + 1))
        assert all(replicas == [lost] for replicas in marks.values())
        # Both sessions' tasks, bookie connections and descriptors are gone.
        await assert_no_leaks(clean, bookies=tc.bookies[:3])
