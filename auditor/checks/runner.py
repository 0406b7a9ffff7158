"""The CLI, the daemon and Spark must run the same driver for a check, with the Pulsar owners
of flagged ledgers attached alike, and should import only the drivers they run.

Which driver runs which check; the one table the CLI, the daemon and Spark share.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from auditor.checks.context import CheckContext
from auditor.checks.findings import ALL_CHECKS, Check, CheckReport

__all__ = ["ALL_CHECKS", "Driver", "driver"]

Driver = Callable[[CheckContext], Awaitable[CheckReport]]


def driver(check: Check) -> Driver:
    """The driver of a check, whose report then names the Pulsar owners of flagged ledgers."""
    run = _driver(check)

    async def with_owners(ctx: CheckContext) -> CheckReport:
        from auditor.checks.owners_run import attach_owners

        report = await run(ctx)
        await attach_owners(ctx, report)
        return report

    return with_owners


def _driver(check: Check) -> Driver:
    """The bare driver (imported on demand: each pulls in only what it needs)."""
    if check is Check.REPLICAS:
        from auditor.checks.replicas_run import run_replicas_check

        return run_replicas_check
    if check is Check.GRACE:
        from auditor.checks.grace_run import run_grace_check

        return run_grace_check
    if check is Check.PLACEMENT:
        from auditor.checks.placement_run import run_placement_check

        return run_placement_check
    if check is Check.METADATA:
        from auditor.checks.metadata_run import run_metadata_check

        return run_metadata_check
    if check is Check.LEDGERS:
        from auditor.checks.ledger_check_run import run_ledger_check

        return run_ledger_check
    if check is Check.BOOKIES:
        from auditor.checks.bookie_check_run import run_bookie_check

        return run_bookie_check
    if check is Check.SCRUB:
        from auditor.checks.scrub_run import run_scrub_check

        return run_scrub_check
    if check is Check.PULSAR:
        # Metadata only here (no bookie asked, no risk): `pulsar-audit` runs the
        # replicas check first and hands its verdicts in (`run_pulsar_audit`).
        from auditor.checks.pulsar_audit_run import run_pulsar_check

        return run_pulsar_check
    raise ValueError(f"no driver for the {check} check")
