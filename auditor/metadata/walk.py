"""A streaming walk of the ledger tree, in ledger-id order.

Large clusters hold tens of millions of ledgers, so nothing here materialises
the whole id set: the walk descends one bucket at a time (at most 10,000
children per listing in the hierarchical layouts) and metadata reads are
pipelined with a bounded window that yields results in id order. Reads go in
batches (`MetadataStore.get_many`: one ZooKeeper multiRead and one asyncio future
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

On a store that serves range reads (`MetadataStore.ranged`: etcd) the walk reads keys in
key order instead, in pages of `read_range` (`RangedWalk`): no listing, no separate read
of each ledger. Keys of fixed width sort as their ids do, so each tree is read as a few
key ranges (per two-digit top: `<root>/DD/...` for the 2-4-4 tree, `<root>/DD0` to
`<root>/DD9` for the 3-4-4-4-4 tree), the legacy tree before the long one, starting at
the key of the IdRange's lower bound; after a span's first request, each request ends at
the key of an id a chunk ahead (etcd's time for a range request grows with all the keys
of its range, whatever its limit: `RangedWalk._pages`). Each key is judged as the
ZooKeeper walk judges the znode it would list (the first component that is no ledger's
is the one named; keys below a ledger, and the ledgers root's own znodes such as LAYOUT,
are passed over as the ZooKeeper walk never lists them), so that the same tree walks to
the same records and the same unexpected znodes on either store. Of a walk of one
IdRange, the directories it owns (`_owns`) but that run past the range's end are looked
through to their end child by child, without reading the ledgers there. The ordering of
names with characters below "/" (`0000-x` sorts before `0000/...` as a key, after it as
a child) is the one place where the two reports' order may differ. The flat layout is
one key range (its misnamed znodes named by the walk of id 0, as on ZooKeeper); so are
BookKeeper's etcd driver's keys (`LedgerManager.ETCD`, `<root>/ledgers/<UUID>`), where a
bad key is named by the walk whose key range holds it. A ledger deleted before its page
is read is not seen at all (`deleted_during_walk` counts only where reads follow a
listing).
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Protocol

from auditor.errors import ConfigError
from auditor.metadata.layout import LedgerManager
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.paths import (
    ETCD_LEDGERS,
    INT_MAX,
    LONG_MAX,
    InvalidLedgerIdError,
    check_ledger_id,
    etcd_ledger_id,
    etcd_ledger_key,
    is_special_znode,
    ledger_id_from_path,
    ledger_path,
)
from auditor.metadata.serde import LedgerMetadataFormatError, decode_ledger_metadata
from auditor.store import MetadataStore, NoNodeError, RangeItem, Stat

_TWO = re.compile(r"^\d{2}$")
_THREE = re.compile(r"^\d{3}$")
FOUR = re.compile(r"^\d{4}$")
LEAF = re.compile(r"^L\d{4}$")
FLAT_LEAF = re.compile(r"^L\d{10}$")
#: A name shaped like a ledger's (L and digits), whatever the count of digits.
LEDGER_SHAPED = re.compile(r"^L\d+$")
#: The top directories of the hierarchical trees (2-4-4, 3-4-4-4-4).
TREE_TOP = re.compile(r"^\d{2,3}$")
WRONG_LAYOUT_FLAT = (
    "a hierarchical ledger directory, but LAYOUT names the flat ledger manager: "
    "no ledger under it is read"
)
WRONG_LAYOUT_HIERARCHICAL = (
    "a flat ledger znode, but LAYOUT names the hierarchical ledger manager: it is not read"
)
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


class NotRangedError(ConfigError):
    """BookKeeper's etcd ledger manager on a store without range reads (ZooKeeper)."""


class LedgerWalker:
    """Walks one ledgers root. `stats` fills in as the walk proceeds."""

    def __init__(
        self,
        zk: MetadataStore,
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
        if manager is LedgerManager.ETCD and not zk.ranged:
            raise NotRangedError(
                f"{self.root}: LAYOUT names BookKeeper's etcd ledger manager, whose ledgers "
                f"are etcd keys, but the metadata store is {zk.where}"
            )

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
                path = f"{self.root}/{name}"
                if not self._misnamed(path, name, 10) and TREE_TOP.match(name):
                    # Ledgers the layout cannot read: a silent "0 ledgers, all clear" else.
                    self._invalid(path, WRONG_LAYOUT_FLAT)

    async def _name_flat_strays(self) -> None:
        """Flat ledger znodes at the root of a hierarchical layout: named, never read
        (the layout says where ledgers are; these are not there)."""
        if self._owns("", 10):
            for name in await self._children(self.root):
                if LEDGER_SHAPED.match(name):
                    self._invalid(f"{self.root}/{name}", WRONG_LAYOUT_HIERARCHICAL)

    async def ledger_paths(self) -> AsyncGenerator[tuple[int, str], None]:
        """(ledger id, znode path) in ascending id order."""
        if self.zk.ranged:
            async with aclosing(RangedWalk(self, 1024).items()) as ranged:
                async for ledger_id, path, _ in ranged:
                    yield ledger_id, path
            return
        if self.manager is LedgerManager.FLAT:
            sources = [self._flat_paths()]
        else:
            # Hierarchical: ids below INT_MAX live in the 2-4-4 tree, the rest in
            # the 3-4-4-4-4 tree, so the two walks in turn are in id order.
            sources = [self._tree(t) for t in trees_of(self.manager)]
            if self.manager is LedgerManager.HIERARCHICAL:
                await self._name_flat_strays()
        for source in sources:
            async for path in source:
                found = self._ledger_id(path)
                if found is not None:
                    yield found, path

    def _ledger_id(self, path: str) -> int | None:
        """The id of a ledger-shaped path found by the walk, or None: it is named instead
        (an id beyond 2^63-1, a ledger filed under the other tree than its id's)."""
        try:
            ledger_id = ledger_id_from_path(self.root, path)
        except InvalidLedgerIdError as exc:
            # Only the last range gets here (the others prune such paths).
            self._invalid(path, out_of_range_reason(path, exc))
            return None
        legacy = path.count("/") - self.root.count("/") == 3
        if self.manager is LedgerManager.HIERARCHICAL and legacy != (ledger_id < INT_MAX):
            # A ledger filed under the other tree than its id says: the
            # Java manager would not find it by id either.
            tree = "legacy (2-4-4)" if legacy else "long (3-4-4-4-4)"
            self._foreign(path, f"ledger {ledger_id} filed under the {tree} tree, not its own")
            return None
        return ledger_id

    async def max_ledger_id(self) -> int | None:
        """The largest ledger id, from the last child at each level (for ETAs); a walk of
        one id range says no more than its range's last id, so that its ETA is its own."""
        found = await self._max_ledger_id()
        if found is not None and self.id_range is not None and not self.id_range.last:
            return min(found, self.id_range.hi - 1)
        return found

    async def _max_ledger_id(self) -> int | None:
        if self.zk.ranged:
            return await RangedWalk(self, 64).max_ledger_id()
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
        if self.zk.ranged:
            hooked = type(self).read is not LedgerWalker.read
            async with aclosing(RangedWalk(self, size * depth).items()) as ranged:
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


def _record(ledger_id: int, path: str, data: bytes, stat: Stat) -> LedgerRecord:
    """A ledger's record from its znode: decoded metadata, or the error that kept it from
    decoding."""
    try:
        md = decode_ledger_metadata(data, ledger_id, znode_ctime=int(stat.ctime))
    except LedgerMetadataFormatError as exc:
        return LedgerRecord(ledger_id, path, None, int(stat.version), exc)
    return LedgerRecord(ledger_id, path, md, int(stat.version))


def _after(key: str) -> str:
    """The smallest key above `key`."""
    return key + "\x00"


def _subtree_end(path: str) -> str:
    """Where the keys below `path/` end ("0" is the character after "/")."""
    return path + "0"


@dataclass(frozen=True, slots=True)
class _Family:
    """Keys of one kind under the root: a tree of the hierarchical layouts (`tree`), the
    flat layout's leaves, or BookKeeper's etcd ledger keys; their key ranges in id order."""

    tree: Tree | None
    spans: list[tuple[str, str]]
    #: The ids its keys can spell (the span of ids its windows are cut from).
    capacity: int


class RangedWalk:
    """One walk of `walker`'s root by range reads of `page` keys (the module docstring).

    What it finds goes to `walker.stats` exactly as the ZooKeeper walk's findings do."""

    def __init__(self, walker: LedgerWalker, page: int) -> None:
        self.w = walker
        self.root = walker.root
        self.page = max(page, 1)
        #: The nodes named lately whose keys below may still come (a node is named once).
        self._named: list[str] = []

    # --- the key ranges --------------------------------------------------------------
    def _families(self, *, pruned: bool = True) -> list[_Family]:
        """The key families of the walk's manager, their spans pruned to the walk's id
        range unless not `pruned` (the largest id is looked for in the whole tree, as the
        ZooKeeper walk does)."""
        r = self.root
        manager = self.w.manager
        if manager is LedgerManager.ETCD:
            return [_Family(None, [(f"{r}/{ETCD_LEDGERS}/", f"{r}/{ETCD_LEDGERS}0")], LONG_MAX)]
        if manager is LedgerManager.FLAT:
            return [_Family(None, [(f"{r}/L", f"{r}/M")], 10**10 - 1)]
        families = []
        for tree in trees_of(manager):
            tops = [f"{dd:02d}" for dd in range(100)]
            if tree.digits % 4 == 2:  # the 2-4-4 tree: `<root>/DD/...`
                spans = [(f"{r}/{dd}/", f"{r}/{dd}0") for dd in tops]
            else:  # the 3-4-4-4-4 tree: `<root>/DD0/...` to `<root>/DD9/...`
                spans = [(f"{r}/{dd}0", f"{r}/{dd}:") for dd in tops]
            rng = self.w.id_range if pruned else None
            below = tree.digits - 2
            kept = [
                span
                for dd, span in zip(tops, spans, strict=True)
                if rng is None or rng.contains_prefix(dd, below)
            ]
            families.append(_Family(tree, kept, min(10**tree.digits - 1, LONG_MAX)))
        return families

    def _leaf_key(self, family: _Family, ledger_id: int) -> str:
        """The key a ledger of this id has in `family` (ids within its capacity)."""
        tree = family.tree
        if tree is None:
            if self.w.manager is LedgerManager.ETCD:
                return etcd_ledger_key(self.root, ledger_id)
            return f"{self.root}/L{ledger_id:010d}"
        digits = f"{ledger_id:0{tree.digits}d}"
        return "/".join([self.root, *self._components(tree, digits)])

    @staticmethod
    def _components(tree: Tree, digits: str) -> list[str]:
        top = tree.digits % 4
        middle = [digits[i : i + 4] for i in range(top, tree.digits - 4, 4)]
        return [digits[:top], *middle, "L" + digits[-4:]]

    def _dirs(self, tree: Tree, digits: str) -> list[tuple[str, str]]:
        """(digits it spells, path) of each directory above a leaf, the top one first."""
        out = []
        path, prefix = self.root, ""
        for name in self._components(tree, digits)[:-1]:
            path, prefix = f"{path}/{name}", prefix + name
            out.append((prefix, path))
        return out

    def _window(self, family: _Family) -> tuple[str, str, list[tuple[str, str, bool]]]:
        """The keys [start, end) this walk reads of `family` ("": no bound), and the
        directories it owns that run past its end: (directory, where their rest starts,
        whether it holds the leaves), the deepest first (the order ZooKeeper's
        depth-first walk comes back up in)."""
        rng = self.w.id_range
        start, end = "", ""
        tails: list[tuple[str, str, bool]] = []
        if rng is None:
            return start, end, tails
        tree = family.tree
        if 0 < rng.lo <= family.capacity:
            start = self._leaf_key(family, rng.lo)
            if tree is not None:
                digits = f"{rng.lo:0{tree.digits}d}"
                for prefix, path in self._dirs(tree, digits):
                    if int(prefix) * 10 ** tree.below(prefix) == rng.lo:
                        # The first directory that is this walk's: all of its children.
                        start = path + "/"
                        break
        elif rng.lo > family.capacity:
            start = family.spans[-1][1] if family.spans else ""
        if rng.last or rng.hi > family.capacity:
            return start, end, tails
        end = self._leaf_key(family, rng.hi)
        if tree is not None:
            dirs = self._dirs(tree, f"{rng.hi:0{tree.digits}d}")
            for i, (prefix, path) in enumerate(dirs):
                if rng.lo <= int(prefix) * 10 ** tree.below(prefix) < rng.hi:
                    leaves = i + 1 == len(dirs)
                    rest = end if leaves else _subtree_end(dirs[i + 1][1])
                    tails.append((path, rest, leaves))
            tails.reverse()
        elif self.w.manager is LedgerManager.FLAT and rng.lo == 0:
            # The walk of id 0 owns the one directory's misnamed znodes, as on ZooKeeper.
            tails.append((self.root, end, True))
        return start, end, tails

    # --- reading ---------------------------------------------------------------------
    def _span_ids(self, family: _Family, span: tuple[str, str]) -> tuple[int, int]:
        """The first and last ids the leaf keys of `span` can spell (first > last: none)."""
        tree = family.tree
        if tree is None:
            return 0, family.capacity
        below = tree.digits - 2
        dd = int(span[0][len(self.root) + 1 :][:2])
        return dd * 10**below, min((dd + 1) * 10**below - 1, family.capacity)

    def _key_at(self, family: _Family, span: tuple[str, str], ledger_id: int) -> str:
        """Where the keys of ids from `ledger_id` on begin in `span`: its start for its first
        id or below, its end past its last."""
        first, last = self._span_ids(family, span)
        if ledger_id > last:
            return span[1]
        if ledger_id <= first:
            return span[0]
        return self._leaf_key(family, ledger_id)

    async def _pages(
        self, family: _Family, span: tuple[str, str], start: str, end: str
    ) -> AsyncGenerator[list[RangeItem], None]:
        """Pages of the keys [start, end) of `span`, the next one read while the last is
        worked through.

        etcd answers a range request in time proportional to every key of its range, not
        only those it returns (it counts them all), so that pages of one long range would
        cost the square of its length: after the first request, each goes to the key of an
        id a chunk of ids ahead, the chunk sized by the ids seen per page (halved when a
        chunk has more than a page, grown while chunks come back sparse)."""
        store = self.w.zk
        page = self.page
        chunk = 0  # ids per request; 0 until the first answer tells the density
        pos, cend, cend_id = start, end, -1

        def fire(a: str, b: str) -> asyncio.Future[tuple[list[RangeItem], bool]]:
            return asyncio.ensure_future(store.read_range(a, b, limit=page))

        def bounded(from_id: int, after: str) -> tuple[str, int]:
            key = self._key_at(family, span, from_id)
            if key <= after or key >= end:
                return end, -1
            return key, from_id

        pending: asyncio.Future[tuple[list[RangeItem], bool]] | None = fire(pos, cend)
        try:
            while pending is not None:
                items, more = await pending
                pending = None
                ids = [i for i in (self._leaf_id(family, it.path) for it in items) if i is not None]
                if more and items:
                    if chunk == 0:
                        seen = ids[-1] - ids[0] + 1 if len(ids) > 1 else page * 16
                        chunk = max(page, seen * page // max(len(ids), 1))
                    elif cend_id >= 0:
                        chunk = max(page, chunk // 2)
                    pos = _after(items[-1].path)
                    if cend_id < 0:
                        cursor = ids[-1] + 1 if ids else self._span_ids(family, span)[0]
                        cend, cend_id = bounded(cursor + chunk, pos)
                    pending = fire(pos, cend)
                elif cend_id >= 0:
                    # A chunk done, short of `end`: the next one.
                    if len(items) * 4 < page:
                        chunk *= 4  # sparse here (or empty): a longer one
                    pos = cend
                    cend, cend_id = bounded(cend_id + chunk, pos)
                    pending = fire(pos, cend)
                yield items
        finally:
            if pending is not None:
                pending.cancel()

    def _clip(self, span: tuple[str, str], start: str, end: str) -> tuple[str, str] | None:
        lo = max(span[0], start)
        hi = min(span[1], end) if end else span[1]
        return (lo, hi) if lo < hi else None

    async def _whole(self, family: _Family) -> list[RangeItem] | None:
        """Every key of `family`'s spans when they fit in one page (one request: a small
        tree is not read top by top); None when there are more."""
        if not family.spans:
            return []
        items, more = await self.w.zk.read_range(
            family.spans[0][0], family.spans[-1][1], limit=self.page
        )
        if more:
            return None
        spans = family.spans
        return [it for it in items if any(a <= it.path < b for a, b in spans)]

    def _ledger_of(self, family: _Family, item: RangeItem) -> tuple[int, str] | None:
        path = self._judge(family, item.path)
        if path is None:
            return None
        ledger_id = self._checked(family, path)
        return None if ledger_id is None else (ledger_id, path)

    async def items(self) -> AsyncGenerator[tuple[int, str, RangeItem], None]:
        """(ledger id, path, its item) of every ledger of the walk, in id order."""
        for family in self._families():
            self._named = []
            start, end, tails = self._window(family)
            whole = await self._whole(family) if self.w.id_range is None else None
            if whole is not None:
                for item in whole:
                    if (found := self._ledger_of(family, item)) is not None:
                        yield found[0], found[1], item
            for span in family.spans if whole is None else []:
                clipped = self._clip(span, start, end)
                if clipped is None:
                    continue
                async with aclosing(self._pages(family, span, *clipped)) as pages:
                    async for page in pages:
                        for item in page:
                            if (found := self._ledger_of(family, item)) is not None:
                                yield found[0], found[1], item
            for directory, rest, leaves in tails:
                await self._tail(family, directory, rest, leaves=leaves)

    async def _tail(self, family: _Family, directory: str, rest: str, *, leaves: bool) -> None:
        """The children of `directory` from `rest` on, for the unexpected ones among them:
        the leaves' directory in pages, any other one child by child (a read each, its
        subtree skipped: its ids are past this walk's)."""
        end = family.spans[-1][1] if family.tree is None else _subtree_end(directory)
        limit = self.page if leaves else 1
        pos = rest
        while pos < end:
            found, _ = await self.w.zk.read_range(pos, end, limit=limit)
            if not found:
                return
            for item in found:
                self._judge(family, item.path)
            last = found[-1].path
            child = f"{directory}/{last[len(directory) + 1 :].split('/', 1)[0]}"
            pos = _after(last) if last == child or leaves else _subtree_end(child)

    # --- judging one key ---------------------------------------------------------------
    def _once(self, node: str, key: str) -> bool:
        """Whether `node` (named by `key`, itself or a key below it) is not named yet."""
        self._named = [n for n in self._named if key < _subtree_end(n)]
        if node in self._named:
            return False
        self._named.append(node)
        return True

    def _judge(self, family: _Family, key: str) -> str | None:
        """The ledger path `key` is, or None (an unexpected node is named, once, by the
        walk that owns it; directories, keys below ledgers and keys ZooKeeper's walk
        does not look at are passed over)."""
        rel = key[len(self.root) + 1 :]
        if family.tree is not None:
            return self._judge_tree(family.tree, key, rel.split("/"))
        if self.w.manager is LedgerManager.ETCD:
            return key  # every key under `ledgers/` stands for a ledger (`_checked`)
        name = rel.split("/", 1)[0]
        node = f"{self.root}/{name}"
        if FLAT_LEAF.match(name):
            rng = self.w.id_range
            ok = key == node and (rng is None or rng.contains_prefix(name[1:], 0))
            return node if ok else None
        if self.w._owns("", 10) and LEDGER_SHAPED.match(name) and self._once(node, key):
            self.w._invalid(node, misnamed_reason(name, 10))
        return None

    def _judge_tree(self, tree: Tree, key: str, parts: list[str]) -> str | None:
        w, rng = self.w, self.w.id_range
        top = parts[0]
        if not tree.top.match(top):
            return None
        if rng is not None and not rng.contains_prefix(top, tree.below(top)):
            return None
        prefix, node = top, f"{self.root}/{top}"
        for i, name in enumerate(parts[1:], 1):
            node = f"{node}/{name}"
            if len(prefix) + 4 == tree.digits:  # the leaves' level
                if LEAF.match(name):
                    last = i == len(parts) - 1
                    if last and (rng is None or rng.contains_prefix(prefix + name[1:], 0)):
                        return node
                    return None
                if not w._owns(prefix, 4) or not self._once(node, key):
                    return None
                if not w._misnamed(node, name, 4) and not is_special_znode(name):
                    w._foreign(node)
                return None
            if not FOUR.match(name):
                if w._owns(prefix, tree.below(prefix)) and self._once(node, key):
                    w._foreign(node)
                return None
            prefix += name
            if rng is not None and not rng.contains_prefix(prefix, tree.below(prefix)):
                return None
        return None

    def _checked(self, family: _Family, path: str) -> int | None:
        if family.tree is not None or self.w.manager is not LedgerManager.ETCD:
            return self.w._ledger_id(path)
        name = path[len(self.root) + len(ETCD_LEDGERS) + 2 :]
        try:
            ledger_id = etcd_ledger_id(name, where=path)
        except InvalidLedgerIdError as exc:
            self.w._invalid(path, out_of_range_reason(path, exc))
            return None
        except ValueError as exc:
            self.w._invalid(path, str(exc).removeprefix(f"{path}: "))
            return None
        rng = self.w.id_range
        return ledger_id if rng is None or ledger_id in rng else None

    # --- the largest id ------------------------------------------------------------------
    def _leaf_id(self, family: _Family, key: str) -> int | None:
        """The id of a ledger `key` is, as the walk would yield it; None otherwise (and
        nothing named: this is for estimates)."""
        rel = key[len(self.root) + 1 :]
        parts = rel.split("/")
        tree = family.tree
        try:
            if tree is None:
                if self.w.manager is LedgerManager.ETCD:
                    return etcd_ledger_id(rel[len(ETCD_LEDGERS) + 1 :])
                return int(rel[1:]) if FLAT_LEAF.match(rel) else None
            if len(parts) != (tree.digits - tree.digits % 4) // 4 + 1:
                return None
            if not tree.top.match(parts[0]) or not LEAF.match(parts[-1]):
                return None
            if not all(FOUR.match(p) for p in parts[1:-1]):
                return None
            ledger_id = check_ledger_id(int("".join(parts).replace("L", "")))
        except ValueError:
            return None
        if self.w.manager is LedgerManager.HIERARCHICAL and (tree.digits == 10) != (
            ledger_id < INT_MAX
        ):
            return None
        return ledger_id

    async def _first_from(self, family: _Family, start: str, end: str) -> int | None:
        """The first ledger id of `family` in the keys [start, end) (ranges kept short by
        the caller: see `_pages` on what a long one costs)."""
        pos = start
        while pos < end:
            items, more = await self.w.zk.read_range(pos, end, limit=self.page)
            for item in items:
                found = self._leaf_id(family, item.path)
                if found is not None:
                    return found
            if not more or not items:
                return None
            pos = _after(items[-1].path)
        return None

    async def max_ledger_id(self) -> int | None:
        """The largest ledger id: the last span with a ledger, in it windows of ids growing
        from its top until one holds a ledger, then a binary search below the window's top
        (a few dozen short reads; the ids are not read in bulk)."""
        for family in reversed(self._families(pruned=False)):
            whole = await self._whole(family)
            if whole is not None:
                ids = [i for it in whole if (i := self._leaf_id(family, it.path)) is not None]
                if ids:
                    return max(ids)
                continue
            for span in reversed(family.spans):
                first, top = self._span_ids(family, span)
                if first > top or await self._first_from(family, *span) is None:
                    continue  # one read: cheap where there are few keys, once where many
                known, width = None, self.page
                while known is None and top >= first:
                    low = max(first, top - width + 1)
                    known = await self._first_from(
                        family, self._key_at(family, span, low), self._key_at(family, span, top + 1)
                    )
                    if known is None:
                        top, width = low - 1, width * 16
                if known is None:
                    continue
                while known < top:
                    mid = (known + top + 1) // 2
                    found = await self._first_from(
                        family, self._key_at(family, span, mid), self._key_at(family, span, top + 1)
                    )
                    if found is None:
                        top = mid - 1
                    else:
                        known = found
                return known
        return None
