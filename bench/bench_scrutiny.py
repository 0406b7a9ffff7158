"""`scrutiny`, `scrutiny-warm` and `naive`: how fast a full pass over N closed ledgers is.

One cluster (N ledgers, E=3 W=2 A=2, 6 bookie processes, no added latency)
and, on it, in separate processes each:

* the auditor as the leader runs it: index load (one ZooKeeper walk), then
  the replicas and placement checks over the index (`scrutiny`'s auditor
  time, `scrutiny-warm`'s cold run), then both checks again over the loaded
  index (`scrutiny-warm`'s warm run);
* the floor: the same ZooKeeper reads and bookie requests, fully pipelined,
  nothing analysed (see bench/worker.py);
* naive: per ledger in turn, read, ask each bookie in turn, analyse; on the
  first BENCH_NAIVE_N ledgers (default 2,000), since it is the slow one.

Floor and auditor alternate BENCH_REPEAT times (default 2); each figure is
the best of its runs, so a burst of load elsewhere on the machine does not
decide a ratio.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from bench.cluster import BenchCluster, Measured
from bench.common import bench_n, emit, env_int, rate, say

COLD = ("index", "replicas", "placement")
WARM = ("warm-replicas", "warm-placement")


def _best(runs: list[Measured], phases: tuple[str, ...]) -> Measured:
    return min(runs, key=lambda m: m.seconds(*phases))


def _cpu(m: Measured, after: str, phases: tuple[str, ...]) -> dict[str, float]:
    """CPU seconds of the measured process and of the cluster over `phases` (which
    begin when phase `after` ended)."""
    return {
        "measured_process": m.worker_cpu(after, phases[-1]),
        "zookeeper": round(sum(m.cluster_cpu[p]["zookeeper"] for p in phases), 2),
        "bookies": round(sum(m.cluster_cpu[p]["bookies"] for p in phases), 2),
    }


async def measure(n: int) -> dict[str, dict[str, Any]]:
    repeat = max(1, env_int("BENCH_REPEAT", 2))
    naive_n = min(n, env_int("BENCH_NAIVE_N", 2000))
    load = round(os.getloadavg()[0], 2)
    floors: list[Measured] = []
    auditors: list[Measured] = []
    async with BenchCluster(n) as cluster:
        for i in range(repeat):
            floors.append(await cluster.measure("floor", counters=False))
            say(f"scrutiny: floor {i + 1}/{repeat}: {floors[-1].seconds('floor'):.1f} s")
            auditors.append(await cluster.measure("auditor", "--warm", counters=False))
            a = auditors[-1]
            say(
                f"scrutiny: auditor {i + 1}/{repeat}: cold {a.seconds(*COLD):.1f} s "
                f"(index {a.seconds('index'):.1f}, replicas {a.seconds('replicas'):.1f}, "
                f"placement {a.seconds('placement'):.1f}), warm {a.seconds(*WARM):.1f} s"
            )
        naive = await cluster.measure("naive", "--limit", str(naive_n), counters=False)
        say(f"naive: {naive_n} ledgers in {naive.seconds('naive'):.1f} s")
    for a in auditors:
        for p in (*COLD[1:], *WARM):
            got = a.run.phases[p]
            if got["ledgers_checked"] != n or got["violations"]:
                raise RuntimeError(f"auditor {p}: {got} on a clean cluster of {n}")
    for f in floors:
        if f.run.phases["floor"]["answered"] != n:
            raise RuntimeError(f"floor: {f.run.phases['floor']}")

    floor = _best(floors, ("floor",))
    cold = _best(auditors, COLD)
    warm = _best(auditors, WARM)
    floor_s = floor.seconds("floor")
    cold_s = cold.seconds(*COLD)
    warm_s = warm.seconds(*WARM)
    naive_s = naive.seconds("naive")
    auditor_rate = rate(n, cold_s)
    naive_rate = rate(naive_n, naive_s)
    common = {"n": n, "runs": repeat, "load_avg_before": load}
    ratio = round(cold_s / floor_s, 3)
    speedup = round(auditor_rate / naive_rate, 1) if naive_rate else 0.0
    return {
        "scrutiny": {
            "bench": "scrutiny",
            **common,
            "auditor_s": round(cold_s, 2),
            "auditor_ledgers_per_s": auditor_rate,
            "auditor_phases_s": {p: round(cold.seconds(p), 2) for p in COLD},
            "floor_s": round(floor_s, 2),
            "floor_ledgers_per_s": rate(n, floor_s),
            "ratio": ratio,
            # Less sensitive to other load on the machine than wall time: both are CPU-bound.
            "cpu_ratio": round(
                _cpu(cold, "ready", COLD)["measured_process"]
                / max(_cpu(floor, "ready", ("floor",))["measured_process"], 1e-9),
                3,
            ),
            "cpu_s": {
                "auditor": _cpu(cold, "ready", COLD),
                "floor": _cpu(floor, "ready", ("floor",)),
            },
            "all_runs_s": {
                "auditor": [round(a.seconds(*COLD), 2) for a in auditors],
                "floor": [round(f.seconds("floor"), 2) for f in floors],
            },
            "target": "auditor time <= 1.25 x floor",
            "met": ratio <= 1.25,
        },
        "scrutiny-warm": {
            "bench": "scrutiny-warm",
            **common,
            "cold_s": round(cold_s, 2),
            "cold_phases_s": {p: round(cold.seconds(p), 2) for p in COLD},
            "warm_s": round(warm_s, 2),
            "warm_phases_s": {p: round(warm.seconds(p), 2) for p in WARM},
            "cold_ledgers_per_s": auditor_rate,
            "warm_ledgers_per_s": rate(n, warm_s),
            "speedup": round(cold_s / warm_s, 2),
            "cpu_speedup": round(
                _cpu(cold, "ready", COLD)["measured_process"]
                / max(_cpu(warm, "placement", WARM)["measured_process"], 1e-9),
                2,
            ),
            "cpu_s": {
                "cold": _cpu(cold, "ready", COLD),
                "warm": _cpu(warm, "placement", WARM),
            },
            "target": "warm run >= 3 x faster than cold",
            "met": cold_s / warm_s >= 3,
        },
        "naive": {
            "bench": "naive",
            "n": naive_n,
            "of": n,
            "load_avg_before": load,
            "naive_s": round(naive_s, 2),
            "naive_ledgers_per_s": naive_rate,
            "auditor_ledgers_per_s": auditor_rate,
            "speedup": speedup,
            "cpu_s": _cpu(naive, "ready", ("naive",)),
            "how": "per ledger in turn: read its metadata, list each ensemble bookie in turn, "
            "analyse (replicas only); the first n ledgers of the walk; the auditor's rate is "
            "scrutiny's cold run (replicas and placement, index load included)",
            "target": "auditor >= 20 x faster than naive",
            "met": speedup >= 20,
        },
    }


def main() -> None:
    for figure in asyncio.run(measure(bench_n())).values():
        emit(figure)


if __name__ == "__main__":
    main()
