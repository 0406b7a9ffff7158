"""Checking every ledger by reading sampled entries from its bookies must stay within bounds
on the bookies, stop cleanly when replication is switched off mid-run, and never report a
ledger that changed under it.

Runs the ledger check (BookKeeper's checkAllLedgers) over a whole cluster.

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
  ledgers are in progress (the checks' pool, `pool.bounded`; upstream bounds
  only the opens with it); entry reads are bounded per bookie by the client's
  in-flight cap and, when `inFlightReadEntryNumInLedgerChecker` > 0, by that
  many across the run.
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
  again (`reread.Reread`, the replicas check's loop too): deleted meanwhile,
  it is counted as skipped (`deleted`); changed (an ensemble replaced, the
  ledger closed), it is checked again with the new metadata, up to three
  times in all, and skipped (`metadata_changing`) if it is still changing
  then (a deleted or changed ledger that ends up not reported is counted
  under `would_be_violations_dropped`, cause `ledger_deleted` or
  `metadata_changed`). Otherwise the violation `unreadable_fragments` is
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
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from auditor.bookie.results import EntryRead, LacRead, NoAnswer, Outcome, Unanswered
from auditor.checks.context import CheckContext
from auditor.checks.findings import (
    Category,
    Check,
    CheckReport,
    LedgerOutcome,
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
    leave_held_alone,
    metadata_problem,
    plan_ledger,
    single_entry_probe,
    violation_detail,
)
from auditor.checks.pool import bounded
from auditor.checks.progress import Progress
from auditor.checks.recorder import RunRecorder
from auditor.checks.reread import Reread, Suspect
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.paths import ledger_path
from auditor.metadata.registry import BookieSet
from auditor.metadata.walk import LedgerRecord, Walker

__all__ = [
    "LedgerAnalysis",
    "LedgerCheckRun",
    "LedgerReader",
    "ledger_violation",
    "run_ledger_check",
]

#: Seconds a look at the replication flag (or at the registered bookies) stays fresh.
_FLAG_TTL: Final = 1.0
_BOOKIES_TTL: Final = 5.0
_NOT_ASKED: Final = NoAnswer(Unanswered.NOT_RESOLVED, "bookie is neither writable nor read-only")


async def run_ledger_check(ctx: CheckContext, *, rng: random.Random | None = None) -> CheckReport:
    """Checks every ledger; `rng` drives the sampling (tests pass a seeded one)."""
    return await LedgerCheckRun(ctx, rng or random.Random()).run()


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
    return (await LedgerReader(ctx, rng or random.Random()).analyse(md, version)).violation()


# --- reading one ledger ----------------------------------------------------------------------


@dataclass(slots=True)
class LedgerAnalysis:
    """What the reads of one version of a ledger found."""

    md: LedgerMetadata
    version: int
    plan: LedgerPlan
    bad: list[BadFragment]
    lac: LacAnswer | None
    reads: int
    #: The bookies registered when the reads were planned (those were read; others were
    #: judged unavailable without a read).
    available: frozenset[str] = frozenset()

    def violation(self) -> Violation | None:
        """`unreadable_fragments` naming the first bad bookie; None when every read passed."""
        if not self.bad:
            return None
        bad = bad_bookie_ids(self.bad)
        detail = violation_detail(
            self.md, self.version, self.plan, self.bad, lac=self.lac, reads=self.reads
        )
        return Violation(
            self.md.ledger_id, Category.UNREADABLE_FRAGMENTS, bad[0] if bad else None, detail
        )


class LedgerReader:
    """The ledger check's reads of one ledger at a time: LAC, the single-entry probe, samples.

    A run has one (it holds the run's read budget, `inFlightReadEntryNumInLedgerChecker`,
    and counts the entries read); `ledger_violation` makes one for a single ledger.
    """

    def __init__(self, ctx: CheckContext, rng: random.Random, log: Any = None) -> None:
        self.ctx = ctx
        self.rng = rng
        self.log = log if log is not None else ctx.log.bind(check=str(Check.LEDGERS))
        bk = ctx.config.bookkeeper
        self.pct = bk.auditorLedgerVerificationPercentage
        limit = bk.inFlightReadEntryNumInLedgerChecker
        self.read_limit = limit if limit > 0 else None
        self.read_slots = asyncio.Semaphore(limit) if limit > 0 else None
        self.entries_read = 0
        self._bookies_at = -_BOOKIES_TTL
        self._bookies: frozenset[str] = frozenset()

    async def _available(self) -> frozenset[str]:
        now = time.monotonic()
        if now - self._bookies_at >= _BOOKIES_TTL:
            found: BookieSet = await self.ctx.registered()
            self._bookies = found.available
            self._bookies_at = now
        return self._bookies

    async def analyse(self, md: LedgerMetadata, version: int) -> LedgerAnalysis:
        """Plans, reads and evaluates one version of a ledger (nothing recorded)."""
        available = await self._available()
        lac: LacAnswer | None = None
        if not md.closed:
            lac = await self._read_lac(md, available)
            if lac.lac is None:
                self.log.warning(
                    "no bookie of the last ensemble answered READ_LAC; LAC taken as -1",
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
        bad = leave_held_alone(evaluate(plan, failures), self.ctx.held_bookies())
        return LedgerAnalysis(md, version, plan, bad, lac, reads, available)

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

        async def read(item: tuple[int, int]) -> None:
            nonlocal reads
            k, entry = item
            if k in failures:
                return  # taken while waiting for a slot; the pair failed meanwhile
            check = plan.checks[k]
            outcome = await self._read(check.bookie, md.ledger_id, entry)
            reads += 1
            reason = classify_read(md, entry, outcome)
            if reason is not None:
                failures.setdefault(k, []).append(ReadFailure(entry, reason))

        # The queue drops a pair once it has failed, so no read of it is sent after that.
        await bounded(queue, read, min(width, bound))
        return failures, reads


# --- the run -------------------------------------------------------------------------------


class LedgerCheckRun:
    def __init__(self, ctx: CheckContext, rng: random.Random) -> None:
        self.ctx = ctx
        self.recorder = RunRecorder.for_context(ctx, Check.LEDGERS)
        self.log = self.recorder.log
        self.reader = LedgerReader(ctx, rng, self.log)
        bk = ctx.config.bookkeeper
        self.max_ledgers = bk.auditorMaxNumberOfConcurrentOpenLedgerOperations
        self.slot_warning = bk.auditorAcquireConcurrentOpenLedgerOperationsTimeOutMSec / 1000.0
        self.walker: Walker = ctx.walker()
        self.reread: Reread[LedgerAnalysis] = Reread(self.recorder, self.walker, self._report)
        self._flag_at = -_FLAG_TTL
        self._enabled = True

    async def _replication_enabled(self, *, fresh: bool = False) -> bool:
        now = time.monotonic()
        if fresh or now - self._flag_at >= _FLAG_TTL:
            self._enabled = await self.ctx.urm.is_replication_enabled()
            self._flag_at = now
        return self._enabled

    async def run(self) -> CheckReport:
        recorder = self.recorder
        if not await self._replication_enabled(fresh=True):
            async for ledger_id in self.walker.ledger_ids():
                recorder.skipped(ledger_id, SkipReason.REPLICATION_DISABLED)
            self.log.warning("ledger check not run: replication is disabled")
            return recorder.finish(self.walker)
        await bounded(
            self._to_check(),
            self.judge,
            self.max_ledgers,
            slow=self._slow_slot,
            slow_after=self.slot_warning,
        )
        report = recorder.finish(self.walker)
        self.log.info(
            "ledger check finished",
            ledgers_checked=report.ledgers_checked,
            ledgers_skipped=dict(report.ledgers_skipped),
            violations=report.violations.total,
            marked=len(report.marked_underreplicated),
            entries_read=self.reader.entries_read,
            verification_percentage=self.reader.pct,
        )
        return report

    async def _to_check(self) -> AsyncIterator[LedgerRecord]:
        """The walk, minus the ledgers left once replication is disabled (counted as skipped)."""
        progress = Progress(
            self.log,
            str(Check.LEDGERS),
            interval=self.ctx.config.checks.progress_interval,
            max_ledger_id=await self.walker.max_ledger_id(),
        )
        window = max(1, min(self.max_ledgers, self.ctx.config.checks.ledger_concurrency))
        stopped = False
        async for rec in self.walker.ledgers(concurrency=window):
            if stopped or not await self._replication_enabled():
                if not stopped:
                    stopped = True
                    self.log.warning(
                        "replication disabled during the ledger check: "
                        "remaining ledgers are skipped",
                        next_ledger_id=rec.ledger_id,
                    )
                self.recorder.skipped(
                    rec.ledger_id, SkipReason.REPLICATION_DISABLED, rec.znode_version
                )
                continue
            progress.tick(rec.ledger_id)
            yield rec

    def _slow_slot(self, rec: LedgerRecord) -> None:
        self.log.warning(
            "waiting for a ledger slot (auditorMaxNumberOfConcurrentOpenLedgerOperations)",
            ledger_id=rec.ledger_id,
            waited_s=self.slot_warning,
            in_progress=self.max_ledgers,
        )

    # --- one ledger ------------------------------------------------------------------------

    async def judge(self, rec: LedgerRecord) -> LedgerOutcome | None:
        """How the ledger came out (recorded once)."""
        return await self.reread.judge(rec, self._look)

    async def _look(
        self, md: LedgerMetadata, rec: LedgerRecord
    ) -> LedgerOutcome | Suspect[LedgerAnalysis]:
        problem = metadata_problem(md)
        if problem is not None:
            return self.recorder.metadata_invalid(rec, problem)
        analysis = await self.reader.analyse(md, rec.znode_version)
        if not analysis.bad:
            return self.recorder.ok(rec.ledger_id, rec.znode_version)
        return Suspect(analysis)

    async def _left_to_the_audit(self, a: LedgerAnalysis) -> LedgerAnalysis:
        """`a` without the bookies that were registered when they were read and are not
        any more: a bookie that went away during the check (its reads then fail as
        refused connections) is the lost-bookie audit's to judge, after
        `lostBookieRecoveryDelay`, as the restart rule says; it may only be restarting.
        The daemon holds such a bookie once its watch has seen it go, but the reads can
        fail before that (found by the soak: a host restarting as the check read it,
        marked 1.6 s later with the watch 0.2 s behind). The registry is read afresh,
        and only when something is to be reported. A bookie still gone at the next run
        is unavailable there from the start, and judged as before. Only where an audit
        follows (`defer_gone_bookies`, the daemon); a one-shot check reports it."""
        if not self.ctx.defer_gone_bookies:
            return a
        read = {b.bookie for frag in a.bad for b in frag.bad} & a.available
        if not read:
            return a
        gone = read - (await self.ctx.registered()).available
        if not gone:
            return a
        self.log.info(
            "bookies gone during the check left to the lost-bookie audit",
            ledger_id=a.md.ledger_id,
            bookies=sorted(gone),
        )
        return replace(a, bad=leave_held_alone(a.bad, gone))

    async def _report(self, a: LedgerAnalysis) -> LedgerOutcome:
        a = await self._left_to_the_audit(a)
        md = a.md
        if not a.bad:
            return self.recorder.ok(md.ledger_id, a.version)
        v = a.violation()
        assert v is not None
        bad = bad_bookie_ids(a.bad)
        lac: dict[str, Any] = {"lac": v.detail["lac"]} if "lac" in v.detail else {}
        line = {
            "ledger_id": md.ledger_id,
            "category": str(v.category),
            "bookie": v.bookie,
            "bad_bookies": bad,
            "fragments": _fragment_evidence(a.bad),
            "metadata_version": a.version,
            **lac,
        }
        outcome = self.recorder.violation(md.ledger_id, a.version, [v], lines=[("violation", line)])
        if not self.ctx.mark:
            return outcome
        if not await self._replication_enabled(fresh=True):
            self.log.warning(
                "not marking under-replicated: replication is disabled",
                ledger_id=md.ledger_id,
                missing_replicas=bad,
            )
            return outcome
        await self.ctx.mark_underreplicated(
            self.recorder.report, md.ledger_id, bad, version=a.version
        )
        return outcome


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
