"""A repair's copy must put on the new bookie exactly the entries its position stores, as the
writer wrote them, and must never take a busy bookie for a lost entry; upstream's replicator
copies more, re-packs the bodies and stops at the first entry it cannot read.

Copying one position of one segment to a new bookie: read, verify, write unchanged.

This is the data half of a repair (upstream `LedgerFragmentReplicator`); the metadata
change comes after it, and only when the result is `complete`. Where it differs from
upstream, it is on purpose:

* **Only the entries the position stores.** Under round robin (WIRE §8) the bookie at
  index i of an E/W segment holds runs of W entries every E; upstream copies every
  entry between the first and last of them, so with E > W a target receives entries it
  is never asked for. Here only the entries of the given ranges that the position
  stores are copied.
* **Byte for byte.** Each entry is read with a plain READ_ENTRY (never fencing) from a
  bookie of its write set, its digest checked with the ledger's digest type and
  password, and the body written to the target exactly as read, with RECOVERY_ADD and
  the ledger's master key. Upstream re-packages the payload with the handle's LAC, so
  its copy differs from the surviving ones; ours is identical, and a repeated copy
  (after a crash) writes the same bytes again.
* **Lost is told from unavailable.** An entry is *unreadable* (lost) only when every
  source that may hold it says so: it answers ENOENTRY or ENOLEDGER, or serves a body
  whose digest or ids do not match (and when no registered bookie of its write set is
  left to ask, unless one that is not registered is not named lost by the mark: it is
  away, maybe restarting, and the entry is unavailable). Such entries are listed in
  `unreadable` and the copy goes on, so one attempt names every range with no copy left
  (upstream stops at the first one and learns the rest attempt by attempt). An entry
  that no source served while one of them *failed* (EIO, ETOOMANYREQUESTS, any other
  error, no answer: a busy, stalled or restarting bookie) is *unavailable*: it may well
  be there, so it says nothing about loss. It stops the copy (the segment cannot be
  committed this attempt, and the failing source would only cost every later entry its
  timeout) and goes to the caller as a passing failure, retried after upstream's
  failed-ledger delay, never as an unrecoverable ledger. The target failing (EUA,
  EREADONLY, no answer) stops the copy too: nothing written after that could be used.
* **A sliding window.** At most `batch` (`rereplicationEntryBatchSize`) entries are in
  flight, each from its read to its write; a new one starts as soon as one ends.
  Upstream's batch-then-wait idles on the slowest entry of every batch; the window
  keeps the same bound on bookie memory (apache/bookkeeper#3408) without the stall.
  Per-bookie request caps and timeouts are the bookie client's. The window is driven
  by the answers themselves (`_Run`): no task, coroutine or future per entry, the
  requests a burst of answers provokes written together, the digest checked on the
  body as received and the body passed to the target's request without a copy, so
  that a worker's cost per entry is near that of the bare requests (Pulsar's entries
  run from 1 KiB to 1 MiB).
* **Sources that stop answering go last.** Within one copy, a source that did not
  answer is tried after the others for the following entries (until it answers
  again), so a stalled replica costs one timeout, not one per entry (upstream's
  `reorderReadSequence` does the same with its slow-bookie tracking).

The byte-rate limit (`replicationRateByBytes`) is a token bucket on bytes read,
written here rather than taken from a library: it must charge what an entry *turns out*
to weigh (known only after the read), which rate-limiter packages, counting permits
asked for up front, do not do. Like Guava's limiter upstream, a read reserves the
running average entry size before it is sent (so `batch` concurrent reads cannot all
slip through at once) and the difference to the real size is settled when the body
arrives, so over a copy the bytes read per second converge on the limit exactly. The
bucket starts empty and stores at most one second of idle credit.

Before any I/O the task is checked: a target in the segment's ensemble is refused
(`TargetInEnsembleError`: writing there would put a second copy of entries on a bookie
that already counts as a replica), and so are entries outside the segment. For a ledger
that is not closed the last segment has no known end, so its entries are refused too:
the tail of an open ledger is copied only after recovery has closed it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from auditor.bookie.client import BookieClient
from auditor.bookie.protocol import BookieProtocolError, Status, master_key, verified_entry_ids
from auditor.bookie.results import ErrorStatus, NoAnswer, Ok, Outcome
from auditor.errors import AuditorError
from auditor.metadata.model import DigestType, LedgerMetadata, SegmentRange
from auditor.metadata.schedule import first_stored, write_set

__all__ = [
    "ByteRate",
    "CopyEvent",
    "CopyPlan",
    "CopyResult",
    "CopyTask",
    "FragmentCopier",
    "InvalidCopyTaskError",
    "TargetInEnsembleError",
    "as_ranges",
    "stored_entries",
]

#: Upstream's first guess of an entry's size for the byte-rate limit (bytes).
INITIAL_ENTRY_ESTIMATE = 1024.0
#: The answers that say a bookie has no copy of an entry (every other failure says nothing).
_ABSENCE = frozenset({Status.ENOENTRY, Status.ENOLEDGER})


class InvalidCopyTaskError(AuditorError):
    """A copy task that cannot be carried out as given; refused before any request."""


class TargetInEnsembleError(InvalidCopyTaskError):
    """The target bookie is already in the segment's ensemble."""


@dataclass(frozen=True, slots=True)
class CopyTask:
    """One ensemble position of one segment, to be copied to `target`."""

    ledger_id: int
    #: The ledger's metadata as read (digest type and password come from it).
    metadata: LedgerMetadata
    #: Which segment of `metadata.segments`.
    segment_index: int
    #: The ensemble position being replaced.
    bookie_index: int
    #: The new bookie; never a member of the segment's ensemble.
    target: str
    #: Inclusive entry ranges to copy; within them only the entries the position stores
    #: (round robin) are copied, so the whole segment range may be given.
    entries: tuple[tuple[int, int], ...]
    #: Bookies that may serve copies; each entry is read only from those of them in its
    #: write set, in write-set order.
    sources: tuple[str, ...]
    #: Bookies of the ledger not registered now and not named by the mark (restarting,
    #: maybe): an entry no source serves while one of these is in its write set (the
    #: position's own bookie included) is unavailable, not lost.
    away: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class CopyResult:
    """What a copy achieved. `entries_copied` entries were acknowledged by the target."""

    entries_copied: int
    #: Bytes of the verified bodies read (whole bodies: header, digest and payload).
    bytes_read: int
    #: Bytes of the bodies the target acknowledged.
    bytes_written: int
    #: Inclusive ranges of consecutive entry ids that every source said it lacks or
    #: holds a bad copy of (complete only when `failure` is None and nothing is
    #: `unavailable`: a stopped copy tried fewer).
    unreadable: tuple[tuple[int, int], ...]
    #: Why the copy stopped (the target refused or did not answer); None when every
    #: entry that could be read is on the target.
    failure: str | None
    #: Inclusive ranges of entries no source served although one may hold them (a
    #: source failed or did not answer): the copy stopped at the first of them, so
    #: they say nothing about loss and `unreadable` may be incomplete.
    unavailable: tuple[tuple[int, int], ...] = ()
    #: What the sources answered for the first unavailable entry ("bookie: answer; ...").
    unavailable_why: str = ""

    @property
    def complete(self) -> bool:
        """The target acknowledged every entry the position must hold."""
        return self.failure is None and not self.unreadable and not self.unavailable


class CopyEvent(NamedTuple):
    """One step of a copy, for counting: a read, a failed read attempt, a write, an
    entry found unreadable. Fields that do not apply are 0.

    A named tuple rather than a frozen dataclass: two are made for every entry copied,
    and a frozen dataclass's constructor (a checked `__setattr__` per field) cost more
    than the rest of counting the entry.
    """

    ledger_id: int
    entry_id: int
    #: The bookie read from or written to (None for `entries_unreadable`).
    bookie: str | None = None
    entries_read: int = 0
    bytes_read: int = 0
    entries_written: int = 0
    bytes_written: int = 0
    #: One source that could not serve the entry (error, no answer, bad digest or ids).
    read_failures: int = 0
    #: The entry could be read from no source: each said it has none (or a bad copy).
    entries_unreadable: int = 0
    #: The entry was served by no source, but one of them failed or did not answer.
    entries_unavailable: int = 0
    #: Seconds from sending the request to its successful answer (reads and writes).
    latency: float = 0.0
    #: Why a read attempt failed.
    detail: str = ""


def stored_entries(
    first: int, last: int, ensemble_size: int, write_quorum: int, index: int
) -> Iterator[int]:
    """The entries of `[first, last]` that the bookie at `index` stores, ascending."""
    e = first_stored(first, last, ensemble_size, write_quorum, index)
    while e is not None:
        yield e
        e = first_stored(e + 1, last, ensemble_size, write_quorum, index)


def as_ranges(entry_ids: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Entry ids as sorted inclusive ranges of consecutive ids."""
    out: list[tuple[int, int]] = []
    for e in sorted(set(entry_ids)):
        if out and out[-1][1] == e - 1:
            out[-1] = (out[-1][0], e)
        else:
            out.append((e, e))
    return tuple(out)


class ByteRate:
    """A token bucket in bytes per second that settles each charge once its size is known.

    `reserve(estimate)` takes tokens for a read about to be sent and says how long to
    wait first (the bucket may go into debt; later reservations wait for it);
    `settle(estimate, actual)` corrects the charge once the body has arrived.
    """

    __slots__ = ("_clock", "_last", "_tokens", "burst", "rate")

    def __init__(
        self,
        rate: float,
        *,
        burst_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self.rate = rate
        self.burst = rate * burst_seconds
        self._clock = clock
        self._tokens = 0.0
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def reserve(self, size: float) -> float:
        """Charges `size` bytes now; returns the seconds to wait before using them."""
        self._refill()
        self._tokens -= size
        return max(0.0, -self._tokens / self.rate)

    def settle(self, reserved: float, actual: float) -> None:
        """Replaces a charge of `reserved` bytes by `actual` bytes."""
        self._refill()
        self._tokens = min(self.burst, self._tokens + reserved - actual)


@dataclass(frozen=True, slots=True)
class CopyPlan:
    """A checked task: the segment, its schedule, the merged ranges, digest and password."""

    segment: SegmentRange
    ensemble_size: int
    write_quorum: int
    ranges: tuple[tuple[int, int], ...]
    digest_type: DigestType
    password: bytes

    def entries(self, index: int) -> Iterator[int]:
        for first, last in self.ranges:
            yield from stored_entries(first, last, self.ensemble_size, self.write_quorum, index)


class FragmentCopier:
    """Copies fragments through one bookie client; one instance per worker.

    `batch` entries at most are in flight per copy (read to write); `bytes_per_second`
    > 0 limits the bytes read by all copies of this copier together (0 or less: no
    limit). `read_timeout` and `add_timeout` bound each request once sent (default: the
    client's `request_timeout`). A ledger whose metadata names no digest type or
    password is read with `fallback_digest_type` and `fallback_password` (upstream's
    `digestType` and `passwd`, CRC32 and empty by default). `observer` is called with
    a `CopyEvent` for every read, failed read attempt, write and unreadable entry.
    """

    def __init__(
        self,
        client: BookieClient,
        *,
        batch: int = 10,
        bytes_per_second: float = 0.0,
        read_timeout: float | None = None,
        add_timeout: float | None = None,
        fallback_digest_type: DigestType = DigestType.CRC32,
        fallback_password: bytes = b"",
        observer: Callable[[CopyEvent], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.client = client
        self.batch = batch
        self.limit = ByteRate(bytes_per_second, clock=clock) if bytes_per_second > 0 else None
        self.read_timeout = read_timeout
        self.add_timeout = add_timeout
        self.fallback_digest_type = fallback_digest_type
        self.fallback_password = fallback_password
        self.observer = observer
        self.clock = clock
        #: Running average of the bodies read (what a read reserves from the limit).
        self.estimate = INITIAL_ENTRY_ESTIMATE

    def plan(self, task: CopyTask) -> CopyPlan:
        """Checks the task against its metadata; raises `InvalidCopyTaskError`."""
        md = task.metadata
        lid = task.ledger_id
        if md.ledger_id != lid:
            raise InvalidCopyTaskError(
                f"copy task for ledger {lid} carries the metadata of ledger {md.ledger_id}"
            )
        ranges = list(md.segment_ranges())
        if not 0 <= task.segment_index < len(ranges):
            raise InvalidCopyTaskError(
                f"ledger {lid} has {len(ranges)} segments, no segment {task.segment_index}"
            )
        seg = ranges[task.segment_index]
        e, w = md.ensemble_size, md.write_quorum
        if len(seg.bookies) != e or not 1 <= w <= e:
            raise InvalidCopyTaskError(
                f"ledger {lid} segment {task.segment_index} has {len(seg.bookies)} bookies "
                f"for ensemble size {e} and write quorum {w}"
            )
        if not 0 <= task.bookie_index < e:
            raise InvalidCopyTaskError(
                f"ledger {lid} segment {task.segment_index} has no position {task.bookie_index}"
            )
        if task.target in seg.bookies:
            raise TargetInEnsembleError(
                f"refusing to copy ledger {lid} segment {task.segment_index} position "
                f"{task.bookie_index} to {task.target}: it is already in the segment's "
                f"ensemble {list(seg.bookies)}"
            )
        for first, last in task.entries:
            if first > last or first < seg.first or last > seg.last:
                where = (
                    f"[{seg.first}, {seg.last}]"
                    if not seg.empty
                    else "no entries (empty, or the open tail of a ledger not closed)"
                )
                raise InvalidCopyTaskError(
                    f"entries [{first}, {last}] are not in ledger {lid} segment "
                    f"{task.segment_index}, which has {where}"
                )
        merged = _merge(task.entries)
        return CopyPlan(
            seg,
            e,
            w,
            merged,
            md.digest_type if md.digest_type is not None else self.fallback_digest_type,
            md.password if md.password is not None else self.fallback_password,
        )

    async def copy(self, task: CopyTask) -> CopyResult:
        """Copies the task's entries to its target; raises only `InvalidCopyTaskError`
        (before any request) and cancellation."""
        run = _Run(self, task, self.plan(task))
        return await run.go()

    def _emit(self, event: CopyEvent) -> None:
        if self.observer is not None:
            self.observer(event)


def _merge(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Inclusive ranges sorted, overlapping and adjacent ones merged."""
    out: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return tuple(out)


class _Entry:
    """One entry of a copy, from its first read to its write's answer."""

    __slots__ = ("candidates", "entry_id", "failed", "next", "reserved", "started", "why")

    def __init__(self, entry_id: int, candidates: list[str]) -> None:
        self.entry_id = entry_id
        #: The sources to try, in order (fixed when the entry starts).
        self.candidates = candidates
        #: Index of the next source to try.
        self.next = 0
        #: A source failed (not merely said it has no copy).
        self.failed = False
        #: What each source that could not serve it answered (built on the first miss).
        self.why: list[str] | None = None
        #: Bytes reserved from the rate limit for the read in flight.
        self.reserved = 0.0
        #: When the request in flight was sent (copier clock).
        self.started = 0.0


class _Run:
    """The state of one copy: a window of entries driven by the answers' callbacks.

    Each entry goes read (source after source, until one serves a verified body), then
    write; when it ends (written, refused, unreadable, or dropped because the copy
    stopped) the next entry starts, so `batch` entries are in flight from read to
    write, with no task or coroutine of their own: the bookie client calls back with
    each answer (`BookieClient.start_read_entry`, `start_add_entry`) and the requests a
    burst of answers provokes leave together, one write per connection and loop
    iteration. `go` waits for the window to empty once nothing more may start.
    """

    def __init__(self, copier: FragmentCopier, task: CopyTask, plan: CopyPlan) -> None:
        self.copier = copier
        self.client = copier.client
        self.task = task
        self.plan = plan
        self.sources = frozenset(task.sources)
        self.key = master_key(plan.password)
        self.entries = plan.entries(task.bookie_index)
        self.copied = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.unreadable: list[int] = []
        self.unavailable: list[int] = []
        self.unavailable_why = ""
        self.failure: str | None = None
        #: Sources that did not answer in this copy (tried after the others).
        self.suspect: set[str] = set()
        #: Entries started and not ended.
        self.in_flight = 0
        #: `_fill` is running (an entry that ends inside it does not call it again).
        self.filling = False
        #: The copy is over (finished or cancelled): late answers are dropped.
        self.ended = False
        #: Reads waiting for the byte-rate limit, by entry.
        self.waits: dict[_Entry, asyncio.TimerHandle] = {}
        self.done: asyncio.Future[None] | None = None

    async def go(self) -> CopyResult:
        self.done = asyncio.get_running_loop().create_future()
        try:
            self._fill()
            await self.done
        finally:
            # Cancelled: requests in flight are left to their answers or time-outs
            # (which return their slots); their callbacks do nothing more.
            self.ended = True
            for handle in self.waits.values():
                handle.cancel()
            self.waits.clear()
        return CopyResult(
            self.copied,
            self.bytes_read,
            self.bytes_written,
            as_ranges(self.unreadable),
            self.failure,
            as_ranges(self.unavailable),
            self.unavailable_why,
        )

    @property
    def stopped(self) -> bool:
        """The target failed, or an entry was unavailable: no entry more is started."""
        return self.failure is not None or bool(self.unavailable)

    def _fill(self) -> None:
        """Starts entries until `batch` are in flight (none once stopped); ends the copy
        when none is in flight."""
        self.filling = True
        try:
            batch = self.copier.batch
            while self.in_flight < batch and not self.stopped:
                e = next(self.entries, None)
                if e is None:
                    break
                self.in_flight += 1
                entry = _Entry(e, self._candidates(e))
                self._try_next(entry)
        finally:
            self.filling = False
        if self.in_flight == 0 and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _crash(self, exc: Exception) -> None:
        """A callback of this copy raised (an observer's bug, say): the copy ends with
        that exception, as the coroutine it replaces would have, instead of waiting
        forever for an entry that will not end."""
        self.ended = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)

    def _end(self) -> None:
        """An entry is over: the next one may start."""
        self.in_flight -= 1
        if not self.filling and not self.ended:
            self._fill()

    def _candidates(self, entry_id: int) -> list[str]:
        seg = self.plan.segment
        members = [
            seg.bookies[i]
            for i in write_set(entry_id, self.plan.ensemble_size, self.plan.write_quorum)
            if seg.bookies[i] in self.sources
        ]
        if not self.suspect:
            return members
        return [b for b in members if b not in self.suspect] + [
            b for b in members if b in self.suspect
        ]

    def _away(self, entry_id: int) -> list[str]:
        """The entry's write-set members that are away (`CopyTask.away`): they may hold it."""
        if not self.task.away:
            return []
        seg = self.plan.segment
        schedule = write_set(entry_id, self.plan.ensemble_size, self.plan.write_quorum)
        return [seg.bookies[i] for i in schedule if seg.bookies[i] in self.task.away]

    # --- reading -----------------------------------------------------------------------

    def _try_next(self, entry: _Entry) -> None:
        """Asks the entry's next source (after the rate limit's wait, if any); with none
        left, the entry is absent or unavailable."""
        if entry.next < len(entry.candidates):
            source = entry.candidates[entry.next]
            entry.next += 1
            copier = self.copier
            limit = copier.limit
            entry.reserved = copier.estimate
            if limit is not None:
                wait = limit.reserve(entry.reserved)
                if wait > 0:
                    loop = asyncio.get_running_loop()
                    self.waits[entry] = loop.call_later(wait, self._read_after_wait, entry, source)
                    return
            self._read(entry, source)
            return
        self._missed(entry)

    def _read_after_wait(self, entry: _Entry, source: str) -> None:
        del self.waits[entry]
        try:
            self._read(entry, source)
        except Exception as exc:
            self._crash(exc)

    def _read(self, entry: _Entry, source: str) -> None:
        entry.started = self.copier.clock()
        self.client.start_read_entry(
            source,
            self.task.ledger_id,
            entry.entry_id,
            partial(self._read_answered, entry, source),
            request_timeout=self.copier.read_timeout,
        )

    def _read_answered(self, entry: _Entry, source: str, out: Outcome[bytes]) -> None:
        try:
            self._take_read(entry, source, out)
        except Exception as exc:
            self._crash(exc)

    def _take_read(self, entry: _Entry, source: str, out: Outcome[bytes]) -> None:
        copier = self.copier
        body = out.value if isinstance(out, Ok) else None
        limit = copier.limit
        if limit is not None:
            limit.settle(entry.reserved, 0 if body is None else len(body))
        if self.ended:
            return
        lid = self.task.ledger_id
        entry_id = entry.entry_id
        if body is None:
            if isinstance(out, NoAnswer):
                self.suspect.add(source)
            # Only "I have no such entry / ledger" is evidence of absence.
            if not (isinstance(out, ErrorStatus) and out.status in _ABSENCE):
                entry.failed = True
            self._read_failed(entry, source, str(out))
            self._try_next(entry)
            return
        size = len(body)
        copier.estimate = 0.8 * copier.estimate + 0.2 * size
        self.suspect.discard(source)
        try:
            ids = verified_entry_ids(body, self.plan.digest_type, self.plan.password)
        except BookieProtocolError as exc:
            self._read_failed(entry, source, str(exc))
            self._try_next(entry)
            return
        if ids != (lid, entry_id):
            wrong = f"body of ledger {ids[0]} entry {ids[1]} returned"
            self._read_failed(entry, source, wrong)
            self._try_next(entry)
            return
        self.bytes_read += size
        if copier.observer is not None:
            copier.observer(
                CopyEvent(
                    lid,
                    entry_id,
                    source,
                    entries_read=1,
                    bytes_read=size,
                    latency=copier.clock() - entry.started,
                )
            )
        if self.stopped:
            self._end()
            return
        self._write(entry, body)

    def _read_failed(self, entry: _Entry, source: str, detail: str) -> None:
        if entry.why is None:
            entry.why = []
        entry.why.append(f"{source}: {detail}")
        self.copier._emit(
            CopyEvent(self.task.ledger_id, entry.entry_id, source, read_failures=1, detail=detail)
        )

    def _missed(self, entry: _Entry) -> None:
        """No source served the entry: absent (each said so, or served a bad copy, or
        none was left to ask), unless one failed or an away bookie may hold it."""
        entry_id = entry.entry_id
        why = entry.why if entry.why is not None else []
        failed = entry.failed
        away = self._away(entry_id)
        if away:
            failed = True
            why += [f"{b}: not registered, not named lost by the mark" for b in away]
        lid = self.task.ledger_id
        if not failed:
            self.unreadable.append(entry_id)
            self.copier._emit(CopyEvent(lid, entry_id, entries_unreadable=1))
        else:
            if not self.unavailable_why:
                self.unavailable_why = f"entry {entry_id}: " + "; ".join(why)
            self.unavailable.append(entry_id)
            self.copier._emit(CopyEvent(lid, entry_id, entries_unavailable=1))
        self._end()

    # --- writing -----------------------------------------------------------------------

    def _write(self, entry: _Entry, body: bytes) -> None:
        task = self.task
        entry.started = self.copier.clock()
        self.client.start_add_entry(
            task.target,
            task.ledger_id,
            entry.entry_id,
            body,
            self.key,
            partial(self._written, entry, len(body)),
            recovery=True,
            request_timeout=self.copier.add_timeout,
        )

    def _written(self, entry: _Entry, size: int, out: Outcome[int]) -> None:
        try:
            self._take_write(entry, size, out)
        except Exception as exc:
            self._crash(exc)

    def _take_write(self, entry: _Entry, size: int, out: Outcome[int]) -> None:
        if self.ended:
            return
        copier = self.copier
        task = self.task
        entry_id = entry.entry_id
        if isinstance(out, Ok) and out.value == entry_id:
            self.copied += 1
            self.bytes_written += size
            if copier.observer is not None:
                copier.observer(
                    CopyEvent(
                        task.ledger_id,
                        entry_id,
                        task.target,
                        entries_written=1,
                        bytes_written=size,
                        latency=copier.clock() - entry.started,
                    )
                )
        elif self.failure is None:
            if isinstance(out, Ok):
                why = f"acknowledged entry {out.value} instead"
            elif isinstance(out, NoAnswer):
                why = f"did not acknowledge it ({out})"
            else:
                why = f"refused it with {out}"
            self.failure = (
                f"target {task.target}, entry {entry_id} of ledger {task.ledger_id}: {why}"
            )
        self._end()
