"""Persistent recursive watches (our addWatch extension of kazoo) against a real ZooKeeper."""

from __future__ import annotations

import asyncio

from kazoo.protocol.states import EventType

from auditor.store import Event, Gap
from auditor.testing.zkserver import ZooKeeperServer, expire_session
from auditor.zk import ZkClient


async def _next(queue: asyncio.Queue[Event | Gap]) -> Event | Gap:
    return await asyncio.wait_for(queue.get(), 10)


async def test_every_create_change_and_delete_below_the_root_in_order(zk: ZkClient) -> None:
    await zk.ensure_path("/ledgers")
    await zk.ensure_path("/elsewhere")
    events = await zk.watch_tree("/ledgers")
    await zk.create("/ledgers/00/0000/L0001", b"a", makepath=True)
    await zk.set("/ledgers/00/0000/L0001", b"b")
    await zk.create("/elsewhere/x", b"")  # outside the root: no event
    await zk.set("/ledgers/00/0000/L0001", b"c")  # the watch persists after firing
    await zk.delete("/ledgers/00/0000/L0001")
    await zk.create("/ledgers/LAYOUT", b"")
    got = [await _next(events) for _ in range(7)]
    assert got == [
        Event(EventType.CREATED, "/ledgers/00"),
        Event(EventType.CREATED, "/ledgers/00/0000"),
        Event(EventType.CREATED, "/ledgers/00/0000/L0001"),
        Event(EventType.CHANGED, "/ledgers/00/0000/L0001"),
        Event(EventType.CHANGED, "/ledgers/00/0000/L0001"),
        Event(EventType.DELETED, "/ledgers/00/0000/L0001"),
        Event(EventType.CREATED, "/ledgers/LAYOUT"),
    ]
    assert events.empty()
    # Paths are the caller's (the fixture's chroot is not shown), one-shot watches
    # on the same nodes still work beside it.
    stat, changed = await zk.exists_watched("/ledgers/LAYOUT")
    assert stat is not None
    await zk.set("/ledgers/LAYOUT", b"1")
    await asyncio.wait_for(changed.wait(), 10)
    assert await _next(events) == Event(EventType.CHANGED, "/ledgers/LAYOUT")
    await zk.unwatch_tree("/ledgers")
    await zk.set("/ledgers/LAYOUT", b"2")
    await zk.create("/ledgers/after", b"")
    # A one-shot watch set after the removal still fires; the removed watch does not.
    stat, changed = await zk.exists_watched("/ledgers/after")
    await zk.delete("/ledgers/after")
    await asyncio.wait_for(changed.wait(), 10)
    assert events.empty()


async def test_a_lost_session_is_a_gap(zk_server: ZooKeeperServer) -> None:
    async with ZkClient(zk_server.hosts, timeout=10, session_timeout=6) as zk:
        await zk.ensure_path("/gap")
        events = await zk.watch_tree("/gap")
        client_id = zk.client_id
        assert client_id is not None
        await asyncio.to_thread(expire_session, zk_server.hosts, client_id)
        got = await _next(events)
        assert isinstance(got, Gap)
