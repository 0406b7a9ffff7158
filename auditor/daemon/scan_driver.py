"""The leader's placement and replicas checks as a Spark scan job (`daemon.engine = "spark"`).

These two checks walk every ledger, and the replicas check asks every bookie
of every ensemble what it holds: on a large cluster that is more than one
leader's event loop should carry. With the Spark engine they run as
`auditor.scan.job.run_scan` instead, partitions on the Spark cluster and the
leader as the job's driver. Only where the ledgers are examined changes:

* the marks the job wants are written once, at its end, through the leader's
  own context, so they are fenced on the leader's vote (a deposed leader
  writes none) exactly as an in-process run's are;
* the merged report is the `CheckReport` an in-process run produces, so the
  daemon's state, API and metrics take it unchanged;
* cancelling the run (leadership lost, shutdown) cancels the Spark jobs.

The other checks stay in process: bookies and grace are light, and the
ledger check's entry reads are not what the scan job partitions. A Spark
session lives for one check run: between daily runs the cluster's resources
are not held, and a changed `[scan]` (SIGHUP) applies to the next run.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from auditor.checks.context import CheckContext
from auditor.checks.findings import Check, CheckReport
from auditor.metadata.etcd_config import EtcdOptions
from auditor.metadata.service_uri import MetadataDriver
from auditor.store import StoreKind
from auditor.zk.security import ZkSecurity

if TYPE_CHECKING:
    from auditor.daemon.config import DaemonConfig
    from auditor.scan.engine import Engine, EngineOptions

#: The checks the Spark engine runs; the rest run in process whatever the engine.
SPARK_CHECKS = frozenset({Check.PLACEMENT, Check.REPLICAS})
IN_PROCESS = "asyncio"

#: Tasks closing a Spark session that came up after its check run was cancelled.
_closing: set[asyncio.Task[None]] = set()


@dataclass(frozen=True, slots=True)
class ScanDriver:
    """How the leader reaches the Spark cluster, and its own ZooKeeper, for the job."""

    options: EngineOptions
    #: The daemon's ZooKeeper connect string (with its chroot): each partition opens a session.
    hosts: str
    #: Seconds for a partition's ZooKeeper connection and calls (`bookkeeper.zkTimeout`).
    timeout: float
    #: Id ranges per run; 0: the engine's default.
    partitions: int = 0
    #: The daemon's ZooKeeper credentials: partitions need them on a secured ZooKeeper.
    security: ZkSecurity | None = None
    #: The store and driver of the daemon's metadata service URI (partitions on etcd
    #: open an etcd session, seen as the driver keys it).
    store: StoreKind = StoreKind.ZOOKEEPER
    driver: MetadataDriver = MetadataDriver.BOOKKEEPER
    etcd: EtcdOptions | None = None

    @property
    def name(self) -> str:
        return self.options.name

    def runs(self, check: Check) -> bool:
        return check in SPARK_CHECKS

    async def run(self, ctx: CheckContext, check: Check) -> CheckReport:
        """One run of `check` as a scan job over the leader's cluster; marks through `ctx`."""
        from auditor.metadata.cluster import ClusterTarget
        from auditor.scan.job import run_scan
        from auditor.scan.partition import ScanSpec

        engine = await _open(self.options)
        try:
            spec = ScanSpec(
                target=ClusterTarget(
                    self.hosts,
                    ctx.root,
                    ctx.manager,
                    self.timeout,
                    self.security or ZkSecurity(),
                    self.driver,
                    self.store,
                    self.etcd,
                ),
                config=ctx.config,
                checks=(check,),
                coverage=False,
            )
            result = await run_scan(
                ctx, engine, spec, partitions=self.partitions or engine.default_partitions()
            )
        finally:
            await engine.close()
        return next(r for r in result.reports if r.check is check)


async def _open(options: EngineOptions) -> Engine:
    """The engine, started off the loop: a Spark session takes seconds (a JVM, an application).

    Starting it in a worker thread also keeps PySpark from installing its SIGINT
    handler over the daemon's (it does so only on the main thread). If the run
    is cancelled meanwhile, the session is stopped once it is up, rather than
    left holding the cluster's resources until this daemon leads again.
    """
    from auditor.scan.engines import open_engine

    opening = asyncio.ensure_future(asyncio.to_thread(open_engine, options, None))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_when_open)
        raise


def _close_when_open(opening: asyncio.Future[Any]) -> None:
    if opening.cancelled() or opening.exception() is not None:
        return
    task = asyncio.ensure_future(opening.result().close())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


def scan_driver(config: DaemonConfig) -> ScanDriver | None:
    """The Spark job of this configuration, or None when every check runs in process."""
    if config.daemon.engine == IN_PROCESS:
        return None
    from auditor.scan.engine import EngineOptions

    scan = config.scan
    return ScanDriver(
        options=EngineOptions(config.daemon.engine, scan.master, dict(scan.spark_conf)),
        hosts=config.daemon.zk,
        timeout=config.auditor.zk_timeout,
        partitions=scan.partitions,
        security=config.zk_security,
        store=config.metadata_store,
        driver=config.metadata_driver,
        etcd=config.etcd,
    )
