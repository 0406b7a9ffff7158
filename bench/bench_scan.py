"""`bk-auditor scan` over N closed ledgers: the in-process engine against Spark, in process
(`local[S]`) and on a real standalone cluster of one and of two workers (issue #34, item 4).

The cluster is the other benchmarks' (bench/cluster.py, `python -m bench.cluster N` in a
process of its own: ZooKeeper and 6 emulated bookies, one process each, seeded from files,
E=3, W=2, A=2, a rack map that spreads every write quorum over two racks), so the cluster
is clean and every run must end with exit 0 and the same counts. It is built once for all
runs and its build time is a figure of its own. The checks are the ones that walk every
ledger: replicas (the one that asks the bookies), placement and metadata. Grace is left
out: it only reads the under-replication marks, once, on the driver.

The runs, as an operator starts them:

* `asyncio`: `python -m auditor scan --engine asyncio` (this checkout's package: the
  process runs from its root).
* `local`: the same with `--engine spark --master local[S]`: S task slots in the driver's
  JVM, the Python workers on this machine.
* `standalone-1`, `standalone-2`: `deploy/spark/submit.sh` (spark-submit in client mode,
  the project shipped as the archive of `deploy/spark/pack-venv.sh`, `--archives`), as
  docs/spark.md tells an operator, against a master and one worker of S cores or S workers
  of one core (auditor/testing/sparkcluster.py: PySpark's own `spark-class`, loopback).
  Either way S task slots: what changes is one executor process or S of them.

Each Spark mode runs at every partition count of BENCH_SCAN_SPARK_PARTITIONS (default 2
and 8 for S = 2: one wave of tasks, then four), so partitions can be held against slots.

What is measured, per run:

* wall time, process start to exit, and its split: up to "scan planned" (the CLI's log
  line: interpreter, Spark session, ZooKeeper, the id ranges planned), the Spark jobs
  from the event log (`spark.eventLog.enabled`, parsed after the run: the scan stage's
  submission and completion, its tasks' launch and run times, the Parquet writes), the
  driver's own work between the scan stage's end and "scan finished" outside any Spark
  job (merging the partitions' reports, the summary), and the stop after it;
* memory from /proc, sampled every quarter second: the Python driver's and the driver
  JVM's peak (VmHWM), each executor JVM's peak, the peak of the executors' Python workers
  together (RSS), and of everything together; on the standalone cluster the executors are
  found below the workers' pids, the workers' own JVMs reported apart;
* CPU seconds of the auditor's processes (driver and executors), the bookie emulators
  and ZooKeeper, to show where the machine's cores went;
* `/proc/loadavg` before each run: the machine is shared.

Environment: BENCH_SCAN_LEDGERS (N, default 100000), BENCH_SCAN_MODES (default
asyncio,local,standalone-1,standalone-2), BENCH_SCAN_SLOTS (S, default 2),
BENCH_SCAN_SPARK_PARTITIONS (default 2,8), BENCH_SCAN_ASYNCIO_PARTITIONS (default 1),
BENCH_SCAN_JSON (a path to keep the figures in, besides the JSON line printed last).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

CHECKS = "replicas,placement,metadata"
SETTINGS = ("checks.progress_interval=3600",)
MODES = "asyncio,local,standalone-1,standalone-2"
#: Partition counts of the Spark runs and of the asyncio runs. More asyncio partitions
#: share one event loop, hence one core: 2 costs a run and gains nothing.
SPARK_PARTITIONS = "2,8"
ASYNCIO_PARTITIONS = "1"
SLOTS = 2
#: What the standalone job asks for, and what each worker offers (the worker's memory must
#: hold one executor's).
DRIVER_MEMORY = "1g"
EXECUTOR_MEMORY = "768m"
WORKER_MEMORY = "1g"
RUN_TIMEOUT = 3600.0
CLUSTER_TIMEOUT = 3600.0
SAMPLE_EVERY = 0.25
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) \[\w+\s*\] (scan \w+)")
REPO = Path(__file__).resolve().parents[1]
SUBMIT = REPO / "deploy" / "spark" / "submit.sh"


@dataclass
class Mode:
    """Where a run's tasks run: the in-process engine, local[S], or S slots of a standalone
    cluster given as one worker of S cores or S workers of one core."""

    name: str
    slots: int = 1
    workers: int = 0
    worker_cores: int = 0

    @property
    def engine(self) -> str:
        return "asyncio" if self.name == "asyncio" else "spark"

    @property
    def standalone(self) -> bool:
        return self.workers > 0

    def describe(self) -> str:
        if self.name == "asyncio":
            return "in-process asyncio engine"
        if not self.standalone:
            return f"local[{self.slots}]: {self.slots} task slots in the driver's JVM"
        return (
            f"standalone, {self.workers} worker{'s' if self.workers > 1 else ''} of "
            f"{self.worker_cores} core{'s' if self.worker_cores > 1 else ''} and {WORKER_MEMORY}"
            f" each ({self.slots} task slots in {self.workers} executor JVM"
            f"{'s' if self.workers > 1 else ''} of {EXECUTOR_MEMORY}); driver {DRIVER_MEMORY}"
        )


@dataclass
class Run:
    mode: str
    engine: str
    partitions: int
    slots: int = 1
    master: str = ""
    exit_code: int = -1
    wall_s: float = 0.0
    startup_s: float = 0.0
    scan_s: float = 0.0
    teardown_s: float = 0.0
    ledgers_checked: int = 0
    ledgers_per_s: float = 0.0
    scan_ledgers_per_s: float = 0.0
    #: Memory (MB): the Python driver's and the driver JVM's peak (VmHWM); the largest
    #: executor JVM's peak; the executors' Python workers together (peak of summed RSS);
    #: the standalone workers' own JVMs; everything of the run together.
    driver_python_peak_mb: float = 0.0
    driver_jvm_peak_mb: float = 0.0
    executor_jvm_peak_mb: float = 0.0
    executor_jvms: int = 0
    executor_python_peak_mb: float = 0.0
    worker_jvm_peak_mb: float = 0.0
    tree_peak_rss_mb: float = 0.0
    #: CPU seconds of the auditor's processes (driver, executors and their Python workers),
    #: of the bookie emulators, of ZooKeeper.
    cpu_auditor_s: float = 0.0
    cpu_driver_s: float = 0.0
    cpu_executors_s: float = 0.0
    cpu_bookies_s: float = 0.0
    cpu_zookeeper_s: float = 0.0
    loadavg_before: str = ""
    #: The time split from Spark's event log (s; see `split_from_event_log`).
    split: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)


# --- the machine ----------------------------------------------------------------


def _proc_field(path: str, key: str) -> str:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return ""


def _java_version() -> str:
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    first = (done.stderr or done.stdout).splitlines()
    return first[0] if first else "unknown"


def machine() -> dict[str, Any]:
    """What the README quotes as "the machine they came from"."""
    try:
        import pyspark

        spark_version = str(pyspark.__version__)
    except ImportError:
        spark_version = "not installed"
    mem_kb = _proc_field("/proc/meminfo", "MemTotal").split()
    return {
        "cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor(),
        "cores": os.cpu_count(),
        "ram_gb": round(int(mem_kb[0]) / 2**20, 1) if mem_kb else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "pyspark": spark_version,
        "java": _java_version(),
    }


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# --- memory and CPU of process trees --------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def _status_kb(pid: int, key: str) -> int:
    value = _proc_field(f"/proc/{pid}/status", key).split()
    return int(value[0]) if value else 0


def _stat(pid: int | str) -> tuple[str, list[str]]:
    """(command name, the fields after it) of /proc/PID/stat; the name may hold spaces."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    return text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (its own, not its children's)."""
    try:
        rest = _stat(pid)[1]
    except (OSError, ValueError):
        return 0.0
    return (int(rest[11]) + int(rest[12])) / TICK


def _processes() -> dict[int, tuple[str, int]]:
    """Every process: pid -> (command name, parent pid)."""
    found: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            name, rest = _stat(entry)
            found[int(entry)] = (name, int(rest[1]))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _tree(root: int, procs: dict[int, tuple[str, int]]) -> list[int]:
    """`root` and everything below it, parents before children."""
    children: dict[int, list[int]] = {}
    for pid, (_, ppid) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        if pid in procs:
            found.append(pid)
            todo.extend(children.get(pid, []))
    return found


def cluster_cpu(host: int) -> tuple[float, float]:
    """CPU seconds so far of the bench cluster: (bookie processes, ZooKeeper's JVM)."""
    bookies = zookeeper = 0.0
    procs = _processes()
    for pid in _tree(host, procs)[1:]:  # not the host itself: it only waits
        name = procs[pid][0]
        if name == "java":
            zookeeper += _cpu_s(pid)
        elif name.startswith("python"):
            bookies += _cpu_s(pid)
    return bookies, zookeeper


DRIVER_PY, DRIVER_JVM, EXEC_JVM, EXEC_PY, WORKER_JVM, OTHER = (
    "driver_python",
    "driver_jvm",
    "executor_jvm",
    "executor_python",
    "worker_jvm",
    "other",
)
#: A JVM's child between its fork and its exec (how the JVM starts a process): the same
#: program and memory as its parent for a moment; neither an executor nor memory of its own.
FORK = "fork"


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _forked(pid: int, ppid: int) -> bool:
    line = _cmdline(pid)
    return bool(line) and line == _cmdline(ppid)


def roles(
    driver: int,
    workers: list[int],
    procs: dict[int, tuple[str, int]],
    forked: Callable[[int, int], bool] = _forked,
) -> dict[int, str]:
    """What each process of a run is, from where it sits.

    Below the driver's process: under the CLI (`local`, asyncio) the root is the Python
    driver, its JVM a child, and Python below the JVM the executors' workers; under
    spark-submit the root is the driver's JVM and its Python child the driver. Below a
    standalone worker's JVM: executor JVMs and their Python daemons and workers. A JVM's
    child with its parent's command line is a fork not yet exec'd (`FORK`).
    """
    out: dict[int, str] = {}
    for pid in _tree(driver, procs):
        name, ppid = procs[pid]
        if name == "java" and procs.get(ppid, ("", 0))[0] == "java" and forked(pid, ppid):
            out[pid] = FORK
        elif name == "java":
            out[pid] = DRIVER_JVM
        elif name.startswith("python"):
            root_is_jvm = procs[driver][0] == "java"
            driver_py = pid == driver or (root_is_jvm and ppid == driver)
            out[pid] = DRIVER_PY if driver_py else EXEC_PY
        else:
            out[pid] = OTHER
    for w in workers:
        for pid in _tree(w, procs):
            name, ppid = procs[pid]
            if pid == w:
                out[pid] = WORKER_JVM
            elif name == "java" and forked(pid, ppid):
                out[pid] = FORK
            elif name == "java":
                out[pid] = EXEC_JVM
            elif name.startswith("python"):
                out[pid] = EXEC_PY
            else:
                out[pid] = OTHER
    return out


class TreeSampler:
    """Peak memory and CPU of a run's processes: the driver's tree and, on a standalone
    cluster, everything below the workers (executors and their Python workers).

    CPU is the last reading of each process seen, so a process's final quarter-second
    before it exits may be missed. Peaks of single processes are their VmHWM (the kernel's
    own high-water mark); peaks of groups (the executors' Python workers, everything) are
    the largest sum of RSS seen at one sample.
    """

    def __init__(self, driver: int, workers: list[int]) -> None:
        self.driver = driver
        self.workers = workers
        #: pid -> (role, peak VmHWM kB)
        self.hwm: dict[int, tuple[str, int]] = {}
        self.group_kb: dict[str, int] = {}
        self.tree_kb = 0
        self._cpu: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def cpu_s(self, *which: str) -> float:
        return sum(s for r, s in self._cpu.values() if r in which)

    def peak_mb(self, role: str) -> float:
        """The largest VmHWM of one process of `role`."""
        return max((kb for r, kb in self.hwm.values() if r == role), default=0) / 1024

    def count(self, role: str) -> int:
        return sum(1 for r, _ in self.hwm.values() if r == role)

    def _sample(self) -> None:
        procs = _processes()
        if self.driver not in procs:
            return
        seen = roles(self.driver, self.workers, procs)
        sums: dict[str, int] = {}
        total = 0
        for pid, role in seen.items():
            if role == FORK:
                continue
            rss = _status_kb(pid, "VmRSS")
            hwm = _status_kb(pid, "VmHWM")
            self.hwm[pid] = (role, max(self.hwm.get(pid, (role, 0))[1], hwm))
            sums[role] = sums.get(role, 0) + rss
            # Not the workers' own JVMs (reported apart), nor the short-lived helpers a JVM
            # starts (jspawnhelper, `bash -c "gzip | tar"`): between spawn and exec those
            # show their parent's memory, counted twice in a sum.
            if role not in (WORKER_JVM, OTHER):
                total += rss
            self._cpu[pid] = (role, max(self._cpu.get(pid, (role, 0.0))[1], _cpu_s(pid)))
        for role, kb in sums.items():
            self.group_kb[role] = max(self.group_kb.get(role, 0), kb)
        self.tree_kb = max(self.tree_kb, total)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(SAMPLE_EVERY)

    @contextmanager
    def running(self) -> Iterator[TreeSampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


# --- the time split ----------------------------------------------------------------


def _log_times(stderr: str) -> dict[str, float]:
    times: dict[str, float] = {}
    for line in stderr.splitlines():
        m = LOG_LINE.match(line)
        if m:
            stamp = datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
            times.setdefault(m.group(2), stamp.timestamp())
    return times


def _event_files(directory: Path) -> list[Path]:
    """The one application's event log under `directory`, in order: Spark 4 writes
    `eventlog_v2_APP/events_N_APP` (rolled files), older ones a single file `APP`."""
    found = [p for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".")]
    rolled = [p for p in found if p.name.startswith("events_")]
    if rolled:
        return sorted(rolled, key=lambda p: int(p.name.split("_")[1]))
    single = [p for p in found if not p.name.startswith("appstatus")]
    if len(single) != 1:
        raise RuntimeError(f"expected one Spark event log in {directory}, found {single}")
    return single


def _events(paths: list[Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        with path.open() as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def split_from_event_log(
    paths: list[Path], t0: float, planned: float, finished: float
) -> dict[str, Any]:
    """Where a Spark run's time went, from its event log and the CLI's log lines (s).

    `session_s`: process start to the SparkContext's start (launcher, JVM, Python);
    `executors_s`: from there until the last executor registered; `to_planned_s`: from the
    context's start to "scan planned" (ZooKeeper and the id ranges planned on the driver);
    `to_stage_s`: "scan planned" to the scan stage's submission; the scan stage:
    submission to completion, its tasks (count, the first's launch after submission, the
    sum, the shortest and the longest of their run times), and how full its slots were
    (task run time over stage time x slots; the tasks' own CPU is in the Python workers,
    which the event log does not see); `writes_s`: the later jobs (the coverage and
    violations Parquet files); `driver_gaps_s`: the driver's own time between those jobs
    and up to "scan finished"; `merge_s` the one before the violations write, where the
    partitions' reports are merged (with the DataFrame of that write planned).
    """
    app_start = 0.0
    executors: dict[str, tuple[float, int]] = {}
    jobs: dict[int, dict[str, Any]] = {}
    stages: dict[int, dict[str, Any]] = {}
    tasks: dict[int, list[dict[str, Any]]] = {}
    for ev in _events(paths):
        kind = ev.get("Event")
        if kind == "SparkListenerApplicationStart":
            app_start = ev["Timestamp"] / 1000
        elif kind == "SparkListenerExecutorAdded":
            cores = int(ev.get("Executor Info", {}).get("Total Cores", 0))
            executors[str(ev["Executor ID"])] = (ev["Timestamp"] / 1000, cores)
        elif kind == "SparkListenerJobStart":
            props = ev.get("Properties") or {}
            jobs[ev["Job ID"]] = {
                "start": ev["Submission Time"] / 1000,
                "stages": list(ev.get("Stage IDs", [])),
                "what": props.get("spark.job.description", ""),
            }
        elif kind == "SparkListenerJobEnd":
            jobs[ev["Job ID"]]["end"] = ev["Completion Time"] / 1000
        elif kind == "SparkListenerStageCompleted":
            info = ev["Stage Info"]
            stages[info["Stage ID"]] = {
                "tasks": info["Number of Tasks"],
                "submitted": info.get("Submission Time", 0) / 1000,
                "completed": info.get("Completion Time", 0) / 1000,
            }
        elif kind == "SparkListenerTaskEnd":
            ti, tm = ev["Task Info"], ev.get("Task Metrics") or {}
            tasks.setdefault(ev["Stage ID"], []).append(
                {
                    "launch": ti["Launch Time"] / 1000,
                    "finish": ti["Finish Time"] / 1000,
                    "executor": str(ti["Executor ID"]),
                    "run": tm.get("Executor Run Time", 0) / 1000,
                    "deserialize": tm.get("Executor Deserialize Time", 0) / 1000,
                }
            )
    order = sorted(jobs)
    scan_jobs = [j for j in order if jobs[j]["what"].startswith("scan of")]
    if not scan_jobs or not app_start:
        return {"error": f"no scan job in {paths}"}
    first = jobs[scan_jobs[0]]
    stage_id = first["stages"][0]
    stage = stages.get(stage_id, {"tasks": 0, "submitted": first["start"], "completed": 0})
    ts = tasks.get(stage_id, [])
    slots = sum(c for _, c in executors.values())
    stage_s = stage["completed"] - stage["submitted"]
    later = [jobs[j] for j in order if j != scan_jobs[0] and jobs[j]["start"] >= first["end"]]
    writes = sum(j.get("end", j["start"]) - j["start"] for j in later)
    # The driver's own stretches after the scan stage, between Spark jobs: before the
    # coverage write (its DataFrame planned), before the violations write (the partitions'
    # reports merged, owners, marks; that DataFrame planned), after the last job (summary).
    edges = [first["end"], *(x for j in later for x in (j["start"], j.get("end", j["start"])))]
    gaps = [edges[i + 1] - edges[i] for i in range(0, len(edges) - 1, 2)]
    gaps.append(finished - edges[-1])
    merge_at = next((i for i, j in enumerate(later) if j["what"] == "write violations"), len(later))
    run_sum = sum(t["run"] for t in ts)
    by_executor: dict[str, int] = {}
    for t in ts:
        by_executor[t["executor"]] = by_executor.get(t["executor"], 0) + 1
    return {
        "session_s": round(app_start - t0, 2),
        "executors": len(executors),
        "slots": slots,
        "executors_s": round(
            max((a for a, _ in executors.values()), default=app_start) - app_start, 2
        ),
        "to_planned_s": round(planned - app_start, 2),
        "to_stage_s": round(stage["submitted"] - planned, 2),
        "stage_s": round(stage_s, 2),
        "stage_tasks": stage["tasks"],
        "tasks_per_executor": by_executor,
        "first_launch_s": round(min((t["launch"] for t in ts), default=0) - stage["submitted"], 2),
        "task_run_sum_s": round(run_sum, 2),
        "task_run_max_s": round(max((t["run"] for t in ts), default=0), 2),
        "task_run_min_s": round(min((t["run"] for t in ts), default=0), 2),
        "task_deserialize_sum_s": round(sum(t["deserialize"] for t in ts), 2),
        "slot_use": round(run_sum / (stage_s * slots), 3) if stage_s > 0 and slots else 0.0,
        "writes_s": round(writes, 2),
        "write_jobs": len(later),
        "driver_gaps_s": [round(g, 2) for g in gaps],
        "merge_s": round(gaps[merge_at], 2),
        "after_stage_s": round(finished - first["end"], 2),
    }


# --- one scan ----------------------------------------------------------------------


def _summary_counts(doc: dict[str, Any]) -> dict[str, Any]:
    """What must be equal across runs: per check, ledgers checked and skipped, and counts."""
    return {
        check: {
            "ledgers_checked": r["ledgers_checked"],
            "ledgers_skipped": r["ledgers_skipped"],
            "counts": r["counts"],
            "violations": len(r["violations"]),
            **({"coverage": r["coverage"]} if "coverage" in r else {}),
        }
        for check, r in sorted(doc["reports"].items())
    }


def _scan_args(zk: str, racks: str, run: Run, out: Path, events: Path) -> list[str]:
    args = ["scan", "--engine", run.engine, "--partitions", str(run.partitions)]
    if run.master.startswith("local"):
        args += ["--master", run.master]
        for key, value in _event_log_conf(events).items():
            args += ["--spark-conf", f"{key}={value}"]
    args += ["--zk", zk, "--checks", CHECKS, "--out", str(out), "--overwrite"]
    for s in (*SETTINGS, f"checks.racks_file={racks}"):
        args += ["--set", s]
    return args


def _event_log_conf(events: Path) -> dict[str, str]:
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false",
    }


@dataclass
class Standalone:
    """A running standalone cluster and the archive its jobs ship."""

    cluster: Any  # auditor.testing.sparkcluster.SparkStandalone
    venv: Path
    mode: Mode

    def submit_env(self, events: Path) -> dict[str, str]:
        opts = [
            f"--driver-memory {DRIVER_MEMORY}",
            f"--executor-memory {EXECUTOR_MEMORY}",
            f"--conf spark.executor.cores={self.mode.worker_cores}",
            f"--conf spark.cores.max={self.mode.slots}",
            "--conf spark.ui.enabled=false",
            *(f"--conf {k}={v}" for k, v in _event_log_conf(events).items()),
        ]
        env: dict[str, str] = self.cluster.env()  # no PYTHONPATH, no virtualenv of ours
        env.update(
            MASTER=self.cluster.url,
            VENV_DIR=str(self.venv),
            SPARK_SUBMIT=str(self.cluster.home / "bin" / "spark-submit"),
            SUBMIT_OPTS=" ".join(opts),
        )
        return env

    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self.cluster.workers if w.proc is not None]


def scan(
    zk: str, host: int, racks: str, work: Path, run: Run, standalone: Standalone | None
) -> Run:
    name = f"{run.mode}-{run.partitions}"
    out = work / name
    events = work / f"{name}-events"
    events.mkdir()
    args = _scan_args(zk, racks, run, out, events)
    if standalone is not None:
        cwd = work / f"{name}-cwd"  # holds nothing of the project
        cwd.mkdir()
        argv, env = [str(SUBMIT), *args], standalone.submit_env(events)
        workers = standalone.worker_pids()
    else:
        # This checkout's package: `-m` from its root puts it first on the path, and the
        # local Python workers get it from PYTHONPATH.
        cwd = REPO
        argv = [sys.executable, "-m", "auditor", *args]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        workers = []
    run.loadavg_before = loadavg()
    cluster_before = cluster_cpu(host)
    with open(work / f"{name}.err", "w+") as err:
        t0 = time.time()
        proc = subprocess.Popen(
            # Under spark-submit the Python driver's stderr comes out on the JVM's stdout.
            argv, stdout=err, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            cwd=cwd, start_new_session=True,
        )  # fmt: skip
        with TreeSampler(proc.pid, workers).running() as mem:
            try:
                run.exit_code = proc.wait(timeout=RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                raise RuntimeError(f"{name}: no end after {RUN_TIMEOUT}s") from None
        t1 = time.time()
        cluster_after = cluster_cpu(host)
        err.seek(0)
        log = err.read()
    if run.exit_code != 0:
        raise RuntimeError(f"{name}: exit {run.exit_code} on a clean cluster:\n" + log[-4000:])
    times = _log_times(log)
    planned, finished = times.get("scan planned", t0), times.get("scan finished", t1)
    doc = json.loads((out / "summary.json").read_text())
    run.wall_s = round(t1 - t0, 1)
    run.startup_s = round(planned - t0, 1)
    run.scan_s = round(finished - planned, 1)
    run.teardown_s = round(t1 - finished, 1)
    run.ledgers_checked = int(doc["reports"]["replicas"]["ledgers_checked"])
    run.ledgers_per_s = round(run.ledgers_checked / (t1 - t0), 1)
    run.scan_ledgers_per_s = round(run.ledgers_checked / max(finished - planned, 1e-9), 1)
    run.driver_python_peak_mb = round(mem.peak_mb(DRIVER_PY), 1)
    run.driver_jvm_peak_mb = round(mem.peak_mb(DRIVER_JVM), 1)
    run.executor_jvm_peak_mb = round(mem.peak_mb(EXEC_JVM), 1)
    run.executor_jvms = mem.count(EXEC_JVM)
    run.executor_python_peak_mb = round(mem.group_kb.get(EXEC_PY, 0) / 1024, 1)
    run.worker_jvm_peak_mb = round(mem.peak_mb(WORKER_JVM), 1)
    run.tree_peak_rss_mb = round(mem.tree_kb / 1024, 1)
    run.cpu_driver_s = round(mem.cpu_s(DRIVER_PY, DRIVER_JVM), 1)
    run.cpu_executors_s = round(mem.cpu_s(EXEC_JVM, EXEC_PY), 1)
    run.cpu_auditor_s = round(run.cpu_driver_s + run.cpu_executors_s + mem.cpu_s(OTHER), 1)
    run.cpu_bookies_s = round(cluster_after[0] - cluster_before[0], 1)
    run.cpu_zookeeper_s = round(cluster_after[1] - cluster_before[1], 1)
    if run.engine == "spark":
        run.split = split_from_event_log(_event_files(events), t0, planned, finished)
    run.counts = _summary_counts(doc)
    return run


# --- the Spark session on its own ----------------------------------------------------


def spark_probe(master: str) -> dict[str, float]:
    """A fresh process's Spark costs: session start, first trivial job, a warm job, stop."""
    from auditor.scan.spark import DEFAULT_CONF

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    t0 = time.monotonic()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("bench-spark-probe").master(master)
    for key, value in DEFAULT_CONF.items():
        builder = builder.config(key, value)
    t1 = time.monotonic()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    t2 = time.monotonic()
    slots = int(spark.sparkContext.defaultParallelism)
    spark.sparkContext.parallelize(range(slots), slots).map(lambda x: x + 1).count()
    t3 = time.monotonic()
    spark.sparkContext.parallelize(range(slots), slots).map(lambda x: x + 1).count()
    t4 = time.monotonic()
    spark.stop()
    t5 = time.monotonic()
    return {
        "import_s": round(t1 - t0, 2),
        "session_start_s": round(t2 - t1, 2),
        "first_job_s": round(t3 - t2, 2),
        "warm_job_s": round(t4 - t3, 2),
        "stop_s": round(t5 - t4, 2),
    }


def probe(master: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_scan", "--spark-probe", master],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    if done.returncode != 0:
        raise RuntimeError(f"Spark probe on {master} failed:\n{done.stderr[-4000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --- the benchmark -------------------------------------------------------------------


def _counts(env: str, default: str) -> list[int]:
    text = os.environ.get(env, default)
    try:
        counts = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise SystemExit(f"{env}: expected partition counts like 2,8, got {text!r}") from None
    if any(p < 1 for p in counts):
        raise SystemExit(f"{env}: partition counts must be >= 1, got {text!r}")
    return counts


def modes(spark: bool) -> list[Mode]:
    slots = int(os.environ.get("BENCH_SCAN_SLOTS", str(SLOTS)))
    known = {
        "asyncio": Mode("asyncio"),
        "local": Mode("local", slots),
        "standalone-1": Mode("standalone-1", slots, workers=1, worker_cores=slots),
        "standalone-2": Mode("standalone-2", slots, workers=slots, worker_cores=1),
    }
    names = [m.strip() for m in os.environ.get("BENCH_SCAN_MODES", MODES).split(",") if m]
    unknown = [m for m in names if m not in known]
    if unknown:
        raise SystemExit(f"BENCH_SCAN_MODES: unknown {unknown}; known: {', '.join(known)}")
    return [known[m] for m in names if spark or m == "asyncio"]


def _plan(mode: Mode) -> list[Run]:
    if mode.engine == "asyncio":
        return [
            Run(mode.name, "asyncio", p)
            for p in _counts("BENCH_SCAN_ASYNCIO_PARTITIONS", ASYNCIO_PARTITIONS)
        ]
    master = "" if mode.standalone else f"local[{mode.slots}]"
    return [
        Run(mode.name, "spark", p, mode.slots, master)
        for p in _counts("BENCH_SCAN_SPARK_PARTITIONS", SPARK_PARTITIONS)
    ]


def _line(r: Run) -> str:
    label = f"{r.mode}, {r.partitions} partition{'s' if r.partitions > 1 else ''}"
    if r.engine == "spark":
        label += f" on {r.slots} slots"
    text = (
        f"  {label}: {r.ledgers_per_s:.1f} ledgers/s; wall {r.wall_s:.1f} s = start "
        f"{r.startup_s:.1f} + scan {r.scan_s:.1f} ({r.scan_ledgers_per_s:.1f} ledgers/s) + stop "
        f"{r.teardown_s:.1f}; load before {r.loadavg_before}\n"
        f"      memory (peak MB): driver Python {r.driver_python_peak_mb:.1f}, driver JVM "
        f"{r.driver_jvm_peak_mb:.1f}, executor JVM {r.executor_jvm_peak_mb:.1f} (x"
        f"{r.executor_jvms}), executors' Python {r.executor_python_peak_mb:.1f}, workers' JVM "
        f"{r.worker_jvm_peak_mb:.1f}, all {r.tree_peak_rss_mb:.1f}\n"
        f"      CPU s: driver {r.cpu_driver_s:.1f}, executors {r.cpu_executors_s:.1f}, "
        f"bookies {r.cpu_bookies_s:.1f}, ZooKeeper {r.cpu_zookeeper_s:.1f}"
    )
    if r.split:
        text += f"\n      split: {json.dumps(r.split)}"
    return text


@contextmanager
def bench_cluster(n: int) -> Iterator[tuple[dict[str, Any], int, float]]:
    """bench/cluster.py's cluster of `n` ledgers in a process of its own:
    (its ready line, its pid, seconds to build it)."""
    t0 = time.monotonic()
    host = subprocess.Popen(
        [sys.executable, "-m", "bench.cluster", str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert host.stdout is not None
        line = host.stdout.readline()
        if not line:
            raise RuntimeError(f"bench.cluster {n} exited {host.wait()} before it was ready")
        yield json.loads(line), host.pid, time.monotonic() - t0
    finally:
        if host.stdin is not None:
            host.stdin.close()
        host.wait(timeout=CLUSTER_TIMEOUT)


@contextmanager
def standalone(mode: Mode, venv: Path, base: Path) -> Iterator[Standalone]:
    from auditor.testing.sparkcluster import SparkStandalone

    cluster = SparkStandalone(
        workers=mode.workers, cores=mode.worker_cores, memory=WORKER_MEMORY, base_dir=base
    )
    try:
        cluster.start()
        yield Standalone(cluster, venv, mode)
    finally:
        cluster.destroy()


def main() -> None:
    n = int(os.environ.get("BENCH_SCAN_LEDGERS", "100000"))
    info = machine()
    cores = int(info["cores"] or 1)
    chosen = modes(spark=info["pyspark"] != "not installed")
    if not chosen:
        raise SystemExit("bench_scan: no run asked for")
    probe_ok = subprocess.run(
        [sys.executable, "-c", "import auditor; print(auditor.__file__)"],
        capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    print(
        f"scan: {n} closed ledgers (E=3 W=2 A=2, 6 emulated bookies, one process each, and "
        f"ZooKeeper: bench/cluster.py); checks {CHECKS} (grace left out: it reads only the "
        f"marks, on the driver); the CLI's auditor: {probe_ok}",
        flush=True,
    )
    print(f"  machine: {json.dumps(info)}", flush=True)
    if info["pyspark"] == "not installed":
        print("  pyspark is not installed: no Spark runs", flush=True)
    for m in chosen:
        over = " (more slots than cores)" if m.engine == "spark" and m.slots > cores else ""
        print(f"  mode {m.name}: {m.describe()}{over}", flush=True)
    setup: dict[str, Any] = {"loadavg_before": loadavg()}
    venv: Path | None = None
    if any(m.standalone for m in chosen):
        from auditor.testing.sparkvenv import packed_venv

        began = time.monotonic()
        python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        packed = packed_venv(REPO, python)
        packed.release()  # nothing else of ours packs while we run
        venv = packed.directory
        setup["pack_venv_s"] = round(time.monotonic() - began, 1)
        setup["pack_venv"] = packed.how
        print(f"  pack-venv: {packed.how} in {setup['pack_venv_s']} s", flush=True)
    runs: list[Run] = []
    probes: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scan-") as tmp:
        work = Path(tmp)
        with bench_cluster(n) as (ready, host, build_s):
            setup["cluster_build_s"] = round(build_s, 1)
            setup["loadavg_after_build"] = loadavg()
            print(
                f"  cluster of {n} ledgers built in {build_s:.1f} s (load {loadavg()})",
                flush=True,
            )
            for m in chosen:
                if m.engine == "spark" and not m.standalone:
                    probes[m.name] = probe(f"local[{m.slots}]")
                    print(f"  Spark alone, local[{m.slots}]: {json.dumps(probes[m.name])}")
                if not m.standalone:
                    for run in _plan(m):
                        runs.append(scan(ready["zk"], host, ready["racks"], work, run, None))
                        print(_line(run), flush=True)
                    continue
                assert venv is not None
                with standalone(m, venv, work / m.name) as sa:
                    setup[f"{m.name}_start_s"] = round(sa.cluster.start_seconds, 1)
                    print(
                        f"  {m.name}: master and {m.workers} worker(s) ALIVE in "
                        f"{sa.cluster.start_seconds:.1f} s",
                        flush=True,
                    )
                    for run in _plan(m):
                        runs.append(scan(ready["zk"], host, ready["racks"], work, run, sa))
                        print(_line(run), flush=True)
    first = runs[0].counts
    for r in runs[1:]:
        if r.counts != first:
            raise RuntimeError(
                f"{r.mode} x{r.partitions} counted differently from {runs[0].mode} x"
                f"{runs[0].partitions}:\n{json.dumps(r.counts)}\n{json.dumps(first)}"
            )
    if first["replicas"]["ledgers_checked"] != n:
        raise RuntimeError(f"replicas checked {first['replicas']['ledgers_checked']} of {n}")
    print(f"  every run: {json.dumps(first)}", flush=True)
    doc = {
        "bench": "scan",
        "ledgers": n,
        "checks": CHECKS,
        "machine": info,
        "modes": {m.name: m.describe() for m in chosen},
        "setup": setup,
        "spark_probe": probes,
        "runs": [{k: v for k, v in asdict(r).items() if k != "counts"} for r in runs],
        "counts": first,
    }
    print(json.dumps(doc), flush=True)
    if os.environ.get("BENCH_SCAN_JSON"):
        Path(os.environ["BENCH_SCAN_JSON"]).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--spark-probe":
        print(json.dumps(spark_probe(sys.argv[2])), flush=True)
    else:
        main()
