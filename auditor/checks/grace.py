"""A mark that stays past its grace period means re-replication is not getting anywhere,
and the grace check, the replicas check, `explain` and the self-test must all age a mark by
the same rule.

Progress of under-replication: ledgers marked longer than the grace period.

Upstream runs this only inside the placement check (and so only when that
check is scheduled); here it is a check of its own, and the replicas check
applies the same rule to the marked ledgers it meets. The rule is
BookKeeper's: whole seconds since the mark's ctime strictly greater than
`underreplicatedLedgerRecoveryGracePeriod`; marks without a ctime cannot age
and are counted as skipped; a grace period of 0 turns the check off.

The check's driver is `grace_run`.
"""

from __future__ import annotations

from collections.abc import Sequence

from auditor.checks.findings import Category, Violation


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
