"""`scrub`, `scrub-64k`: how fast the deep scrub reads and verifies every copy, against
bare entry reads of the same copies from the same bookies in the same run.

The deep scrub (`bk-auditor check scrub`, auditor/checks/scrub_run.py) reads every entry
from every bookie of its write set and checks each copy's digest. What it cannot do
faster than is asking for those copies and taking the answers in, so that is the floor.

One cluster (`rereplication`'s: real ZooKeeper, six bookie processes seeded from files,
their bodies built on read with a CRC32C digest), every bookie up, closed E3/W2/A2
ledgers, every copy where its write set says (the cluster is clean: the scrub must find
nothing):

* `scrub`: `min(BENCH_N, 200)` ledgers of 256 entries of 1 KiB payloads (a typical
  small Pulsar batch): 102,400 copies; the figure that counts per entry;
* `scrub-64k`: `min(BENCH_N, 100)` ledgers of 64 entries of 64 KiB payloads: 12,800
  copies, 839 MB of payload; the figure that counts per byte.

Both sides run in a process of their own, alternating BENCH_REPEAT times (default 2);
each side's best run is the figure:

* **floor**: the entry list (ledger, entry, bookie) of every copy is computed from the
  metadata before the timed part, and one raw v3 connection per bookie is opened. Then
  READ_ENTRY of every copy, hand-encoded frames (`read_entry_frame`), pipelined
  `checks.bookie_max_in_flight` (64) deep per bookie (as deep as the scrub may go): the
  callback that takes a burst of a bookie's answers first writes as many new reads to it
  in one write (ours too writes a loop iteration's requests together); an answer is
  parsed (`FrameParser`, protobuf's C parser) only for its status and body length.
  No digest check, no comparison of copies, no ZooKeeper, no task or future per request.
* **ours**: `run_scrub_check` with the default configuration except
  `scrub.bytes_per_second` = 10^12 (1 TB/s per bookie: the budget is kept and spent, so
  its cost is in the figure, but never makes a read wait; the default, 8 MiB/s, would
  make the figure the budget's). Timed from before the walk to the report: ours also
  walks ZooKeeper (one metadata read per ledger), reads the marks and asks each bookie
  for its listing once per ledger (600 or 300 list requests beside the reads), and
  connects to the bookies on its first request.

Each side reports the copies it read and the payload bytes (copies x payload size, the
bytes the scrub verifies); CPU is the measured process's (getrusage), in microseconds
per MB of payload and per copy, with the bookies' CPU during the run beside it. Not the
figure: `ours_narrow`, one more run of ours with four ledgers at once (`LEDGERS_AT_ONCE`
before issue 35), to tell the ledgers' spread over the bookies from our own costs.

    python -m bench.bench_scrub floor|ours --zk HOSTS --entries N

runs one measured side (the bench starts it; phases as `bench.worker`).
`BENCH_PROFILE=DIR` records each side's timed phase with py-spy (`bench/profile.py`:
DIR/scrub-<payload>-<side>-<run>-scrub.txt and its .top.txt summary; not a figure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from auditor.bookie.protocol import FrameParser, Operation, Status, read_entry_frame
from auditor.checks import scrub_run
from auditor.checks.context import open_context
from auditor.checks.scrub import entry_write_sets
from auditor.checks.scrub_run import run_scrub_check
from auditor.config import load_config
from auditor.config.model import ChecksConfig
from auditor.logs import configure_logging
from auditor.metadata.walk import LedgerWalker
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.zk import ZkClient
from bench.bench_rereplication import MANAGER, RereplicationCluster, run_side
from bench.cluster import Measured, WorkerRun
from bench.common import ROOT, W, emit, env_int, rate, say
from bench.profile import PhaseProfiler
from bench.worker import phase

#: `scrub`: entries per ledger, payload bytes, most ledgers.
ENTRIES, PAYLOAD, MAX_LEDGERS = 256, 1024, 200
#: `scrub-64k`: the same.
ENTRIES_64K, PAYLOAD_64K, MAX_LEDGERS_64K = 64, 64 * 1024, 100
#: Per bookie, the scrub's budget in the measured runs: never reached (see the module).
UNLIMITED_BYTES_PER_S = 10**12
#: The extra run's option (not the figure): ledgers scrubbed at once, `LEDGERS_AT_ONCE`
#: before it was raised to 16 (the entries open across the run bounded as before).
NARROW = ("--ledgers-at-once", "4")
#: Reads the floor keeps in flight per bookie: what the scrub may (its gate per bookie).
FLOOR_WINDOW = ChecksConfig().bookie_max_in_flight


def _append(path: Path) -> BinaryIO:
    """The log file a side writes its stderr to."""
    return open(path, "ab")


class ScrubCluster(RereplicationCluster):
    """`rereplication`'s cluster, every bookie up; sides are this module's."""

    side_module = "bench.bench_scrub"

    async def run_side(self, side: str, expect: int, *options: str) -> Measured:
        """One measured process; with BENCH_PROFILE, its timed phase under py-spy."""
        args = [sys.executable, "-m", self.side_module, side, "--zk", self.hosts]
        args += ["--entries", str(self.entries_per_ledger), *options]
        err_path = self.work / f"{side}-{time.monotonic_ns()}.err"
        profiler = None
        if os.environ.get("BENCH_PROFILE"):
            self.profiled += 1
            label = f"scrub-{self.payload}-{side}-{self.profiled}"
            profiler = PhaseProfiler(Path(os.environ["BENCH_PROFILE"]), label)
        result = WorkerRun()
        bookies_before = 0.0
        with _append(err_path) as err:
            proc = await asyncio.create_subprocess_exec(
                *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err
            )
            assert proc.stdout is not None and proc.stdin is not None
            try:
                while line := await proc.stdout.readline():
                    doc = json.loads(line)
                    name = doc.pop("phase")
                    if name == "done":
                        result.done = doc
                        continue
                    result.phases[name] = doc
                    if name == "ready":
                        bookies_before = self.cpu().bookies
                    elif name == "scrub":
                        doc["bookies_cpu_s"] = round(self.cpu().bookies - bookies_before, 2)
                    if profiler is not None:
                        await profiler.stop(name)
                        if name == "ready":
                            await profiler.start(int(doc["pid"]))
                    proc.stdin.write(b"\n")
                    await proc.stdin.drain()
                code = await proc.wait()
            finally:
                if profiler is not None:
                    await profiler.stop("exit")
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        if code != 0:
            raise RuntimeError(f"{side} exited {code}:\n{err_path.read_text()[-4000:]}")
        copies = int(result.phases["scrub"]["copies"])
        if copies != expect or result.phases["scrub"].get("failed"):
            raise RuntimeError(f"{side} read {result.phases['scrub']}, expected {expect} copies")
        return Measured(result)


# --- the measured sides -----------------------------------------------------------------------


async def _copies(zk: ZkClient) -> dict[str, list[tuple[int, int]]]:
    """Per bookie, the (ledger, entry) of every copy it must hold, in ledger order."""
    out: dict[str, list[tuple[int, int]]] = {}
    async for rec in LedgerWalker(zk, ROOT, MANAGER).ledgers():
        if rec.metadata is None:
            continue
        for entry, bookies in entry_write_sets(rec.metadata):
            for bookie in bookies:
                out.setdefault(bookie, []).append((rec.ledger_id, entry))
    return out


class _Conn(asyncio.Protocol):
    """One raw v3 connection to one bookie: the next read sent as each answer comes."""

    def __init__(self, floor: _Floor, work: list[tuple[int, int]]) -> None:
        self.floor = floor
        self.parser = FrameParser()
        self.transport: asyncio.Transport | None = None
        self.work = work[::-1]  # popped from the end
        self.txn = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send_reads(self, count: int) -> None:
        """The next `count` reads, written together (one system call)."""
        frames = []
        work = self.work
        for _ in range(min(count, len(work))):
            lid, e = work.pop()
            self.txn += 1
            frames.append(read_entry_frame(self.txn, lid, e))
        if frames:
            assert self.transport is not None
            self.transport.write(b"".join(frames))

    def data_received(self, data: bytes) -> None:
        floor = self.floor
        answers = self.parser.feed(data)
        # As many reads out as answers came in, before looking at them.
        self.send_reads(len(answers))
        for payload in answers:
            resp = pb.Response.FromString(payload)
            if (
                int(resp.header.operation) == Operation.READ_ENTRY
                and int(resp.status) == Status.EOK
            ):
                floor.copies += 1
                floor.bytes += len(resp.readResponse.body)
            else:
                floor.failed += 1
        floor.answered += len(answers)
        if floor.answered == floor.total and not floor.done.done():
            floor.done.set_result(None)


class _Floor:
    """What the floor's connections count."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.answered = 0
        self.copies = 0
        self.bytes = 0
        self.failed = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


async def floor_side(zk: ZkClient, args: argparse.Namespace) -> None:
    work = await _copies(zk)
    floor = _Floor(sum(len(w) for w in work.values()))
    loop = asyncio.get_running_loop()
    conns: list[_Conn] = []
    for bookie, copies in work.items():
        host, port = bookie.rsplit(":", 1)
        _, conn = await loop.create_connection(partial(_Conn, floor, copies), host, int(port))
        conns.append(conn)
    await phase("ready", copies=floor.total)
    started = time.monotonic()
    for conn in conns:
        conn.send_reads(FLOOR_WINDOW)
    await floor.done
    seconds = time.monotonic() - started
    for conn in conns:
        if conn.transport is not None:
            conn.transport.close()
    await phase(
        "scrub",
        seconds=round(seconds, 4),
        copies=floor.copies,
        body_bytes=floor.bytes,
        failed=floor.failed,
    )


async def ours_side(zk: ZkClient, args: argparse.Namespace) -> None:
    import auditor

    print(f"auditor from {auditor.__file__}", file=sys.stderr, flush=True)
    sets = [
        "checks.progress_interval=3600",
        f"scrub.bytes_per_second={UNLIMITED_BYTES_PER_S}",
        *args.set,
    ]
    config = load_config(None, sets)
    if args.ledgers_at_once:
        scrub_run.LEDGERS_AT_ONCE = args.ledgers_at_once
    async with open_context(zk, ROOT, MANAGER, config) as ctx:
        await phase("ready")
        started = time.monotonic()
        report = await run_scrub_check(ctx)
        seconds = time.monotonic() - started
    cov = report.scrub
    assert cov is not None
    await phase(
        "scrub",
        seconds=round(seconds, 4),
        copies=cov.copies_verified,
        payload_bytes=cov.bytes_verified,
        ledgers=report.ledgers_checked,
        violations=report.violations.total,
        failed=report.violations.total + cov.copies_absent + cov.copies_unverified,
    )


async def side_main(args: argparse.Namespace) -> None:
    await run_side(args, floor_side, ours_side)


# --- the bench ----------------------------------------------------------------------------------


def _figure(m: Measured, payload: int) -> dict[str, Any]:
    done = m.run.phases["scrub"]
    seconds = float(done["seconds"])
    copies = int(done["copies"])
    mb = copies * payload / 1e6
    cpu = m.worker_cpu("ready", "scrub")
    return {
        "s": round(seconds, 2),
        "copies": copies,
        "copies_per_s": rate(copies, seconds),
        "mb_per_s": round(mb / seconds, 1) if seconds else 0.0,
        "cpu_s": cpu,
        "cpu_us_per_mb": round(cpu * 1e6 / mb, 0) if mb else 0.0,
        "cpu_us_per_copy": round(cpu * 1e6 / max(copies, 1), 1),
        "cpu_share": round(cpu / seconds, 2) if seconds else 0.0,
        "bookies_cpu_s": done["bookies_cpu_s"],
        "bookies_cpu_share": round(float(done["bookies_cpu_s"]) / seconds, 2) if seconds else 0.0,
    }


async def measure(n: int) -> dict[str, Any]:
    """`scrub`: 1 KiB payloads."""
    return await _measure(min(n, MAX_LEDGERS), ENTRIES, PAYLOAD, name="scrub")


async def measure_64k(n: int) -> dict[str, Any]:
    """`scrub-64k`: 64 KiB payloads."""
    return await _measure(min(n, MAX_LEDGERS_64K), ENTRIES_64K, PAYLOAD_64K, name="scrub-64k")


async def _measure(ledgers: int, entries: int, payload: int, *, name: str) -> dict[str, Any]:
    """Floor and ours alternating on the same cluster; each side's best run."""
    repeat = max(1, env_int("BENCH_REPEAT", 2))
    load_before = os.getloadavg()
    floors: list[Measured] = []
    ours: list[Measured] = []
    expect = ledgers * entries * W
    cluster = ScrubCluster(ledgers, entries=entries, payload=payload)
    async with cluster:
        for i in range(repeat):
            f = await cluster.run_side("floor", expect)
            floors.append(f)
            say(f"{name}: floor {i + 1}/{repeat}: {f.run.phases['scrub']['seconds']:.2f} s")
            o = await cluster.run_side("ours", expect)
            got = o.run.phases["scrub"]
            if got["violations"] or got["ledgers"] != ledgers:
                raise RuntimeError(f"ours scrubbed {got}, expected {ledgers} clean ledgers")
            ours.append(o)
            say(f"{name}: ours {i + 1}/{repeat}: {got['seconds']:.2f} s")
        # Not the figure: ours with four ledgers at once (ledgers k..k+3 load their
        # bookies unevenly, and each ledger's window drains at its end), to tell the
        # spread over the bookies from our own costs.
        narrow = await cluster.run_side("ours", expect, *NARROW)
        say(f"{name}: ours {' '.join(NARROW)}: {narrow.run.phases['scrub']['seconds']:.2f} s")
    load_after = os.getloadavg()
    best_floor = min(floors, key=lambda m: float(m.run.phases["scrub"]["seconds"]))
    best_ours = min(ours, key=lambda m: float(m.run.phases["scrub"]["seconds"]))
    fl, us = _figure(best_floor, payload), _figure(best_ours, payload)
    return {
        "bench": name,
        "ledgers": ledgers,
        "entries_per_ledger": entries,
        "payload_bytes": payload,
        "copies": expect,
        "pace_bytes_per_s_per_bookie": UNLIMITED_BYTES_PER_S,
        "in_flight_per_bookie": FLOOR_WINDOW,
        "runs": repeat,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in load_after],
        "ours": us,
        "floor": fl,
        "ratio": round(us["mb_per_s"] / fl["mb_per_s"], 3) if fl["mb_per_s"] else 0.0,
        "ratio_of": "mb_per_s",
        "cpu_ratio": round(us["cpu_us_per_mb"] / fl["cpu_us_per_mb"], 2)
        if fl["cpu_us_per_mb"]
        else 0.0,
        "ours_narrow": {"options": " ".join(NARROW), **_figure(narrow, payload)},
        "all_runs_s": {
            "ours": [float(m.run.phases["scrub"]["seconds"]) for m in ours],
            "floor": [float(m.run.phases["scrub"]["seconds"]) for m in floors],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_scrub")
    parser.add_argument("side", nargs="?", choices=["floor", "ours"])
    parser.add_argument("--zk")
    parser.add_argument("--entries", type=int, default=ENTRIES)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--ledgers-at-once", type=int, default=0)
    args = parser.parse_args()
    if args.side is None:
        wanted = os.environ.get("BENCH_ONLY", "scrub,scrub-64k").split(",")
        n = env_int("BENCH_N", 100_000)
        if "scrub" in wanted:
            emit(asyncio.run(measure(n)))
        if "scrub-64k" in wanted:
            emit(asyncio.run(measure_64k(n)))
        return
    configure_logging("json", level="WARNING")
    asyncio.run(side_main(args))


if __name__ == "__main__":
    main()
