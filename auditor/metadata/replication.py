"""The replication worker's queue: taking a marked ledger, unmarking it, releasing it.

Java's workers and ours share `underreplication/ledgers` and
`underreplication/locks`, so a ledger is taken exactly as
`ZkLedgerUnderreplicationManager.getLedgerToRereplicate` takes it: one walk of
the four hex levels, each level and the leaves shuffled so that workers do not
all start at the same ledger, depth first; a leaf whose lock exists is passed
over; otherwise its version is read and the ephemeral lock
`locks/urL%010d` (TextFormat `LockDataFormat`, `bookieId: "<holder>"`) is
created. Whoever creates the lock first owns the ledger: NodeExists sends us
to the next candidate. A Java worker, a bookie's garbage collector and we thus
never work on one ledger at once.

Deliberate differences from Java, each for a reason:

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
  meanwhile; the next walk reads everything again); nothing else can make a
  walk succeed. A server without `addWatch` gets Pulsar's behaviour: no
  cache, and a walk every second. The cache does not rely on parents being
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
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from auditor.errors import AuditorError
from auditor.metadata.records import (
    RecordFormatError,
    decode_underreplicated_ledger,
    encode_lock_data,
)
from auditor.metadata.underreplication import (
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
#: How often an idle worker walks again when the server has no persistent watches
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


class ReplicationQueue:
    """One worker's view of the marked ledgers under one ledgers root.

    `holder` is the lock data's `bookieId` (Java writes its host name). `rng`
    shuffles the walk (seed it for a reproducible order); `rate_limit` is
    `zkReplicationTaskRateLimit`. One queue per ZooKeeper session: the
    persistent watch it keeps is per client and path. `close` ends the watch
    and releases every lock still held.
    """

    def __init__(
        self,
        zk: MetadataStore,
        root: str,
        holder: str,
        *,
        rng: random.Random | None = None,
        rate_limit: float = 0.0,
    ) -> None:
        self.zk = zk
        self.root = root.rstrip("/")
        self.base = f"{self.root}/underreplication"
        self.ledgers = f"{self.base}/ledgers"
        self.locks = f"{self.base}/locks"
        self.holder = holder
        self.limiter = RateLimiter(rate_limit)
        self._rng = rng or random.Random()
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
        #: Set by a change a walk may find; a new one at the start of each walk.
        self._wake = asyncio.Event()

    # --- taking -------------------------------------------------------------------

    async def take(self) -> TakenLedger | None:
        """One walk; the ledger now locked by us, or None when no marked ledger is free."""
        await self.limiter.acquire()
        await self._ensure_watch()
        await self._reap_orphans()
        if self._wake.is_set():
            self._wake = asyncio.Event()
        visited: set[str] = set()
        taken = await self._walk(self.ledgers, 0, visited)
        if taken is None:
            # A whole walk saw every directory there is: forget the ones gone.
            for path in [p for p in self._listings if p not in visited]:
                del self._listings[path]
        return taken

    async def _walk(self, path: str, depth: int, visited: set[str]) -> TakenLedger | None:
        children = await self._list(path, visited)
        if not children:
            return None
        order = list(children)
        self._rng.shuffle(order)
        for name in order:
            child = f"{path}/{name}"
            if depth < HEX_LEVELS:
                if _HEX_DIR.fullmatch(name) is None:
                    continue
                taken = await self._walk(child, depth + 1, visited)
            else:
                taken = await self._try_leaf(child, name, visited)
            if taken is not None:
                return taken
        return None

    async def _try_leaf(self, path: str, name: str, visited: set[str]) -> TakenLedger | None:
        ledger_id, problem = mark_problem(self.base, path, name)
        if problem is not None or ledger_id is None:
            return None  # a corrupt mark: for an operator, never locked
        locked = await self._list(self.locks, visited)
        if locked is not None and mark_name(ledger_id) in locked:
            return None
        try:
            data, stat = await self.zk.get(path)
        except NoNodeError:
            return None  # unmarked meanwhile
        lock_path = ur_lock_path(self.base, ledger_id)
        lock = await self._lock(lock_path)
        if lock is None:
            return None
        session = int(lock.ephemeralOwner)
        try:
            replicas = decode_underreplicated_ledger(data).replicas
        except RecordFormatError:
            replicas = ()
        taken = TakenLedger(
            ledger_id=ledger_id,
            mark_path=path,
            mark_version=int(stat.version),
            lock_path=lock_path,
            lock_version=int(lock.version),
            missing_replicas=tuple(replicas),
        )
        self._held[lock_path] = _Hold(taken, session)
        self._orphans.pop(lock_path, None)
        return taken

    async def _lock(self, lock_path: str) -> Stat | None:
        """Creates the ephemeral lock; its stat when this session owns it, else None.

        A create that was cancelled or failed may have happened all the same: it is
        remembered as an orphan and reaped later. A lock made as the session changed is
        not ours (ours, if it was made, went with the old session).
        """
        session = self._session()
        try:
            if not await self._create_lock(lock_path):
                return None
            lock = await self.zk.exists(lock_path)
        except BaseException:
            if session is not None:
                self._orphans[lock_path] = session
            raise
        session = self._session()
        if lock is None or session is None or lock.ephemeralOwner != session:
            return None
        return lock

    async def _create_lock(self, lock_path: str) -> bool:
        """Whether we created the lock (False: someone holds it)."""
        for _ in range(2):
            try:
                await self.zk.create(lock_path, self._lock_data, ephemeral=True)
                return True
            except NodeExistsError:
                return False
            except NoNodeError:
                await self.zk.ensure_path(self.locks)  # `locks` itself is missing
        return False

    async def _list(self, path: str, visited: set[str]) -> list[str] | None:
        """A path's children (None: no such node), from the cache while it is current."""
        visited.add(path)
        cached = self._listings.get(path)
        if cached is not None:
            return cached
        epoch = self._epoch
        self._reading[path] = self._reading.get(path, 0) + 1
        try:
            children = await self.zk.get_children(path)
        except NoNodeError:
            # Listed but gone: its parent's listing is stale (on etcd, a directory goes
            # with the last key below it, and no event says so).
            self._forget(path.rsplit("/", 1)[0])
            return None
        finally:
            changed = path in self._stale
            self._reading[path] -= 1
            if not self._reading[path]:
                del self._reading[path]
                self._stale.discard(path)
        if self._watch is not None and epoch == self._epoch and not changed:
            self._listings[path] = children
        return children

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
        lock = await self._lock(lock_path)
        if lock is None:
            return None
        session = int(lock.ephemeralOwner)
        replicas: tuple[str, ...] = ()
        try:
            data, _ = await self.zk.get(mark_path)
            replicas = tuple(decode_underreplicated_ledger(data).replicas)
        except (NoNodeError, RecordFormatError):
            pass
        except BaseException:
            self._orphans[lock_path] = session
            raise
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
        """An event set when a walk may find something it did not: a mark created, a lock
        deleted, or the watch lost (a reconnect: anything may have changed). Set at once
        if that happened since the last walk began. Without persistent watches on the
        server, it is set after `POLL_WITHOUT_WATCH` seconds."""
        await self._ensure_watch()
        if not self._watch_supported:
            ev = asyncio.Event()
            asyncio.get_running_loop().call_later(POLL_WITHOUT_WATCH, ev.set)
            return ev
        return self._wake

    async def wait_enabled(self) -> None:
        """Returns once `underreplication/disable` is absent (at once if it is)."""
        path = f"{self.base}/disable"
        while True:
            stat, gone = await self.zk.exists_watched(path)
            if stat is None:
                return
            await gone.wait()

    async def _ensure_watch(self) -> None:
        async with self._watch_starting:  # one watch, however many takers start it
            if self._watch is not None or not self._watch_supported:
                return
            try:
                events = await self.zk.watch_tree(self.base)
            except WatchUnsupportedError:
                self._watch_supported = False
                return
            self._epoch += 1
            self._listings.clear()
            self._watch = asyncio.ensure_future(self._follow(events))

    async def _follow(self, events: asyncio.Queue[Event | Gap]) -> None:
        """Keeps the cache current and wakes idle walkers; ends when the watch is lost."""
        ledgers = self.ledgers + "/"
        locks = self.locks + "/"
        while True:
            item = await events.get()
            if isinstance(item, Gap):
                self._epoch += 1
                self._listings.clear()
                self._watch = None
                self._wake.set()
                return
            if item.type == EventType.CHANGED:
                continue  # data only: no listing changes
            self._forget_listings(item)
            freed = item.type == EventType.DELETED and item.path.startswith(locks)
            marked = item.type == EventType.CREATED and item.path.startswith(ledgers)
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
        """The ZooKeeper view whose writes happen only while our lock on `taken` is at its
        version; FencedOutError at once when the lock is not held by this queue or the
        session that took it is gone."""
        hold = self._held.get(taken.lock_path)
        if hold is None or hold.taken != taken:
            raise FencedOutError(f"replication lock {taken.lock_path} is not held by this worker")
        if self._session() != hold.owner:
            raise FencedOutError(
                f"replication lock {taken.lock_path} was taken in a ZooKeeper session "
                "that has ended"
            )
        return self.zk.fenced(taken.lock_path, taken.lock_version)

    async def still_held(self, taken: TakenLedger) -> bool:
        """Whether our lock on `taken` is still there, unchanged, in our live session."""
        hold = self._held.get(taken.lock_path)
        if hold is None or hold.taken != taken or self._session() != hold.owner:
            return False
        stat = await self.zk.exists(taken.lock_path)
        return (
            stat is not None
            and int(stat.ephemeralOwner) == hold.owner
            and int(stat.version) == taken.lock_version
        )

    async def mark_replicated(self, taken: TakenLedger) -> bool:
        """Deletes the mark if it is unchanged since the lock was taken (True), keeps it
        otherwise (False); then always releases the lock. FencedOutError (mark kept)
        when our lock is gone."""
        try:
            unmarked = await self._unmark(taken)
        except BaseException:
            with contextlib.suppress(AuditorError):
                await self.release(taken)
            raise
        await self.release(taken)
        return unmarked

    async def _unmark(self, taken: TakenLedger) -> bool:
        fenced = self.fenced(taken)
        if taken.mark_version is None:
            return False  # locked with `acquire`: no mark version to delete
        try:
            await fenced.delete(taken.mark_path, taken.mark_version)
        except (BadVersionError, NoNodeError):
            return False  # re-marked since we took it (kept), or removed by someone else
        # The empty hex directories above it, deepest first, as Java: the first that is
        # not empty (or changed, or gone) ends it; `underreplication/ledgers` stays.
        parent = taken.mark_path.rsplit("/", 1)[0]
        with contextlib.suppress(StoreUnavailableError):
            while parent.startswith(self.ledgers + "/"):
                stat = await self.zk.exists(parent)
                if stat is None or stat.numChildren:
                    break
                try:
                    await self.zk.delete(parent, int(stat.version))
                except (NotEmptyError, NoNodeError, BadVersionError):
                    break
                parent = parent.rsplit("/", 1)[0]
        return True

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
        stat = await self.zk.exists(lock_path)
        if stat is not None and int(stat.ephemeralOwner) == owner:
            with contextlib.suppress(NoNodeError, BadVersionError):
                await self.zk.delete(lock_path, int(stat.version))

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
                await self.zk.unwatch_tree(self.base)
        for taken in self.held():
            with contextlib.suppress(AuditorError):
                await self.release(taken)
        with contextlib.suppress(AuditorError):
            await self._reap_orphans()

    def _session(self) -> int | None:
        return self.zk.session
