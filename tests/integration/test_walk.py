"""The streaming ledger walk against a real ZooKeeper and a real etcd."""

from __future__ import annotations

import gc
import os
from dataclasses import replace

import pytest

from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_tree import IdRange, UnexpectedZnode
from auditor.metadata.model import LedgerState
from auditor.metadata.paths import LONG_MAX, InvalidLedgerIdError
from auditor.metadata.serde import encode_ledger_metadata
from auditor.metadata.walk import LedgerWalker
from auditor.store import MetadataStore, StoreKind
from auditor.testing.cluster import ClusterWriter, make_metadata

ENSEMBLE = ["192.0.2.1:3181", "192.0.2.2:3181", "192.0.2.3:3181"]
EDGE_IDS = [0, 1, 9999, 10000, 2147483646, 2147483647, 2147483648, 2**40 + 7, 2**63 - 1]


@pytest.mark.parametrize("manager", [LedgerManager.HIERARCHICAL, LedgerManager.LONG_HIERARCHICAL])
async def test_walk_is_in_id_order_across_both_trees(
    store: MetadataStore, manager: LedgerManager
) -> None:
    w = ClusterWriter(store, "/ledgers", manager)
    await w.init_cluster()
    for i in reversed(EDGE_IDS):
        await w.write_ledger(make_metadata(i, ENSEMBLE, write_quorum=2, last_entry_id=i % 50))
    walker = LedgerWalker(store, "/ledgers", manager)
    records = [r async for r in walker.ledgers(concurrency=4)]
    assert [r.ledger_id for r in records] == EDGE_IDS
    assert all(r.metadata is not None and r.metadata.ledger_id == r.ledger_id for r in records)
    assert walker.stats.ledgers == len(EDGE_IDS)
    # Special znodes (LAYOUT, INSTANCEID, available, cookies, underreplication, idgen)
    # are not ledgers and not reported as foreign either.
    assert walker.stats.foreign_znodes == []
    assert await walker.max_ledger_id() == EDGE_IDS[-1]


@pytest.mark.parametrize(
    ("manager", "ids"),
    [
        (LedgerManager.FLAT, [0, 5, 123, 9999999999]),
        (LedgerManager.LEGACY_HIERARCHICAL, [3, 20000, 2147483646]),
    ],
)
async def test_walk_other_managers(
    store: MetadataStore, manager: LedgerManager, ids: list[int]
) -> None:
    w = ClusterWriter(store, "/ledgers", manager)
    await w.init_cluster()
    for i in ids:
        await w.write_ledger(make_metadata(i, ENSEMBLE))
    walker = LedgerWalker(store, "/ledgers", manager)
    assert [i async for i in walker.ledger_ids()] == ids
    assert await walker.max_ledger_id() == ids[-1]


async def test_corrupt_ledger_is_reported_and_the_walk_goes_on(store: MetadataStore) -> None:
    w = ClusterWriter(store)
    await w.init_cluster()
    await w.write_ledger(make_metadata(1, ENSEMBLE))
    bad_path = await w.write_raw(2, b"BookieMetadataFormatVersion\t3\n\xff\xff\xff")
    await w.write_ledger(make_metadata(3, ENSEMBLE))
    walker = LedgerWalker(store, "/ledgers", LedgerManager.HIERARCHICAL)
    records = [r async for r in walker.ledgers()]
    assert [r.ledger_id for r in records] == [1, 2, 3]
    bad = records[1]
    assert bad.metadata is None and bad.error is not None
    assert bad.path == bad_path == "/ledgers/00/0000/L0002"
    assert "2" in str(bad.error)
    assert walker.stats.corrupt == 1


async def test_ledger_deleted_mid_walk_is_counted_not_fatal(store: MetadataStore) -> None:
    w = ClusterWriter(store)
    await w.init_cluster()
    for i in range(10):
        await w.write_ledger(make_metadata(i, ENSEMBLE))
    walker = LedgerWalker(store, "/ledgers", LedgerManager.HIERARCHICAL)
    seen = []
    async for rec in walker.ledgers(concurrency=1):
        seen.append(rec.ledger_id)
        if rec.ledger_id == 3:
            await store.delete(w.path(7))
    assert seen == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    if store.kind is StoreKind.ZOOKEEPER:
        # 7 was listed with its bucket before it was deleted; its read found no node.
        assert walker.stats.deleted_during_walk == 1
    else:
        # etcd: the walk reads keys with their data in one range read (`RangedWalk`, no
        # listing), so a ledger deleted before its page is read is never seen at all, as
        # if deleted before the walk began: none is deleted *during* the walk.
        assert walker.stats.deleted_during_walk == 0


async def test_raw_batches_hand_out_what_the_walk_reads_undecoded(store: MetadataStore) -> None:
    """The index's load walks the same ledgers in the same order, bytes instead of records:
    a corrupt one is handed out as it is, a deleted one counted and left out."""
    w = ClusterWriter(store)
    await w.init_cluster()
    for i in range(12):
        await w.write_ledger(make_metadata(i, ENSEMBLE))
    await w.write_raw(12, b"BookieMetadataFormatVersion\t3\n\xff")
    walker = LedgerWalker(store, "/ledgers", LedgerManager.HIERARCHICAL)
    records = [r async for r in walker.ledgers(concurrency=4)]
    raw = LedgerWalker(store, "/ledgers", LedgerManager.HIERARCHICAL)
    batches = [b async for b in raw.raw_batches(concurrency=4)]
    assert [len(b) for b in batches] == [2] * 6 + [1]  # batch_shape(4): 2 a batch
    flat = [item for b in batches for item in b]
    assert [(i, p) for i, p, _, _ in flat] == [(r.ledger_id, r.path) for r in records]
    assert [d for _, _, d, _ in flat] == [(await store.get(r.path))[0] for r in records]
    assert [s.version for _, _, _, s in flat] == [r.znode_version for r in records]
    assert raw.stats.ledgers == 13 and raw.stats.corrupt == 0  # the reader decodes
    deleting = LedgerWalker(store, "/ledgers", LedgerManager.HIERARCHICAL)
    seen = []
    async for batch in deleting.raw_batches(concurrency=1):
        seen += [i for i, _, _, _ in batch]
        if seen[-1] == 3:
            await store.delete(w.path(7))
    assert seen == [0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12]
    expected = 1 if store.kind is StoreKind.ZOOKEEPER else 0  # as in the test above
    assert deleting.stats.deleted_during_walk == expected


async def test_foreign_znodes_are_reported(store: MetadataStore) -> None:
    w = ClusterWriter(store)
    await w.init_cluster()
    await w.write_ledger(make_metadata(1, ENSEMBLE))
    await store.create("/ledgers/00/0000/notaledger", b"")
    await store.create(
        "/ledgers/disableHealthCheck", b""
    )  # top level: skipped silently, as upstream
    walker = LedgerWalker(store, "/ledgers", LedgerManager.HIERARCHICAL)
    assert [i async for i in walker.ledger_ids()] == [1]
    assert walker.stats.foreign_znodes == ["/ledgers/00/0000/notaledger"]


async def test_foreign_znodes_say_why(store: MetadataStore) -> None:
    w = ClusterWriter(store)
    await w.init_cluster()
    await w.write_ledger(make_metadata(1, ENSEMBLE))
    # A valid ledger znode filed under the other tree: BookKeeper would not find it by id.
    data = encode_ledger_metadata(make_metadata(2, ENSEMBLE))
    await store.create("/ledgers/21/4748/L3648", data, makepath=True)
    await store.create("/ledgers/00/abcd", b"", makepath=True)
    walker = LedgerWalker(store, "/ledgers", LedgerManager.HIERARCHICAL)
    assert [i async for i in walker.ledger_ids()] == [1]
    assert walker.stats.unexpected == [
        UnexpectedZnode("/ledgers/00/abcd", "not a ledger znode"),
        UnexpectedZnode(
            "/ledgers/21/4748/L3648",
            "ledger 2147483648 filed under the legacy (2-4-4) tree, not its own",
        ),
    ]
    assert (walker.stats.unexpected_count, walker.stats.invalid_ledgers) == (2, 0)


#: Znodes shaped like ledgers' that no ledger can be, and what the walk says of each.
BEYOND = {
    "/ledgers/922/3372/0368/5477/L5808": f"a ledger id is 0..{LONG_MAX}, got {2**63}",
    "/ledgers/922/3372/0368/5477/L58080": "a ledger's name here is L and 4 digits, not 5",
    "/ledgers/999/9999/9999/9999/L9999": f"a ledger id is 0..{LONG_MAX}, got {10**19 - 1}",
}


@pytest.mark.parametrize("manager", [LedgerManager.HIERARCHICAL, LedgerManager.LONG_HIERARCHICAL])
async def test_ledger_znodes_beyond_the_id_range_are_named_and_the_walk_goes_on(
    store: MetadataStore, manager: LedgerManager
) -> None:
    w = ClusterWriter(store, "/ledgers", manager)
    await w.init_cluster()
    for i in (1, 3, LONG_MAX):
        await w.write_ledger(make_metadata(i, ENSEMBLE))
    # Valid metadata (of ledger 5) at each path: only the path is wrong.
    for path in BEYOND:
        await store.create(path, encode_ledger_metadata(make_metadata(5, ENSEMBLE)), makepath=True)
    walker = LedgerWalker(store, "/ledgers", manager)
    records = [r async for r in walker.ledgers(concurrency=2)]
    assert [r.ledger_id for r in records] == [1, 3, LONG_MAX]
    assert all(r.metadata is not None for r in records)
    assert walker.stats.unexpected == [
        UnexpectedZnode(path, reason, invalid_ledger=True) for path, reason in BEYOND.items()
    ]
    assert (walker.stats.ledgers, walker.stats.corrupt) == (3, 0)
    assert (walker.stats.unexpected_count, walker.stats.invalid_ledgers) == (3, 3)
    assert str(walker.stats.unexpected[0]) == (
        f"/ledgers/922/3372/0368/5477/L5808: a ledger id is 0..{LONG_MAX}, got {2**63}"
    )
    # The largest id for progress estimates passes over them too.
    assert await walker.max_ledger_id() == LONG_MAX
    with pytest.raises(InvalidLedgerIdError):
        await walker.read(2**63, "/ledgers/922/3372/0368/5477/L5808")
    with pytest.raises(InvalidLedgerIdError):
        await walker.read(-1)


async def test_misnamed_ledger_znodes_in_each_layout(store: MetadataStore) -> None:
    flat = ClusterWriter(store, "/flat", LedgerManager.FLAT)
    await flat.init_cluster()
    await flat.write_ledger(make_metadata(7, ENSEMBLE))
    await store.create("/flat/L123", b"")
    walker = LedgerWalker(store, "/flat", LedgerManager.FLAT)
    assert [i async for i in walker.ledger_ids()] == [7]
    assert walker.stats.unexpected == [
        UnexpectedZnode("/flat/L123", "a ledger's name here is L and 10 digits, not 3", True)
    ]
    legacy = ClusterWriter(store, "/legacy", LedgerManager.LEGACY_HIERARCHICAL)
    await legacy.init_cluster()
    await legacy.write_ledger(make_metadata(7, ENSEMBLE))
    await store.create("/legacy/00/0000/L00007", b"")
    walker = LedgerWalker(store, "/legacy", LedgerManager.LEGACY_HIERARCHICAL)
    assert [i async for i in walker.ledger_ids()] == [7]
    assert walker.stats.unexpected == [
        UnexpectedZnode(
            "/legacy/00/0000/L00007", "a ledger's name here is L and 4 digits, not 5", True
        )
    ]


async def test_partitions_name_each_unexpected_znode_once(store: MetadataStore) -> None:
    w = ClusterWriter(store)
    await w.init_cluster()
    for i in (1, 20_000, 2**40, LONG_MAX):
        await w.write_ledger(make_metadata(i, ENSEMBLE))
    for path in BEYOND:
        await store.create(path, b"", makepath=True)
    await store.create("/ledgers/00/0000/L00001", b"")
    await store.create("/ledgers/00/0002/junk", b"")
    ranges = [IdRange(0, 10), IdRange(10, 2**41), IdRange(2**41, LONG_MAX + 1)]
    seen: list[tuple[int, str]] = []
    ids: list[int] = []
    for n, r in enumerate(ranges):
        walker = LedgerWalker(store, "/ledgers", LedgerManager.HIERARCHICAL, r)
        ids += [i async for i in walker.ledger_ids()]
        seen += [(n, u.path) for u in walker.stats.unexpected]
    assert ids == [1, 20_000, 2**40, LONG_MAX]
    assert seen == [
        (0, "/ledgers/00/0000/L00001"),
        (1, "/ledgers/00/0002/junk"),
        *((2, path) for path in BEYOND),
    ]


async def test_znode_ctime_is_the_fallback_creation_time(store: MetadataStore) -> None:
    w = ClusterWriter(store)
    await w.init_cluster()
    path = await w.write_ledger(make_metadata(1, ENSEMBLE))
    await w.write_ledger(make_metadata(2, ENSEMBLE, ctime=123456))
    _, stat = await store.get(path)
    # etcd keeps no times (nor does Pulsar's EtcdMetadataStore): the fallback there is 0.
    assert (int(stat.ctime) > 0) is (store.kind is StoreKind.ZOOKEEPER)
    recs = [r async for r in LedgerWalker(store, "/ledgers", LedgerManager.HIERARCHICAL).ledgers()]
    assert recs[0].metadata is not None and recs[0].metadata.ctime == int(stat.ctime)
    assert not recs[0].metadata.ctime_stored
    assert recs[1].metadata is not None and recs[1].metadata.ctime == 123456


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_walk_over_100k_ledgers_has_flat_memory(store: MetadataStore) -> None:
    """Resident memory after 100k ledgers is what it was after the first 10k.

    Keeping the decoded ledgers (or their ids) would cost tens of MB at this
    size; the walk holds one bucket listing and a bounded read window.
    """
    n = 100_000
    w = ClusterWriter(store)
    await w.init_cluster()
    template = make_metadata(
        0, ENSEMBLE, write_quorum=2, ack_quorum=2, last_entry_id=99, length=4096
    )
    # Ids 0..99,999 fill ten legacy buckets of 10,000 ledgers each.
    assert await w.write_ledgers(replace(template, ledger_id=i) for i in range(n)) == n
    walker = LedgerWalker(store, "/ledgers", LedgerManager.HIERARCHICAL)
    gc.collect()
    count = 0
    last_id = -1
    baseline = 0
    peak = 0
    async for rec in walker.ledgers(concurrency=128):
        assert rec.metadata is not None and rec.metadata.state is LedgerState.CLOSED
        assert rec.ledger_id == last_id + 1
        last_id = rec.ledger_id
        count += 1
        if count % 10_000 == 0:
            rss = _rss_bytes()
            baseline = baseline or rss
            peak = max(peak, rss)
    assert count == n and walker.stats.ledgers == n
    assert peak - baseline < 12_000_000, (baseline, peak)
