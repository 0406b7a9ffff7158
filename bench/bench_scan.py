"""`bk-auditor scan` over N closed ledgers: the asyncio engine against Spark at 1, 2, 4 partitions.

The cluster is bench_replicas' (bench/cluster_host.py: 6 emulated bookies and
ZooKeeper in another process, E=3, W=2, A=2), with a rack map that spreads
every write quorum over two racks, so the cluster is clean and every run must
end with exit 0 and the same counts. Each run is the CLI in a subprocess, as
an operator runs it, with the checks that walk every ledger: replicas (the
one that asks the bookies), placement and metadata. Grace is left out: it only
reads the under-replication marks, once, on the driver.

A Spark run is `--master local[P]` for P partitions: one task slot per
partition, so P partitions really run at once (what P executor cores would
give). On a host with fewer cores than P that oversubscribes the cores, which
the output says. The Spark session's own cost is measured apart, in a fresh
process: start-up, a first trivial job (it starts the Python workers) and a
warm one.

Wall time is the operator's: process start to exit. The scan phase is read
from the CLI's own log lines ("scan planned" to "scan finished"), so start-up
and tear-down show separately. Memory is sampled from /proc: the driver's
peak (VmHWM) and the peak of the whole process tree (driver, JVM, Python
workers); and CPU seconds of the auditor, the bookie emulators and ZooKeeper,
to show which of them the host's cores went to.

Environment: BENCH_SCAN_LEDGERS (N, default 100000), BENCH_SCAN_SPARK_PARTITIONS
(default 1,2,4), BENCH_SCAN_ASYNCIO_PARTITIONS (default 1), BENCH_SCAN_JSON (a
path to keep the figures in, besides the JSON line printed last).
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

CHECKS = "replicas,placement,metadata"
SETTINGS = ("checks.progress_interval=3600",)
#: Partition counts of the Spark runs (issue #6) and of the asyncio runs. More asyncio
#: partitions share one event loop, hence one core: 2 costs a run and gains nothing.
SPARK_PARTITIONS = "1,2,4"
ASYNCIO_PARTITIONS = "1"
RUN_TIMEOUT = 3600.0
SAMPLE_EVERY = 0.25
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) \[\w+\s*\] (scan \w+)")
CLI = Path(sys.executable).with_name("bk-auditor")


@dataclass
class Run:
    engine: str
    partitions: int
    master: str = ""
    exit_code: int = -1
    wall_s: float = 0.0
    startup_s: float = 0.0
    scan_s: float = 0.0
    teardown_s: float = 0.0
    ledgers_checked: int = 0
    ledgers_per_s: float = 0.0
    scan_ledgers_per_s: float = 0.0
    driver_peak_rss_mb: float = 0.0
    tree_peak_rss_mb: float = 0.0
    #: CPU seconds of the auditor's processes, of the bookie emulators, of ZooKeeper.
    cpu_auditor_s: float = 0.0
    cpu_bookies_s: float = 0.0
    cpu_zookeeper_s: float = 0.0
    load_before: float = 0.0
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


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(_stat(entry)[1][1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def cluster_cpu(host: int) -> tuple[float, float]:
    """CPU seconds so far of the bench cluster: (bookie emulators' process, ZooKeeper's JVM)."""
    bookies = zookeeper = 0.0
    for pid in _descendants(host):
        try:
            name = _stat(pid)[0]
        except (OSError, ValueError):
            continue
        if name == "java":
            zookeeper += _cpu_s(pid)
        elif name.startswith("python"):
            bookies += _cpu_s(pid)
    return bookies, zookeeper


class TreeSampler:
    """Peak memory and CPU of a process and of everything it started (JVM, Python workers).

    CPU is the last reading of each process seen, so a process's final
    quarter-second before it exits may be missed.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.driver_kb = 0
        self.tree_kb = 0
        self._cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @property
    def cpu_s(self) -> float:
        return sum(self._cpu.values())

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.driver_kb = max(self.driver_kb, _status_kb(self.pid, "VmHWM"))
            tree = _descendants(self.pid)
            self.tree_kb = max(self.tree_kb, sum(_status_kb(p, "VmRSS") for p in tree))
            for p in tree:
                self._cpu[p] = max(self._cpu.get(p, 0.0), _cpu_s(p))
            self._stop.wait(SAMPLE_EVERY)

    @contextmanager
    def running(self) -> Iterator[TreeSampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


# --- one scan ----------------------------------------------------------------------


def _log_times(stderr: str) -> dict[str, float]:
    times: dict[str, float] = {}
    for line in stderr.splitlines():
        m = LOG_LINE.match(line)
        if m:
            stamp = datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
            times.setdefault(m.group(2), stamp.timestamp())
    return times


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


def scan(zk: str, host: int, racks: Path, work: Path, run: Run) -> Run:
    out = work / f"{run.engine}-{run.partitions}"
    args = [str(CLI), "scan", "--engine", run.engine, "--partitions", str(run.partitions)]
    if run.master:
        args += ["--master", run.master]
    args += ["--zk", zk, "--checks", CHECKS, "--out", str(out), "--overwrite"]
    for s in (*SETTINGS, f"checks.racks_file={racks}"):
        args += ["--set", s]
    run.load_before = round(os.getloadavg()[0], 2)
    cluster_before = cluster_cpu(host)
    with open(work / f"{out.name}.err", "w+") as err:
        t0 = time.time()
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err)
        with TreeSampler(proc.pid).running() as mem:
            try:
                run.exit_code = proc.wait(timeout=RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(
                    f"{run.engine} x{run.partitions}: no end after {RUN_TIMEOUT}s"
                ) from None
        t1 = time.time()
        cluster_after = cluster_cpu(host)
        err.seek(0)
        log = err.read()
    if run.exit_code != 0:
        raise RuntimeError(
            f"{run.engine} x{run.partitions}: exit {run.exit_code} on a clean cluster:\n"
            + log[-4000:]
        )
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
    run.driver_peak_rss_mb = round(mem.driver_kb / 1024, 1)
    run.tree_peak_rss_mb = round(mem.tree_kb / 1024, 1)
    run.cpu_auditor_s = round(mem.cpu_s, 1)
    run.cpu_bookies_s = round(cluster_after[0] - cluster_before[0], 1)
    run.cpu_zookeeper_s = round(cluster_after[1] - cluster_before[1], 1)
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
    )
    if done.returncode != 0:
        raise RuntimeError(f"Spark probe on {master} failed:\n{done.stderr[-4000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --- the benchmark -------------------------------------------------------------------


def _racks(bookies: list[str], path: Path) -> Path:
    # Ensembles are 3 consecutive bookies of 6; 3 racks put each write quorum on 2.
    path.write_text(json.dumps({b: f"/rack-{i % 3}" for i, b in enumerate(bookies)}))
    return path


def _counts(env: str, default: str) -> list[int]:
    text = os.environ.get(env, default)
    try:
        counts = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise SystemExit(f"{env}: expected partition counts like 1,2,4, got {text!r}") from None
    if any(p < 1 for p in counts):
        raise SystemExit(f"{env}: partition counts must be >= 1, got {text!r}")
    return counts


def _plan(spark: bool) -> list[Run]:
    runs = [Run("asyncio", p) for p in _counts("BENCH_SCAN_ASYNCIO_PARTITIONS", ASYNCIO_PARTITIONS)]
    if spark:
        counts = _counts("BENCH_SCAN_SPARK_PARTITIONS", SPARK_PARTITIONS)
        runs += [Run("spark", p, f"local[{p}]") for p in counts]
    return runs


def _line(r: Run, cores: int) -> str:
    label = f"{r.engine}, {r.partitions} partition{'s' if r.partitions > 1 else ''}"
    if r.master:
        label += f", {r.master}" + (" (oversubscribed)" if r.partitions > cores else "")
    return (
        f"  {label}: {r.ledgers_per_s:.1f} ledgers/s; wall {r.wall_s:.1f} s = start "
        f"{r.startup_s:.1f} + scan {r.scan_s:.1f} ({r.scan_ledgers_per_s:.1f} ledgers/s) + stop "
        f"{r.teardown_s:.1f}\n"
        f"      peak RSS: driver {r.driver_peak_rss_mb:.1f} MB, with JVM and workers "
        f"{r.tree_peak_rss_mb:.1f} MB; CPU s: auditor {r.cpu_auditor_s:.1f}, bookies "
        f"{r.cpu_bookies_s:.1f}, ZooKeeper {r.cpu_zookeeper_s:.1f}; load before {r.load_before}"
    )


def main() -> None:
    n = int(os.environ.get("BENCH_SCAN_LEDGERS", "100000"))
    info = machine()
    cores = int(info["cores"] or 1)
    plan = _plan(spark=info["pyspark"] != "not installed")
    if not plan:
        raise SystemExit("bench_scan: no run asked for")
    print(
        f"scan: {n} closed ledgers (E=3 W=2 A=2, 6 emulated bookies, ZooKeeper, in another "
        f"process); checks {CHECKS} (grace left out: it reads only the marks, on the driver); "
        "each run is `bk-auditor scan` in a subprocess",
        flush=True,
    )
    print(f"  machine: {json.dumps(info)}", flush=True)
    if info["pyspark"] == "not installed":
        print("  pyspark is not installed: no Spark runs", flush=True)
    print(
        "  Spark runs use --master local[P] for P partitions (a task slot per partition, so all "
        f"P run at once); with {cores} cores, P > {cores} oversubscribes them",
        flush=True,
    )
    host = subprocess.Popen(
        [sys.executable, "-m", "bench.cluster_host", str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout is not None
        ready = json.loads(host.stdout.readline())
        with tempfile.TemporaryDirectory(prefix="bench-scan-") as tmp:
            work = Path(tmp)
            racks = _racks(ready["bookies"], work / "racks.json")
            probes = {}
            for master in dict.fromkeys(r.master for r in plan if r.master):
                probes[master] = probe(master)
                print(f"  Spark alone, {master}: {json.dumps(probes[master])}", flush=True)
            runs: list[Run] = []
            for run in plan:
                runs.append(scan(ready["zk"], host.pid, racks, work, run))
                print(_line(run, cores), flush=True)
    finally:
        if host.stdin is not None:
            host.stdin.close()
        host.wait(timeout=60)
    first = runs[0].counts
    for r in runs[1:]:
        if r.counts != first:
            raise RuntimeError(
                f"{r.engine} x{r.partitions} counted differently from {runs[0].engine} x"
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
