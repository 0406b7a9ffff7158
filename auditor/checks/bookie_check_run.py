"""A bookie check that reads the registry once, or marks on a first look, marks the ledgers
of a bookie that was only restarting, or that a worker has already moved; the driver reads
the registry on both sides of the walk and each ledger again before it marks.

The bookie check driver: read who is available, walk every ledger, mark the lost ones.

One pass over the metadata in id order (reads pipelined by the walker), each
ledger's lost bookies computed against the available set read before the
walk; a ledger with none is settled at once, one with a lost bookie once the
registry has been read again after the walk. Choices where upstream is silent
or where a one-shot run differs from the daemon (the daemon's delay
bookkeeping lives in `auditor.schedule`):

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
* BP-34 before a report: every ledger still on a lost bookie after the
  registry's second read has its metadata read again from the store (in
  batches). Deleted meanwhile: dropped `ledger_deleted`; at a new version (a
  worker replaced the bookie, the ledger closed): judged again on it, dropped
  `metadata_changed` if it no longer names a lost bookie. The walk may have
  been the daemon's index, a few milliseconds behind the store, or a direct
  walk minutes long: either way what is reported and marked is the store's now.
* The mark is written only while the ledger is at the version it was decided
  on (`CheckContext.mark_underreplicated`'s `version`): a ledger re-replicated
  between that read and the mark is not marked for a bookie it no longer has.
* An existing mark that does not decode is left alone and logged; the other
  ledgers are still marked.
"""

from __future__ import annotations

from collections.abc import Set

from auditor.checks.bookie_check import (
    LedgerLoss,
    LostBookieIndex,
    invalid_metadata_violation,
    ledger_loss,
    loss_violations,
)
from auditor.checks.context import CheckContext
from auditor.checks.findings import Check, CheckReport, DropCause, LedgerOutcome, SkipReason
from auditor.checks.pool import bounded
from auditor.checks.progress import Progress
from auditor.checks.recorder import RunRecorder, decode_error
from auditor.metadata.underreplication import UnderreplicationFormatError
from auditor.metadata.walk import LedgerRecord

#: Ledgers read again per batch before the report (one `get_many` each).
REREAD_BATCH = 512

__all__ = ["BookieCheckRun", "run_bookie_check"]


async def run_bookie_check(ctx: CheckContext) -> CheckReport:
    """Reports (and with `ctx.mark`, marks) every ledger with a bookie that is neither
    writable nor read-only."""
    return await BookieCheckRun(ctx).run()


class BookieCheckRun:
    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.recorder = RunRecorder.for_context(ctx, Check.BOOKIES)
        self.log = self.recorder.log
        self.index = LostBookieIndex(())
        #: Ledgers with a lost bookie, settled once the registry is read again after the walk.
        self.losses: list[LedgerLoss] = []
        #: Where ledgers are read again: the store, never the index.
        self.fresh = ctx.fresh_walker()

    def judge(self, rec: LedgerRecord) -> LedgerOutcome | None:
        """One ledger of the walk: settled now, or (None) held while one of its bookies
        looks lost."""
        if rec.metadata is None:
            v = invalid_metadata_violation(
                rec.ledger_id, decode_error(rec), rec.path, rec.znode_version
            )
            return self.recorder.violation(rec.ledger_id, rec.znode_version, [v])
        loss = self.index.add(rec.metadata, rec.znode_version)
        if loss is None:
            return self.recorder.ok(rec.ledger_id, rec.znode_version)
        self.losses.append(loss)
        return None

    async def run(self) -> CheckReport:
        ctx, recorder = self.ctx, self.recorder
        before = await ctx.registered()
        # A held bookie (its lost-bookie delay still running) counts as present:
        # it may be restarting, and a restart marks nothing.
        held = ctx.held_bookies() - before.available
        self.index = LostBookieIndex(before.available | held)
        if held:
            self.log.info("bookies held by the lost-bookie delay left alone", bookies=sorted(held))
        walker = ctx.walker()
        progress = Progress(
            self.log,
            str(Check.BOOKIES),
            interval=ctx.config.checks.progress_interval,
            max_ledger_id=await walker.max_ledger_id(),
        )
        self.log.info(
            "bookie check started",
            writable=len(before.writable),
            readonly=len(before.readonly),
        )
        async for rec in walker.ledgers(concurrency=ctx.config.checks.walk_window):
            progress.tick(rec.ledger_id)
            self.judge(rec)
        if walker.stats.foreign_znodes:
            self.log.warning(
                "znodes under the ledgers root that are not ledgers",
                examples=walker.stats.foreign_znodes[:10],
                count=walker.stats.unexpected_count,
            )
        losses = await self._settle_losses()
        report = recorder.report
        report.lost_bookies = self.index.lost_bookies
        for bookie, ledgers in self.index:
            self.log.warning("lost bookie", bookie=bookie, ledgers=len(ledgers))
        await self._mark_all(losses)
        report = recorder.finish(walker)
        self.log.info(
            "bookie check finished",
            ledgers_checked=report.ledgers_checked,
            ledgers_deleted_during_walk=walker.stats.deleted_during_walk,
            lost_bookies=report.lost_bookies,
            counts=report.counts(),
            marked=len(report.marked_underreplicated),
            seconds=round(report.finished_at - report.started_at, 3),
        )
        return report

    async def _settle_losses(self) -> list[LedgerLoss]:
        """ "Lost" is unavailable before and after the walk: bookies that registered again
        meanwhile are forgotten, and a ledger left with none is a dropped would-be violation."""
        after = await self.ctx.registered()
        returned = set(self.index.lost_bookies) & after.available
        if returned:
            self.log.info(
                "bookies registered again during the walk: not lost", bookies=sorted(returned)
            )
            self.index.forget(returned)
        # Available before or after the walk (or held): never lost this run.
        available = self.index.available | returned
        still: list[LedgerLoss] = []
        for loss in self.losses:
            left = loss.without(returned)
            if left is None:
                self.recorder.ok(loss.ledger_id, loss.znode_version)
                self.recorder.dropped(loss.ledger_id, DropCause.BOOKIE_RETURNED)
            else:
                still.append(left)
        self.losses = []
        kept: list[LedgerLoss] = []
        for i in range(0, len(still), REREAD_BATCH):
            batch = still[i : i + REREAD_BATCH]
            fresh = await self.fresh.read_many([loss.ledger_id for loss in batch])
            for loss, rec in zip(batch, fresh, strict=True):
                now = self._again(loss, rec, available)
                if now is not None:
                    self.recorder.violation(now.ledger_id, now.znode_version, loss_violations(now))
                    kept.append(now)
        return kept

    def _again(
        self, loss: LedgerLoss, rec: LedgerRecord | None, available: Set[str]
    ) -> LedgerLoss | None:
        """The loss as the store shows it now (recorded when there is none left to report):
        the same at the same version, judged again at a new one."""
        if rec is None:
            self.log.info("ledger deleted while being checked", ledger_id=loss.ledger_id)
            self.recorder.skipped(loss.ledger_id, SkipReason.DELETED)
            self.recorder.dropped(loss.ledger_id, DropCause.LEDGER_DELETED)
            return None
        if rec.znode_version == loss.znode_version:
            return loss
        if rec.metadata is None:
            v = invalid_metadata_violation(
                rec.ledger_id, decode_error(rec), rec.path, rec.znode_version
            )
            self.recorder.violation(rec.ledger_id, rec.znode_version, [v])
            return None
        self.log.info(
            "metadata changed during the check; judged again",
            ledger_id=loss.ledger_id,
            old_version=loss.znode_version,
            new_version=rec.znode_version,
        )
        now = ledger_loss(rec.metadata, available, rec.znode_version)
        if now is None:
            self.recorder.ok(rec.ledger_id, rec.znode_version)
            self.recorder.dropped(rec.ledger_id, DropCause.METADATA_CHANGED)
        return now

    async def _mark_all(self, losses: list[LedgerLoss]) -> None:
        """One mark per affected ledger, a bounded number in flight."""
        if not self.ctx.mark or not losses:
            return
        if not await self.ctx.urm.is_replication_enabled():
            self.log.warning(
                "replication is disabled: reporting but not marking",
                ledgers_not_marked=len(losses),
                lost_bookies=self.recorder.report.lost_bookies,
            )
            return
        await bounded(losses, self._mark_one, self.ctx.config.checks.ledger_concurrency)

    async def _mark_one(self, loss: LedgerLoss) -> None:
        try:
            await self.ctx.mark_underreplicated(
                self.recorder.report, loss.ledger_id, loss.bookies, version=loss.znode_version
            )
        except UnderreplicationFormatError as exc:
            self.log.error(
                "could not mark ledger: its existing under-replication mark is corrupt",
                ledger_id=loss.ledger_id,
                missing_replicas=list(loss.bookies),
                error=str(exc),
            )
