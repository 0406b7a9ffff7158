"""A follower whose ZooKeeper session is lost while it waits in line.

Losing a session while following costs nothing: the follower's vote goes with
the session and kazoo's lock recipe votes again in the new one. When that
vote then wins, the daemon must lead, not log an election and step down in
the same instant (which the soak saw: "elected auditor" then "no longer the
auditor" a millisecond later, and a needless second election).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from auditor.checks.findings import Check
from auditor.daemon.election import current_auditor, election_path
from auditor.testing.cluster import ClusterWriter
from auditor.testing.inprocess import fast_config, running
from auditor.testing.leaks import assert_no_leaks, snapshot
from auditor.testing.zkserver import ZooKeeperServer, expire_session
from auditor.zk import ZkClient

ROOT = "/ledgers"
ME = "follower:1"


async def _votes(zk: ZkClient, done: Callable[[set[str]], bool]) -> None:
    """Waits on child watches until the votes satisfy `done`."""
    while True:
        votes, changed = await zk.get_children_watched(election_path(ROOT))
        if done(set(votes)):
            return
        await asyncio.wait_for(changed.wait(), 30)


async def _until_leader(zk: ZkClient, who: str) -> None:
    path = election_path(ROOT)
    while await current_auditor(zk, ROOT) != who:
        _, changed = await zk.get_children_watched(path)
        if await current_auditor(zk, ROOT) == who:
            return
        await asyncio.wait_for(changed.wait(), 30)


async def test_a_follower_that_lost_its_session_leads_when_its_new_vote_wins(
    zk: ZkClient,
    zk_hosts: str,
    zk_server: ZooKeeperServer,
    info_logs: list[MutableMapping[str, Any]],
) -> None:
    await ClusterWriter(zk, ROOT).init_cluster()
    path = election_path(ROOT)
    await zk.ensure_path(path)
    cfg = fast_config(zk_hosts, ME, ["daemon.zk_session_timeout=4"])
    clean = snapshot()
    async with ZkClient(zk_hosts) as java:
        # A Java auditor leads; the daemon waits in line behind it.
        await java.create(
            f"{path}/V_", b'bookieId: "10.0.0.9:3181"\n', ephemeral=True, sequence=True
        )
        async with running(cfg) as daemon:
            await _votes(zk, lambda votes: len(votes) == 2)
            before = set(await zk.get_children(path))
            zk_of_daemon = daemon.store
            assert isinstance(zk_of_daemon, ZkClient)
            client_id = zk_of_daemon.client_id
            assert client_id is not None
            await asyncio.to_thread(expire_session, zk_server.hosts, client_id)
            # The follower votes again in its new session ...
            await _votes(zk, lambda votes: len(votes) == 2 and votes != before)
            assert any(e["event"] == "ZooKeeper session lost; voting again" for e in info_logs)
            # ... and when the Java auditor goes, that vote wins and the daemon leads.
            await java.close()
            await _until_leader(zk, ME)
            # Its first check finished: leadership that lasted, not an instant's.
            bookies = daemon.state.checks[Check.BOOKIES]
            deadline = time.monotonic() + 30
            while bookies.last_finished is None:  # daemon state: no event to await
                assert time.monotonic() < deadline, "the new leader ran no check"
                await asyncio.sleep(0.05)
            assert daemon.state.is_leader
    events = [
        e["event"] for e in info_logs if e["event"] in ("elected auditor", "no longer the auditor")
    ]
    # One election, one end (when the test stopped the daemon).
    assert events == ["elected auditor", "no longer the auditor"]
    await assert_no_leaks(clean)
