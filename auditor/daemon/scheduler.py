"""The leader's work: every check on its schedule, and the lost-bookie audit.

One task per periodic check (initial delay from the ctime stored in
ZooKeeper, so a new leader resumes the old leader's rhythm; jitter; the ctime
written after a success), a task following the bookie set and one following
the `lostBookieRecoveryDelay` znode, both feeding the pure state machine of
`auditor.schedule.lost_bookie_delay`. Checks run one at a time (as upstream's
single auditor thread does, so they never stack load on the bookies), wait
while auto-recovery is disabled, and are skipped while a delayed lost-bookie
audit is pending. A failing check is logged and tried again at its next slot;
nothing here lets an exception end the leader's loop except cancellation.

With a `ScanDriver` (`daemon.engine = "spark"`) the placement and replicas
checks run as a Spark scan job; everything around a run (gating, ctime,
reports) is the same for both engines.

The Pulsar audit (`[pulsar] interval`, off by default: it reads Pulsar's whole
tree) runs as one more check, in process, after a new leader's first round and
then every interval; it joins the last replicas and placement reports (`last_reports`:
no bookie is asked again), the marks and each ledger's risk, as `pulsar-audit` does, and
hands its rollups to `on_pulsar` before its report is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from auditor.analysis.risk import RiskReport
from auditor.analysis.risk_run import run_risk
from auditor.checks.context import CheckContext
from auditor.checks.findings import Check, CheckReport
from auditor.checks.pulsar_audit import PulsarAudit
from auditor.checks.runner import driver
from auditor.config import BookKeeperConfig
from auditor.daemon.config import PulsarSection, RiskSection, SelfTestSection
from auditor.daemon.contained import ContainedReads, parse_delay
from auditor.daemon.outage import wait_out_outage
from auditor.daemon.scan_driver import IN_PROCESS, ScanDriver
from auditor.daemon.scrub_cycle import ScrubCycle
from auditor.daemon.state import (
    DaemonState,
    RunCompleted,
    RunFailed,
    RunOutcome,
    RunSkipped,
    RunState,
)
from auditor.metadata.records import CheckKind
from auditor.metadata.registry import all_known_bookies, read_bookies, watch_bookies
from auditor.schedule.bookie_sightings import BookieSightings
from auditor.schedule.lost_bookie_delay import (
    CancelPendingAudit,
    Decision,
    LostBookieDelay,
    RunAuditNow,
    ScheduleAudit,
)
from auditor.selftest.canary import CANARY_PLACEMENT, CANARY_REPLICAS, run_canary
from auditor.selftest.cases import run_selftest
from auditor.selftest.harness import SelfTestResult
from auditor.store import FencedOutError, NoNodeError, StoreUnavailableError

#: Checks whose last run time BookKeeper keeps in ZooKeeper.
CTIME_KIND: dict[Check, CheckKind] = {
    Check.LEDGERS: CheckKind.CHECK_ALL_LEDGERS,
    Check.PLACEMENT: CheckKind.PLACEMENT_POLICY_CHECK,
    Check.REPLICAS: CheckKind.REPLICAS_CHECK,
}


#: The order the leader's first runs take (one at a time): the start audit of
#: lost bookies first, the ledger check (reads, the heaviest) last, so that the
#: replicas check sees bookies as they are before the ledger check marks them.
START_ORDER = (Check.BOOKIES, Check.PLACEMENT, Check.REPLICAS, Check.GRACE, Check.LEDGERS)


def initial_delay(ctime_ms: int, interval_s: float, now_ms: int) -> float:
    """BookKeeper's rule: run now if never run or overdue, else when the interval ends."""
    if ctime_ms < 0:
        return 0.0
    elapsed = max(0, (now_ms - ctime_ms) // 1000)
    return 0.0 if elapsed > interval_s else float(interval_s - elapsed)


def jittered(delay: float, interval: float, jitter: float, rng: random.Random) -> float:
    """Spreads runs of many clusters' auditors: up to `jitter` of the interval later."""
    if jitter <= 0 or interval <= 0:
        return delay
    return delay + rng.uniform(0, jitter * interval)


def intervals(bk: BookKeeperConfig) -> dict[Check, float]:
    """Seconds between runs per check (0 = off), from BookKeeper's keys.

    The grace check runs with the placement check's interval, as upstream
    runs it inside that check.
    """
    return {
        Check.BOOKIES: float(bk.auditorPeriodicBookieCheckInterval),
        Check.LEDGERS: float(bk.auditorPeriodicCheckInterval),
        Check.PLACEMENT: float(bk.auditorPeriodicPlacementPolicyCheckInterval),
        Check.REPLICAS: float(bk.auditorReplicasCheckInterval),
        Check.GRACE: float(bk.auditorPeriodicPlacementPolicyCheckInterval),
    }


class LeaderWork:
    """Everything the leader does, for as long as it leads (cancel to stop)."""

    def __init__(
        self,
        ctx: CheckContext,
        *,
        reads: ContainedReads,
        jitter: float,
        sightings: BookieSightings | None = None,
        on_report: Callable[[Check, RunOutcome], None],
        on_state: Callable[[Check, RunState, float | None], None],
        gate: asyncio.Event | None = None,
        rng: random.Random | None = None,
        scan: ScanDriver | None = None,
        selftest: SelfTestSection | None = None,
        on_selftest: Callable[[list[SelfTestResult]], None] | None = None,
        risk: RiskSection | None = None,
        on_risk: Callable[[RiskReport], None] | None = None,
        pulsar: PulsarSection | None = None,
        on_pulsar: Callable[[PulsarAudit], None] | None = None,
        last_reports: Callable[[], Sequence[CheckReport]] | None = None,
        scrub_state: DaemonState | None = None,
    ) -> None:
        self.ctx = ctx
        #: The ctime and delay znodes, read so that a bad value never ends the work.
        self.reads = reads
        #: Since when each bookie is missing, as this process saw it (the restart rule).
        self.sightings = sightings
        self.jitter = jitter
        self.rng = rng or random.Random()
        self.on_report = on_report
        self.on_state = on_state
        #: Set while ZooKeeper is connected; a SUSPENDED session pauses new checks.
        self.gate = gate
        #: Runs the checks it `runs` as a Spark job; None: every check in process.
        self.scan = scan
        #: `[selftest]` (a `SelfTestSection`); None: no self-test (tests of other parts).
        self.selftest = selftest
        self.on_selftest = on_selftest
        #: `[risk]` (a `RiskSection`); None or interval 0: no periodic risk report.
        self.risk = risk
        self.on_risk = on_risk
        #: `[pulsar]`; None or interval 0: no periodic Pulsar audit.
        self.pulsar = pulsar
        self.on_pulsar = on_pulsar
        #: The other checks' last reports, whose verdicts the Pulsar audit joins.
        self.last_reports = last_reports
        #: Where the continuous deep scrub reports its progress; None: no scrub (it also
        #: needs `[scrub] continuous`).
        self.scrub_state = scrub_state
        self.log = ctx.log.bind(role="leader")
        self.delay = LostBookieDelay()
        # The restart rule: while a bookie's lost-bookie delay runs, the checks leave it alone.
        ctx.held_bookies = lambda: self.delay.held_bookies
        ctx.defer_gone_bookies = True
        self.one_at_a_time = asyncio.Lock()
        self.triggers: dict[Check, asyncio.Event] = {c: asyncio.Event() for c in Check}
        self._timer: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    # --- running one check ------------------------------------------------------

    async def _wait_enabled(self) -> None:
        """Returns once auto-recovery is enabled.

        A read that fails while the metadata store is away is asked again once connected:
        the run waiting here is still due, and giving up would drop it (its
        trigger consumed, nothing reported) until the check's next turn.
        """
        urm = self.ctx.urm
        while True:
            try:
                stat, changed = await self.ctx.store.exists_watched(f"{urm.base}/disable")
            except StoreUnavailableError as exc:
                self.log.warning(
                    "cannot read whether auto-recovery is enabled; asking again when connected",
                    error=str(exc),
                )
                await self._reconnected()
                continue
            if stat is None:
                return
            self.log.info("auto-recovery is disabled; checks wait until it is enabled")
            await changed.wait()

    def engine(self, check: Check) -> str:
        """Where `check` runs: "spark" or "asyncio" (in process)."""
        return self.scan.name if self.scan is not None and self.scan.runs(check) else IN_PROCESS

    async def _run(self, check: Check) -> CheckReport:
        if check is Check.PULSAR:
            return await self._run_pulsar()
        if self.scan is not None and self.scan.runs(check):
            return await self.scan.run(self.ctx, check)
        # A scan's partitions walk at once: only a run in one walk reports its progress.
        with self.ctx.reporting_progress(check):
            return await driver(check)(self.ctx)

    async def _run_pulsar(self) -> CheckReport:
        from auditor.analysis.pulsar_run import ledger_domains
        from auditor.checks.pulsar_audit_run import run_pulsar_audit, verdicts_of

        reports = self.last_reports() if self.last_reports is not None else ()
        marks = await self.ctx.urm.marked_ids()
        verdicts = verdicts_of(reports, marks)
        risk_of = await ledger_domains(self.ctx)
        # Its walk reads ZooKeeper, not the index (which keeps no custom metadata).
        with self.ctx.reporting_progress(Check.PULSAR):
            report, audit = await run_pulsar_audit(self.ctx, verdicts=verdicts, risk_of=risk_of)
        if self.on_pulsar is not None:
            self.on_pulsar(audit)
        return report

    async def run_check(self, check: Check, *, periodic: bool) -> None:
        if periodic and check is not Check.BOOKIES and self.delay.should_skip_periodic_check():
            self.log.info("check skipped: a delayed lost-bookie audit is pending", check=str(check))
            self.on_report(check, RunSkipped("a delayed lost-bookie audit is pending"))
            return
        # The check's task is under way: what follows may wait (auto-recovery
        # disabled, ZooKeeper suspended, the index loading), and "check started"
        # says when it actually begins.
        self.log.info("check due", check=str(check), periodic=periodic)
        await self._wait_enabled()
        if self.gate is not None:
            await self.gate.wait()
        if self.ctx.index is not None:
            # The first run after election is the index's load; a check that
            # started walking ZooKeeper meanwhile would read everything twice.
            await self.ctx.index.usable()
        async with self.one_at_a_time:
            # Again, now that it is this check's turn: the connection may have gone
            # while it queued behind another, and a suspended leader starts nothing.
            if self.gate is not None:
                await self.gate.wait()
            self.on_state(check, RunState.RUNNING, None)
            index = self.ctx.index
            engine = self.engine(check)
            # Where the check's walk reads ledger metadata from (Spark tasks read ZooKeeper).
            indexed = engine == "asyncio" and index is not None and index.ready.is_set()
            self.log.info(
                "check started",
                check=str(check),
                engine=engine,
                metadata="index" if indexed else "zookeeper",
            )
            started = time.monotonic()
            try:
                report = await self._run(check)
            except asyncio.CancelledError:
                raise
            except FencedOutError:
                raise  # leadership lost: the daemon steps down
            except Exception as exc:
                self.log.error(
                    "check failed", check=str(check), error=f"{type(exc).__name__}: {exc}"
                )
                self.on_report(check, RunFailed(f"failed: {exc}", time.monotonic() - started))
                return
            duration = time.monotonic() - started
            await self._store_ctime(check)
            self.on_report(check, RunCompleted(report, duration))

    async def _store_ctime(self, check: Check) -> None:
        """Records when `check` ran, where BookKeeper keeps it (a new leader's first delay).

        The run's findings are complete by now: ZooKeeper gone at this point
        (a restart longer than a call's timeout, say) must not lose them, nor
        leave the check "running" with no report until its next turn. The time
        stays unstored; a successor then only runs the check sooner.
        """
        kind = CTIME_KIND.get(check)
        if kind is None:
            return
        try:
            await self.ctx.urm.set_check_ctime(kind, int(self.ctx.clock() * 1000))
        except FencedOutError:
            raise
        except StoreUnavailableError as exc:
            self.log.warning("check time not stored", check=str(check), error=str(exc))
            return
        self.reads.ctime_stored(kind)

    # --- periodic checks -----------------------------------------------------------

    async def first_delay(self, check: Check, interval: float) -> float:
        """When a check first runs under this leader (BookKeeper's ctime rule)."""
        kind = CTIME_KIND.get(check)
        if check is Check.BOOKIES:
            return interval  # the start audit just ran (see lost_bookie_delay)
        if kind is None:
            return 0.0
        ctime = await self.reads.check_ctime(kind)
        return initial_delay(ctime, interval, int(self.ctx.clock() * 1000))

    async def periodic(self, check: Check, interval: float, delay: float) -> None:
        while True:
            self.on_state(check, RunState.SCHEDULED, self.ctx.clock() + delay)
            trigger = self.triggers[check]
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):  # not wait_for: see MetadataStore._call
                    await trigger.wait()
            manual = trigger.is_set()
            trigger.clear()
            await self._outlasting(check, self.run_check(check, periodic=not manual))
            delay = jittered(interval, interval, self.jitter, self.rng)

    async def triggered_only(self, check: Check) -> None:
        """A check that is off still runs when asked for (API, CLI)."""
        while True:
            await self.triggers[check].wait()
            self.triggers[check].clear()
            await self._outlasting(check, self.run_check(check, periodic=False))

    async def _outlasting(self, what: object, step: Awaitable[None]) -> bool:
        """One step of a leader loop that a ZooKeeper outage must not end.

        A call that fails while disconnected (recording a check's time, say) is
        not a reason to give up leadership: a session that survives the outage
        still leads, and one that does not ends leadership through LOST. A fenced
        write refused is different: that leader no longer leads. Returns whether
        the step completed (False: it was cut short, and the connection is back).
        """
        try:
            await step
        except FencedOutError:
            raise
        except StoreUnavailableError as exc:
            self.log.warning(
                f"{self.ctx.store.kind.label} call failed; resuming when connected",
                task=str(what),
                error=str(exc),
            )
            await self._reconnected()
            return False
        return True

    async def _reconnected(self) -> None:
        """After a call found the store unavailable: once the session is connected again
        (`daemon/outage.py`'s rule, on the gate); without a gate (no session followed),
        after a second."""
        if self.gate is not None:
            await wait_out_outage(self.gate)
        else:
            await asyncio.sleep(1.0)

    async def _every(self, what: str, step: Callable[[], Awaitable[None]], interval: float) -> None:
        """`step` now, then again every (jittered) `interval`; an outage does not skip a turn."""
        while True:
            if not await self._outlasting(what, step()):
                continue  # cut short by ZooKeeper: still due, now that it is back
            await asyncio.sleep(jittered(interval, interval, self.jitter, self.rng))

    # --- the detector self-test ---------------------------------------------------------

    async def selftest_loop(self, period: float) -> None:
        """The self-test now (a new leader proves its detectors first), then every `period`."""
        await self._every("selftest", self.run_selftest, period)

    async def run_selftest(self) -> None:
        """The pure self-test, then (when configured) the canary, each reported as it ends.

        The canary does not queue behind the checks (`one_at_a_time`): it asks
        the bookies a few requests, and a detector that stopped working must
        not wait hours behind a long replicas run to be noticed.
        """
        self._selftest_done(run_selftest(), "selftest")
        if self.selftest is None or not self.selftest.canary:
            return
        if self.gate is not None:
            await self.gate.wait()
        try:
            results = await run_canary(self.ctx, self.selftest.canary_root)
        except (FencedOutError, StoreUnavailableError):
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            checks = (CANARY_REPLICAS, CANARY_PLACEMENT)
            results = [SelfTestResult(c, 0, error=error) for c in checks]
        self._selftest_done(results, "canary")

    def _selftest_done(self, results: list[SelfTestResult], what: str) -> None:
        for r in results:
            if r.ok:
                self.log.info(f"{what} passed", check=r.check, fixtures=r.fixtures)
            else:
                self.log.error(
                    f"{what} failed: a detector does not find what it must",
                    check=r.check,
                    failed=r.summary(),
                    failures=[f.to_json() for f in r.failures],
                    error=r.error,
                )
        if self.on_selftest is not None:
            self.on_selftest(results)

    # --- the risk report -----------------------------------------------------------------

    async def risk_loop(self, interval: float) -> None:
        """The risk report when leadership starts, then every `[risk] interval`."""
        await self._every("risk", self.run_risk, interval)

    async def run_risk(self) -> None:
        """One risk report, handed to `on_risk`; a failure is logged and waits for the next.

        It reads the metadata index, not the bookies, so it does not queue
        behind the checks; without an index it walks ZooKeeper, and then takes
        its turn among them (`one_at_a_time`) like any other walk.
        """
        if self.gate is not None:
            await self.gate.wait()
        index = self.ctx.index
        indexed = index is not None and await index.usable()
        try:
            if indexed:
                report = await run_risk(self.ctx)
            else:
                async with self.one_at_a_time:
                    report = await run_risk(self.ctx)
        except (FencedOutError, StoreUnavailableError):
            raise
        except Exception as exc:
            self.log.error("risk report failed", error=f"{type(exc).__name__}: {exc}")
            return
        if self.on_risk is not None:
            self.on_risk(report)

    # --- the continuous deep scrub ---------------------------------------------------------

    async def scrub_ready(self) -> None:
        """The scrub's gate before each turn: auto-recovery enabled (it marks), the store
        connected, the index loaded (its walks would otherwise read ZooKeeper twice)."""
        await self._wait_enabled()
        if self.gate is not None:
            await self.gate.wait()
        if self.ctx.index is not None:
            await self.ctx.index.usable()

    async def scrub_loop(self, state: DaemonState) -> None:
        """`daemon/scrub_cycle.py`'s loop for as long as this leader leads; an outage of
        the metadata store pauses it (the record says where to go on)."""
        cycle = ScrubCycle(
            self.ctx,
            state,
            ready=self.scrub_ready,
            on_report=self.on_report,
            on_state=self.on_state,
        )
        while True:
            await self._outlasting(Check.SCRUB, cycle.run())

    # --- the lost-bookie audit ---------------------------------------------------------

    async def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, RunAuditNow):
                self.log.info(
                    "lost-bookie audit now", reason=str(d.reason), bookies=sorted(d.bookies)
                )
                await self.run_check(Check.BOOKIES, periodic=False)
            elif isinstance(d, ScheduleAudit):
                self._cancel_timer()
                self._timer = asyncio.ensure_future(self._fire(d))
                self.log.info(
                    "lost-bookie audit delayed",
                    in_s=round(d.at - time.monotonic(), 1),
                    held=sorted(self.delay.held_bookies),
                )
            elif isinstance(d, CancelPendingAudit):
                self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self._timer is not None and not self._timer.done():
            self._timer.cancel()
        self._timer = None

    async def _fire(self, d: ScheduleAudit) -> None:
        await asyncio.sleep(max(0.0, d.at - time.monotonic()))
        await self._apply(self.delay.on_timer(time.monotonic(), d.token))

    async def _delay_value(self) -> int:
        """The delay in force: the znode's, or the configured one when it holds a bad value."""
        return await self.reads.delay()

    async def follow_bookies(self) -> None:
        first = True  # leader_started already saw the first set
        while True:
            stream = watch_bookies(self.ctx.store, self.ctx.root)
            try:
                async for bookies in stream:
                    if first:
                        first = False
                        continue
                    await self._wait_enabled()
                    decisions = self.delay.on_bookies_changed(
                        bookies.available, await self._delay_value(), time.monotonic()
                    )
                    await self._apply(decisions)
                return
            except FencedOutError:
                raise
            except StoreUnavailableError as exc:
                # After the outage the first set is news: bookies may have gone meanwhile.
                self.log.warning(
                    "bookie watch interrupted; resuming when connected", error=str(exc)
                )
                await self._reconnected()
            finally:
                await stream.aclose()

    async def _delay_watched(self) -> tuple[bytes | None, asyncio.Event]:
        """The delay znode's bytes (None while it does not exist) and an event for its next
        change."""
        path = self.reads.delay_path
        while True:
            try:
                data, _, changed = await self.ctx.store.get_watched(path)
                return data, changed
            except NoNodeError:
                stat, changed = await self.ctx.store.exists_watched(path)
                if stat is None:
                    return None, changed

    async def follow_delay(self) -> None:
        """Each write of the delay znode: a new delay, or (the same value) a trigger.

        A bad value is no trigger: the configured delay replaces it (see
        `ContainedReads`), and the lost-bookie rules hear of it only when that
        changes the delay in force.
        """
        changed: asyncio.Event | None = None
        while True:
            try:
                if changed is None:
                    _, changed = await self._delay_watched()
                await changed.wait()
                data, changed = await self._delay_watched()
                await self._wait_enabled()
            except FencedOutError:
                raise
            except StoreUnavailableError as exc:
                self.log.warning("delay watch interrupted; resuming when connected", error=str(exc))
                changed = None
                await self._reconnected()
                continue
            if data is None:
                continue  # deleted: the next creation is the change
            delay = self.reads.delay_of(data)
            if parse_delay(data) is None and delay == self.delay.delay_before_change:
                continue
            await self._outlasting(
                "lostBookieRecoveryDelay",
                self._apply(self.delay.on_delay_changed(delay, time.monotonic())),
            )

    # --- the whole ---------------------------------------------------------------------

    async def run(self, lost_bookie_recovery_delay: int) -> None:
        urm = self.ctx.urm
        await urm.check_layout()
        await urm.init_lost_bookie_recovery_delay(lost_bookie_recovery_delay)
        cookies = await all_known_bookies(self.ctx.store, self.ctx.root)
        available = (await read_bookies(self.ctx.store, self.ctx.root)).available
        missing = self.sightings.missing_since() if self.sightings is not None else {}
        start = self.delay.leader_started(
            cookies, available, await self._delay_value(), time.monotonic(), missing
        )
        every = intervals(self.ctx.config.bookkeeper)
        try:
            self._tasks.append(asyncio.ensure_future(self.follow_bookies()))
            self._tasks.append(asyncio.ensure_future(self.follow_delay()))
            if self.selftest is not None and self.selftest.period > 0:
                self._tasks.append(asyncio.ensure_future(self.selftest_loop(self.selftest.period)))
            if self.risk is not None and self.risk.interval > 0:
                self._tasks.append(asyncio.ensure_future(self.risk_loop(float(self.risk.interval))))
            if self.scrub_state is not None and self.ctx.config.scrub.continuous:
                # Beside the checks, not queued with them (see `daemon/scrub_cycle.py`).
                self._tasks.append(asyncio.ensure_future(self.scrub_loop(self.scrub_state)))
            await self._apply(start)
            # Checks due now run one after another in START_ORDER, so a new
            # leader's first round is predictable; then each keeps its rhythm.
            delays = {c: await self.first_delay(c, every[c]) for c in START_ORDER if every[c] > 0}
            for check in START_ORDER:
                if check in delays and delays[check] == 0:
                    await self.run_check(check, periodic=True)
                    delays[check] = every[check]
            for check in START_ORDER:
                if check in delays:
                    delay = jittered(delays[check], every[check], self.jitter, self.rng)
                    self._tasks.append(
                        asyncio.ensure_future(self.periodic(check, every[check], delay))
                    )
                else:
                    self._tasks.append(asyncio.ensure_future(self.triggered_only(check)))
                    self.on_state(check, RunState.OFF, None)
            if self.pulsar is not None and self.pulsar.interval > 0:
                # Queued behind the first round (one check at a time), then periodic.
                self._tasks.append(
                    asyncio.ensure_future(
                        self.periodic(Check.PULSAR, float(self.pulsar.interval), 0.0)
                    )
                )
            # Any task ending ends the leader's work (only cancellation and lost
            # leadership do so); the daemon then steps down and contends again.
            done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            self._cancel_timer()
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks.clear()
