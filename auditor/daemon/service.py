"""The daemon's lifecycle: connect, serve the API and metrics, contend, lead, step down.

One loop owns leadership: campaign; when elected, run `LeaderWork` against a
ZooKeeper view fenced on our vote; stop it the moment leadership is in doubt
(LOST at once; after SUSPENDED, lead on only if the vote is still first once
reconnected), then contend again. The API and metrics only read `state`;
mutating API calls come back here through the `DaemonControl` methods.

Shutdown (SIGTERM/SIGINT): stop leading and delete the vote first (the next
node takes over at once, not after a session timeout), then stop the API with
grace, then close ZooKeeper; bounded by `daemon.shutdown_timeout`. SIGHUP
reloads the configuration; a leader restarts its schedules with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from auditor.analysis.risk import RiskReport
from auditor.checks.context import open_context
from auditor.checks.findings import Check, CheckReport
from auditor.daemon.election import Elector, Leadership, current_auditor, election_path
from auditor.daemon.scan_driver import scan_driver
from auditor.daemon.scheduler import CTIME_KIND, LeaderWork, intervals
from auditor.daemon.state import DaemonState, NotLeaderError, Outcome, SelfTestState
from auditor.index.store import MetadataIndex
from auditor.index.sync import IndexSync
from auditor.logs import get_logger
from auditor.metadata.layout import LedgerManager
from auditor.metadata.underreplication import UnderreplicatedLedger, UnderreplicationManager
from auditor.selftest.harness import SelfTestResult
from auditor.zk import FencedOutError, KazooState, ZkClient, ZkUnavailableError


class Daemon:
    """`bk-auditor run`. `reload` re-reads the configuration (SIGHUP)."""

    def __init__(
        self,
        config: Any,
        *,
        reload: Callable[[], Any] | None = None,
        metrics: Any = None,
    ) -> None:
        self.config = config
        self._reload = reload
        self.log = get_logger("auditor.daemon").bind(identity=config.daemon.identity)
        self.state = DaemonState(identity=config.daemon.identity)
        self.metrics = metrics
        self.zk: ZkClient | None = None
        self.root = config.daemon.ledgers_root
        self.manager: LedgerManager | None = None
        self.api: Any = None
        self.work: LeaderWork | None = None
        self._stop = asyncio.Event()
        self._depose = asyncio.Event()
        self._connected = asyncio.Event()
        self._suspension_timer: asyncio.TimerHandle | None = None
        self._restart_work = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        #: The last detector self-test and canary results, by check label.
        self.selftest: dict[str, SelfTestResult] = {}
        #: Set each time self-test results arrive (tests wait on it; clear before waiting).
        self.selftest_reported = asyncio.Event()
        #: The leader's last risk report, and an event set each time one arrives (tests
        #: clear it before waiting).
        self.risk_report: RiskReport | None = None
        self.risk_reported = asyncio.Event()

    # --- DaemonControl ----------------------------------------------------------------

    def _zk(self) -> ZkClient:
        if self.zk is None:
            raise NotLeaderError("not connected to ZooKeeper yet")
        return self.zk

    async def trigger_check(self, check: Check) -> None:
        if not self.state.is_leader or self.work is None:
            leader = await self.current_leader()
            raise NotLeaderError(f"this node is not the auditor; the auditor is {leader}")
        self.work.triggers[check].set()

    async def current_leader(self) -> str | None:
        return await current_auditor(self._zk(), self.root)

    def _urm(self) -> UnderreplicationManager:
        return UnderreplicationManager(self._zk(), self.root)

    async def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        await self._urm().set_lost_bookie_recovery_delay(seconds)

    async def get_lost_bookie_recovery_delay(self) -> int:
        return await self._urm().get_lost_bookie_recovery_delay()

    async def set_autorecovery(self, enabled: bool) -> None:
        urm = self._urm()
        await (urm.enable_replication() if enabled else urm.disable_replication())
        self.state.replication_enabled = enabled

    async def list_underreplicated(self) -> AsyncIterator[UnderreplicatedLedger]:
        async for ur in self._urm().list_underreplicated():
            yield ur

    async def explain(self, ledger_id: int) -> dict[str, Any]:
        from auditor.analysis.explain_run import explain_on_cluster

        if self.manager is None:
            raise NotLeaderError("the ledger layout has not been read yet")
        return await explain_on_cluster(
            self._zk(), self.root, self.manager, self.config.auditor, ledger_id
        )

    # --- reports and state ------------------------------------------------------------------

    def _on_state(self, check: Check, what: str, next_run: float | None) -> None:
        cs = self.state.checks[check]
        if what == "running":
            cs.outcome = Outcome.RUNNING
            cs.last_started = time.time()
        elif what == "off":
            cs.enabled = False
        cs.next_run = next_run if what == "scheduled" else cs.next_run

    def _on_selftest(self, results: list[SelfTestResult]) -> None:
        now = time.time()
        for r in results:
            self.selftest[r.check] = r
            self.state.selftest[r.check] = SelfTestState(
                r.check, r.ok, r.fixtures, "" if r.ok else r.summary(), now
            )
        if self.metrics is not None:
            self.metrics.record_selftest(results, now)
        self.selftest_reported.set()

    def _on_risk(self, report: RiskReport) -> None:
        self.risk_report = report
        if self.metrics is not None:
            self.metrics.record_risk(report, self.config.risk.top)
        self.risk_reported.set()

    def _on_report(
        self, check: Check, report: CheckReport | None, duration: float, outcome: str
    ) -> None:
        cs = self.state.checks[check]
        cs.last_finished = time.time()
        if report is not None:
            cs.last_report = report
            cs.last_success = cs.last_finished
            cs.last_error = None
            cs.outcome = Outcome.VIOLATIONS if report.has_violations else Outcome.OK
            if check is Check.BOOKIES:
                self.state.lost_bookies = tuple(report.lost_bookies)
            if self.metrics is not None:
                self.metrics.record_report(report, duration)
                if check is Check.BOOKIES:
                    self.metrics.set_lost_bookies(len(report.lost_bookies))
            self.log.info(
                "check run",
                check=str(check),
                outcome=str(cs.outcome),
                seconds=round(duration, 3),
                ledgers_checked=report.ledgers_checked,
                counts=report.counts(),
            )
        elif outcome == "skipped":
            cs.outcome = Outcome.SKIPPED
            if self.metrics is not None:
                self.metrics.record_skip(check)
        else:
            cs.outcome = Outcome.FAILED
            cs.last_error = outcome
            if self.metrics is not None:
                self.metrics.record_failure(check, duration)
        if report is not None:
            self._spawn(self._count_marks())

    async def _count_marks(self) -> None:
        if self.metrics is None or self.zk is None:
            return
        with contextlib.suppress(Exception):
            urm = UnderreplicationManager(self.zk, self.root)
            self.metrics.set_underreplicated(await urm.count_underreplicated())

    def _spawn(self, coro: Any) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.append(t)
        t.add_done_callback(lambda _t: self._tasks.remove(_t) if _t in self._tasks else None)

    # --- connection, heartbeat, signals -------------------------------------------------------

    async def _follow_connection(self, zk: ZkClient) -> None:
        async for st in zk.states():
            if st == KazooState.CONNECTED:
                self.state.zk_connected = True
                self._connected.set()
                self._disarm_suspension_limit()
            elif st == KazooState.SUSPENDED:
                self.state.zk_connected = False
                self._connected.clear()
                self.log.warning("ZooKeeper connection suspended; leader work paused")
                self._arm_suspension_limit()
            elif st == KazooState.LOST:
                self.state.zk_connected = False
                self._connected.clear()
                self._disarm_suspension_limit()
                if self.state.is_leader:
                    self.log.error("ZooKeeper session lost; stepping down at once")
                    self._depose.set()
                else:
                    # A follower's vote went with the session and kazoo's lock votes
                    # again in the new one; a deposal left set now would end the
                    # leadership that vote may win, the moment it begins.
                    self.log.warning("ZooKeeper session lost; voting again")
            self._readiness()

    def _arm_suspension_limit(self) -> None:
        """Disconnected for a whole session timeout, the session may be gone on the
        server and another daemon may lead: stop acting as leader now rather than
        when a call finally fails (running checks are cancelled, nothing is written:
        writes are fenced anyway). A session that survives elects us again at once."""
        self._disarm_suspension_limit()
        if not self.state.is_leader:
            return
        limit = self.config.daemon.zk_session_timeout

        def expired() -> None:
            self._suspension_timer = None
            if self.state.is_leader and not self._connected.is_set():
                self.log.error(
                    "disconnected from ZooKeeper for a whole session timeout; stepping down",
                    seconds=limit,
                )
                self._depose.set()

        self._suspension_timer = asyncio.get_running_loop().call_later(limit, expired)

    def _disarm_suspension_limit(self) -> None:
        if self._suspension_timer is not None:
            self._suspension_timer.cancel()
        self._suspension_timer = None

    def _readiness(self) -> None:
        if self.api is not None:
            self.api.set_serving(live=True, ready=self.state.zk_connected)

    async def _heartbeat(self, notify: Any) -> None:
        while True:
            self.state.heartbeat = time.monotonic()
            if notify is not None:
                notify.watchdog()
            await asyncio.sleep(1.0)

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._on_hup)

    def _on_hup(self) -> None:
        if self._reload is None:
            return
        try:
            self.config = self._reload()
        except Exception as exc:  # a bad edit must not take the daemon down
            self.log.error("configuration reload failed; keeping the old one", error=str(exc))
            return
        self.log.info("configuration reloaded")
        self._restart_work.set()

    # --- leadership ----------------------------------------------------------------------------

    async def _lead(self, elector: Elector, leadership: Leadership) -> None:
        """Runs the leader's work until told to stop, deposed, or fenced out."""
        assert self.manager is not None
        self.state.is_leader = True
        self.state.leader = self.state.identity
        elected_at = time.time()
        for cs in self.state.checks.values():
            cs.waiting_since = elected_at  # staleness before a first run counts from here
        if self.metrics is not None:
            self.metrics.set_leader(True)
        self.log.info("elected auditor", vote=leadership.vote_path)
        index = self._start_index(leadership.zk)
        try:
            while not self._stop.is_set() and not self._depose.is_set():
                self._restart_work.clear()
                async with open_context(
                    leadership.zk, self.root, self.manager, self.config.auditor, mark=True
                ) as ctx:
                    ctx.log = ctx.log.bind(identity=self.state.identity)
                    ctx.index = index[0] if index is not None else None
                    if self.metrics is not None:
                        ctx.bookies.observer = self.metrics.bookie_request
                        ctx.on_retry_queue = self.metrics.set_retry_queue
                    # After a fail-over the stored ctimes say when checks last ran.
                    for check, kind in CTIME_KIND.items():
                        ctime = await ctx.urm.get_check_ctime(kind)
                        if ctime > 0:
                            self.state.checks[check].recorded_success = ctime / 1000
                            if self.metrics is not None:
                                self.metrics.set_last_success(check, ctime / 1000)
                    self.work = LeaderWork(
                        ctx,
                        jitter=self.config.daemon.jitter,
                        on_report=self._on_report,
                        on_state=self._on_state,
                        gate=self._connected,
                        scan=scan_driver(self.config),
                        selftest=self.config.selftest,
                        on_selftest=self._on_selftest,
                        risk=self.config.risk,
                        on_risk=self._on_risk,
                    )
                    for check, iv in intervals(self.config.auditor.bookkeeper).items():
                        self.state.checks[check].interval_s = iv
                        self.state.checks[check].enabled = iv > 0
                        if self.metrics is not None:
                            self.metrics.set_check_interval(check, iv)
                    if self.metrics is not None:
                        self.metrics.set_selftest_interval(self.config.selftest.period)
                    work = asyncio.ensure_future(
                        self.work.run(self.config.auditor.bookkeeper.lostBookieRecoveryDelay)
                    )
                    waits = [
                        asyncio.ensure_future(self._stop.wait()),
                        asyncio.ensure_future(self._depose.wait()),
                        asyncio.ensure_future(self._restart_work.wait()),
                        asyncio.ensure_future(self._watch_vote(elector, leadership)),
                        work,
                    ]
                    try:
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for w in waits:
                            w.cancel()
                        await asyncio.gather(*waits, return_exceptions=True)
                    if work.done() and not work.cancelled() and work.exception() is not None:
                        exc = work.exception()
                        if isinstance(exc, FencedOutError):
                            self.log.error("a fenced write was refused; stepping down")
                        else:
                            self.log.error("leader work failed; stepping down", error=str(exc))
                        return
        finally:
            if index is not None:
                index[1].cancel()
                await asyncio.gather(index[1], return_exceptions=True)
                if self.metrics is not None:
                    self.metrics.set_index_ledgers(0)
            self.work = None
            self.state.is_leader = False
            if self.metrics is not None:
                self.metrics.set_leader(False)
            self.log.info("no longer the auditor")

    def _start_index(self, zk: ZkClient) -> tuple[IndexSync, asyncio.Task[None]] | None:
        """The leader's metadata index, loading in the background (checks wait for it)."""
        if not self.config.daemon.metadata_index:
            return None
        assert self.manager is not None
        sync = IndexSync(
            zk,
            MetadataIndex(self.root, self.manager),
            concurrency=self.config.auditor.checks.ledger_concurrency,
            log=self.log,
        )
        metrics = self.metrics
        if metrics is not None:
            sync.on_loaded = lambda s: metrics.index_loaded(
                len(s.index), s.index.bytes_per_ledger()
            )
            sync.on_resync = lambda _reason: metrics.index_resynced()
        return sync, asyncio.ensure_future(sync.run())

    async def _watch_vote(self, elector: Elector, leadership: Leadership) -> None:
        """After a reconnect (same session), lead on only if our vote is still first."""
        zk = self._zk()
        while True:
            # While disconnected nothing can be read; a session that survives the
            # outage keeps its vote, and a lost one ends leadership elsewhere (LOST).
            await self._connected.wait()
            try:
                stat, changed = await zk.exists_watched(leadership.vote_path)
                leading = stat is not None and await elector.still_leading(leadership)
            except ZkUnavailableError:
                await asyncio.sleep(0.1)  # the state change that explains it is on its way
                continue
            if not leading:
                self.log.error("our vote is gone or no longer first; stepping down")
                self._depose.set()
                return
            await changed.wait()

    async def _contend(self, zk: ZkClient) -> None:
        elector = Elector(zk, self.root, self.state.identity)
        while not self._stop.is_set():
            self._depose.clear()
            await self._connected.wait()
            if self.metrics is not None:
                self.metrics.election_attempt()
            campaign = asyncio.ensure_future(elector.campaign())
            stop = asyncio.ensure_future(self._stop.wait())
            try:
                await asyncio.wait([campaign, stop], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
            if self._stop.is_set():
                campaign.cancel()
                with contextlib.suppress(BaseException):
                    await campaign
                break
            try:
                leadership = campaign.result()
            except Exception as exc:
                self.log.warning("election attempt failed; trying again", error=str(exc))
                await elector.resign()
                await asyncio.sleep(1.0)
                continue
            try:
                await self._lead(elector, leadership)
            finally:
                await elector.resign()
            self.state.leader = None
        await elector.resign()

    async def _follow_leader(self, zk: ZkClient) -> None:
        """Who leads and whether auto-recovery is on, for status and metrics.

        Re-read when the votes or the disable flag change (watches); a slow
        safety re-read covers watches lost with a session.
        """
        urm = UnderreplicationManager(zk, self.root)
        votes_path = election_path(self.root)
        while True:
            waits: list[asyncio.Event] = []
            with contextlib.suppress(Exception):
                await zk.ensure_path(votes_path)
                _, votes_changed = await zk.get_children_watched(votes_path)
                disabled, flag_changed = await zk.exists_watched(f"{urm.base}/disable")
                waits = [votes_changed, flag_changed]
                if not self.state.is_leader:
                    self.state.leader = await current_auditor(zk, self.root)
                self.state.replication_enabled = disabled is None
                if self.metrics is not None:
                    self.metrics.set_leader_elected(self.state.leader is not None)
                    self.metrics.set_replication_enabled(self.state.replication_enabled)
            if not waits:  # ZooKeeper unavailable: try again shortly
                await asyncio.sleep(1.0)
                continue
            pending = [asyncio.ensure_future(e.wait()) for e in waits]
            try:
                await asyncio.wait(pending, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in pending:
                    t.cancel()

    # --- the whole ------------------------------------------------------------------------------

    async def run(
        self, *, api_factory: Any = None, notify: Any = None, signals: bool = True
    ) -> int:
        from auditor.metadata.cluster import read_manager

        d = self.config.daemon
        if signals:
            self._install_signals()
        zk = ZkClient(
            d.zk,
            timeout=self.config.auditor.zk_timeout,
            session_timeout=d.zk_session_timeout,
            security=self.config.zk_security,
        )
        self.zk = zk
        follow = asyncio.ensure_future(self._follow_connection(zk))
        await zk.start()
        self.state.zk_connected = True
        self._connected.set()
        try:
            self.manager = self.config.ledger_manager or await read_manager(zk, self.root)
            if api_factory is not None:
                self.api = await api_factory(self)
                self._readiness()
            if self.metrics is not None and self.config.metrics.enabled:
                await self.metrics.start_http(self.config.metrics.host, self.config.metrics.port)
            side = [
                asyncio.ensure_future(self._heartbeat(notify)),
                asyncio.ensure_future(self._follow_leader(zk)),
            ]
            if notify is not None:
                notify.ready()
            self.log.info("daemon started", zk=d.zk, ledgers_root=self.root, engine=d.engine)
            contend = asyncio.ensure_future(self._contend(zk))
            await self._stop.wait()
            self.log.info("shutting down")
            if notify is not None:
                notify.stopping()
            try:
                await asyncio.wait_for(contend, d.shutdown_timeout)
            except TimeoutError:
                self.log.warning("leader work did not stop in time; cancelling it")
            for t in [*side, *self._tasks]:
                t.cancel()
            await asyncio.gather(*side, *self._tasks, return_exceptions=True)
            if self.api is not None:
                await self.api.stop(grace=min(5.0, d.shutdown_timeout))
            if self.metrics is not None:
                self.metrics.stop_http()
        finally:
            follow.cancel()
            await zk.close()
        self.log.info("daemon stopped")
        return 0

    def stop(self) -> None:
        self._stop.set()
