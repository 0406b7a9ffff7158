"""The asyncio facade against a real ZooKeeper server."""

from __future__ import annotations

import asyncio
import time

import pytest

from auditor.testing.zkserver import ZooKeeperServer, expire_session, free_port
from auditor.zk import (
    BadVersionError,
    FencedOutError,
    KazooState,
    NodeExistsError,
    NoNodeError,
    ZkClient,
    ZkUnavailableError,
)


async def test_basic_calls_round_trip(zk: ZkClient) -> None:
    await zk.create("/a/b", b"x", makepath=True)
    data, stat = await zk.get("/a/b")
    assert data == b"x"
    assert stat.version == 0
    stat = await zk.set("/a/b", b"y", version=0)
    assert stat.version == 1
    assert await zk.get_children("/a") == ["b"]
    with pytest.raises(NodeExistsError):
        await zk.create("/a/b", b"z")
    await zk.delete("/a/b")
    with pytest.raises(NoNodeError):
        await zk.get("/a/b")
    assert await zk.exists("/a/b") is None


async def test_many_concurrent_reads_share_one_connection(zk: ZkClient) -> None:
    await zk.create_many([("/m", b"")] + [(f"/m/n{i}", str(i).encode()) for i in range(500)])
    got = await asyncio.gather(*(zk.get(f"/m/n{i}") for i in range(500)))
    assert [d for d, _ in got] == [str(i).encode() for i in range(500)]


async def test_unreachable_server_fails_within_timeout() -> None:
    port = free_port()  # nothing listens there
    client = ZkClient(f"127.0.0.1:{port}", timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(ZkUnavailableError, match="cannot connect to ZooKeeper"):
        await client.start()
    assert time.monotonic() - t0 < 5.0


async def test_real_session_expiry_is_reported_as_lost(
    zk_server: ZooKeeperServer, zk: ZkClient
) -> None:
    states = zk.states()
    first = asyncio.ensure_future(anext(states))
    await zk.create("/eph", b"", ephemeral=True)
    cid = zk.client_id
    assert cid is not None
    await asyncio.to_thread(expire_session, zk_server.hosts, cid)
    seen: list[KazooState] = []
    nxt = first
    while KazooState.LOST not in seen:
        seen.append(await asyncio.wait_for(nxt, 15))
        nxt = asyncio.ensure_future(anext(states))
    nxt.cancel()
    # The ephemeral node went with the session.
    async with ZkClient(zk.hosts) as other:
        assert await other.exists("/eph") is None


async def test_fenced_writes_happen_only_while_the_fence_stands(zk: ZkClient) -> None:
    await zk.create("/vote", b"me", ephemeral=True)
    fenced = zk.fenced("/vote", 0)
    await fenced.create("/a/b/c", b"1", makepath=True)
    assert (await zk.get("/a/b/c"))[0] == b"1"
    with pytest.raises(NodeExistsError):
        await fenced.create("/a/b/c", b"2")
    await fenced.set("/a/b/c", b"3", version=0)
    with pytest.raises(BadVersionError):
        await fenced.set("/a/b/c", b"4", version=0)
    await zk.delete("/vote")  # leadership gone
    with pytest.raises(FencedOutError, match="leadership lost"):
        await fenced.create("/a/b/d", b"x")
    with pytest.raises(FencedOutError):
        await fenced.set("/a/b/c", b"5")
    with pytest.raises(FencedOutError):
        await fenced.delete("/a/b/c")
    assert await zk.exists("/a/b/d") is None
    assert (await zk.get("/a/b/c"))[0] == b"3"
