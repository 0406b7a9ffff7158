"""The measured process: one auditor workload against a running bench cluster, nothing else.

    python -m bench.worker TASK --zk HOST:PORT --racks FILE [--set KEY=VALUE ...]
        [--limit N] [--warm]

TASK is one of:

* `auditor`: what the leader does: load the metadata index (one ZooKeeper
  walk), then the replicas and the placement checks over it; with `--warm`
  the two checks once more with the index already loaded.
* `floor`: bench/floor.py: the same ZooKeeper listings and reads and one
  list request per (ledger, ensemble bookie) with raw kazoo and one raw
  socket per bookie, nothing analysed; then its ZooKeeper reads alone and
  its bookie requests alone. No auditor can issue the same I/O faster.
* `naive`: what a user would write: per ledger in turn, read its metadata,
  ask each ensemble bookie in turn, analyse; `--limit` ledgers only.
* `replicas`: the replicas check alone, walking ZooKeeper (no index).

The worker runs in a process of its own so that its peak RSS and CPU time
are the workload's alone: the cluster, its writer and the bench's
bookkeeping live elsewhere. It prints one JSON line
per phase on stdout and then waits for a line on stdin before going on, so
the bench can read the bookies' counters and the cluster's CPU between
phases; the last line has `"phase": "done"` with the process's peak RSS
(VmHWM, see `usage`) and CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from auditor.bookie.availability import EMPTY
from auditor.bookie.client import BookieClient
from auditor.bookie.protocol import Status
from auditor.bookie.results import ErrorStatus, Ok
from auditor.bookie.tls import bookie_tls
from auditor.checks.context import CheckContext, open_context
from auditor.checks.findings import CheckReport
from auditor.checks.placement_run import run_placement_check
from auditor.checks.replicas import BookieAnswer, Listed, Unanswered, analyse, expectations
from auditor.checks.replicas_run import run_replicas_check
from auditor.config import AuditorConfig, load_config
from auditor.index.store import MetadataIndex
from auditor.index.sync import IndexSync
from auditor.logs import configure_logging
from auditor.metadata.layout import LedgerManager
from auditor.metadata.registry import resolve_bookie
from auditor.metadata.walk import LedgerWalker
from auditor.zk import ZkClient

ROOT = "/ledgers"
MANAGER = LedgerManager.HIERARCHICAL


def status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def usage() -> dict[str, Any]:
    """Peak and current RSS, and CPU seconds so far, of this process.

    The peak is VmHWM, the high-water mark of this process's own address
    space. `ru_maxrss` would be wrong here: Linux carries it across fork and
    exec, so a child's starts at its parent's RSS at the fork (the bench
    process, which has just built a cluster of 3N ledgers).
    """
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "maxrss_kb": status_kb("VmHWM"),
        "rss_kb": status_kb("VmRSS"),
        "cpu_s": round(ru.ru_utime + ru.ru_stime, 3),
    }


async def phase(name: str, **fields: Any) -> None:
    """Reports a phase and waits for the bench to say go on."""
    print(json.dumps({"phase": name, "pid": os.getpid(), **fields, **usage()}), flush=True)
    await asyncio.to_thread(sys.stdin.readline)


def report_fields(report: CheckReport) -> dict[str, Any]:
    return {
        "ledgers_checked": report.ledgers_checked,
        "violations": report.violations.total,
        "skipped": dict(report.ledgers_skipped),
    }


async def timed(
    name: str, ctx: CheckContext, run: Callable[[CheckContext], Awaitable[CheckReport]]
) -> None:
    started = time.monotonic()
    report = await run(ctx)
    await phase(name, seconds=round(time.monotonic() - started, 4), **report_fields(report))


async def auditor(zk: ZkClient, config: AuditorConfig, warm: bool) -> None:
    async with open_context(zk, ROOT, MANAGER, config) as ctx:
        sync = IndexSync(
            zk,
            MetadataIndex(ROOT, MANAGER),
            concurrency=config.checks.walk_window,
            log=ctx.log,
        )
        await phase("ready")
        started = time.monotonic()
        task = asyncio.ensure_future(sync.run())
        try:
            if not await sync.usable():
                raise RuntimeError(f"the index did not load: {sync.failed}")
            ctx.index = sync
            index = sync.index
            await phase(
                "index",
                seconds=round(time.monotonic() - started, 4),
                ledgers=len(index),
                bytes_per_ledger=round(index.bytes_per_ledger(), 1),
            )
            await timed("replicas", ctx, run_replicas_check)
            await timed("placement", ctx, run_placement_check)
            if warm:
                await timed("warm-replicas", ctx, run_replicas_check)
                await timed("warm-placement", ctx, run_placement_check)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def replicas_only(zk: ZkClient, config: AuditorConfig) -> None:
    async with open_context(zk, ROOT, MANAGER, config) as ctx:
        await phase("ready")
        await timed("replicas", ctx, run_replicas_check)


def bookie_client(zk: ZkClient, config: AuditorConfig) -> BookieClient:
    """A client built exactly as `open_context` builds the checks' one."""

    async def resolve(bookie_id: str) -> tuple[str, int] | None:
        return await resolve_bookie(zk, ROOT, bookie_id)

    return BookieClient(
        resolve,
        request_timeout=config.read_timeout,
        max_in_flight=config.checks.bookie_max_in_flight,
        list_capability_ttl=config.checks.list_capability_ttl,
        tls=bookie_tls(config.bookkeeper),
    )


async def naive(zk: ZkClient, config: AuditorConfig, limit: int) -> None:
    client = bookie_client(zk, config)
    try:
        await phase("ready")
        started = time.monotonic()
        walker = LedgerWalker(zk, ROOT, MANAGER)
        ledgers = violations = 0
        paths = walker.ledger_paths()
        async for ledger_id, path in paths:
            if ledgers >= limit:
                break
            ledgers += 1
            rec = await walker.read(ledger_id, path)
            if rec is None or rec.metadata is None:
                continue
            md = rec.metadata
            answers: dict[str, BookieAnswer] = {}
            for bookie in sorted({exp.bookie for exp in expectations(md)}):
                out = await client.get_list_of_entries(bookie, ledger_id)
                if isinstance(out, Ok):
                    answers[bookie] = Listed(out.value)
                elif isinstance(out, ErrorStatus) and out.status is Status.ENOLEDGER:
                    answers[bookie] = Listed(EMPTY)
                else:
                    answers[bookie] = Unanswered(str(out))
            verdict = analyse(md, answers)
            if verdict.category is not None or verdict.unanswered:
                violations += 1
        await paths.aclose()
        await phase(
            "naive",
            seconds=round(time.monotonic() - started, 4),
            ledgers=ledgers,
            violations=violations,
        )
    finally:
        await client.close()


async def run(args: argparse.Namespace) -> None:
    sets = ["checks.progress_interval=3600", f"checks.racks_file={args.racks}", *args.set]
    config = load_config(None, sets)
    async with ZkClient(args.zk, timeout=60) as zk:
        if args.task == "auditor":
            await auditor(zk, config, args.warm)
        elif args.task == "naive":
            await naive(zk, config, args.limit)
        else:
            await replicas_only(zk, config)
    print(json.dumps({"phase": "done", **usage()}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker")
    parser.add_argument("task", choices=["auditor", "floor", "naive", "replicas"])
    parser.add_argument("--zk", required=True)
    parser.add_argument("--racks", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument("--warm", action="store_true")
    configure_logging("json", level="WARNING")
    args = parser.parse_args()
    if args.task == "floor":
        from bench import floor  # raw kazoo and sockets, no event loop

        floor.main(args)
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
