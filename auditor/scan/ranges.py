"""A scan's driver must spread the reading of ledgers over partitions without reading them
itself (that is the work being spread out), and every ledger, even one created after the
plan, must fall in exactly one partition.

Splitting the ledger id space into partitions from cheap listings of the tree.

The driver can list directories: in the hierarchical layouts a directory spells a
decimal prefix of every id below it, so listings alone tell where ledgers are.
The plan descends level by level to the directories that hold leaves (at most
10,000 ledgers each); when there are fewer of those than a few per partition,
it lists them too and splits on exact ids. Partitions are contiguous id ranges
that together cover every id from 0 to 2^63, so a ledger created between the
plan and the scan still falls in exactly one partition.

The flat layout has only one directory; its single listing gives the ids.

On a store with range reads (etcd) a listing is itself a read of every key below the
directory, so the plan asks only for the largest ledger id (the walk's few short reads)
and splits 0..that id evenly: ids are handed out in order, so even id ranges hold about
even numbers of ledgers.

Directories and leaves whose paths spell ids beyond 2^63-1 hold no ledger and
are left out of the plan; the partition that runs to the end of the id space
walks them and names them as invalid ledger znodes (`IdRange.last`).
"""

from __future__ import annotations

from dataclasses import dataclass

from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_tree import FLAT_LEAF, FOUR, LEAF, IdRange, Tree, trees_of
from auditor.metadata.paths import LONG_MAX, is_valid_ledger_id
from auditor.metadata.walk import LedgerWalker
from auditor.store import MetadataStore, NoNodeError

#: Buckets per partition the plan aims for before it stops descending.
BUCKETS_PER_PARTITION = 4
WHOLE = IdRange(0, LONG_MAX + 1)


@dataclass(frozen=True, slots=True)
class Bucket:
    """A directory (ids `lo`..`hi`) or a single ledger (`hi == lo + 1`)."""

    lo: int
    hi: int
    path: str
    prefix: str
    tree: Tree | None


async def _children(store: MetadataStore, path: str) -> list[str]:
    try:
        return sorted(await store.get_children(path))
    except NoNodeError:
        return []


def _dir(path: str, prefix: str, tree: Tree) -> Bucket:
    scale: int = 10 ** tree.below(prefix)
    return Bucket(int(prefix) * scale, (int(prefix) + 1) * scale, path, prefix, tree)


def _leaf(ledger_id: int) -> Bucket:
    return Bucket(ledger_id, ledger_id + 1, "", "", None)


def _plannable(b: Bucket) -> bool:
    """Whether a bucket can hold a ledger: its first id is a valid one."""
    return is_valid_ledger_id(b.lo)


async def _expand(store: MetadataStore, b: Bucket) -> list[Bucket]:
    """The next level down of one directory bucket."""
    assert b.tree is not None
    names = await _children(store, b.path)
    if len(b.prefix) + 4 == b.tree.digits:
        found = [_leaf(int(b.prefix + n[1:])) for n in names if LEAF.match(n)]
    else:
        found = [_dir(f"{b.path}/{n}", b.prefix + n, b.tree) for n in names if FOUR.match(n)]
    return [x for x in found if _plannable(x)]


def _leaf_parent(b: Bucket) -> bool:
    return b.tree is None or len(b.prefix) + 4 == b.tree.digits


async def buckets(
    store: MetadataStore, root: str, manager: LedgerManager, partitions: int
) -> list[Bucket]:
    """Where the ledgers are, as id-ordered buckets of comparable size."""
    root = root.rstrip("/")
    if manager is LedgerManager.FLAT:
        return [_leaf(int(n[1:])) for n in await _children(store, root) if FLAT_LEAF.match(n)]
    tops = await _children(store, root)
    found = [
        bucket
        for tree in trees_of(manager)
        for n in tops
        if tree.top.match(n) and _plannable(bucket := _dir(f"{root}/{n}", n, tree))
    ]
    # Down to the directories that hold leaves: those hold at most 10,000 ledgers each.
    while not all(_leaf_parent(b) for b in found):
        nxt: list[Bucket] = []
        for b in found:
            nxt.extend([b] if _leaf_parent(b) else await _expand(store, b))
        found = nxt
    # Too few to balance on: list them (one listing each) and split on exact ids.
    if len(found) < partitions * BUCKETS_PER_PARTITION:
        leaves: list[Bucket] = []
        for b in found:
            leaves.extend(await _expand(store, b) if b.tree is not None else [b])
        found = leaves
    return found


def split(found: list[Bucket], partitions: int) -> list[IdRange]:
    """Contiguous ranges of about equal bucket counts, tiling [0, 2^63)."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    n = min(partitions, len(found))
    if n <= 1:
        return [WHOLE]
    starts = [found[(i * len(found)) // n].lo for i in range(n)]
    starts[0] = 0
    ends = [*starts[1:], WHOLE.hi]
    return [IdRange(lo, hi) for lo, hi in zip(starts, ends, strict=True)]


async def plan_ranges(
    store: MetadataStore, root: str, manager: LedgerManager, partitions: int
) -> list[IdRange]:
    if store.ranged:
        return await even_ranges(store, root, manager, partitions)
    return split(await buckets(store, root, manager, partitions), partitions)


async def even_ranges(
    store: MetadataStore, root: str, manager: LedgerManager, partitions: int
) -> list[IdRange]:
    """Contiguous ranges tiling [0, 2^63), splitting 0..the largest ledger id evenly."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    largest = await LedgerWalker(store, root, manager).max_ledger_id()
    if largest is None or partitions == 1:
        return [WHOLE]
    n = min(partitions, largest + 1)
    starts = [((largest + 1) * i) // n for i in range(n)]
    ends = [*starts[1:], WHOLE.hi]
    return [IdRange(lo, hi) for lo, hi in zip(starts, ends, strict=True)]
