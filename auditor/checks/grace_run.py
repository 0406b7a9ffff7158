"""Aging the marks takes one listing of them and no ledger metadata, so unlike the other
checks it walks no ledgers, and a scan runs it once, on its driver, not in every partition.

The grace check's driver: every under-replication mark, judged against the grace period.

The rule is `grace`.

A corrupt mark (data that does not decode, a name that is not `urL%010d` of a
valid id, a mark out of its place) cannot be aged: it is an invalid znode of
the report, named by path and reason with a warning of its own, and every
other mark is judged as usual.
"""

from __future__ import annotations

from auditor.checks.context import CheckContext
from auditor.checks.findings import Check, CheckReport, LedgerOutcome, SkipReason
from auditor.checks.grace import past_grace
from auditor.checks.recorder import RunRecorder
from auditor.metadata.underreplication import CorruptMark, UnderreplicatedLedger

__all__ = ["GraceRun", "run_grace_check"]


async def run_grace_check(ctx: CheckContext) -> CheckReport:
    return await GraceRun(ctx).run()


class GraceRun:
    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.recorder = RunRecorder.for_context(ctx, Check.GRACE)
        self.grace = ctx.config.bookkeeper.underreplicatedLedgerRecoveryGracePeriod

    def judge(self, ur: UnderreplicatedLedger) -> LedgerOutcome:
        """One mark: skipped (the check off, or no ctime to age), within the grace period,
        or past it."""
        recorder = self.recorder
        if self.grace <= 0:
            return recorder.skipped(ur.ledger_id, SkipReason.GRACE_PERIOD_DISABLED)
        if ur.ctime < 0:
            return recorder.skipped(ur.ledger_id, SkipReason.NO_CTIME)
        now_ms = int(self.ctx.clock() * 1000)
        late = past_grace(ur.ledger_id, now_ms, ur.ctime, self.grace, ur.replicas)
        if late is None:
            return recorder.ok(ur.ledger_id)
        return recorder.violation(ur.ledger_id, -1, [late])

    async def run(self) -> CheckReport:
        if self.grace <= 0:
            self.recorder.log.info(
                "underreplicatedLedgerRecoveryGracePeriod is 0: the grace check is off"
            )
        async for item in self.ctx.urm.list_marks():
            if isinstance(item, CorruptMark):
                self.corrupt(item)
            else:
                self.judge(item)
        return self.recorder.finish()

    def corrupt(self, mark: CorruptMark) -> None:
        """A mark that cannot be judged: named in the report, and in a warning."""
        self.recorder.invalid_znode(mark.path, mark.reason, what="corrupt under-replication mark")
