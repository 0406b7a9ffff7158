"""`bookie-load`: what the auditor asks of the bookies, counted by the bookies themselves.

A cluster of N ledgers whose bookies answer after BENCH_LATENCY_MS (default
5 ms), so requests pile up in flight as they would against disks and a
network; without latency an emulator answers each request as soon as it
reads it and in-flight counts say nothing. On it:

* the auditor (index load, replicas, placement, then both checks warm) with
  the default configuration: every phase's requests per (ledger, bookie)
  and per operation, and the most in flight at each bookie;
* the replicas check with 2,000 ledgers at once, so that the demand on each
  bookie (about 1,000 requests) is far above the cap, with the default cap
  and with a cap of 16: the cap, not the demand, must bound what a bookie sees;
* the naive sequential check (`naive-latency`): on loopback without latency
  a sequential check pays no waits and only CPU separates it from the
  auditor, so `naive` alone says little about what overlapping requests is
  worth; with latency it does. Compared with the auditor's cold run here.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Any

from auditor.config import ChecksConfig
from bench.cluster import BenchCluster, Measured
from bench.common import bench_n, emit, env_int, rate, say

LIST = "get_list_of_entries_of_ledger"
AUDITOR_PHASES = ("index", "replicas", "placement", "warm-replicas", "warm-placement")
LISTING_PHASES = ("replicas", "warm-replicas")
HIGH_CONCURRENCY = 2000
SMALL_CAP = 16


def _pairs(counters: list[dict[str, Any]]) -> int:
    """(ledger, bookie) pairs of the cluster: every bookie holds the ledgers it is in."""
    return sum(int(s["ledgers"]) for s in counters)


def _requests(counters: list[dict[str, Any]]) -> int:
    return sum(sum(s["received"].values()) for s in counters)


def _one_list_each(counters: list[dict[str, Any]]) -> bool:
    """Each bookie got exactly one list request for each ledger it holds."""
    return all(
        s["lists_per_ledger"] == {"1": s["ledgers"]} and s["ledgers_listed"] == s["ledgers"]
        for s in counters
    )


def _by_operation(counters: list[dict[str, Any]]) -> dict[str, int]:
    """Requests received by all bookies together, per operation."""
    total: Counter[str] = Counter()
    for s in counters:
        total.update(s["received"])
    return dict(sorted(total.items()))


def _max_in_flight(m: Measured, phase: str) -> list[int]:
    return [int(s["max_in_flight"]) for s in m.counters[phase]]


async def measure(n: int) -> list[dict[str, Any]]:
    latency = float(env_int("BENCH_LATENCY_MS", 5))
    cap = ChecksConfig().bookie_max_in_flight
    naive_n = min(n, env_int("BENCH_NAIVE_N", 2000))
    load = round(os.getloadavg()[0], 2)
    async with BenchCluster(n, latency_ms=latency) as cluster:
        auditor = await cluster.measure("auditor", "--warm")
        say("bookie-load: auditor done")
        high = await cluster.measure(
            "replicas", "--set", f"checks.ledger_concurrency={HIGH_CONCURRENCY}"
        )
        say("bookie-load: replicas with high concurrency done")
        small = await cluster.measure(
            "replicas",
            "--set",
            f"checks.ledger_concurrency={HIGH_CONCURRENCY}",
            "--set",
            f"checks.bookie_max_in_flight={SMALL_CAP}",
        )
        say("bookie-load: replicas with a small cap done")
        naive = await cluster.measure("naive", "--limit", str(naive_n), counters=False)
        say("bookie-load: naive done")
    pairs = _pairs(auditor.counters["replicas"])
    per_phase = {p: round(_requests(auditor.counters[p]) / pairs, 6) for p in AUDITOR_PHASES}
    by_operation = {p: _by_operation(auditor.counters[p]) for p in AUDITOR_PHASES}
    one_list = all(_one_list_each(auditor.counters[p]) for p in LISTING_PHASES)
    one_list = one_list and not any(
        by_operation[p].get(LIST) for p in AUDITOR_PHASES if p not in LISTING_PHASES
    )
    seen = {
        f"auditor, ledger_concurrency=100, cap {cap}": (
            [
                max(_max_in_flight(auditor, p)[i] for p in AUDITOR_PHASES)
                for i in range(len(auditor.counters["replicas"]))
            ],
            cap,
        ),
        f"replicas, ledger_concurrency={HIGH_CONCURRENCY}, cap {cap}": (
            _max_in_flight(high, "replicas"),
            cap,
        ),
        f"replicas, ledger_concurrency={HIGH_CONCURRENCY}, cap {SMALL_CAP}": (
            _max_in_flight(small, "replicas"),
            SMALL_CAP,
        ),
    }
    under_cap = all(max(per_bookie) <= limit for per_bookie, limit in seen.values())
    cold_s = auditor.seconds("index", "replicas", "placement")
    naive_rate = rate(naive_n, naive.seconds("naive"))
    speedup = round(rate(n, cold_s) / naive_rate, 1) if naive_rate else 0.0
    naive_figure = {
        "bench": "naive-latency",
        "n": naive_n,
        "of": n,
        "latency_ms": latency,
        "load_avg_before": load,
        "naive_s": round(naive.seconds("naive"), 2),
        "naive_ledgers_per_s": naive_rate,
        "auditor_s": round(cold_s, 2),
        "auditor_ledgers_per_s": rate(n, cold_s),
        "speedup": speedup,
        "how": "as naive, on bookies that answer after latency_ms; the auditor's rate is its "
        "cold run (index load, replicas, placement) on the same cluster",
        "target": "auditor >= 20 x faster than naive",
        "met": speedup >= 20,
    }
    return [
        {
            "bench": "bookie-load",
            "n": n,
            "latency_ms": latency,
            "load_avg_before": load,
            "ledger_bookie_pairs": pairs,
            "requests_per_ledger_bookie": per_phase,
            "requests_by_operation": by_operation,
            "list_requests_per_ledger": {
                p: [s["lists_per_ledger"] for s in auditor.counters[p]] for p in LISTING_PHASES
            },
            "other_runs_requests_by_operation": {
                "replicas_high_concurrency": _by_operation(high.counters["replicas"]),
                "replicas_small_cap": _by_operation(small.counters["replicas"]),
            },
            "max_in_flight_per_bookie": {k: v[0] for k, v in seen.items()},
            "target": "exactly one list request per (ledger, bookie) per replicas run; "
            "in-flight never above the cap",
            "met_one_list": one_list,
            "met_cap": under_cap,
            "met": one_list and under_cap,
        },
        naive_figure,
    ]


def main() -> None:
    for figure in asyncio.run(measure(bench_n())):
        emit(figure)


if __name__ == "__main__":
    main()
