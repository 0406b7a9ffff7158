"""Replicas check over N closed ledgers (default 100,000; E=3, W=2, A=2; 6 bookies).

Prints the rate and how resident memory evolves as the check goes through the
ledgers: after a quarter of them and at the end. Flat memory means the
difference stays small while the ledger count quadruples. Bookies and
ZooKeeper run in another process (bench/cluster_host.py). Set
BENCH_REPLICAS_LEDGERS to change N.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time

from auditor.checks.context import open_context
from auditor.checks.replicas_run import ReplicasRun
from auditor.config import load_config
from auditor.logs import configure_logging
from auditor.metadata.layout import LedgerManager
from auditor.zk import ZkClient


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def measure(hosts: str, n: int) -> dict[str, object]:
    config = load_config(None, ["checks.progress_interval=3600"])
    samples: list[tuple[int, int]] = []
    async with (
        ZkClient(hosts, timeout=60) as zk,
        open_context(zk, "/ledgers", LedgerManager.HIERARCHICAL, config) as ctx,
    ):
        run = ReplicasRun(ctx)
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                samples.append((run.walker.stats.ledgers, rss()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)

        sampler = asyncio.ensure_future(sample())
        t0 = time.monotonic()
        report = await run.run()
        elapsed = time.monotonic() - t0
        stop.set()
        await sampler
    quarter = next((r for done, r in samples if done >= n // 4), samples[-1][1])
    peak = max(r for _, r in samples)
    return {
        "bench": "replicas",
        "ledgers": n,
        "checked": report.ledgers_checked,
        "violations": len(report.violations),
        "seconds": round(elapsed, 1),
        "ledgers_per_s": round(report.ledgers_checked / elapsed, 1),
        "rss_at_quarter_mb": round(quarter / 2**20, 1),
        "rss_peak_mb": round(peak / 2**20, 1),
        "rss_growth_after_quarter_mb": round((peak - quarter) / 2**20, 1),
    }


def main() -> None:
    n = int(os.environ.get("BENCH_REPLICAS_LEDGERS", "100000"))
    configure_logging(level=30)
    host = subprocess.Popen(
        [sys.executable, "-m", "bench.cluster_host", str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout is not None
        ready = json.loads(host.stdout.readline())
        print(json.dumps(asyncio.run(measure(ready["zk"], n))), flush=True)
    finally:
        if host.stdin is not None:
            host.stdin.close()
        host.wait(timeout=60)


if __name__ == "__main__":
    main()
