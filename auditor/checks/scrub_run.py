"""The deep scrub reads every copy of every entry of every closed ledger, so it must be paced
per bookie and bounded in flight, and what it reports gets copies replaced, so nothing is
reported on a first impression: the same BP-34 discipline as the replicas check.

Driving the deep scrub: every copy read, judged by `scrub.judge_entry`, re-checked before
any report, corrupt and unreadable copies marked.

Per closed ledger (`replicas.skip_reason`; a ledger marked under-replicated is skipped:
re-replication has it in hand):
- each bookie with duties in it is asked once for its listing (what its index holds),
  so that "no such entry" for an entry it lists is told apart from a missing copy;
- every entry is read from every bookie of its write set, `checks.bookie_max_in_flight`
  entries of the ledger at a time and `ENTRIES_OPEN` times that across the run (ledgers
  waiting for room served in turn), and no bookie is sent more than
  `checks.bookie_max_in_flight` of the scrub's reads at once (a gate per bookie, beside
  the client's own cap), each read let
  go only while the bookie's byte budget (`scrub.bytes_per_second`, `scrub_pace`) is not
  in debt; each entry is judged as soon as its copies are in, and its bodies dropped
  (reads sent from the answers' callbacks: no task, coroutine or future per read);
- a ledger with a bookie that did not answer waits `checks.retry_delay` and is scrubbed
  again (`replicas_retry`: the re-checks are owed per (ledger, bookie)); a bookie still
  silent after them is logged and left to the replicas check, which reports silent
  bookies (`bookie_unavailable_registered`);
- a would-be finding goes through `reread.Reread` (a fresh look at the mark, the
  metadata read again and the ledger scrubbed again when it changed) before it is
  reported; corrupt and unreadable copies are then marked under-replicated for their
  bookies (`ctx.mark_underreplicated`, at the version judged), divergent ones only
  reported (which copy is right is not known).

Bookies held by the lost-bookie delay (`ctx.held_bookies`) are neither read nor judged.
`bk-auditor check scrub` runs this once, over the id range of the context (`--from`,
`--to`). The daemon's leader runs it a chunk at a time (`limit` ledgers from its cursor:
`daemon/scrub_cycle.py`), with gates that outlive the chunk (so the byte budget is one
bucket per bookie across chunks, not a fresh burst each) and the pace of the cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import cast

from auditor.bookie.availability import EMPTY, Availability
from auditor.bookie.protocol import Status
from auditor.bookie.results import ErrorStatus, Ok, Outcome
from auditor.checks.context import CheckContext
from auditor.checks.findings import (
    Check,
    CheckReport,
    DropCause,
    LedgerOutcome,
    ScrubCoverage,
    SkipReason,
)
from auditor.checks.looks import first_looks, looks_again
from auditor.checks.pool import bounded
from auditor.checks.recorder import RunRecorder
from auditor.checks.replicas import listing_duties, skip_reason
from auditor.checks.replicas_retry import NO_SILENCE, RecheckRule, RetryQueue, Silence
from auditor.checks.reread import Reread, Suspect
from auditor.checks.scrub import (
    Copy,
    EntryVerdict,
    LedgerScrub,
    as_copy,
    entry_write_sets,
    judge_entry,
)
from auditor.checks.scrub_pace import ByteBudget
from auditor.metadata.model import DigestType, LedgerMetadata
from auditor.metadata.walk import LedgerRecord

__all__ = ["ENTRIES_OPEN", "LEDGERS_AT_ONCE", "Gates", "ScrubRun", "run_scrub_check"]

#: Ledgers scrubbed at once: enough that their ensembles spread over the bookies and one
#: ledger's last reads or list round trip do not leave its bookies idle; the gates, not
#: this, bound what each bookie sees, and `ENTRIES_OPEN` what is held.
LEDGERS_AT_ONCE = 16
#: Entries open at once across the run (read, not yet judged), in units of
#: `checks.bookie_max_in_flight`: their bodies are what the scrub holds in memory.
ENTRIES_OPEN = 4


class _Gate:
    """One bookie's share of the scrub: reads in flight, reads waiting, its byte budget.

    A read goes out (`BookieClient.start_read_entry`: no task, coroutine or future per
    read) while fewer than `in_flight` of the scrub's reads are out to the bookie and
    its budget is not in debt; otherwise it waits here, in the order it came, and goes
    when an answer returns a slot or the budget's timer fires."""

    __slots__ = ("budget", "free", "timer", "waiting")

    def __init__(self, in_flight: int, rate: float) -> None:
        self.free = max(1, in_flight)
        self.budget = ByteBudget(rate)
        self.waiting: deque[tuple[_LedgerReads, _Entry, str]] = deque()
        self.timer: asyncio.TimerHandle | None = None

    def submit(self, reads: _LedgerReads, entry: _Entry, bookie: str) -> None:
        self.waiting.append((reads, entry, bookie))
        self.pump()

    def settle(self, size: int) -> None:
        """An answer came: its slot back, its bytes taken from the budget."""
        self.free += 1
        if size:
            self.budget.spend(size)
        self.pump()

    def pump(self) -> None:
        while self.waiting and self.free > 0 and self.timer is None:
            reads, entry, bookie = self.waiting.popleft()
            if reads.ended:
                continue
            wait = self.budget.delay()
            if wait > 0:
                # The wait is the point: the bookie's byte budget is spent until then.
                self.waiting.appendleft((reads, entry, bookie))
                self.timer = asyncio.get_running_loop().call_later(wait, self._wake)
                return
            self.free -= 1
            reads.send(self, entry, bookie)

    def _wake(self) -> None:
        self.timer = None
        self.pump()


class _Entry:
    """One entry being read: what its bookies returned so far, how many are still out."""

    __slots__ = ("copies", "entry_id", "left")

    def __init__(self, entry_id: int, left: int) -> None:
        self.entry_id = entry_id
        self.copies: dict[str, Copy] = {}
        self.left = left


class _Room:
    """Room for open entries across the run, and the ledgers waiting for it, served in
    the order they came (a ledger that just closed an entry goes behind them)."""

    __slots__ = ("free", "waiting")

    def __init__(self, entries: int) -> None:
        self.free = max(1, entries)
        self.waiting: deque[_LedgerReads] = deque()

    def queue(self, reads: _LedgerReads) -> None:
        if not reads.queued:
            reads.queued = True
            self.waiting.append(reads)

    def serve(self) -> None:
        while self.free > 0 and self.waiting:
            reads = self.waiting.popleft()
            reads.queued = False
            reads.fill()


class _LedgerReads:
    """Every copy of a ledger's entries read through the bookies' gates, `limit` entries at
    a time, each entry judged as soon as its copies are in and its bodies dropped; driven
    by the answers' callbacks, `done` once the last entry is judged."""

    def __init__(
        self,
        run: ScrubRun,
        md: LedgerMetadata,
        held: frozenset[str],
        listings: dict[str, Availability],
        on_verdict: Callable[[EntryVerdict], None] | None = None,
    ) -> None:
        bk = run.cfg.bookkeeper
        self.run = run
        self.on_verdict = on_verdict
        self.lid = md.ledger_id
        self.digest: DigestType = md.digest_type or bk.recovery_digest_type
        self.password = md.password if md.password is not None else bk.recovery_password
        self.held = held
        self.listings = listings
        self.todo = entry_write_sets(md)
        self.limit = max(1, run.cfg.checks.bookie_max_in_flight)
        self.open = 0
        self.ended = False
        #: In the run's `_Room` queue.
        self.queued = False
        #: Every entry started.
        self.exhausted = False
        self.out = LedgerScrub(md.ledger_id)
        self.done: asyncio.Future[LedgerScrub] = asyncio.get_running_loop().create_future()

    def fill(self) -> None:
        """Entries started until `limit` are open, the run has no room, or none is left;
        done when all are judged."""
        if self.ended:
            return
        room = self.run.room
        while self.open < self.limit and not self.exhausted:
            if room.free <= 0:
                room.queue(self)
                return
            item = next(self.todo, None)
            if item is None:
                self.exhausted = True
                break
            entry_id, bookies = item
            asked = [b for b in bookies if b not in self.held]
            entry = _Entry(entry_id, len(asked))
            if not asked:
                self._judge(entry)
                continue
            self.open += 1
            room.free -= 1
            for bookie in asked:
                self.run.gates.of(bookie).submit(self, entry, bookie)
        if self.exhausted and self.open == 0 and not self.done.done():
            self.ended = True
            self.done.set_result(self.out)

    def send(self, gate: _Gate, entry: _Entry, bookie: str) -> None:
        self.run.ctx.bookies.start_read_entry(
            bookie, self.lid, entry.entry_id, partial(self._answered, gate, entry, bookie)
        )

    def _answered(self, gate: _Gate, entry: _Entry, bookie: str, out: Outcome[bytes]) -> None:
        try:
            gate.settle(len(out.value) if isinstance(out, Ok) else 0)
            if self.ended:
                return
            entry.copies[bookie] = as_copy(out)
            entry.left -= 1
            if entry.left == 0:
                room = self.run.room
                self.open -= 1
                room.free += 1
                self._judge(entry)
                if self.exhausted:
                    self.fill()  # done when it was the last
                else:
                    room.queue(self)
                room.serve()
        except Exception as exc:  # a callback must not raise: the scrub does, from `done`
            if not self.done.done():
                self.done.set_exception(exc)
            self.end()

    def end(self) -> None:
        """No more reads or judgements; the room of its open entries back to the run."""
        if self.ended:
            return
        self.ended = True
        room = self.run.room
        room.free += self.open
        self.open = 0
        room.serve()

    def _judge(self, entry: _Entry) -> None:
        verdict = judge_entry(
            self.lid, entry.entry_id, entry.copies, self.digest, self.password, self.listings
        )
        self.out.add(verdict)
        if self.on_verdict is not None:
            self.on_verdict(verdict)


class Gates:
    """Every bookie's gate, created as bookies are first read, at one rate for all."""

    def __init__(self, in_flight: int, rate: float) -> None:
        self.in_flight = in_flight
        self.rate = rate
        self._by_bookie: dict[str, _Gate] = {}

    def of(self, bookie: str) -> _Gate:
        gate = self._by_bookie.get(bookie)
        if gate is None:
            gate = self._by_bookie[bookie] = _Gate(self.in_flight, self.rate)
        return gate

    def set_rate(self, rate: float) -> None:
        """A new pace for every bookie, from now (`ByteBudget.set_rate`)."""
        self.rate = rate
        for gate in self._by_bookie.values():
            gate.budget.set_rate(rate)


@dataclass(frozen=True, slots=True)
class _Found:
    """A would-be finding: the scrub of one version of the metadata."""

    md: LedgerMetadata
    version: int
    scrub: LedgerScrub


class ScrubRun:
    """One run of the deep scrub (see the module)."""

    def __init__(
        self, ctx: CheckContext, *, limit: int | None = None, gates: Gates | None = None
    ) -> None:
        self.ctx = ctx
        #: The first pass stops after this many ledgers (None: the whole walk).
        self.limit = limit
        #: The id of the last ledger the first pass walked (None: none).
        self.last_walked: int | None = None
        #: Whether the first pass walked to the end of the ledgers (not stopped by `limit`).
        self.exhausted = False
        self.cfg = ctx.config
        self.recorder = RunRecorder.for_context(ctx, Check.SCRUB, scrub=ScrubCoverage())
        self.log = self.recorder.log
        self.walker = ctx.walker()
        self.rule = RecheckRule(self.cfg.checks.retry_attempts)
        self.retry = RetryQueue()
        self.marked: set[int] = set()
        self.gates = gates or Gates(
            self.cfg.checks.bookie_max_in_flight, self.cfg.scrub.bytes_per_second
        )
        self.room = _Room(ENTRIES_OPEN * self.cfg.checks.bookie_max_in_flight)
        self.reread: Reread[_Found] = Reread(
            self.recorder, self.walker, self._report, marked=self._fresh_mark
        )

    @property
    def report(self) -> CheckReport:
        return self.recorder.report

    @property
    def coverage(self) -> ScrubCoverage:
        cov = self.report.scrub
        if cov is None:
            cov = self.report.scrub = ScrubCoverage()
        return cov

    # --- reading ---------------------------------------------------------------------------

    async def _listings(
        self, md: LedgerMetadata, bookies: Iterable[str]
    ) -> dict[str, Availability]:
        """What each bookie's index holds of the ledger, for those that could say."""
        asked = [(b, self.ctx.bookies.start_list(b, md.ledger_id)) for b in bookies]
        out: dict[str, Availability] = {}
        try:
            for bookie, listing in asked:
                answer = await listing
                if isinstance(answer, Ok):
                    out[bookie] = answer.value
                elif isinstance(answer, ErrorStatus) and answer.status is Status.ENOLEDGER:
                    out[bookie] = EMPTY
        finally:
            for _, listing in asked:
                if not listing.done():
                    listing.cancel()
        return out

    async def scrub(
        self, md: LedgerMetadata, on_verdict: Callable[[EntryVerdict], None] | None = None
    ) -> LedgerScrub:
        """Every copy of every entry of a closed ledger, read and judged; `on_verdict` is
        told each entry's verdict (`explain --scrub` accounts for each copy with it)."""
        held = self.ctx.held_bookies()
        listings = await self._listings(md, [b for b in listing_duties(md) if b not in held])
        reads = _LedgerReads(self, md, held, listings, on_verdict)
        try:
            reads.fill()
            return await reads.done
        finally:
            # Cancelled: reads not sent are dropped, answers still due only return slots.
            reads.end()

    # --- one ledger ------------------------------------------------------------------------

    async def judge(self, rec: LedgerRecord, silence: Silence = NO_SILENCE) -> LedgerOutcome | None:
        """How the ledger came out (recorded); None when it waits for a retry pass."""
        doubt = DropCause.RETRY_SUCCEEDED if silence.looks else None
        return await self.reread.judge(rec, partial(self._look, silence=silence), doubt=doubt)

    async def _look(
        self, md: LedgerMetadata, rec: LedgerRecord, *, silence: Silence
    ) -> LedgerOutcome | Suspect[_Found] | None:
        version = rec.znode_version
        skip = skip_reason(md)
        if skip is not None:
            return self.recorder.skipped(md.ledger_id, skip, version)
        if md.ledger_id in self.marked:
            return self.recorder.skipped(md.ledger_id, SkipReason.UNDERREPLICATED, version)
        scrub = await self.scrub(md)
        now = silence.after(scrub.silent) if scrub.silent else NO_SILENCE
        if self.rule.waits(now):
            self.retry.add(md.ledger_id, now)
            return None
        self._count(scrub)
        for bookie, reason in sorted(scrub.silent.items()):
            self.log.info(
                "bookie did not answer the scrub's reads; its copies left unverified",
                ledger_id=md.ledger_id,
                bookie=bookie,
                reason=reason,
            )
        if not scrub.found:
            return self.recorder.ok(md.ledger_id, version)
        return Suspect(_Found(md, version, scrub))

    def _count(self, scrub: LedgerScrub) -> None:
        cov = self.coverage
        cov.entries += scrub.entries
        cov.copies_verified += scrub.copies_verified
        cov.bytes_verified += scrub.bytes_verified
        cov.copies_absent += scrub.copies_absent
        cov.copies_unverified += scrub.copies_silent

    async def _fresh_mark(self, ledger_id: int, version: int) -> LedgerOutcome | None:
        """The look before reporting: a ledger marked meanwhile is re-replication's."""
        if await self.ctx.urm.get_mark(ledger_id) is None:
            return None
        return self.recorder.skipped(ledger_id, SkipReason.UNDERREPLICATED, version)

    async def _report(self, found: _Found) -> LedgerOutcome:
        md, version, scrub = found.md, found.version, found.scrub
        outcome = self.recorder.violation(md.ledger_id, version, scrub.violations(md, version))
        to_mark = scrub.to_mark()
        if to_mark:
            await self.ctx.mark_underreplicated(self.report, md.ledger_id, to_mark, version=version)
        return outcome

    # --- the passes ------------------------------------------------------------------------

    async def _walk(self) -> AsyncIterator[tuple[LedgerRecord, Silence]]:
        """The first looks, in id order, up to `limit` ledgers."""
        walked = 0
        # An async generator: closed here when the limit stops the walk early.
        looks = cast(
            AsyncGenerator[tuple[LedgerRecord, Silence], None],
            first_looks(self.walker, self.log, str(Check.SCRUB), self.cfg.checks),
        )
        async with contextlib.aclosing(looks):
            async for item in looks:
                self.last_walked = item[0].ledger_id
                yield item
                walked += 1
                if self.limit is not None and walked >= self.limit:
                    return
        self.exhausted = True

    def _pending(
        self, waiting: Iterable[tuple[int, Silence]]
    ) -> AsyncIterator[tuple[LedgerRecord, Silence]]:
        return looks_again(self.walker, self.recorder, waiting)

    async def _pass(self, items: AsyncIterator[tuple[LedgerRecord, Silence]]) -> None:
        async def one(item: tuple[LedgerRecord, Silence]) -> None:
            await self.judge(*item)

        await bounded(items, one, LEDGERS_AT_ONCE)

    async def run(self) -> CheckReport:
        listing = await self.ctx.urm.read_marks()
        self.marked = set(listing.marked_ids())
        await self._pass(self._walk())
        for attempt in range(1, self.rule.bound + 1):
            if not self.retry:
                break
            pending, self.retry = self.retry, RetryQueue()
            self.log.info(
                "scrubbing again the ledgers whose bookies did not answer, after a delay",
                ledgers=len(pending),
                delay_s=self.cfg.checks.retry_delay,
                attempt=attempt,
            )
            # The delay is the point (BP-34): give a slow or restarting bookie time.
            await asyncio.sleep(self.cfg.checks.retry_delay)
            await self._pass(self._pending(pending.waiting()))
        return self.recorder.finish(self.walker)


async def run_scrub_check(ctx: CheckContext) -> CheckReport:
    started = time.monotonic()
    report = await ScrubRun(ctx).run()
    ctx.log.info(
        "scrub finished",
        ledgers_checked=report.ledgers_checked,
        violations=report.violations.total,
        bytes_verified=0 if report.scrub is None else report.scrub.bytes_verified,
        seconds=round(time.monotonic() - started, 3),
    )
    return report
