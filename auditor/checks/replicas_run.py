"""The replicas check asks every bookie of every closed ledger, and what it reports gets
ledgers marked for re-replication, so nothing is reported on a first impression, and memory
must stay flat however many ledgers wait for a re-check.

Driving the replicas check: bookie answers in, BP-34's re-checks before any report.

Per closed ledger: skip it if it is already marked under-replicated (unless the
mark is older than the grace period, which is its own violation), ask each
distinct ensemble bookie once for what it holds (or probe by reads when it
cannot list; `bookie_answers`, which `explain` asks through too), and analyse.
Nothing is reported on a first impression:
- a ledger with a bookie that did not answer is "potentially faulty" and is
  checked again after `checks.retry_delay`; the re-checks are owed to each
  (ledger, bookie) that falls silent, not to the ledger: a bookie is reported
  (`bookie_unavailable_registered`, if still registered) only once it has
  been silent on the look where it fell silent and on `checks.retry_attempts`
  re-checks after it, and a ledger is re-checked at most twice
  `checks.retry_attempts` times (`replicas_retry`: the rule, and why that
  bound); an unregistered bookie is the bookie check's business;
- before a violation is reported, the mark is looked up again and the
  metadata re-read (`reread.Reread`); if the ledger changed (ensemble
  replaced, re-replicated), it is analysed again instead.

Each of these set-asides that ends with nothing reported for the ledger is
counted in `report.dropped` by cause (false-alarm accounting): the retry
succeeded, the ledger was marked meanwhile, deleted, or its metadata changed.
An unanswering bookie that is not registered is not counted: it is not a
false alarm but the bookie check's finding.

Ledgers are judged in batches (`batch_shape`: two batches of half
`checks.ledger_concurrency` at once, through the bounded pool): a batch's list
requests go out together, its answers are awaited together and judged in one
pass, with no task or coroutine per ledger, and a fully replicated ledger is
decided from the bytes its bookies sent (`replicas.listed_in_full`); a ledger
that needs more (a bookie to probe, a would-be violation to re-read) goes on
as `judge` takes it, after the pass. Only the
ledgers waiting for a retry are kept, packed with their silent bookies'
streaks (`replicas_retry.RetryQueue`), so memory stays flat in the number of
ledgers. A run is a first pass over the walk and retry passes over what did
not answer: `run` does them in turn, each ledger carrying its silences from
pass to pass; a scan does each as a stage across its partitions (`begin`,
`first_pass`, `retry_pass`, `finish`), handing on ledger ids only, so there
the re-checks stay counted per ledger (`Silence.since_first`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from auditor.bookie.availability import EMPTY
from auditor.bookie.client import ListBatch, decode_listing
from auditor.bookie.protocol import Status
from auditor.bookie.results import CannotList, ErrorStatus, ListOutcome, Ok, RawListOutcome
from auditor.checks.context import CheckContext
from auditor.checks.findings import (
    Check,
    CheckReport,
    Coverage,
    DropCause,
    LedgerOutcome,
    SkipReason,
)
from auditor.checks.grace import past_grace
from auditor.checks.looks import first_looks, looks_again
from auditor.checks.pool import bounded
from auditor.checks.recorder import RunRecorder
from auditor.checks.replicas import (
    BookieAnswer,
    Duties,
    Expectation,
    Listed,
    Probed,
    ReplicasVerdict,
    Unanswered,
    Unverified,
    analyse,
    expectations,
    listed_in_full,
    listing_duties,
    probe_entries,
    skip_reason,
    unanswered_registered,
    verdict_violations,
)
from auditor.checks.replicas_retry import NO_SILENCE, RecheckRule, RetryQueue, Silence
from auditor.checks.reread import Reread, Suspect
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.registry import BookieSet
from auditor.metadata.underreplication import CorruptMark, UnderreplicatedLedger
from auditor.metadata.walk import LedgerRecord

__all__ = ["ReplicasRun", "batch_shape", "bookie_answers", "run_replicas_check"]

_ABSENT = (Status.ENOENTRY, Status.ENOLEDGER)

T = TypeVar("T")


# --- asking the bookies about one ledger (the run and `explain`) ----------------------------


async def bookie_answers(
    ctx: CheckContext, md: LedgerMetadata, expected: Sequence[Expectation] | None = None
) -> dict[str, BookieAnswer]:
    """What each bookie that must hold entries of `md` says it holds, asked once each.

    All the list requests go out before the first answer is awaited
    (`start_list`: no task per request where the bookie is known to list); the
    bookies that cannot list are then probed together. `expected` is
    `expectations(md)` when the caller has it already.
    """
    exps = expectations(md) if expected is None else expected
    bookies = sorted({exp.bookie for exp in exps})
    held = ctx.held_bookies()
    # A held bookie's lost-bookie delay is running: it may be restarting; not asked,
    # not judged.
    asked = [None if b in held else ctx.bookies.start_list(b, md.ledger_id) for b in bookies]
    answers: dict[str, BookieAnswer] = {}
    to_probe: list[str] = []
    try:
        for bookie, listing in zip(bookies, asked, strict=True):
            answer = Unverified() if listing is None else _answer(await listing)
            if answer is _PROBE and ctx.config.checks.probe_unlistable:
                to_probe.append(bookie)
            answers[bookie] = Unverified() if answer is _PROBE else answer
    finally:
        for listing in asked:
            if listing is not None and not listing.done():
                listing.cancel()
    if to_probe:
        probed = await asyncio.gather(*(_probe(ctx, md, b) for b in to_probe))
        answers.update(zip(to_probe, probed, strict=True))
    return answers


#: `_answer`'s word for a bookie that cannot list: probe it by reads (if allowed).
_PROBE = Unverified()


def _answer(out: ListOutcome) -> BookieAnswer:
    """One bookie's list outcome as the analysis takes it."""
    if isinstance(out, Ok):
        return Listed(out.value)
    if isinstance(out, ErrorStatus) and out.status is Status.ENOLEDGER:
        return Listed(EMPTY)
    if isinstance(out, CannotList):
        return _PROBE
    return Unanswered(str(out))


async def _probe(ctx: CheckContext, md: LedgerMetadata, bookie: str) -> BookieAnswer:
    entries = probe_entries(md, bookie)
    outcomes = await asyncio.gather(
        *(ctx.bookies.read_entry(bookie, md.ledger_id, e) for e in entries)
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


# --- the run -------------------------------------------------------------------------------


def batch_shape(concurrency: int) -> tuple[int, int]:
    """(ledgers a batch, batches judged at once) for `checks.ledger_concurrency`: two
    batches when there is room (one is judged while the other's answers come), never
    more than `concurrency` ledgers in progress."""
    concurrency = max(concurrency, 1)
    depth = 2 if concurrency >= 2 else 1
    return concurrency // depth, depth


async def _ready(value: T) -> T:
    return value


@dataclass(frozen=True, slots=True)
class _Found:
    """A would-be violation: the verdict on one version of the metadata, and the silent
    bookies' streaks that verdict ends."""

    md: LedgerMetadata
    version: int
    verdict: ReplicasVerdict
    silence: Silence


#: What one look at a ledger came to (`reread.Look`).
_Seen = LedgerOutcome | Suspect[_Found] | None


class ReplicasRun:
    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.config
        self.recorder = RunRecorder.for_context(ctx, Check.REPLICAS, coverage=Coverage())
        self.log = self.recorder.log
        self.walker = ctx.walker()
        self.rule = RecheckRule(self.cfg.checks.retry_attempts)
        #: The ledgers waiting for the next retry pass (iterated: their ids).
        self.retry = RetryQueue()
        self.registered = BookieSet(frozenset(), frozenset())
        self.marks: dict[int, UnderreplicatedLedger] = {}
        #: Ledgers marked by a corrupt mark only (its name spells them; its data cannot
        #: be aged): skipped as marked, as a replication worker would not copy them twice.
        self.corrupt_marked: set[int] = set()
        self.reread: Reread[_Found] = Reread(
            self.recorder, self.walker, self._report, marked=partial(self._marked, fresh=True)
        )

    @property
    def report(self) -> CheckReport:
        return self.recorder.report

    # --- one ledger ------------------------------------------------------------------------

    async def judge(self, rec: LedgerRecord, silence: Silence = NO_SILENCE) -> LedgerOutcome | None:
        """How the ledger came out (recorded); None when it waits for a retry pass.

        `silence`: the ledger's looks so far in this run; after its first, it was set
        aside for a silent bookie, so ending with nothing reported is a drop
        (`retry_succeeded`, unless a later cause names it better).
        """
        doubt = DropCause.RETRY_SUCCEEDED if silence.looks else None
        return await self.reread.judge(rec, partial(self._look, silence=silence), doubt=doubt)

    async def _look(
        self, md: LedgerMetadata, rec: LedgerRecord, *, silence: Silence
    ) -> LedgerOutcome | Suspect[_Found] | None:
        version = rec.znode_version
        skip = skip_reason(md)
        if skip is not None:
            return self.recorder.skipped(md.ledger_id, skip, version)
        marked = self._listed_mark(md.ledger_id, version)
        if marked is not None:
            return marked
        expected = expectations(md)
        verdict = analyse(md, await bookie_answers(self.ctx, md, expected), expected)
        return self._after(md, version, verdict, silence)

    def _after(
        self, md: LedgerMetadata, version: int, verdict: ReplicasVerdict, silence: Silence
    ) -> LedgerOutcome | Suspect[_Found] | None:
        """A look's end, once its verdict is in: queued for a retry (None), ok (recorded),
        or a suspect to re-read before reporting."""
        now = silence.after(verdict.unanswered) if verdict.unanswered else NO_SILENCE
        if self.rule.waits(now):
            self.retry.add(md.ledger_id, now)
            return None
        if verdict.category is None and not verdict.unanswered:
            return self.recorder.ok(md.ledger_id, version, coverage=verdict.coverage())
        return Suspect(_Found(md, version, verdict, now))

    def _listed_mark(self, ledger_id: int, version: int) -> LedgerOutcome | None:
        """`_marked` on a first look: the marks listed at `begin`, no read."""
        if ledger_id in self.corrupt_marked:
            return self.recorder.skipped(ledger_id, SkipReason.UNDERREPLICATED, version)
        ur = self.marks.get(ledger_id)
        return None if ur is None else self._mark_outcome(ledger_id, version, ur)

    async def _marked(self, ledger_id: int, version: int, *, fresh: bool) -> LedgerOutcome | None:
        """Marked ledgers are skipped (or, past the grace period, reported as such).

        The first look uses the marks listed at the start of the run (one
        listing instead of a read per ledger); the look before reporting is fresh.
        A corrupt mark that names the ledger marks it too: skipped, never aged
        (named at `begin`, as the grace check names it).
        """
        if not fresh:
            return self._listed_mark(ledger_id, version)
        ur = await self.ctx.urm.get_mark(ledger_id)
        return None if ur is None else self._mark_outcome(ledger_id, version, ur)

    def _mark_outcome(
        self, ledger_id: int, version: int, ur: UnderreplicatedLedger | CorruptMark
    ) -> LedgerOutcome:
        if isinstance(ur, CorruptMark):
            return self.recorder.skipped(ledger_id, SkipReason.UNDERREPLICATED, version)
        grace = self.cfg.bookkeeper.underreplicatedLedgerRecoveryGracePeriod
        now_ms = int(self.ctx.clock() * 1000)
        late = past_grace(ledger_id, now_ms, ur.ctime, grace, ur.replicas)
        if late is None:
            return self.recorder.skipped(ledger_id, SkipReason.UNDERREPLICATED, version)
        return self.recorder.violation(ledger_id, version, [late])

    async def _report(self, found: _Found) -> LedgerOutcome:
        md, version, verdict = found.md, found.version, found.verdict
        available = self.registered.available
        due = self.rule.due(found.silence)
        violations = verdict_violations(md, verdict, version, available, due)
        silent_registered = unanswered_registered(verdict, available)
        for bookie, streak in found.silence.streaks:
            if bookie not in silent_registered:
                self.log.info(
                    "unanswering bookie is not registered; left to the bookie check",
                    ledger_id=md.ledger_id,
                    bookie=bookie,
                )
            elif bookie not in due:
                # Fell silent too late in the ledger's re-checks to have all of its own.
                self.log.info(
                    "unanswering bookie not re-checked enough before the bound; "
                    "left to the next run",
                    ledger_id=md.ledger_id,
                    bookie=bookie,
                    silent_looks=streak,
                    rechecks=found.silence.looks - 1,
                )
        coverage = verdict.coverage()
        if not violations:
            return self.recorder.ok(md.ledger_id, version, coverage=coverage)
        outcome = self.recorder.violation(md.ledger_id, version, violations, coverage=coverage)
        missing = verdict.bookies_missing_entries
        if verdict.category is not None and missing:
            await self.ctx.mark_underreplicated(self.report, md.ledger_id, missing, version=version)
        return outcome

    # --- ledgers judged in batches --------------------------------------------------------

    async def _judge_batch(self, batch: Sequence[tuple[LedgerRecord, Silence]]) -> None:
        """Judges a batch of ledgers as `judge` judges each: their list requests sent
        together (per bookie, `start_lists_raw`), their answers gathered into one
        `ListBatch` and judged in one pass, with no task, coroutine or future per ledger;
        a fully replicated ledger is decided from the bytes its bookies sent
        (`listed_in_full`). What needs more than one look (a bookie to probe, a suspect
        to re-read) goes on as `judge` does, after the pass."""
        recorder = self.recorder
        held = self.ctx.held_bookies()
        asked: list[tuple[LedgerRecord, Silence, LedgerMetadata, Duties]] = []
        later: list[Callable[[], Coroutine[Any, Any, object]]] = []
        per_bookie: dict[str, list[int]] = {}
        answers = ListBatch()
        try:
            for rec, silence in batch:
                md = rec.metadata
                if md is None:
                    later.append(partial(self.judge, rec, silence))
                    continue
                doubt = DropCause.RETRY_SUCCEEDED if silence.looks else None
                version = rec.znode_version
                skip = skip_reason(md)
                if skip is not None:
                    recorder.settle(recorder.skipped(md.ledger_id, skip, version), doubt)
                    continue
                marked = self._listed_mark(md.ledger_id, version)
                if marked is not None:
                    recorder.settle(marked, doubt)
                    continue
                duties = listing_duties(md)
                for bookie in duties:
                    if bookie not in held:
                        ids = per_bookie.get(bookie)
                        if ids is None:
                            per_bookie[bookie] = [md.ledger_id]
                        else:
                            ids.append(md.ledger_id)
                asked.append((rec, silence, md, duties))
            start = self.ctx.bookies.start_lists_raw
            for bookie, ids in per_bookie.items():
                start(answers, bookie, ids)
            await answers.wait()
            outcomes = answers.outcomes
            for rec, silence, md, duties in asked:
                lid = md.ledger_id
                raw: dict[str, bytes] = {}
                for bookie in duties:
                    out = outcomes.get((bookie, lid))
                    if type(out) is Ok and type(out.value) is bytes:
                        raw[bookie] = out.value
                version = rec.znode_version
                doubt = DropCause.RETRY_SUCCEEDED if silence.looks else None
                if len(raw) == len(duties) and listed_in_full(md, duties, raw):
                    ok = recorder.ok_listed(lid, version, len(raw))
                    if doubt is not None:
                        recorder.settle(ok, doubt)
                    continue
                listings = {b: (None if b in held else outcomes[b, lid]) for b in duties}
                answered, to_probe = self._answers(md, listings)
                if to_probe:
                    first = partial(self._probed_look, md, version, silence, answered, to_probe)
                    later.append(partial(self._judge_from, rec, silence, first))
                    continue
                verdict = analyse(md, answered)
                seen = self._after(md, version, verdict, silence)
                if seen is None:
                    continue
                if isinstance(seen, Suspect):
                    later.append(partial(self._judge_from, rec, silence, partial(_ready, seen)))
                    continue
                recorder.settle(seen, doubt)
        finally:
            answers.cancel()
        if later:
            # Each to its end (its ledger recorded) before the first error, if any, is raised.
            ended = await asyncio.gather(*(each() for each in later), return_exceptions=True)
            for end in ended:
                if isinstance(end, BaseException):
                    raise end

    def _answers(
        self, md: LedgerMetadata, listings: Mapping[str, RawListOutcome | ListOutcome | None]
    ) -> tuple[dict[str, BookieAnswer], list[str]]:
        """What each bookie said (None: held by the lost-bookie delay, not asked), as
        `bookie_answers` takes it, and those to probe."""
        probe = self.cfg.checks.probe_unlistable
        answers: dict[str, BookieAnswer] = {}
        to_probe: list[str] = []
        for bookie, out in sorted(listings.items()):
            if out is None:
                answers[bookie] = Unverified()
                continue
            if isinstance(out, Ok) and isinstance(out.value, bytes):
                out = decode_listing(bookie, md.ledger_id, out.value)
            answer = _answer(out)
            if answer is _PROBE and probe:
                to_probe.append(bookie)
            answers[bookie] = Unverified() if answer is _PROBE else answer
        return answers, to_probe

    async def _probed_look(
        self,
        md: LedgerMetadata,
        version: int,
        silence: Silence,
        answers: dict[str, BookieAnswer],
        to_probe: list[str],
    ) -> LedgerOutcome | Suspect[_Found] | None:
        probed = await asyncio.gather(*(_probe(self.ctx, md, b) for b in to_probe))
        answers.update(zip(to_probe, probed, strict=True))
        return self._after(md, version, analyse(md, answers), silence)

    async def _judge_from(
        self,
        rec: LedgerRecord,
        silence: Silence,
        first: Callable[[], Awaitable[_Seen]],
    ) -> LedgerOutcome | None:
        """`judge`, whose first look is `first` (begun in a batch); later looks as usual."""
        pending = [first]

        async def look(
            md: LedgerMetadata, at: LedgerRecord
        ) -> LedgerOutcome | Suspect[_Found] | None:
            if pending:
                return await pending.pop()()
            return await self._look(md, at, silence=silence)

        doubt = DropCause.RETRY_SUCCEEDED if silence.looks else None
        return await self.reread.judge(rec, look, doubt=doubt)

    async def _batches(
        self, items: AsyncIterator[tuple[LedgerRecord, Silence]]
    ) -> AsyncIterator[list[tuple[LedgerRecord, Silence]]]:
        size, _ = batch_shape(self.cfg.checks.ledger_concurrency)
        batch: list[tuple[LedgerRecord, Silence]] = []
        async for item in items:
            batch.append(item)
            if len(batch) >= size:
                yield batch
                batch = []
        if batch:
            yield batch

    # --- the passes ------------------------------------------------------------------------

    def _walk(self) -> AsyncIterator[tuple[LedgerRecord, Silence]]:
        return first_looks(self.walker, self.log, str(Check.REPLICAS), self.cfg.checks)

    def _pending(
        self, waiting: Iterable[tuple[int, Silence]]
    ) -> AsyncIterator[tuple[LedgerRecord, Silence]]:
        return looks_again(self.walker, self.recorder, waiting)

    async def _pass(self, items: AsyncIterator[tuple[LedgerRecord, Silence]]) -> None:
        """Judges `items` in batches (`batch_shape`): at most `checks.ledger_concurrency`
        ledgers in progress."""
        _, depth = batch_shape(self.cfg.checks.ledger_concurrency)
        await bounded(self._batches(items), self._judge_batch, depth)
        if self.ctx.on_retry_queue is not None:
            self.ctx.on_retry_queue(len(self.retry))

    async def _recheck(self, waiting: Iterable[tuple[int, Silence]]) -> None:
        self.registered = await self.ctx.registered()
        await self._pass(self._pending(waiting))

    async def begin(self) -> None:
        self.registered = await self.ctx.registered()
        listing = await self.ctx.urm.read_marks()
        self.marks = listing.by_id()
        self.corrupt_marked = listing.marked_ids() - self.marks.keys()
        # Every byte read is named when bad: the grace check names corrupt marks too, but
        # it may not run for a while (a pending lost-bookie audit holds it back). A scan's
        # partition (an id range) leaves them to the scan's one grace run: named once.
        for mark in listing.corrupt if self.ctx.id_range is None else ():
            self.recorder.invalid_znode(
                mark.path, mark.reason, what="corrupt under-replication mark"
            )

    async def first_pass(self) -> None:
        await self._pass(self._walk())

    async def retry_pass(self, pending: Iterable[int], attempt: int) -> None:
        """Checks `pending` ledger ids again at re-check `attempt`; the caller has waited
        `checks.retry_delay`. Their silences were not kept (a scan's stage), so each
        silent bookie is taken as silent since the first look: counted per ledger."""
        await self._recheck((lid, Silence.since_first(attempt)) for lid in pending)

    def finish(self) -> CheckReport:
        report = self.recorder.finish(self.walker)
        if self.ctx.on_retry_queue is not None:
            self.ctx.on_retry_queue(0)
        return report

    async def run(self) -> CheckReport:
        await self.begin()
        await self.first_pass()
        for attempt in range(1, self.rule.bound + 1):
            if not self.retry:
                break
            pending, self.retry = self.retry, RetryQueue()
            self.log.info(
                "re-checking potentially faulty ledgers after a delay",
                ledgers=len(pending),
                delay_s=self.cfg.checks.retry_delay,
                attempt=attempt,
            )
            # The delay is the point (BP-34): give a slow or restarting bookie time.
            await asyncio.sleep(self.cfg.checks.retry_delay)
            await self._recheck(pending.waiting())
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
