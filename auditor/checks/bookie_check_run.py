"""The bookie check driver: read who is available, walk every ledger, mark the lost ones.

One pass over the metadata in id order (reads pipelined by the walker), each
ledger's lost bookies computed against the available set read before the
walk. Choices where upstream is silent or where a one-shot run differs from
the daemon (the daemon's delay bookkeeping lives in `lost_bookie_delay`):

* The available set is read again after the walk, and a bookie that has
  re-registered meanwhile is not reported: "lost" means unavailable both
  before and after the walk. (A bookie lost during the walk is caught by the
  next run.) A ledger left with no lost bookie is counted as a dropped
  would-be violation (`bookie_returned`).
* One mark per ledger, listing all its lost bookies (sorted). Upstream marks
  once per lost bookie with `[thatBookie]`; the marks merge by exact string,
  so the znode ends up listing the same bookies, with fewer ZooKeeper writes.
* While replication is disabled the check still reports but does not mark.
  Upstream's auditor blocks until replication is re-enabled (S33) although
  marking itself would succeed (S64): operators disable replication for
  rolling restarts (S51), and a one-shot check must neither hang nor mark the
  ledgers of a bookie that is merely restarting. A warning says what was held
  back.
* An existing mark that does not decode is left alone and logged; the other
  ledgers are still marked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from auditor.checks.bookie_check import (
    LedgerLoss,
    LostBookieIndex,
    invalid_metadata_violation,
    loss_violations,
)
from auditor.checks.context import CheckContext
from auditor.checks.findings import Check, CheckReport, DropCause, SkipReason, Violation
from auditor.checks.progress import Progress
from auditor.metadata.underreplication import UnderreplicationFormatError


async def run_bookie_check(ctx: CheckContext) -> CheckReport:
    """Reports (and with `ctx.mark`, marks) every ledger with a bookie that is neither
    writable nor read-only."""
    report = ctx.new_report(Check.BOOKIES)
    before = await ctx.registered()
    index = LostBookieIndex(before.available)
    walker = ctx.walker()
    progress = Progress(
        ctx.log,
        str(Check.BOOKIES),
        interval=ctx.config.checks.progress_interval,
        max_ledger_id=await walker.max_ledger_id(),
    )
    ctx.log.info(
        "bookie check started",
        writable=len(before.writable),
        readonly=len(before.readonly),
    )
    losses: list[LedgerLoss] = []
    invalid: list[Violation] = []
    async for rec in walker.ledgers(concurrency=ctx.config.checks.ledger_concurrency):
        progress.tick(rec.ledger_id)
        report.ledgers_checked += 1
        if rec.metadata is None:
            reason = rec.error.reason if rec.error is not None else "metadata did not decode"
            invalid.append(
                invalid_metadata_violation(rec.ledger_id, reason, rec.path, rec.znode_version)
            )
            continue
        loss = index.add(rec.metadata, rec.znode_version)
        if loss is not None:
            losses.append(loss)
    if walker.stats.deleted_during_walk:
        report.ledgers_skipped[str(SkipReason.DELETED)] = walker.stats.deleted_during_walk
    if walker.stats.foreign_znodes:
        ctx.log.warning(
            "znodes under the ledgers root that are not ledgers",
            examples=walker.stats.foreign_znodes[:10],
            count=len(walker.stats.foreign_znodes),
        )

    after = await ctx.registered()
    returned = set(index.lost_bookies) & after.available
    if returned:
        ctx.log.info("bookies registered again during the walk: not lost", bookies=sorted(returned))
        index.forget(returned)
        kept_losses = [kept for loss in losses if (kept := loss.without(returned)) is not None]
        # Ledgers whose every lost bookie came back: would-be violations, not reported.
        gone = len(losses) - len(kept_losses)
        if gone:
            report.dropped[str(DropCause.BOOKIE_RETURNED)] += gone
        losses = kept_losses

    report.lost_bookies = index.lost_bookies
    for loss in losses:
        report.violations.extend(loss_violations(loss))
    report.violations.extend(invalid)
    _log_findings(ctx, report, index)
    await _mark_all(ctx, report, losses)
    report.finished_at = ctx.clock()
    ctx.log.info(
        "bookie check finished",
        ledgers_checked=report.ledgers_checked,
        ledgers_deleted_during_walk=walker.stats.deleted_during_walk,
        lost_bookies=report.lost_bookies,
        counts=report.counts(),
        marked=len(report.marked_underreplicated),
        seconds=round(report.finished_at - report.started_at, 3),
    )
    return report


def _log_findings(ctx: CheckContext, report: CheckReport, index: LostBookieIndex) -> None:
    for v in report.violations:
        ctx.log.warning(
            "violation",
            check=str(report.check),
            ledger_id=v.ledger_id,
            category=str(v.category),
            bookie=v.bookie,
            **v.detail,
        )
    for bookie, ledgers in index:
        ctx.log.warning("lost bookie", bookie=bookie, ledgers=len(ledgers))


async def _mark_all(ctx: CheckContext, report: CheckReport, losses: Sequence[LedgerLoss]) -> None:
    """One mark per affected ledger, a bounded number in flight."""
    if not ctx.mark or not losses:
        return
    if not await ctx.urm.is_replication_enabled():
        ctx.log.warning(
            "replication is disabled: reporting but not marking",
            ledgers_not_marked=len(losses),
            lost_bookies=report.lost_bookies,
        )
        return
    limit = ctx.config.checks.ledger_concurrency
    pending: set[asyncio.Task[None]] = set()
    try:
        for loss in losses:
            if len(pending) >= limit:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
            pending.add(asyncio.ensure_future(_mark_one(ctx, report, loss)))
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
    finally:
        for task in pending:
            task.cancel()


async def _mark_one(ctx: CheckContext, report: CheckReport, loss: LedgerLoss) -> None:
    try:
        await ctx.mark_underreplicated(report, loss.ledger_id, loss.bookies)
    except UnderreplicationFormatError as exc:
        ctx.log.error(
            "could not mark ledger: its existing under-replication mark is corrupt",
            ledger_id=loss.ledger_id,
            missing_replicas=list(loss.bookies),
            error=str(exc),
        )
