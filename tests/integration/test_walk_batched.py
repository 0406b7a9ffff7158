"""The walk reads in batches (one `get_many` per batch) and yields what it yielded when it
read ledger by ledger: the same records, in id order, with the same stats.

The reference is built here from `ledger_paths()` and one `read()` per ledger
(a single getData each), against the same real ZooKeeper.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from auditor.metadata.layout import LedgerManager
from auditor.metadata.paths import LONG_MAX, InvalidLedgerIdError
from auditor.metadata.walk import BATCH_MAX, LedgerRecord, LedgerWalker, batch_shape
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.zk import ZkClient, ZkStat

ENSEMBLE = ["192.0.2.1:3181", "192.0.2.2:3181", "192.0.2.3:3181"]
CORRUPT = b"BookieMetadataFormatVersion\t3\n\xff\xff\xff"


class CountingZk(ZkClient):
    """A real client that counts the reads asked of it."""

    gets = 0
    batches: list[int]

    async def get(self, path: str) -> tuple[bytes, ZkStat]:
        self.gets += 1
        return await super().get(path)

    async def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, ZkStat] | None]:
        self.batches.append(len(paths))
        return await super().get_many(paths)


def _key(rec: LedgerRecord) -> tuple[object, ...]:
    """A record as comparable values (the error is an exception instance)."""
    error = None if rec.error is None else (type(rec.error), str(rec.error))
    return (rec.ledger_id, rec.path, rec.metadata, rec.znode_version, error)


async def _reference(zk: ZkClient, manager: LedgerManager) -> tuple[list[tuple[object, ...]], int]:
    """Records as one read per ledger gives them, and the count of unexpected znodes."""
    walker = LedgerWalker(zk, "/ledgers", manager)
    out = []
    async for ledger_id, path in walker.ledger_paths():
        rec = await walker.read(ledger_id, path)
        assert rec is not None
        out.append(_key(rec))
    return out, walker.stats.unexpected_count


async def _cluster(zk: ZkClient, manager: LedgerManager) -> list[int]:
    """Ledgers in both trees and many buckets, some corrupt, one updated, some stray znodes."""
    w = ClusterWriter(zk, "/ledgers", manager)
    await w.init_cluster()
    small = [] if manager is LedgerManager.LONG_HIERARCHICAL else list(range(0, 1200, 3))
    big = [] if manager is LedgerManager.LEGACY_HIERARCHICAL else [2**31 + i for i in range(250)]
    ids = sorted({*small, *range(9_990, 10_020), *big, LONG_MAX})
    if manager is LedgerManager.LEGACY_HIERARCHICAL:
        ids.remove(LONG_MAX)
    corrupt = set(ids[5::97])
    template = make_metadata(0, ENSEMBLE, write_quorum=2, last_entry_id=9, length=100)
    await w.write_ledgers(replace(template, ledger_id=i) for i in ids if i not in corrupt)
    for i in sorted(corrupt):
        await w.write_raw(i, CORRUPT)
    await zk.set(w.path(ids[1]), (await zk.get(w.path(ids[1])))[0])  # version 1
    await zk.create(w.path(ids[0]).rsplit("/", 1)[0] + "/junk", b"")
    return ids


@pytest.mark.parametrize(
    "manager",
    [
        LedgerManager.HIERARCHICAL,
        LedgerManager.LEGACY_HIERARCHICAL,
        LedgerManager.LONG_HIERARCHICAL,
    ],
)
async def test_batched_walk_yields_what_single_reads_give(
    zk: ZkClient, zk_hosts: str, manager: LedgerManager
) -> None:
    ids = await _cluster(zk, manager)
    expected, unexpected = await _reference(zk, manager)
    assert [k[0] for k in expected] == ids
    corrupt = sum(1 for k in expected if k[4] is not None)
    assert corrupt >= 3 and any(k[3] == 1 for k in expected) and unexpected == 1
    for multi_read in (None, False):
        counting = CountingZk(zk_hosts, timeout=10.0, multi_read=multi_read)
        counting.batches = []
        async with counting:
            for concurrency in (1, 7, 64, 100, 2 * BATCH_MAX + 1, 5000):
                counting.batches.clear()
                walker = LedgerWalker(counting, "/ledgers", manager)
                got = [_key(r) async for r in walker.ledgers(concurrency=concurrency)]
                assert got == expected, (multi_read, concurrency)
                stats = walker.stats
                assert (stats.ledgers, stats.corrupt, stats.deleted_during_walk) == (
                    len(ids),
                    corrupt,
                    0,
                )
                assert stats.unexpected_count == unexpected
                size, _ = batch_shape(concurrency)
                assert max(counting.batches) <= size
                assert sum(counting.batches) == len(ids)
            assert counting.gets == 0
            assert counting.multi_read is (multi_read is None)


def test_batch_shape_keeps_the_reads_in_flight_within_concurrency() -> None:
    assert batch_shape(1) == (1, 1)
    assert batch_shape(0) == (1, 1)
    assert batch_shape(2) == (1, 2)
    assert batch_shape(64) == (32, 2)
    assert batch_shape(100) == (50, 2)
    assert batch_shape(1000) == (BATCH_MAX, 4)
    for c in range(1, 3000):
        size, depth = batch_shape(c)
        assert 1 <= size <= BATCH_MAX and depth >= 1
        assert size * depth <= c
        assert c < 2 or depth >= 2  # one batch is read while another is yielded
        assert size * depth > c - size  # and the window is about `c`


async def test_deleted_and_changed_during_a_batched_walk(zk: ZkClient) -> None:
    w = ClusterWriter(zk)
    await w.init_cluster()
    template = make_metadata(0, ENSEMBLE)
    await w.write_ledgers(replace(template, ledger_id=i) for i in range(1000))
    walker = LedgerWalker(zk, "/ledgers", LedgerManager.HIERARCHICAL)
    seen: list[tuple[int, int]] = []
    async for rec in walker.ledgers(concurrency=100):
        seen.append((rec.ledger_id, rec.znode_version))
        if rec.ledger_id == 10:
            # Far beyond what is in flight (at most 100 ledgers ahead).
            await zk.delete(w.path(900))
            await zk.delete(w.path(901))
            await zk.set(w.path(800), (await zk.get(w.path(800)))[0])
    assert [i for i, _ in seen] == [i for i in range(1000) if i not in (900, 901)]
    assert dict(seen)[800] == 1 and dict(seen)[799] == 0
    assert walker.stats.deleted_during_walk == 2
    assert walker.stats.ledgers == 998


async def test_read_many_is_read_for_each(zk: ZkClient) -> None:
    w = ClusterWriter(zk)
    await w.init_cluster()
    for i in (1, 2, 5, 3_000_000_000):
        await w.write_ledger(make_metadata(i, ENSEMBLE))
    await w.write_raw(4, CORRUPT)
    walker = LedgerWalker(zk, "/ledgers", LedgerManager.HIERARCHICAL)
    asked: list[int | tuple[int, str]] = [5, 3, (4, w.path(4)), 1, 3_000_000_000, 2, 1]
    got = await walker.read_many(asked)
    singles = []
    for item in asked:
        ledger_id, path = item if isinstance(item, tuple) else (item, None)
        singles.append(await walker.read(ledger_id, path))
    assert [None if r is None else _key(r) for r in got] == [
        None if r is None else _key(r) for r in singles
    ]
    assert got[1] is None and got[2] is not None and got[2].error is not None
    assert got[4] is not None and got[4].path == "/ledgers/000/0000/0030/0000/L0000"
    assert await walker.read_many([]) == []
    for bad in (-1, 2**63):
        with pytest.raises(InvalidLedgerIdError):
            await walker.read_many([1, bad])
