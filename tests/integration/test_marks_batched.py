"""Listing a hundred thousand marks (issue #30 item 6): directories listed in batches, data
read in batches, and nothing read that a count does not need, on ZooKeeper and etcd.

The listing must still yield what one request at a time yields, item for item and in the
same order (breadth-first, sorted, as BookKeeper lists marks): `_serial` below is that
listing, written as the manager wrote it before, and the reference of the first test.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

from auditor.metadata.records import RecordFormatError, decode_underreplicated_ledger
from auditor.metadata.underreplication import (
    LIST_BATCH,
    READ_BATCH,
    CorruptMark,
    UnderreplicatedLedger,
    UnderreplicationManager,
    encode_mark,
    mark_problem,
    ur_ledger_path,
)
from auditor.store import MetadataStore, NoNodeError, Stat
from auditor.testing.cli import bk as cli
from auditor.testing.cluster import ClusterWriter
from auditor.zk import ZkClient

ROOT = "/ledgers"
BASE = f"{ROOT}/underreplication"
#: More marks than one listing batch and one read batch hold, in several hex directories.
IDS = [1 + i * 40_009 for i in range(2 * max(LIST_BATCH, READ_BATCH) + 17)]
LEAVES = f"{BASE}/ledgers/0000/0000/0000"


class Counting:
    """The real store, with the reads asked of it counted (and, if `before_reads` is set,
    something done to the store before the first batch of data reads)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.gets = 0
        self.read_batches: list[int] = []
        self.listings = 0
        self.listing_batches: list[int] = []
        self.before_reads: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def get(self, path: str) -> tuple[bytes, Stat]:
        self.gets += 1
        return await self.store.get(path)

    async def get_many(self, paths: Sequence[str]) -> Sequence[tuple[bytes, Stat] | None]:
        if self.before_reads is not None:
            action, self.before_reads = self.before_reads, None
            await action()
        self.read_batches.append(len(paths))
        return await self.store.get_many(paths)

    async def get_children(self, path: str) -> list[str]:
        self.listings += 1
        return await self.store.get_children(path)

    async def get_children_many(self, paths: Sequence[str]) -> Sequence[list[str] | None]:
        self.listing_batches.append(len(paths))
        return await self.store.get_children_many(paths)


async def run_cli(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BK_AUDITOR_")}
    return await cli(*args, within=60, env=env)


def counting(store: MetadataStore) -> tuple[Counting, UnderreplicationManager]:
    wrapper = Counting(store)
    return wrapper, UnderreplicationManager(cast(MetadataStore, wrapper), ROOT)


async def _serial(store: MetadataStore) -> list[UnderreplicatedLedger | CorruptMark]:
    """The listing one request at a time: breadth-first, sorted children, a mark's data
    read as it is listed (the manager's listing before batching)."""
    top = f"{BASE}/ledgers"
    queue: deque[tuple[str, int]] = deque([(top, 0)])
    out: list[UnderreplicatedLedger | CorruptMark] = []
    while queue:
        path, depth = queue.popleft()
        try:
            children = sorted(await store.get_children(path))
        except NoNodeError:
            continue
        name = path.rsplit("/", 1)[1]
        hex_dir = 1 <= depth <= 4 and len(name) == 4 and all(c in "0123456789abcdef" for c in name)
        if not children and path != top and not hex_dir:
            out.append(
                CorruptMark(
                    path, None, "neither an under-replication mark nor a directory of marks"
                )
            )
        for child in children:
            child_path = f"{path}/{child}"
            if not child.startswith("urL"):
                queue.append((child_path, depth + 1))
                continue
            ledger_id, problem = mark_problem(BASE, child_path, child)
            if problem is not None or ledger_id is None:
                out.append(CorruptMark(child_path, ledger_id, problem or "not a mark"))
                continue
            data, stat = await store.get(child_path)
            try:
                rec = decode_underreplicated_ledger(data)
            except RecordFormatError as exc:
                out.append(CorruptMark(child_path, ledger_id, f"does not decode: {exc.reason}"))
                continue
            out.append(
                UnderreplicatedLedger(
                    ledger_id, rec.replicas, rec.ctime_or_unassigned, int(stat.version)
                )
            )
    return out


async def _tree(store: MetadataStore) -> None:
    """IDS marked (in many leaf and two upper hex directories), one mark whose data does not
    decode, one named as no mark is, one out of place, an empty stray directory and a stray
    znode among the leaves."""
    urm = UnderreplicationManager(store, ROOT)
    await urm.check_layout()
    slots = asyncio.Semaphore(32)

    async def create(path: str, data: bytes) -> None:
        async with slots:
            await store.create(path, data, makepath=True)

    await asyncio.gather(
        *(create(ur_ledger_path(BASE, i), encode_mark([f"bk{i % 5}:3181"], 1000 + i)) for i in IDS)
    )
    for path, data in {
        ur_ledger_path(BASE, 2): b"this is not { a mark",
        f"{LEAVES}/0003/urLthree": b"",
        f"{BASE}/ledgers/urL0000000004": b"",
        f"{LEAVES}/0005/stray": b"",
        f"{BASE}/ledgers/0000/not-hex": b"",
    }.items():
        await store.create(path, data, makepath=True)


async def test_batched_listing_yields_the_serial_listings_items_in_its_order(
    store: MetadataStore,
) -> None:
    await _tree(store)
    expected = await _serial(store)
    assert len(expected) == len(IDS) + 5
    wrapper, urm = counting(store)
    assert [item async for item in urm.list_marks()] == expected
    # Batches, not a request a directory or a mark.
    assert (wrapper.gets, wrapper.listings) == (0, 0)
    assert sum(wrapper.read_batches) == len(IDS) + 1  # the corrupt-data mark is read too
    assert max(wrapper.read_batches) <= READ_BATCH
    assert len(wrapper.read_batches) <= len(IDS) // READ_BATCH + 2
    assert max(wrapper.listing_batches) == LIST_BATCH
    listing = await urm.read_marks()
    assert listing.marks == [m for m in expected if isinstance(m, UnderreplicatedLedger)]
    assert listing.corrupt == [m for m in expected if isinstance(m, CorruptMark)]


async def test_counting_and_the_marked_ids_read_no_data(store: MetadataStore) -> None:
    await _tree(store)
    wrapper, urm = counting(store)
    # Every ledger a name spells: the corrupt-data mark's (2), the misplaced one's (4).
    assert await urm.count_underreplicated() == len(IDS) + 2
    assert await urm.marked_ids() == {*IDS, 2, 4}
    names = [item async for item in urm.list_mark_names()]
    assert [n for n in names if isinstance(n, int)] == [1, 2, *IDS[1:]]
    assert [c.path for c in names if isinstance(c, CorruptMark)] == [
        f"{BASE}/ledgers/urL0000000004",
        f"{BASE}/ledgers/0000/not-hex",
        f"{LEAVES}/0003/urLthree",
        f"{LEAVES}/0005/stray",
    ]
    assert (wrapper.gets, wrapper.read_batches, wrapper.listings) == (0, [], 0)


async def test_a_mark_removed_while_listing_is_passed_over(store: MetadataStore) -> None:
    await _tree(store)
    expected = await _serial(store)
    gone = ur_ledger_path(BASE, IDS[3])

    async def remove() -> None:
        await store.delete(gone)

    wrapper, urm = counting(store)
    wrapper.before_reads = remove
    got = [item async for item in urm.list_marks()]
    assert got == [m for m in expected if getattr(m, "ledger_id", None) != IDS[3]]
    assert len(got) == len(expected) - 1


async def test_count_only_lists_and_does_not_read(zk: ZkClient) -> None:
    """`list-underreplicated --count-only` without a filter reads no data: a mark whose data
    does not decode is counted as a mark (only reading it tells), a znode that is no mark
    by its name or place is corrupt (exit 1); with a filter every mark is read, as before."""
    await ClusterWriter(zk).init_cluster()
    urm = UnderreplicationManager(zk, ROOT)
    await urm.check_layout()
    for i in (1, 7, 70_000):
        await urm.mark_underreplicated(i, ["bk:3181"], now_ms=1000)
    await zk.create(ur_ledger_path(BASE, 2), b"this is not { a mark", makepath=True)
    z = ("list-underreplicated", "--zk", zk.hosts, "--count-only")
    code, out, err = await run_cli(*z, "--json")
    assert (code, out) == (0, '{"count": 4, "corrupt": 0}\n')
    assert err == "4 under-replicated ledgers; auto-recovery enabled\n"
    code, out, _ = await run_cli(*z, "--json", "--missing-replica", "bk:3181")
    assert (code, out) == (1, '{"count": 3, "corrupt": 1}\n')

    await zk.create(f"{LEAVES}/0003/urLthree", b"", makepath=True)
    code, out, err = await run_cli(*z)
    assert (code, out) == (1, "4\n")
    assert err.splitlines() == [
        f"bk-auditor: error: corrupt under-replication mark {LEAVES}/0003/urLthree: "
        "mark name 'urLthree' is not urL and a ledger id",
        "4 under-replicated ledgers, 1 corrupt marks; auto-recovery enabled",
    ]


async def test_children_of_many_nodes_at_once(store: MetadataStore) -> None:
    """The store's batched listing, which the marks' listing stands on: each node's children
    in the order asked, None for a node that does not exist."""
    for path in ("/m/a/x", "/m/a/y", "/m/b"):
        await store.create(path, b"", makepath=True)
    paths = ["/m/a", "/m/none", "/m/b", "/m", *(f"/m/n{i}" for i in range(1200))]
    found = await store.get_children_many(paths)
    assert [sorted(c) if c is not None else None for c in found[:4]] == [
        ["x", "y"],
        None,
        [],
        ["a", "b"],
    ]
    assert list(found[4:]) == [None] * 1200
