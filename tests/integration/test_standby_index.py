"""The warm standby: followers keep the metadata index too (`daemon.standby_index`).

Every daemon loads the index from its first session on and keeps it current by
its watch, leader or not; a new leader's first check then reads that index at
once: no second full read after a fail-over. With `standby_index = false` a
follower holds no index and a new leader reads every ledger when elected, as
before. Two daemons run in this process on a small cluster of emulated bookies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import pytest

from auditor.backoff import Backoff
from auditor.checks.findings import Check
from auditor.daemon import standby
from auditor.daemon.leadership import Phase
from auditor.daemon.service import Daemon
from auditor.index.sync import IndexSync
from auditor.metadata.serde import encode_ledger_metadata
from auditor.testing.cluster import make_metadata
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.inprocess import fast_config, running, until
from auditor.testing.leaks import assert_no_leaks, snapshot
from auditor.testing.observe import events_of
from auditor.testing.zkserver import ZooKeeperServer, expire_session
from auditor.zk import ZkClient

pytestmark = pytest.mark.slow

LEDGERS = 24
#: The configured session timeout: a new leader's first check starts within it + 2 s.
SESSION = 4.0


async def _ledgers(tc: TestCluster) -> None:
    ids = tc.ids
    await tc.cluster.write_ledgers(
        make_metadata(lid, [ids[lid % 3], ids[(lid + 1) % 3]], write_quorum=2)
        for lid in range(1, LEDGERS + 1)
    )


def _config(zk: ZkClient, identity: str, *extra: str) -> Any:
    return fast_config(zk.hosts, identity, [f"daemon.zk_session_timeout={SESSION}", *extra])


async def _leading(daemon: Daemon) -> None:
    await until(
        events_of(daemon).decided, lambda: daemon.state.is_leader, f"{daemon.state.identity} leads"
    )


async def _in_line(daemon: Daemon) -> None:
    """Until `daemon` waits in the election behind the leader."""
    await until(
        events_of(daemon).decided,
        lambda: daemon.state.phase is Phase.VOTING,
        f"{daemon.state.identity} votes",
    )


async def _indexed(sync: IndexSync, done: Callable[[], bool], what: str) -> None:
    """Until the index (notified after every load and every re-read) satisfies `done`."""
    async with sync.changed:
        try:
            await asyncio.wait_for(sync.changed.wait_for(done), 30)
        except TimeoutError:
            raise AssertionError(f"not within 30s: {what}") from None


def _sample(daemon: Daemon, name: str) -> float:
    value = daemon.metrics.registry.get_sample_value(f"bookkeeper_auditor_{name}")
    assert value is not None, name
    return value


def _logged(logs: list[MutableMapping[str, Any]], event: str, identity: str) -> list[Any]:
    return [e for e in logs if e["event"] == event and e.get("identity") == identity]


async def _first_check_after(daemon: Daemon, t0: float) -> float:
    """When the new leader's first check (the start audit: the bookie check) started."""
    bookies = daemon.state.checks[Check.BOOKIES]
    await until(
        events_of(daemon).check_ended,
        lambda: (bookies.last_finished or 0) > t0,
        "the new leader's first check",
        within=30,
    )
    assert bookies.last_started is not None
    return bookies.last_started


async def test_a_followers_index_is_loaded_and_follows_the_cluster(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        await _ledgers(tc)
        async with running(_config(zk, "leader:1")) as leader:
            await _leading(leader)
            async with running(_config(zk, "follower:1")) as follower:
                await _in_line(follower)
                sync = follower.index
                assert sync is not None
                await asyncio.wait_for(sync.ready.wait(), 30)
                assert sync.index.ids() == list(range(1, LEDGERS + 1))
                # Reported by a follower too: size, one load.
                assert _sample(follower, "index_ledgers") == LEDGERS
                assert _sample(follower, "index_loads_total") == 1
                assert 0 < _sample(follower, "index_bytes_per_ledger") < 400

                # Created, changed, deleted after the load: the watch brings each in.
                ids = tc.ids
                await tc.cluster.write_ledger(make_metadata(500, [ids[0], ids[2]]))
                changed = make_metadata(5, [ids[2], ids[0]], write_quorum=2, last_entry_id=9)
                await zk.set(tc.cluster.path(5), encode_ledger_metadata(changed))
                await zk.delete(tc.cluster.path(7))

                def caught_up() -> bool:
                    five = sync.index.get(5)
                    return (
                        500 in sync.index
                        and 7 not in sync.index
                        and five is not None
                        and five.znode_version == 1
                    )

                await _indexed(sync, caught_up, "the follower's index follows the cluster")
                five = sync.index.get(5)
                assert five is not None and five.metadata is not None
                md = five.metadata
                assert (md.segments, md.last_entry_id) == (changed.segments, 9)
                assert _sample(follower, "index_ledgers") == LEDGERS  # one more, one less
                # Still a follower, still the one load.
                assert not follower.state.is_leader and follower.index is sync
                assert _sample(follower, "index_loads_total") == 1
                assert _sample(follower, "index_resyncs_total") == 0
                assert _sample(follower, "index_failures_total") == 0


async def test_a_new_leader_checks_with_the_index_it_kept_as_a_follower(
    zk: ZkClient, zk_server: ZooKeeperServer, info_logs: list[MutableMapping[str, Any]]
) -> None:
    async with test_cluster(zk, 3) as tc:
        await _ledgers(tc)
        clean = snapshot()
        async with running(_config(zk, "old:1")) as old:
            await _leading(old)
            async with running(_config(zk, "new:1")) as new:
                await _in_line(new)
                sync = new.index
                assert sync is not None
                await asyncio.wait_for(sync.ready.wait(), 30)
                # A change while following: the new leader's checks must see it.
                await tc.cluster.write_ledger(make_metadata(500, [tc.ids[0], tc.ids[1]]))
                await _indexed(sync, lambda: 500 in sync.index, "ledger 500 in the index")

                old_zk = old.store
                assert isinstance(old_zk, ZkClient)
                client_id = old_zk.client_id
                assert client_id is not None
                t0 = time.time()
                await asyncio.to_thread(expire_session, zk_server.hosts, client_id)
                await _leading(new)
                started = await _first_check_after(new, t0)
                assert started - t0 < SESSION + 2, f"first check {started - t0:.1f}s after"

                # The index it kept: the same object, no second full read, and the check read it.
                assert new.index is sync and sync.ready.is_set()
                assert new.state.tallies.index_loads == 1
                assert len(_logged(info_logs, "index loaded", "new:1")) == 1
                [first, *_] = _logged(info_logs, "check started", "new:1")
                assert (first["check"], first["metadata"]) == (str(Check.BOOKIES), "index")
                report = new.state.checks[Check.BOOKIES].last_report
                assert report is not None and report.ledgers_checked == LEDGERS + 1
                assert _sample(new, "index_ledgers") == LEDGERS + 1
                # The old leader, back in line in a new session, re-read its own index.
                await _in_line(old)
                assert old.index is not None
                await asyncio.wait_for(old.index.ready.wait(), 30)
                assert old.state.tallies.index_resyncs >= 1
        await assert_no_leaks(clean)


async def test_without_standby_a_follower_holds_no_index_and_a_new_leader_loads_one(
    zk: ZkClient, zk_server: ZooKeeperServer, info_logs: list[MutableMapping[str, Any]]
) -> None:
    off = "daemon.standby_index=false"
    async with test_cluster(zk, 3) as tc:
        await _ledgers(tc)
        async with running(_config(zk, "old:1", off)) as old:
            await _leading(old)
            async with running(_config(zk, "new:1", off)) as new:
                await _in_line(new)
                await until(
                    events_of(new).leader_read, lambda: new.state.leader == "old:1", "leader seen"
                )
                assert new.index is None
                assert _sample(new, "index_ledgers") == 0
                assert _sample(new, "index_loads_total") == 0
                assert not _logged(info_logs, "index loaded", "new:1")

                old_zk = old.store
                assert isinstance(old_zk, ZkClient)
                client_id = old_zk.client_id
                assert client_id is not None
                t0 = time.time()
                await asyncio.to_thread(expire_session, zk_server.hosts, client_id)
                await _leading(new)
                await _first_check_after(new, t0)
                # Loaded when elected, and the first check waited for it and read it.
                assert new.index is None
                assert new.state.tallies.index_loads == 1
                assert len(_logged(info_logs, "index loaded", "new:1")) == 1
                [first, *_] = _logged(info_logs, "check started", "new:1")
                assert (first["check"], first["metadata"]) == (str(Check.BOOKIES), "index")
                assert _sample(new, "index_ledgers") == LEDGERS
                # The old leader, in line again, dropped its index with its term (in line
                # again only once its term has wound down: it stepped down before voting).
                await until(
                    events_of(old).decided,
                    lambda: old.state.phase is Phase.VOTING and not old.state.is_leader,
                    "old steps down and votes again",
                )
                assert old.index is None
                assert _sample(old, "index_ledgers") == 0
                assert old.state.tallies.index_loads == 1


async def test_a_failed_standby_index_is_counted_and_replaced_while_the_leader_leads(
    zk: ZkClient, monkeypatch: pytest.MonkeyPatch, info_logs: list[MutableMapping[str, Any]]
) -> None:
    """An index that fails neither ends nor holds up leadership: the checks walk
    ZooKeeper, the failure is logged and counted, and a new index, started after the
    back-off, reaches the leader's checks."""
    monkeypatch.setattr(standby, "INDEX_BACKOFF", Backoff(initial=0.05, maximum=600.0))
    load = IndexSync._load
    loads: list[IndexSync] = []
    fail, second = asyncio.Event(), asyncio.Event()

    async def failing_once(self: IndexSync) -> None:
        loads.append(self)
        if len(loads) == 1:  # the first load fails once the leader's checks read it
            await fail.wait()
            raise RuntimeError("index bug")
        second.set()
        await load(self)

    monkeypatch.setattr(IndexSync, "_load", failing_once)
    async with test_cluster(zk, 3) as tc:
        await _ledgers(tc)
        async with running(_config(zk, "solo:1")) as solo:
            await _leading(solo)
            await until(
                events_of(solo).znode_read, lambda: solo.work is not None, "the leader's work"
            )
            assert solo.work is not None and solo.work.ctx.index is loads[0]
            fail.set()
            await asyncio.wait_for(second.wait(), 30)
            replacement = solo.index
            assert replacement is loads[1] and replacement is not loads[0]
            await asyncio.wait_for(replacement.ready.wait(), 30)
            assert loads[0].failed is not None
            assert _sample(solo, "index_failures_total") == 1
            assert _sample(solo, "index_loads_total") == 1
            assert any(
                e["event"] == "standby metadata index failed; starting again" for e in info_logs
            )
            # Leadership held throughout, and its checks now read the new index.
            assert solo.state.is_leader and solo.work is not None
            assert solo.work.ctx.index is replacement
            # The first round's run may still be walking the store (the index had failed):
            # the run triggered below is the one after it.
            await until(
                events_of(solo).check_ended,
                lambda: solo.state.checks[Check.PLACEMENT].last_finished is not None,
                "the first placement run",
            )
            placed = solo.state.checks[Check.PLACEMENT].last_finished
            await solo.trigger_check(Check.PLACEMENT)
            await until(
                events_of(solo).check_ended,
                lambda: solo.state.checks[Check.PLACEMENT].last_finished != placed,
                "placement again",
            )
            last = _logged(info_logs, "check started", "solo:1")[-1]
            assert (last["check"], last["metadata"]) == (str(Check.PLACEMENT), "index")
            assert not any(e["event"] == "no longer the auditor" for e in info_logs)
