"""The daemon's continuous scrub runs `ScrubRun` a chunk of ledgers at a time, writing its
record after each; what that costs is the difference from one `ScrubRun` over the same
ledgers (`check scrub`'s path, the cheapest code doing the same reads), so the two are run
alternately on one cluster: a real ZooKeeper and three emulated bookies, unpaced.

`python -m bench.scrub_daemon_chunks LEDGERS ENTRIES [ROUNDS]`: wall time and CPU per ledger
of each side, each round (CPU includes the emulated bookies, in this process on both sides).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import sys
import time

import auditor
from auditor.checks.findings import Check
from auditor.checks.scrub_progress_store import progress_path
from auditor.checks.scrub_run import run_scrub_check
from auditor.daemon.scrub_cycle import ScrubCycle
from auditor.daemon.state import DaemonState, RunOutcome, RunState
from auditor.store import NoNodeError
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.zkserver import ZooKeeperServer
from auditor.zk import ZkClient

OVERRIDES = ["scrub.bytes_per_second=0", "checks.retry_delay=0.1"]


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def one_run(tc: TestCluster, ledgers: int) -> None:
    async with tc.context(overrides=OVERRIDES) as ctx:
        report = await run_scrub_check(ctx)
    assert report.ledgers_checked == ledgers


async def chunked(tc: TestCluster, zk: ZkClient, ledgers: int) -> None:
    with contextlib.suppress(NoNodeError):
        await zk.delete(progress_path("/ledgers"))
    state = DaemonState("bench")
    state.scrub_scheduled(True)
    cycle_done = asyncio.Event()

    def reported(check: Check, outcome: RunOutcome) -> None:
        if state.scrub is not None and state.scrub.finished is not None:
            cycle_done.set()

    async def ready() -> None:
        return None

    def scheduled(check: Check, what: RunState, at: float | None) -> None:
        return None

    async with tc.context(overrides=OVERRIDES, mark=True) as ctx:
        cycle = ScrubCycle(ctx, state, ready=ready, on_report=reported, on_state=scheduled)
        task = asyncio.ensure_future(cycle.run())
        try:
            await asyncio.wait_for(cycle_done.wait(), 600)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert state.scrub is not None and state.scrub.ledgers == ledgers


async def main(ledgers: int, entries: int, rounds: int) -> None:
    print("auditor from", auditor.__file__)
    server = ZooKeeperServer()
    server.start()
    try:
        async with ZkClient(server.hosts, timeout=10.0) as zk, test_cluster(zk, 3) as tc:
            for lid in range(1, ledgers + 1):
                await tc.writer.write_ledger(lid, tc.ids, write_quorum=2, num_entries=entries)
            for n in range(rounds):
                for name, side in (
                    ("one run", one_run(tc, ledgers)),
                    ("chunked", chunked(tc, zk, ledgers)),
                ):
                    c0, t0 = cpu(), time.perf_counter()
                    await side
                    wall, used = time.perf_counter() - t0, cpu() - c0
                    print(
                        f"round {n} {name}: {wall:.3f} s wall, "
                        f"{used / ledgers * 1e3:.3f} ms CPU/ledger"
                    )
    finally:
        server.destroy()


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(args[0], args[1], args[2] if len(args) > 2 else 3))
