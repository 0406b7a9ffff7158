"""The deep scrub cannot run as the other checks do, whole runs one at a time on a
schedule: a cycle reads every byte of the cluster over days, and a leader change must
neither start it over nor lose what it found. So the leader runs it as a loop of its own,
beside the checks, a chunk of ledgers at a time, keeping its place in a record only the
leader writes.

The leader's continuous deep scrub (`[scrub] continuous`): chunks from the cursor, paced.

Each turn: the record is read (`checks/scrub_progress_store.py`); the rules
(`checks/scrub_progress.py`) say to rest until the next cycle is due, or to read from the
cursor (a new cycle's record is written first). A chunk is `chunk` ledgers from the
cursor in id order, scrubbed by `ScrubRun` with its BP-34 re-checks and its marks, at the
cycle's pace (recomputed before every chunk, never above `scrub.bytes_per_second` per
bookie; the gates, and so each bookie's bucket and its `checks.bookie_max_in_flight`
reads, outlive the chunk). The record then moves past the chunk, written at the version
read, through the leader's fenced store view: a leader that lost its vote writes nothing,
and its successor reads the chunk again (at most `chunk` ledgers read twice).

The scrub runs beside the other checks, not in their one-at-a-time queue: a cycle of days
cannot wait its turn behind each of them, nor hold them back; its own budget bounds what
it takes from each bookie. Like them it waits while auto-recovery is disabled (it marks)
and while the metadata store is away. A chunk's report is the check's run (`on_report`:
counters per category, `status`); a chunk that fails is reported and tried again after
`RETRY_AFTER`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

from auditor.checks.context import CheckContext
from auditor.checks.findings import Check, CheckReport
from auditor.checks.scrub_progress import (
    Read,
    Rest,
    ScrubProgress,
    advance,
    expected_end,
    finish,
    next_step,
    pace,
    verified_share,
)
from auditor.checks.scrub_progress_store import (
    ZNODE,
    Stored,
    progress_path,
    read_progress,
    write_progress,
)
from auditor.checks.scrub_run import Gates, ScrubRun
from auditor.daemon.contained import shown
from auditor.daemon.state import (
    DaemonState,
    RunCompleted,
    RunFailed,
    RunOutcome,
    RunState,
    ScrubStatus,
)
from auditor.metadata.ledger_tree import IdRange
from auditor.metadata.paths import LONG_MAX
from auditor.store import BadVersionError, FencedOutError, NodeExistsError, StoreUnavailableError

__all__ = ["CHUNK_LEDGERS", "RETRY_AFTER", "ScrubCycle"]

#: Ledgers a chunk scrubs before the record moves on: what a new leader may read again.
CHUNK_LEDGERS = 32
#: Seconds before a failed chunk is tried again.
RETRY_AFTER = 30.0
#: What `status` says the scrub does about an unusable record.
USING_NEW_CYCLE = "unusable: a new cycle starts from ledger 0 and writes over it"


class ScrubCycle:
    """The loop (see the module); `run` until cancelled."""

    def __init__(
        self,
        ctx: CheckContext,
        state: DaemonState,
        *,
        ready: Callable[[], Awaitable[None]],
        on_report: Callable[[Check, RunOutcome], None],
        on_state: Callable[[Check, RunState, float | None], None],
        chunk: int | None = None,
        retry_after: float = RETRY_AFTER,
    ) -> None:
        self.ctx = ctx
        self.state = state
        #: Returns once the scrub may read and mark (auto-recovery enabled, connected).
        self.ready = ready
        self.on_report = on_report
        self.on_state = on_state
        self.chunk = CHUNK_LEDGERS if chunk is None else chunk
        self.retry_after = retry_after
        self.log = ctx.log.bind(check=str(Check.SCRUB))
        cfg = ctx.config
        self.interval = cfg.scrub.interval
        self.ceiling = cfg.scrub.bytes_per_second
        self.gates = Gates(cfg.checks.bookie_max_in_flight, self.ceiling)
        self._path = progress_path(ctx.root)
        # The walk reads metadata ahead by its window (a thousand ledgers by default): a
        # chunk's walk reads no further ahead than the chunk it scrubs.
        checks = dataclasses.replace(
            cfg.checks,
            walk_read_ahead=min(cfg.checks.walk_read_ahead, self.chunk),
            ledger_concurrency=min(cfg.checks.ledger_concurrency, self.chunk),
        )
        self._chunk_config = dataclasses.replace(cfg, checks=checks)

    async def run(self) -> None:
        while True:
            await self.ready()
            stored = await self._read()
            step = next_step(stored.progress, self.ctx.clock(), self.interval)
            if isinstance(step, Rest):
                assert stored.progress is not None
                self._publish(stored.progress, 0)
                self.on_state(Check.SCRUB, RunState.SCHEDULED, step.until)
                self.log.info("scrub cycle done; resting until the next", until=step.until)
                await asyncio.sleep(max(0.0, step.until - self.ctx.clock()))
                continue
            await self._turn(stored, step)

    async def _read(self) -> Stored:
        stored = await read_progress(self.ctx.store, self.ctx.root)
        if stored.invalid is not None:
            if self.state.znode_invalid(ZNODE, shown(stored.data), USING_NEW_CYCLE, time.time()):
                self.log.warning(
                    "scrub progress record is unusable; a new cycle writes over it",
                    path=self._path,
                    value=shown(stored.data),
                    error=stored.invalid,
                )
        elif self.state.znode_valid(ZNODE):
            self.log.info("scrub progress record usable again", path=self._path)
        return stored

    async def _turn(self, stored: Stored, step: Read) -> None:
        progress, version = step.progress, stored.version
        try:
            if step.new:
                version = await write_progress(self.ctx.store, self.ctx.root, progress, version)
                self.log.info("scrub cycle started", cycle=progress.cycle)
                if self.state.znode_valid(ZNODE):  # written over: usable again
                    self.log.info("scrub progress record written over", path=self._path)
            rate = pace(
                progress, self.ctx.clock(), self.interval, self.ceiling, await self._bookies()
            )
            self.gates.set_rate(rate)
            if progress.previous_bytes == 0:  # the first cycle's share goes by ids
                self._max_id = await self.ctx.walker().max_ledger_id()
            self._publish(progress, 0)
            self.on_state(Check.SCRUB, RunState.RUNNING, None)
            started = time.monotonic()
            report, run = await self._chunk(progress)
            cov = report.scrub
            verified = 0 if cov is None else cov.bytes_verified
            judged = report.ledgers_checked
            if run.exhausted:
                after = finish(progress, self.ctx.clock(), run.last_walked, verified, judged)
            elif run.last_walked is not None:
                after = advance(progress, run.last_walked, verified, judged)
            else:  # stopped before its first ledger: nothing moves
                after = progress
            await write_progress(self.ctx.store, self.ctx.root, after, version)
        except (BadVersionError, NodeExistsError) as exc:
            # Another writer moved the record: read it again and go on from there.
            self.log.warning(
                "scrub progress record changed meanwhile; reading it again", error=str(exc)
            )
            return
        except (asyncio.CancelledError, FencedOutError, StoreUnavailableError):
            raise
        except Exception as exc:  # a chunk that fails must not end the leader's work
            error = f"{type(exc).__name__}: {exc}"
            self.log.error("scrub chunk failed", error=error)
            self.on_report(Check.SCRUB, RunFailed(f"failed: {exc}", 0.0))
            await asyncio.sleep(self.retry_after)
            return
        self._publish(after, verified)
        self.on_report(Check.SCRUB, RunCompleted(report, time.monotonic() - started))
        if after.finished is not None:
            self.log.info(
                "scrub cycle finished",
                cycle=after.cycle,
                ledgers=after.ledgers,
                bytes_verified=after.bytes,
                seconds=round(after.finished - after.started, 1),
            )

    async def _chunk(self, progress: ScrubProgress) -> tuple[CheckReport, ScrubRun]:
        """`chunk` ledgers from the cursor, scrubbed; the report and the run (where its
        walk stopped)."""
        ctx = dataclasses.replace(
            self.ctx, id_range=IdRange(progress.cursor, LONG_MAX + 1), config=self._chunk_config
        )
        run = ScrubRun(ctx, limit=self.chunk, gates=self.gates)
        with ctx.reporting_progress(Check.SCRUB):
            report = await run.run()
        return report, run

    async def _bookies(self) -> int:
        return len((await self.ctx.registered()).available)

    def _publish(self, p: ScrubProgress, verified: int) -> None:
        now = self.ctx.clock()
        share = verified_share(p, self._max_id)
        self.state.scrub_progressed(
            ScrubStatus(
                cycle=p.cycle,
                started=p.started,
                interval=self.interval,
                cursor=p.cursor,
                bytes=p.bytes,
                ledgers=p.ledgers,
                previous_bytes=p.previous_bytes,
                share=share,
                expected_end=expected_end(p, now, share),
                finished=p.finished,
                rest_until=None if p.finished is None else p.started + self.interval,
                rate=self.gates.rate,
                updated=now,
            ),
            verified,
        )

    #: The largest ledger id, for the first cycle's share (None: not read).
    _max_id: int | None = None
