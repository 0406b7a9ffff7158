"""The metadata check: every ledger's metadata decodes, and nothing else is asked.

The other checks report undecodable metadata too, each on its own walk; this
check exists for the cases where only that question is wanted and for a
snapshot, where it is the one question a metadata copy can answer completely.
The decoder's own validation (quorum sizes, segment order, closed-ledger
fields) is the rule set, so every engine and every check agree on what
"invalid" means.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from auditor.checks.context import CheckContext
from auditor.checks.findings import (
    Category,
    Check,
    CheckReport,
    LedgerOutcome,
    Outcome,
    SkipReason,
    metadata_invalid,
)
from auditor.checks.progress import Progress
from auditor.metadata.walk import LedgerRecord


async def judge_metadata(
    records: AsyncIterator[LedgerRecord],
    report: CheckReport,
    *,
    log: Any,
    outcome: Callable[[LedgerOutcome], None],
    tick: Callable[[int], None] = lambda _: None,
) -> None:
    async for rec in records:
        tick(rec.ledger_id)
        report.ledgers_checked += 1
        if rec.metadata is not None:
            outcome(
                LedgerOutcome(Check.METADATA, rec.ledger_id, Outcome.OK, None, rec.znode_version)
            )
            continue
        reason = rec.error.reason if rec.error is not None else "metadata missing"
        v = metadata_invalid(rec.ledger_id, rec.path, rec.znode_version, reason)
        report.violations.append(v)
        log.warning(
            "metadata invalid",
            ledger_id=rec.ledger_id,
            category=str(Category.METADATA_INVALID),
            check=str(Check.METADATA),
            **v.detail,
        )
        outcome(
            LedgerOutcome(Check.METADATA, rec.ledger_id, Outcome.VIOLATION, None, rec.znode_version)
        )


async def run_metadata_check(ctx: CheckContext) -> CheckReport:
    report = ctx.new_report(Check.METADATA)
    walker = ctx.walker()
    progress = Progress(
        ctx.log,
        str(Check.METADATA),
        interval=ctx.config.checks.progress_interval,
        max_ledger_id=await walker.max_ledger_id(),
    )
    await judge_metadata(
        walker.ledgers(concurrency=ctx.config.checks.ledger_concurrency),
        report,
        log=ctx.log,
        outcome=ctx.outcome,
        tick=progress.tick,
    )
    if walker.stats.deleted_during_walk:
        report.ledgers_skipped[str(SkipReason.DELETED)] += walker.stats.deleted_during_walk
    report.finished_at = ctx.clock()
    return report
