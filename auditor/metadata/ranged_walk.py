"""The ledger walk on a store that serves range reads (etcd), where walking by listings
would cost a request per directory and per ledger: here the keys are read in key order,
with their data, in pages of `MetadataStore.read_range`.

How: keys of fixed width sort as their ids do, so each layout's ledgers are a few key
ranges (a `KeyFamily` of `Span`s, in id order: per two-digit top for the hierarchical
trees), the legacy tree before the long one, starting at the key of the IdRange's lower
bound (`Window`); after a span's first request, each request ends at the key of an id a
chunk ahead (etcd's time for a range request grows with all the keys of its range,
whatever its limit: `RangedWalk._pages`). A family whose keys fit in one page is read in
one request. Each key is judged as the ZooKeeper walk judges the znode it would list
(`ledger_tree.ZnodeJudge`; the first component that is no ledger's is the one named; keys
below a ledger, and the ledgers root's own znodes such as LAYOUT, are passed over as the
ZooKeeper walk never lists them), so that the same tree walks to the same records and the
same unexpected znodes on either store. Of a walk of one IdRange, the directories it owns
but that run past the range's end (`Tail`s) are looked through to their end child by
child, without reading the ledgers there. The ordering of names with characters below
"/" (`0000-x` sorts before `0000/...` as a key, after it as a child) is the one place
where the two reports' order may differ. The flat layout is one key range (its misnamed
znodes named by the walk of id 0, as on ZooKeeper); so are BookKeeper's etcd driver's
keys, where a bad key is named by the walk whose key range holds it. A ledger deleted
before its page is read is not seen at all (`deleted_during_walk` counts only where reads
follow a listing).

The keys of each layout, as they are in etcd under the ledgers root `/ledgers` (Pulsar's
etcd metadata store keeps a znode at the key of its path; an `EtcdStore` with a `prefix`
puts the prefix before every key). "0" is the character after "/", ":" the one after "9":

* legacy hierarchical (2-4-4): ledger 42 is the key `/ledgers/00/0000/L0042`, read in the
  span of the top `00`, [`/ledgers/00/`, `/ledgers/000`) (one span per top `00` to `99`).
  A walk of IdRange(1_000_000, 2_000_500) reads [`/ledgers/00/0100/`,
  `/ledgers/00/0200/L0500`) of it, then the rest of `/ledgers/00/0200` from
  `/ledgers/00/0200/L0500` on (a `Tail`: the walk owns that directory) for unexpected
  names only.
* long hierarchical (3-4-4-4-4): ledger 2147483648 (2^31) is the key
  `/ledgers/000/0000/0021/4748/L3648`, read in the span [`/ledgers/000`, `/ledgers/00:`),
  which holds the tops `000` to `009`.
* hierarchical (both trees, ids below 2^31-1 in the legacy one): ledger 42 at
  `/ledgers/00/0000/L0042` is read in the legacy family's [`/ledgers/00/`,
  `/ledgers/000`), then ledger 2147483648 at `/ledgers/000/0000/0021/4748/L3648` in the
  long family's [`/ledgers/000`, `/ledgers/00:`).
* flat: ledger 42 is the key `/ledgers/L0000000042`, read in the one span [`/ledgers/L`,
  `/ledgers/M`), which holds `/ledgers/LAYOUT` too (passed over).
* BookKeeper's etcd driver (`LedgerManager.ETCD`, the scope `/ledgers` of
  `etcd://host:2379/ledgers`): ledger 42 is the key
  `/ledgers/ledgers/00000000-0000-0000-0000-00000000002a` (`UUID(0, 42)`), read in the one
  span [`/ledgers/ledgers/`, `/ledgers/ledgers0`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import NamedTuple

from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_tree import (
    FLAT_LEAF,
    FOUR,
    LEAF,
    LEDGER_SHAPED,
    Tree,
    ZnodeJudge,
    misnamed_reason,
    out_of_range_reason,
    trees_of,
)
from auditor.metadata.paths import (
    ETCD_LEDGERS,
    INT_MAX,
    LONG_MAX,
    InvalidLedgerIdError,
    check_ledger_id,
    etcd_ledger_id,
    etcd_ledger_key,
    is_special_znode,
)
from auditor.store import MetadataStore, RangeItem


class Span(NamedTuple):
    """The keys [start, end) of one key range, in key order."""

    start: str
    end: str


class SpanIds(NamedTuple):
    """The first and last ids the leaf keys of a span can spell (first > last: none)."""

    first: int
    last: int


@dataclass(frozen=True, slots=True)
class KeyFamily:
    """Keys of one kind under the root: a tree of the hierarchical layouts (`tree`), the
    flat layout's leaves, or BookKeeper's etcd ledger keys; their key ranges in id order."""

    tree: Tree | None
    spans: tuple[Span, ...]
    #: The ids its keys can spell (the span of ids its windows are cut from).
    capacity: int


class Directory(NamedTuple):
    """A directory above a ledger's key: the digits its path spells, and the path."""

    digits: str
    path: str


class Tail(NamedTuple):
    """A directory a walk of an IdRange owns that runs past the range's end: its children
    from the key `rest` on are looked through for unexpected ones (`leaves`: it is the
    directory of the ledgers' keys themselves)."""

    directory: str
    rest: str
    leaves: bool


class Window(NamedTuple):
    """The keys [start, end) a walk reads of one family ("": no bound), and the tails it
    looks through after them, the deepest first (the order ZooKeeper's depth-first walk
    comes back up in)."""

    start: str
    end: str
    tails: list[Tail]


class RangedLedger(NamedTuple):
    """A ledger the walk found: its id, its path, and its key's item (data and stat)."""

    ledger_id: int
    path: str
    item: RangeItem


class _ChunkEnd(NamedTuple):
    """Where a request of `_pages` ends: the key of an id a chunk ahead (`ledger_id`), or
    the end of the keys read (`ledger_id` None)."""

    key: str
    ledger_id: int | None


def _after(key: str) -> str:
    """The smallest key above `key`."""
    return key + "\x00"


def _subtree_end(path: str) -> str:
    """Where the keys below `path/` end ("0" is the character after "/")."""
    return path + "0"


class RangedWalk:
    """One walk of `judge`'s root on `store` by range reads of `page` keys (the module
    docstring). What it finds goes to `judge.stats` exactly as the ZooKeeper walk's
    findings do."""

    def __init__(self, store: MetadataStore, judge: ZnodeJudge, page: int) -> None:
        self.store = store
        self.judge = judge
        self.root = judge.root
        self.manager = judge.manager
        self.id_range = judge.id_range
        self.page = max(page, 1)
        #: The nodes named lately whose keys below may still come (a node is named once).
        self._named: list[str] = []

    # --- the key ranges --------------------------------------------------------------
    def _families(self, *, pruned: bool = True) -> list[KeyFamily]:
        """The key families of the walk's manager, their spans pruned to the walk's id
        range unless not `pruned` (the largest id is looked for in the whole tree, as the
        ZooKeeper walk does)."""
        r = self.root
        if self.manager is LedgerManager.ETCD:
            ledgers = Span(f"{r}/{ETCD_LEDGERS}/", f"{r}/{ETCD_LEDGERS}0")
            return [KeyFamily(None, (ledgers,), LONG_MAX)]
        if self.manager is LedgerManager.FLAT:
            return [KeyFamily(None, (Span(f"{r}/L", f"{r}/M"),), 10**10 - 1)]
        families = []
        for tree in trees_of(self.manager):
            tops = [f"{dd:02d}" for dd in range(100)]
            if tree.digits % 4 == 2:  # the 2-4-4 tree: `<root>/DD/...`
                spans = [Span(f"{r}/{dd}/", f"{r}/{dd}0") for dd in tops]
            else:  # the 3-4-4-4-4 tree: `<root>/DD0/...` to `<root>/DD9/...`
                spans = [Span(f"{r}/{dd}0", f"{r}/{dd}:") for dd in tops]
            rng = self.id_range if pruned else None
            below = tree.digits - 2
            kept = tuple(
                span
                for dd, span in zip(tops, spans, strict=True)
                if rng is None or rng.contains_prefix(dd, below)
            )
            families.append(KeyFamily(tree, kept, min(10**tree.digits - 1, LONG_MAX)))
        return families

    def _leaf_key(self, family: KeyFamily, ledger_id: int) -> str:
        """The key a ledger of this id has in `family` (ids within its capacity)."""
        tree = family.tree
        if tree is None:
            if self.manager is LedgerManager.ETCD:
                return etcd_ledger_key(self.root, ledger_id)
            return f"{self.root}/L{ledger_id:010d}"
        digits = f"{ledger_id:0{tree.digits}d}"
        return "/".join([self.root, *self._components(tree, digits)])

    @staticmethod
    def _components(tree: Tree, digits: str) -> list[str]:
        top = tree.digits % 4
        middle = [digits[i : i + 4] for i in range(top, tree.digits - 4, 4)]
        return [digits[:top], *middle, "L" + digits[-4:]]

    def _dirs(self, tree: Tree, digits: str) -> list[Directory]:
        """Each directory above the leaf of the id `digits` spells, the top one first."""
        out = []
        path, prefix = self.root, ""
        for name in self._components(tree, digits)[:-1]:
            path, prefix = f"{path}/{name}", prefix + name
            out.append(Directory(prefix, path))
        return out

    def _window(self, family: KeyFamily) -> Window:
        """What this walk reads of `family`, and the directories it owns that run past its
        end."""
        rng = self.id_range
        start, end = "", ""
        tails: list[Tail] = []
        if rng is None:
            return Window(start, end, tails)
        tree = family.tree
        if 0 < rng.lo <= family.capacity:
            start = self._leaf_key(family, rng.lo)
            if tree is not None:
                for d in self._dirs(tree, f"{rng.lo:0{tree.digits}d}"):
                    if int(d.digits) * 10 ** tree.below(d.digits) == rng.lo:
                        # The first directory that is this walk's: all of its children.
                        start = d.path + "/"
                        break
        elif rng.lo > family.capacity:
            start = family.spans[-1].end if family.spans else ""
        if rng.last or rng.hi > family.capacity:
            return Window(start, end, tails)
        end = self._leaf_key(family, rng.hi)
        if tree is not None:
            dirs = self._dirs(tree, f"{rng.hi:0{tree.digits}d}")
            for i, d in enumerate(dirs):
                if rng.lo <= int(d.digits) * 10 ** tree.below(d.digits) < rng.hi:
                    leaves = i + 1 == len(dirs)
                    rest = end if leaves else _subtree_end(dirs[i + 1].path)
                    tails.append(Tail(d.path, rest, leaves))
            tails.reverse()
        elif self.manager is LedgerManager.FLAT and rng.lo == 0:
            # The walk of id 0 owns the one directory's misnamed znodes, as on ZooKeeper.
            tails.append(Tail(self.root, end, True))
        return Window(start, end, tails)

    # --- reading ---------------------------------------------------------------------
    def _span_ids(self, family: KeyFamily, span: Span) -> SpanIds:
        """The ids the leaf keys of `span` can spell."""
        tree = family.tree
        if tree is None:
            return SpanIds(0, family.capacity)
        below = tree.digits - 2
        dd = int(span.start[len(self.root) + 1 :][:2])
        return SpanIds(dd * 10**below, min((dd + 1) * 10**below - 1, family.capacity))

    def _key_at(self, family: KeyFamily, span: Span, ledger_id: int) -> str:
        """Where the keys of ids from `ledger_id` on begin in `span`: its start for its first
        id or below, its end past its last."""
        ids = self._span_ids(family, span)
        if ledger_id > ids.last:
            return span.end
        if ledger_id <= ids.first:
            return span.start
        return self._leaf_key(family, ledger_id)

    async def _pages(
        self, family: KeyFamily, span: Span, start: str, end: str
    ) -> AsyncGenerator[list[RangeItem], None]:
        """Pages of the keys [start, end) of `span`, the next one read while the last is
        worked through.

        etcd answers a range request in time proportional to every key of its range, not
        only those it returns (it counts them all), so that pages of one long range would
        cost the square of its length: after the first request, each goes to the key of an
        id a chunk of ids ahead, the chunk sized by the ids seen per page (halved when a
        chunk has more than a page, grown while chunks come back sparse)."""
        store = self.store
        page = self.page
        chunk = 0  # ids per request; 0 until the first answer tells the density
        pos, bound = start, _ChunkEnd(end, None)

        def fire(a: str, b: str) -> asyncio.Future[tuple[list[RangeItem], bool]]:
            return asyncio.ensure_future(store.read_range(a, b, limit=page))

        def bounded(from_id: int, after: str) -> _ChunkEnd:
            key = self._key_at(family, span, from_id)
            if key <= after or key >= end:
                return _ChunkEnd(end, None)
            return _ChunkEnd(key, from_id)

        pending: asyncio.Future[tuple[list[RangeItem], bool]] | None = fire(pos, bound.key)
        try:
            while pending is not None:
                items, more = await pending
                pending = None
                ids = [i for i in (self._leaf_id(family, it.path) for it in items) if i is not None]
                if more and items:
                    if chunk == 0:
                        seen = ids[-1] - ids[0] + 1 if len(ids) > 1 else page * 16
                        chunk = max(page, seen * page // max(len(ids), 1))
                    elif bound.ledger_id is not None:
                        chunk = max(page, chunk // 2)
                    pos = _after(items[-1].path)
                    if bound.ledger_id is None:
                        cursor = ids[-1] + 1 if ids else self._span_ids(family, span).first
                        bound = bounded(cursor + chunk, pos)
                    pending = fire(pos, bound.key)
                elif bound.ledger_id is not None:
                    # A chunk done, short of `end`: the next one.
                    if len(items) * 4 < page:
                        chunk *= 4  # sparse here (or empty): a longer one
                    pos = bound.key
                    bound = bounded(bound.ledger_id + chunk, pos)
                    pending = fire(pos, bound.key)
                yield items
        finally:
            if pending is not None:
                pending.cancel()

    def _clip(self, span: Span, start: str, end: str) -> Span | None:
        lo = max(span.start, start)
        hi = min(span.end, end) if end else span.end
        return Span(lo, hi) if lo < hi else None

    async def _whole(self, family: KeyFamily) -> list[RangeItem] | None:
        """Every key of `family`'s spans when they fit in one page (one request: a small
        tree is not read top by top); None when there are more."""
        spans = family.spans
        if not spans:
            return []
        items, more = await self.store.read_range(spans[0].start, spans[-1].end, limit=self.page)
        if more:
            return None
        return [it for it in items if any(a <= it.path < b for a, b in spans)]

    def _ledger_of(self, family: KeyFamily, item: RangeItem) -> RangedLedger | None:
        path = self._judge(family, item.path)
        if path is None:
            return None
        ledger_id = self._checked(family, path)
        return None if ledger_id is None else RangedLedger(ledger_id, path, item)

    async def items(self) -> AsyncGenerator[RangedLedger, None]:
        """Every ledger of the walk, in id order."""
        for family in self._families():
            self._named = []
            window = self._window(family)
            whole = await self._whole(family) if self.id_range is None else None
            if whole is not None:
                for item in whole:
                    if (found := self._ledger_of(family, item)) is not None:
                        yield found
            for span in family.spans if whole is None else ():
                clipped = self._clip(span, window.start, window.end)
                if clipped is None:
                    continue
                async with aclosing(self._pages(family, span, *clipped)) as pages:
                    async for page in pages:
                        for item in page:
                            if (found := self._ledger_of(family, item)) is not None:
                                yield found
            for tail in window.tails:
                await self._tail(family, tail)

    async def _tail(self, family: KeyFamily, tail: Tail) -> None:
        """The children of the tail's directory from its `rest` on, for the unexpected ones
        among them: the leaves' directory in pages, any other one child by child (a read
        each, its subtree skipped: its ids are past this walk's)."""
        directory = tail.directory
        end = family.spans[-1].end if family.tree is None else _subtree_end(directory)
        limit = self.page if tail.leaves else 1
        pos = tail.rest
        while pos < end:
            found, _ = await self.store.read_range(pos, end, limit=limit)
            if not found:
                return
            for item in found:
                self._judge(family, item.path)
            last = found[-1].path
            child = f"{directory}/{last[len(directory) + 1 :].split('/', 1)[0]}"
            pos = _after(last) if last == child or tail.leaves else _subtree_end(child)

    # --- judging one key ---------------------------------------------------------------
    def _once(self, node: str, key: str) -> bool:
        """Whether `node` (named by `key`, itself or a key below it) is not named yet."""
        self._named = [n for n in self._named if key < _subtree_end(n)]
        if node in self._named:
            return False
        self._named.append(node)
        return True

    def _judge(self, family: KeyFamily, key: str) -> str | None:
        """The ledger path `key` is, or None (an unexpected node is named, once, by the
        walk that owns it; directories, keys below ledgers and keys ZooKeeper's walk
        does not look at are passed over)."""
        rel = key[len(self.root) + 1 :]
        if family.tree is not None:
            return self._judge_tree(family.tree, key, rel.split("/"))
        if self.manager is LedgerManager.ETCD:
            return key  # every key under `ledgers/` stands for a ledger (`_checked`)
        name = rel.split("/", 1)[0]
        node = f"{self.root}/{name}"
        if FLAT_LEAF.match(name):
            rng = self.id_range
            ok = key == node and (rng is None or rng.contains_prefix(name[1:], 0))
            return node if ok else None
        if self.judge.owns("", 10) and LEDGER_SHAPED.match(name) and self._once(node, key):
            self.judge.invalid(node, misnamed_reason(name, 10))
        return None

    def _judge_tree(self, tree: Tree, key: str, parts: list[str]) -> str | None:
        judge, rng = self.judge, self.id_range
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
                if not judge.owns(prefix, 4) or not self._once(node, key):
                    return None
                if not judge.misnamed(node, name, 4) and not is_special_znode(name):
                    judge.foreign(node)
                return None
            if not FOUR.match(name):
                if judge.owns(prefix, tree.below(prefix)) and self._once(node, key):
                    judge.foreign(node)
                return None
            prefix += name
            if rng is not None and not rng.contains_prefix(prefix, tree.below(prefix)):
                return None
        return None

    def _checked(self, family: KeyFamily, path: str) -> int | None:
        if family.tree is not None or self.manager is not LedgerManager.ETCD:
            return self.judge.ledger_id(path)
        name = path[len(self.root) + len(ETCD_LEDGERS) + 2 :]
        try:
            ledger_id = etcd_ledger_id(name, where=path)
        except InvalidLedgerIdError as exc:
            self.judge.invalid(path, out_of_range_reason(path, exc))
            return None
        except ValueError as exc:
            self.judge.invalid(path, str(exc).removeprefix(f"{path}: "))
            return None
        rng = self.id_range
        return ledger_id if rng is None or ledger_id in rng else None

    # --- the largest id ------------------------------------------------------------------
    def _leaf_id(self, family: KeyFamily, key: str) -> int | None:
        """The id of a ledger `key` is, as the walk would yield it; None otherwise (and
        nothing named: this is for estimates)."""
        rel = key[len(self.root) + 1 :]
        parts = rel.split("/")
        tree = family.tree
        try:
            if tree is None:
                if self.manager is LedgerManager.ETCD:
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
        if self.manager is LedgerManager.HIERARCHICAL and (tree.digits == 10) != (
            ledger_id < INT_MAX
        ):
            return None
        return ledger_id

    async def _first_from(self, family: KeyFamily, start: str, end: str) -> int | None:
        """The first ledger id of `family` in the keys [start, end) (ranges kept short by
        the caller: see `_pages` on what a long one costs)."""
        pos = start
        while pos < end:
            items, more = await self.store.read_range(pos, end, limit=self.page)
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
