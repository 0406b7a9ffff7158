"""The ranged walk (etcd's range reads) against the ZooKeeper walk, on the same tree.

One Pulsar-layout tree (hierarchical and long hierarchical: ledgers, special znodes,
stray and misnamed znodes, a ledger filed under the wrong tree, one beyond 2^63-1, keys
below a ledger) is written on a real ZooKeeper and on a real etcd (Pulsar's keys, no
key for parents); the two walks give the same records, the same unexpected znodes in
the same order, and the same largest id, whole and restricted to id ranges.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_tree import IdRange
from auditor.metadata.paths import LONG_MAX
from auditor.metadata.walk import LedgerWalker
from auditor.store import MetadataStore
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.zk import ZkClient

ENSEMBLE = ["192.0.2.1:3181", "192.0.2.2:3181", "192.0.2.3:3181"]
IDS = [
    0, 1, 2, 9999, 10000, 10001, 123456, 99999999, 100000000, 2147483646,
    2147483647, 2147483648, 2**40 + 7, 10**17 + 3, 2**63 - 1,
]  # fmt: skip
H, LH = LedgerManager.HIERARCHICAL, LedgerManager.LONG_HIERARCHICAL

# Znodes that are no ledgers, for each layout (paths under /ledgers).
STRAYS = {
    H: [
        "00/0000/notaledger",  # foreign at the leaves' level
        "00/0000/L12345",  # misnamed: an invalid ledger znode
        "00/0001/underreplication",  # special at the leaves' level: passed over
        "00/abc",  # foreign at a middle level
        "01/zz/child",  # foreign, with a child (etcd: only the child's key)
        "00/0000/L0001/child",  # below a ledger: never listed
        "disableHealthCheck",  # top level: passed over
        "000/0000/0000/0000/L0005",  # ledger 5 filed under the long tree
        "99/9999/L9998",  # ledger 9999999998 filed under the legacy tree
        "000/0000/0002/abcd",  # foreign in the long tree
        "999/9999/9999/9999/L9999",  # an id beyond 2^63-1
        "000/0000/0214/7483/L64x",  # foreign at the leaves' level of the long tree
        "000/0000/0000/zzzz",  # after every id of its directory's (an id range's tail)
    ],
    LH: [
        "000/0000/0000/0000/notaledger",
        "000/0000/0000/0000/L123",
        "000/0000/0000/0000/L0001/child",
        "000/abc",
        "000/0000/xyz/deeper/still",
        "000/0000/0000/zzzz",
        "00/0000/L0001",  # a legacy path: not this layout's tree, passed over
        "999/9999/9999/9999/L9999",
    ],
}
RANGES = [
    IdRange(0, 10000),
    IdRange(10000, 2147483648),
    IdRange(2147483648, 2**40),
    IdRange(2**40, LONG_MAX + 1),
    IdRange(1, 9999),
    IdRange(5, 123457),
    IdRange(10001, 10**17 + 4),
    IdRange(2147483647, 2147483649),
    IdRange(10**17 + 4, 10**18),  # no ledgers: the largest id is the range's last
]


async def write_tree(store: MetadataStore, manager: LedgerManager) -> None:
    w = ClusterWriter(store, "/ledgers", manager)
    await w.init_cluster(instance_id="0d7a8b4e-0000-4000-8000-000000000001")
    for i in IDS:
        md = make_metadata(i, ENSEMBLE, ctime=1_700_000_000_000, ctoken=i, last_entry_id=i % 7)
        await w.write_ledger(md)
    await store.delete(w.path(2))
    await w.write_raw(2, b"BookieMetadataFormatVersion\t3\n\xff\xff\xff")  # corrupt
    for stray in STRAYS[manager]:
        await store.create(f"/ledgers/{stray}", b"x", makepath=True)


async def walk(store: MetadataStore, manager: LedgerManager, rng: IdRange | None) -> Any:
    walker = LedgerWalker(store, "/ledgers", manager, rng)
    records = [
        (r.ledger_id, r.path, r.metadata, r.znode_version, str(r.error))
        async for r in walker.ledgers(concurrency=4)
    ]
    ids = [i async for i in LedgerWalker(store, "/ledgers", manager, rng).ledger_ids()]
    assert ids == [r[0] for r in records]
    s = walker.stats
    counts = (s.ledgers, s.corrupt, s.unexpected_count, s.invalid_ledgers, s.deleted_during_walk)
    return records, s.unexpected, counts, await walker.max_ledger_id()


@pytest.mark.parametrize("manager", [H, LH], ids=["hierarchical", "longhierarchical"])
async def test_same_tree_walks_the_same_on_zookeeper_and_etcd(
    zk: ZkClient, etcd: MetadataStore, manager: LedgerManager
) -> None:
    assert etcd.ranged and not zk.ranged
    await write_tree(zk, manager)
    await write_tree(etcd, manager)

    on_zk = await walk(zk, manager, None)
    on_etcd = await walk(etcd, manager, None)
    assert on_etcd == on_zk
    records, unexpected, _, largest = on_etcd
    assert [r[0] for r in records] == sorted(IDS)
    assert largest == 2**63 - 1
    assert [r[0] for r in records if r[4] != "None"] == [2]
    named = {u.path.removeprefix("/ledgers/") for u in unexpected}
    if manager is H:
        assert named == {
            "00/0000/notaledger",
            "00/0000/L12345",
            "00/abc",
            "01/zz",
            "000/0000/0000/0000/L0005",
            "99/9999/L9998",
            "000/0000/0002/abcd",
            "999/9999/9999/9999/L9999",
            "000/0000/0214/7483/L64x",
            "000/0000/0000/zzzz",
        }
    else:
        assert named == {
            "000/0000/0000/0000/notaledger",
            "000/0000/0000/0000/L123",
            "000/abc",
            "000/0000/xyz",
            "999/9999/9999/9999/L9999",
            "000/0000/0000/zzzz",
        }

    # Restricted to id ranges, both walks see the same ledgers and name the same znodes
    # (each in exactly one range of a partition, as the ZooKeeper walk does).
    for rng in RANGES:
        on_zk = await walk(zk, manager, rng)
        on_etcd = await walk(etcd, manager, rng)
        assert on_etcd == on_zk, rng
        assert [r[0] for r in on_etcd[0]] == [i for i in IDS if i in rng], rng
    partition = [r for r in RANGES[:4]]
    in_parts = [u.path for rng in partition for u in (await walk(etcd, manager, rng))[1]]
    assert sorted(in_parts) == sorted(u.path for u in unexpected)


async def test_page_size_follows_concurrency(etcd: MetadataStore) -> None:
    await write_tree(etcd, H)
    reads: list[int] = []
    real = etcd.read_range

    async def counted(start: str, end: str, *, limit: int) -> Any:
        reads.append(limit)
        return await real(start, end, limit=limit)

    etcd.read_range = counted  # type: ignore[method-assign]
    walker = LedgerWalker(etcd, "/ledgers", H)
    got = [r.ledger_id async for r in walker.ledgers(concurrency=2)]
    assert got == sorted(IDS)
    assert set(reads) == {2}


async def test_etcd_manager_on_zookeeper_is_refused(zk: ZkClient) -> None:
    from auditor.metadata.walk import NotRangedError

    with pytest.raises(NotRangedError, match="etcd"):
        LedgerWalker(zk, "/ledgers", LedgerManager.ETCD)


@pytest.mark.parametrize(
    ("manager", "ids", "strays", "named"),
    [
        (
            LedgerManager.FLAT,
            [0, 5, 123, 9999999999],
            ["L123", "L00000000012/child", "LAYOUTX", "notaledger"],
            {"/ledgers/L123", "/ledgers/L00000000012"},
        ),
        (
            LedgerManager.LEGACY_HIERARCHICAL,
            [3, 20000, 2147483646, 9999999999],
            ["00/0000/L12", "05/bad", "000/0000/0000/0000/L0001"],
            {"/ledgers/00/0000/L12", "/ledgers/05/bad"},
        ),
    ],
)
async def test_flat_and_legacy_walk_the_same(
    zk: ZkClient,
    etcd: MetadataStore,
    manager: LedgerManager,
    ids: list[int],
    strays: list[str],
    named: set[str],
) -> None:
    for store in (zk, etcd):
        w = ClusterWriter(store, "/ledgers", manager)
        await w.init_cluster()
        for i in ids:
            await w.write_ledger(make_metadata(i, ENSEMBLE, ctime=1_700_000_000_000, ctoken=1))
        for stray in strays:
            await store.create(f"/ledgers/{stray}", b"x", makepath=True)
    on_zk = await walk(zk, manager, None)
    on_etcd = await walk(etcd, manager, None)
    assert on_etcd == on_zk
    assert [r[0] for r in on_etcd[0]] == ids
    assert {u.path for u in on_etcd[1]} == named
    assert on_etcd[3] == ids[-1]
    # Within id ranges, the same ledgers and the same znodes named (the flat layout's
    # misnamed ones by the range of id 0, wherever they sort).
    for rng in [IdRange(0, 6), IdRange(4, 20001), IdRange(6, LONG_MAX + 1)]:
        assert await walk(etcd, manager, rng) == await walk(zk, manager, rng), rng
    if manager is LedgerManager.FLAT:
        assert {u.path for u in (await walk(etcd, manager, IdRange(0, 6)))[1]} == named


def random_tree(seed: int, manager: LedgerManager) -> tuple[list[int], list[str]]:
    """Ledger ids and stray znodes (no names with characters below "/": their order as keys
    and as children differs, the one difference the module docstring names)."""
    rnd = random.Random(seed)
    scales = [10**4, 10**6, 10**8, 2**31, 10**12, 10**16, 2**63]
    ids = sorted({rnd.randrange(0, rnd.choice(scales)) for _ in range(40)})
    tree = [(3, 4)] if manager is LH else [(2, 2), (3, 4)]
    strays = []
    for _ in range(16):
        top, levels = rnd.choice(tree)
        digits = [f"{rnd.randrange(0, 10**top):0{top}d}"] + [
            f"{rnd.randrange(0, 3):04d}" for _ in range(levels - 1)
        ]
        depth = rnd.randrange(1, levels + 1)
        name = rnd.choice(["zz", "abc", "L12", "L123456", "12345", "idgen", "ID-1", "Lx"])
        path = "/".join([*digits[:depth], name])
        if rnd.random() < 0.3:
            path += "/below"
        strays.append(path)
    return ids, strays


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("manager", [H, LH], ids=["hierarchical", "longhierarchical"])
async def test_random_trees_walk_the_same(
    zk: ZkClient, etcd: MetadataStore, manager: LedgerManager, seed: int
) -> None:
    ids, strays = random_tree(seed, manager)
    for store in (zk, etcd):
        w = ClusterWriter(store, "/ledgers", manager)
        await w.init_cluster()
        await w.write_ledgers(
            make_metadata(i, ENSEMBLE, ctime=1_700_000_000_000, ctoken=1) for i in ids
        )
        for stray in strays:
            if await store.exists(f"/ledgers/{stray}") is None:
                await store.create(f"/ledgers/{stray}", b"x", makepath=True)
    assert await walk(etcd, manager, None) == await walk(zk, manager, None)
    rnd = random.Random(seed)
    cuts = sorted({0, LONG_MAX + 1, *(rnd.choice(ids) + rnd.randrange(-2, 3) for _ in range(6))})
    cuts = [c for c in cuts if 0 <= c <= LONG_MAX + 1]
    cuts += [1, 10**4, 10**8, 2**31] if seed == 1 else []
    cuts = sorted(set(cuts))
    for lo, hi in itertools.pairwise(cuts):
        rng = IdRange(lo, hi)
        assert await walk(etcd, manager, rng) == await walk(zk, manager, rng), rng
