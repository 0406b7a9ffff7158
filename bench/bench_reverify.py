"""`reverify`: what the worker's re-verification of a mark naming a live bookie costs, against
bare reads of the same entries (issue 35 item 3).

A mark that names a bookie which is registered and lists every entry it should hold (a
deep-scrub mark, or Java's for a bookie that came back) is no longer unmarked on the
listings alone: the worker reads that bookie's share of the ledger back and checks every
digest (`auditor/worker/reverify.py`). This bench measures that path when every copy is
sound (the common case: nothing to copy, the mark goes):

* the cluster of `rereplication` (six bookie processes, `min(BENCH_N, 1,000)` closed
  E3/W2/A2 ledgers of 256 entries of 1 KiB), bookie 0 kept running; half of the ledgers
  name it, and each is marked under-replicated with bookie 0 as the replica;
* **floor**: one process, one connection to bookie 0, READ_ENTRY of bookie 0's share of
  every marked ledger, pipelined up to the bookie client's per-bookie cap, only the
  response's header and status looked at (no digest check, no ZooKeeper in the timed
  part: the entry list is computed before it);
* **ours**: a `ReplicationWorker` with the default configuration (one ledger at a time,
  the re-verification's window `rereplicationEntryBatchSize` 10), in a process of its
  own, until every mark is gone: lock, metadata, listings, re-verification (every read's
  digest checked), unmark.

They alternate BENCH_REPEAT times (the marks are written again before each of ours); the
best run of each side is the figure, CPU per entry read is the measured process's.

    python -m bench.bench_reverify floor|ours --zk HOSTS --racks FILE --lost BOOKIE ...

runs one measured side (the bench starts it; the arguments are `rereplication`'s, with
`--lost` the bookie the marks name).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from auditor.bookie.protocol import FrameParser, encode_message, read_entry_request
from auditor.logs import configure_logging
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.metadata.walk import LedgerWalker
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.worker.copy import stored_entries
from auditor.zk import ZkClient
from bench.bench_rereplication import (
    ENTRIES,
    FLOOR_WINDOW,
    LOST,
    MANAGER,
    MAX_LEDGERS,
    RereplicationCluster,
    run_bench_worker,
    run_side,
)
from bench.cluster import Measured
from bench.common import ROOT, E, W, bench_n, emit, env_int, rate, say
from bench.worker import phase

#: The extra run's options (not defaults): a window of 64 reads.
WIDE = ("--set", "rereplicationEntryBatchSize=64")
#: The bookie the marks name (bookie 0, as `rereplication`'s lost one, but running).
SUSPECT = LOST


class ReverifyCluster(RereplicationCluster):
    """`rereplication`'s cluster, its measured sides this module's."""

    side_module = "bench.bench_reverify"

    async def mark(self) -> None:
        assert self.zk is not None
        urm = UnderreplicationManager(self.zk, ROOT)
        for md in self.lost_ledgers():
            await urm.mark_underreplicated(md.ledger_id, [self.ids[SUSPECT]])


async def _share(zk: ZkClient, bookie: str, entries: int) -> list[tuple[int, int]]:
    """(ledger, entry) of every entry `bookie` holds."""
    out: list[tuple[int, int]] = []
    async for rec in LedgerWalker(zk, ROOT, MANAGER).ledgers():
        md = rec.metadata
        if md is None or bookie not in md.segments[0].bookies:
            continue
        index = md.segments[0].bookies.index(bookie)
        out += [(rec.ledger_id, e) for e in stored_entries(0, entries - 1, E, W, index)]
    return out


class _Reads(asyncio.Protocol):
    """Pipelined READ_ENTRY on one raw v3 connection, driven by the answers."""

    def __init__(self, work: list[tuple[int, int]]) -> None:
        self.work = list(reversed(work))  # popped from the end
        self.total = len(work)
        self.parser = FrameParser()
        self.transport: asyncio.Transport | None = None
        self.txn = 0
        self.ok = 0
        self.failed = 0
        self.bytes = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self) -> None:
        if not self.work:
            return
        lid, e = self.work.pop()
        self.txn += 1
        assert self.transport is not None
        self.transport.write(encode_message(read_entry_request(self.txn, lid, e)))

    def data_received(self, data: bytes) -> None:
        for payload in self.parser.feed(data):
            resp = pb.Response.FromString(payload)
            if int(resp.status) == 0:
                self.ok += 1
                self.bytes += len(resp.readResponse.body)
            else:
                self.failed += 1
            self.send()
        if self.ok + self.failed == self.total and not self.done.done():
            self.done.set_result(None)


async def floor_side(zk: ZkClient, args: argparse.Namespace) -> None:
    work = await _share(zk, args.lost, args.entries)
    reads = _Reads(work)
    host, port = args.lost.rsplit(":", 1)
    await asyncio.get_running_loop().create_connection(lambda: reads, host, int(port))
    await phase("ready", entries=len(work))
    started = time.monotonic()
    for _ in range(FLOOR_WINDOW):
        reads.send()
    await reads.done
    seconds = time.monotonic() - started
    assert reads.transport is not None
    reads.transport.close()
    await phase(
        "reverify",
        seconds=round(seconds, 4),
        entries=reads.ok,
        bytes=reads.bytes,
        failed=reads.failed,
    )


async def ours_side(zk: ZkClient, args: argparse.Namespace) -> None:
    seconds, state = await run_bench_worker(
        zk, args, lambda state: state.ledgers_found_healthy >= args.expect
    )
    await phase(
        "reverify",
        seconds=round(seconds, 4),
        entries=state.entries_reverified,
        ledgers=state.ledgers_found_healthy,
        written=state.entries_written,
        failures={str(k): v for k, v in state.failures.items()},
    )


async def side_main(args: argparse.Namespace) -> None:
    await run_side(args, floor_side, ours_side)


def _figure(m: Measured) -> dict[str, Any]:
    run = m.run.phases["reverify"]
    cpu = m.worker_cpu("ready", "reverify")
    entries = int(run["entries"])
    return {
        "s": round(float(run["seconds"]), 2),
        "entries": entries,
        "entries_per_s": rate(entries, float(run["seconds"])),
        "cpu_us_per_entry": round(cpu * 1e6 / max(entries, 1), 1),
    }


async def measure(n: int) -> dict[str, Any]:
    """`reverify`: entries read back and verified per second, against the floor's reads."""
    ledgers = min(n, MAX_LEDGERS)
    repeat = max(1, env_int("BENCH_REPEAT", 2))
    load = round(os.getloadavg()[0], 2)
    floors: list[Measured] = []
    ours: list[Measured] = []
    cluster = ReverifyCluster(ledgers)
    async with cluster:
        marked = len(cluster.lost_ledgers())
        suspect = cluster.ids[SUSPECT]
        expect = sum(
            len(list(stored_entries(0, ENTRIES - 1, E, W, md.segments[0].bookies.index(suspect))))
            for md in cluster.lost_ledgers()
        )
        for i in range(repeat):
            f = await cluster.run_side("floor", marked)
            got = f.run.phases["reverify"]
            if got["entries"] != expect or got["failed"]:
                raise RuntimeError(f"floor read {got}, expected {expect} entries")
            floors.append(f)
            say(f"reverify: floor {i + 1}/{repeat}: {got['seconds']:.1f} s")
            await cluster.mark()
            o = await cluster.run_side("ours", marked)
            got = o.run.phases["reverify"]
            if got["entries"] != expect or got["ledgers"] != marked or got["written"]:
                raise RuntimeError(f"ours re-verified {got}, expected {expect} entries")
            ours.append(o)
            say(f"reverify: ours {i + 1}/{repeat}: {got['seconds']:.1f} s")
        # Not the figure: the same with a window of 64 reads, to tell the window's
        # round trips from per-entry cost.
        await cluster.mark()
        wide = await cluster.run_side("ours", marked, *WIDE)
        if wide.run.phases["reverify"]["entries"] != expect:
            raise RuntimeError(f"ours {WIDE} re-verified {wide.run.phases['reverify']}")
        say(f"reverify: ours, {' '.join(WIDE)}: {wide.run.phases['reverify']['seconds']:.1f} s")
    fl = _figure(min(floors, key=lambda m: float(m.run.phases["reverify"]["seconds"])))
    us = _figure(min(ours, key=lambda m: float(m.run.phases["reverify"]["seconds"])))
    ratio = round(us["entries_per_s"] / fl["entries_per_s"], 3) if fl["entries_per_s"] else 0.0
    return {
        "bench": "reverify",
        "ledgers": ledgers,
        "ledgers_marked": marked,
        "entries_per_ledger": ENTRIES,
        "runs": repeat,
        "load_avg_before": load,
        "load_avg_after": round(os.getloadavg()[0], 2),
        "ours": us,
        "floor": fl,
        "ours_ledgers_per_s": rate(marked, us["s"]),
        "ours_wide": {"options": " ".join(WIDE), **_figure(wide)},
        "ratio": ratio,
        "ratio_of": "entries_per_s",
        "all_runs_s": {
            "ours": [_figure(m)["s"] for m in ours],
            "floor": [_figure(m)["s"] for m in floors],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_reverify")
    parser.add_argument("side", nargs="?", choices=["floor", "ours"])
    parser.add_argument("--zk")
    parser.add_argument("--racks")
    parser.add_argument("--lost")
    parser.add_argument("--target")
    parser.add_argument("--expect", type=int, default=0)
    parser.add_argument("--entries", type=int, default=ENTRIES)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.side is None:
        emit(asyncio.run(measure(bench_n())))
        return
    configure_logging("json", level="WARNING")
    out = os.environ.get("BENCH_CPROFILE")
    if not out:
        asyncio.run(side_main(args))
        return
    # As `rereplication`: cProfile in process CPU time, one file per side (not a figure).
    import cProfile
    from pathlib import Path

    with cProfile.Profile(time.process_time) as prof:
        asyncio.run(side_main(args))
    wide = "-wide" if args.set else ""
    prof.dump_stats(str(Path(out) / f"reverify-{args.side}{wide}.pstats"))


if __name__ == "__main__":
    main()
