"""BookKeeper's own etcd driver's keys, written raw as it writes them, read through the view.

The keys and values are those of `metadata-drivers/etcd` (EtcdRegistrationManager's
initNewCluster, registerBookie and writeCookie, EtcdLedgerManager's createLedgerMetadata):
the layout and the instance id, bookies on their lease with empty values, ledgers at
`<scope>/ledgers/<UUID(0, id)>` holding LedgerMetadataSerDe bytes.
"""

from __future__ import annotations

import asyncio

import pytest

from auditor.etcd import EtcdStore
from auditor.metadata.bk_etcd import BookKeeperEtcdView
from auditor.metadata.cluster import read_manager
from auditor.metadata.layout import Layout, LedgerManager, parse_layout
from auditor.metadata.ledger_tree import IdRange
from auditor.metadata.registry import (
    BookieSet,
    all_known_bookies,
    cookie_bytes,
    read_bookies,
    register_bookie,
    resolve_bookie,
    watch_bookies,
)
from auditor.metadata.serde import encode_ledger_metadata
from auditor.metadata.walk import LedgerWalker
from auditor.store import Event, EventType, FencedOutError
from auditor.testing.cluster import ClusterWriter, make_metadata

SCOPE = "/ledgers"
INSTANCE = "6a9b1f6e-3f11-4c52-9a0b-0d2f3c4e5a61"
LAYOUT = b"2\norg.apache.bookkeeper.metadata.etcd.EtcdLedgerManagerFactory:0"
ENSEMBLE = ["b1:3181", "b2:3181", "b3:3181"]
LEDGERS = {
    0: "/ledgers/ledgers/00000000-0000-0000-0000-000000000000",
    10: "/ledgers/ledgers/00000000-0000-0000-0000-00000000000a",
    255: "/ledgers/ledgers/00000000-0000-0000-0000-0000000000ff",
    2**32 + 1: "/ledgers/ledgers/00000000-0000-0000-0000-000100000001",
    2**48: "/ledgers/ledgers/00000000-0000-0000-0001-000000000000",
    2**63 - 1: "/ledgers/ledgers/00000000-0000-0000-7fff-ffffffffffff",
}
BAD = [
    "/ledgers/ledgers/00000000-0000-0000-0000-00000000000B",  # upper case hex
    "/ledgers/ledgers/not-a-uuid",
]


def metadata(ledger_id: int) -> bytes:
    md = make_metadata(ledger_id, ENSEMBLE, write_quorum=2, ctime=1_700_000_000_000, ctoken=7)
    return encode_ledger_metadata(md)


async def write_as_bookkeeper(etcd: EtcdStore) -> None:
    """The keys BookKeeper's etcd driver writes (initNewCluster, then bookies and ledgers)."""
    for key, value in [
        (SCOPE, b""),
        (f"{SCOPE}/layout", LAYOUT),
        (f"{SCOPE}/instanceid", INSTANCE.encode()),
        (f"{SCOPE}/cookies", b""),
        (f"{SCOPE}/bookies", b""),
        (f"{SCOPE}/bookies/writable", b""),
        (f"{SCOPE}/bookies/readonly", b""),
        (f"{SCOPE}/ledgers", b""),
        (f"{SCOPE}/buckets", b""),
        (f"{SCOPE}/underreplication", b""),
    ]:
        await etcd.create(key, value)
    for bookie in ENSEMBLE:
        await etcd.create(f"{SCOPE}/cookies/{bookie}", cookie_bytes(bookie, INSTANCE))
    # registerBookie: an empty value on the bookie's lease; read-only: the readonly key.
    await etcd.create(f"{SCOPE}/bookies/writable/b1:3181", b"", ephemeral=True)
    await etcd.create(f"{SCOPE}/bookies/writable/b2:3181", b"", ephemeral=True)
    await etcd.create(f"{SCOPE}/bookies/readonly/b3:3181", b"", ephemeral=True)
    for ledger_id, key in reversed(LEDGERS.items()):
        await etcd.create(key, metadata(ledger_id))
    for key in BAD:
        await etcd.create(key, b"junk")


async def test_bookkeepers_etcd_keys_read_through_the_view(etcd: EtcdStore) -> None:
    await write_as_bookkeeper(etcd)
    # The raw keys, exactly.
    items, more = await etcd.read_range(SCOPE, SCOPE + "0", limit=100)
    assert not more
    raw = {i.path: i.data for i in items}
    assert raw[f"{SCOPE}/layout"] == LAYOUT
    assert raw[f"{SCOPE}/instanceid"] == INSTANCE.encode()
    assert raw[f"{SCOPE}/bookies/writable/b1:3181"] == b""
    assert raw["/ledgers/ledgers/00000000-0000-0000-0000-00000000000a"] == metadata(10)
    assert [p for p in raw if p.startswith("/ledgers/bookies/")] == [
        "/ledgers/bookies/readonly",
        "/ledgers/bookies/readonly/b3:3181",
        "/ledgers/bookies/writable",
        "/ledgers/bookies/writable/b1:3181",
        "/ledgers/bookies/writable/b2:3181",
    ]

    view = BookKeeperEtcdView(etcd, SCOPE)
    # The layout, as LAYOUT.
    assert await read_manager(view, SCOPE) is LedgerManager.ETCD
    data, _ = await view.get(f"{SCOPE}/LAYOUT")
    assert parse_layout(data) == Layout(LedgerManager.ETCD, 0, 2)
    assert (await view.get(f"{SCOPE}/INSTANCEID"))[0] == INSTANCE.encode()
    assert set(await view.get_children(SCOPE)) >= {"LAYOUT", "INSTANCEID", "available", "ledgers"}

    # The bookies, as the registry reads them.
    assert await read_bookies(view, SCOPE) == BookieSet(
        frozenset({"b1:3181", "b2:3181"}), frozenset({"b3:3181"})
    )
    assert await all_known_bookies(view, SCOPE) == frozenset(ENSEMBLE)
    # An empty registration: the address is the id's.
    assert await resolve_bookie(view, SCOPE, "b3:3181") == ("b3", 3181)
    stat = await view.exists(f"{SCOPE}/available/b1:3181")
    assert stat is not None and stat.ephemeralOwner == etcd.session

    # The ledgers, walked in id order by range reads; the bad keys named.
    walker = LedgerWalker(view, SCOPE, LedgerManager.ETCD)
    records = [r async for r in walker.ledgers(concurrency=4)]
    assert [(r.ledger_id, r.path) for r in records] == sorted(LEDGERS.items())
    for r in records:
        assert r.metadata == make_metadata(
            r.ledger_id, ENSEMBLE, write_quorum=2, ctime=1_700_000_000_000, ctoken=7
        )
    assert {u.path for u in walker.stats.unexpected} == set(BAD)
    assert all(u.invalid_ledger for u in walker.stats.unexpected)
    assert "UUID(0, id)" in walker.stats.unexpected[0].reason
    assert await walker.max_ledger_id() == 2**63 - 1
    rec = await walker.read(10)
    assert rec is not None and rec.path == LEDGERS[10] and rec.metadata is not None

    # An id range: its ledgers, and the bad keys its key range holds.
    part = LedgerWalker(view, SCOPE, LedgerManager.ETCD, IdRange(1, 2**48))
    assert [r.ledger_id async for r in part.ledgers()] == [10, 255, 2**32 + 1]
    assert part.stats.foreign_znodes == [BAD[0]]  # between ledger 10's key and 11's
    assert await part.max_ledger_id() == 2**48 - 1
    first = LedgerWalker(view, SCOPE, LedgerManager.ETCD, IdRange(0, 1))
    assert [r.ledger_id async for r in first.ledgers()] == [0]
    assert first.stats.unexpected == []
    last = LedgerWalker(view, SCOPE, LedgerManager.ETCD, IdRange(2**48, 2**63))
    assert [r.ledger_id async for r in last.ledgers()] == [2**48, 2**63 - 1]
    assert last.stats.foreign_znodes == [BAD[1]]


async def test_the_views_watches_name_zookeepers_paths(etcd: EtcdStore) -> None:
    await write_as_bookkeeper(etcd)
    view = BookKeeperEtcdView(etcd, SCOPE)
    sets = watch_bookies(view, SCOPE)
    try:
        first = await asyncio.wait_for(anext(sets), 10)
        assert first.readonly == {"b3:3181"}
        events = await view.watch_tree(f"{SCOPE}/available")
        try:
            # b2 goes read-only as BookKeeper's driver does it: the readonly key, then the
            # writable one deleted.
            await etcd.create(f"{SCOPE}/bookies/readonly/b2:3181", b"", ephemeral=True)
            await etcd.delete(f"{SCOPE}/bookies/writable/b2:3181")
            seen = [await asyncio.wait_for(events.get(), 10) for _ in range(2)]
            assert seen == [
                Event(EventType.CREATED, f"{SCOPE}/available/readonly/b2:3181"),
                Event(EventType.DELETED, f"{SCOPE}/available/b2:3181"),
            ]
        finally:
            await view.unwatch_tree(f"{SCOPE}/available")
        while True:
            now = await asyncio.wait_for(anext(sets), 10)
            if now.writable == {"b1:3181"}:
                break
        assert now.readonly == {"b2:3181", "b3:3181"}
    finally:
        await sets.aclose()


async def test_the_cluster_writer_writes_bookkeepers_etcd_keys(etcd: EtcdStore) -> None:
    view = BookKeeperEtcdView(etcd, SCOPE)
    w = ClusterWriter(view, SCOPE, LedgerManager.ETCD)
    await w.init_cluster(instance_id=INSTANCE)
    await w.add_cookie("b1:3181")
    await register_bookie(view, SCOPE, "b1:3181", "b1", 3181)
    await register_bookie(view, SCOPE, "b2:3181", "b2", 3181, readonly=True)
    assert await w.write_ledger(make_metadata(10, ENSEMBLE)) == LEDGERS[10]
    await w.write_ledgers([make_metadata(i, ENSEMBLE) for i in (0, 255)])

    items, _ = await etcd.read_range(SCOPE, SCOPE + "0", limit=100)
    raw = {i.path: i.data for i in items}
    assert raw[f"{SCOPE}/layout"] == LAYOUT
    assert raw[f"{SCOPE}/instanceid"] == INSTANCE.encode()
    assert sorted(p for p in raw if "/ledgers/ledgers/" in p) == [
        LEDGERS[0],
        LEDGERS[10],
        LEDGERS[255],
    ]
    assert f"{SCOPE}/bookies/writable/b1:3181" in raw
    assert f"{SCOPE}/bookies/readonly/b2:3181" in raw
    assert f"{SCOPE}/cookies/b1:3181" in raw
    for name in ("LAYOUT", "INSTANCEID", "available", "idgen"):
        assert f"{SCOPE}/{name}" not in raw
    assert not any(p.startswith(f"{SCOPE}/underreplication/") for p in raw)

    walker = LedgerWalker(view, SCOPE, LedgerManager.ETCD)
    assert [i async for i in walker.ledger_ids()] == [0, 10, 255]
    assert walker.stats.unexpected == []


async def test_the_views_calls_name_zookeepers_paths(etcd: EtcdStore) -> None:
    await write_as_bookkeeper(etcd)
    view = BookKeeperEtcdView(etcd, SCOPE)
    assert view.ranged and view.kind is etcd.kind and view.session == etcd.session
    created = await view.create(f"{SCOPE}/available/b9:3181", b"", ephemeral=True)
    assert created == f"{SCOPE}/available/b9:3181"
    assert (await etcd.get(f"{SCOPE}/bookies/writable/b9:3181"))[0] == b""
    got = await view.get_many([f"{SCOPE}/LAYOUT", f"{SCOPE}/INSTANCEID", f"{SCOPE}/nothing"])
    assert [g[0] if g else None for g in got] == [LAYOUT, INSTANCE.encode(), None]
    assert sorted(await view.get_children(f"{SCOPE}/available")) == [
        "b1:3181",
        "b2:3181",
        "b9:3181",
        "readonly",
    ]
    assert await view.get_children(f"{SCOPE}/available/readonly") == ["b3:3181"]
    # A fenced write: only while the fencing node is at its version.
    fence = f"{SCOPE}/available/b9:3181"
    fenced = view.fenced(fence, 0)
    await fenced.set(f"{SCOPE}/INSTANCEID", b"changed")
    assert (await etcd.get(f"{SCOPE}/instanceid"))[0] == b"changed"
    await view.delete(fence)
    assert await etcd.exists(f"{SCOPE}/bookies/writable/b9:3181") is None
    with pytest.raises(FencedOutError):
        await fenced.set(f"{SCOPE}/INSTANCEID", b"again")
    items, _ = await view.read_range(f"{SCOPE}/bookies/", f"{SCOPE}/bookies0", limit=10)
    assert [i.path for i in items] == [
        f"{SCOPE}/available/readonly",
        f"{SCOPE}/available/readonly/b3:3181",
        f"{SCOPE}/available",
        f"{SCOPE}/available/b1:3181",
        f"{SCOPE}/available/b2:3181",
    ]
