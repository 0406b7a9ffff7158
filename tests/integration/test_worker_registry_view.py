"""The worker's view of the registered bookies (`RegistryView`) on a real ZooKeeper: kept
while nothing changes, listed again when a watch fires, after `MAX_AGE`, or when a
listing had no watch to keep it current."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from auditor.metadata.registry import BookieSet
from auditor.testing.cluster import ClusterWriter
from auditor.worker.registry_view import MAX_AGE, RegistryView
from auditor.zk import ZkClient

ROOT = "/ledgers"


@pytest.fixture
async def other(zk_hosts: str) -> AsyncIterator[ZkClient]:
    """A second session: the bookies registering and leaving."""
    client = ZkClient(zk_hosts, timeout=10.0, session_timeout=10.0)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _register(zk: ZkClient, bookie: str, *, readonly: bool = False) -> None:
    where = f"{ROOT}/available/readonly" if readonly else f"{ROOT}/available"
    await zk.create(f"{where}/{bookie}", b"", ephemeral=True)


async def test_kept_until_a_watch_fires(zk: ZkClient, other: ZkClient) -> None:
    await ClusterWriter(zk, ROOT).init_cluster()
    await _register(other, "a:3181")
    await _register(other, "r:3181", readonly=True)
    view = RegistryView(zk, ROOT, clock=Clock())
    first = await view.read()
    assert first == BookieSet(frozenset({"a:3181"}), frozenset({"r:3181"}))
    assert await view.read() is first  # no new listing: nothing changed
    [writable_changed, _] = view._changed
    await _register(other, "b:3181")
    await asyncio.wait_for(writable_changed.wait(), 10)
    second = await view.read()
    assert second == BookieSet(frozenset({"a:3181", "b:3181"}), frozenset({"r:3181"}))
    assert await view.read() is second
    readonly_changed = view._changed[1]
    await other.delete(f"{ROOT}/available/readonly/r:3181")
    await asyncio.wait_for(readonly_changed.wait(), 10)
    assert await view.read() == BookieSet(frozenset({"a:3181", "b:3181"}), frozenset())


async def test_listed_again_after_max_age_keeping_its_watches(zk: ZkClient) -> None:
    await ClusterWriter(zk, ROOT).init_cluster()
    await _register(zk, "a:3181")
    clock = Clock()
    view = RegistryView(zk, ROOT, clock=clock)
    first = await view.read()
    watches = list(view._changed)
    clock.now += MAX_AGE
    again = await view.read()
    assert again == first and again is not first  # listed again...
    assert view._changed == watches  # ...without setting more watches
    assert await view.read() is again


async def test_a_listing_without_a_watch_is_not_kept(zk: ZkClient) -> None:
    """No `available/readonly` node (a registry Java's bookies never made read-only):
    nothing would say when it appears, so every read lists."""
    await zk.ensure_path(f"{ROOT}/available")
    await _register(zk, "a:3181")
    view = RegistryView(zk, ROOT, clock=Clock())
    first = await view.read()
    assert first == BookieSet(frozenset({"a:3181"}), frozenset())
    await zk.ensure_path(f"{ROOT}/available/readonly")
    await _register(zk, "r:3181", readonly=True)
    assert await view.read() == BookieSet(frozenset({"a:3181"}), frozenset({"r:3181"}))
