"""`memory`: the auditor's peak RSS at N and at 3N ledgers, and what the index costs.

Each size gets its own cluster, and the auditor runs in a process of its own
(bench/worker.py: index load, replicas and placement over the index, both
once more warm), so its peak RSS (VmHWM; not `ru_maxrss`, which a child
inherits from its parent) is the auditor's and nothing else's.
Everything but the index is meant to stay flat in the number of ledgers (the
walks stream, only ids of ledgers waiting for a retry are kept), so the
target compares the peaks with the index taken out: the index's own size is
`bytes_per_ledger() x ledgers`, as the index measures itself.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from bench.cluster import BenchCluster
from bench.common import bench_n, emit, say

MB = 2**20


async def at(n: int) -> dict[str, Any]:
    async with BenchCluster(n) as cluster:
        m = await cluster.measure("auditor", "--warm", counters=False)
    index = m.run.phases["index"]
    for p in ("replicas", "placement", "warm-replicas", "warm-placement"):
        if m.run.phases[p]["ledgers_checked"] != n or m.run.phases[p]["violations"]:
            raise RuntimeError(f"memory at {n}: {p} {m.run.phases[p]}")
    peak = m.run.done["maxrss_kb"] * 1024
    index_bytes = index["bytes_per_ledger"] * index["ledgers"]
    figure = {
        "ledgers": index["ledgers"],
        "peak_rss_mb": round(peak / MB, 1),
        "rss_before_work_mb": round(m.run.phases["ready"]["rss_kb"] / 1024, 1),
        "peak_after_index_load_mb": round(index["maxrss_kb"] / 1024, 1),
        "index_bytes_per_ledger": index["bytes_per_ledger"],
        "index_mb": round(index_bytes / MB, 1),
        "beyond_index_mb": round((peak - index_bytes) / MB, 1),
    }
    say(f"memory at {n}: {figure}")
    return figure


async def measure(n: int) -> dict[str, Any]:
    load = round(os.getloadavg()[0], 2)
    one = await at(n)
    three = await at(3 * n)
    ratio = round(three["beyond_index_mb"] / one["beyond_index_mb"], 3)
    worst_index = max(one["index_bytes_per_ledger"], three["index_bytes_per_ledger"])
    return {
        "bench": "memory",
        "n": n,
        "load_avg_before": load,
        "at_n": one,
        "at_3n": three,
        "peak_ratio": round(three["peak_rss_mb"] / one["peak_rss_mb"], 3),
        "beyond_index_ratio": ratio,
        "index_bytes_per_ledger": worst_index,
        "target": "peak RSS beyond the index at 3N <= 1.1 x at N; index <= 200 bytes per ledger",
        "met_rss": ratio <= 1.1,
        "met_index": worst_index <= 200,
        "met": ratio <= 1.1 and worst_index <= 200,
    }


def main() -> None:
    emit(asyncio.run(measure(bench_n())))


if __name__ == "__main__":
    main()
