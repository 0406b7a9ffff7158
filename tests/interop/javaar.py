"""Real Java AutoRecovery (`org.apache.bookkeeper.replication.AutoRecoveryMain`).

One `JavaAutoRecovery` is one JVM running BookKeeper's own AutoRecovery from the pinned jars,
its auditor elector and its replication worker both, exactly as `bin/bookkeeper autorecovery`
starts them. Its identity in the election is the bookie id its configuration names
(`advertisedAddress` and `bookiePort`; nothing listens on that port), so several can run on
one host side by side and each vote says which one it is.

The auditor's and the worker's timings are shortened for tests (`TEST_SETTINGS`): no delay
before a lost bookie is audited, only the lost-bookie audit among the periodic checks (the
others would mark on their own schedule and blur what a test watches), short back-offs and
grace periods so a ledger the worker could not repair is tried again within a second or two.

It is a `realbk.JavaDaemon`, as a bookie is: stopped by its own pid, SIGTERM for a clean
stop (the shutdown hook closes its ZooKeeper session: its vote and its locks go at once) or
SIGKILL for a crash (they go when the session times out, `zkTimeout`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.interop.realbk import JavaDaemon, write_conf

#: The auditor and worker knobs of every test AutoRecovery (a test's `settings` win).
TEST_SETTINGS: Mapping[str, object] = {
    # The auditor: a lost bookie is audited at once; only the lost-bookie audit is periodic.
    "lostBookieRecoveryDelay": 0,
    "auditorPeriodicBookieCheckInterval": 60,
    "auditorPeriodicCheckInterval": 0,
    "auditorPeriodicPlacementPolicyCheckInterval": 0,
    "auditorReplicasCheckInterval": 0,
    # The worker: short back-off after a failure, and a failed ledger's lock held for
    # 1600/32 = 50 ms, then 100, 200, ... up to 1.6 s (instead of 9.4 s up to 5 min).
    "rwRereplicateBackoffMs": 500,
    "lockReleaseOfFailedLedgerGracePeriod": 1600,
    "openLedgerRereplicationGracePeriod": 1000,
    # Its client: tests stop bookies on purpose, do not wait long for them.
    "readEntryTimeoutSec": 2,
    "addEntryTimeoutSec": 2,
    "bookieErrorThresholdPerInterval": 1000,
}


class JavaAutoRecovery(JavaDaemon):
    """One real AutoRecoveryMain on the cluster, voting as `127.0.0.1:<port>` (nothing
    listens there)."""

    KIND = "autorecovery"
    MAIN_CLASS = "org.apache.bookkeeper.replication.AutoRecoveryMain"
    #: What ComponentStarter logs once AutoRecoveryMain's elector and worker threads run
    #: (its vote follows within moments: callers wait for it in ZooKeeper).
    STARTED = "Started component autorecovery-server."
    JVM_OPTIONS = ("-Xmx128m",)

    def conf(self) -> Path:
        settings: dict[str, object] = {
            "bookiePort": self.port,
            "advertisedAddress": "127.0.0.1",
            "allowLoopback": "true",
            "useHostNameAsBookieID": "false",
            "metadataServiceUri": self.cluster.uri,
            "zkTimeout": 10000,
            "httpServerEnabled": "false",
            "enableStatistics": "false",
            **TEST_SETTINGS,
            **self.settings,
        }
        return write_conf(self.dir / "autorecovery.conf", settings)
