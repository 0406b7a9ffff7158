"""Driving the replicas check: bookie answers in, BP-34's re-checks before any report.

Per closed ledger: skip it if it is already marked under-replicated (unless the
mark is older than the grace period, which is its own violation), ask each
distinct ensemble bookie once for what it holds (or probe by reads when it
cannot list), and analyse. Nothing is reported on a first impression:
- a ledger with a bookie that did not answer is "potentially faulty" and is
  checked again after `checks.retry_delay`, up to `checks.retry_attempts`
  times; only then is a still-silent, still-registered bookie reported
  (`bookie_unavailable_registered`); an unregistered one is the bookie
  check's business;
- before a violation is reported, the mark is looked up again and the
  metadata re-read; if the ledger changed (ensemble replaced, re-replicated),
  it is analysed again instead.

Each of these set-asides that ends with nothing reported for the ledger is
counted in `report.dropped` by cause (false-alarm accounting): the retry
succeeded, the ledger was marked meanwhile, deleted, or its metadata changed.
An unanswering bookie that is not registered is not counted: it is not a
false alarm but the bookie check's finding.

Ledgers flow through a bounded window (`checks.ledger_concurrency`); only the
ids of ledgers waiting for a retry are kept, packed, so memory stays flat in
the number of ledgers.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from typing import Any

from auditor.bookie.availability import EMPTY
from auditor.bookie.protocol import Status
from auditor.bookie.results import CannotList, ErrorStatus, Ok
from auditor.checks.context import CheckContext
from auditor.checks.findings import (
    Category,
    Check,
    CheckReport,
    Coverage,
    DropCause,
    LedgerOutcome,
    Outcome,
    SkipReason,
    Violation,
    metadata_invalid,
)
from auditor.checks.grace import past_grace
from auditor.checks.progress import Progress
from auditor.checks.replicas import (
    BookieAnswer,
    Listed,
    Probed,
    ReplicasVerdict,
    Unanswered,
    Unverified,
    Verified,
    analyse,
    expectations,
    probe_entries,
    unanswered_registered,
)
from auditor.metadata.model import LedgerMetadata, LedgerState
from auditor.metadata.registry import BookieSet
from auditor.metadata.underreplication import UnderreplicatedLedger
from auditor.metadata.walk import LedgerRecord, Walker

#: How often a ledger whose metadata keeps changing under us is analysed again.
MAX_REANALYSES = 3
#: Skips that name the cause of a drop better than the doubt that preceded them.
_SKIP_CAUSES = {
    str(SkipReason.UNDERREPLICATED): DropCause.MARKED_MEANWHILE,
    str(SkipReason.DELETED): DropCause.LEDGER_DELETED,
    str(SkipReason.METADATA_CHANGING): DropCause.METADATA_CHANGED,
}
_ABSENT = (Status.ENOENTRY, Status.ENOLEDGER)


def _invalid(rec: LedgerRecord) -> Violation:
    reason = rec.error.reason if rec.error is not None else "metadata missing"
    return metadata_invalid(rec.ledger_id, rec.path, rec.znode_version, reason)


class ReplicasRun:
    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.config
        self.report = ctx.new_report(Check.REPLICAS, coverage=Coverage())
        self.walker: Walker = ctx.walker()
        self.retry: array[int] = array("q")
        self.registered = BookieSet(frozenset(), frozenset())
        self.log = ctx.log.bind(check="replicas")
        self.marks: dict[int, UnderreplicatedLedger] = {}

    # --- asking the bookies -------------------------------------------------

    async def _probe(self, md: LedgerMetadata, bookie: str) -> BookieAnswer:
        entries = probe_entries(md, bookie)
        outcomes = await asyncio.gather(
            *(self.ctx.bookies.read_entry(bookie, md.ledger_id, e) for e in entries)
        )
        found: dict[int, bool] = {}
        for entry, out in zip(entries, outcomes, strict=True):
            if isinstance(out, Ok):
                found[entry] = True
            elif isinstance(out, ErrorStatus) and out.status in _ABSENT:
                found[entry] = False
            else:
                return Unanswered(f"probe read of entry {entry}: {out}")
        return Probed(found)

    async def _ask(self, md: LedgerMetadata, bookie: str) -> BookieAnswer:
        out = await self.ctx.bookies.get_list_of_entries(bookie, md.ledger_id)
        if isinstance(out, Ok):
            return Listed(out.value)
        if isinstance(out, ErrorStatus) and out.status is Status.ENOLEDGER:
            return Listed(EMPTY)
        if isinstance(out, CannotList):
            if self.cfg.checks.probe_unlistable:
                return await self._probe(md, bookie)
            return Unverified()
        return Unanswered(str(out))

    async def answers(self, md: LedgerMetadata) -> dict[str, BookieAnswer]:
        bookies = sorted({exp.bookie for exp in expectations(md)})
        got = await asyncio.gather(*(self._ask(md, b) for b in bookies))
        return dict(zip(bookies, got, strict=True))

    # --- one ledger ------------------------------------------------------------

    def _skip(self, ledger_id: int, reason: SkipReason, version: int = -1) -> LedgerOutcome:
        self.report.ledgers_skipped[str(reason)] += 1
        return LedgerOutcome(Check.REPLICAS, ledger_id, Outcome.SKIPPED, str(reason), version)

    async def check(self, rec: LedgerRecord, final: bool, retrying: bool = False) -> None:
        outcome = await self._judge(rec, final, retrying)
        if outcome is not None:
            self.ctx.outcome(outcome)

    def _settled(self, outcome: LedgerOutcome, doubt: DropCause | None) -> LedgerOutcome:
        """Counts a would-be violation that ended with nothing reported for its ledger."""
        if doubt is None or outcome.outcome is Outcome.VIOLATION:
            return outcome
        cause = _SKIP_CAUSES.get(outcome.skip_reason or "", doubt)
        self.report.dropped[str(cause)] += 1
        self.log.info("would-be violation dropped", ledger_id=outcome.ledger_id, cause=str(cause))
        return outcome

    async def _judge(
        self, rec: LedgerRecord, final: bool, retrying: bool = False
    ) -> LedgerOutcome | None:
        """How the ledger came out; None when it waits for a retry.

        `doubt` is why the ledger was last set aside while a violation loomed
        (a silent bookie when `retrying`, then changed metadata); see `_settled`.
        """
        report = self.report
        doubt = DropCause.RETRY_SUCCEEDED if retrying else None
        for _ in range(MAX_REANALYSES):
            version = rec.znode_version
            if rec.metadata is None:
                report.ledgers_checked += 1
                self._violation(_invalid(rec))
                return LedgerOutcome(
                    Check.REPLICAS, rec.ledger_id, Outcome.VIOLATION, None, version
                )
            md = rec.metadata
            if md.state is LedgerState.OPEN:
                return self._settled(self._skip(md.ledger_id, SkipReason.OPEN, version), doubt)
            if md.state is LedgerState.IN_RECOVERY:
                skip = self._skip(md.ledger_id, SkipReason.IN_RECOVERY, version)
                return self._settled(skip, doubt)
            if md.last_entry_id < 0:
                return self._settled(self._skip(md.ledger_id, SkipReason.EMPTY, version), doubt)
            marked = await self._already_marked(md.ledger_id, version, fresh=False)
            if marked is not None:
                return self._settled(marked, doubt)
            verdict = analyse(md, await self.answers(md))
            if verdict.unanswered and not final:
                self.retry.append(md.ledger_id)
                return None
            if verdict.category is None and not verdict.unanswered:
                ok = self._account(md.ledger_id, version, verdict, Outcome.OK)
                return self._settled(ok, doubt)
            # BP-34: before reporting, look at the mark and the metadata again.
            marked = await self._already_marked(md.ledger_id, version, fresh=True)
            if marked is not None:
                return self._settled(marked, DropCause.MARKED_MEANWHILE)
            fresh = await self.walker.read(md.ledger_id, rec.path)
            if fresh is None:
                deleted = self._skip(md.ledger_id, SkipReason.DELETED)
                return self._settled(deleted, DropCause.LEDGER_DELETED)
            if fresh.znode_version != rec.znode_version:
                doubt = DropCause.METADATA_CHANGED
                self.log.info(
                    "metadata changed during the check; analysing again",
                    ledger_id=md.ledger_id,
                    old_version=rec.znode_version,
                    new_version=fresh.znode_version,
                )
                rec = fresh
                continue
            return await self._report(md, rec.znode_version, verdict)
        # Still changing after several looks: the next run will see it settled.
        self.log.warning("metadata kept changing; not judged this run", ledger_id=rec.ledger_id)
        changing = self._skip(rec.ledger_id, SkipReason.METADATA_CHANGING, rec.znode_version)
        return self._settled(changing, doubt)

    async def _already_marked(
        self, ledger_id: int, version: int, *, fresh: bool
    ) -> LedgerOutcome | None:
        """Marked ledgers are skipped (or, past the grace period, reported as such).

        The first look uses the marks listed at the start of the run (one
        listing instead of a read per ledger); the look before reporting is fresh.
        """
        ur = await self.ctx.urm.get(ledger_id) if fresh else self.marks.get(ledger_id)
        if ur is None:
            return None
        grace = self.cfg.bookkeeper.underreplicatedLedgerRecoveryGracePeriod
        now_ms = int(self.ctx.clock() * 1000)
        v = past_grace(ledger_id, now_ms, ur.ctime, grace, ur.replicas)
        if v is None:
            return self._skip(ledger_id, SkipReason.UNDERREPLICATED, version)
        self.report.ledgers_checked += 1
        self._violation(v)
        return LedgerOutcome(Check.REPLICAS, ledger_id, Outcome.VIOLATION, None, version)

    def _account(
        self, ledger_id: int, version: int, verdict: ReplicasVerdict, outcome: Outcome
    ) -> LedgerOutcome:
        self.report.ledgers_checked += 1
        cov = self.report.coverage
        assert cov is not None
        mine = Coverage()
        for how in verdict.verified.values():
            if how is Verified.LISTED:
                mine.listed += 1
            elif how is Verified.PROBED:
                mine.probed += 1
            else:
                mine.unverified += 1
        cov.listed += mine.listed
        cov.probed += mine.probed
        cov.unverified += mine.unverified
        return LedgerOutcome(
            Check.REPLICAS,
            ledger_id,
            outcome,
            None,
            version,
            mine.listed,
            mine.probed,
            mine.unverified,
        )

    async def _report(
        self, md: LedgerMetadata, version: int, verdict: ReplicasVerdict
    ) -> LedgerOutcome:
        reported = self.report.violations.total
        evidence = verdict.evidence(md, version)
        if verdict.category is not None:
            self._violation(Violation(md.ledger_id, verdict.category, None, evidence))
            missing = verdict.bookies_missing_entries
            if missing:
                await self.ctx.mark_underreplicated(self.report, md.ledger_id, missing)
        silent_registered = unanswered_registered(verdict, self.registered.available)
        for bookie, reason in sorted(verdict.unanswered.items()):
            if bookie in silent_registered:
                self._violation(
                    Violation(
                        md.ledger_id,
                        Category.BOOKIE_UNAVAILABLE_REGISTERED,
                        bookie,
                        {
                            "reason": reason,
                            "attempts": self.cfg.checks.retry_attempts + 1,
                            "segments": [
                                [s.first, s.last]
                                for s in md.segment_ranges()
                                if bookie in s.bookies
                            ],
                            "metadata_version": version,
                        },
                    )
                )
            else:
                self.log.info(
                    "unanswering bookie is not registered; left to the bookie check",
                    ledger_id=md.ledger_id,
                    bookie=bookie,
                )
        found = Outcome.VIOLATION if self.report.violations.total > reported else Outcome.OK
        return self._account(md.ledger_id, version, verdict, found)

    def _violation(self, v: Violation) -> None:
        self.report.violations.append(v)
        self.log.warning(
            "violation",
            ledger_id=v.ledger_id,
            category=str(v.category),
            bookie=v.bookie,
            **v.detail,
        )

    # --- the run -----------------------------------------------------------------

    async def _pool(self, records: Any, final: bool, retrying: bool = False) -> None:
        limit = asyncio.Semaphore(self.cfg.checks.ledger_concurrency)
        tasks: set[asyncio.Task[None]] = set()
        failure: list[BaseException] = []

        def done(t: asyncio.Task[None]) -> None:
            tasks.discard(t)
            limit.release()
            if not t.cancelled() and t.exception() is not None:
                failure.append(t.exception())  # type: ignore[arg-type]

        try:
            async for rec in records:
                if failure:
                    break
                await limit.acquire()
                t = asyncio.ensure_future(self.check(rec, final, retrying))
                tasks.add(t)
                t.add_done_callback(done)
            if tasks:
                await asyncio.wait(set(tasks))
        finally:
            for t in tasks:
                t.cancel()
        if failure:
            raise failure[0]

    async def _walk(self, final: bool) -> Any:
        progress = Progress(
            self.log,
            "replicas",
            interval=self.cfg.checks.progress_interval,
            max_ledger_id=await self.walker.max_ledger_id(),
        )
        async for rec in self.walker.ledgers(concurrency=self.cfg.checks.ledger_concurrency):
            progress.tick(rec.ledger_id)
            yield rec

    async def _reread(self, ids: Any) -> Any:
        for ledger_id in ids:
            rec = await self.walker.read(ledger_id)
            if rec is None:
                deleted = self._skip(ledger_id, SkipReason.DELETED)
                self.ctx.outcome(self._settled(deleted, DropCause.LEDGER_DELETED))
                continue
            yield rec

    # A run is a first pass over the walk and retry passes over what did not answer.
    # `run` does them in turn; a scan does each as a stage across its partitions.

    async def begin(self) -> None:
        self.registered = await self.ctx.registered()
        self.marks = {ur.ledger_id: ur async for ur in self.ctx.urm.list_underreplicated()}

    def _queue_changed(self) -> None:
        if self.ctx.on_retry_queue is not None:
            self.ctx.on_retry_queue(len(self.retry))

    async def first_pass(self) -> None:
        final = self.cfg.checks.retry_attempts == 0
        await self._pool(self._walk(final=final), final=final)
        self._queue_changed()

    async def retry_pass(self, pending: Any, attempt: int) -> None:
        """Checks `pending` ledger ids again; the caller has waited `checks.retry_delay`."""
        self.registered = await self.ctx.registered()
        final = attempt >= self.cfg.checks.retry_attempts
        await self._pool(self._reread(pending), final=final, retrying=True)
        self._queue_changed()

    def finish(self) -> CheckReport:
        deleted = self.walker.stats.deleted_during_walk
        if deleted:
            self.report.ledgers_skipped[str(SkipReason.DELETED)] += deleted
        self.report.finished_at = self.ctx.clock()
        if self.ctx.on_retry_queue is not None:
            self.ctx.on_retry_queue(0)
        return self.report

    async def run(self) -> CheckReport:
        await self.begin()
        await self.first_pass()
        for attempt in range(1, self.cfg.checks.retry_attempts + 1):
            if not self.retry:
                break
            pending, self.retry = self.retry, array("q")
            self.log.info(
                "re-checking potentially faulty ledgers after a delay",
                ledgers=len(pending),
                delay_s=self.cfg.checks.retry_delay,
                attempt=attempt,
            )
            # The delay is the point (BP-34): give a slow or restarting bookie time.
            await asyncio.sleep(self.cfg.checks.retry_delay)
            await self.retry_pass(pending, attempt)
        return self.finish()


async def run_replicas_check(ctx: CheckContext) -> CheckReport:
    started = time.monotonic()
    report = await ReplicasRun(ctx).run()
    ctx.log.info(
        "replicas check finished",
        ledgers_checked=report.ledgers_checked,
        violations=report.violations.total,
        seconds=round(time.monotonic() - started, 3),
    )
    return report
