"""The leader's term: the leader's work from the vote that won it to the decision that
ends it, and what that work reports.

Why a module of its own: a term is where leadership meets the checks. It opens a check
context on the store view fenced on our vote, reads the stored check ctimes (a new
leader resumes the old one's rhythm), runs `LeaderWork` (`auditor.daemon.scheduler`)
and races it against everything that may end the term: a decision of the leadership
machine (`end`), a new configuration (the work starts over, leadership stays), our vote
lost (`Campaign.watch_vote`), the other driver's election taken. Whatever raises
becomes a decision: nothing here ends the election. The work's reports land in
`DaemonState`; the daemon's listeners are told.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from structlog.typing import FilteringBoundLogger

from auditor.analysis.risk import RiskReport
from auditor.checks.context import CheckContext, open_context
from auditor.checks.findings import Check, CheckReport
from auditor.checks.pulsar_audit import PulsarAudit
from auditor.daemon.campaign import Campaign
from auditor.daemon.config import DaemonConfig
from auditor.daemon.contained import ContainedReads
from auditor.daemon.election import Leadership
from auditor.daemon.leadership import (
    Action,
    Decision,
    Elected,
    Event,
    FencedOut,
    VoteLost,
    WorkEnded,
    WorkFailed,
)
from auditor.daemon.scan_driver import scan_driver
from auditor.daemon.scheduler import CTIME_KIND, LeaderWork, intervals
from auditor.daemon.standby import IndexSupervisor, TermIndex
from auditor.daemon.state import DaemonState, Happening, RunCompleted, RunOutcome, RunState
from auditor.metadata.layout import LedgerManager
from auditor.metadata.service_uri import MetadataDriver
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.schedule.bookie_sightings import BookieSightings
from auditor.selftest.harness import SelfTestResult
from auditor.store import FencedOutError, MetadataStore


class LeaderTerms:
    """A daemon's leader terms, one at a time (`run`, handed to `Campaign.run`).

    `config` gives the configuration in force; `restart` is set when a new one asks
    the work to start over; `decide` is the leadership machine's, `tell` the daemon's
    listeners', `spawn` runs a side task the daemon cancels at shutdown.
    """

    def __init__(
        self,
        store: MetadataStore,
        *,
        root: str,
        driver: MetadataDriver,
        manager: LedgerManager,
        config: Callable[[], DaemonConfig],
        state: DaemonState,
        sightings: BookieSightings,
        campaign: Campaign,
        indexes: IndexSupervisor | None,
        decide: Callable[[Event], Decision],
        tell: Callable[[Happening], None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        connected: asyncio.Event,
        restart: asyncio.Event,
        log: FilteringBoundLogger,
    ) -> None:
        self.store = store
        self.root = root
        self.driver = driver
        self.manager = manager
        self._config = config
        self.state = state
        self.sightings = sightings
        self.campaign = campaign
        self.indexes = indexes
        self._decide = decide
        self._tell = tell
        self._spawn = spawn
        self._connected = connected
        self._restart = restart
        self.log = log
        #: The leader's work while this daemon leads.
        self.work: LeaderWork | None = None
        #: The last detector self-test and canary results, by check label.
        self.selftest: dict[str, SelfTestResult] = {}
        #: The leader's last risk report.
        self.risk_report: RiskReport | None = None
        #: Resolved with the decision that ends the current term.
        self._end: asyncio.Future[Decision] | None = None

    def end(self, d: Decision) -> None:
        """`d` ends the current term, if there is one and nothing ended it yet."""
        if self._end is not None and not self._end.done():
            self._end.set_result(d)

    async def run(self, leadership: Leadership) -> Decision:
        """One leader term, from the vote that won it; returns the decision that ended it."""
        self._end = asyncio.get_running_loop().create_future()
        try:
            elected = self._decide(Elected(leadership.vote_path))
            return await self._lead(leadership) if elected.action is Action.LEAD else elected
        finally:
            self._end = None

    async def _lead(self, leadership: Leadership) -> Decision:
        """Runs the leader's work until a decision ends the term; returns that decision."""
        self.state.lead(time.time())
        # The standby index when there is one; else (as without standby) one for this term.
        index = self.indexes.start_term(leadership.store) if self.indexes is not None else None
        try:
            while True:
                self._restart.clear()
                end = await self._lead_once(leadership, index)
                if end is not None:
                    return end
        finally:
            if self.indexes is not None:
                await self.indexes.end_term(index)
            self.work = None
            self.state.stepped_down()
            self.log.info("no longer the auditor")

    async def _lead_once(self, leadership: Leadership, index: TermIndex | None) -> Decision | None:
        """One run of the leader's work; the decision that ends the term, or None for a
        restart with a new configuration. Whatever raises here, the stored ctimes read
        at the start included, becomes a decision: nothing ends the election task."""
        assert self._end is not None
        term_end, campaign, config = self._end, self.campaign, self._config()
        reading = contextlib.ExitStack()  # the index the checks read, for this run
        try:
            async with open_context(
                leadership.store,
                self.root,
                self.manager,
                config.auditor,
                # BookKeeper's etcd driver has no under-replication manager: report only.
                mark=self.driver.marks,
            ) as ctx:
                ctx.log = ctx.log.bind(identity=self.state.identity)
                if self.indexes is not None:
                    reading.enter_context(self.indexes.reading(ctx, leadership.store, index))
                ctx.bookies.observer = self.state.tallies.bookie_request
                ctx.on_retry_queue = self._set_retry_queue
                ctx.on_progress = partial(self._on_progress, ctx)
                bk = config.auditor.bookkeeper
                reads = ContainedReads(
                    self.state,
                    ctx.urm,
                    self.log,
                    configured_delay=bk.lostBookieRecoveryDelay,
                    on_read=partial(self._tell, Happening.ZNODE_READ),
                )
                # After a fail-over the stored ctimes say when checks last ran.
                for check, kind in CTIME_KIND.items():
                    ctime = await reads.check_ctime(kind)
                    if ctime > 0:
                        self.state.check_recorded(check, ctime / 1000)
                self.work = LeaderWork(
                    ctx,
                    reads=reads,
                    sightings=self.sightings,
                    jitter=config.daemon.jitter,
                    on_report=self._on_report,
                    on_state=self._on_state,
                    gate=self._connected,
                    scan=scan_driver(config),
                    selftest=config.selftest,
                    on_selftest=self._on_selftest,
                    risk=config.risk,
                    on_risk=self._on_risk,
                    pulsar=config.pulsar,
                    on_pulsar=self._on_pulsar,
                    last_reports=self._last_reports,
                    scrub_state=self.state,
                )
                for check, iv in intervals(bk).items():
                    self.state.check_interval(check, iv)
                self.state.tallies.selftest_interval = config.selftest.period
                self.state.pulsar_scheduled(config.pulsar.interval)
                self.state.scrub_scheduled(config.auditor.scrub.continuous)
                work = asyncio.ensure_future(self.work.run(bk.lostBookieRecoveryDelay))
                restart = asyncio.ensure_future(self._restart.wait())
                vote = asyncio.ensure_future(campaign.watch_vote(leadership))
                other = asyncio.ensure_future(campaign.other_leader_appears())
                mine: list[asyncio.Future[Any]] = [work, restart, vote, other]
                try:
                    await asyncio.wait([term_end, *mine], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in mine:
                        w.cancel()
                    await asyncio.gather(*mine, return_exceptions=True)
        except asyncio.CancelledError:
            raise
        except FencedOutError as exc:
            return self._ended(self._decide(FencedOut(str(exc))), term_end)
        except Exception as exc:
            return self._ended(self._decide(WorkFailed(f"{type(exc).__name__}: {exc}")), term_end)
        finally:
            reading.close()
        if term_end.done():
            return term_end.result()
        if other.done() and not other.cancelled() and other.exception() is None:
            return self._ended(campaign.defer_to(other.result()), term_end)
        if vote.done() and not vote.cancelled():
            error = vote.exception()
            event: Event = VoteLost() if error is None else WorkFailed(f"vote watch: {error}")
            return self._ended(self._decide(event), term_end)
        if work.done() and not work.cancelled():
            error = work.exception()
            if error is None:
                return self._ended(self._decide(WorkEnded()), term_end)
            if isinstance(error, FencedOutError):
                return self._ended(self._decide(FencedOut(str(error))), term_end)
            failed = WorkFailed(f"{type(error).__name__}: {error}")
            return self._ended(self._decide(failed), term_end)
        return None  # a new configuration: the work starts over, leadership stays

    @staticmethod
    def _ended(d: Decision, term_end: asyncio.Future[Decision]) -> Decision:
        """`d`, or the decision that ended the term first (a later event only carries on)."""
        return term_end.result() if term_end.done() else d

    # --- what the work reports ---------------------------------------------------------

    def _on_state(self, check: Check, what: RunState, next_run: float | None) -> None:
        self.state.check_run_state(check, what, next_run)

    def _on_selftest(self, results: list[SelfTestResult]) -> None:
        for r in results:
            self.selftest[r.check] = r
        self.state.selftest_done(results, time.time())
        self._tell(Happening.SELFTEST_REPORTED)

    def _on_risk(self, report: RiskReport) -> None:
        self.risk_report = report
        self.state.tallies.record_risk(report, self._config().risk.top)
        self._tell(Happening.RISK_REPORTED)

    def _on_pulsar(self, audit: PulsarAudit) -> None:
        self.state.pulsar_done(audit, self._config().pulsar.top)

    def _last_reports(self) -> list[CheckReport]:
        """The last replicas and placement reports, whose verdicts the Pulsar audit joins
        (under-replicated and unplaced counts; `missing` entries with no copy)."""
        return [
            cs.last_report
            for c in (Check.REPLICAS, Check.PLACEMENT)
            if (cs := self.state.checks.get(c)) is not None and cs.last_report is not None
        ]

    def _on_report(self, check: Check, outcome: RunOutcome) -> None:
        self.state.check_ended(check, outcome, time.time())
        self._tell(Happening.CHECK_ENDED)
        if isinstance(outcome, RunCompleted):
            report = outcome.report
            self.log.info(
                "check run",
                check=str(check),
                outcome=str(self.state.checks[check].outcome),
                seconds=round(outcome.duration, 3),
                ledgers_checked=report.ledgers_checked,
                counts=report.counts(),
            )
            self._spawn(self._count_marks())

    def _on_progress(
        self, ctx: CheckContext, check: Check, done: int, estimate: int | None
    ) -> None:
        """The total is the index's size while the walk reads the index (at least what the
        walk saw: ledgers created meanwhile), else the driver's estimate."""
        sync = ctx.index
        if sync is not None and sync.ready.is_set():
            total = max(len(sync.index), done)
            self.state.check_progress(check, done, total, "ledgers", time.time())
        else:
            self.state.check_progress(check, done, estimate, "max_ledger_id", time.time())

    def _set_retry_queue(self, n: int) -> None:
        self.state.retry_queue = n

    async def _count_marks(self) -> None:
        with contextlib.suppress(Exception):
            urm = UnderreplicationManager(self.store, self.root)
            self.state.tallies.underreplicated = await urm.count_underreplicated()
