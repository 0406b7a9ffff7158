"""Auditor election on BookKeeper's path, with Java-format votes, and fenced leader writes."""

from __future__ import annotations

import asyncio

import pytest

from auditor.daemon.election import (
    Elector,
    current_auditor,
    election_path,
    ordered_votes,
    vote_sequence,
)
from auditor.metadata.underreplication import UnderreplicationManager, ur_ledger_path
from auditor.testing.zkserver import ZooKeeperServer, expire_session
from auditor.zk import FencedOutError, SessionState, ZkClient, ZkUnavailableError

ROOT = "/ledgers"


async def votes_reach(zk: ZkClient, n: int) -> None:
    """Waits (on child watches, no polling) until the election has `n` votes."""
    path = election_path(ROOT)
    while True:
        children, changed = await zk.get_children_watched(path)
        if len(children) >= n:
            return
        await asyncio.wait_for(changed.wait(), 15)


def test_vote_order_is_bookkeepers() -> None:
    assert vote_sequence("V_0000000012") == 12
    assert vote_sequence("0f3a9cV_0000000003") == 3
    assert vote_sequence("readonly") is None
    assert ordered_votes(["V_0000000012", "abcV_0000000003", "x", "V_0000000007"]) == [
        "abcV_0000000003",
        "V_0000000007",
        "V_0000000012",
    ]


async def test_java_vote_ahead_keeps_us_follower_until_it_goes(zk: ZkClient, zk_hosts: str) -> None:
    path = election_path(ROOT)
    await zk.ensure_path(path)
    async with ZkClient(zk_hosts) as java:
        # What BookKeeper's ZkLedgerAuditorManager.createMyVote writes.
        await java.create(
            f"{path}/V_", b'bookieId: "10.0.0.9:3181"\n', ephemeral=True, sequence=True
        )
        elector = Elector(zk, ROOT, "auditor-1:9876")
        campaign = asyncio.ensure_future(elector.campaign())
        # Our vote is in line behind the Java one.
        await votes_reach(zk, 2)
        assert not campaign.done()
        assert await current_auditor(zk, ROOT) == "10.0.0.9:3181"
        ours = [c for c in await zk.get_children(path) if not c.startswith("V_")]
        assert len(ours) == 1 and vote_sequence(ours[0]) is not None
        data, _ = await zk.get(f"{path}/{ours[0]}")
        assert data == b'bookieId: "auditor-1:9876"\n'
    # The Java node's session closed: its vote is gone and we lead.
    leadership = await asyncio.wait_for(campaign, 15)
    assert await current_auditor(zk, ROOT) == "auditor-1:9876"
    assert (await zk.get(path))[0] == b'bookieId: "auditor-1:9876"\n'
    assert leadership.vote_path == f"{path}/{ours[0]}"
    await elector.resign()
    assert await zk.get_children(path) == []


async def test_resign_hands_over_to_the_next_in_line(zk: ZkClient, zk_hosts: str) -> None:
    async with ZkClient(zk_hosts) as other:
        first, second = Elector(zk, ROOT, "a:1"), Elector(other, ROOT, "b:2")
        await first.campaign()
        waiting = asyncio.ensure_future(second.campaign())
        await votes_reach(zk, 2)
        assert not waiting.done()
        await first.resign()
        await asyncio.wait_for(waiting, 10)
        assert await current_auditor(zk, ROOT) == "b:2"
        await second.resign()


async def test_cancelled_campaign_withdraws_its_vote(zk: ZkClient, zk_hosts: str) -> None:
    async with ZkClient(zk_hosts) as other:
        leader = Elector(zk, ROOT, "a:1")
        await leader.campaign()
        follower = Elector(other, ROOT, "b:2")
        waiting = asyncio.ensure_future(follower.campaign())
        await votes_reach(zk, 2)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert len(await zk.get_children(election_path(ROOT))) == 1
        await leader.resign()


async def test_a_leader_whose_session_expired_writes_nothing(
    zk_server: ZooKeeperServer, zk: ZkClient, zk_hosts: str
) -> None:
    leader_zk = ZkClient(zk_hosts, timeout=5, session_timeout=4)
    await leader_zk.start()
    states = leader_zk.states()
    try:
        leadership = await Elector(leader_zk, ROOT, "a:1").campaign()
        urm = UnderreplicationManager(leadership.store, ROOT)
        await urm.mark_underreplicated(1, ["b:3181"])  # a leader's write goes through
        cid = leader_zk.client_id
        assert cid is not None
        await asyncio.to_thread(expire_session, zk_hosts, cid)
        # Whatever state kazoo is in (expired, or reconnected with a new
        # session), the fenced write must not happen.
        with pytest.raises((FencedOutError, ZkUnavailableError)):
            await urm.mark_underreplicated(2, ["b:3181"])
        async with ZkClient(zk_hosts) as observer:
            assert await observer.exists(ur_ledger_path(f"{ROOT}/underreplication", 1)) is not None
            assert await observer.exists(ur_ledger_path(f"{ROOT}/underreplication", 2)) is None
            # Again after kazoo has reconnected with a new session.
            seen: list[SessionState] = []
            while not (SessionState.LOST in seen and seen[-1] == SessionState.CONNECTED):
                seen.append(await asyncio.wait_for(states.__anext__(), 15))
            with pytest.raises((FencedOutError, ZkUnavailableError)):
                await urm.mark_underreplicated(3, ["b:3181"])
            assert await observer.exists(ur_ledger_path(f"{ROOT}/underreplication", 3)) is None
    finally:
        await states.aclose()
        await leader_zk.close()
