"""A streaming walk of the ledger tree, in ledger-id order.

Large clusters hold tens of millions of ledgers, so nothing here materialises
the whole id set: the walk descends one bucket at a time (at most 10,000
children per listing in the hierarchical layouts) and metadata reads are
pipelined with a bounded window that yields results in id order. Reads go in
batches (`ZkClient.get_many`: one ZooKeeper multiRead and one asyncio future
per batch, no task or future per ledger), since per-read overhead, not
ZooKeeper, is what a walk's time goes to. A ledger
deleted while we walk (NoNode on list or read) is counted, not an error; a
ledger whose bytes do not decode is yielded as a record carrying the error, so
the caller reports it (id and path) and the walk goes on.

A znode that cannot be a ledger is never yielded and never stops the walk: it
is an `UnexpectedZnode` in `stats.unexpected`, named by path with the reason.
That is one way for every such znode, whether its name is not a ledger's, it is
a ledger filed under the other tree, or its path spells an id outside
0..2^63-1 (`invalid_ledger`: it stands where a ledger would, and no ledger can
be there). Such an id has no record to carry: nothing downstream (the index,
the checks' reports, the API) can hold it.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from auditor.metadata.layout import LedgerManager
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.paths import (
    INT_MAX,
    LONG_MAX,
    InvalidLedgerIdError,
    check_ledger_id,
    is_special_znode,
    ledger_id_from_path,
    ledger_path,
)
from auditor.metadata.serde import LedgerMetadataFormatError, decode_ledger_metadata
from auditor.zk import NoNodeError, ZkClient, ZkStat

_TWO = re.compile(r"^\d{2}$")
_THREE = re.compile(r"^\d{3}$")
FOUR = re.compile(r"^\d{4}$")
LEAF = re.compile(r"^L\d{4}$")
FLAT_LEAF = re.compile(r"^L\d{10}$")
#: A name shaped like a ledger's (L and digits), whatever the count of digits.
LEDGER_SHAPED = re.compile(r"^L\d+$")
#: Unexpected znodes kept by path (all are counted): enough for an operator to go and look.
UNEXPECTED_KEPT = 100
#: The most ledgers one batch of the walk reads (one multiRead). A smaller `concurrency`
#: makes smaller batches, two in flight (one only when `concurrency` is 1).
BATCH_MAX = 250


def batch_shape(concurrency: int) -> tuple[int, int]:
    """(ledgers per batch, batches in flight) for a walk of `concurrency` reads in
    flight: at least two batches when there is room, so that one is read while the
    other is decoded and yielded; never more than `concurrency` reads."""
    concurrency = max(concurrency, 1)
    size = min(BATCH_MAX, max(concurrency // 2, 1))
    return size, max(concurrency // size, 1)


@dataclass(frozen=True, slots=True)
class IdRange:
    """Ledger ids `lo <= id < hi`: one partition of a walk (a Spark task, say)."""

    lo: int
    hi: int

    def __contains__(self, ledger_id: int) -> bool:
        return self.lo <= ledger_id < self.hi

    @property
    def last(self) -> bool:
        """Whether this range runs to the end of the id space: it also walks the znodes
        whose paths spell ids beyond 2^63-1, so that they are named by exactly one range."""
        return self.hi > LONG_MAX

    def contains_prefix(self, digits: str, below: int) -> bool:
        """Whether a znode whose path spells `digits`, `below` digits short of an id, may
        hold ids in this range (every id under it lies in one decimal interval)."""
        scale: int = 10**below
        first = int(digits) * scale
        return (self.last or first < self.hi) and first + scale > self.lo


@dataclass(frozen=True, slots=True)
class Tree:
    """One hierarchical tree: the top level's name pattern and the digits of a full id."""

    top: re.Pattern[str]
    digits: int

    def below(self, prefix: str) -> int:
        return self.digits - len(prefix)


LEGACY_TREE = Tree(_TWO, 10)
LONG_TREE = Tree(_THREE, 19)


def trees_of(manager: LedgerManager) -> list[Tree]:
    """The trees of a hierarchical manager, in id order (flat has none)."""
    if manager is LedgerManager.LEGACY_HIERARCHICAL:
        return [LEGACY_TREE]
    if manager is LedgerManager.LONG_HIERARCHICAL:
        return [LONG_TREE]
    if manager is LedgerManager.HIERARCHICAL:
        return [LEGACY_TREE, LONG_TREE]
    return []


@dataclass(frozen=True, slots=True)
class UnexpectedZnode:
    """A znode under the ledgers root that the walk could not take as a ledger."""

    path: str
    reason: str
    #: It stands where a ledger would (`L` and digits at a ledger's level) but names no
    #: valid ledger: a bad ledger znode, where a stray name is merely unexpected.
    invalid_ledger: bool = False

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def misnamed_reason(name: str, digits: int) -> str:
    """Why `L` and digits at a ledger's level is no ledger: the count of digits."""
    return f"a ledger's name here is L and {digits} digits, not {len(name) - 1}"


def out_of_range_reason(path: str, exc: InvalidLedgerIdError) -> str:
    """Why a ledger-shaped path is no ledger: the id it spells (the error names the path)."""
    return str(exc).removeprefix(f"{path}: ")


@dataclass
class WalkStats:
    """What the walk saw besides ledgers; a caller reports these, never drops them."""

    ledgers: int = 0
    deleted_during_walk: int = 0
    corrupt: int = 0
    #: The first UNEXPECTED_KEPT unexpected znodes, in walk order; all are counted below.
    unexpected: list[UnexpectedZnode] = field(default_factory=list)
    unexpected_count: int = 0
    #: How many of them are `invalid_ledger`.
    invalid_ledgers: int = 0

    @property
    def foreign_znodes(self) -> list[str]:
        """The paths of the unexpected znodes kept (what callers read before reasons)."""
        return [u.path for u in self.unexpected]

    def note_unexpected(self, znode: UnexpectedZnode) -> None:
        self.unexpected_count += 1
        if znode.invalid_ledger:
            self.invalid_ledgers += 1
        if len(self.unexpected) < UNEXPECTED_KEPT:
            self.unexpected.append(znode)


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """One ledger as read: metadata, or the error that kept it from decoding."""

    ledger_id: int
    path: str
    metadata: LedgerMetadata | None
    znode_version: int
    error: LedgerMetadataFormatError | None = None


class Walker(Protocol):
    """What a check driver walks: ZooKeeper itself, or the leader's index of it."""

    stats: WalkStats

    async def max_ledger_id(self) -> int | None: ...

    def ledgers(self, concurrency: int = 64) -> AsyncIterator[LedgerRecord]: ...

    def ledger_ids(self) -> AsyncIterator[int]: ...

    async def read(self, ledger_id: int, path: str | None = None) -> LedgerRecord | None: ...


class LedgerWalker:
    """Walks one ledgers root. `stats` fills in as the walk proceeds."""

    def __init__(
        self,
        zk: ZkClient,
        root: str,
        manager: LedgerManager,
        id_range: IdRange | None = None,
    ) -> None:
        self.zk = zk
        self.root = root.rstrip("/")
        self.manager = manager
        #: Only ledgers in this range are walked (subtrees outside it are not even listed).
        self.id_range = id_range
        self.stats = WalkStats()

    async def _children(self, path: str) -> list[str]:
        try:
            return sorted(await self.zk.get_children(path))
        except NoNodeError:
            return []

    def _foreign(self, path: str, reason: str = "not a ledger znode") -> None:
        self.stats.note_unexpected(UnexpectedZnode(path, reason))

    def _invalid(self, path: str, reason: str) -> None:
        self.stats.note_unexpected(UnexpectedZnode(path, reason, invalid_ledger=True))

    def _owns(self, prefix: str, below: int) -> bool:
        """Whether this walk names the unexpected znodes in the directory spelling `prefix`:
        of the ranges that list it, the one holding the first id it could hold (so that
        partitions of one scan name each znode once)."""
        if self.id_range is None:
            return True
        first = int(prefix or "0") * 10**below
        return first in self.id_range or (first > LONG_MAX and self.id_range.last)

    def _misnamed(self, path: str, name: str, digits: int) -> bool:
        """An `L` and a wrong count of digits: an invalid ledger znode; True if it was one."""
        if not LEDGER_SHAPED.match(name):
            return False
        self._invalid(path, misnamed_reason(name, digits))
        return True

    async def _leaves(self, path: str, prefix: str, leaf: re.Pattern[str]) -> AsyncIterator[str]:
        for name in await self._children(path):
            if leaf.match(name):
                if self.id_range is None or self.id_range.contains_prefix(prefix + name[1:], 0):
                    yield f"{path}/{name}"
            elif not self._owns(prefix, 4) or self._misnamed(f"{path}/{name}", name, 4):
                continue
            elif not is_special_znode(name):
                self._foreign(f"{path}/{name}")

    async def _tree(self, tree: Tree) -> AsyncIterator[str]:
        """Every leaf path of one tree, in id order, pruned to `id_range`."""
        for top in await self._children(self.root):
            if not tree.top.match(top):
                continue
            if self.id_range is None or self.id_range.contains_prefix(top, tree.below(top)):
                async for p in self._levels(f"{self.root}/{top}", top, tree):
                    yield p

    async def _levels(self, path: str, prefix: str, tree: Tree) -> AsyncIterator[str]:
        if len(prefix) + 4 == tree.digits:
            async for p in self._leaves(path, prefix, LEAF):
                yield p
            return
        for name in await self._children(path):
            if not FOUR.match(name):
                if self._owns(prefix, tree.below(prefix)):
                    self._foreign(f"{path}/{name}")
                continue
            sub = prefix + name
            if self.id_range is None or self.id_range.contains_prefix(sub, tree.below(sub)):
                async for p in self._levels(f"{path}/{name}", sub, tree):
                    yield p

    async def _flat_paths(self) -> AsyncIterator[str]:
        for name in await self._children(self.root):
            if FLAT_LEAF.match(name):
                if self.id_range is None or self.id_range.contains_prefix(name[1:], 0):
                    yield f"{self.root}/{name}"
            elif self._owns("", 10):
                self._misnamed(f"{self.root}/{name}", name, 10)

    async def ledger_paths(self) -> AsyncGenerator[tuple[int, str], None]:
        """(ledger id, znode path) in ascending id order."""
        if self.manager is LedgerManager.FLAT:
            sources = [self._flat_paths()]
        else:
            # Hierarchical: ids below INT_MAX live in the 2-4-4 tree, the rest in
            # the 3-4-4-4-4 tree, so the two walks in turn are in id order.
            sources = [self._tree(t) for t in trees_of(self.manager)]
        for source in sources:
            async for path in source:
                try:
                    ledger_id = ledger_id_from_path(self.root, path)
                except InvalidLedgerIdError as exc:
                    # Only the last range gets here (the others prune such paths).
                    self._invalid(path, out_of_range_reason(path, exc))
                    continue
                legacy = path.count("/") - self.root.count("/") == 3
                if self.manager is LedgerManager.HIERARCHICAL and legacy != (ledger_id < INT_MAX):
                    # A ledger filed under the other tree than its id says: the
                    # Java manager would not find it by id either.
                    tree = "legacy (2-4-4)" if legacy else "long (3-4-4-4-4)"
                    self._foreign(
                        path, f"ledger {ledger_id} filed under the {tree} tree, not its own"
                    )
                    continue
                yield ledger_id, path

    async def max_ledger_id(self) -> int | None:
        """The largest ledger id, from the last child at each level (for ETAs); a walk of
        one id range says no more than its range's last id, so that its ETA is its own."""
        found = await self._max_ledger_id()
        if found is not None and self.id_range is not None and not self.id_range.last:
            return min(found, self.id_range.hi - 1)
        return found

    async def _max_ledger_id(self) -> int | None:
        if self.manager is LedgerManager.FLAT:
            names = [n for n in await self._children(self.root) if FLAT_LEAF.match(n)]
            return ledger_id_from_path(self.root, f"{self.root}/{names[-1]}") if names else None
        trees: list[tuple[re.Pattern[str], int]] = []
        # The long tree holds the larger ids, so it is looked at first.
        if self.manager in (LedgerManager.LONG_HIERARCHICAL, LedgerManager.HIERARCHICAL):
            trees.append((_THREE, 3))
        if self.manager in (LedgerManager.LEGACY_HIERARCHICAL, LedgerManager.HIERARCHICAL):
            trees.append((_TWO, 1))
        tops = await self._children(self.root)
        for top_pattern, middle_levels in trees:
            for top in reversed([n for n in tops if top_pattern.match(n)]):
                found = await self._last_leaf(f"{self.root}/{top}", middle_levels)
                if found is not None:
                    return found
        return None

    async def _last_leaf(self, path: str, levels: int) -> int | None:
        """The largest valid id under `path` (paths beyond 2^63-1 are passed over)."""
        names = await self._children(path)
        if levels == 0:
            for leaf in reversed([n for n in names if LEAF.match(n)]):
                try:
                    return ledger_id_from_path(self.root, f"{path}/{leaf}")
                except InvalidLedgerIdError:
                    continue
            return None
        for name in reversed([n for n in names if FOUR.match(n)]):
            found = await self._last_leaf(f"{path}/{name}", levels - 1)
            if found is not None:
                return found
        return None

    async def ledger_ids(self) -> AsyncIterator[int]:
        async for ledger_id, _ in self.ledger_paths():
            yield ledger_id

    async def read(self, ledger_id: int, path: str | None = None) -> LedgerRecord | None:
        """One ledger's record now (None if it does not exist); for re-reads outside the walk.

        InvalidLedgerIdError for an id outside 0..2^63-1 (the walk never yields one)."""
        check_ledger_id(ledger_id)
        if path is None:
            path = ledger_path(self.manager, self.root, ledger_id)
        try:
            data, stat = await self.zk.get(path)
        except NoNodeError:
            return None
        return _record(ledger_id, path, data, stat)

    async def read_many(
        self, ledgers: Sequence[int | tuple[int, str]]
    ) -> list[LedgerRecord | None]:
        """Several ledgers' records now, in the order asked (None for one that does not
        exist), read as one batch; for re-reads outside the walk. A ledger is its id (its
        path from the layout) or (id, path).

        InvalidLedgerIdError for an id outside 0..2^63-1 (the walk never yields one)."""
        ids: list[int] = []
        paths: list[str] = []
        for item in ledgers:
            ledger_id, path = item if isinstance(item, tuple) else (item, None)
            check_ledger_id(ledger_id)
            ids.append(ledger_id)
            paths.append(path or ledger_path(self.manager, self.root, ledger_id))
        return await self._read_batch(ids, paths)

    async def _read_batch(self, ids: list[int], paths: list[str]) -> list[LedgerRecord | None]:
        if type(self).read is not LedgerWalker.read:
            # A subclass that hooks `read` (tests inject changes there) sees every read.
            return [await self.read(i, p) for i, p in zip(ids, paths, strict=True)]
        found = await self.zk.get_many(paths)
        return [
            None if got is None else _record(ledger_id, path, got[0], got[1])
            for ledger_id, path, got in zip(ids, paths, found, strict=True)
        ]

    async def ledgers(self, concurrency: int = 64) -> AsyncIterator[LedgerRecord]:
        """Every ledger's metadata in id order, with at most `concurrency` reads in flight
        (in batches: `batch_shape`)."""
        size, depth = batch_shape(concurrency)
        window: deque[asyncio.Future[list[LedgerRecord | None]]] = deque()
        ids: list[int] = []
        paths: list[str] = []
        listing = self.ledger_paths()
        try:
            async for ledger_id, path in listing:
                ids.append(ledger_id)
                paths.append(path)
                if len(ids) < size:
                    continue
                window.append(asyncio.ensure_future(self._read_batch(ids, paths)))
                ids, paths = [], []
                if len(window) >= depth:
                    for rec in await window.popleft():
                        if (out := self._account(rec)) is not None:
                            yield out
            if ids:
                window.append(asyncio.ensure_future(self._read_batch(ids, paths)))
            while window:
                for rec in await window.popleft():
                    if (out := self._account(rec)) is not None:
                        yield out
        finally:
            for batch in window:
                batch.cancel()
            await listing.aclose()

    def _account(self, rec: LedgerRecord | None) -> LedgerRecord | None:
        if rec is None:
            self.stats.deleted_during_walk += 1
            return None
        self.stats.ledgers += 1
        if rec.error is not None:
            self.stats.corrupt += 1
        return rec


def _record(ledger_id: int, path: str, data: bytes, stat: ZkStat) -> LedgerRecord:
    """A ledger's record from its znode: decoded metadata, or the error that kept it from
    decoding."""
    try:
        md = decode_ledger_metadata(data, ledger_id, znode_ctime=int(stat.ctime))
    except LedgerMetadataFormatError as exc:
        return LedgerRecord(ledger_id, path, None, int(stat.version), exc)
    return LedgerRecord(ledger_id, path, md, int(stat.version))
