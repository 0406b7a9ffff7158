"""The replication worker's loop: take a marked ledger, repair it, commit, verify, unmark.

BookKeeper's `ReplicationWorker` step by step, with the changes the issue asks for:

* **Take** a ledger as Java does (`ReplicationQueue`: shuffled walk, the ephemeral
  `locks/urL%010d` lock), so Java workers and ours never hold one ledger at once.
* **Plan** with the replicas check's own analysis (`worker/plan.py`): a position is bad
  when its bookie is lost or lacks entries it must hold; a registered bookie that did
  not answer is unknown, not bad, and the ledger is tried again later.
* **Copy** only what the bad position must hold, verified, unchanged, to a target the
  placement policy allows (`worker/targets.py`, `worker/copy.py`). The copy stops the
  moment the ZooKeeper connection is suspended: a worker that may have lost its lock
  writes nothing more.
* **Commit** the ensemble change only once the target acknowledged every entry, with a
  version check, fenced on our lock (`metadata/ledger_update.py`): a worker whose
  session is gone cannot change metadata. One write per segment.
* **Verify** by planning again from fresh metadata and fresh bookie answers; only an
  empty plan unmarks (versioned: a mark changed since the lock was taken stays).
* **Open ledgers**: the under-replicated tail of a ledger that is not closed is never
  copied. Its closed segments are repaired; the lock is held for
  `openLedgerRereplicationGracePeriod` (the writer may replace the bookie itself) and
  then released with the mark kept. Fencing and recovering such a ledger is not built
  yet (issue 16, item 5): until it is, such a ledger waits for its writer.
* **Unrecoverable** ledgers (an entry with no readable copy anywhere) are reported once
  with their ranges, kept marked for an operator, and tried again only after
  `worker.unrecoverable_retry`; the lock is held meanwhile, so no other worker (ours)
  retries them in between (upstream loops on them forever: apache/bookkeeper#4872).
* Other failures hold the lock for an exponential delay capped at
  `lockReleaseOfFailedLedgerGracePeriod` (upstream's rule), then release it.

`kill -9` at any step leaves the cluster consistent: until the commit the metadata
names only the old bookies (copies on the target are unreferenced garbage, repeated
harmlessly by the next attempt); the commit is one conditional write; the mark goes
only after the commit and a successful verification; the lock is ephemeral.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from auditor.bookie.client import BookieClient
from auditor.checks.context import CheckContext
from auditor.checks.placement_run import placement_policy
from auditor.checks.replicas_run import bookie_answers
from auditor.config import AuditorConfig
from auditor.errors import AuditorError
from auditor.logs import get_logger
from auditor.metadata.ledger_update import (
    ConcurrentUpdateError,
    EnsembleConflictError,
    LedgerDeletedError,
    replace_bookies,
    update_ledger,
)
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.paths import ledger_path
from auditor.metadata.replication import ReplicationQueue, TakenLedger
from auditor.metadata.serde import LedgerMetadataFormatError, decode_ledger_metadata
from auditor.topology.racks import open_rack_resolver
from auditor.worker.copy import CopyResult, CopyTask, FragmentCopier
from auditor.worker.plan import LedgerPlan, Repair, plan_ledger
from auditor.worker.state import Failure, InHand, Unrecoverable, WorkerState
from auditor.worker.targets import NoTargetError, choose_targets
from auditor.zk import FencedOutError, NoNodeError, ZkClient, ZkUnavailableError

#: A safety walk of the marks when no watch fired for this long (s).
IDLE_REWALK = 60.0
#: Upstream's exponential steps before the failed-ledger delay reaches its cap.
BACKOFF_STEPS = 5


class Connection(Protocol):
    """The daemon's view of its ZooKeeper session."""

    @property
    def connected(self) -> asyncio.Event:
        """Set while connected."""

    @property
    def disconnected(self) -> asyncio.Event:
        """Set while suspended or lost (cleared on reconnecting)."""


@dataclass(frozen=True, slots=True)
class WorkerConnection:
    """A `Connection` from the daemon's two events."""

    connected: asyncio.Event
    disconnected: asyncio.Event


class Disconnected(AuditorError):
    """The ZooKeeper connection was suspended mid-repair: the worker stopped writing."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one taken ledger ended; `hold` > 0 keeps the lock that long before releasing."""

    done: bool
    failure: Failure | None = None
    detail: str = ""
    hold: float = 0.0


def default_lock_holder() -> str:
    """What Java's worker writes in a lock: this host's canonical (fully qualified) name."""
    return socket.getfqdn() or "localhost"


def failed_delay(grace_ms: int, failures: int) -> float:
    """Upstream's failed-ledger delay (s): grace/32 doubled per earlier failure, capped."""
    base = (grace_ms // 2**BACKOFF_STEPS) / 1000.0
    if failures < BACKOFF_STEPS:
        return float(base * 2**failures)
    return grace_ms / 1000.0


def ranges_text(ranges: Iterable[tuple[int, int]]) -> str:
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


class ReplicationWorker:
    """One daemon's worker: `run()` until cancelled; `ledgers_in_parallel` repairs at once."""

    def __init__(
        self,
        ctx: CheckContext,
        conn: Connection,
        state: WorkerState,
        *,
        holder: str,
        ledgers_in_parallel: int = 1,
        unrecoverable_retry: float = 3600.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        log: Any = None,
    ) -> None:
        self.ctx = ctx
        self.zk: ZkClient = ctx.zk
        self.config: AuditorConfig = ctx.config
        self.conn = conn
        self.state = state
        self.holder = holder
        self.parallel = max(1, ledgers_in_parallel)
        self.unrecoverable_retry = unrecoverable_retry
        self.rng = rng if rng is not None else random.Random()
        self.clock = clock
        self.log = log if log is not None else get_logger("auditor.worker")
        bk = self.config.bookkeeper
        self.queue = ReplicationQueue(
            self.zk, ctx.root, holder, rng=self.rng, rate_limit=bk.zkReplicationTaskRateLimit
        )
        self.copier = FragmentCopier(
            ctx.bookies,
            batch=max(1, bk.rereplicationEntryBatchSize),
            bytes_per_second=float(max(bk.replicationRateByBytes, 0)),
            read_timeout=float(bk.readEntryTimeout),
            add_timeout=float(bk.readEntryTimeout),
            observer=self._counted,
        )
        #: Consecutive failures per ledger in this process (upstream's count, for the delay).
        self._failures: dict[int, int] = {}
        self._holds: set[asyncio.Task[None]] = set()
        #: Set when a lock is released here (a slot for another ledger may be free).
        self.released = asyncio.Event()

    @property
    def bookies(self) -> BookieClient:
        return self.ctx.bookies

    # --- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Takes and repairs ledgers until cancelled; never ends on a failure of one ledger."""
        self.state.enabled = self.state.running = True
        slots = asyncio.Semaphore(self.parallel)
        active: set[asyncio.Task[None]] = set()
        try:
            while True:
                await slots.acquire()
                try:
                    taken = await self._next()
                except BaseException:
                    slots.release()
                    raise
                task = asyncio.ensure_future(self._handle(taken))
                active.add(task)

                def done(t: asyncio.Task[None]) -> None:
                    active.discard(t)
                    slots.release()

                task.add_done_callback(done)
        finally:
            self.state.running = False
            for t in (*active, *self._holds):
                t.cancel()
            await asyncio.gather(*active, *self._holds, return_exceptions=True)
            for taken_id in list(self.state.in_hand):
                self.state.in_hand.pop(taken_id, None)

    async def _next(self) -> TakenLedger:
        """Waits until a marked ledger is free, replication enabled and ZooKeeper connected."""
        while True:
            await self.conn.connected.wait()
            try:
                if await self._disabled():
                    self.state.waiting = "replication disabled (underreplication/disable)"
                    await self.queue.wait_enabled()
                    continue
                changed = await self.queue.changed()
                taken = await self.queue.take()
            except ZkUnavailableError as exc:
                self.state.waiting = f"ZooKeeper unavailable: {exc}"
                await asyncio.sleep(0.1)  # the state change that explains it is on its way
                continue
            if taken is not None:
                self.state.waiting = ""
                return taken
            self.state.waiting = "no free marked ledger"
            await self._until(changed, self.released, within=IDLE_REWALK)

    async def _disabled(self) -> bool:
        return await self.zk.exists(f"{self.ctx.root}/underreplication/disable") is not None

    @staticmethod
    async def _until(*events: asyncio.Event, within: float) -> None:
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _handle(self, taken: TakenLedger) -> None:
        """One ledger, start to end: its outcome decides the lock's fate."""
        start = self.clock()
        lid = taken.ledger_id
        self.state.in_hand[lid] = InHand(lid, start, "planning")
        self.log.info("ledger taken for re-replication", ledger=lid, missing=taken.missing_replicas)
        try:
            outcome = await self._repair(taken)
        except asyncio.CancelledError:
            self.state.in_hand.pop(lid, None)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._release(taken, start))
            raise
        except Disconnected as exc:
            outcome = Outcome(False, Failure.LOCK_LOST, str(exc))
        except FencedOutError as exc:
            outcome = Outcome(False, Failure.LOCK_LOST, f"our lock is gone: {exc}")
        except Exception as exc:  # one ledger's failure never ends the worker
            outcome = Outcome(False, Failure.ERROR, f"{type(exc).__name__}: {exc}")
        if outcome.done:
            self._failures.pop(lid, None)
            self.state.in_hand.pop(lid, None)
            self.state.released(self.clock() - start)
            self.released.set()
            return
        assert outcome.failure is not None
        self.state.failures[outcome.failure] += 1
        level = "error" if outcome.failure is Failure.UNRECOVERABLE else "warning"
        getattr(self.log, level)(
            "ledger not re-replicated",
            ledger=lid,
            reason=str(outcome.failure),
            detail=outcome.detail,
            lock_held_for_s=round(outcome.hold, 3),
        )
        if outcome.hold <= 0 or outcome.failure is Failure.LOCK_LOST:
            self.state.in_hand.pop(lid, None)
            await self._release(taken, start)
            return
        # Hold the lock (so no worker takes the ledger before its time), then release it.
        until = self.clock() + outcome.hold
        held = self.state.in_hand.get(lid)
        self.state.in_hand[lid] = InHand(
            lid, start, "deferred", held.fragments if held else (), until
        )
        hold = asyncio.ensure_future(self._hold_then_release(taken, start, outcome.hold))
        self._holds.add(hold)
        hold.add_done_callback(self._holds.discard)

    async def _hold_then_release(self, taken: TakenLedger, start: float, seconds: float) -> None:
        try:
            await asyncio.sleep(seconds)
        finally:
            self.state.in_hand.pop(taken.ledger_id, None)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._release(taken, start))

    async def _release(self, taken: TakenLedger, start: float) -> None:
        try:
            await self.queue.release(taken)
        except ZkUnavailableError as exc:
            # The lock is ephemeral: it goes with the session if the delete could not.
            self.log.warning("could not release a replication lock", ledger=taken.ledger_id,
                             error=str(exc))
        self.state.released(self.clock() - start)
        self.released.set()

    # --- one ledger ----------------------------------------------------------------------------

    def _step(self, lid: int, step: str, fragments: tuple[str, ...] | None = None) -> None:
        held = self.state.in_hand.get(lid)
        if held is not None:
            self.state.in_hand[lid] = InHand(
                lid, held.since, step, held.fragments if fragments is None else fragments
            )

    def _path(self, lid: int) -> str:
        return ledger_path(self.ctx.manager, self.ctx.root, lid)

    async def _read(self, lid: int) -> LedgerMetadata | None:
        try:
            data, stat = await self.zk.get(self._path(lid))
        except NoNodeError:
            return None
        return decode_ledger_metadata(data, lid, int(stat.ctime))

    async def _plan(self, md: LedgerMetadata, taken: TakenLedger) -> LedgerPlan:
        registered = await self.ctx.registered()
        answers = await bookie_answers(self.ctx, md)
        return plan_ledger(
            md,
            registered=registered.available,
            answers=answers,
            mark_replicas=taken.missing_replicas,
        )

    def _failed(self, lid: int, failure: Failure, detail: str) -> Outcome:
        n = self._failures.get(lid, 0)
        self._failures[lid] = n + 1
        grace = self.config.bookkeeper.lockReleaseOfFailedLedgerGracePeriod
        return Outcome(False, failure, detail, failed_delay(grace, n))

    async def _repair(self, taken: TakenLedger) -> Outcome:
        lid = taken.ledger_id
        try:
            md = await self._read(lid)
        except LedgerMetadataFormatError as exc:
            return self._failed(lid, Failure.ERROR, f"metadata does not decode: {exc}")
        if md is None:  # deleted: nothing to repair, the mark goes (upstream §1.4)
            await self.queue.mark_replicated(taken)
            self.log.info("marked ledger no longer exists; mark removed", ledger=lid)
            return Outcome(True)
        plan = await self._plan(md, taken)
        if plan.skipped is not None and not plan.repairs and not plan.open_tail:
            return self._failed(lid, Failure.ERROR, f"cannot be planned: {plan.skipped}")
        if not plan.repairs and not plan.open_tail:
            if plan.unknown:
                return self._failed(
                    lid, Failure.UNKNOWN_BOOKIES, f"no answer from {', '.join(plan.unknown)}"
                )
            unmarked = await self.queue.mark_replicated(taken)
            self.state.ledgers_found_healthy += 1
            self.log.info(
                "marked ledger has every copy; mark removed" if unmarked else
                "marked ledger has every copy; its mark changed meanwhile and stays",
                ledger=lid,
            )
            return Outcome(True)
        copied, outcome = await self._repair_segments(taken, md, plan.repairs)
        if outcome is not None:
            return outcome
        if plan.open_tail:
            # Never copied unfenced; the writer may still replace the bookie itself.
            grace = self.config.bookkeeper.openLedgerRereplicationGracePeriod / 1000.0
            tail = "; ".join(_describe(r) for r in plan.open_tail)
            return Outcome(
                False,
                Failure.OPEN_LEDGER,
                f"open ledger: its last segment is under-replicated ({tail}); kept marked, "
                "lock held for openLedgerRereplicationGracePeriod (recovery not built yet)",
                grace,
            )
        return await self._verify(taken, copied)

    async def _repair_segments(
        self, taken: TakenLedger, md: LedgerMetadata, repairs: tuple[Repair, ...]
    ) -> tuple[int, Outcome | None]:
        """Copies and commits segment by segment; (fragments committed, a failure or None)."""
        lid = taken.ledger_id
        registered = await self.ctx.registered()
        writable = registered.writable
        resolver = await open_rack_resolver(self.zk, self.ctx.root, self.config, log=self.log)
        known = frozenset(registered.available) | frozenset(
            b for s in md.segments for b in s.bookies
        )
        locations = await resolver.locations(sorted(known | writable))
        policy = placement_policy(self.config.bookkeeper, frozenset(known | writable), locations)
        by_segment: dict[int, list[Repair]] = {}
        for r in repairs:
            by_segment.setdefault(r.segment_index, []).append(r)
        committed = 0
        unreadable: list[tuple[int, int]] = []
        for seg_index, seg_repairs in sorted(by_segment.items()):
            try:
                targets = choose_targets(
                    md,
                    seg_index,
                    [r.bookie_index for r in seg_repairs],
                    writable=writable,
                    policy=policy,
                    locations=locations,
                    rng=self.rng,
                )
            except NoTargetError as exc:
                return committed, self._failed(lid, Failure.NO_TARGET, str(exc))
            lines = tuple(
                f"{_describe(r)} -> {targets[r.bookie_index]}" for r in seg_repairs
            )
            self._step(lid, "copying", lines)
            self.log.info("copying fragments", ledger=lid, fragments=list(lines))
            results = [
                await self._copy(
                    CopyTask(
                        ledger_id=lid,
                        metadata=md,
                        segment_index=seg_index,
                        bookie_index=r.bookie_index,
                        target=targets[r.bookie_index],
                        entries=r.entries,
                        sources=r.sources,
                    )
                )
                for r in seg_repairs
            ]
            for r, res in zip(seg_repairs, results, strict=True):
                unreadable.extend(res.unreadable)
                if res.failure is not None:
                    return committed, self._failed(
                        lid, Failure.TARGET_FAILED,
                        f"{_describe(r)} -> {targets[r.bookie_index]}: {res.failure}",
                    )
            if any(res.unreadable for res in results):
                continue  # never commit a copy that lacks entries
            self._step(lid, "committing")
            first = md.segments[seg_index].first_entry_id
            replacements = {r.old: targets[r.bookie_index] for r in seg_repairs}
            try:
                result = await update_ledger(
                    self.queue.fenced(taken),
                    self.zk,
                    self._path(lid),
                    lid,
                    replace_bookies(first, replacements),
                )
            except LedgerDeletedError:
                await self.queue.mark_replicated(taken)
                return committed, Outcome(True)
            except (ConcurrentUpdateError, EnsembleConflictError) as exc:
                # The metadata moved under us (a writer's ensemble change, another
                # repair): nothing is written; the next attempt plans on what is there.
                return committed, self._failed(lid, Failure.METADATA_CONFLICT, str(exc))
            if result.written:
                committed += len(seg_repairs)
                self.state.fragments_replicated += len(seg_repairs)
                self.log.info(
                    "fragments committed", ledger=lid, segment_first_entry=first,
                    replaced=replacements, metadata_version=result.version,
                )
            md = result.metadata
        if unreadable:
            now = self.clock()
            merged = tuple(sorted(set(unreadable)))
            self.state.unrecoverable[lid] = Unrecoverable(
                lid, merged, self.state.unrecoverable.get(lid, Unrecoverable(
                    lid, merged, now, 0.0)).since, now + self.unrecoverable_retry
            )
            return committed, Outcome(
                False,
                Failure.UNRECOVERABLE,
                f"entries with no readable copy anywhere: {ranges_text(merged)}; kept marked "
                "for an operator",
                self.unrecoverable_retry,
            )
        self.state.unrecoverable.pop(lid, None)
        return committed, None

    async def _copy(self, task: CopyTask) -> CopyResult:
        """The copy, stopped the moment the ZooKeeper connection is suspended."""
        if self.conn.disconnected.is_set():
            raise Disconnected("ZooKeeper connection suspended before the copy")
        copy = asyncio.ensure_future(self.copier.copy(task))
        lost = asyncio.ensure_future(self.conn.disconnected.wait())
        try:
            await asyncio.wait([copy, lost], return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not copy.done():
                copy.cancel()
            await asyncio.gather(copy, lost, return_exceptions=True)
        if copy.cancelled():
            raise Disconnected("ZooKeeper connection suspended: copy stopped")
        return copy.result()

    async def _verify(self, taken: TakenLedger, committed: int) -> Outcome:
        """Plans again from fresh metadata and answers; unmarks only an empty plan."""
        lid = taken.ledger_id
        self._step(lid, "verifying")
        md = await self._read(lid)
        if md is None:
            await self.queue.mark_replicated(taken)
            return Outcome(True)
        plan = await self._plan(md, taken)
        if plan.repairs or plan.open_tail or plan.unknown:
            left = "; ".join(_describe(r) for r in (*plan.repairs, *plan.open_tail))
            unknown = f"; no answer from {', '.join(plan.unknown)}" if plan.unknown else ""
            return self._failed(lid, Failure.VERIFY_FAILED, f"still to repair: {left}{unknown}")
        unmarked = await self.queue.mark_replicated(taken)
        self.state.ledgers_replicated += 1
        self.log.info(
            "ledger re-replicated",
            ledger=lid,
            fragments=committed,
            mark_removed=unmarked,
        )
        return Outcome(True)

    def _counted(self, event: Any) -> None:
        """The copier's counts, into the state the metrics read."""
        self.state.entries_read += getattr(event, "entries_read", 0)
        self.state.entries_written += getattr(event, "entries_written", 0)
        self.state.bytes_read += getattr(event, "bytes_read", 0)
        self.state.bytes_written += getattr(event, "bytes_written", 0)


def _describe(r: Repair) -> str:
    return (
        f"segment {r.segment_index} [{r.first_entry}-{r.last_entry}] position {r.bookie_index} "
        f"{r.old} ({r.why})"
    )
