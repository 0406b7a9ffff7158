"""`local[2]` runs the executors inside the driver's JVM, with the driver's files, Python and
virtualenv, so it hides what an operator's cluster does: executors in processes of their own,
with their own working directories, a Python environment shipped with the job, a worker
lost mid-job. The tests that must see those run on a real standalone Spark cluster.

A throwaway standalone Spark cluster: one master and N workers, each a JVM of its own,
started from PySpark's own distribution (`bin/spark-class` under the installed `pyspark`
package, the same Spark the driver's `spark-submit` is) on loopback, with ports from
`free_port` and a work directory per worker.

Each worker has a loopback address of its own (127.0.0.2, 127.0.0.3, ...; the master and
the driver 127.0.0.1), so its executors are on a host of their own as Spark sees it: Spark
never runs a speculative copy of a task on the host of a running attempt, and with one
address for all there would be no other host.

Every process is a session leader of its own (`start_new_session`), so a worker and the
executor JVMs it launches share its process group; PySpark's Python daemons leave that group
(`setpgid`), so stopping or killing a worker also walks its descendants in /proc. Readiness
is the master's own JSON status page (`/json`): started means every worker is ALIVE there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from auditor.errors import ServiceUnavailableError
from auditor.testing.zkserver import free_port

#: Heap of the master's and each worker's JVM (the executors get `executor_memory`).
DAEMON_MEMORY = "256m"
#: Short-lived JVMs on a busy 2-core machine: the C1 compiler only (less compile work at
#: start) and one GC thread.
JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: The master's settings (its conf dir's spark-defaults.conf): no REST submission server,
#: which would take the fixed port 6066 whatever the other ports are.
MASTER_DEFAULTS = {"spark.master.rest.enabled": "false"}
#: How often the master's status page is polled while waiting.
POLL = 0.1
#: One HTTP request to a status page (s).
HTTP_TIMEOUT = 2.0
#: Environment variables that would put the driver's Python or code in front of a worker's.
_SCRUBBED = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


class SparkClusterError(ServiceUnavailableError):
    """The throwaway Spark cluster could not be started."""


def spark_home() -> Path:
    """The Spark distribution inside the installed `pyspark` package (bin/, jars/)."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise SparkClusterError(f"no bin/spark-class under {home}")
    return home


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children first seen, then theirs), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name (field 2) is in parentheses and may hold spaces.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def http_json(url: str, timeout: float = HTTP_TIMEOUT) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.loads(reply.read())


@dataclass
class SparkDaemon:
    """A master's or worker's JVM and the ports and directory it was given."""

    name: str
    port: int
    web_port: int
    directory: Path
    #: The loopback address it binds (its executors too).
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None
    #: Every pid that belonged to it when it was last stopped or killed (for the tests).
    killed: list[int] = field(default_factory=list)

    @property
    def web(self) -> str:
        return f"http://{self.host}:{self.web_port}"

    @property
    def log(self) -> Path:
        return self.directory / f"{self.name}.log"

    def end(self, sig: signal.Signals, timeout: float) -> None:
        """Sends `sig` to the JVM, its process group and every descendant (executors and
        their Python workers), then waits until none of them is left (SIGKILL after
        `timeout`)."""
        if self.proc is None:
            return
        pid = self.proc.pid
        pids = [pid, *descendants(pid)]
        self.killed = pids
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (
            self.proc.poll() is None or any(_alive(p) for p in pids)
        ):
            time.sleep(0.05)
        if sig != signal.SIGKILL and (self.proc.poll() is None or any(_alive(p) for p in pids)):
            self.end(signal.SIGKILL, timeout)
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
        self.proc = None


class SparkStandalone:
    """A master and `workers` workers of `cores` cores and `memory` each, on loopback."""

    def __init__(
        self,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        base_dir: Path | None = None,
    ) -> None:
        self.home = spark_home()
        self._own_dir = base_dir is None
        self.base_dir = base_dir or Path(tempfile.mkdtemp(prefix="spark-standalone-"))
        self.cores = cores
        self.memory = memory
        self.master = SparkDaemon("master", free_port(), free_port(), self.base_dir / "master")
        self.workers = [
            SparkDaemon(
                f"worker{i}",
                free_port(),
                free_port(),
                self.base_dir / f"worker{i}",
                host=f"127.0.0.{i + 2}",
            )
            for i in range(workers)
        ]
        #: Seconds from the first JVM's start to every worker ALIVE at the master.
        self.start_seconds = 0.0

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master.port}"

    def env(self) -> dict[str, str]:
        """The daemons' environment: this Spark, loopback, small heaps, and none of the
        driver's Python settings (the executors must run what the job ships)."""
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
        conf = self.base_dir / "conf"  # ours only: no spark-defaults.conf from elsewhere
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "spark-defaults.conf").write_text(
            "".join(f"{k} {v}\n" for k, v in MASTER_DEFAULTS.items())
        )
        env.update(
            SPARK_HOME=str(self.home),
            SPARK_CONF_DIR=str(conf),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            SPARK_DAEMON_JAVA_OPTS=JAVA_OPTS,
        )
        return env

    def _launch(self, daemon: SparkDaemon, args: list[str], extra: dict[str, str]) -> None:
        daemon.directory.mkdir(parents=True, exist_ok=True)
        log = open(daemon.log, "ab")  # noqa: SIM115 - owned by the process
        daemon.proc = subprocess.Popen(
            [str(self.home / "bin" / "spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**self.env(), **extra},
            cwd=daemon.directory,
            start_new_session=True,
        )
        log.close()

    def start(self, timeout: float = 120.0) -> None:
        began = time.monotonic()
        self._launch(
            self.master,
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.master.port),
                "--webui-port",
                str(self.master.web_port),
            ],
            {},
        )
        try:
            # Workers started before the master serves back off for seconds between tries.
            self.wait_alive(0, timeout)
            for w in self.workers:
                self.start_worker(w)
            self.wait_alive(len(self.workers), timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began

    def start_worker(self, w: SparkDaemon) -> None:
        local = w.directory / "local"
        local.mkdir(parents=True, exist_ok=True)
        self._launch(
            w,
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                w.host,
                "--port",
                str(w.port),
                "--webui-port",
                str(w.web_port),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(w.directory / "work"),
                self.url,
            ],
            # Executors' block manager and shuffle files: the worker's own directory; the
            # worker, its web UI and its executors bind its own address.
            {"SPARK_LOCAL_DIRS": str(local), "SPARK_LOCAL_IP": w.host},
        )

    def status(self) -> dict[str, Any]:
        """The master's JSON status page: workers, applications, cores."""
        doc: dict[str, Any] = http_json(f"{self.master.web}/json/")
        return doc

    def wait_alive(self, workers: int, timeout: float) -> None:
        """Returns once the master is ALIVE with `workers` workers ALIVE."""
        deadline = time.monotonic() + timeout
        seen = "nothing"
        while time.monotonic() < deadline:
            for d in (self.master, *self.workers):
                if d.proc is not None and d.proc.poll() is not None:
                    raise SparkClusterError(
                        f"spark {d.name} exited with {d.proc.returncode}; see {d.log}"
                    )
            try:
                doc = self.status()
            except OSError as exc:  # not serving yet
                seen = str(exc)
            else:
                alive = [w for w in doc.get("workers", []) if w.get("state") == "ALIVE"]
                seen = f"status {doc.get('status')}, {len(alive)} workers alive"
                if doc.get("status") == "ALIVE" and len(alive) >= workers:
                    return
            time.sleep(POLL)
        raise SparkClusterError(f"spark master not ready within {timeout:g}s ({seen})")

    def worker_executors(self, index: int) -> list[dict[str, Any]]:
        """The executors running on worker `index`, from its own JSON status page."""
        doc = http_json(f"{self.workers[index].web}/json/")
        return list(doc.get("executors", []))

    def kill_worker(self, index: int) -> list[int]:
        """SIGKILLs worker `index` with every process below it (its executors and their
        Python workers), as a machine that dies would; returns the pids killed."""
        w = self.workers[index]
        w.end(signal.SIGKILL, 30.0)
        return w.killed

    def stop(self) -> None:
        for d in (*self.workers, self.master):
            d.end(signal.SIGTERM, 15.0)

    def destroy(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
