"""The daemon's lifecycle: connect, serve the API and metrics, follow the session,
and supervise the parts that contend, lead and keep the index.

Why: one place wires the process together and decides how it ends; each concern has a
module of its own. `session.py` follows the store's session, `campaign.py` is the
election loop (when to vote, voting, our vote's watch), `term.py` the leader's term (its
work and what it reports), `watches.py` what every daemon watches (who leads, the
bookies), `standby.py` the metadata index (kept leader or not, replaced after a
failure), `outage.py` the one rule for reads that a store outage interrupts,
`leadership.py` the pure decision machine. Every event that may start, pause or end
leadership (a session state change, our vote gone, a fenced write refused, the leader's
work failing, SIGTERM, a vote of another session with our identity, ...) becomes a
`Decision` with a reason, which this module logs, records in `state` (the last decisions
for `status`, a count per reason for the metrics), tells its `listeners` about, and
carries out. The API and metrics only read `state`; mutating API calls come back here
through the `DaemonControl` methods.

A leader runs its work against a view of the metadata store fenced on its vote and
stops it the moment leadership is in doubt (LOST at once; after SUSPENDED, it leads on
only if its vote is still first once reconnected, and steps down after a whole session
timeout without the store). Leader work that fails steps down and backs off
(`auditor.backoff`: exponentially, with jitter) before voting again.

Supervision: the election task and the connection follower must outlive the
daemon's run. If either ends while the daemon is not stopping, health turns
NOT_SERVING at once, the daemon shuts down as on SIGTERM, and `run` returns
`EXIT_ELECTION_ENDED`, so that systemd (`Restart=on-failure`) or Kubernetes starts
it again: a daemon that is out of the election while it should be in it is never
SERVING.

Shutdown (SIGTERM/SIGINT): stop leading and delete the vote first (the next node
takes over at once, not after a session timeout), then stop the API with grace,
then close the store's client; bounded by `daemon.shutdown_timeout`. SIGHUP reloads
the configuration; a leader restarts its schedules with it.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from functools import partial
from typing import Any, Protocol

from auditor.analysis.risk import RiskReport
from auditor.backoff import Backoff
from auditor.checks.context import open_context
from auditor.checks.findings import Check
from auditor.daemon.campaign import Campaign
from auditor.daemon.cluster_checks import follow_cluster_checks
from auditor.daemon.config import DaemonConfig
from auditor.daemon.election import current_auditor, make_elector
from auditor.daemon.leadership import (
    Action,
    ConfigReloaded,
    Decision,
    Event,
    LeadershipMachine,
    Phase,
    Started,
    StepDownRequested,
    StopRequested,
    TaskEnded,
    leader_backoff,
)
from auditor.daemon.metrics import Metrics
from auditor.daemon.scheduler import LeaderWork
from auditor.daemon.sdnotify import Notifier
from auditor.daemon.session import SessionFollower, check_acls
from auditor.daemon.standby import IndexSupervisor
from auditor.daemon.state import (
    DaemonState,
    Happening,
    NotLeaderError,
)
from auditor.daemon.term import LeaderTerms
from auditor.daemon.watches import LeaderFollower, note_missing_bookies
from auditor.index.sync import IndexSync
from auditor.logs import get_logger
from auditor.metadata.layout import LedgerManager
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
    MetadataStore,
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


def backoff_of(config: DaemonConfig) -> Backoff:
    """`daemon.leader_backoff_initial` and `daemon.leader_backoff_max` (seconds)."""
    d = config.daemon
    return leader_backoff(
        initial=d.leader_backoff_initial,
        maximum=max(d.leader_backoff_max, d.leader_backoff_initial),
    )


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
        store_name = config.metadata_store.label
        self.state = DaemonState(
            identity=config.daemon.identity, election=str(self.driver), store=store_name
        )
        #: When each bookie went missing, as this process saw it (followers too).
        self.sightings = BookieSightings()
        #: The series, read from `state` when scraped; served over HTTP only when given.
        self.metrics = metrics if metrics is not None else Metrics()
        self.metrics.bind(self.state)
        self._serve_metrics = metrics is not None
        self.machine = LeadershipMachine(backoff_of(config), rng, store=store_name)
        #: The metadata store's client, once `run` opened it.
        self.store: MetadataStore | None = None
        self.root = config.daemon.ledgers_root
        self.manager: LedgerManager | None = None
        self.api: ApiHandle | None = None
        self.views: ViewsHandle | None = None
        #: The replication worker, once running (`worker.enabled`).
        self.worker: ReplicationWorker | None = None
        #: The supervised election task, once running.
        self.election: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._stop_why = "stop()"
        self._connected = asyncio.Event()
        #: Set while the session is suspended or lost: the replication worker stops writing.
        self._disconnected = asyncio.Event()
        self._restart_work = asyncio.Event()
        self._rng = rng if rng is not None else random.Random()
        self._notify: Notifier | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: Told each time something in `Happening` happened, after the state that shows it
        #: changed: for whoever follows the daemon from outside without polling (the
        #: `auditor.testing.observe` events).
        self.listeners: list[Callable[[Happening], None]] = []
        #: The metadata indexes (the standby one, a leader's for its term), once the
        #: ledger layout is known.
        self.indexes: IndexSupervisor | None = None
        #: The daemon's part in the election, and its leader terms, once the election
        #: task runs.
        self.campaign: Campaign | None = None
        self.leader: LeaderTerms | None = None

    @property
    def index(self) -> IndexSync | None:
        """The standby metadata index (`daemon.standby_index`), leader or not, from the
        first session on; replaced by a new one after a failure. None when off."""
        return self.indexes.standby if self.indexes is not None else None

    @property
    def work(self) -> LeaderWork | None:
        """The leader's work while this daemon leads."""
        return self.leader.work if self.leader is not None else None

    @property
    def selftest(self) -> dict[str, SelfTestResult]:
        """The last detector self-test and canary results, by check label."""
        return self.leader.selftest if self.leader is not None else {}

    @property
    def risk_report(self) -> RiskReport | None:
        """The leader's last risk report."""
        return self.leader.risk_report if self.leader is not None else None

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
        if d.ends_term and self.leader is not None:
            self.leader.end(d)
        if self._notify is not None:  # `systemctl status` shows where it stands
            self._notify.show(self.state)
        self._readiness()
        self._tell(Happening.DECIDED)
        return d

    # --- reports and state ------------------------------------------------------------------

    def _tell(self, what: Happening) -> None:
        for listener in self.listeners:
            listener(what)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.append(t)
        t.add_done_callback(lambda _t: self._tasks.remove(_t) if _t in self._tasks else None)

    # --- connection, heartbeat, signals -------------------------------------------------------

    def _on_connect(self) -> None:
        """At each connect: with ZooKeeper credentials, which relied-on znodes anyone
        may change (`session.check_acls`)."""
        store = self.store
        if isinstance(store, ZkClient) and self.config.zk_security.credentials:
            checked = partial(self._tell, Happening.ACLS_CHECKED)
            self._spawn(check_acls(store, self.root, self.state, self.log, checked))

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
        assert self.manager is not None
        self.leader = LeaderTerms(
            store,
            root=self.root,
            driver=self.driver,
            manager=self.manager,
            config=lambda: self.config,
            state=self.state,
            sightings=self.sightings,
            campaign=campaign,
            indexes=self.indexes,
            decide=self._decide,
            tell=self._tell,
            spawn=self._spawn,
            connected=self._connected,
            restart=self._restart_work,
            log=self.log,
        )
        await campaign.run(self.leader.run)

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
            notify.show(self.state)  # "waiting for ZooKeeper" (or etcd)
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
        session = SessionFollower(
            store,
            state=self.state,
            connected=self._connected,
            disconnected=self._disconnected,
            decide=self._decide,
            readiness=self._readiness,
            session_timeout=lambda: self.config.daemon.zk_session_timeout,
            on_connect=self._on_connect,
        )
        follow = asyncio.ensure_future(session.run())
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
                asyncio.ensure_future(
                    LeaderFollower(
                        store,
                        root=self.root,
                        driver=self.driver,
                        state=self.state,
                        log=self.log,
                        readiness=self._readiness,
                        read=partial(self._tell, Happening.LEADER_READ),
                    ).run()
                ),
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
            watch = asyncio.ensure_future(
                note_missing_bookies(store, self.root, self.sightings, self._connected, self.log)
            )
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
