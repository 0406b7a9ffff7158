"""A full pass over N closed ledgers against the floor (issue #17): `floor`,
`replicas-cold`, `placement`, `index-load`, `warm-replicas` and `naive`.

One cluster (N ledgers, E=3 W=2 A=2, 6 bookie processes, no added latency)
and, on it, each in a process of its own:

* the floor (bench/floor.py): the replicas check's ZooKeeper reads and bookie
  requests with raw kazoo and raw sockets, nothing analysed; then its
  ZooKeeper reads alone and its bookie requests alone (`floor`);
* `bk-auditor check replicas --json` and `bk-auditor check placement --json`,
  the one-shot CLI a user runs, from process start to exit (`replicas-cold`,
  `placement`); CPU from the child's rusage (os.wait4);
* the auditor as the daemon's leader runs it (bench/worker.py `auditor
  --warm`): the index load (`index-load`, against the floor's ZooKeeper
  reads alone), then the checks over the loaded index; the second replicas
  run is `warm-replicas`;
* naive: per ledger in turn, read, ask each bookie in turn, analyse; on the
  first BENCH_NAIVE_N ledgers (default 2,000), since it is the slow one.

The floor, the two CLI runs and the auditor alternate BENCH_REPEAT times
(default 2); each figure is the best of its runs, so a burst of load
elsewhere on the machine does not decide a ratio. Every run must find all N
ledgers and nothing wrong (the cluster is clean).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.cluster import BenchCluster, Measured
from bench.common import bench_n, emit, env_int, rate, run_timed, say

#: The floor's phases and the phase each one's CPU is counted from.
FLOOR_PHASES = {
    "floor": "ready",
    "floor-get": "floor",
    "zk-reads": "floor-get",
    "zk-reads-get": "zk-reads",
    "bookie-requests": "prepared",
}
CLI_TIMEOUT = 7200.0


@dataclass
class CliRun:
    """One `bk-auditor check ...` process: wall seconds, CPU seconds, its JSON report."""

    seconds: float
    cpu_s: float
    maxrss_kb: int
    report: dict[str, Any]


def _cli(cluster: BenchCluster, check: str, tag: str) -> CliRun:
    """Runs the one-shot CLI to its end (call in a thread); stdout/stderr to files."""
    args = [
        sys.executable,
        "-m",
        "auditor",
        "check",
        check,
        "--json",
        "--zk",
        cluster.hosts,
        "--set",
        f"checks.racks_file={cluster.racks}",
    ]
    return run_check_cli(args, cluster.work, check, tag)


def run_check_cli(args: list[str], work: Path, check: str, tag: str) -> CliRun:
    """Runs `args` (a `bk-auditor check CHECK --json`) to its end (call in a thread),
    stdout and stderr to files in `work`; its wall and CPU time and its report."""
    out_path = work / f"cli-{check}-{tag}.out"
    err_path = work / f"cli-{check}-{tag}.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        code, seconds, ru = run_timed(args, out, err)
    reports = [json.loads(line) for line in out_path.read_text().splitlines() if line.strip()]
    report = next((r for r in reports if r.get("check") == check), None)
    if code != 0 or report is None:
        tail = err_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"bk-auditor check {check} exited {code}:\n{tail}")
    return CliRun(seconds, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, report)


def _check_cli(run: CliRun, n: int) -> None:
    r = run.report
    if r.get("ledgers_checked") != n or r.get("violations_total", 0) or r.get("violations"):
        summary = {k: r.get(k) for k in ("check", "ledgers_checked", "violations_total", "counts")}
        raise RuntimeError(f"bk-auditor check on a clean cluster of {n}: {summary}")


def _phase_cpu(m: Measured, phase: str, after: str) -> float:
    return float(m.run.phases[phase]["cpu_s"]) - float(m.run.phases[after]["cpu_s"])


def _us(cpu_s: float, count: int) -> float:
    return round(cpu_s / count * 1e6, 1) if count else 0.0


def _check_report_time(report: dict[str, Any]) -> float | None:
    try:
        started = datetime.fromisoformat(str(report["started_at"]).replace("Z", "+00:00"))
        finished = datetime.fromisoformat(str(report["finished_at"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None
    return round((finished - started).total_seconds(), 2)


def floor_figure(floors: list[Measured], n: int) -> dict[str, Any]:
    """Each floor phase's best run: rate and CPU per unit."""
    out: dict[str, Any] = {}
    for name, after in FLOOR_PHASES.items():
        best = min(floors, key=lambda m: m.seconds(name))
        doc = best.run.phases[name]
        seconds = float(doc["seconds"])
        cpu = _phase_cpu(best, name, after)
        if name in ("floor", "floor-get"):
            out[name] = {
                "seconds": round(seconds, 2),
                "ledgers_per_s": rate(n, seconds),
                "cpu_us_per_ledger": _us(cpu, n),
                "requests": doc["requests"],
            }
        elif name in ("zk-reads", "zk-reads-get"):
            out[name] = {
                "seconds": round(seconds, 2),
                "znodes": doc["znodes"],
                "znodes_per_s": rate(int(doc["znodes"]), seconds),
                "ledger_znodes_per_s": rate(n, seconds),
                "cpu_us_per_znode": _us(cpu, int(doc["znodes"])),
            }
        else:
            requests = int(doc["requests"])
            out[name] = {
                "seconds": round(seconds, 2),
                "requests": requests,
                "requests_per_s": rate(requests, seconds),
                "cpu_us_per_request": _us(cpu, requests),
            }
        out[name]["all_runs_s"] = [round(m.seconds(name), 2) for m in floors]
    return out


async def measure(n: int) -> dict[str, dict[str, Any]]:
    repeat = max(1, env_int("BENCH_REPEAT", 2))
    naive_n = min(n, env_int("BENCH_NAIVE_N", 2000))
    load = round(os.getloadavg()[0], 2)
    floors: list[Measured] = []
    auditors: list[Measured] = []
    replicas: list[CliRun] = []
    placements: list[CliRun] = []
    async with BenchCluster(n) as cluster:
        for i in range(repeat):
            f = await cluster.measure("floor", counters=False)
            floors.append(f)
            say(
                f"scrutiny: floor {i + 1}/{repeat}: {f.seconds('floor'):.1f} s "
                f"(zk reads alone {f.seconds('zk-reads'):.1f} s, "
                f"bookie requests alone {f.seconds('bookie-requests'):.1f} s)"
            )
            for check, runs in (("replicas", replicas), ("placement", placements)):
                run = await asyncio.to_thread(_cli, cluster, check, str(i))
                _check_cli(run, n)
                runs.append(run)
                say(f"scrutiny: check {check} {i + 1}/{repeat}: {run.seconds:.1f} s")
            a = await cluster.measure("auditor", "--warm", counters=False)
            auditors.append(a)
            say(
                f"scrutiny: auditor {i + 1}/{repeat}: index {a.seconds('index'):.1f} s, "
                f"warm replicas {a.seconds('warm-replicas'):.1f} s"
            )
        naive = await cluster.measure("naive", "--limit", str(naive_n), counters=False)
        say(f"naive: {naive_n} ledgers in {naive.seconds('naive'):.1f} s")
    for a in auditors:
        for p in ("replicas", "placement", "warm-replicas", "warm-placement"):
            got = a.run.phases[p]
            if got["ledgers_checked"] != n or got["violations"]:
                raise RuntimeError(f"auditor {p}: {got} on a clean cluster of {n}")
        if a.run.phases["index"]["ledgers"] != n:
            raise RuntimeError(f"auditor index: {a.run.phases['index']}")
    for f in floors:
        got = f.run.phases
        if got["floor"]["ledgers"] != n or got["floor"]["ok"] != got["floor"]["requests"]:
            raise RuntimeError(f"floor: {got['floor']}")
        if got["floor-get"]["ledgers"] != n or got["floor-get"]["ok"] != got["floor"]["requests"]:
            raise RuntimeError(f"floor-get: {got['floor-get']}")
        for p in ("zk-reads", "zk-reads-get"):
            if got[p]["ledgers"] != n:
                raise RuntimeError(f"floor {p}: {got[p]}")
        if got["bookie-requests"]["ok"] != got["bookie-requests"]["requests"]:
            raise RuntimeError(f"floor bookie-requests: {got['bookie-requests']}")

    common = {"n": n, "runs": repeat, "load_avg_before": load}
    fl = floor_figure(floors, n)
    floor_rate = fl["floor"]["ledgers_per_s"]
    get_floor_rate = fl["floor-get"]["ledgers_per_s"]
    zk_rate = fl["zk-reads"]["ledger_znodes_per_s"]
    zk_get_rate = fl["zk-reads-get"]["ledger_znodes_per_s"]

    def cli_figure(name: str, runs: list[CliRun], target: str, bound: float) -> dict[str, Any]:
        best = min(runs, key=lambda r: r.seconds)
        ratio = round(rate(n, best.seconds) / floor_rate, 3) if floor_rate else 0.0
        us = _us(best.cpu_s, n)
        figure: dict[str, Any] = {
            "bench": name,
            **common,
            "command": f"bk-auditor check {best.report['check']} --json",
            "seconds": round(best.seconds, 2),
            "ledgers_per_s": rate(n, best.seconds),
            "check_s": _check_report_time(best.report),
            "cpu_us_per_ledger": us,
            "cpu_s": round(best.cpu_s, 2),
            "peak_rss_mb": round(best.maxrss_kb / 1024, 1),
            "floor_ledgers_per_s": floor_rate,
            "floor_cpu_us_per_ledger": fl["floor"]["cpu_us_per_ledger"],
            "ratio": ratio,
            "floor_get_ledgers_per_s": get_floor_rate,
            "ratio_to_floor_get": round(rate(n, best.seconds) / get_floor_rate, 3)
            if get_floor_rate
            else 0.0,
            "all_runs_s": [round(r.seconds, 2) for r in runs],
            "note": "wall time from process start to exit (interpreter start-up, imports and "
            "ZooKeeper connection included); check_s is the report's own started/finished",
            "target": target,
        }
        if name == "replicas-cold":
            figure["met_ratio"] = ratio >= bound
            figure["met_stretch"] = ratio >= 0.8
            figure["met_cpu"] = us <= 250
            figure["met"] = ratio >= bound and us <= 250
        else:
            figure["met"] = ratio >= bound
        return figure

    index_best = min(auditors, key=lambda m: m.seconds("index"))
    index_s = index_best.seconds("index")
    index_cpu = _phase_cpu(index_best, "index", "ready")
    index_rate = rate(n, index_s)
    index_ratio = round(index_rate / zk_rate, 3) if zk_rate else 0.0
    warm_best = min(auditors, key=lambda m: m.seconds("warm-replicas"))
    warm_s = warm_best.seconds("warm-replicas")
    warm_rate = rate(n, warm_s)
    cold = cli_figure("replicas-cold", replicas, "ratio >= 0.5 (stretch 0.8); CPU <= 250 us", 0.5)
    naive_s = naive.seconds("naive")
    naive_rate = rate(naive_n, naive_s)
    speedup = round(cold["ledgers_per_s"] / naive_rate, 1) if naive_rate else 0.0
    return {
        "floor": {
            "bench": "floor",
            **common,
            **fl,
            "how": "bench/floor.py: raw kazoo, about 1,000 reads in flight drained in order "
            "(floor, zk-reads: multiRead requests of 250 getData, as the auditor's walk "
            "batches; floor-get, zk-reads-get: one get_async per znode, issue 17's floor), "
            "v3 metadata parsed to its ensembles only, one pre-encoded "
            "GET_LIST_OF_ENTRIES_OF_LEDGER per (ledger, ensemble bookie) pipelined on one "
            "socket per bookie, answers parsed to frame, header and status; zk-reads and "
            "bookie-requests are each part alone (the pairs known before the clock starts); "
            "the other figures' ratios are to floor and zk-reads",
        },
        "replicas-cold": cold,
        "placement": cli_figure("placement", placements, "ledgers/s >= 1.0 x the floor's", 1.0),
        "index-load": {
            "bench": "index-load",
            **common,
            "seconds": round(index_s, 2),
            "ledgers": index_best.run.phases["index"]["ledgers"],
            "ledger_znodes_per_s": index_rate,
            "cpu_us_per_znode": _us(index_cpu, n),
            "bytes_per_ledger": index_best.run.phases["index"]["bytes_per_ledger"],
            "floor_zk_reads_per_s": zk_rate,
            "floor_cpu_us_per_znode": fl["zk-reads"]["cpu_us_per_znode"],
            "ratio": index_ratio,
            "floor_zk_reads_get_per_s": zk_get_rate,
            "ratio_to_zk_reads_get": round(index_rate / zk_get_rate, 3) if zk_get_rate else 0.0,
            "all_runs_s": [round(a.seconds("index"), 2) for a in auditors],
            "target": "ledger znodes/s >= 0.8 x the floor's ZooKeeper reads alone",
            "met": index_ratio >= 0.8,
        },
        "warm-replicas": {
            "bench": "warm-replicas",
            **common,
            "seconds": round(warm_s, 2),
            "ledgers_per_s": warm_rate,
            "cpu_us_per_ledger": _us(_phase_cpu(warm_best, "warm-replicas", "placement"), n),
            "floor_bookie_requests_per_s": fl["bookie-requests"]["requests_per_s"],
            "all_runs_s": [round(a.seconds("warm-replicas"), 2) for a in auditors],
            "how": "the replicas check over the loaded index (its second run in the process)",
            "target": "ledgers/s >= 10,000",
            "met": warm_rate >= 10_000,
        },
        "naive": {
            "bench": "naive",
            "n": naive_n,
            "of": n,
            "load_avg_before": load,
            "naive_s": round(naive_s, 2),
            "naive_ledgers_per_s": naive_rate,
            "auditor_ledgers_per_s": cold["ledgers_per_s"],
            "speedup": speedup,
            "cpu_s": round(_phase_cpu(naive, "naive", "ready"), 2),
            "how": "per ledger in turn: read its metadata, list each ensemble bookie in turn, "
            "analyse (replicas only); the first n ledgers of the walk; the auditor's rate is "
            "replicas-cold's (the one-shot CLI over all ledgers)",
            "target": "auditor >= 20 x faster than naive",
            "met": speedup >= 20,
        },
    }


def main() -> None:
    for figure in asyncio.run(measure(bench_n())).values():
        emit(figure)


if __name__ == "__main__":
    main()
