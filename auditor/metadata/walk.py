"""The walk of a ledgers root that every check, the index and the scan read ledgers by:
each ledger's metadata once, in ledger-id order, without holding the tree in memory.

Large clusters hold tens of millions of ledgers, so nothing here materialises
the whole id set. On ZooKeeper the walk descends one bucket at a time (at most 10,000
children per listing in the hierarchical layouts) and metadata reads are
pipelined with a bounded window that yields results in id order. Reads go in
batches (`MetadataStore.get_many`: one ZooKeeper multiRead and one asyncio future
per batch, no task or future per ledger), since per-read overhead, not
ZooKeeper, is what a walk's time goes to. A ledger
deleted while we walk (NoNode on list or read) is counted, not an error; a
ledger whose bytes do not decode is yielded as a record carrying the error, so
the caller reports it (id and path) and the walk goes on.

On a store that serves range reads (`MetadataStore.ranged`: etcd) `LedgerWalker` hands
the walk to `ranged_walk.RangedWalk`, which reads keys in key order instead: no listing,
no separate read of each ledger. Both walks judge what they meet by the same rules
(`ledger_tree.py`: the names of each layout, `IdRange`, and the unexpected znodes, named
in `stats.unexpected`), so that the same tree walks to the same records on either store.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Protocol, TypeAlias, TypeVar

from auditor.errors import ConfigError
from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_tree import (
    FLAT_LEAF,
    FOUR,
    LEAF,
    LEDGER_SHAPED,
    LEGACY_TREE,
    LONG_TREE,
    TREE_TOP,
    WRONG_LAYOUT_FLAT,
    WRONG_LAYOUT_HIERARCHICAL,
    IdRange,
    Tree,
    WalkStats,
    ZnodeJudge,
    trees_of,
)
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.paths import (
    InvalidLedgerIdError,
    check_ledger_id,
    is_special_znode,
    ledger_id_from_path,
    ledger_path,
)
from auditor.metadata.ranged_walk import RangedWalk
from auditor.metadata.serde import LedgerMetadataFormatError, decode_ledger_metadata
from auditor.store import MetadataStore, NoNodeError, Stat

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


#: One ledger znode as read and not decoded: (ledger id, path, data, stat).
RawLedger: TypeAlias = tuple[int, str, bytes, Stat]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """One ledger as read: metadata, or the error that kept it from decoding."""

    ledger_id: int
    path: str
    metadata: LedgerMetadata | None
    znode_version: int
    error: LedgerMetadataFormatError | None = None


class Walker(Protocol):
    """What a check driver walks: the metadata store itself, or the leader's index of it."""

    stats: WalkStats

    async def max_ledger_id(self) -> int | None: ...

    def ledgers(self, concurrency: int = 64) -> AsyncIterator[LedgerRecord]: ...

    def ledger_ids(self) -> AsyncIterator[int]: ...

    async def read(self, ledger_id: int, path: str | None = None) -> LedgerRecord | None: ...


class NotRangedError(ConfigError):
    """BookKeeper's etcd ledger manager on a store without range reads (ZooKeeper)."""


class LedgerWalker:
    """Walks one ledgers root: by listings and batched reads, or by key ranges where the
    store serves them (`RangedWalk`). `stats` fills in as the walk proceeds."""

    def __init__(
        self,
        store: MetadataStore,
        root: str,
        manager: LedgerManager,
        id_range: IdRange | None = None,
    ) -> None:
        self.store = store
        self.root = root.rstrip("/")
        self.manager = manager
        #: Only ledgers in this range are walked (subtrees outside it are not even listed).
        self.id_range = id_range
        self.stats = WalkStats()
        #: What the walk meets that is no ledger goes to `stats` by its rules.
        self.judge = ZnodeJudge(self.root, manager, id_range, self.stats)
        if manager is LedgerManager.ETCD and not store.ranged:
            raise NotRangedError(
                f"{self.root}: LAYOUT names BookKeeper's etcd ledger manager, whose ledgers "
                f"are etcd keys, but the metadata store is {store.where}"
            )

    async def _children(self, path: str) -> list[str]:
        try:
            return sorted(await self.store.get_children(path))
        except NoNodeError:
            return []

    def _ledger(self, path: str, found: list[tuple[int, str]]) -> None:
        ledger_id = self.judge.ledger_id(path)
        if ledger_id is not None:
            found.append((ledger_id, path))

    async def _leaves(self, path: str, prefix: str, leaf: re.Pattern[str]) -> list[tuple[int, str]]:
        """The ledgers of one bucket (id, path) in id order; what else is there is judged
        as it comes, in name order. One list a listing: a walk of millions of ledgers
        pays the generators between here and its reader per bucket, not per ledger."""
        found: list[tuple[int, str]] = []
        for name in await self._children(path):
            if leaf.match(name):
                if self.id_range is None or self.id_range.contains_prefix(prefix + name[1:], 0):
                    self._ledger(f"{path}/{name}", found)
            elif not self.judge.owns(prefix, 4) or self.judge.misnamed(f"{path}/{name}", name, 4):
                continue
            elif not is_special_znode(name):
                self.judge.foreign(f"{path}/{name}")
        return found

    async def _tree(self, tree: Tree) -> AsyncIterator[list[tuple[int, str]]]:
        """Every ledger of one tree, in id order, pruned to `id_range`: a list a bucket."""
        for top in await self._children(self.root):
            if not tree.top.match(top):
                continue
            if self.id_range is None or self.id_range.contains_prefix(top, tree.below(top)):
                async for found in self._levels(f"{self.root}/{top}", top, tree):
                    yield found

    async def _levels(
        self, path: str, prefix: str, tree: Tree
    ) -> AsyncIterator[list[tuple[int, str]]]:
        if len(prefix) + 4 == tree.digits:
            yield await self._leaves(path, prefix, LEAF)
            return
        for name in await self._children(path):
            if not FOUR.match(name):
                if self.judge.owns(prefix, tree.below(prefix)):
                    self.judge.foreign(f"{path}/{name}")
                continue
            sub = prefix + name
            if self.id_range is None or self.id_range.contains_prefix(sub, tree.below(sub)):
                async for found in self._levels(f"{path}/{name}", sub, tree):
                    yield found

    async def _flat(self) -> AsyncIterator[list[tuple[int, str]]]:
        found: list[tuple[int, str]] = []
        for name in await self._children(self.root):
            if FLAT_LEAF.match(name):
                if self.id_range is None or self.id_range.contains_prefix(name[1:], 0):
                    self._ledger(f"{self.root}/{name}", found)
            elif self.judge.owns("", 10):
                path = f"{self.root}/{name}"
                if not self.judge.misnamed(path, name, 10) and TREE_TOP.match(name):
                    # Ledgers the layout cannot read: a silent "0 ledgers, all clear" else.
                    self.judge.invalid(path, WRONG_LAYOUT_FLAT)
        yield found

    async def _name_flat_strays(self) -> None:
        """Flat ledger znodes at the root of a hierarchical layout: named, never read
        (the layout says where ledgers are; these are not there)."""
        if self.judge.owns("", 10):
            for name in await self._children(self.root):
                if LEDGER_SHAPED.match(name):
                    self.judge.invalid(f"{self.root}/{name}", WRONG_LAYOUT_HIERARCHICAL)

    async def ledger_paths(self) -> AsyncGenerator[tuple[int, str], None]:
        """(ledger id, znode path) in ascending id order."""
        if self.store.ranged:
            async with aclosing(RangedWalk(self.store, self.judge, 1024).items()) as ranged:
                async for ledger_id, path, _ in ranged:
                    yield ledger_id, path
            return
        async with aclosing(self._listed()) as listed:
            async for found in listed:
                for item in found:
                    yield item

    async def _listed(self) -> AsyncGenerator[list[tuple[int, str]], None]:
        """`ledger_paths` of a listed tree (not a ranged store), a list per listing."""
        if self.manager is LedgerManager.FLAT:
            sources = [self._flat()]
        else:
            # Hierarchical: ids below INT_MAX live in the 2-4-4 tree, the rest in
            # the 3-4-4-4-4 tree, so the two walks in turn are in id order.
            sources = [self._tree(t) for t in trees_of(self.manager)]
            if self.manager is LedgerManager.HIERARCHICAL:
                await self._name_flat_strays()
        for source in sources:
            async for found in source:
                if found:
                    yield found

    async def max_ledger_id(self) -> int | None:
        """The largest ledger id, from the last child at each level (for ETAs); a walk of
        one id range says no more than its range's last id, so that its ETA is its own."""
        found = await self._max_ledger_id()
        if found is not None and self.id_range is not None and not self.id_range.last:
            return min(found, self.id_range.hi - 1)
        return found

    async def _max_ledger_id(self) -> int | None:
        if self.store.ranged:
            return await RangedWalk(self.store, self.judge, 64).max_ledger_id()
        if self.manager is LedgerManager.FLAT:
            names = [n for n in await self._children(self.root) if FLAT_LEAF.match(n)]
            return ledger_id_from_path(self.root, f"{self.root}/{names[-1]}") if names else None
        trees: list[tuple[re.Pattern[str], int]] = []
        # The long tree holds the larger ids, so it is looked at first.
        if self.manager in (LedgerManager.LONG_HIERARCHICAL, LedgerManager.HIERARCHICAL):
            trees.append((LONG_TREE.top, 3))
        if self.manager in (LedgerManager.LEGACY_HIERARCHICAL, LedgerManager.HIERARCHICAL):
            trees.append((LEGACY_TREE.top, 1))
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
            data, stat = await self.store.get(path)
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
        return [None if raw is None else _record(*raw) for raw in await self._read_raw(ids, paths)]

    async def _read_raw(self, ids: list[int], paths: list[str]) -> list[RawLedger | None]:
        found = await self.store.get_many(paths)
        return [
            None if got is None else (ledger_id, path, got[0], got[1])
            for ledger_id, path, got in zip(ids, paths, found, strict=True)
        ]

    async def _windowed(
        self, size: int, depth: int, read: Callable[[list[int], list[str]], Awaitable[list[T]]]
    ) -> AsyncGenerator[list[T], None]:
        """The listing's ledgers read `size` at a time by `read`, `depth` batches in
        flight, each batch's results handed out whole and in id order."""
        window: deque[asyncio.Future[list[T]]] = deque()
        ids: list[int] = []
        paths: list[str] = []
        listing = self._listed()
        try:
            async for found in listing:
                for ledger_id, path in found:
                    ids.append(ledger_id)
                    paths.append(path)
                    if len(ids) < size:
                        continue
                    window.append(asyncio.ensure_future(read(ids, paths)))
                    ids, paths = [], []
                    if len(window) >= depth:
                        yield await window.popleft()
            if ids:
                window.append(asyncio.ensure_future(read(ids, paths)))
            while window:
                yield await window.popleft()
        finally:
            for batch in window:
                batch.cancel()
            await listing.aclose()

    async def ledgers(self, concurrency: int = 64) -> AsyncIterator[LedgerRecord]:
        """Every ledger's metadata in id order, with at most `concurrency` reads in flight
        (in batches: `batch_shape`)."""
        size, depth = batch_shape(concurrency)
        if self.store.ranged:
            hooked = type(self).read is not LedgerWalker.read
            async with aclosing(RangedWalk(self.store, self.judge, size * depth).items()) as ranged:
                async for ledger_id, path, item in ranged:
                    if hooked:
                        # A subclass that hooks `read` (tests inject changes there) sees
                        # every read.
                        rec = await self.read(ledger_id, path)
                    else:
                        rec = _record(ledger_id, path, item.data, item.stat)
                    if (out := self._account(rec)) is not None:
                        yield out
            return
        async with aclosing(self._windowed(size, depth, self._read_batch)) as batches:
            async for batch in batches:
                for rec in batch:
                    if (out := self._account(rec)) is not None:
                        yield out

    async def raw_batches(self, concurrency: int = 64) -> AsyncIterator[list[RawLedger]]:
        """Every ledger's znode as read, not decoded, in id order and in batches (those of
        `ledgers`), for a reader that decodes its own way: the index packs the bytes
        straight into its records (`index.decode`) instead of building `LedgerMetadata`.

        The walk's `stats` count ledgers and those deleted during the walk; `corrupt` is
        left to the reader, which is the one to decode. A subclass's `read` hook is not
        consulted (it hands out records, not bytes)."""
        size, depth = batch_shape(concurrency)
        if self.store.ranged:
            batch: list[RawLedger] = []
            async with aclosing(RangedWalk(self.store, self.judge, size * depth).items()) as ranged:
                async for ledger_id, path, item in ranged:
                    batch.append((ledger_id, path, item.data, item.stat))
                    if len(batch) >= size:
                        self.stats.ledgers += len(batch)
                        yield batch
                        batch = []
            if batch:
                self.stats.ledgers += len(batch)
                yield batch
            return
        async with aclosing(self._windowed(size, depth, self._read_raw)) as batches:
            async for found in batches:
                read = [raw for raw in found if raw is not None]
                self.stats.deleted_during_walk += len(found) - len(read)
                self.stats.ledgers += len(read)
                if read:
                    yield read

    def _account(self, rec: LedgerRecord | None) -> LedgerRecord | None:
        if rec is None:
            self.stats.deleted_during_walk += 1
            return None
        self.stats.ledgers += 1
        if rec.error is not None:
            self.stats.corrupt += 1
        return rec


def _record(ledger_id: int, path: str, data: bytes, stat: Stat) -> LedgerRecord:
    """A ledger's record from its znode: decoded metadata, or the error that kept it from
    decoding."""
    try:
        md = decode_ledger_metadata(data, ledger_id, znode_ctime=int(stat.ctime))
    except LedgerMetadataFormatError as exc:
        return LedgerRecord(ledger_id, path, None, int(stat.version), exc)
    return LedgerRecord(ledger_id, path, md, int(stat.version))
