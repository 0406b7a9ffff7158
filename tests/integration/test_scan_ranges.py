"""Planning a scan's id ranges from listings, and walking one range, on a real ZooKeeper."""

from __future__ import annotations

import itertools

import pytest

from auditor.etcd import EtcdStore
from auditor.metadata.bk_etcd import BookKeeperEtcdView
from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_tree import IdRange
from auditor.metadata.paths import LONG_MAX
from auditor.metadata.walk import LedgerWalker
from auditor.scan.ranges import buckets, plan_ranges
from auditor.store import MetadataStore
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.zk import ZkClient

ENSEMBLE = ["192.0.2.1:3181", "192.0.2.2:3181", "192.0.2.3:3181"]
#: Ids on both sides of every level boundary of both hierarchical trees.
EDGE_IDS = [0, 1, 9999, 10000, 123456789, 2147483646, 2147483647, 2147483648, 2**40 + 7, LONG_MAX]


async def _write(store: MetadataStore, manager: LedgerManager, ids: list[int]) -> None:
    w = ClusterWriter(store, "/ledgers", manager)
    await w.init_cluster()
    for i in ids:
        await w.write_ledger(make_metadata(i, ENSEMBLE))


async def _walk(store: MetadataStore, manager: LedgerManager, r: IdRange | None) -> list[int]:
    return [i async for i in LedgerWalker(store, "/ledgers", manager, r).ledger_ids()]


@pytest.mark.parametrize(
    ("manager", "ids"),
    [
        (LedgerManager.HIERARCHICAL, EDGE_IDS),
        (LedgerManager.LONG_HIERARCHICAL, EDGE_IDS),
        (LedgerManager.LEGACY_HIERARCHICAL, [0, 1, 9999, 10000, 123456789, 2147483646]),
        (LedgerManager.FLAT, [0, 5, 123, 9999999999]),
    ],
)
@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 50])
async def test_ranges_tile_the_id_space_and_each_ledger_is_walked_once(
    zk: ZkClient, manager: LedgerManager, ids: list[int], partitions: int
) -> None:
    await _write(zk, manager, ids)
    ranges = await plan_ranges(zk, "/ledgers", manager, partitions)
    assert ranges[0].lo == 0 and ranges[-1].hi == LONG_MAX + 1
    assert all(a.hi == b.lo for a, b in itertools.pairwise(ranges))
    assert len(ranges) == min(partitions, len(ids))
    walked = [i for r in ranges for i in await _walk(zk, manager, r)]
    assert walked == ids


async def test_a_range_lists_only_the_subtrees_it_overlaps(zk: ZkClient) -> None:
    ids = [5, 20_005, 30_005, 3_000_000_000]
    await _write(zk, LedgerManager.HIERARCHICAL, ids)
    assert await _walk(zk, LedgerManager.HIERARCHICAL, IdRange(20_000, 30_006)) == [20_005, 30_005]
    assert await _walk(zk, LedgerManager.HIERARCHICAL, IdRange(30_006, LONG_MAX + 1)) == [
        3_000_000_000
    ]
    assert await _walk(zk, LedgerManager.HIERARCHICAL, IdRange(6, 20_005)) == []


async def test_many_ledgers_split_evenly_on_exact_ids(zk: ZkClient) -> None:
    ids = list(range(0, 3000, 3))
    await _write(zk, LedgerManager.HIERARCHICAL, ids)
    ranges = await plan_ranges(zk, "/ledgers", LedgerManager.HIERARCHICAL, 4)
    sizes = [len(await _walk(zk, LedgerManager.HIERARCHICAL, r)) for r in ranges]
    assert sizes == [250, 250, 250, 250]


async def test_plans_on_leaf_directories_when_there_are_enough(zk: ZkClient) -> None:
    # Ten leaf directories (10,000 ids each), one ledger in each: with 2
    # partitions the plan stops at the directories and lists no leaf.
    ids = [k * 10_000 + 7 for k in range(10)]
    await _write(zk, LedgerManager.HIERARCHICAL, ids)
    found = await buckets(zk, "/ledgers", LedgerManager.HIERARCHICAL, 2)
    assert [(b.lo, b.hi) for b in found] == [(k * 10_000, (k + 1) * 10_000) for k in range(10)]
    ranges = await plan_ranges(zk, "/ledgers", LedgerManager.HIERARCHICAL, 2)
    assert ranges == [IdRange(0, 50_000), IdRange(50_000, LONG_MAX + 1)]


async def test_an_empty_cluster_is_one_range(zk: ZkClient) -> None:
    await _write(zk, LedgerManager.HIERARCHICAL, [])
    assert await plan_ranges(zk, "/ledgers", LedgerManager.HIERARCHICAL, 8) == [
        IdRange(0, LONG_MAX + 1)
    ]


@pytest.mark.parametrize("partitions", [1, 2, 3, 50])
async def test_znodes_beyond_the_id_space_are_left_out_of_the_plan_and_named_once(
    zk: ZkClient, partitions: int
) -> None:
    ids = [1, 20_005, LONG_MAX]
    await _write(zk, LedgerManager.HIERARCHICAL, ids)
    beyond = ["/ledgers/922/3372/0368/5477/L5808", "/ledgers/999/9999/9999/9999/L9999"]
    for path in beyond:
        await zk.create(path, b"not even metadata", makepath=True)
    found = await buckets(zk, "/ledgers", LedgerManager.HIERARCHICAL, partitions)
    assert all(b.lo <= LONG_MAX for b in found)
    ranges = await plan_ranges(zk, "/ledgers", LedgerManager.HIERARCHICAL, partitions)
    assert ranges[0].lo == 0 and ranges[-1].hi == LONG_MAX + 1
    assert all(a.lo < a.hi == b.lo for a, b in itertools.pairwise(ranges))
    assert len(ranges) == min(partitions, len(ids))
    walked: list[int] = []
    named: list[str] = []
    for r in ranges:
        walker = LedgerWalker(zk, "/ledgers", LedgerManager.HIERARCHICAL, r)
        walked += [i async for i in walker.ledger_ids()]
        named += [u.path for u in walker.stats.unexpected if u.invalid_ledger]
    assert walked == ids
    assert named == beyond


@pytest.mark.parametrize(
    ("manager", "ids"),
    [
        (LedgerManager.HIERARCHICAL, EDGE_IDS),
        (LedgerManager.ETCD, [0, 1, 9999, 10000, 123456789, 2**40 + 7]),
        (LedgerManager.FLAT, [0, 5, 123, 9999999999]),
    ],
)
@pytest.mark.parametrize("partitions", [1, 3, 50])
async def test_on_etcd_the_plan_splits_up_to_the_largest_id_evenly(
    etcd: EtcdStore, manager: LedgerManager, ids: list[int], partitions: int
) -> None:
    """No listing on etcd (a listing reads every key below): the largest id, split evenly."""
    store: MetadataStore = etcd
    if manager is LedgerManager.ETCD:
        store = BookKeeperEtcdView(etcd, "/ledgers")
    await _write(store, manager, ids)
    ranges = await plan_ranges(store, "/ledgers", manager, partitions)
    assert ranges[0].lo == 0 and ranges[-1].hi == LONG_MAX + 1
    assert all(a.hi == b.lo for a, b in itertools.pairwise(ranges))
    largest = max(ids)
    assert len(ranges) == partitions
    assert [r.lo for r in ranges] == [((largest + 1) * i) // partitions for i in range(partitions)]
    walked = [i for r in ranges for i in await _walk(store, manager, r)]
    assert walked == ids
    empty = BookKeeperEtcdView(etcd, "/other") if manager is LedgerManager.ETCD else etcd
    await ClusterWriter(empty, "/other", manager).init_cluster()
    assert await plan_ranges(empty, "/other", manager, partitions) == [IdRange(0, LONG_MAX + 1)]
