"""`spark`: bench/bench_scan.py's figures (`bk-auditor scan`, asyncio engine against Spark)
as JSON lines.

bench_scan is its own program (it prints a report for people, and its
figures as one JSON document to the file BENCH_SCAN_JSON names). It runs
here as a child whose stdout goes to our stderr, with N as its ledger count
(unless BENCH_SCAN_LEDGERS is set), and its document becomes one line per
run and one per Spark session probe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import bench_n, emit


def to_figures(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One figure per scan run (with its mode's description: slots, workers, memory), per
    Spark session probe, and one of the set-up (the cluster's build, the standalone
    clusters' start, the archive's packing); the counts ride along on the first."""
    shared = {"ledgers": doc.get("ledgers"), "checks": doc.get("checks")}
    modes = doc.get("modes", {})
    figures: list[dict[str, Any]] = []
    for run in doc.get("runs", []):
        mode = {"mode_is": modes[run["mode"]]} if run.get("mode") in modes else {}
        figures.append({"bench": "spark", "figure": "scan", **shared, **mode, **run})
    for master, probe in sorted(doc.get("spark_probe", {}).items()):
        figures.append({"bench": "spark", "figure": "session", "master": master, **probe})
    if doc.get("setup"):
        figures.append({"bench": "spark", "figure": "setup", **shared, **doc["setup"]})
    if figures and "counts" in doc:
        figures[0]["counts"] = doc["counts"]
    return figures


def measure(n: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        out = Path(tmp) / "scan.json"
        env = dict(os.environ, BENCH_SCAN_JSON=str(out))
        env.setdefault("BENCH_SCAN_LEDGERS", str(n))
        done = subprocess.run(
            [sys.executable, "-m", "bench.bench_scan"],
            stdout=sys.stderr,
            stdin=subprocess.DEVNULL,
            env=env,
            check=False,
        )
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"bench.bench_scan exited {done.returncode} without its figures")
        doc: dict[str, Any] = json.loads(out.read_text())
    return to_figures(doc)


def main() -> None:
    for figure in measure(bench_n()):
        emit(figure)


if __name__ == "__main__":
    main()
