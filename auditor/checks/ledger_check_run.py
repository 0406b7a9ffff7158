"""Runs the ledger check (BookKeeper's checkAllLedgers) over a whole cluster.

The analysis is `auditor.checks.ledger_check`; this module gathers its inputs
(metadata from the walk, each open ledger's LAC, the single-entry probe, the
sampled entry reads) and records what it finds. How it behaves, and where it
chooses differently from upstream:

* **Replication disabled** at the start: nothing is read and nothing marked;
  the ledger ids are listed (no metadata reads) so the report counts every
  ledger as skipped for that reason. Disabled during the run (the flag is looked at
  about once a second, and again before every mark): no new ledger is
  started, every remaining ledger of the walk is counted as skipped for that
  reason, ledgers already in progress finish and are reported, but none is
  marked. Upstream stops the same way but counts nothing.
* **Concurrency**: at most `auditorMaxNumberOfConcurrentOpenLedgerOperations`
  ledgers are in progress (upstream bounds only the opens with it); entry
  reads are bounded per bookie by the client's in-flight cap and, when
  `inFlightReadEntryNumInLedgerChecker` > 0, by that many across the run.
  Waiting for a ledger slot longer than
  `auditorAcquireConcurrentOpenLedgerOperationsTimeOutMSec` logs a warning
  and keeps waiting: every bookie call has its own timeout, so a slot always
  frees, whereas upstream's early end would leave ledgers unchecked without
  a trace.
* **LAC of a ledger that is not closed**: READ_LAC (never fencing) to every
  available bookie of the last segment; the largest LAC vouched for wins
  (explicit LAC, or the LAC in a last entry whose digest verifies). When no
  bookie answers at all the LAC is unknown and taken as -1: the last
  segment is then reduced to its first entry and the single-entry probe
  decides whether it is checked (so a last segment whose bookies answer
  nothing ends up reported, and one that is merely empty does not). Upstream
  fails the whole run instead.
* **Reads** never fence. A read fails on an error status, no answer
  (timeout, unreachable, dropped), or a body that is not the entry asked for
  or whose digest does not verify. The first failure makes the bookie bad for
  that fragment, and its remaining reads there are not sent (upstream sends
  them all; with a 100% percentage on a bookie that lost a big ledger that is
  a read per entry for nothing).
* **Before reporting** a ledger with bad fragments its metadata is read
  again: deleted meanwhile, it is counted as skipped (`deleted`); changed
  (an ensemble replaced, the ledger closed), it is checked again with the new
  metadata, up to three times in all, and skipped (`metadata_changing`) if it
  is still changing then (a deleted or changed ledger that ends up not
  reported is counted under `would_be_violations_dropped`, cause
  `ledger_deleted` or `metadata_changed`). Otherwise the violation `unreadable_fragments` is
  reported (bookie: the first bad bookie) and, with marking on, the ledger
  is marked under-replicated with every bad bookie as a missing replica.
* Undecodable metadata is `metadata_invalid`; ledgers deleted during the
  walk are counted as skipped (`deleted`). Nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from auditor.bookie.results import EntryRead, LacRead, NoAnswer, Outcome, Unanswered
from auditor.checks.context import CheckContext
from auditor.checks.findings import (
    Category,
    Check,
    CheckReport,
    DropCause,
    SkipReason,
    Violation,
    metadata_invalid,
)
from auditor.checks.ledger_check import (
    BadFragment,
    LacAnswer,
    LedgerPlan,
    Probe,
    ReadFailure,
    Verdict,
    bad_bookie_ids,
    classify_read,
    entry_may_exist,
    entry_ranges,
    evaluate,
    lac_from_answers,
    metadata_problem,
    plan_ledger,
    single_entry_probe,
    violation_detail,
)
from auditor.checks.progress import Progress
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.paths import ledger_path
from auditor.metadata.registry import BookieSet
from auditor.metadata.serde import LedgerMetadataFormatError, decode_ledger_metadata
from auditor.metadata.walk import LedgerRecord
from auditor.zk import NoNodeError

__all__ = ["ledger_violation", "run_ledger_check"]

#: Analyses of one ledger when its metadata keeps changing under us.
_ATTEMPTS: Final = 3
#: Seconds a look at the replication flag (or at the registered bookies) stays fresh.
_FLAG_TTL: Final = 1.0
_BOOKIES_TTL: Final = 5.0
_NOT_ASKED: Final = NoAnswer(Unanswered.NOT_RESOLVED, "bookie is neither writable nor read-only")


async def run_ledger_check(ctx: CheckContext, *, rng: random.Random | None = None) -> CheckReport:
    """Checks every ledger; `rng` drives the sampling (tests pass a seeded one)."""
    return await _Run(ctx, rng or random.Random()).run()


async def ledger_violation(
    ctx: CheckContext, md: LedgerMetadata, version: int, *, rng: random.Random | None = None
) -> Violation | None:
    """One ledger through the check's reads and analysis, read-only (for `explain`).

    The same plan, reads and verdict as a run, minus the re-read before
    reporting and the marking; None when every read passed.
    """
    problem = metadata_problem(md)
    if problem is not None:
        path = ledger_path(ctx.manager, ctx.root, md.ledger_id)
        return metadata_invalid(md.ledger_id, path, version, problem)
    a = await _Run(ctx, rng or random.Random())._analyse(md, version)
    if not a.bad:
        return None
    bad = bad_bookie_ids(a.bad)
    detail = violation_detail(md, version, a.plan, a.bad, lac=a.lac, reads=a.reads)
    return Violation(md.ledger_id, Category.UNREADABLE_FRAGMENTS, bad[0] if bad else None, detail)


@dataclass(slots=True)
class _Analysis:
    md: LedgerMetadata
    version: int
    plan: LedgerPlan
    bad: list[BadFragment]
    lac: LacAnswer | None
    reads: int


class _Run:
    def __init__(self, ctx: CheckContext, rng: random.Random) -> None:
        self.ctx = ctx
        self.rng = rng
        self.log = ctx.log
        bk = ctx.config.bookkeeper
        self.pct = bk.auditorLedgerVerificationPercentage
        self.max_ledgers = bk.auditorMaxNumberOfConcurrentOpenLedgerOperations
        self.slot_warning = bk.auditorAcquireConcurrentOpenLedgerOperationsTimeOutMSec / 1000.0
        limit = bk.inFlightReadEntryNumInLedgerChecker
        self.read_limit = limit if limit > 0 else None
        self.read_slots = asyncio.Semaphore(limit) if limit > 0 else None
        self.report = ctx.new_report(Check.LEDGERS)
        self.entries_read = 0
        self._flag_at = -_FLAG_TTL
        self._enabled = True
        self._bookies_at = -_BOOKIES_TTL
        self._bookies: frozenset[str] = frozenset()

    # --- shared, refreshed views -------------------------------------------------------

    async def _replication_enabled(self, *, fresh: bool = False) -> bool:
        now = time.monotonic()
        if fresh or now - self._flag_at >= _FLAG_TTL:
            self._enabled = await self.ctx.urm.is_replication_enabled()
            self._flag_at = now
        return self._enabled

    async def _available(self) -> frozenset[str]:
        now = time.monotonic()
        if now - self._bookies_at >= _BOOKIES_TTL:
            found: BookieSet = await self.ctx.registered()
            self._bookies = found.available
            self._bookies_at = now
        return self._bookies

    # --- the run -------------------------------------------------------------------------

    async def run(self) -> CheckReport:
        report = self.report
        if not await self._replication_enabled(fresh=True):
            async for _ in self.ctx.walker().ledger_ids():
                report.ledgers_skipped[SkipReason.REPLICATION_DISABLED] += 1
            report.finished_at = self.ctx.clock()
            self.log.warning(
                "ledger check not run: replication is disabled", check=str(Check.LEDGERS)
            )
            return report
        walker = self.ctx.walker()
        progress = Progress(
            self.log,
            str(Check.LEDGERS),
            interval=self.ctx.config.checks.progress_interval,
            max_ledger_id=await walker.max_ledger_id(),
        )
        slots = asyncio.Semaphore(self.max_ledgers)
        tasks: set[asyncio.Task[None]] = set()
        errors: list[BaseException] = []
        stopped = False

        def finished(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            slots.release()
            if not task.cancelled() and (exc := task.exception()) is not None:
                errors.append(exc)

        window = min(self.max_ledgers, self.ctx.config.checks.ledger_concurrency)
        try:
            async for rec in walker.ledgers(concurrency=max(1, window)):
                if errors:
                    break
                if stopped or not await self._replication_enabled():
                    if not stopped:
                        stopped = True
                        self.log.warning(
                            "replication disabled during the ledger check: "
                            "remaining ledgers are skipped",
                            check=str(Check.LEDGERS),
                            next_ledger_id=rec.ledger_id,
                        )
                    report.ledgers_skipped[SkipReason.REPLICATION_DISABLED] += 1
                    continue
                progress.tick(rec.ledger_id)
                await self._acquire(slots, rec.ledger_id)
                task = asyncio.create_task(self._ledger(rec), name=f"ledger-check {rec.ledger_id}")
                tasks.add(task)
                task.add_done_callback(finished)
            if tasks:
                await asyncio.wait(list(tasks))
        except BaseException:
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.wait(list(tasks))
            raise
        if errors:
            raise errors[0]
        if walker.stats.deleted_during_walk:
            report.ledgers_skipped[SkipReason.DELETED] += walker.stats.deleted_during_walk
        # Ledgers finish out of order; the report lists them in id order.
        report.marked_underreplicated.sort()
        report.finished_at = self.ctx.clock()
        self.log.info(
            "ledger check finished",
            check=str(Check.LEDGERS),
            ledgers_checked=report.ledgers_checked,
            ledgers_skipped=dict(report.ledgers_skipped),
            violations=report.violations.total,
            marked=len(report.marked_underreplicated),
            entries_read=self.entries_read,
            verification_percentage=self.pct,
        )
        return report

    async def _acquire(self, slots: asyncio.Semaphore, ledger_id: int) -> None:
        if self.slot_warning <= 0:
            await slots.acquire()
            return
        while True:
            try:
                async with asyncio.timeout(self.slot_warning):
                    await slots.acquire()
                return
            except TimeoutError:
                self.log.warning(
                    "waiting for a ledger slot (auditorMaxNumberOfConcurrentOpenLedgerOperations)",
                    check=str(Check.LEDGERS),
                    ledger_id=ledger_id,
                    waited_s=self.slot_warning,
                    in_progress=self.max_ledgers,
                )

    # --- one ledger ------------------------------------------------------------------------

    async def _ledger(self, rec: LedgerRecord) -> None:
        if rec.metadata is None:
            reason = rec.error.reason if rec.error is not None else "unreadable metadata"
            self._invalid(rec.ledger_id, rec.path, rec.znode_version, reason)
            return
        md, version = rec.metadata, rec.znode_version
        for attempt in range(1, _ATTEMPTS + 1):
            problem = metadata_problem(md)
            if problem is not None:
                self._invalid(rec.ledger_id, rec.path, version, problem)
                return
            analysis = await self._analyse(md, version)
            if not analysis.bad:
                self.report.ledgers_checked += 1
                if attempt > 1:  # judged again on new metadata: the first look's finding is void
                    self._dropped(rec.ledger_id, DropCause.METADATA_CHANGED)
                return
            try:
                data, stat = await self.ctx.zk.get(rec.path)
            except NoNodeError:
                self.report.ledgers_skipped[SkipReason.DELETED] += 1
                self._dropped(rec.ledger_id, DropCause.LEDGER_DELETED)
                self.log.info(
                    "ledger deleted while being checked",
                    check=str(Check.LEDGERS),
                    ledger_id=rec.ledger_id,
                )
                return
            fresh_version = int(stat.version)
            if fresh_version == version:
                await self._report(analysis)
                return
            if attempt == _ATTEMPTS:
                break
            self.log.info(
                "ledger metadata changed while being checked; checking again",
                check=str(Check.LEDGERS),
                ledger_id=rec.ledger_id,
                metadata_version=version,
                new_metadata_version=fresh_version,
            )
            try:
                md = decode_ledger_metadata(data, rec.ledger_id, znode_ctime=int(stat.ctime))
            except LedgerMetadataFormatError as exc:
                self._invalid(rec.ledger_id, rec.path, fresh_version, exc.reason)
                return
            version = fresh_version
        # Still changing after several looks: the next run will see it settled.
        self.report.ledgers_skipped[SkipReason.METADATA_CHANGING] += 1
        self._dropped(rec.ledger_id, DropCause.METADATA_CHANGED)
        self.log.warning(
            "ledger metadata kept changing; not judged this run",
            check=str(Check.LEDGERS),
            ledger_id=rec.ledger_id,
            attempts=_ATTEMPTS,
        )

    def _dropped(self, ledger_id: int, cause: DropCause) -> None:
        """A would-be `unreadable_fragments` not reported (false-alarm accounting)."""
        self.report.dropped[str(cause)] += 1
        self.log.info(
            "would-be violation dropped",
            check=str(Check.LEDGERS),
            ledger_id=ledger_id,
            cause=str(cause),
        )

    def _invalid(self, ledger_id: int, path: str, version: int, reason: str) -> None:
        self.report.ledgers_checked += 1
        v = metadata_invalid(ledger_id, path, version, reason)
        self.report.violations.append(v)
        self.log.warning(
            "violation",
            check=str(Check.LEDGERS),
            ledger_id=ledger_id,
            category=str(v.category),
            **v.detail,
        )

    async def _analyse(self, md: LedgerMetadata, version: int) -> _Analysis:
        available = await self._available()
        lac: LacAnswer | None = None
        if not md.closed:
            lac = await self._read_lac(md, available)
            if lac.lac is None:
                self.log.warning(
                    "no bookie of the last ensemble answered READ_LAC; LAC taken as -1",
                    check=str(Check.LEDGERS),
                    ledger_id=md.ledger_id,
                    bookies=list(md.segments[-1].bookies),
                )
        lac_value = None if lac is None else lac.lac
        probe = single_entry_probe(md, lac_value)
        may_exist = None if probe is None else await self._probe(md, probe, available)
        plan = plan_ledger(
            md, lac_value, available, self.pct, self.rng, last_entry_may_exist=may_exist
        )
        failures, reads = await self._read_planned(md, plan)
        return _Analysis(md, version, plan, evaluate(plan, failures), lac, reads)

    async def _read_lac(self, md: LedgerMetadata, available: frozenset[str]) -> LacAnswer:
        bookies = list(dict.fromkeys(md.segments[-1].bookies))

        async def ask(bookie: str) -> Outcome[LacRead]:
            if bookie not in available:
                return _NOT_ASKED
            return await self.ctx.bookies.read_lac(bookie, md.ledger_id)

        answers = await asyncio.gather(*(ask(b) for b in bookies))
        return lac_from_answers(md, answers)

    async def _probe(self, md: LedgerMetadata, probe: Probe, available: frozenset[str]) -> bool:
        async def ask(bookie: str) -> Outcome[EntryRead] | None:
            if bookie not in available:
                return None
            return await self._read(bookie, md.ledger_id, probe.entry_id)

        replies = await asyncio.gather(*(ask(b) for _, b in probe.targets))
        exists = entry_may_exist(replies)
        if not exists:
            self.log.info(
                "last fragment skipped: its only entry is absent on every bookie of its write set",
                check=str(Check.LEDGERS),
                ledger_id=md.ledger_id,
                entry_id=probe.entry_id,
            )
        return exists

    async def _read(self, bookie: str, ledger_id: int, entry_id: int) -> Outcome[EntryRead]:
        self.entries_read += 1
        if self.read_slots is None:
            return await self.ctx.bookies.read_entry(bookie, ledger_id, entry_id)
        async with self.read_slots:
            return await self.ctx.bookies.read_entry(bookie, ledger_id, entry_id)

    async def _read_planned(
        self, md: LedgerMetadata, plan: LedgerPlan
    ) -> tuple[dict[int, list[ReadFailure]], int]:
        """Reads the planned entries, bookies interleaved; a pair stops at its first failure."""
        items: list[tuple[int, Iterator[int]]] = []
        bound = 0
        bookies: set[str] = set()
        for k, check in enumerate(plan.checks):
            if check.verdict is Verdict.READ and check.entries is not None:
                sel = check.entries
                items.append((k, iter(sel)))
                bound += sel.count() if sel.every else sel.buckets + 2
                bookies.add(check.bookie)
        failures: dict[int, list[ReadFailure]] = {}
        if not items:
            return failures, 0
        reads = 0
        queue = _interleave(items, failures)
        width = self.ctx.config.checks.bookie_max_in_flight * len(bookies)
        if self.read_limit is not None:
            width = min(width, self.read_limit)

        async def worker() -> None:
            nonlocal reads
            for k, entry in queue:
                check = plan.checks[k]
                outcome = await self._read(check.bookie, md.ledger_id, entry)
                reads += 1
                reason = classify_read(md, entry, outcome)
                if reason is not None:
                    failures.setdefault(k, []).append(ReadFailure(entry, reason))

        await asyncio.gather(*(worker() for _ in range(max(1, min(width, bound)))))
        return failures, reads

    async def _report(self, a: _Analysis) -> None:
        md = a.md
        bad = bad_bookie_ids(a.bad)
        detail = violation_detail(md, a.version, a.plan, a.bad, lac=a.lac, reads=a.reads)
        v = Violation(md.ledger_id, Category.UNREADABLE_FRAGMENTS, bad[0] if bad else None, detail)
        self.report.ledgers_checked += 1
        self.report.violations.append(v)
        evidence: dict[str, Any] = {"lac": detail["lac"]} if "lac" in detail else {}
        self.log.warning(
            "violation",
            check=str(Check.LEDGERS),
            ledger_id=md.ledger_id,
            category=str(v.category),
            bookie=v.bookie,
            bad_bookies=bad,
            fragments=_fragment_evidence(a.bad),
            metadata_version=a.version,
            **evidence,
        )
        if not self.ctx.mark:
            return
        if not await self._replication_enabled(fresh=True):
            self.log.warning(
                "not marking under-replicated: replication is disabled",
                check=str(Check.LEDGERS),
                ledger_id=md.ledger_id,
                missing_replicas=bad,
            )
            return
        await self.ctx.mark_underreplicated(self.report, md.ledger_id, bad)


def _interleave(
    items: Sequence[tuple[int, Iterator[int]]], failed: dict[int, list[ReadFailure]]
) -> Iterator[tuple[int, int]]:
    """One entry per pair in turn, so every bookie is read from at once; drops failed pairs."""
    pending = deque(items)
    while pending:
        k, entries = pending.popleft()
        if k in failed:
            continue
        entry = next(entries, None)
        if entry is None:
            continue
        pending.append((k, entries))
        yield k, entry


def _fragment_evidence(bad: Sequence[BadFragment]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for bf in bad:
        f = bf.fragment
        out.append(
            {
                "segment": f.segment,
                "entries": [f.first, f.last],
                "bad": {
                    b.bookie: "unavailable"
                    if b.unavailable
                    else sorted({r.reason for r in b.failures})
                    for b in bf.bad
                },
                "failed_entries": entry_ranges(r.entry_id for b in bf.bad for r in b.failures)[:20],
            }
        )
    return out
