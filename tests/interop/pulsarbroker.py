"""A real Apache Pulsar broker for the interop suite: standalone, on the test ZooKeeper.

`PulsarBroker` runs `org.apache.pulsar.PulsarStandaloneStarter` from the jars of
`tests/interop/broker/pom.xml` (pulsar-broker 4.0.7, BookKeeper 4.17.2) with
`--metadata-url zk:<zk>/<chroot>`: Pulsar's whole tree (managed ledgers, cursors, schemas,
policies) is under a chroot of its own on the session's ZooKeeper, and its in-process
bookie runs on Pulsar's metadata driver with its ledgers at `/<chroot>/ledgers`, so the
same cluster is `metadata-store:zk:<zk>/<chroot>` to every BookKeeper tool (`cluster`).
No functions worker, no stream storage; broker, web and bookie ports are free loopback
ports (never 8080); heap and direct memory are bounded. It is ready once its admin API
answers for the `public/default` namespace the standalone creates last, and it is stopped
by its own pid.

`PulsarBroker.over(cluster, ...)` runs the same broker without its bookie, over a
BookKeeper cluster the suite made on Pulsar's driver (`realbk.RealCluster(...,
driver="pulsar")`): the standalone's `--only-broker` starts neither ZooKeeper nor a bookie,
and the broker's BookKeeper client is given that cluster's `metadata-store:zk:` URI, whose
chroot is the broker's metadata chroot too. Its bookies are then the suite's `RealBookie`s,
which a test can stop one at a time.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from auditor.testing.serverprocess import ServerProcess
from auditor.testing.zkserver import free_port
from tests.interop.realbk import (
    ROOT,
    START_TIMEOUT,
    Cluster,
    InteropError,
    java,
    write_conf,
)

#: The one Pulsar version the suite pins (tests/interop/broker/pom.xml says the same).
BROKER_VERSION = "4.0.7"
BROKER_JARS = Path(
    os.environ.get(
        "BK_AUDITOR_INTEROP_BROKER_JARS", ROOT / ".cache" / "interop" / "broker" / "jars"
    )
)
#: What bin/pulsar adds to BookKeeper's opens for the broker.
BROKER_OPENS = (
    "--add-opens",
    "java.base/sun.net=ALL-UNNAMED",
    "--add-opens",
    "java.management/sun.management=ALL-UNNAMED",
)
#: Heap and direct memory together well under 1.5 GB.
BROKER_MEMORY = ("-Xms128m", "-Xmx512m", "-XX:MaxDirectMemorySize=512m")
#: Entries per ledger before the managed ledger rolls to a new one.
ENTRIES_PER_LEDGER = 5
#: Every admin call is bounded.
HTTP_TIMEOUT = 30.0


def broker_jars() -> Path:
    """The broker's jar directory, checked: the suite fails, never skips, without it."""
    if not (BROKER_JARS / f"pulsar-broker-{BROKER_VERSION}.jar").is_file():
        raise InteropError(
            f"no pulsar-broker {BROKER_VERSION} jars in {BROKER_JARS}: run `make interop-jars`"
        )
    return BROKER_JARS


class AdminError(InteropError):
    """The broker's admin API answered with an error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:300]}")
        self.status = status


class PulsarBroker(ServerProcess):
    """One standalone Pulsar broker (with its one bookie) whose metadata is at
    `/<chroot>` on the ZooKeeper at `zk_hosts`; or, made by `over`, the broker alone over
    a cluster of real bookies."""

    def __init__(
        self, zk_hosts: str, chroot: str, base_dir: Path, settings: Mapping[str, object] = {}
    ) -> None:
        base_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(base_dir, own_dir=False)
        self.zk_hosts = zk_hosts
        self.chroot = chroot
        self.broker_port = free_port()
        self.web_port = free_port()
        self.bookie_port = free_port()
        self.settings = dict(settings)
        #: The BookKeeper cluster it uses when it runs no bookie of its own (`over`).
        self.bookies: Cluster | None = None

    @classmethod
    def over(
        cls, cluster: Cluster, base_dir: Path, settings: Mapping[str, object] = {}
    ) -> PulsarBroker:
        """The broker alone (no bookie, no ZooKeeper of its own) over `cluster`, a cluster
        on Pulsar's driver: its metadata goes under the chroot holding the cluster's
        ledgers, as a Pulsar cluster keeps both."""
        chroot = cluster.ledgers_root.removesuffix("/ledgers").strip("/")
        if cluster.driver != "pulsar" or cluster.ledgers_root != f"/{chroot}/ledgers":
            raise InteropError(f"not a cluster on Pulsar's driver at /<chroot>/ledgers: {cluster}")
        broker = cls(cluster.zk_hosts, chroot, base_dir, settings)
        broker.bookies = cluster
        return broker

    @property
    def metadata_url(self) -> str:
        """Pulsar's metadata store URL (`zk:host:port/chroot`)."""
        return f"zk:{self.zk_hosts}/{self.chroot}"

    @property
    def cluster(self) -> Cluster:
        """The broker's BookKeeper cluster, as the suite's BookKeeper tools address it
        (Pulsar's driver: `metadata-store:zk:<zk>/<chroot>`)."""
        if self.bookies is not None:
            return self.bookies
        return Cluster(self.zk_hosts, f"/{self.chroot}/ledgers", "pulsar")

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.broker_port}"

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def log(self) -> Path:
        return self.base_dir / "broker.log"

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def conf(self) -> Path:
        settings: dict[str, object] = {
            "clusterName": "standalone",
            "metadataStoreUrl": self.metadata_url,
            "configurationMetadataStoreUrl": self.metadata_url,
            "bindAddress": "127.0.0.1",
            "advertisedAddress": "127.0.0.1",
            "brokerServicePort": self.broker_port,
            "webServicePort": self.web_port,
            "functionsWorkerEnabled": "false",
            "brokerDeleteInactiveTopicsEnabled": "false",
            # One bookie: every ledger on it.
            "managedLedgerDefaultEnsembleSize": 1,
            "managedLedgerDefaultWriteQuorum": 1,
            "managedLedgerDefaultAckQuorum": 1,
            # Ledgers roll every few entries, and rolled ones stay (retention), so a topic
            # has several ledgers; cursors persist every mark-delete to their ledger.
            "managedLedgerMaxEntriesPerLedger": ENTRIES_PER_LEDGER,
            "managedLedgerMinLedgerRolloverTimeMinutes": 0,
            "managedLedgerCursorMaxEntriesPerLedger": 2,
            "managedLedgerDefaultMarkDeleteRateLimit": 0,
            "defaultRetentionTimeInMinutes": 600,
            "defaultRetentionSizeInMB": 100,
            # The bookie (BKCluster reads the same file).
            "journalDirectory": self.base_dir / "bookie" / "journal",
            "ledgerDirectories": self.base_dir / "bookie" / "ledgers",
            "allowLoopback": "true",
            "httpServerEnabled": "false",
            "journalSyncData": "false",
            "gcWaitTime": 600000,
            "dbStorage_writeCacheMaxSizeMb": 16,
            "dbStorage_readAheadCacheMaxSizeMb": 16,
            "dbStorage_rocksDB_blockCacheSize": 8 * 1024 * 1024,
            **self.settings,
        }
        if self.bookies is not None:
            # Its BookKeeper client on the very URI the cluster's own processes have
            # (without it the broker derives `metadata-store:<metadataStoreUrl>`).
            settings["bookkeeperMetadataServiceUri"] = self.bookies.uri
        return write_conf(self.base_dir / "standalone.conf", settings)

    def start(self, timeout: float = 3 * START_TIMEOUT) -> None:
        if self.proc is not None:
            raise InteropError("the broker is already running")
        conf = self.conf()
        if self.bookies is None:
            bookie: tuple[str | Path, ...] = (
                "--bookkeeper-port",
                str(self.bookie_port),
                "--bookkeeper-dir",
                self.base_dir / "bookie",
            )
        else:
            # Neither ZooKeeper nor a bookie: the cluster's bookies serve it.
            bookie = ("--only-broker",)
        command = java(
            *BROKER_OPENS,
            *BROKER_MEMORY,
            "-Dlog4j2.level=INFO",
            f"-Djava.io.tmpdir={self.base_dir}",
            "org.apache.pulsar.PulsarStandaloneStarter",
            "--config",
            conf,
            "-nfw",
            "-nss",
            "--metadata-url",
            self.metadata_url,
            *bookie,
            cp=str(broker_jars() / "*"),
        )

        def serving(_: float) -> bool:
            # The standalone creates `public/default` after the broker serves.
            try:
                self.admin("GET", "/admin/v2/namespaces/public/default", timeout=1.0)
            except (OSError, InteropError):
                return False
            return True

        self.launch(
            command,
            self.log.name,
            serving,
            timeout,
            lambda message: InteropError(f"pulsar broker: {message}\n{self.log_tail()}"),
            self.web_url,
        )

    def admin(
        self, method: str, path: str, body: Any = None, *, timeout: float = HTTP_TIMEOUT
    ) -> Any:
        """One call of the broker's admin REST API (`path` already quoted); its JSON
        answer, or None for an empty one. An error status is an `AdminError`."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.web_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as exc:
            raise AdminError(method, path, exc.code, exc.read().decode(errors="replace")) from exc
        return json.loads(raw) if raw else None


def topic_path(topic: str) -> str:
    """`persistent://t/ns/local` -> `/persistent/t/ns/<local, quoted>` for the admin API's
    topic resources (the local name percent-encoded, as Pulsar's admin client does)."""
    domain, _, rest = topic.partition("://")
    tenant, namespace, local = rest.split("/", 2)
    return f"/{domain}/{tenant}/{namespace}/{urllib.parse.quote(local, safe='')}"
