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

It is started and stopped like `RealBookie`: by its own pid, SIGTERM for a clean stop (the
shutdown hook closes its ZooKeeper session: its vote and its locks go at once) or SIGKILL
for a crash (they go when the session times out, `zkTimeout`).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from tests.interop.realbk import (
    START_TIMEOUT,
    Cluster,
    InteropError,
    free_port,
    write_conf,
)

#: What ComponentStarter logs once AutoRecoveryMain's elector and worker threads are started.
STARTED = "Started component autorecovery-server."

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


class JavaAutoRecovery:
    """One real AutoRecoveryMain on the cluster, voting as `127.0.0.1:<port>`."""

    def __init__(
        self,
        cluster: Cluster,
        base_dir: Path,
        *,
        port: int | None = None,
        settings: Mapping[str, object] = {},
    ) -> None:
        self.cluster = cluster
        self.port = port or free_port()
        self.dir = base_dir / f"autorecovery-{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.settings = dict(settings)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bookie_id(self) -> str:
        """What its vote (and the shell's `whoisauditor`) names."""
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.dir / "autorecovery.log"

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

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Starts the JVM and returns once its elector and worker threads run (its vote
        follows within moments: callers wait for it in ZooKeeper)."""
        if self.proc is not None:
            raise InteropError(f"autorecovery {self.bookie_id} is already running")
        conf = self.conf()
        # Where a previous run of this process left off: only this run's lines count.
        offset = self.log.stat().st_size if self.log.exists() else 0
        log = open(self.log, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            self.cluster.java(
                "-Xmx128m",
                f"-Djava.io.tmpdir={self.dir}",
                "org.apache.bookkeeper.replication.AutoRecoveryMain",
                "--conf",
                conf,
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise InteropError(
                    f"autorecovery {self.bookie_id} exited with {code}; see {self.log}"
                )
            with open(self.log, "rb") as f:
                f.seek(offset)
                if STARTED.encode() in f.read():
                    return
            time.sleep(0.1)
        self.kill()
        raise InteropError(f"autorecovery {self.bookie_id} did not start within {timeout:g}s")

    def stop(self) -> None:
        """SIGTERM to its own pid: the shutdown hook closes the elector, the worker and the
        ZooKeeper session (its vote and locks are deleted)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: its vote and locks stay until the ZooKeeper session times out."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
