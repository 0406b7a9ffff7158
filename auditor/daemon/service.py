"""The daemon's lifecycle: connect, serve the API and metrics, contend, lead, step down.

Leadership is decided by `LeadershipMachine` (`auditor.daemon.leadership`): every
event that may start, pause or end it (a session state change, our vote gone, a
fenced write refused, the leader's work failing, SIGTERM, a vote of another session
with our identity, ...) becomes a `Decision` with a reason, which this module logs,
records in `state` (the last decisions for `status`, a count per reason for the
metrics) and carries out. This module is the asyncio side only: tasks, timers,
ZooKeeper. The API and metrics only read `state`; mutating API calls come back here
through the `DaemonControl` methods.

A leader runs `LeaderWork` against a ZooKeeper view fenced on its vote and stops it
the moment leadership is in doubt (LOST at once; after SUSPENDED, it leads on only if
its vote is still first once reconnected, and steps down after a whole session
timeout without ZooKeeper). Leader work that fails steps down and backs off
(exponentially, with jitter) before voting again.

Supervision: the election task and the connection follower must outlive the
daemon's run. If either ends while the daemon is not stopping, health turns
NOT_SERVING at once, the daemon shuts down as on SIGTERM, and `run` returns
`EXIT_ELECTION_ENDED`, so that systemd (`Restart=on-failure`) or Kubernetes starts
it again: a daemon that is out of the election while it should be in it is never
SERVING.

Shutdown (SIGTERM/SIGINT): stop leading and delete the vote first (the next node
takes over at once, not after a session timeout), then stop the API with grace,
then close ZooKeeper; bounded by `daemon.shutdown_timeout`. SIGHUP reloads the
configuration; a leader restarts its schedules with it.

The metadata index (`daemon.metadata_index`) is every daemon's by default
(`daemon.standby_index`): it is loaded from the first session on and kept current
by its watch, leader or not, so a new leader's first check reads it at once
instead of waiting for a full read. The daemon has one ZooKeeper client for its
whole life (kazoo opens a new session in it after an expiry; the leader's view is
that client, fenced on the vote), so one index follows it: a lost watch or session
is a gap, after which the index reads everything again. An index that fails is
logged, counted and started again later; it never ends or holds up leadership:
checks walk ZooKeeper meanwhile. With `standby_index = false` only the leader
holds one, loaded when it is elected and dropped when its term ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from functools import partial
from typing import Any, Protocol

from auditor.analysis.risk import RiskReport
from auditor.backoff import Backoff
from auditor.checks.context import CheckContext, open_context
from auditor.checks.findings import Check, CheckReport
from auditor.checks.pulsar_audit import PulsarAudit
from auditor.daemon.campaign import Campaign
from auditor.daemon.cluster_checks import follow_cluster_checks
from auditor.daemon.config import DaemonConfig
from auditor.daemon.contained import ContainedReads
from auditor.daemon.election import Leadership, current_auditor, make_elector, watch_election
from auditor.daemon.leadership import (
    Action,
    ConfigReloaded,
    Connected,
    Decision,
    Elected,
    Event,
    FencedOut,
    LeadershipMachine,
    Phase,
    SessionLost,
    Started,
    StepDownRequested,
    StopRequested,
    Suspended,
    SuspendedTooLong,
    TaskEnded,
    VoteLost,
    WorkEnded,
    WorkFailed,
    leader_backoff,
)
from auditor.daemon.metrics import Metrics
from auditor.daemon.outage import wait_out_outage
from auditor.daemon.scan_driver import scan_driver
from auditor.daemon.scheduler import CTIME_KIND, LeaderWork, intervals
from auditor.daemon.sdnotify import Notifier
from auditor.daemon.standby import IndexSupervisor, TermIndex
from auditor.daemon.state import (
    DaemonState,
    NotLeaderError,
    RunCompleted,
    RunOutcome,
    RunState,
    UnreadableVote,
)
from auditor.index.sync import IndexSync
from auditor.logs import get_logger
from auditor.metadata.acls import find_open_acls
from auditor.metadata.elections import ElectionHolder
from auditor.metadata.layout import LedgerManager
from auditor.metadata.registry import watch_bookies
from auditor.metadata.service_uri import describe_ignored
from auditor.metadata.underreplication import (
    CorruptMark,
    UnderreplicatedLedger,
    UnderreplicationManager,
)
from auditor.schedule.bookie_sightings import BookieSightings
from auditor.secretfiles import check_api_token
from auditor.selftest.harness import SelfTestResult
from auditor.store import (
    FencedOutError,
    MetadataStore,
    SessionState,
    StoreAuthError,
    StoreKind,
    StoreUnavailableError,
)
from auditor.worker.loop import ReplicationWorker, WorkerConnection, default_lock_holder
from auditor.zk import ZkClient

#: `run`'s exit code when a supervised task ended (EX_TEMPFAIL: a restart is the remedy).
EXIT_ELECTION_ENDED = 75
#: Phases in which a connected daemon is ready: it is in the election's cycle.
_IN_ELECTION = frozenset({Phase.VOTING, Phase.LEADING, Phase.BACKING_OFF})


class ApiHandle(Protocol):
    """What the daemon needs of its API server (`auditor.api.server.ApiServer`)."""

    #: The port it listens on (tests and the demo dial it).
    port: int

    def set_serving(self, live: bool, ready: bool) -> None: ...

    async def refresh_health(self) -> None: ...

    async def stop(self, grace: float) -> None: ...


ApiFactory = Callable[["Daemon"], Awaitable[ApiHandle]]


class ViewsHandle(Protocol):
    """The read-only HTTP views (`auditor.api.http.HttpViews`), when `api.http_port` >= 0."""

    port: int

    async def stop(self, grace: float) -> None: ...


ViewsFactory = Callable[["Daemon"], Awaitable[ViewsHandle]]


#: How messages name each metadata store.
STORE_NAMES = {StoreKind.ZOOKEEPER: "ZooKeeper", StoreKind.ETCD: "etcd"}


def backoff_of(config: DaemonConfig) -> Backoff:
    """`daemon.leader_backoff_initial` and `daemon.leader_backoff_max` (seconds)."""
    d = config.daemon
    return leader_backoff(
        initial=d.leader_backoff_initial,
        maximum=max(d.leader_backoff_max, d.leader_backoff_initial),
    )


class Happening(enum.StrEnum):
    """What the daemon tells its `listeners` about."""

    DECIDED = "decided"  # a leadership decision (in `state.decisions`)
    LEADER_READ = "leader_read"  # who leads, and the disable flag, read again
    CHECK_ENDED = "check_ended"  # a check run ended, whatever its outcome
    ACLS_CHECKED = "acls_checked"  # the relied-on znodes' ACLs read (`state.open_acls`)
    ZNODE_READ = "znode_read"  # the leader read a check ctime or the delay znode
    SELFTEST_REPORTED = "selftest_reported"  # self-test results arrived (`selftest`)
    RISK_REPORTED = "risk_reported"  # a risk report arrived (`risk_report`)


def _ending(task: asyncio.Task[None]) -> str:
    """How a finished task ended, in a few words."""
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return "returned" if exc is None else f"{type(exc).__name__}: {exc}"


class Daemon:
    """`bk-auditor run`. `reload` re-reads the configuration (SIGHUP)."""

    def __init__(
        self,
        config: DaemonConfig,
        *,
        reload: Callable[[], DaemonConfig] | None = None,
        metrics: Metrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self._reload = reload
        self.log = get_logger("auditor.daemon").bind(identity=config.daemon.identity)
        #: Whose election this daemon takes part in (fixed for the process's life: a
        #: reload that changes the driver needs a restart).
        self.driver = config.metadata_driver
        self.state = DaemonState(identity=config.daemon.identity, election=str(self.driver))
        #: When each bookie went missing, as this process saw it (followers too).
        self.sightings = BookieSightings()
        #: The series, read from `state` when scraped; served over HTTP only when given.
        self.metrics = metrics if metrics is not None else Metrics()
        self.metrics.bind(self.state)
        self._serve_metrics = metrics is not None
        self.machine = LeadershipMachine(
            backoff_of(config), rng, store=STORE_NAMES.get(config.metadata_store, "ZooKeeper")
        )
        #: The metadata store's client, once `run` opened it.
        self.store: MetadataStore | None = None
        self.root = config.daemon.ledgers_root
        self.manager: LedgerManager | None = None
        self.api: ApiHandle | None = None
        self.views: ViewsHandle | None = None
        self.work: LeaderWork | None = None
        #: The replication worker, once running (`worker.enabled`).
        self.worker: ReplicationWorker | None = None
        #: The supervised election task, once running.
        self.election: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._stop_why = "stop()"
        self._connected = asyncio.Event()
        #: Set while the session is suspended or lost: the replication worker stops writing.
        self._disconnected = asyncio.Event()
        self._suspension_timer: asyncio.TimerHandle | None = None
        self._restart_work = asyncio.Event()
        #: Resolved with the decision that ends the current leader term.
        self._term_end: asyncio.Future[Decision] | None = None
        self._rng = rng if rng is not None else random.Random()
        self._notify: Notifier | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: Told each time something in `Happening` happened, after the state that shows it
        #: changed: for whoever follows the daemon from outside without polling (the
        #: `auditor.testing.observe` events).
        self.listeners: list[Callable[[Happening], None]] = []
        #: The last detector self-test and canary results, by check label.
        self.selftest: dict[str, SelfTestResult] = {}
        #: The leader's last risk report.
        self.risk_report: RiskReport | None = None
        #: The metadata indexes (the standby one, a leader's for its term), once the
        #: ledger layout is known.
        self.indexes: IndexSupervisor | None = None
        #: The daemon's part in the election, once the election task runs.
        self.campaign: Campaign | None = None

    @property
    def index(self) -> IndexSync | None:
        """The standby metadata index (`daemon.standby_index`), leader or not, from the
        first session on; replaced by a new one after a failure. None when off."""
        return self.indexes.standby if self.indexes is not None else None

    # --- DaemonControl ----------------------------------------------------------------

    def _store(self) -> MetadataStore:
        if self.store is None:
            raise NotLeaderError("not connected to the metadata store yet")
        return self.store

    async def trigger_check(self, check: Check) -> None:
        if not self.state.is_leader or self.work is None:
            leader = await self.current_leader()
            raise NotLeaderError(f"this node is not the auditor; the auditor is {leader}")
        self.work.triggers[check].set()

    async def current_leader(self) -> str | None:
        return await current_auditor(self._store(), self.root, self.driver)

    def _urm(self) -> UnderreplicationManager:
        return UnderreplicationManager(self._store(), self.root)

    async def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        await self._urm().set_lost_bookie_recovery_delay(seconds)

    async def get_lost_bookie_recovery_delay(self) -> int:
        return await self._urm().get_lost_bookie_recovery_delay()

    async def set_autorecovery(self, enabled: bool) -> None:
        urm = self._urm()
        await (urm.enable_replication() if enabled else urm.disable_replication())
        self.state.replication_enabled = enabled

    async def list_underreplicated(self) -> AsyncIterator[UnderreplicatedLedger | CorruptMark]:
        async for ur in self._urm().list_marks():
            yield ur

    async def explain(self, ledger_id: int) -> dict[str, Any]:
        from auditor.analysis.explain_run import explain_on_cluster

        if self.manager is None:
            raise NotLeaderError("the ledger layout has not been read yet")
        return await explain_on_cluster(
            self._store(), self.root, self.manager, self.config.auditor, ledger_id
        )

    async def step_down(self, by: str) -> Decision:
        """Asks this leader to step down (it votes again at once, behind the others)."""
        if not self.state.is_leader:
            leader = await self.current_leader()
            raise NotLeaderError(f"this node is not the auditor; the auditor is {leader}")
        return self._decide(StepDownRequested(by))

    # --- decisions ------------------------------------------------------------------------

    def _decide(self, event: Event) -> Decision:
        """The machine's decision on `event`: logged, recorded, and (when it ends the
        leader's term) handed to the term."""
        d = self.machine.decide(event, time.time())
        self.state.record_decision(d)
        fields: dict[str, object] = {"action": str(d.action), "reason": str(d.reason)}
        if d.detail:
            fields["detail"] = d.detail
        if d.backoff:
            fields["backoff_s"] = round(d.backoff, 3)
        if d.level == "error":
            self.log.error(d.message, **fields)
        elif d.level == "warning":
            self.log.warning(d.message, **fields)
        else:
            self.log.info(d.message, **fields)
        if d.ends_term and self._term_end is not None and not self._term_end.done():
            self._term_end.set_result(d)
        if self._notify is not None:  # `systemctl status` shows where it stands
            self._notify.show(self.state)
        self._readiness()
        self._tell(Happening.DECIDED)
        return d

    # --- reports and state ------------------------------------------------------------------

    def _tell(self, what: Happening) -> None:
        for listener in self.listeners:
            listener(what)

    def _on_state(self, check: Check, what: RunState, next_run: float | None) -> None:
        self.state.check_run_state(check, what, next_run)

    def _on_selftest(self, results: list[SelfTestResult]) -> None:
        for r in results:
            self.selftest[r.check] = r
        self.state.selftest_done(results, time.time())
        self._tell(Happening.SELFTEST_REPORTED)

    def _on_risk(self, report: RiskReport) -> None:
        self.risk_report = report
        self.state.tallies.record_risk(report, self.config.risk.top)
        self._tell(Happening.RISK_REPORTED)

    def _on_pulsar(self, audit: PulsarAudit) -> None:
        self.state.pulsar_done(audit, self.config.pulsar.top)

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
        if self.store is None:
            return
        with contextlib.suppress(Exception):
            urm = UnderreplicationManager(self.store, self.root)
            self.state.tallies.underreplicated = await urm.count_underreplicated()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.append(t)
        t.add_done_callback(lambda _t: self._tasks.remove(_t) if _t in self._tasks else None)

    # --- connection, heartbeat, signals -------------------------------------------------------

    async def _follow_connection(self, store: MetadataStore) -> None:
        async for st in store.states():
            if st == SessionState.CONNECTED:
                self.state.zk_connected = True
                self.state.tallies.zk_connected()
                self._disconnected.clear()
                self._connected.set()
                self._disarm_suspension_limit()
                self._decide(Connected())
                if isinstance(store, ZkClient) and self.config.zk_security.credentials:
                    self._spawn(self._check_acls(store))
            elif st == SessionState.SUSPENDED:
                self.state.zk_connected = False
                self.state.tallies.zk_suspended()
                self._connected.clear()
                self._disconnected.set()
                if self._decide(Suspended()).action is Action.PAUSE:
                    self._arm_suspension_limit()
            elif st == SessionState.LOST:
                self.state.zk_connected = False
                self.state.tallies.zk_session_lost()
                self._connected.clear()
                self._disconnected.set()
                self._disarm_suspension_limit()
                self._decide(SessionLost())
            self._readiness()

    async def _check_acls(self, zk: ZkClient) -> None:
        """At every connect with credentials: which relied-on znodes anyone may change
        (`auditor.metadata.acls`), each logged, counted and shown in `status`. A read that
        fails is logged and leaves the last finding; it never stops the daemon."""

        async def acls_of(path: str) -> list[Any]:
            return (await zk.get_acls(path))[0]

        try:
            found = await find_open_acls(acls_of, self.root)
        except (StoreUnavailableError, StoreAuthError) as exc:
            self.log.warning("znode ACLs not checked", error=str(exc))
            self._tell(Happening.ACLS_CHECKED)
            return
        self.state.open_acls = tuple(found)
        self._tell(Happening.ACLS_CHECKED)  # after the state it announces
        for item in found:
            self.log.warning(
                "relied-on znode is open to anyone",
                path=item.path,
                perms=list(item.perms),
                fix="setAcl it to the auditor's and the bookies' credentials (docs/runbook.md)",
            )
        if not found:
            self.log.info("relied-on znodes admit only authenticated changes", root=self.root)

    def _arm_suspension_limit(self) -> None:
        """Disconnected for a whole session timeout, the session may be gone on the
        server and another daemon may lead: stop acting as leader now rather than
        when a call finally fails (running checks are cancelled, nothing is written:
        writes are fenced anyway). A session that survives elects us again at once."""
        self._disarm_suspension_limit()
        limit = self.config.daemon.zk_session_timeout

        def expired() -> None:
            self._suspension_timer = None
            if not self._connected.is_set():
                self._decide(SuspendedTooLong(limit))

        self._suspension_timer = asyncio.get_running_loop().call_later(limit, expired)

    def _disarm_suspension_limit(self) -> None:
        if self._suspension_timer is not None:
            self._suspension_timer.cancel()
        self._suspension_timer = None

    def _readiness(self) -> None:
        """Live unless a supervised task ended; ready while connected and in the election,
        and while the election is not held by a vote nobody can read (the cluster is then
        unaudited, whoever this daemon is)."""
        if self.api is not None:
            phase = self.state.phase
            self.api.set_serving(
                live=phase is not Phase.ENDED,
                ready=self.state.zk_connected
                and phase in _IN_ELECTION
                and self.state.unreadable_vote is None,
            )

    async def _heartbeat(self, notify: Notifier | None) -> None:
        while True:
            self.state.heartbeat = time.monotonic()
            if notify is not None:
                notify.watchdog()
                notify.show(self.state)  # sent only when the line changed
            await asyncio.sleep(1.0)

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, self.stop, "SIGINT")
        loop.add_signal_handler(signal.SIGHUP, self._on_hup)

    def _on_hup(self) -> None:
        if self._reload is None:
            return
        try:
            self.config = self._reload()
        except Exception as exc:  # a bad edit must not take the daemon down
            self.log.error("configuration reload failed; keeping the old one", error=str(exc))
            return
        self.machine.backoff = backoff_of(self.config)
        if self._decide(ConfigReloaded()).action is Action.RESTART_WORK:
            self._restart_work.set()

    # --- leadership ----------------------------------------------------------------------------

    async def _term(self, leadership: Leadership) -> Decision:
        """One leader term, from the vote that won it; returns the decision that ended it."""
        self._term_end = asyncio.get_running_loop().create_future()
        try:
            elected = self._decide(Elected(leadership.vote_path))
            return await self._lead(leadership) if elected.action is Action.LEAD else elected
        finally:
            self._term_end = None

    async def _lead(self, leadership: Leadership) -> Decision:
        """Runs the leader's work until a decision ends the term; returns that decision."""
        self.state.lead(time.time())
        # The standby index when there is one; else (as without standby) one for this term.
        index = self.indexes.start_term(leadership.store) if self.indexes is not None else None
        try:
            while True:
                self._restart_work.clear()
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
        assert self.manager is not None and self._term_end is not None
        assert self.campaign is not None
        term_end, campaign = self._term_end, self.campaign
        reading = contextlib.ExitStack()  # the index the checks read, for this run
        try:
            async with open_context(
                leadership.store,
                self.root,
                self.manager,
                self.config.auditor,
                # BookKeeper's etcd driver has no under-replication manager: report only.
                mark=self.driver.marks,
            ) as ctx:
                ctx.log = ctx.log.bind(identity=self.state.identity)
                if self.indexes is not None:
                    reading.enter_context(self.indexes.reading(ctx, leadership.store, index))
                ctx.bookies.observer = self.state.tallies.bookie_request
                ctx.on_retry_queue = self._set_retry_queue
                ctx.on_progress = partial(self._on_progress, ctx)
                bk = self.config.auditor.bookkeeper
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
                    jitter=self.config.daemon.jitter,
                    on_report=self._on_report,
                    on_state=self._on_state,
                    gate=self._connected,
                    scan=scan_driver(self.config),
                    selftest=self.config.selftest,
                    on_selftest=self._on_selftest,
                    risk=self.config.risk,
                    on_risk=self._on_risk,
                    pulsar=self.config.pulsar,
                    on_pulsar=self._on_pulsar,
                    last_reports=self._last_reports,
                )
                for check, iv in intervals(bk).items():
                    self.state.check_interval(check, iv)
                self.state.tallies.selftest_interval = self.config.selftest.period
                self.state.pulsar_scheduled(self.config.pulsar.interval)
                work = asyncio.ensure_future(self.work.run(bk.lostBookieRecoveryDelay))
                restart = asyncio.ensure_future(self._restart_work.wait())
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

    # --- the election ---------------------------------------------------------------------

    async def _elect(self, store: MetadataStore) -> None:
        """The election task: vote, lead, step down, back off; until stopped."""
        campaign = self.campaign = Campaign(
            make_elector(self.driver, store, self.root, self.state.identity),
            store,
            root=self.root,
            driver=self.driver,
            state=self.state,
            decide=self._decide,
            connected=self._connected,
            stop=self._stop,
            rng=self._rng,
            log=self.log,
            store_name=self.machine.store,
        )
        await campaign.run(self._term)

    async def _watch_bookies(self, store: MetadataStore) -> None:
        """Notes when each bookie disappears, leader or not (the restart rule's clock).

        A new leader waits `lostBookieRecoveryDelay` from the moment this
        process first saw a bookie missing, so every daemon keeps watching.
        After an outage the first set read is compared with the last one seen:
        a bookie that went meanwhile is missing from then on, later than it
        really went, which only makes the wait longer, never a false alarm.
        """
        while True:
            stream = watch_bookies(store, self.root)
            try:
                async for bookies in stream:
                    self.sightings.observe(bookies.available, time.monotonic())
            except StoreUnavailableError as exc:
                self.log.info("bookie watch interrupted; resuming when connected", error=str(exc))
                await wait_out_outage(self._connected)
            finally:
                await stream.aclose()

    async def _replicate(self, store: MetadataStore) -> None:
        """The replication worker, on every daemon (leader or not), until stopped."""
        assert self.manager is not None
        w = self.config.worker
        async with open_context(store, self.root, self.manager, self.config.auditor) as ctx:
            ctx.log = ctx.log.bind(identity=self.state.identity, component="worker")
            worker = ReplicationWorker(
                ctx,
                WorkerConnection(self._connected, self._disconnected),
                self.state.worker,
                holder=w.lock_holder or default_lock_holder(),
                ledgers_in_parallel=w.ledgers_in_parallel,
                unrecoverable_retry=w.unrecoverable_retry,
                log=ctx.log,
            )
            self.worker = worker
            await worker.run()

    def _note_unreadable_vote(self, holder: ElectionHolder | None) -> None:
        """Says so, loudly and once, while a live vote we cannot read holds the election
        (`DaemonState.unreadable_vote`: status, a metric, readiness); and when it ends."""
        held = self.state.unreadable_vote
        if holder is not None and holder.live and holder.auditor is None:
            if held is None or held.path != holder.path:
                self.state.unreadable_vote = UnreadableVote(
                    holder.path, holder.session, holder.error, time.time()
                )
                self.log.error(
                    "election held by a vote that does not decode; nobody audits the "
                    "cluster while its session lives",
                    znode=holder.path,
                    session=f"0x{holder.session:x}",
                    error=holder.error,
                )
                self._readiness()
            return
        if held is not None:
            self.state.unreadable_vote = None
            self.log.info("the election is no longer held by an unreadable vote", znode=held.path)
            self._readiness()

    async def _follow_leader(self, store: MetadataStore) -> None:
        """Who leads and whether auto-recovery is on, for status and metrics.

        Re-read when the election (votes or Pulsar's key) or the disable flag change
        (watches); a slow safety re-read covers watches lost with a session.
        """
        urm = UnderreplicationManager(store, self.root)
        while True:
            waits: list[asyncio.Event] = []
            with contextlib.suppress(Exception):
                # Watches only: a follower writes nothing in the election it waits in.
                holder, votes_changed = await watch_election(store, self.root, self.driver)
                disabled, flag_changed = await store.exists_watched(f"{urm.base}/disable")
                waits = [votes_changed, flag_changed]
                if not self.state.is_leader:
                    self.state.leader = holder.auditor if holder is not None else None
                self._note_unreadable_vote(holder)
                self.state.replication_enabled = disabled is None
                self._tell(Happening.LEADER_READ)
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
        self,
        *,
        api_factory: ApiFactory | None = None,
        views_factory: ViewsFactory | None = None,
        notify: Notifier | None = None,
        signals: bool = True,
    ) -> int:
        """Runs until stopped (0), or until a supervised task ends (EXIT_ELECTION_ENDED)."""
        from auditor.metadata.cluster import open_store, read_manager

        d = self.config.daemon
        check_api_token(self.config.api.token)
        self._notify = notify
        if notify is not None:
            notify.show(self.state)  # "waiting for ZooKeeper"
        if signals:
            self._install_signals()
        store = open_store(
            d.zk,
            store=self.config.metadata_store,
            driver=self.driver,
            root=self.root,
            timeout=self.config.auditor.zk_timeout,
            session_timeout=d.zk_session_timeout,
            security=self.config.zk_security,
            etcd=self.config.etcd,
        )
        self.store = store
        follow = asyncio.ensure_future(self._follow_connection(store))
        await store.start()
        self.state.zk_connected = True
        self._connected.set()
        code = 0
        try:
            self.manager = self.config.ledger_manager or await read_manager(
                store, self.root, self.driver
            )
            indexes = self.indexes = IndexSupervisor(
                store,
                root=self.root,
                manager=self.manager,
                config=lambda: self.config,
                tallies=self.state.tallies,
                log=self.log,
            )
            if d.metadata_index and d.standby_index:
                indexes.start_standby()
            self._decide(Started())
            if api_factory is not None:
                self.api = await api_factory(self)
                self._readiness()
            if views_factory is not None and self.config.api.http_port >= 0:
                self.views = await views_factory(self)
            if self._serve_metrics and self.config.metrics.enabled:
                await self.metrics.start_http(self.config.metrics.host, self.config.metrics.port)
            side = [
                asyncio.ensure_future(self._heartbeat(notify)),
                asyncio.ensure_future(self._follow_leader(store)),
                asyncio.ensure_future(
                    follow_cluster_checks(
                        store,
                        self.root,
                        self.state,
                        self.log,
                        lambda: self.config.auditor.bookkeeper,
                    )
                ),
            ]
            if indexes.standby is not None:
                side.append(asyncio.ensure_future(indexes.keep()))
            if notify is not None:
                notify.ready()
            self.log.info(
                "daemon started",
                zk=d.zk,
                ledgers_root=self.root,
                engine=d.engine,
                election=str(self.driver),
                store=str(self.config.metadata_store),
                identity_from=self.config.origin("daemon.identity"),
                zk_tls=tls.describe() if (tls := self.config.zk_security.tls) else "off",
            )
            if self.config.uri_ignored:
                self.log.warning(describe_ignored(self.config.uri_ignored))
            if self.config.etcd is not None and self.config.etcd.ignored:
                self.log.warning(
                    "ignoring etcd configuration keys", keys=list(self.config.etcd.ignored)
                )
            watch = asyncio.ensure_future(self._watch_bookies(store))
            election = self.election = asyncio.ensure_future(self._elect(store))
            supervised = {
                election: "election",
                follow: "connection follower",
                watch: "bookie watch",
            }
            if self.config.worker.enabled and not self.driver.marks:
                self.log.warning(
                    "replication worker not started: BookKeeper's etcd driver has no "
                    "under-replication manager, so there are no marks to work on"
                )
            elif self.config.worker.enabled:
                supervised[asyncio.ensure_future(self._replicate(store))] = "replication worker"
            stopping = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait([stopping, *supervised], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            ended = [t for t in supervised if t.done()]
            if ended and not self._stop.is_set():
                task = ended[0]
                self._decide(TaskEnded(supervised[task], _ending(task)))
                if self.api is not None:
                    await self.api.refresh_health()  # NOT_SERVING before anything stops
                if notify is not None:
                    notify.status(f"the {supervised[task]} task ended; exiting")
                code = EXIT_ELECTION_ENDED
                self._stop.set()
            else:
                self._decide(StopRequested(self._stop_why))
            self.log.info("shutting down")
            if notify is not None:
                notify.stopping()
            _, late = await asyncio.wait([election], timeout=d.shutdown_timeout)
            if late:
                self.log.warning("leader work did not stop in time; cancelling it")
                election.cancel()
                await asyncio.gather(election, return_exceptions=True)
            for t in [*side, watch, *self._tasks]:
                t.cancel()
            await asyncio.gather(*side, watch, *self._tasks, return_exceptions=True)
            if self.api is not None:
                await self.api.stop(grace=min(5.0, d.shutdown_timeout))
            if self.views is not None:
                await self.views.stop(grace=0.0)
            self.metrics.stop_http()
        finally:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
            await store.close()
        self.log.info("daemon stopped", exit_code=code)
        return code

    def stop(self, why: str = "stop()") -> None:
        """Ends `run` (SIGTERM and SIGINT call it): leadership is handed over first."""
        if not self._stop.is_set():
            self._stop_why = why
        self._stop.set()
