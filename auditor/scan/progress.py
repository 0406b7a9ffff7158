"""A check walks once, in id order, so its own `Progress` can say how far it is; a scan's
partitions run at once, in this process or on Spark executors, and no single walk sees the
whole, yet the operator still wants a progress line and an ETA.

How far a scan or a snapshot is: per stage, partitions done and the share of the work.

A scan runs stages (the first pass, each retry, a snapshot's write). The engine keeps a
`StageTally` of the stage it runs and the scan's driver reads it on a timer
(`reporting_stages`), logging one "scan progress" line every `checks.progress_interval`
seconds: the stage, the partitions done, the share of the stage done, ledgers walked
where the engine knows them, and an ETA from the share. The CLI draws that event as a
bar on a terminal (`auditor.cli.progress`).

What the share is made of differs by engine:
- in process, each partition tells how far it is (`PartitionProgress`: the
  checks it has finished plus the running check's share of its id range, from
  the checks' own `Progress` hook), so the share moves within a partition;
- on Spark, the driver sees finished tasks only (Spark's status tracker), so
  the share is partitions done over partitions, and no ledger count.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

#: The event the driver logs, and the CLI's bar draws.
SCAN_PROGRESS_EVENT = "scan progress"


class PartitionProgress:
    """One partition's progress through the checks it runs in turn.

    `tick` is the checks' progress hook (`auditor.checks.progress.reporting_progress`):
    ledgers done by the running check and an estimate of its total (None while unknown).
    """

    __slots__ = ("_base", "_checks", "_current", "_done_checks", "finished", "ledgers")

    def __init__(self, checks: int = 1) -> None:
        self._checks = max(checks, 1)
        self._done_checks = 0
        self._current = 0.0
        self._base = 0
        #: Ledgers walked so far, all checks of the partition together.
        self.ledgers = 0
        self.finished = False

    def tick(self, done: int, total: int | None) -> None:
        self.ledgers = self._base + done
        if total:
            self._current = min(done / total, 1.0)

    def end_check(self, walked: int | None = None) -> None:
        """A check ended, having walked `walked` ledgers (the hook is told at most twice a
        second, so its last count may be behind)."""
        if walked is not None:
            self.ledgers = self._base + walked
        self._done_checks = min(self._done_checks + 1, self._checks)
        self._current = 0.0
        self._base = self.ledgers

    def finish(self) -> None:
        self.finished = True

    @property
    def share(self) -> float:
        if self.finished:
            return 1.0
        return min((self._done_checks + self._current) / self._checks, 1.0)


@dataclass
class StageTally:
    """The stage an engine is running, as far as it knows."""

    stage: str
    partitions: int
    partitions_done: int = 0
    #: The in-process engine's partitions (None on Spark: only finished tasks are seen).
    parts: list[PartitionProgress] | None = None
    started: float = field(default_factory=time.monotonic)

    def partitions_finished(self) -> int:
        if self.parts is not None:
            return sum(1 for p in self.parts if p.finished)
        return min(self.partitions_done, self.partitions)

    def share(self) -> float:
        if self.parts is not None:
            return sum(p.share for p in self.parts) / max(len(self.parts), 1)
        return self.partitions_finished() / max(self.partitions, 1)

    def ledgers(self) -> int | None:
        if self.parts is None:
            return None
        return sum(p.ledgers for p in self.parts)

    def fields(self, now: float) -> dict[str, Any]:
        """The "scan progress" line's fields."""
        share = self.share()
        elapsed = max(now - self.started, 0.0)
        out: dict[str, Any] = {
            "stage": self.stage,
            "partitions_done": self.partitions_finished(),
            "partitions": self.partitions,
            "percent": round(100 * share, 1),
        }
        ledgers = self.ledgers()
        if ledgers is not None:
            out["ledgers_done"] = ledgers
        if 0 < share < 1:
            out["eta_s"] = round(elapsed * (1 - share) / share, 1)
        return out


def local_stage(stage: str, partitions: int, checks: int = 1) -> StageTally:
    """A stage of the in-process engine, with a `PartitionProgress` per partition."""
    return StageTally(
        stage, partitions, parts=[PartitionProgress(checks) for _ in range(partitions)]
    )


@asynccontextmanager
async def reporting_stages(
    log: Any,
    current: Callable[[], StageTally | None],
    interval: float,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[None]:
    """Logs the engine's current stage every `interval` seconds while the body runs."""

    async def report() -> None:
        while True:
            await asyncio.sleep(interval)
            tally = current()
            if tally is not None:
                log.info(SCAN_PROGRESS_EVENT, **tally.fields(clock()))

    task = asyncio.create_task(report(), name="scan-progress")
    try:
        yield
    finally:
        task.cancel()
        # Waited for without swallowing a cancellation of our own caller.
        await asyncio.wait([task])
