"""The cluster writer and the bookie registry against a real ZooKeeper and a real etcd."""

from __future__ import annotations

import asyncio

import pytest

from auditor.etcd import EtcdStore
from auditor.metadata.registry import (
    BookieSet,
    address_from_service_info,
    all_known_bookies,
    read_bookies,
    register_bookie,
    resolve_bookie,
    service_info_bytes,
    unregister_bookie,
    watch_bookies,
)
from auditor.store import MetadataStore
from auditor.testing.cluster import ClusterWriter
from auditor.zk import ZkClient

ROOT = "/ledgers"


def other_session(request: pytest.FixtureRequest, store: MetadataStore) -> MetadataStore:
    """Another session (another process's) on the store `store` talks to, rooted where it is:
    the test's ZooKeeper chroot, or its etcd key prefix."""
    if isinstance(store, EtcdStore):
        return EtcdStore([request.getfixturevalue("etcd_server").endpoint], prefix=store.prefix)
    return ZkClient(request.getfixturevalue("zk_hosts"))


async def test_init_cluster_lays_out_what_bookkeeper_creates(store: MetadataStore) -> None:
    instance = await ClusterWriter(store).init_cluster(
        instance_id="7d3b5ad6-0000-4000-8000-000000000001"
    )
    assert instance == "7d3b5ad6-0000-4000-8000-000000000001"
    assert sorted(await store.get_children(ROOT)) == [
        "INSTANCEID",
        "LAYOUT",
        "available",
        "cookies",
        "idgen",
        "underreplication",
    ]
    assert (await store.get(f"{ROOT}/LAYOUT"))[0] == (
        b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    )
    assert (await store.get(f"{ROOT}/INSTANCEID"))[0] == instance.encode()
    assert await store.get_children(f"{ROOT}/available") == ["readonly"]
    assert (await store.get(f"{ROOT}/underreplication/LAYOUT"))[0] == b'type: "BASIC"\nversion: 1\n'
    # Idempotent.
    await ClusterWriter(store).init_cluster()


def test_service_info_bytes_match_the_spec_example() -> None:
    # Spec §3 example without the property: endpoint bookie/3181/10.0.0.1/bookie-rpc.
    data = service_info_bytes("10.0.0.1", 3181)
    assert data.hex() == "32210a06626f6f6b696510ed181a0831302e302e302e31220a626f6f6b69652d727063"
    assert address_from_service_info(data) == ("10.0.0.1", 3181)
    assert address_from_service_info(b"") is None
    assert address_from_service_info(b"\xff\xff\xff") is None


async def test_register_readonly_unregister_and_resolve(store: MetadataStore) -> None:
    await ClusterWriter(store).init_cluster()
    await register_bookie(store, ROOT, "bk1.example:3181", "127.0.0.1", 40001)
    await register_bookie(store, ROOT, "bookie-uuid-2", "127.0.0.2", 40002)
    assert await read_bookies(store, ROOT) == BookieSet(
        frozenset({"bk1.example:3181", "bookie-uuid-2"}), frozenset()
    )
    # Registration data wins over the id's own host:port.
    assert await resolve_bookie(store, ROOT, "bk1.example:3181") == ("127.0.0.1", 40001)
    assert await resolve_bookie(store, ROOT, "bookie-uuid-2") == ("127.0.0.2", 40002)
    await register_bookie(store, ROOT, "bookie-uuid-2", "127.0.0.2", 40002, readonly=True)
    bs = await read_bookies(store, ROOT)
    assert bs.writable == {"bk1.example:3181"} and bs.readonly == {"bookie-uuid-2"}
    assert bs.available == {"bk1.example:3181", "bookie-uuid-2"}
    assert await resolve_bookie(store, ROOT, "bookie-uuid-2") == ("127.0.0.2", 40002)
    await unregister_bookie(store, ROOT, "bookie-uuid-2")
    await unregister_bookie(store, ROOT, "bk1.example:3181")
    assert await read_bookies(store, ROOT) == BookieSet(frozenset(), frozenset())
    # Gone, but cookies remember them; an unregistered id falls back to host:port.
    assert await all_known_bookies(store, ROOT) == {"bk1.example:3181", "bookie-uuid-2"}
    assert await resolve_bookie(store, ROOT, "bk1.example:3181") == ("bk1.example", 3181)
    assert await resolve_bookie(store, ROOT, "bookie-uuid-2") is None
    cookie, _ = await store.get(f"{ROOT}/cookies/bk1.example:3181")
    assert cookie.startswith(b'5\nbookieHost: "bk1.example:3181"\n')


async def test_legacy_registration_without_data_resolves_from_the_id(store: MetadataStore) -> None:
    await ClusterWriter(store).init_cluster()
    await store.create(f"{ROOT}/available/10.1.1.1:3181", b"", ephemeral=True)
    assert await resolve_bookie(store, ROOT, "10.1.1.1:3181") == ("10.1.1.1", 3181)


async def test_bookie_changes_arrive_as_a_stream(
    store: MetadataStore, request: pytest.FixtureRequest
) -> None:
    await ClusterWriter(store).init_cluster()
    stream = watch_bookies(store, ROOT)
    assert await anext(stream) == BookieSet(frozenset(), frozenset())
    async with other_session(request, store) as other:  # a bookie with its own session
        nxt = asyncio.ensure_future(anext(stream))
        await register_bookie(other, ROOT, "b1:3181", "127.0.0.1", 3181)
        assert (await asyncio.wait_for(nxt, 10)).writable == {"b1:3181"}
        nxt = asyncio.ensure_future(anext(stream))
        await register_bookie(other, ROOT, "b1:3181", "127.0.0.1", 3181, readonly=True)
        got = await asyncio.wait_for(nxt, 10)
        while got.writable:  # the read-only node appears before the writable one goes
            got = await asyncio.wait_for(anext(stream), 10)
        assert got == BookieSet(frozenset(), frozenset({"b1:3181"}))
        nxt = asyncio.ensure_future(anext(stream))
    # The bookie's session closed: its ephemeral registration vanished.
    assert await asyncio.wait_for(nxt, 10) == BookieSet(frozenset(), frozenset())
    await stream.aclose()
