"""`make bench`: every benchmark, one JSON line per figure on stdout, progress on stderr.

    BENCH_N=100000 BENCH_ONLY=scrutiny,memory python -m bench

Figures: codec, floor, replicas-cold, placement, index-load, warm-replicas,
naive, memory, bookie-load, naive-latency, failover, memory-1m, failover-1m,
rereplication, rereplication-64k, rereplication-small, scrub, scrub-64k, etcd-floor,
etcd-replicas,
spark, marks, compiled-pieces. BENCH_ONLY picks some (by figure name, or by
benchmark name for all its figures: scrutiny, big, etcd, rereplication-all); a
benchmark whose figures are all left out does not run. The first line
describes the machine.
Each benchmark sets up its own cluster and tears it down; one that fails
prints `{"bench": ..., "error": ...}` and the others still run; the exit
status is then 1. Knobs: BENCH_N (ledgers, default 100,000), BENCH_REPEAT
(floor/auditor alternations, default 2), BENCH_NAIVE_N (default 2,000),
BENCH_LATENCY_MS (bookie-load, default 5), BENCH_SESSION_TIMEOUT (failover,
default 6), BENCH_BIG_N (memory-1m and failover-1m, default 1,000,000),
BENCH_ETCD_N (etcd-floor and etcd-replicas, default BENCH_N), BENCH_ETCD_PAGE
(keys a range read of the etcd floor asks for, default 1,000), BENCH_MARKS_N
(under-replication marks of `marks`, default 100,000), BENCH_SMALL_N
(ledgers of `rereplication-small`, half re-replicated, default 2,000), BENCH_MARKS_SRC
(`marks`: the source tree whose CLI is timed, default this one). BENCH_COMPILED=1 first
compiles pyproject.toml's mypyc modules in place (`python -m bench.compiled`), runs, and
removes them again; the machine line says which modules were compiled.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

from bench import (
    bench_big,
    bench_bookie_load,
    bench_codec,
    bench_compiled,
    bench_etcd,
    bench_failover,
    bench_marks,
    bench_memory,
    bench_rereplication,
    bench_reverify,
    bench_scrub,
    bench_scrutiny,
    bench_small_ledgers,
    bench_spark,
)
from bench import compiled as compiled_build
from bench.common import bench_n, emit, machine, say

Figures = list[dict[str, Any]]


def _codec(n: int) -> Figures:
    return list(bench_codec.figures())


def _scrutiny(n: int) -> Figures:
    return list(asyncio.run(bench_scrutiny.measure(n)).values())


def _memory(n: int) -> Figures:
    return [asyncio.run(bench_memory.measure(n))]


def _bookie_load(n: int) -> Figures:
    return asyncio.run(bench_bookie_load.measure(n))


def _failover(n: int) -> Figures:
    return [asyncio.run(bench_failover.measure(n))]


def _big(n: int) -> Figures:
    return asyncio.run(bench_big.measure(wanted=selected()))


def _rereplication(n: int) -> Figures:
    wanted = selected()
    out: Figures = []
    if "rereplication" in wanted:
        out.append(asyncio.run(bench_rereplication.measure(n)))
    if "rereplication-64k" in wanted:
        out.append(asyncio.run(bench_rereplication.measure_64k(n)))
    return out


def _small_ledgers(n: int) -> Figures:
    return [asyncio.run(bench_small_ledgers.measure(bench_small_ledgers.small_n()))]


def _scrub(n: int) -> Figures:
    wanted = selected()
    out: Figures = []
    if "scrub" in wanted:
        out.append(asyncio.run(bench_scrub.measure(n)))
    if "scrub-64k" in wanted:
        out.append(asyncio.run(bench_scrub.measure_64k(n)))
    return out


def _etcd(n: int) -> Figures:
    return asyncio.run(bench_etcd.measure(bench_etcd.bench_etcd_n()))


def _spark(n: int) -> Figures:
    return bench_spark.measure(n)


def _marks(n: int) -> Figures:
    return [asyncio.run(bench_marks.measure(bench_marks.bench_marks_n()))]


def _compiled_pieces(n: int) -> Figures:
    return [bench_compiled.run_child(n)]


#: Benchmarks in the order they run, each with the figures it produces.
BENCHMARKS: list[tuple[str, tuple[str, ...], Callable[[int], Figures]]] = [
    ("codec", ("codec",), _codec),
    (
        "scrutiny",
        ("floor", "replicas-cold", "placement", "index-load", "warm-replicas", "naive"),
        _scrutiny,
    ),
    ("memory", ("memory",), _memory),
    ("bookie-load", ("bookie-load", "naive-latency"), _bookie_load),
    ("failover", ("failover",), _failover),
    ("big", ("memory-1m", "failover-1m"), _big),
    ("rereplication-all", ("rereplication", "rereplication-64k"), _rereplication),
    ("rereplication-small", ("rereplication-small",), _small_ledgers),
    ("scrub", ("scrub", "scrub-64k"), _scrub),
    ("etcd", ("etcd-floor", "etcd-replicas"), _etcd),
    ("spark", ("spark",), _spark),
    ("marks", ("marks",), _marks),
    ("compiled", ("compiled-pieces",), _compiled_pieces),
    ("reverify", ("reverify",), lambda n: [asyncio.run(bench_reverify.measure(n))]),
]
FIGURES = [f for _, figures, _ in BENCHMARKS for f in figures]


def selected() -> set[str]:
    """The figures BENCH_ONLY names; a benchmark's name (`scrutiny`, `big`) stands for all
    of its figures."""
    raw = os.environ.get("BENCH_ONLY", "")
    wanted = {name.strip() for name in raw.split(",") if name.strip()}
    for name, figures, _ in BENCHMARKS:
        if name in wanted:
            wanted = (wanted - {name}) | set(figures)
    unknown = wanted - set(FIGURES)
    if unknown:
        raise SystemExit(f"BENCH_ONLY: unknown {sorted(unknown)}; figures are {FIGURES}")
    return wanted or set(FIGURES)


def run() -> int:
    # SIGTERM stops like Ctrl-C: clusters are torn down (processes stopped, files removed).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    wanted = selected()
    n = bench_n()
    compiled = os.environ.get("BENCH_COMPILED", "") == "1"
    if compiled:
        say("compiling pyproject.toml's mypyc modules in place (BENCH_COMPILED=1)")
        compiled_build.build(compiled_build.listed_modules())
    try:
        emit({"bench": "machine", **machine(), "compiled": compiled_build.compiled_modules()})
        return _run(wanted, n)
    finally:
        if compiled:
            compiled_build.clean()


def _run(wanted: set[str], n: int) -> int:
    failed = False
    for name, figures, bench in BENCHMARKS:
        if not wanted & set(figures):
            continue
        say(f"{name}: starting (n={n})")
        try:
            for figure in bench(n):
                if figure["bench"] in wanted:
                    emit(figure)
        except Exception as exc:
            failed = True
            traceback.print_exc(file=sys.stderr)
            emit({"bench": name, "error": f"{type(exc).__name__}: {exc}"})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run())
