"""`ZkClient.get_many` against a real ZooKeeper: multiRead, and the pipelined fallback.

The fixture's server (3.8) takes multiRead; the fallback is selected by the
client's `multi_read=False`, and an old server's refusal is the real server's
own answer to an opcode it does not know (it answers an unknown opcode exactly
as a 3.5 answers 22: UNIMPLEMENTED, then it closes the connection).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from kazoo.exceptions import NoNodeError as KazooNoNode

from auditor.testing.zkserver import ZooKeeperServer
from auditor.zk import (
    SessionState,
    ZkAuthError,
    ZkClient,
    ZkResponseError,
    ZkSecurity,
    ZkStat,
    parse_zk_auth,
)
from auditor.zk import multiread as mr


async def _pair(hosts: str) -> AsyncIterator[tuple[ZkClient, ZkClient]]:
    multi = ZkClient(hosts, timeout=10.0)
    single = ZkClient(hosts, timeout=10.0, multi_read=False)
    async with multi, single:
        yield multi, single


@pytest.fixture
async def clients(zk: ZkClient, zk_hosts: str) -> AsyncIterator[tuple[ZkClient, ZkClient]]:
    """A client that finds out multiRead, and one that never uses it, in the test's chroot."""
    async for pair in _pair(zk_hosts):
        yield pair


async def test_mixed_existing_and_missing_znodes(
    zk: ZkClient, clients: tuple[ZkClient, ZkClient]
) -> None:
    await zk.create("/d", b"")
    await zk.create("/d/empty", b"")
    await zk.create("/d/bin", bytes(range(256)) * 40)  # 10 KiB, every byte value
    await zk.create("/d/v", b"one")
    await zk.set("/d/v", b"two")
    await zk.set("/d/v", b"three")
    paths = ["/d/bin", "/d/gone", "/d/v", "/d/empty", "/nowhere/at/all", "/d/v", "/d"]
    singles: list[tuple[bytes, ZkStat] | None] = []
    for p in paths:
        exists = await zk.exists(p)
        singles.append(None if exists is None else await zk.get(p))
    multi, single = clients
    assert multi.multi_read is None
    got = await multi.get_many(paths)
    assert multi.multi_read is True
    assert got == singles
    assert got[0] is not None and got[0][0] == bytes(range(256)) * 40
    assert got[2] is not None and got[2][0] == b"three" and got[2][1].version == 2
    assert got[3] is not None and got[3][0] == b"" and got[3][1].version == 0
    assert got[1] is None and got[4] is None
    assert await single.get_many(paths) == singles
    assert single.multi_read is False
    assert await multi.get_many([]) == [] == await single.get_many([])


async def test_paths_are_read_under_the_chroot(
    zk_server: ZooKeeperServer, zk: ZkClient, zk_hosts: str
) -> None:
    chroot = zk_hosts[len(zk_server.hosts) :]
    await zk.create("/x", b"inside")
    async with ZkClient(zk_server.hosts, timeout=10.0) as root:
        await root.ensure_path("/x")  # the same name outside the chroot, empty
        outside = await root.get_many(["/x", f"{chroot}/x"])
        assert [f[0] for f in outside if f is not None] == [b"", b"inside"]
        async for multi, single in _pair(zk_hosts):
            for client in (multi, single):
                found = await client.get_many(["/x", "/", "//x/"])
                assert [f[0] for f in found if f is not None] == [b"inside", b"", b"inside"]
            assert multi.multi_read is True
        root_stat = (await root.get_many([chroot]))[0]
        assert root_stat is not None and (await zk.get_many(["/"]))[0] == root_stat


async def test_a_batch_beyond_one_request(zk: ZkClient, clients: tuple[ZkClient, ZkClient]) -> None:
    n = 2 * mr.MAX_OPS + 123
    await zk.create("/big", b"")
    for start in range(0, n, 1000):
        await zk.create_many(
            [(f"/big/n{i:05d}", f"v{i}".encode()) for i in range(start, min(n, start + 1000))]
        )
    paths = [f"/big/n{i:05d}" for i in range(n)]
    paths[7] = "/big/missing"
    for client in clients:
        got = await client.get_many(paths)
        assert len(got) == n and got[7] is None
        assert [g[0] for g in got if g is not None] == [
            f"v{i}".encode() for i in range(n) if i != 7
        ]


async def test_an_acl_refusal_names_the_path(
    zk: ZkClient, zk_hosts: str, clients: tuple[ZkClient, ZkClient]
) -> None:
    alice = ZkSecurity(parse_zk_auth("digest:alice:alice-secret"), True)
    async with ZkClient(zk_hosts, timeout=10.0, security=alice) as owner:
        await owner.create("/secret", b"s")
    await zk.create("/open", b"o")
    for client in clients:
        with pytest.raises(ZkAuthError, match="denied get /secret"):
            await client.get_many(["/open", "/secret", "/missing"])
        assert await client.get_many(["/open", "/missing"]) == [await zk.get("/open"), None]


async def test_an_old_server_is_found_out_once_and_read_the_old_way(
    zk: ZkClient, zk_hosts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await zk.create_many([("/o", b"")] + [(f"/o/n{i}", f"{i}".encode()) for i in range(50)])
    paths = [f"/o/n{i}" for i in range(52)]
    expected = await zk.get_many(paths)
    # An opcode this server does not know gets the answer 3.5 gives to multiRead.
    monkeypatch.setattr(mr.MultiRead, "type", 122)
    async with ZkClient(zk_hosts, timeout=10.0) as old:
        session = old.client_id
        states = old.states()
        assert await old.get_many(paths) == expected
        assert old.multi_read is False
        # The server did close the connection after its refusal; kazoo reconnected.
        assert await asyncio.wait_for(anext(states), 10) == SessionState.SUSPENDED
        assert await asyncio.wait_for(anext(states), 10) == SessionState.CONNECTED
        await states.aclose()
        assert await old.get_many(paths) == expected
        assert old.client_id == session  # the server closed the connection, not the session
        assert await old.get(paths[0]) == expected[0]


async def test_a_malformed_reply_fails_its_batch_only(
    zk: ZkClient, zk_hosts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kazoo's reader hands the parse error to the batch and reads on: the batch fails
    with a typed error at once (no hang until the timeout), the session goes on."""
    await zk.create_many([("/m", b""), ("/m/a", b"a"), ("/m/b", b"b")])
    parse = mr.MultiRead.deserialize

    def cut_short(self: mr.MultiRead, buffer: bytes, offset: int) -> list[mr.Result]:
        return parse(self, buffer[:-3], offset)

    async with ZkClient(zk_hosts, timeout=30.0) as client:
        session = client.client_id
        monkeypatch.setattr(mr.MultiRead, "deserialize", cut_short)
        started = asyncio.get_running_loop().time()
        with pytest.raises(ZkResponseError, match="multiRead reply truncated after 2 of 2"):
            await client.get_many(["/m/a", "/m/b"])
        assert asyncio.get_running_loop().time() - started < 5
        monkeypatch.setattr(mr.MultiRead, "deserialize", parse)
        assert await client.get_many(["/m/a", "/m/b"]) == [
            await zk.get("/m/a"),
            await zk.get("/m/b"),
        ]
        assert client.connected and client.client_id == session and client.multi_read


async def test_get_children_ops_on_the_wire(zk: ZkClient) -> None:
    """The request class carries getChildren too (no facade method uses it yet): the
    server's answer to a mixed request parses as each lone call's answer."""
    await zk.create_many([("/c", b"c"), ("/c/b", b""), ("/c/a", b""), ("/c/\u00e9", b"")])
    chroot = zk.kazoo.chroot
    ops = [
        (mr.GET_CHILDREN, mr.chrooted(chroot, "/c")),
        (mr.GET_DATA, mr.chrooted(chroot, "/c")),
        (mr.GET_CHILDREN, mr.chrooted(chroot, "/c/a")),
        (mr.GET_CHILDREN, mr.chrooted(chroot, "/none")),
    ]
    result = mr.submit(zk.kazoo, mr.MultiRead(ops))
    children, data, leaf, missing = await asyncio.to_thread(result.get, True, 10)
    assert sorted(children) == sorted(await zk.get_children("/c")) == ["a", "b", "\u00e9"]
    assert data == await zk.get("/c")
    assert leaf == []
    assert isinstance(missing, KazooNoNode)  # a raw multiRead result: kazoo's own
