"""The other checks report undecodable metadata too, each on its own walk, but sometimes
only that question is wanted, and on a snapshot it is the one question a metadata copy can
answer completely.

The metadata check: every ledger's metadata decodes, and nothing else is asked.

The decoder's own validation (quorum sizes, segment order, closed-ledger
fields) is the rule set, so every engine and every check agree on what
"invalid" means. `MetadataRun` (the drivers' one shape: see `auditor.checks`)
judges records from the live walk or a snapshot's rows alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from auditor.checks.context import CheckContext
from auditor.checks.findings import Check, CheckReport, LedgerOutcome
from auditor.checks.progress import Progress
from auditor.checks.recorder import RunRecorder
from auditor.metadata.walk import LedgerRecord

__all__ = ["MetadataRun", "run_metadata_check"]


class MetadataRun:
    """Judges ledger records (from the live walk or a snapshot): decoded, or not."""

    def __init__(self, recorder: RunRecorder) -> None:
        self.recorder = recorder

    def judge(self, rec: LedgerRecord) -> LedgerOutcome:
        if rec.metadata is None:
            return self.recorder.metadata_invalid(rec)
        return self.recorder.ok(rec.ledger_id, rec.znode_version)

    async def judge_all(
        self, records: AsyncIterator[LedgerRecord], *, tick: Callable[[int], None] = lambda _: None
    ) -> None:
        async for rec in records:
            tick(rec.ledger_id)
            self.judge(rec)


async def run_metadata_check(ctx: CheckContext) -> CheckReport:
    recorder = RunRecorder.for_context(ctx, Check.METADATA)
    walker = ctx.walker()
    progress = Progress(
        recorder.log,
        str(Check.METADATA),
        interval=ctx.config.checks.progress_interval,
        max_ledger_id=await walker.max_ledger_id(),
    )
    await MetadataRun(recorder).judge_all(
        walker.ledgers(concurrency=ctx.config.checks.walk_window),
        tick=progress.tick,
    )
    return recorder.finish(walker)
