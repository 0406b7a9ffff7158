"""The replicas check and the deep scrub look at ledgers the same way, BP-34's: every ledger
once, in id order, then, after a delay, those a silent bookie set aside, each read afresh.
Written once here, so the two drivers cannot drift apart in what a pass reads, how its
progress is logged, or what a ledger deleted while it waited comes to.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from auditor.checks.findings import DropCause, SkipReason
from auditor.checks.progress import Progress
from auditor.checks.recorder import RunRecorder
from auditor.checks.replicas_retry import NO_SILENCE, Silence
from auditor.config.model import ChecksConfig
from auditor.metadata.walk import LedgerRecord, Walker


async def first_looks(
    walker: Walker, log: Any, check: str, checks: ChecksConfig
) -> AsyncIterator[tuple[LedgerRecord, Silence]]:
    """Every ledger of the walk, no silence yet, its progress logged every
    `checks.progress_interval` as `check`'s."""
    progress = Progress(
        log, check, interval=checks.progress_interval, max_ledger_id=await walker.max_ledger_id()
    )
    async for rec in walker.ledgers(concurrency=checks.walk_window):
        progress.tick(rec.ledger_id)
        yield rec, NO_SILENCE


async def looks_again(
    walker: Walker, recorder: RunRecorder, waiting: Iterable[tuple[int, Silence]]
) -> AsyncIterator[tuple[LedgerRecord, Silence]]:
    """The ledgers waiting for a re-check, read again; one deleted meanwhile is settled here
    (skipped as deleted, a drop for that cause)."""
    for ledger_id, silence in waiting:
        rec = await walker.read(ledger_id)
        if rec is None:
            deleted = recorder.skipped(ledger_id, SkipReason.DELETED)
            recorder.settle(deleted, DropCause.LEDGER_DELETED)
            continue
        yield rec, silence
