"""The etcd adapter against a real etcd 3.4: the port's contract, and the keys exactly as
Apache Pulsar's `EtcdMetadataStore` reads and writes them (checked with a raw aetcd client
beside the store)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator

import aetcd
import pytest

from auditor.etcd import EtcdStat, EtcdStore
from auditor.store import (
    BadVersionError,
    Event,
    EventType,
    FencedOutError,
    Gap,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionState,
    StoreAuthError,
    StoreKind,
    StoreTimeoutError,
    StoreUnavailableError,
)
from auditor.testing.etcdserver import EtcdServer
from auditor.testing.zkserver import free_port


@pytest.fixture
async def raw(etcd_server: EtcdServer) -> AsyncIterator[aetcd.Client]:
    """A plain aetcd client on the same etcd: what Pulsar (or anyone) sees of our keys."""
    client = aetcd.Client(host="127.0.0.1", port=etcd_server.port, timeout=10)
    await client.connect()
    try:
        yield client
    finally:
        await client.close()


def key(store: EtcdStore, path: str) -> bytes:
    return (store.prefix + path).encode()


async def next_state(states: AsyncGenerator[SessionState, None]) -> SessionState:
    """The next session state, within a lease's TTL and then some."""
    async with asyncio.timeout(20):
        return await anext(states)


# --- the layout: Pulsar's rules -------------------------------------------------------


async def test_is_a_metadata_store(etcd: EtcdStore) -> None:
    assert isinstance(etcd, MetadataStore)
    assert etcd.kind is StoreKind.ETCD
    assert etcd.ranged
    assert etcd.connected
    assert etcd.state == "CONNECTED"
    assert etcd.where.startswith("http://127.0.0.1:")


async def test_create_then_set_is_version_1_seen_and_etcd_version_2(
    etcd: EtcdStore, raw: aetcd.Client
) -> None:
    assert await etcd.create("/ledgers/L1", b"one") == "/ledgers/L1"
    data, stat = await etcd.get("/ledgers/L1")
    assert (data, stat.version, stat.ephemeralOwner) == (b"one", 0, 0)
    stat = await etcd.set("/ledgers/L1", b"two", version=0)
    assert stat.version == 1
    assert isinstance(stat, EtcdStat)
    got = await raw.get(key(etcd, "/ledgers/L1"))
    assert got is not None
    assert (got.value, got.version, got.lease) == (b"two", 2, 0)
    assert (stat.mod_revision, stat.create_revision) == (got.mod_revision, got.create_revision)
    assert (await etcd.get("/ledgers/L1"))[1].version == 1
    # No parent keys, as Pulsar writes none.
    assert await raw.get(key(etcd, "/ledgers")) is None


async def test_reads_keys_as_pulsar_writes_them(etcd: EtcdStore, raw: aetcd.Client) -> None:
    await raw.put(key(etcd, "/managed-ledgers/t/ns/persistent/topic"), b"\x08\x01")
    await raw.put(key(etcd, "/managed-ledgers/t/ns/persistent/topic"), b"\x08\x02")
    data, stat = await etcd.get("/managed-ledgers/t/ns/persistent/topic")
    assert (data, stat.version) == (b"\x08\x02", 1)
    assert await etcd.get_children("/managed-ledgers") == ["t"]
    assert await etcd.get_children("/managed-ledgers/t/ns") == ["persistent"]


async def test_children_are_first_segments_of_the_keys_below(
    etcd: EtcdStore, raw: aetcd.Client
) -> None:
    await etcd.create("/c/x/deep/leaf", b"")
    await etcd.create("/c/y", b"")
    await etcd.create("/c/x/other", b"")
    await etcd.create("/c-beside", b"")  # sorts between /c and /c/, is no child of /c
    await etcd.create("/c.beside/z", b"")
    assert await etcd.get_children("/c") == ["x", "y"]
    assert await etcd.get_children("/c/x") == ["deep", "other"]
    assert await etcd.get_children("/c/y") == []
    assert await etcd.get_children("/") == ["c", "c-beside", "c.beside"]
    with pytest.raises(NoNodeError):
        await etcd.get_children("/nothing")
    # An intermediate "directory" has no key, yet exists as ZooKeeper callers expect.
    assert await raw.get(key(etcd, "/c/x")) is None
    stat = await etcd.exists("/c/x")
    assert stat is not None
    assert (stat.version, stat.ephemeralOwner) == (0, 0)
    assert await etcd.get("/c/x") == (b"", stat)
    assert await etcd.exists("/c/nothing") is None
    with pytest.raises(NoNodeError):
        await etcd.get("/c/nothing")


async def test_sequential_names_follow_the_parent_keys_version(
    etcd: EtcdStore, raw: aetcd.Client
) -> None:
    assert await etcd.create("/q/n-", b"a", sequence=True) == "/q/n-0"
    assert await etcd.create("/q/n-", b"b", sequence=True) == "/q/n-1"
    assert await etcd.create("/q/n-", b"c", sequence=True) == "/q/n-2"
    parent = await raw.get(key(etcd, "/q"))
    assert parent is not None
    assert (parent.value, parent.version) == (b"", 3)
    assert (await etcd.get("/q/n-1"))[0] == b"b"
    # A parent with data of its own: Pulsar's put overwrites it, the name is its version.
    await etcd.create("/p", b"data")
    assert await etcd.create("/p/s", b"", sequence=True) == "/p/s1"
    assert (await etcd.get("/p"))[0] == b""
    # Directly under the root: the parent key is "/" (under our prefix).
    assert await etcd.create("/top-", b"", sequence=True) == "/top-0"


async def test_ephemeral_keys_are_on_our_lease(etcd: EtcdStore, raw: aetcd.Client) -> None:
    session = etcd.session
    assert session is not None and session != 0
    await etcd.create("/eph", b"me", ephemeral=True)
    got = await raw.get(key(etcd, "/eph"))
    assert got is not None
    assert got.lease == session
    stat = await etcd.exists("/eph")
    assert stat is not None and stat.ephemeralOwner == session
    # A set keeps the key on our lease (etcd would detach it from a plain put).
    assert (await etcd.set("/eph", b"still me")).ephemeralOwner == session
    got = await raw.get(key(etcd, "/eph"))
    assert got is not None and got.lease == session
    await etcd.create("/persistent", b"")
    assert (await etcd.get("/persistent"))[1].ephemeralOwner == 0
    info = await raw.get_lease_info(session)
    assert info.TTL > 0 and info.grantedTTL == 10


async def test_close_revokes_the_lease(etcd_server: EtcdServer, raw: aetcd.Client) -> None:
    store = EtcdStore([etcd_server.endpoint], prefix="/t-close", timeout=5, session_timeout=30)
    await store.start()
    await store.create("/eph", b"", ephemeral=True)
    await store.close()
    assert await raw.get(b"/t-close/eph") is None
    with pytest.raises(StoreUnavailableError):
        await store.get("/eph")


async def test_errors_as_zookeeper_gives_them(etcd: EtcdStore) -> None:
    await etcd.create("/n", b"")
    with pytest.raises(NodeExistsError):
        await etcd.create("/n", b"")
    with pytest.raises(BadVersionError):
        await etcd.set("/n", b"x", version=3)
    with pytest.raises(NoNodeError):
        await etcd.set("/missing", b"x")
    with pytest.raises(NoNodeError):
        await etcd.set("/missing", b"x", version=0)
    with pytest.raises(NoNodeError):
        await etcd.delete("/missing")
    with pytest.raises(BadVersionError):
        await etcd.delete("/n", version=1)
    # No parent needed, with or without makepath.
    assert await etcd.create("/a/b/c", b"") == "/a/b/c"
    assert await etcd.create("/d/e/f", b"", makepath=True) == "/d/e/f"
    await etcd.create("/a", b"")
    with pytest.raises(NotEmptyError):
        await etcd.delete("/a")
    with pytest.raises(NotEmptyError):
        await etcd.delete("/a/b")  # a directory without a key of its own
    await etcd.delete("/a/b/c", version=0)
    await etcd.delete("/a")
    await etcd.set("/n", b"x", version=0)
    await etcd.delete("/n", version=1)
    assert await etcd.exists("/n") is None


async def test_ensure_path_puts_empty_keys_where_missing(
    etcd: EtcdStore, raw: aetcd.Client
) -> None:
    await etcd.create("/e1", b"kept")
    await etcd.ensure_path("/e1/e2/e3")
    await etcd.ensure_path("/e1/e2/e3")
    for path, value, version in (("/e1", b"kept", 1), ("/e1/e2", b"", 1), ("/e1/e2/e3", b"", 1)):
        got = await raw.get(key(etcd, path))
        assert got is not None
        assert (path, got.value, got.version) == (path, value, version)


async def test_create_many_is_one_transaction_per_chunk(etcd: EtcdStore, raw: aetcd.Client) -> None:
    await etcd.create_many([("/m", b"")] + [(f"/m/{i:03}", b"%d" % i) for i in range(200)])
    assert len(await etcd.get_children("/m")) == 200
    await etcd.create("/x/2", b"")
    with pytest.raises(NodeExistsError, match="/x/2"):
        await etcd.create_many([("/x/1", b""), ("/x/2", b""), ("/x/3", b"")])
    assert await raw.get(key(etcd, "/x/1")) is None  # all or nothing


# --- fencing ------------------------------------------------------------------------


async def test_fenced_writes_refused_once_the_fence_changes(
    etcd: EtcdStore, raw: aetcd.Client
) -> None:
    await etcd.create("/leader", b"me")
    await etcd.create("/data", b"v0")
    await etcd.create("/doomed", b"")
    fenced = etcd.fenced("/leader", 0)
    assert fenced.session == etcd.session
    await fenced.set("/data", b"v1")
    await fenced.create("/made", b"")
    # The fence's own compare and the write's: the write's failure is told as usual.
    with pytest.raises(BadVersionError):
        await fenced.set("/data", b"x", version=7)
    with pytest.raises(NodeExistsError):
        await fenced.create("/made", b"")
    with pytest.raises(NoNodeError):
        await fenced.delete("/missing")
    await fenced.create("/full/child", b"")
    with pytest.raises(NotEmptyError):
        await fenced.delete("/full")

    await etcd.set("/leader", b"someone else")  # the fence moves on to version 1
    with pytest.raises(FencedOutError, match="/leader"):
        await fenced.set("/data", b"v2")
    with pytest.raises(FencedOutError):
        await fenced.create("/late", b"")
    with pytest.raises(FencedOutError):
        await fenced.delete("/doomed")
    with pytest.raises(FencedOutError):
        await fenced.create("/seq-", b"", sequence=True)
    with pytest.raises(FencedOutError):
        await fenced.create_many([("/late1", b""), ("/late2", b"")])
    got = await raw.get(key(etcd, "/data"))
    assert got is not None and (got.value, got.version) == (b"v1", 2)
    assert await raw.get(key(etcd, "/late")) is None
    assert await raw.get(key(etcd, "/late1")) is None
    assert await raw.get(key(etcd, "/doomed")) is not None
    assert await raw.get(key(etcd, "/")) is None  # no sequential counter put either
    # Unfenced, the same session writes on.
    await etcd.set("/data", b"v2")
    await etcd.fenced("/leader", 1).set("/data", b"v3")
    await etcd.delete("/leader")
    with pytest.raises(FencedOutError):
        await etcd.fenced("/leader", 1).set("/data", b"v4")


# --- batched and ranged reads -------------------------------------------------------


async def test_get_many_beyond_one_transaction_with_missing_keys(etcd: EtcdStore) -> None:
    await etcd.create_many([(f"/g/{i:04}", b"%d" % i) for i in range(0, 400, 2)])
    paths = [f"/g/{i:04}" for i in range(400)]
    found = await etcd.get_many(paths)
    assert len(found) == 400
    for i, item in enumerate(found):
        if i % 2:
            assert item is None
        else:
            assert item is not None
            assert item[0] == b"%d" % i and item[1].version == 0
    assert await etcd.get_many([]) == []
    assert await etcd.get_many(["/g"]) == [None]  # keys only: no directory here


async def test_read_range_pages_in_key_order(etcd: EtcdStore) -> None:
    await etcd.create_many([(f"/r/{i:03}", b"%d" % i) for i in range(50)])
    await etcd.create("/s/outside", b"")
    seen: list[str] = []
    start, pages = "/r/", []
    while True:
        items, more = await etcd.read_range(start, "/r0", limit=20)
        pages.append((len(items), more))
        seen += [item.path for item in items]
        if not more:
            break
        start = items[-1].path + "\0"
    assert pages == [(20, True), (20, True), (10, False)]
    assert seen == [f"/r/{i:03}" for i in range(50)]
    items, more = await etcd.read_range("/r/010", "/r/013", limit=100)
    assert [(i.path, i.data, i.stat.version) for i in items] == [
        ("/r/010", b"10", 0),
        ("/r/011", b"11", 0),
        ("/r/012", b"12", 0),
    ]
    assert not more


# --- watches ------------------------------------------------------------------------


async def test_watch_tree_delivers_changes_in_order(etcd: EtcdStore) -> None:
    queue = await etcd.watch_tree("/w")
    await etcd.create("/w", b"")
    await etcd.create("/w/a", b"1")
    await etcd.set("/w/a", b"2")
    await etcd.create("/w/a/deep", b"")
    await etcd.create("/w-beside", b"")  # not below /w
    await etcd.delete("/w/a/deep")
    await etcd.delete("/w/a")
    got = [await asyncio.wait_for(queue.get(), 5) for _ in range(6)]
    assert got == [
        Event(EventType.CREATED, "/w"),
        Event(EventType.CREATED, "/w/a"),
        Event(EventType.CHANGED, "/w/a"),
        Event(EventType.CREATED, "/w/a/deep"),
        Event(EventType.DELETED, "/w/a/deep"),
        Event(EventType.DELETED, "/w/a"),
    ]
    await etcd.unwatch_tree("/w")
    await etcd.create("/w/b", b"")
    await asyncio.sleep(0.3)
    assert queue.empty()


async def test_one_shot_watches_fire_on_the_first_change_after_the_read(
    etcd: EtcdStore,
) -> None:
    await etcd.create("/o/node", b"v")
    data, stat, changed = await etcd.get_watched("/o/node")
    assert (data, stat.version) == (b"v", 0)
    children, child_changed = await etcd.get_children_watched("/o")
    assert children == ["node"]
    missing, created = await etcd.exists_watched("/o/later")
    assert missing is None
    await asyncio.sleep(0.2)
    assert not changed.is_set() and not child_changed.is_set() and not created.is_set()

    await etcd.set("/o/node", b"w")
    await asyncio.wait_for(changed.wait(), 5)
    await asyncio.sleep(0.2)
    assert not child_changed.is_set()  # a data change is no change of children
    await etcd.create("/o/later", b"")
    await asyncio.wait_for(created.wait(), 5)
    await asyncio.wait_for(child_changed.wait(), 5)


async def test_a_change_between_the_read_and_the_watch_is_not_lost(etcd: EtcdStore) -> None:
    await etcd.create("/race", b"0")
    # The change lands before the watch's stream is even opened (the task has not run).
    _, _, changed = await etcd.get_watched("/race")
    await etcd.set("/race", b"1")
    await asyncio.wait_for(changed.wait(), 5)


# --- the session --------------------------------------------------------------------


async def test_a_revoked_lease_is_lost_then_a_new_session_connects(
    etcd: EtcdStore, raw: aetcd.Client
) -> None:
    old = etcd.session
    assert old is not None
    await etcd.create("/leader", b"me", ephemeral=True)
    fenced = etcd.fenced("/leader", 0)
    await fenced.create("/work", b"")
    tree = await etcd.watch_tree("/leader")
    states = etcd.states()

    await raw.revoke_lease(old)  # as etcd does when the lease expires

    assert await next_state(states) is SessionState.LOST
    assert await next_state(states) is SessionState.CONNECTED
    assert etcd.session not in (None, old)
    assert etcd.connected
    assert await raw.get(key(etcd, "/leader")) is None
    assert await etcd.exists("/leader") is None
    with pytest.raises(FencedOutError):
        await fenced.set("/work", b"late")
    assert (await etcd.get("/work"))[0] == b""
    got = [await asyncio.wait_for(tree.get(), 5) for _ in range(2)]
    assert got == [Event(EventType.DELETED, "/leader"), Gap("LOST")]
    # Ephemerals of the new session are on the new lease.
    await etcd.create("/leader", b"me again", ephemeral=True)
    stat = await etcd.exists("/leader")
    assert stat is not None and stat.ephemeralOwner == etcd.session


async def test_unreachable_endpoint_fails_within_the_timeout() -> None:
    store = EtcdStore([f"http://127.0.0.1:{free_port()}"], timeout=2.0)
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=r"cannot connect to etcd at http://127"):
        await store.start()
    assert time.monotonic() - t0 < 4.0
    assert store.session is None


async def test_a_silent_endpoint_fails_within_the_timeout() -> None:
    """A server that takes the connection and never answers: the deadline, not a hang."""
    writers: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(OSError):
            while await reader.read(4096):
                pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        store = EtcdStore([f"127.0.0.1:{port}"], timeout=1.5)
        t0 = time.monotonic()
        with pytest.raises(StoreTimeoutError, match=r"within 1\.5s"):
            await store.start()
        assert time.monotonic() - t0 < 3.5
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()
        await asyncio.sleep(0.1)  # the handlers see the closed sockets and end


async def test_the_first_endpoint_that_answers_is_used(etcd_server: EtcdServer) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    store = EtcdStore([dead, etcd_server.hosts], prefix="/t-failover", timeout=5.0)
    async with store:
        assert store.where == f"{dead},{etcd_server.endpoint}"
        await store.create("/x", b"")
        assert (await store.get("/x"))[0] == b""
        await store.delete("/x")


async def test_a_stopped_server_suspends_and_a_restarted_one_reconnects() -> None:
    server = EtcdServer()
    await asyncio.to_thread(server.start)
    try:
        store = EtcdStore([server.endpoint], timeout=3.0, session_timeout=30.0)
        await store.start()
        try:
            await store.create("/kept", b"v")
            tree = await store.watch_tree("/kept")
            states = store.states()
            await asyncio.to_thread(server.stop)
            with pytest.raises(StoreUnavailableError):
                await store.get("/kept")
            assert await next_state(states) is SessionState.SUSPENDED
            assert await asyncio.wait_for(tree.get(), 10) == Gap("SUSPENDED")
            assert not store.connected
            await asyncio.to_thread(server.start)
            assert await next_state(states) is SessionState.CONNECTED
            assert (await store.get("/kept"))[0] == b"v"
        finally:
            await store.close()
    finally:
        await asyncio.to_thread(server.destroy)


async def test_a_lease_unrenewed_for_its_ttl_is_lost_and_revoked_on_return() -> None:
    """etcd keeps leases across its restart (and renews them), so a session that has not
    renewed its lease for the TTL gives it up itself: LOST, and once etcd answers again
    the old lease is revoked (its ephemerals go) before a new one is taken."""
    server = EtcdServer()
    await asyncio.to_thread(server.start)
    try:
        store = EtcdStore([server.endpoint], timeout=2.0, session_timeout=2.0)
        await store.start()
        try:
            old = store.session
            await store.create("/eph", b"", ephemeral=True)
            states = store.states()
            await asyncio.to_thread(server.stop)
            assert await next_state(states) is SessionState.SUSPENDED
            assert await next_state(states) is SessionState.LOST
            assert store.session is None
            with pytest.raises(StoreUnavailableError, match="no etcd session"):
                await store.create("/eph2", b"", ephemeral=True)
            await asyncio.to_thread(server.start)
            assert await next_state(states) is SessionState.CONNECTED
            assert store.session not in (None, old)
            assert await store.exists("/eph") is None
        finally:
            await store.close()
    finally:
        await asyncio.to_thread(server.destroy)


async def test_authentication() -> None:
    server = EtcdServer()
    await asyncio.to_thread(server.start)
    try:
        raw = aetcd.Client(host="127.0.0.1", port=server.port, timeout=10)
        await raw.connect()
        try:
            auth = aetcd.rpc.AuthStub(raw.channel)
            await auth.RoleAdd(aetcd.rpc.AuthRoleAddRequest(name="root"))
            await auth.UserAdd(aetcd.rpc.AuthUserAddRequest(name="root", password="secret"))
            await auth.UserGrantRole(aetcd.rpc.AuthUserGrantRoleRequest(user="root", role="root"))
            await auth.AuthEnable(aetcd.rpc.AuthEnableRequest())
        finally:
            await raw.close()
        store = EtcdStore([server.endpoint], timeout=5.0, username="root", password="secret")
        async with store:
            await store.create("/x", b"v", ephemeral=True)
            assert (await store.get("/x"))[0] == b"v"
        refused = EtcdStore([server.endpoint], timeout=5.0, username="root", password="wrong")
        with pytest.raises(StoreAuthError, match="refused"):
            await refused.start()
        async with EtcdStore([server.endpoint], timeout=5.0) as anonymous:
            with pytest.raises(StoreAuthError):
                await anonymous.get("/x")
    finally:
        await asyncio.to_thread(server.destroy)
