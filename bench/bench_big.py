"""`memory-1m` and `failover-1m`: the auditor at BENCH_BIG_N ledgers (default 1,000,000).

One cluster of BENCH_BIG_N closed ledgers (the shape of every bench cluster;
ZooKeeper's heap is sized for it by `BenchZooKeeper`) serves both figures, so
it is written once:

* `memory-1m`: the auditor as the leader runs it (bench/worker.py `auditor`:
  index load, then the replicas and placement checks over the index) in a
  process of its own; its peak RSS (VmHWM) and the index's bytes per ledger
  as the index measures itself. Every check must find all ledgers clean.
* `failover-1m`: bench/bench_failover.py's figure on the same cluster: two
  daemons, the follower's standby index loaded (where the daemon keeps one),
  SIGKILL of the leader during its first check, seconds to the new leader's
  first check task.

BENCH_BIG_N=50000 makes a quick run.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from bench import bench_failover
from bench.cluster import BenchCluster, Measured
from bench.common import emit, env_int, say

MB = 2**20
INDEX_TARGET = 200


def big_n() -> int:
    return env_int("BENCH_BIG_N", 1_000_000)


def _memory(m: Measured, n: int, load: float) -> dict[str, Any]:
    index = m.run.phases["index"]
    for p in ("replicas", "placement"):
        if m.run.phases[p]["ledgers_checked"] != n or m.run.phases[p]["violations"]:
            raise RuntimeError(f"memory at {n}: {p} {m.run.phases[p]}")
    if index["ledgers"] != n:
        raise RuntimeError(f"memory at {n}: index {index}")
    peak = m.run.done["maxrss_kb"] * 1024
    index_bytes = index["bytes_per_ledger"] * index["ledgers"]
    per_ledger = index["bytes_per_ledger"]
    return {
        "bench": "memory-1m",
        "n": n,
        "load_avg_before": load,
        "peak_rss_mb": round(peak / MB, 1),
        "rss_before_work_mb": round(m.run.phases["ready"]["rss_kb"] / 1024, 1),
        "peak_after_index_load_mb": round(index["maxrss_kb"] / 1024, 1),
        "index_bytes_per_ledger": per_ledger,
        "index_mb": round(index_bytes / MB, 1),
        "beyond_index_mb": round((peak - index_bytes) / MB, 1),
        "phases_s": {p: round(m.seconds(p), 2) for p in ("index", "replicas", "placement")},
        "how": "bench/worker.py auditor: index load, replicas and placement over the index",
        "target": f"index <= {INDEX_TARGET} bytes per ledger",
        "met": per_ledger <= INDEX_TARGET,
    }


async def measure(n: int | None = None, wanted: set[str] | None = None) -> list[dict[str, Any]]:
    n = big_n() if n is None else n
    wanted = {"memory-1m", "failover-1m"} if wanted is None else wanted
    figures: list[dict[str, Any]] = []
    say(f"big: a cluster of {n} ledgers (BENCH_BIG_N)")
    async with BenchCluster(n) as cluster:
        if "memory-1m" in wanted:
            load = round(os.getloadavg()[0], 2)
            m = await cluster.measure("auditor", counters=False)
            figures.append(_memory(m, n, load))
            say(f"memory-1m: {figures[-1]}")
        if "failover-1m" in wanted:
            figures.append(await bench_failover.run_on(cluster, n, "failover-1m"))
    return figures


def main() -> None:
    for figure in asyncio.run(measure()):
        emit(figure)


if __name__ == "__main__":
    main()
