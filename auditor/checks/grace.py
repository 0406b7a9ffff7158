"""Progress of under-replication: ledgers marked longer than the grace period.

Upstream runs this only inside the placement check (and so only when that
check is scheduled); here it is a check of its own, and the replicas check
applies the same rule to the marked ledgers it meets. The rule is
BookKeeper's: whole seconds since the mark's ctime strictly greater than
`underreplicatedLedgerRecoveryGracePeriod`; marks without a ctime cannot age
and are counted as skipped; a grace period of 0 turns the check off.
"""

from __future__ import annotations

from collections.abc import Sequence

from auditor.checks.context import CheckContext
from auditor.checks.findings import (
    Category,
    Check,
    CheckReport,
    LedgerOutcome,
    Outcome,
    SkipReason,
    Violation,
)


def past_grace(
    ledger_id: int, now_ms: int, ctime: int, grace_s: int, replicas: Sequence[str] = ()
) -> Violation | None:
    """A violation when a mark made at `ctime` (ms) is older than `grace_s` seconds."""
    if grace_s <= 0 or ctime < 0:
        return None
    age = (now_ms - ctime) // 1000
    if age <= grace_s:
        return None
    return Violation(
        ledger_id,
        Category.UNDERREPLICATED_PAST_GRACE_PERIOD,
        None,
        {
            "marked_at_ms": ctime,
            "age_s": age,
            "grace_period_s": grace_s,
            "replicas": list(replicas),
        },
    )


async def run_grace_check(ctx: CheckContext) -> CheckReport:
    report = ctx.new_report(Check.GRACE)
    grace = ctx.config.bookkeeper.underreplicatedLedgerRecoveryGracePeriod
    log = ctx.log.bind(check="grace")
    if grace <= 0:
        log.info("underreplicatedLedgerRecoveryGracePeriod is 0: the grace check is off")
    async for ur in ctx.urm.list_underreplicated():
        skip = (
            SkipReason.GRACE_PERIOD_DISABLED
            if grace <= 0
            else SkipReason.NO_CTIME
            if ur.ctime < 0
            else None
        )
        if skip is not None:
            report.ledgers_skipped[str(skip)] += 1
            ctx.outcome(LedgerOutcome(Check.GRACE, ur.ledger_id, Outcome.SKIPPED, str(skip)))
            continue
        report.ledgers_checked += 1
        v = past_grace(ur.ledger_id, int(ctx.clock() * 1000), ur.ctime, grace)
        found = Outcome.OK if v is None else Outcome.VIOLATION
        ctx.outcome(LedgerOutcome(Check.GRACE, ur.ledger_id, found))
        if v is not None:
            v = Violation(
                v.ledger_id, v.category, None, {**v.detail, "replicas": list(ur.replicas)}
            )
            report.violations.append(v)
            log.warning("violation", ledger_id=v.ledger_id, category=str(v.category), **v.detail)
    report.finished_at = ctx.clock()
    return report
