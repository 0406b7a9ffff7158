"""A check's report and its per-ledger outcome rows must never disagree, and every check must
log its violations alike and within bounds; both hold only if each ledger is settled in one
place, once.

One run's account of its ledgers: the report and the per-ledger outcome rows, kept together.

Every check driver settles each ledger through its `RunRecorder`, exactly once:
`ok`, `skipped` (with its reason), `violation` (one or several of one ledger)
or `metadata_invalid`. Each of these updates the report (ledgers checked or
skipped, violations, the replicas check's coverage), logs the violations, and
hands the ledger's `LedgerOutcome` to the sink (a scan's coverage rows), so the
report and the rows cannot disagree. `dropped` counts a would-be violation that
ended with nothing reported (false-alarm accounting) and `settle` decides when
an outcome is one; `finish` closes the report.

A bad znode that names no ledger is no ledger's outcome: `invalid_znode`
records it in the report's invalid znodes (a corrupt mark, by the grace
check), and `finish(walker)` records the walk's invalid ledger znodes (paths
spelling no valid id), once per run, whichever walker (ZooKeeper or the
leader's index) walked.

Log lines, the same for every check: each violation is a warning "violation"
with check, ledger_id, category, bookie and the violation's detail, unless the
driver describes its lines itself (the placement check logs one line per
segment, the ledger check a summary of its bad fragments). `metadata_invalid`
of the two metadata-only checks (placement, metadata) is logged as "metadata
invalid", the event those checks have always used. Every line of the recorder's
logger names the check.

Those lines are bounded (`checks.violation_log_limit`, `log_limit` here): per
run and per category, the first `log_limit` violations are logged, the others
only counted; a violation is logged whole or not at all (all of a driver's
lines for it). When any was left out, `finish` logs one warning "violation log
lines suppressed" with, per category seen, `logged` and `suppressed` violations
(the two add up to the category's violations this run). The report, the outcome
rows and everything built on them keep every violation. A recorder is one run,
or one partition or stage of a scan, so the bound applies to each.

Part of the one driver convention (see `auditor.checks`): every `<Check>Run`
owns one recorder, and nothing else writes its report's counts or its rows.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Final

from auditor.checks.context import CheckContext
from auditor.checks.findings import (
    Check,
    CheckReport,
    Coverage,
    DropCause,
    InvalidZnode,
    LedgerOutcome,
    Outcome,
    SkipReason,
    Violation,
    metadata_invalid,
)
from auditor.config.model import ChecksConfig
from auditor.metadata.ledger_tree import WalkStats
from auditor.metadata.walk import LedgerRecord, Walker

__all__ = [
    "DEFAULT_LOG_LIMIT",
    "SKIP_CAUSES",
    "LogLine",
    "RunRecorder",
    "Sink",
    "decode_error",
    "violation_fields",
]

Sink = Callable[[LedgerOutcome], None]
#: One log line: its event and fields (a driver's own description of a violation).
LogLine = tuple[str, dict[str, Any]]

#: Skips that name why a would-be violation was dropped better than the doubt before them.
SKIP_CAUSES: Final = {
    str(SkipReason.UNDERREPLICATED): DropCause.MARKED_MEANWHILE,
    str(SkipReason.DELETED): DropCause.LEDGER_DELETED,
    str(SkipReason.METADATA_CHANGING): DropCause.METADATA_CHANGED,
}
_INVALID_EVENTS: Final = {Check.PLACEMENT: "metadata invalid", Check.METADATA: "metadata invalid"}
#: `checks.violation_log_limit`'s default, for recorders made without a configuration.
DEFAULT_LOG_LIMIT: Final = ChecksConfig().violation_log_limit


def decode_error(rec: LedgerRecord) -> str:
    """Why a record carries no metadata."""
    return rec.error.reason if rec.error is not None else "metadata missing"


def violation_fields(v: Violation) -> dict[str, Any]:
    """The fields of a violation's default log line."""
    return {"ledger_id": v.ledger_id, "category": str(v.category), "bookie": v.bookie, **v.detail}


class RunRecorder:
    """The report of one run (or one partition or stage of it) and its outcome rows."""

    def __init__(
        self,
        report: CheckReport,
        log: Any,
        sink: Sink | None = None,
        *,
        clock: Callable[[], float] = time.time,
        log_limit: int = DEFAULT_LOG_LIMIT,
    ) -> None:
        self.report = report
        self.check = report.check
        self.log = log.bind(check=str(report.check))
        self._sink = sink
        self._clock = clock
        #: Violations logged one by one per category, at most; negative: no bound.
        self.log_limit = log_limit
        self._logged: Counter[str] = Counter()
        self._suppressed: Counter[str] = Counter()

    @classmethod
    def for_context(cls, ctx: CheckContext, check: Check, **fields: Any) -> RunRecorder:
        """A recorder of a fresh report of `check`, whose rows go to `ctx.outcome`."""
        return cls(
            ctx.new_report(check, **fields),
            ctx.log,
            ctx.outcome,
            clock=ctx.clock,
            log_limit=ctx.config.checks.violation_log_limit,
        )

    # --- one outcome per ledger ---------------------------------------------------------

    def ok(
        self, ledger_id: int, version: int = -1, *, coverage: Coverage | None = None
    ) -> LedgerOutcome:
        """Judged, nothing found."""
        self.report.ledgers_checked += 1
        return self._row(ledger_id, Outcome.OK, None, version, coverage)

    def ok_listed(self, ledger_id: int, version: int, listed: int) -> LedgerOutcome:
        """`ok` with coverage `Coverage(listed=listed)`: the replicas check's common case
        (every bookie listed its whole share), recorded without a `Coverage` a ledger."""
        self.report.ledgers_checked += 1
        mine = self.report.coverage
        if mine is None:
            mine = self.report.coverage = Coverage()
        mine.listed += listed
        row = LedgerOutcome(self.check, ledger_id, Outcome.OK, None, version, listed)
        if self._sink is not None:
            self._sink(row)
        return row

    def skipped(self, ledger_id: int, reason: SkipReason, version: int = -1) -> LedgerOutcome:
        """Not judged, for `reason`."""
        self.report.ledgers_skipped[str(reason)] += 1
        return self._row(ledger_id, Outcome.SKIPPED, str(reason), version, None)

    def violation(
        self,
        ledger_id: int,
        version: int,
        found: Sequence[Violation],
        *,
        coverage: Coverage | None = None,
        lines: Sequence[LogLine] | None = None,
    ) -> LedgerOutcome:
        """Judged, and `found` (one ledger's violations, at least one) reported.

        Logged as one "violation" line each, or as `lines` when the driver
        describes them itself, within the bound of `log_limit` per category.
        """
        if not found:
            raise ValueError(f"ledger {ledger_id}: a violation outcome needs a violation")
        self.report.ledgers_checked += 1
        for v in found:
            self.report.violations.append(v)
        self._log_violations(found, lines)
        return self._row(ledger_id, Outcome.VIOLATION, None, version, coverage)

    def metadata_invalid(self, rec: LedgerRecord, reason: str | None = None) -> LedgerOutcome:
        """`metadata_invalid`: the record did not decode, or `reason` says what is wrong with it."""
        why = decode_error(rec) if reason is None else reason
        v = metadata_invalid(rec.ledger_id, rec.path, rec.znode_version, why)
        event = _INVALID_EVENTS.get(self.check, "violation")
        return self.violation(
            rec.ledger_id, rec.znode_version, [v], lines=[(event, violation_fields(v))]
        )

    # --- would-be violations ------------------------------------------------------------

    def dropped(self, ledger_id: int, cause: DropCause) -> None:
        """A would-be violation of this ledger ended with nothing reported."""
        self.report.dropped[str(cause)] += 1
        self.log.info("would-be violation dropped", ledger_id=ledger_id, cause=str(cause))

    def settle(self, outcome: LedgerOutcome, doubt: DropCause | None) -> LedgerOutcome:
        """Counts `outcome` as a drop when the ledger had been set aside (`doubt`) and
        ended with nothing reported; the skip's own cause wins over the doubt."""
        if doubt is not None and outcome.outcome is not Outcome.VIOLATION:
            self.dropped(outcome.ledger_id, SKIP_CAUSES.get(outcome.skip_reason or "", doubt))
        return outcome

    # --- bad znodes that name no ledger ---------------------------------------------------

    def invalid_znode(self, path: str, reason: str, *, what: str = "invalid znode") -> None:
        """A bad znode of the report, with one warning naming it (`what` it is)."""
        self.report.invalid_znodes.append(InvalidZnode(path, reason))
        self.log.warning(what, path=path, reason=reason)

    def walked(self, stats: WalkStats) -> None:
        """The walk's invalid ledger znodes (every one counted, those it kept listed), with
        one warning for them all."""
        if not stats.invalid_ledgers:
            return
        kept = [u for u in stats.unexpected if u.invalid_ledger]
        for u in kept:
            self.report.invalid_znodes.append(InvalidZnode(u.path, u.reason))
        self.report.invalid_znodes.count_unlisted(stats.invalid_ledgers - len(kept))
        self.log.warning(
            "invalid ledger znodes: not ledgers, left out of the check",
            count=stats.invalid_ledgers,
            examples=[str(u) for u in kept[:10]],
        )

    # --- the end ------------------------------------------------------------------------

    def finish(self, walker: Walker | None = None) -> CheckReport:
        """The report, closed: ledgers the walk saw deleted counted as skipped, the walk's
        invalid ledger znodes named, marks in id order (ledgers finish out of order), the
        finishing time stamped."""
        if walker is not None:
            if walker.stats.deleted_during_walk:
                deleted = walker.stats.deleted_during_walk
                self.report.ledgers_skipped[str(SkipReason.DELETED)] += deleted
            self.walked(walker.stats)
        self.report.marked_underreplicated.sort()
        self.report.finished_at = self._clock()
        self._summarise_suppressed()
        return self.report

    # --- bounded violation lines ----------------------------------------------------------

    def _admit(self, category: str) -> bool:
        """Counts one violation of `category`: whether its lines are logged."""
        if self.log_limit < 0 or self._logged[category] < self.log_limit:
            self._logged[category] += 1
            return True
        self._suppressed[category] += 1
        return False

    def _log_violations(self, found: Sequence[Violation], lines: Sequence[LogLine] | None) -> None:
        """Each violation's lines, if it is admitted. A driver's own lines go with the
        violations of the category they name (or with any admitted one if they name none)."""
        if lines is None:
            for v in found:
                if self._admit(str(v.category)):
                    self.log.warning("violation", **violation_fields(v))
            return
        admitted = [str(v.category) for v in found if self._admit(str(v.category))]
        if not admitted:
            return
        for event, fields in lines:
            category = fields.get("category")
            if category is None or str(category) in admitted:
                self.log.warning(event, **fields)

    def _summarise_suppressed(self) -> None:
        """One warning for the violations not logged one by one, with exact counts."""
        if not self._suppressed:
            return
        seen = sorted(self._logged.keys() | self._suppressed.keys())
        self.log.warning(
            "violation log lines suppressed",
            logged={c: self._logged[c] for c in seen},
            suppressed={c: self._suppressed[c] for c in seen},
            limit=self.log_limit,
        )

    def _row(
        self,
        ledger_id: int,
        outcome: Outcome,
        reason: str | None,
        version: int,
        coverage: Coverage | None,
    ) -> LedgerOutcome:
        if coverage is None:
            row = LedgerOutcome(self.check, ledger_id, outcome, reason, version)
        else:
            mine = self.report.coverage
            if mine is None:
                mine = self.report.coverage = Coverage()
            mine.listed += coverage.listed
            mine.probed += coverage.probed
            mine.unverified += coverage.unverified
            row = LedgerOutcome(
                self.check,
                ledger_id,
                outcome,
                reason,
                version,
                coverage.listed,
                coverage.probed,
                coverage.unverified,
            )
        if self._sink is not None:
            self._sink(row)
        return row
