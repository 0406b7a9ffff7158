"""Real Apache BookKeeper for the interop suite: the jars, bookies, the Java client, the shell.

Nothing here emulates: every process is BookKeeper's own code from the jars the Makefile
copied out of Maven Central (`make interop-jars`, pinned by `tests/interop/bookkeeper/pom.xml`). The
jars are found at `BK_AUDITOR_INTEROP_JARS` or `.cache/interop/bookkeeper/jars` beside
the repository; a missing cache is an error naming the make target, never a skip.

* `metaformat` makes a fresh cluster (BookieShell's `metaformat -n -f`) under a ledgers
  root of its own, so clusters share the test ZooKeeper and nothing else.
* `RealBookie` is one `org.apache.bookkeeper.server.Main` on a free loopback port with its
  journal and ledger directories in a temporary directory, of the ledger storage asked
  for; it is stopped by its own pid (SIGTERM, or SIGKILL for a crash) and can be started
  again on the same port and directories.
* `JavaClient` is one JVM running `java/BkClient.java` (compiled once per session), which
  takes one JSON command a line: a JVM start per operation would cost seconds each.
* `shell` runs one BookieShell command and returns its output (the shell logs its
  answers: callers parse the lines).
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from auditor.testing.serverprocess import ServerProcess
from auditor.testing.zkserver import free_port

ROOT = Path(__file__).resolve().parents[2]
INTEROP_DIR = Path(__file__).resolve().parent
#: The one BookKeeper version the suite pins (tests/interop/bookkeeper/pom.xml says the same).
BOOKKEEPER_VERSION = "4.17.2"
JARS = Path(
    os.environ.get("BK_AUDITOR_INTEROP_JARS", ROOT / ".cache" / "interop" / "bookkeeper" / "jars")
)
#: BookKeeper on Apache Pulsar's metadata driver: pulsar-metadata and the BookKeeper it was
#: built against (tests/interop/pulsar/pom.xml), in a cache of its own so that the plain
#: clusters never have Pulsar's classes on their class path.
PULSAR_JARS = Path(
    os.environ.get(
        "BK_AUDITOR_INTEROP_PULSAR_JARS", ROOT / ".cache" / "interop" / "pulsar" / "jars"
    )
)
PULSAR_VERSION = "4.0.7"
#: What Pulsar's bin/bookkeeper sets so that BookKeeper's code finds Pulsar's drivers for
#: `metadata-store:` URIs.
PULSAR_DRIVER_PROPS = {
    "bookkeeper.metadata.bookie.drivers": (
        "org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver"
    ),
    "bookkeeper.metadata.client.drivers": (
        "org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver"
    ),
}
#: As BookKeeper's bin/common.sh sets them for Java 17; never -ea (PageCacheUtil asserts).
JVM_FLAGS = (
    "-Djava.net.preferIPv4Stack=true",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "--add-opens",
    "java.base/java.io=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.nio=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.misc=ALL-UNNAMED",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
)
#: Every wait on a Java process is bounded: a JVM start is seconds. The bound only tells a
#: hang from a slow start: `make test` starts the first bookies beside the static checks and
#: two other pytest workers, and on a 2-core machine busy with more still (load 12-15) a
#: bookie once took more than 60 s to serve.
START_TIMEOUT = 120.0
CALL_TIMEOUT = 60.0

#: `--set` for our checks of a cluster the Java client wrote without rack information: the
#: placement policy that asks nothing of racks (under the default rack-aware policy every
#: write quorum on `/default-rack` fails, as Java's own placement check says).
NO_RACKS = "ensemblePlacementPolicy=org.apache.bookkeeper.client.DefaultEnsemblePlacementPolicy"

STORAGES = {
    "sorted": "org.apache.bookkeeper.bookie.SortedLedgerStorage",
    "interleaved": "org.apache.bookkeeper.bookie.InterleavedLedgerStorage",
    "db": "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage",
}


class InteropError(RuntimeError):
    """A real BookKeeper process could not be run or did not answer."""


def jars(driver: str = "bookkeeper") -> Path:
    """The jar directory of a driver's clusters, checked: the suite fails, never skips,
    without it."""
    if driver == "pulsar":
        if not (PULSAR_JARS / f"pulsar-metadata-{PULSAR_VERSION}.jar").is_file():
            raise InteropError(
                f"no pulsar-metadata {PULSAR_VERSION} jars in {PULSAR_JARS}: "
                "run `make interop-jars`"
            )
        return PULSAR_JARS
    if not (JARS / f"bookkeeper-server-{BOOKKEEPER_VERSION}.jar").is_file():
        raise InteropError(
            f"no BookKeeper {BOOKKEEPER_VERSION} jars in {JARS}: run `make interop-jars`"
        )
    return JARS


def classpath(*extra: Path, driver: str = "bookkeeper") -> str:
    return os.pathsep.join([*(str(p) for p in extra), str(jars(driver) / "*")])


def driver_props(driver: str) -> dict[str, str]:
    """The system properties a JVM of a cluster on `driver` needs."""
    return dict(PULSAR_DRIVER_PROPS) if driver == "pulsar" else {}


def java(*args: str | Path, cp: str, props: Mapping[str, str] = {}) -> list[str]:
    return [
        "java",
        *JVM_FLAGS,
        *(f"-D{k}={v}" for k, v in props.items()),
        "-cp",
        cp,
        *(str(a) for a in args),
    ]


def compile_programs(out: Path) -> Path:
    """Compiles tests/interop/java/*.java into `out` (once per session) and returns it."""
    sources = sorted((INTEROP_DIR / "java").glob("*.java"))
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["javac", "-nowarn", "-d", str(out), "-cp", classpath(), *map(str, sources)],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise InteropError(f"javac failed: {done.stderr.strip()}")
    return out


@dataclass(frozen=True, slots=True)
class Cluster:
    """Where one real cluster's metadata lives: a ledgers root of its own, and which
    metadata driver its Java processes use: BookKeeper's own (`zk+hierarchical://`) or
    Pulsar's (`metadata-store:zk:`, whose path is a chroot holding `/ledgers`)."""

    zk_hosts: str  # host:port, no chroot
    ledgers_root: str  # e.g. /t-1a2b/ledgers
    driver: str = "bookkeeper"

    @property
    def uri(self) -> str:
        """The metadata service URI of this cluster, as its Java processes are given it."""
        if self.driver == "pulsar":
            chroot = self.ledgers_root.removesuffix("/ledgers")
            return f"metadata-store:zk:{self.zk_hosts}{chroot}"
        return f"zk+hierarchical://{self.zk_hosts}{self.ledgers_root}"

    @property
    def classpath(self) -> str:
        return classpath(driver=self.driver)

    def java(self, *args: str | Path, extra_cp: Sequence[Path] = ()) -> list[str]:
        """A java command line for this cluster's jars and driver."""
        return java(
            *args,
            cp=classpath(*extra_cp, driver=self.driver),
            props=driver_props(self.driver),
        )

    def conf_lines(self) -> list[str]:
        return [f"metadataServiceUri={self.uri}", "zkTimeout=10000"]


def write_conf(path: Path, settings: Mapping[str, object]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


def shell(
    cluster: Cluster,
    *command: str,
    workdir: Path,
    timeout: float = CALL_TIMEOUT,
    stdin: str | None = None,
    extra: Mapping[str, object] = {},
) -> str:
    """Runs `BookieShell -conf <conf> <command...>` and returns what it printed.

    A non-zero exit is an `InteropError` with the output's tail: the shell reports its
    answers through its log, so a caller parses lines, and a failure must show them.
    """
    conf = write_conf(
        workdir / f"shell-{time.monotonic_ns()}.conf",
        {"metadataServiceUri": cluster.uri, "zkTimeout": 10000, **extra},
    )
    done = subprocess.run(
        cluster.java("org.apache.bookkeeper.bookie.BookieShell", "-conf", conf, *command),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        tail = "\n".join(output.splitlines()[-15:])
        raise InteropError(f"BookieShell {' '.join(command)} exited {done.returncode}:\n{tail}")
    return output


def metaformat(cluster: Cluster, workdir: Path) -> None:
    """A fresh cluster at the ledgers root (BookieShell `metaformat -n -f`)."""
    shell(cluster, "metaformat", "-n", "-f", workdir=workdir)


class JavaDaemon(ServerProcess):
    """One long-running JVM of a cluster (a bookie, an AutoRecovery) with an identity of its
    own (`127.0.0.1:<port>`), its directory, configuration and log: started from its
    configuration and ready once this run's log lines say `STARTED` and `ready()` holds;
    stopped by its own pid, SIGTERM for a clean stop, SIGKILL for a crash. It can be
    started again on the same port and directory."""

    #: Names its directory and log, and its errors.
    KIND = ""
    MAIN_CLASS = ""
    #: What the process logs once it is up (ComponentStarter's line).
    STARTED = ""
    JVM_OPTIONS: tuple[str, ...] = ()

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
        self.dir = base_dir / f"{self.KIND}-{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        # The cluster's directory goes with the cluster, not with one of its processes.
        super().__init__(self.dir, own_dir=False)
        self.settings = dict(settings)

    @property
    def bookie_id(self) -> str:
        """Its identity: a bookie's id; what an AutoRecovery's vote names."""
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.dir / f"{self.KIND}.log"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def conf(self) -> Path:
        raise NotImplementedError

    def ready(self) -> bool:
        """Beyond the log line: whether it serves (a bookie: its port accepts)."""
        return True

    def start(self, timeout: float = START_TIMEOUT) -> None:
        if self.proc is not None:
            raise InteropError(f"{self.KIND} {self.bookie_id} is already running")
        conf = self.conf()
        # Where a previous run left its log: only this run's lines count.
        offset = self.log.stat().st_size if self.log.exists() else 0

        def serving(_: float) -> bool:
            with open(self.log, "rb") as f:
                f.seek(offset)
                return self.STARTED.encode() in f.read() and self.ready()

        self.launch(
            self.cluster.java(
                *self.JVM_OPTIONS, f"-Djava.io.tmpdir={self.dir}", self.MAIN_CLASS, "--conf", conf
            ),
            self.log.name,
            serving,
            timeout,
            lambda message: InteropError(f"{self.KIND} {self.bookie_id}: {message}"),
            self.bookie_id,
        )

    def stop(self) -> None:
        """SIGTERM to its own pid (SIGKILL after 10 s): it shuts down and closes its
        ZooKeeper session (a bookie unregisters; an AutoRecovery's vote and locks go)."""
        super().stop()

    def kill(self) -> None:
        """SIGKILL: what its session holds stays until the session times out."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class RealBookie(JavaDaemon):
    """One real bookie (`org.apache.bookkeeper.server.Main`) on loopback."""

    KIND = "bookie"
    MAIN_CLASS = "org.apache.bookkeeper.server.Main"
    STARTED = "Started component bookie-server"
    JVM_OPTIONS = ("-Xmx192m", "-XX:MaxDirectMemorySize=256m")

    def __init__(
        self,
        cluster: Cluster,
        base_dir: Path,
        *,
        storage: str = "sorted",
        port: int | None = None,
        settings: Mapping[str, object] = {},
    ) -> None:
        super().__init__(cluster, base_dir, port=port, settings=settings)
        self.storage = storage

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def ledger_dir(self) -> Path:
        return self.dir / "ledgers"

    def conf(self) -> Path:
        settings: dict[str, object] = {
            "bookiePort": self.port,
            "advertisedAddress": "127.0.0.1",
            "listeningInterface": "lo",
            "allowLoopback": "true",
            "useHostNameAsBookieID": "false",
            "metadataServiceUri": self.cluster.uri,
            "zkTimeout": 10000,
            "journalDirectories": self.dir / "journal",
            "ledgerDirectories": self.ledger_dir,
            "ledgerStorageClass": STORAGES[self.storage],
            "httpServerEnabled": "false",
            "autoRecoveryDaemonEnabled": "false",
            "journalSyncData": "false",
            "diskUsageThreshold": 0.999,
            "diskUsageWarnThreshold": 0.99,
            "dbStorage_writeCacheMaxSizeMb": 16,
            "dbStorage_readAheadCacheMaxSizeMb": 16,
            "dbStorage_rocksDB_blockCacheSize": 8 * 1024 * 1024,
            "flushInterval": 1000,
            "gcWaitTime": 600000,
            "numAddWorkerThreads": 1,
            "numReadWorkerThreads": 2,
            "numJournalCallbackThreads": 1,
            "serverNumIOThreads": 2,
            "enableStatistics": "false",
            **self.settings,
        }
        return write_conf(self.dir / "bk.conf", settings)

    def ready(self) -> bool:
        # Its registration appears before Netty listens: the port must accept too.
        try:
            socket.create_connection(self.address, timeout=1).close()
        except OSError:
            return False
        return True


class JavaClient:
    """The real BookKeeper client (`java/BkClient.java`), one JSON command a line."""

    def __init__(self, cluster: Cluster, classes: Path, workdir: Path) -> None:
        self.cluster = cluster
        self.log = workdir / f"client-{time.monotonic_ns()}.log"
        log = open(self.log, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            cluster.java("-Xmx256m", "BkClient", cluster.uri, extra_cp=[classes]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        log.close()
        self._buffer = b""
        ready = self._answer(START_TIMEOUT)
        if not ready.get("ready"):
            raise InteropError(f"the Java client did not start: {ready}; see {self.log}")

    def _answer(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise InteropError(
                        f"the Java client did not answer in {timeout:g}s; see {self.log}"
                    )
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    raise InteropError(f"the Java client exited; see {self.log}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, op: str, *, timeout: float = CALL_TIMEOUT, **args: Any) -> dict[str, Any]:
        """One command; its answer (`ok` false with `error` and `code` when it failed)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}).encode() + b"\n")
        self.proc.stdin.flush()
        return self._answer(timeout)

    def ok(self, op: str, **args: Any) -> dict[str, Any]:
        """One command that must succeed."""
        answer = self.call(op, **args)
        if not answer.get("ok"):
            raise InteropError(f"Java client {op} {args} failed: {answer}")
        return answer

    def kill(self) -> None:
        """SIGKILL: what it holds open (a ledger's writer) stays open, as after a crash."""
        self.proc.kill()
        self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def payload(ledger: int, entry: int, size: int = 64) -> bytes:
    """What BkClient writes as entry `entry` of ledger `ledger` (see its header)."""
    unit = f"l={ledger} e={entry} ".encode()
    n = max(size, len(unit))
    return (unit * (n // len(unit) + 1))[:n]


def temp_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def stop_all(processes: Sequence[RealBookie]) -> None:
    for p in processes:
        p.stop()


class RealCluster:
    """A real BookKeeper cluster: a ledgers root of its own on the test ZooKeeper, real
    bookies, and (made on first use) one Java client. `close()` stops all of it."""

    def __init__(
        self, zk_hosts: str, classes: Path, workdir: Path, name: str, driver: str = "bookkeeper"
    ) -> None:
        self.cluster = Cluster(zk_hosts, f"/{name}/ledgers", driver)
        self.classes = classes
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.bookies: list[RealBookie] = []
        self._client: JavaClient | None = None
        self.metaformat()

    @property
    def uri(self) -> str:
        return self.cluster.uri

    @property
    def zk_hosts(self) -> str:
        return self.cluster.zk_hosts

    @property
    def ledgers_root(self) -> str:
        return self.cluster.ledgers_root

    def metaformat(self) -> None:
        # BookieShell makes the ledgers root itself, parents included.
        metaformat(self.cluster, self.workdir)

    def add_bookie(self, storage: str = "sorted", **settings: object) -> RealBookie:
        bookie = RealBookie(self.cluster, self.workdir, storage=storage, settings=settings)
        self.bookies.append(bookie)
        bookie.start()
        return bookie

    def add_bookies(self, *storages: str, **settings: object) -> list[RealBookie]:
        """One bookie of each storage named, their JVMs started side by side (each start
        is seconds of mostly waiting); in the order named."""
        before = len(self.bookies)
        with ThreadPoolExecutor(max_workers=max(len(storages), 1)) as pool:
            started = [pool.submit(self.add_bookie, s, **settings) for s in storages]
            bookies = [f.result() for f in started]
        # `bookies` in the order named, as one by one would have it.
        self.bookies[before:] = bookies
        return bookies

    def bookie(self, bookie_id: str) -> RealBookie:
        for b in self.bookies:
            if b.bookie_id == bookie_id:
                return b
        raise KeyError(bookie_id)

    @property
    def client(self) -> JavaClient:
        if self._client is None:
            self._client = JavaClient(self.cluster, self.classes, self.workdir)
        return self._client

    def shell(self, *command: str, **kwargs: Any) -> str:
        return shell(self.cluster, *command, workdir=self.workdir, **kwargs)

    def listed(self, bookie_id: str, ledger: int, last: int) -> list[int]:
        """BookKeeperAdmin.getListOfEntriesOfLedger through the Java client: the entries up
        to `last` that `bookie_id` says it holds.

        A bookie just restarted is "not available" (-8) to the client until its watcher
        sees the registration again: that is waited out, 20 s at most (the client offers
        no event to wait on)."""
        deadline = time.monotonic() + 20
        while True:
            answer = self.client.call("list", bookie=bookie_id, ledger=ledger, last=last)
            if answer.get("ok"):
                entries: list[int] = answer["entries"]
                return entries
            assert answer.get("code") == -8 and time.monotonic() < deadline, answer
            time.sleep(0.2)

    def close(self) -> None:
        """Ends every process of the cluster at once (SIGKILL): a test is over, and a
        graceful close of the Java client alone waits seconds for its thread pools."""
        if self._client is not None:
            self._client.kill()
            self._client = None
        for b in self.bookies:
            b.kill()
