"""Java's workers and ours take marks from the same `underreplication/ledgers` and
`underreplication/locks`, so a ledger must be locked exactly as Java locks it; the order
of takes, the cost of a take and the fencing of writes are ours to choose, and differ.

The replication worker's queue: taking a marked ledger, unmarking it, releasing it.

A ledger is locked exactly as
`ZkLedgerUnderreplicationManager.getLedgerToRereplicate` locks it: a leaf whose
lock exists is passed over; otherwise its version is read and the ephemeral lock
`locks/urL%010d` (TextFormat `LockDataFormat`, `bookieId: "<holder>"`) is
created. Whoever creates the lock first owns the ledger: NodeExists sends us
to the next candidate. A Java worker, a bookie's garbage collector and we thus
never work on one ledger at once, whatever order each tries the marks in.

Deliberate differences from Java, each for a reason:

* **The order.** Java walks the four hex levels depth first, each level and the
  leaves shuffled, and takes the first ledger it can lock. Here every mark is
  known (the tree listed once when the watch below starts, then kept from its
  events) and the candidates are tried in the order of the queue's `TakeOrder`:
  the worker's ranks them by risk (`worker/risk.py`: fewest copies left, then
  fewest racks, then the oldest mark), so that the ledgers one failure from loss
  are copied first; ties, and a queue without an order, go in a random order of
  this queue's own (as Java's shuffle, so that workers do not all start at the
  same ledger). Each mark and its ledger's metadata are read once, in batches
  (`get_many`), and again only when the watch says the mark changed or its lock
  was released (a worker's commit happens under the lock); the candidates wait
  in a heap. So a take costs what changed since the last one and a few heap
  operations, not a walk of every mark nor a read of every ledger. The one
  candidate about to be locked is read again, its mark and metadata in one
  batch: if either changed since it was ranked (ledger metadata is not watched),
  it is ranked again and tried in its new place. The mark's version kept is the
  one read before the lock was created, as in Java.
* A mark whose name or place is not BookKeeper's (`urL42`, a mark under the
  wrong hex directories, an id outside 0..2^63-1) is never locked: it is a
  corrupt mark for an operator (`underreplication.CorruptMark`), and the
  ledger it seems to name may not be the one meant. Directories that are not
  four lowercase hex digits are not descended: no mark below them is where
  BookKeeper keeps it. A mark in its place whose data does not decode is
  taken, with no missing replicas listed (Java never reads the data either):
  the ledger it names is the ledger to look at.
* The mark is read with `get` (as Pulsar's manager does), not `exists`, so
  the worker learns which bookies the auditor found missing; the version kept
  is the one read before the lock was created, as in Java, so a re-mark after
  that keeps the mark on unmarking.
* Listings are cached, as Java's SubTreeCache does, but kept current by one
  persistent recursive watch on `underreplication` (ZooKeeper 3.6+, as the
  leader's metadata index uses) instead of one-shot watches per directory:
  the cache and the wake-up of an idle worker then cost one watch, not one per
  directory, and no watcher piles up. An idle worker is woken when a node is
  created under `ledgers` (a new mark), deleted under `locks` (a ledger
  freed), or the watch is lost (a connection loss: anything may have changed
  meanwhile; the next take reads everything again); nothing else can make a
  take succeed. The same events mark the ranking out of date (`outdated`), and
  a mark changed or a lock deleted sends that ledger to be read again. Listings
  not cached are read in batches (`get_children_many`), so the first take of a
  queue lists a tree of a hundred thousand marks in some hundreds of requests,
  and the later ones read only what the watch said changed. A server without
  `addWatch` gets Pulsar's behaviour: no cache, every mark read again at each
  take, and a look every second. The cache does not rely on parents being
  nodes of their own: on etcd a hex "directory" is only the keys below it,
  so it comes with its first mark and goes with its last with no event of
  its own. A created node therefore also drops every cached listing above it
  that lacks the way down to it, and a listed directory found gone drops its
  parent's listing.
* Unmarking (versioned delete of the mark) is fenced on our lock, in one
  multi-op with a check of the lock's version, so a worker that lost its lock
  cannot unmark. ZooKeeper's check compares versions only and every new lock
  has version 0, so a lock re-created by another worker after our session
  expired would pass it: `fenced` therefore also refuses, before sending
  anything, when the session that took the lock is no longer ours (kazoo fails
  every request queued across a session expiry, so what was sent before goes
  in the old session or not at all).
* Releasing deletes the lock only while it is still ours (its
  `ephemeralOwner` is our live session), so a late release never frees a lock
  another worker has since taken. A take cancelled or failed after its create
  was sent leaves no lock behind for the life of the session: the next take
  deletes it.

The rate limit `zkReplicationTaskRateLimit` (takes per second) is Guava's
bursty `RateLimiter`, as Java's: the first take is free, the next ones are
spaced 1/rate apart, and up to one second of unused rate is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from auditor.errors import AuditorError
from auditor.metadata.paths import is_valid_ledger_id
from auditor.metadata.records import (
    UNASSIGNED_CTIME,
    RecordFormatError,
    decode_underreplicated_ledger,
    encode_lock_data,
)
from auditor.metadata.underreplication import (
    LIST_BATCH,
    LISTINGS_IN_FLIGHT,
    READ_BATCH,
    READS_IN_FLIGHT,
    decode_plain_mark,
    mark_name,
    mark_problem,
    ur_ledger_path,
    ur_lock_path,
)
from auditor.store import (
    BadVersionError,
    Event,
    EventType,
    FencedOutError,
    Gap,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    Stat,
    StoreUnavailableError,
    WatchUnsupportedError,
)

#: The hex directory levels between `underreplication/ledgers` and a mark.
HEX_LEVELS = 4
_HEX_DIR = re.compile(r"[0-9a-f]{4}")
#: A mark's or lock's name: `urL` and a ledger id's digits (at most 19).
_MARK_OR_LOCK = re.compile(r"urL0*([0-9]{1,19})")
#: How often an idle worker looks again when the server has no persistent watches
#: (Pulsar's manager waits at most this long between walks).
POLL_WITHOUT_WATCH = 1.0


@dataclass(frozen=True, slots=True)
class TakenLedger:
    """A ledger this worker holds the replication lock of."""

    ledger_id: int
    mark_path: str
    #: The mark's version read before the lock was created: unmarking deletes only that.
    #: None for a lock taken with `acquire` (Java's acquireUnderreplicatedLedger): no
    #: version was read, so unmarking leaves any mark alone.
    mark_version: int | None
    lock_path: str
    lock_version: int
    #: The mark's `replica` lines; () when the mark is empty or its data does not decode.
    missing_replicas: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Hold:
    """A lock we hold, and the session that owns it (its `ephemeralOwner`)."""

    taken: TakenLedger
    owner: int


class RateLimiter:
    """Guava's `SmoothBursty` RateLimiter: `rate` permits per second, at most one second
    of unused permits stored, the first permit free; `rate <= 0` is no limit.

    It starts at the first `acquire`, not at construction, so that time spent setting
    up is not stored as a burst."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._stored = 0.0
        self._next_free: float | None = None

    def reserve(self) -> float:
        """Takes one permit; the seconds to wait before using it."""
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        if self._next_free is None:
            self._next_free = now
        if now > self._next_free:
            self._stored = min(self.rate, self._stored + (now - self._next_free) * self.rate)
            self._next_free = now
        wait = self._next_free - now
        spent = min(1.0, self._stored)
        self._stored -= spent
        self._next_free += (1.0 - spent) / self.rate
        return wait

    async def acquire(self) -> None:
        wait = self.reserve()
        if wait > 0:
            await asyncio.sleep(wait)


@dataclass(frozen=True, slots=True)
class MarkRead:
    """One marked ledger as the queue read it, for its `TakeOrder` to rank."""

    ledger_id: int
    #: The mark's `replica` lines; () when it lists none or its data does not decode.
    missing: tuple[str, ...]
    #: Unix seconds: the mark's ctime field (refreshed when a missing bookie is added),
    #: else the znode's ctime, else (a store that keeps no times) when this queue
    #: first saw the mark.
    marked_at: float
    #: The ledger's metadata znode (data, its ctime in ms); None when there is none.
    metadata: bytes | None
    metadata_ctime: int = 0


class TakeOrder(Protocol):
    """The order in which a queue tries the marked ledgers: lower keys first.

    The queue tells it what it read (`learn`), what is gone (`forget`), and asks for
    each ledger's key; the order keeps what it needs between takes (`worker/risk.py`)."""

    def ledger_path(self, ledger_id: int) -> str:
        """Where the ledger's metadata is (read with its mark, in one batch)."""
        ...

    async def prepare(self) -> bool:
        """Before the marks are ranked: reads what ranks depend on besides the marks and
        the ledgers (the registry, racks); True when that changed every ledger's rank."""
        ...

    async def learn(self, reads: Sequence[MarkRead]) -> bool:
        """Ranks these ledgers from what was just read of them; True when other ledgers'
        ranks changed too (a rack source that failed)."""
        ...

    def forget(self, ledger_ids: Iterable[int]) -> None:
        """These ledgers are no longer marked."""
        ...

    def key(self, ledger_id: int) -> tuple[float, ...]:
        """A ledger's place in the order (a ledger never learnt sorts last)."""
        ...


@dataclass(slots=True)
class _Known:
    """A mark the order has ranked, and the versions it was ranked at."""

    path: str
    mark_version: int
    #: The ledger metadata's version; -1 when there was none (or no order reads it).
    metadata_version: int
    #: This queue's random rank among equals.
    tiebreak: float
    first_seen: float


def _ledger_of(path: str) -> int | None:
    """The ledger a mark's or a lock's path names (`urL<digits>`), or None."""
    m = _MARK_OR_LOCK.fullmatch(path.rsplit("/", 1)[-1])
    return int(m.group(1)) if m is not None else None


def _lock_ledger(name: str) -> int | None:
    """The ledger a lock's name is for (`urL%010d`), None for any other name: exactly the
    ids whose `mark_name` the name is."""
    lid = _ledger_of(name)
    if lid is None or not is_valid_ledger_id(lid):
        return None
    return lid if mark_name(lid) == name else None


def _mark_contents(ledger_id: int, data: bytes) -> tuple[tuple[str, ...], int]:
    """(the mark's replicas, its ctime field or UNASSIGNED_CTIME); nothing for data
    that does not decode (the ledger is taken all the same, as Java's worker does)."""
    plain = decode_plain_mark(ledger_id, data, 0)
    if plain is not None:
        return plain.replicas, plain.ctime
    try:
        rec = decode_underreplicated_ledger(data)
    except RecordFormatError:
        return (), UNASSIGNED_CTIME
    return tuple(rec.replicas), rec.ctime_or_unassigned


class ReplicationQueue:
    """One worker's view of the marked ledgers under one ledgers root.

    `holder` is the lock data's `bookieId` (Java writes its host name). `order` ranks
    the marks (None: a random order); `rng` breaks ties (seed it for a reproducible
    order); `rate_limit` is `zkReplicationTaskRateLimit`. One queue per ZooKeeper
    session: the persistent watch it keeps is per client and path. `close` ends the
    watch and releases every lock still held.
    """

    def __init__(
        self,
        store: MetadataStore,
        root: str,
        holder: str,
        *,
        order: TakeOrder | None = None,
        rng: random.Random | None = None,
        rate_limit: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.root = root.rstrip("/")
        self.base = f"{self.root}/underreplication"
        self.ledgers = f"{self.base}/ledgers"
        self.locks = f"{self.base}/locks"
        self.holder = holder
        self.order = order
        self.limiter = RateLimiter(rate_limit)
        self._rng = rng or random.Random()
        self._clock = clock
        self._lock_data = encode_lock_data(holder)
        self._held: dict[str, _Hold] = {}
        #: Locks we may have created without taking the ledger (a take cancelled or failed
        #: after the create was sent): lock path -> our session then. Deleted at the next
        #: take, so that they do not hold the ledger for as long as the session lives.
        self._orphans: dict[str, int] = {}
        self._watch_starting = asyncio.Lock()
        #: Cached listings (path -> children), current while the watch is.
        self._listings: dict[str, list[str]] = {}
        #: Listings being read (path -> how many), and those of them whose children
        #: changed meanwhile: such a listing is used once but not cached.
        self._reading: dict[str, int] = {}
        self._stale: set[str] = set()
        #: Bumped when the watch is added or lost: a listing read across that is not cached.
        self._epoch = 0
        self._watch: asyncio.Task[None] | None = None
        self._watch_supported = True
        #: Set by a change a take may find; a new one at the start of each take.
        self._wake = asyncio.Event()
        #: The marks ranked (ledger id -> what they were ranked at), the ones to read
        #: again (their mark changed, or their lock was released: a commit happens under
        #: it), and an event set when the ranking may be out of date.
        self._known: dict[int, _Known] = {}
        self._dirty: set[int] = set()
        self._outdated = asyncio.Event()
        self._ranking = asyncio.Lock()
        #: The locks as the last refresh listed them (for `queued` without a watch).
        self._locked: list[str] = []
        #: Every mark (ledger id -> path), kept from the watch's events once listed (for
        #: the watch of `_marks_epoch`), and the events that came while it was listed.
        self._marks: dict[int, str] | None = None
        self._marks_epoch = -1
        self._journal: list[Event] | None = None
        #: The candidates: each ranked ledger's key, and a heap of (key, ledger id) in
        #: which an entry whose key is no longer the ledger's is skipped.
        self._keys: dict[int, tuple[float, ...]] = {}
        self._heap: list[tuple[tuple[float, ...], int]] = []
        #: The candidates the last take found locked (by the listing, or by a lock it
        #: could not create: another worker's, made before the watch told us).
        self._found_locked: set[int] = set()
        #: Whether `underreplication/disable` exists, as the watch last told (None: not
        #: known, read it), and how many of its events came (a read across one is not kept).
        self._disabled: bool | None = None
        self._disable_events = 0

    # --- taking -------------------------------------------------------------------

    async def take(self) -> TakenLedger | None:
        """The first marked ledger in the order that we could lock, now locked by us; None
        when no marked ledger is free."""
        await self.limiter.acquire()
        await self._ensure_watch()
        await self._reap_orphans()
        if self._wake.is_set():
            self._wake = asyncio.Event()
        marks = await self.refresh()
        visited: set[str] = set()
        self._found_locked = set()
        # Candidates popped stay candidates (locked, taken: still marked), even when the
        # take is cancelled: back into the heap at the end, unless ranked again meanwhile.
        passed: list[tuple[tuple[float, ...], int]] = []
        try:
            while self._heap:
                key, lid = heapq.heappop(self._heap)
                if self._keys.get(lid) != key:
                    continue  # stale: in the heap again under its new key, or forgotten
                path = marks.get(lid)
                if path is None:
                    del self._keys[lid]  # unmarked: in again (`_rekey`) if marked again
                    continue
                passed.append((key, lid))
                locked = await self._list(self.locks, visited)
                if locked is not None and mark_name(lid) in locked:
                    self._found_locked.add(lid)
                    continue
                read = await self._read_candidate(lid, path)
                if read is None:
                    continue  # unmarked meanwhile
                data, stat, moved = read
                # Ranked again on the way (it or its ledger changed): `_rekey` put it in
                # the heap under its new key; tried now only if that still leads.
                if moved and self._keys.get(lid) != key:
                    again = self._keys.get(lid)
                    if again is None or (self._heap and again > self._heap[0][0]):
                        continue
                taken = await self._try_leaf(lid, path, data, stat)
                if taken == "unmarked":
                    continue  # repaired by another worker as we locked it
                if taken is not None:
                    return taken
                self._found_locked.add(lid)  # locked by another before the listing said so
            return None
        finally:
            for item in passed:
                if self._keys.get(item[1]) == item[0]:
                    heapq.heappush(self._heap, item)

    def _key(self, ledger_id: int) -> tuple[float, ...]:
        known = self._known[ledger_id]
        if self.order is None:
            return (known.tiebreak,)
        return (*self.order.key(ledger_id), known.tiebreak)

    def _rekey(self, ledger_ids: Iterable[int]) -> None:
        """Puts ledgers whose key changed into the heap under their new key (an entry
        under an old key stays behind, skipped when popped)."""
        for lid in ledger_ids:
            if lid not in self._known:
                continue
            key = self._key(lid)
            if self._keys.get(lid) != key:
                self._keys[lid] = key
                heapq.heappush(self._heap, (key, lid))
        if len(self._heap) > 2 * len(self._keys) + 1024:
            self._reheap()

    def _reheap(self) -> None:
        """Every ledger's key computed again, the heap rebuilt without stale entries."""
        self._keys = {lid: self._key(lid) for lid in self._known}
        self._heap = [(key, lid) for lid, key in self._keys.items()]
        heapq.heapify(self._heap)

    def _forget_ids(self, ledger_ids: Sequence[int]) -> None:
        for lid in ledger_ids:
            self._known.pop(lid, None)
            self._keys.pop(lid, None)
        if ledger_ids and self.order is not None:
            self.order.forget(ledger_ids)

    async def _read_candidate(self, lid: int, path: str) -> tuple[bytes, Stat, bool] | None:
        """The mark about to be locked (None: gone), and whether it or its ledger moved
        since ranked (then ranked again, here)."""
        if self.order is None:
            try:
                data, stat = await self.store.get(path)
            except NoNodeError:
                return None
            return data, stat, False
        mark, md = await self.store.get_many([path, self.order.ledger_path(lid)])
        if mark is None:
            return None
        known = self._known.get(lid)
        md_version = -1 if md is None else int(md[1].version)
        if (
            known is not None
            and known.mark_version == int(mark[1].version)
            and known.metadata_version == md_version
        ):
            return mark[0], mark[1], False
        await self._learn([(lid, path, mark, md)])
        return mark[0], mark[1], True

    async def refresh(self) -> dict[int, str]:
        """Brings the ranking up to date; every current mark (ledger id -> its path).

        The marks come from the watch (one listing of the tree when it starts); those
        new, changed or whose lock was released since are read, in batches, and handed
        to the order. Without a watch (a server older than 3.6) nothing says what
        changed, so the tree is listed and every mark read again."""
        async with self._ranking:
            if self._outdated.is_set():
                self._outdated = asyncio.Event()
            if self.order is not None and await self.order.prepare():
                self._reheap()  # the registry or the racks changed every rank
            marks, listed = await self._current_marks()
            self._locked = await self._list(self.locks, set()) or []
            if listed:
                # Listed now: anything may have come or gone (and, without a watch, changed).
                self._forget_ids([lid for lid in self._known if lid not in marks])
                unwatched = self._watch is None
                todo = [
                    lid
                    for lid in marks
                    if unwatched or lid not in self._known or lid in self._dirty
                ]
            else:
                # From the watch: every mark made, changed or removed since is in `_dirty`.
                self._forget_ids([lid for lid in self._dirty if lid not in marks])
                todo = [lid for lid in self._dirty if lid in marks]
            self._dirty.clear()
            if self.order is None:
                # Nothing to rank by: a random order, and no read before the take's.
                now = self._clock()
                new = [lid for lid in todo if lid not in self._known]
                for lid in new:
                    self._known[lid] = _Known(marks[lid], -1, -1, self._rng.random(), now)
                self._rekey(new)
                return marks
            step = max(1, READ_BATCH // 2)  # a mark and its ledger each
            batches = [todo[i : i + step] for i in range(0, len(todo), step)]
            for i in range(0, len(batches), READS_IN_FLIGHT):
                # A change from now on puts a ledger in `_dirty` again: read again next time.
                window = batches[i : i + READS_IN_FLIGHT]
                try:
                    await asyncio.gather(*(self._read_marks(b, marks) for b in window))
                except BaseException:
                    for batch in batches[i:]:
                        self._dirty.update(batch)
                    raise
            return marks

    async def _current_marks(self) -> tuple[dict[int, str], bool]:
        """Every mark in its place (ledger id -> path), and whether the tree was listed for
        it: kept from the watch's events once listed; listed again when the watch starts
        (or there is none). Events that come while the tree is listed are applied on top,
        in their order, so that a listing read before a change does not undo it."""
        if self._marks is not None and self._watch is not None and self._marks_epoch == self._epoch:
            return self._marks, False
        epoch = self._epoch
        visited: set[str] = set()
        self._journal = []
        try:
            marks = await self._list_marks(visited)
            for event in self._journal:
                self._apply(marks, event)
        finally:
            self._journal = None
        # Every directory there is was listed: forget the ones gone.
        for path in [p for p in self._listings if p.startswith(self.ledgers)]:
            if path not in visited:
                del self._listings[path]
        if self._watch is not None and epoch == self._epoch:
            self._marks, self._marks_epoch = marks, epoch
        return marks, True

    def _apply(self, marks: dict[int, str], event: Event) -> None:
        """A mark created or deleted, into `marks`."""
        name = event.path.rsplit("/", 1)[1]
        if not name.startswith("urL"):
            return
        lid, problem = mark_problem(self.base, event.path, name)
        if problem is not None or lid is None:
            return
        if event.type == EventType.CREATED:
            marks[lid] = event.path
        elif event.type == EventType.DELETED:
            marks.pop(lid, None)

    async def _read_marks(self, batch: list[int], marks: dict[int, str]) -> None:
        """Reads these marks (and their ledgers' metadata, for the order) in one batch and
        ranks them; a mark gone meanwhile is left for the watch to remove."""
        where = {lid: path for lid in batch if (path := marks.get(lid)) is not None}
        paths: list[str] = []
        for lid, path in where.items():
            paths.append(path)
            if self.order is not None:
                paths.append(self.order.ledger_path(lid))
        found = iter(await self.store.get_many(paths))
        items: list[tuple[int, str, tuple[bytes, Stat], tuple[bytes, Stat] | None]] = []
        gone: list[int] = []
        for lid, path in where.items():
            mark = next(found)
            md = next(found) if self.order is not None else None
            if mark is None:
                gone.append(lid)
            else:
                items.append((lid, path, mark, md))
        self._forget_ids(gone)
        await self._learn(items)

    async def _learn(
        self, items: Sequence[tuple[int, str, tuple[bytes, Stat], tuple[bytes, Stat] | None]]
    ) -> None:
        """Records what was read of these marks and hands it to the order."""
        reads: list[MarkRead] = []
        for lid, path, (data, stat), md in items:
            before = self._known.get(lid)
            seen = before.first_seen if before is not None else self._clock()
            tiebreak = before.tiebreak if before is not None else self._rng.random()
            self._known[lid] = _Known(
                path,
                int(stat.version),
                -1 if md is None else int(md[1].version),
                tiebreak,
                seen,
            )
            if self.order is None:
                continue
            replicas, ctime = _mark_contents(lid, data)
            if ctime != UNASSIGNED_CTIME:
                marked_at = ctime / 1000.0
            elif int(stat.ctime) > 0:
                marked_at = int(stat.ctime) / 1000.0
            else:
                marked_at = seen
            reads.append(
                MarkRead(
                    lid,
                    replicas,
                    marked_at,
                    None if md is None else md[0],
                    0 if md is None else int(md[1].ctime),
                )
            )
        if reads and self.order is not None and await self.order.learn(reads):
            self._reheap()  # every rank may have changed
        else:
            self._rekey(lid for lid, _, _, _ in items)

    async def _list_marks(self, visited: set[str]) -> dict[int, str]:
        """Every mark in its place (ledger id -> path), level by level, listings from the
        cache or read in batches; directories that are not hex digits are not descended,
        corrupt marks never named."""
        marks: dict[int, str] = {}
        level = [self.ledgers]
        for depth in range(HEX_LEVELS + 1):
            listings = await self._list_many(level, visited)
            below: list[str] = []
            for path, children in zip(level, listings, strict=True):
                if not children:
                    continue
                if depth < HEX_LEVELS:
                    below.extend(f"{path}/{n}" for n in children if _HEX_DIR.fullmatch(n))
                    continue
                for name in children:
                    leaf = f"{path}/{name}"
                    lid, problem = mark_problem(self.base, leaf, name)
                    if problem is None and lid is not None:
                        marks[lid] = leaf
            level = below
        return marks

    def free_marks(self) -> list[int]:
        """The marked ledgers no lock is known to hold (the cached listing of the locks,
        and ours), as last listed; no I/O. What a take could have taken instead: logged
        beside each take, so the soak judges the order from outside the heap."""
        names = set(self._listings.get(self.locks, self._locked))
        names.update(path.rsplit("/", 1)[1] for path in self._held)
        # The few locks as ledger ids, rather than every mark's name formatted to look
        # it up (a take logs this: with 100,000 marks that was 100,000 names a take).
        excluded = {lid for lid in map(_lock_ledger, names) if lid is not None}
        excluded |= self._found_locked
        return [lid for lid in self._keys if lid not in excluded]

    def queued(self, limit: int) -> list[tuple[int, bool]]:
        """The first `limit` marks in take order as last ranked, each with whether its lock
        is held (as the cached listing of the locks says, else the last refresh; no I/O)."""
        locked = set(self._listings.get(self.locks, self._locked))
        locked.update(path.rsplit("/", 1)[1] for path in self._held)  # ours, events or not
        first = heapq.nsmallest(limit, self._keys.items(), key=lambda item: item[1])
        return [(lid, mark_name(lid) in locked) for lid, _ in first]

    async def _try_leaf(
        self, ledger_id: int, path: str, data: bytes, stat: Stat
    ) -> TakenLedger | Literal["unmarked"] | None:
        """Locks a mark read as (`data`, `stat`); None when someone else holds its lock,
        "unmarked" when the mark went before our lock was made.

        The mark is read again with the lock, in the same request: a worker that repaired
        the ledger may have unmarked it and released its lock between our read and our
        lock (seen under load in the risk-order test). Java's worker would plan that
        ledger all over again, reading every bookie of it, to find it whole; ours lets
        the lock go at once. A mark changed meanwhile (the auditor added a bookie to it)
        is taken as it is now: that version is the one unmarking may delete."""
        lock_path = ur_lock_path(self.base, ledger_id)
        locked = await self._lock(lock_path, path)
        if locked is None:
            return None
        lock, mark = locked
        session = int(lock.ephemeralOwner)
        if mark is None:
            try:
                await self._delete_own_lock(lock_path, session)
            except BaseException:
                self._orphans[lock_path] = session
                raise
            return "unmarked"
        if int(mark[1].version) != int(stat.version):
            data, stat = mark
        replicas, _ = _mark_contents(ledger_id, data)
        taken = TakenLedger(
            ledger_id=ledger_id,
            mark_path=path,
            mark_version=int(stat.version),
            lock_path=lock_path,
            lock_version=int(lock.version),
            missing_replicas=replicas,
        )
        self._held[lock_path] = _Hold(taken, session)
        self._orphans.pop(lock_path, None)
        return taken

    async def _lock(
        self, lock_path: str, mark_path: str
    ) -> tuple[Stat, tuple[bytes, Stat] | None] | None:
        """Creates the ephemeral lock; its stat when this session owns it, with the mark at
        `mark_path` as read just after (None: no mark), else None.

        A create that was cancelled or failed may have happened all the same: it is
        remembered as an orphan and reaped later. A lock made as the session changed is
        not ours (ours, if it was made, went with the old session).
        """
        session = self._session()
        try:
            if not await self._create_lock(lock_path):
                return None
            lock, mark = await self.store.get_many([lock_path, mark_path])
        except BaseException:
            if session is not None:
                self._orphans[lock_path] = session
            raise
        session = self._session()
        if lock is None or session is None or lock[1].ephemeralOwner != session:
            return None
        return lock[1], mark

    async def _create_lock(self, lock_path: str) -> bool:
        """Whether we created the lock (False: someone holds it)."""
        for _ in range(2):
            try:
                await self.store.create(lock_path, self._lock_data, ephemeral=True)
                return True
            except NodeExistsError:
                return False
            except NoNodeError:
                await self.store.ensure_path(self.locks)  # `locks` itself is missing
        return False

    async def _list(self, path: str, visited: set[str]) -> list[str] | None:
        """A path's children (None: no such node), from the cache while it is current."""
        [children] = await self._list_many([path], visited)
        return children

    async def _list_many(self, paths: Sequence[str], visited: set[str]) -> list[list[str] | None]:
        """Paths' children (None: no such node), from the cache while it is current, the
        others read `LIST_BATCH` at a time (`get_children_many`), `LISTINGS_IN_FLIGHT`
        batches at once."""
        out: list[list[str] | None] = [None] * len(paths)
        wanted: list[int] = []
        for i, path in enumerate(paths):
            visited.add(path)
            cached = self._listings.get(path)
            if cached is not None:
                out[i] = cached
            else:
                wanted.append(i)
        batches = [wanted[i : i + LIST_BATCH] for i in range(0, len(wanted), LIST_BATCH)]
        for i in range(0, len(batches), LISTINGS_IN_FLIGHT):
            window = batches[i : i + LISTINGS_IN_FLIGHT]
            listed = await asyncio.gather(
                *(self._read_listings([paths[j] for j in b]) for b in window)
            )
            for batch, found in zip(window, listed, strict=True):
                for j, children in zip(batch, found, strict=True):
                    out[j] = children
        return out

    async def _read_listings(self, paths: list[str]) -> list[list[str] | None]:
        """One batch of listings, each cached unless the watch was added or lost, or its
        children changed, while it was read."""
        epoch = self._epoch
        for path in paths:
            self._reading[path] = self._reading.get(path, 0) + 1
        changed: set[str] = set()
        try:
            found = await self.store.get_children_many(paths)
        finally:
            for path in paths:
                if path in self._stale:
                    changed.add(path)
                self._reading[path] -= 1
                if not self._reading[path]:
                    del self._reading[path]
                    self._stale.discard(path)
        out = list(found)
        for path, children in zip(paths, out, strict=True):
            if children is None:
                # Listed but gone: its parent's listing is stale (on etcd, a directory goes
                # with the last key below it, and no event says so).
                self._forget(path.rsplit("/", 1)[0])
                continue
            if self._watch is not None and epoch == self._epoch and path not in changed:
                self._listings[path] = children
        return out

    async def acquire(self, ledger_id: int) -> TakenLedger | None:
        """Locks one ledger, marked or not (Java's `acquireUnderreplicatedLedger`); None
        when someone else holds its lock.

        `recover` locks the ledgers it moves this way, so that no worker (Java's or
        ours) and no bookie's garbage collector works on them meanwhile. No mark
        version is recorded, so `mark_replicated` leaves any mark alone (as Java's):
        a mark is the auditor's finding, and a worker that takes it later judges the
        ledger afresh. The mark's replicas, if it has one, are read for the plan."""
        lock_path = ur_lock_path(self.base, ledger_id)
        mark_path = ur_ledger_path(self.base, ledger_id)
        locked = await self._lock(lock_path, mark_path)
        if locked is None:
            return None
        lock, mark = locked
        session = int(lock.ephemeralOwner)
        replicas: tuple[str, ...] = ()
        if mark is not None:
            with contextlib.suppress(RecordFormatError):
                replicas = tuple(decode_underreplicated_ledger(mark[0]).replicas)
        taken = TakenLedger(
            ledger_id=ledger_id,
            mark_path=mark_path,
            mark_version=None,
            lock_path=lock_path,
            lock_version=int(lock.version),
            missing_replicas=replicas,
        )
        self._held[lock_path] = _Hold(taken, session)
        self._orphans.pop(lock_path, None)
        return taken

    # --- waiting ------------------------------------------------------------------

    async def changed(self) -> asyncio.Event:
        """An event set when a take may find something it did not: a mark created, a lock
        deleted, or the watch lost (a reconnect: anything may have changed). Set at once
        if that happened since the last take began. Without persistent watches on the
        server, it is set after `POLL_WITHOUT_WATCH` seconds."""
        await self._ensure_watch()
        if not self._watch_supported:
            ev = asyncio.Event()
            asyncio.get_running_loop().call_later(POLL_WITHOUT_WATCH, ev.set)
            return ev
        return self._wake

    async def outdated(self) -> asyncio.Event:
        """An event set when the ranking may be out of date: a mark made, changed or
        removed, a lock released, or the watch lost. Set at once if that happened since
        the last `refresh` began. Without persistent watches on the server, it is set
        after `POLL_WITHOUT_WATCH` seconds."""
        await self._ensure_watch()
        if not self._watch_supported:
            ev = asyncio.Event()
            asyncio.get_running_loop().call_later(POLL_WITHOUT_WATCH, ev.set)
            return ev
        return self._outdated

    async def replication_disabled(self) -> bool:
        """Whether `underreplication/disable` exists (replication disabled). Asked before
        every take: read once, then kept current by the watch's events (no request per
        ledger); read each time where there is no watch."""
        await self._ensure_watch()
        if self._watch is not None and self._disabled is not None:
            return self._disabled
        epoch, events = self._epoch, self._disable_events
        disabled = await self.store.exists(f"{self.base}/disable") is not None
        if self._watch is not None and epoch == self._epoch and events == self._disable_events:
            self._disabled = disabled
        return disabled

    async def wait_enabled(self) -> None:
        """Returns once `underreplication/disable` is absent (at once if it is)."""
        path = f"{self.base}/disable"
        while True:
            stat, gone = await self.store.exists_watched(path)
            if stat is None:
                return
            await gone.wait()

    async def _ensure_watch(self) -> None:
        async with self._watch_starting:  # one watch, however many takers start it
            if self._watch is not None or not self._watch_supported:
                return
            try:
                events = await self.store.watch_tree(self.base)
            except WatchUnsupportedError:
                self._watch_supported = False
                return
            self._epoch += 1
            self._listings.clear()
            self._disabled = None
            self._dirty.update(self._known)  # nothing watched them meanwhile
            self._watch = asyncio.ensure_future(self._follow(events))

    async def _follow(self, events: asyncio.Queue[Event | Gap]) -> None:
        """Keeps the listings, the marks and what to read again current, and wakes idle
        takers; ends when the watch is lost."""
        ledgers = self.ledgers + "/"
        locks = self.locks + "/"
        disable = self.base + "/disable"
        while True:
            item = await events.get()
            if isinstance(item, Gap):
                self._epoch += 1
                self._listings.clear()
                self._disabled = None
                self._marks = None
                self._dirty.update(self._known)
                self._watch = None
                self._wake.set()
                self._outdated.set()
                return
            if item.path == disable and item.type != EventType.CHANGED:
                self._disable_events += 1
                self._disabled = item.type == EventType.CREATED
            in_ledgers = item.path.startswith(ledgers)
            freed = item.type == EventType.DELETED and item.path.startswith(locks)
            if in_ledgers or freed:
                # A mark made, changed or removed; or a lock released, after which the
                # ledger's metadata may be another (a commit happens under the lock).
                lid = _ledger_of(item.path)
                if lid is not None:
                    self._dirty.add(lid)
                self._outdated.set()
            if item.type == EventType.CHANGED:
                continue  # data only: no listing changes
            if in_ledgers:
                if self._journal is not None:
                    self._journal.append(item)
                if self._marks is not None:
                    self._apply(self._marks, item)
            self._forget_listings(item)
            marked = item.type == EventType.CREATED and in_ledgers
            if freed or marked:
                self._wake.set()

    def _forget(self, path: str) -> None:
        """Drops `path`'s cached listing; one being read is then used once, not cached."""
        self._listings.pop(path, None)
        if path in self._reading:
            self._stale.add(path)

    def _forget_listings(self, event: Event) -> None:
        """Drops the listings a created or deleted node may have changed: its parent's;
        a deleted node's own; and for a created node every listing above it that lacks
        the way down to it (or is being read): on a store without parent nodes (etcd)
        the directories above a new mark appear with it, with no event of their own."""
        child = event.path.rsplit("/", 1)[0]
        self._forget(child)
        if event.type == EventType.DELETED:
            self._listings.pop(event.path, None)
            return
        while child.startswith(self.base + "/"):
            parent, _, name = child.rpartition("/")
            listing = self._listings.get(parent)
            if parent in self._reading or (listing is not None and name not in listing):
                self._forget(parent)
            child = parent

    # --- holding, unmarking, releasing -------------------------------------------

    def fenced(self, taken: TakenLedger) -> MetadataStore:
        """The store view whose writes happen only while our lock on `taken` is at its
        version; FencedOutError at once when the lock is not held by this queue or the
        session that took it is gone."""
        hold = self._held.get(taken.lock_path)
        if hold is None or hold.taken != taken:
            raise FencedOutError(f"replication lock {taken.lock_path} is not held by this worker")
        if self._session() != hold.owner:
            raise FencedOutError(
                f"replication lock {taken.lock_path} was taken in a metadata store session "
                "that has ended"
            )
        return self.store.fenced(taken.lock_path, taken.lock_version)

    async def still_held(self, taken: TakenLedger) -> bool:
        """Whether our lock on `taken` is still there, unchanged, in our live session."""
        hold = self._held.get(taken.lock_path)
        if hold is None or hold.taken != taken or self._session() != hold.owner:
            return False
        stat = await self.store.exists(taken.lock_path)
        return (
            stat is not None
            and int(stat.ephemeralOwner) == hold.owner
            and int(stat.version) == taken.lock_version
        )

    async def mark_replicated(self, taken: TakenLedger) -> bool:
        """Deletes the mark if it is unchanged since the lock was taken (True), keeps it
        otherwise (False); then always releases the lock. FencedOutError (mark kept)
        when our lock is gone.

        Once the mark is gone, the lock is released and the emptied hex directories
        above the mark removed at the same time: neither needs the other, and a worker
        repairing small ledgers would otherwise wait for one after the other."""
        try:
            unmarked = await self._unmark(taken)
        except BaseException:
            with contextlib.suppress(AuditorError):
                await self.release(taken)
            raise
        if not unmarked:
            await self.release(taken)
            return False
        released, _ = await asyncio.gather(
            self.release(taken), self._remove_empty_dirs(taken.mark_path), return_exceptions=True
        )
        if isinstance(released, BaseException):
            raise released
        return True

    async def _unmark(self, taken: TakenLedger) -> bool:
        fenced = self.fenced(taken)
        if taken.mark_version is None:
            return False  # locked with `acquire`: no mark version to delete
        try:
            await fenced.delete(taken.mark_path, taken.mark_version)
        except (BadVersionError, NoNodeError):
            return False  # re-marked since we took it (kept), or removed by someone else
        return True

    async def _remove_empty_dirs(self, mark_path: str) -> None:
        """The empty hex directories above a deleted mark, deepest first, as Java: the
        first that is not empty (or gone) ends it; `underreplication/ledgers` stays. A
        delete without a version refuses a directory with children (NotEmptyError) just
        as the version read first did (a directory's data never changes), in one request
        where `exists` and `delete` were two."""
        parent = mark_path.rsplit("/", 1)[0]
        with contextlib.suppress(StoreUnavailableError):
            while parent.startswith(self.ledgers + "/"):
                try:
                    await self.store.delete(parent)
                except (NotEmptyError, NoNodeError, BadVersionError):
                    break
                parent = parent.rsplit("/", 1)[0]

    async def release(self, taken: TakenLedger) -> None:
        """Deletes our lock on `taken` if it is still ours; a lock gone, or now another
        worker's, is left alone.

        A delete the store did not answer (StoreUnavailableError, raised on) leaves the
        lock with our session, which may live for days: no worker, ours or Java's, could
        take that ledger meanwhile. So the lock becomes an orphan, deleted at the next take
        (which every worker loop makes soon), retried until it is gone or the session is."""
        hold = self._held.pop(taken.lock_path, None)
        if hold is None:
            return
        if hold.taken != taken:
            self._held[taken.lock_path] = hold
            return
        try:
            await self._delete_own_lock(taken.lock_path, hold.owner)
        except BaseException:
            self._orphans[taken.lock_path] = hold.owner
            raise

    async def _delete_own_lock(self, lock_path: str, owner: int) -> None:
        """Deletes the lock at `lock_path` if `owner`, our live session, owns it. Within one
        session only this queue makes that lock, so the owner is what makes it ours."""
        session = self._session()
        if session is None:
            # No session known right now: the connection is suspended, and the session (our
            # lock with it) may well come back. Raised on, so the lock becomes an orphan,
            # tried again at the next take. Before, this was taken for "the session is
            # over" and the lock stayed with the session when it came back (found by the
            # soak with real workers: every lock released during a ZooKeeper restart was
            # kept until the daemon's end, and its ledgers were never repaired).
            raise StoreUnavailableError(f"{lock_path}: no session while the connection is down")
        if session != owner:
            return  # that session is over, and its ephemeral lock with it
        stat = await self.store.exists(lock_path)
        if stat is not None and int(stat.ephemeralOwner) == owner:
            with contextlib.suppress(NoNodeError, BadVersionError):
                await self.store.delete(lock_path, int(stat.version))

    async def _reap_orphans(self) -> None:
        for lock_path, owner in list(self._orphans.items()):
            if lock_path in self._held:
                del self._orphans[lock_path]
                continue
            with contextlib.suppress(StoreUnavailableError):
                await self._delete_own_lock(lock_path, owner)
                del self._orphans[lock_path]

    def held(self) -> list[TakenLedger]:
        """The ledgers this queue holds locks on."""
        return [h.taken for h in self._held.values()]

    async def close(self) -> None:
        """Stops the watch and releases every lock still held, each on its own (one
        failed release does not keep the others)."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
            with contextlib.suppress(AuditorError):
                await self.store.unwatch_tree(self.base)
        for taken in self.held():
            with contextlib.suppress(AuditorError):
                await self.release(taken)
        with contextlib.suppress(AuditorError):
            await self._reap_orphans()

    def _session(self) -> int | None:
        return self.store.session
