"""`rereplication`: how fast a lost bookie's ledgers are copied, against bare wire I/O.

One cluster (real ZooKeeper, six bookie processes, bookie i in rack i mod 3),
`min(BENCH_N, 1,000)` closed E3/W2/A2 ledgers of `ENTRIES` entries with
`PAYLOAD`-byte payloads (1 KiB: a typical small Pulsar message batch). Bookie 0
is stopped (lost); half of the ledgers name it, and the placement policy can
send each of its copies only to bookie 3 (the other bookie of its rack), so
both sides below move exactly the same entries between the same bookies:

* **floor**: one process, one connection per bookie, READ_ENTRY from the one
  surviving bookie of each entry's write set and, as each answer arrives,
  ADD_ENTRY (RECOVERY_ADD) of its body to bookie 3; reads pipelined up to the
  bookie client's per-bookie cap; only the response's header, status and body
  are looked at; no digest check, no per-request task, no ZooKeeper in the
  timed part (the entry list is computed before it).
* **ours**: a `ReplicationWorker` with the default configuration (one ledger
  at a time, `rereplicationEntryBatchSize` 10), in a process of its own,
  taking the marks the bench wrote (as the auditor would) until every ledger
  is re-replicated: lock, plan, copy, commit, verify, unmark.

They alternate BENCH_REPEAT times; between runs bookie 3 is restarted (what
was copied to it is gone: its seeded data comes back from its seed file) and
the metadata is written back. Each side's best run is the figure; CPU is the
measured process's, per entry copied.

    python -m bench.bench_rereplication floor|ours --zk HOSTS --racks FILE
        --lost BOOKIE --target BOOKIE --expect N

runs one measured side (the bench starts it; phases as `bench.worker`).

**`rereplication-64k`** is the same bench on entries of 64 KiB payloads (Pulsar's
batches are often 64 KiB to 1 MiB), `min(BENCH_N, 200)` ledgers of `ENTRIES_64K`
entries so that it runs in a couple of minutes: what it measures is bytes, MB/s against
the same floor on the same entries (no `ours_wide` run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

from auditor.bookie.protocol import (
    FrameParser,
    Operation,
    Status,
    add_entry_request,
    encode_message,
    master_key,
    read_entry_request,
)
from auditor.checks.context import open_context
from auditor.config import load_config
from auditor.logs import configure_logging
from auditor.metadata.layout import LedgerManager
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.paths import ledger_path
from auditor.metadata.registry import available_path
from auditor.metadata.schedule import write_set
from auditor.metadata.serde import encode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.metadata.walk import LedgerWalker
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.testing.cluster import make_metadata
from auditor.worker.copy import stored_entries
from auditor.worker.loop import ReplicationWorker, WorkerConnection
from auditor.worker.state import WorkerState
from auditor.zk import ZkClient
from bench.cluster import BenchCluster, Measured, WorkerRun
from bench.common import ROOT, A, E, W, bench_n, emit, env_int, rate, say
from bench.worker import phase, usage

#: Entries per ledger and payload bytes per entry.
ENTRIES = 256
PAYLOAD = 1024
MAX_LEDGERS = 1000
#: The 64 KiB run: entries per ledger, payload bytes, most ledgers.
ENTRIES_64K = 64
PAYLOAD_64K = 64 * 1024
MAX_LEDGERS_64K = 200
LOST, TARGET = 0, 3
MANAGER = LedgerManager.HIERARCHICAL
#: The extra run's options (not defaults): more ledgers and entries in flight.
WIDE = ("--parallel", "4", "--set", "rereplicationEntryBatchSize=64")
#: Reads the floor keeps in flight per source bookie (the bookie client's default cap).
FLOOR_WINDOW = 64


def _append(path: Path) -> BinaryIO:
    """A log file a child process writes to (kept across a bookie's restarts)."""
    return open(path, "ab")


class RereplicationCluster(BenchCluster):
    """The bench cluster with long ledgers of large payloads, and a restartable bookie."""

    entries_per_ledger = ENTRIES
    payload = PAYLOAD
    #: The module whose `floor` and `ours` sides `run_side` starts (a subclass's own).
    side_module = "bench.bench_rereplication"

    def __init__(self, n: int, *, entries: int | None = None, payload: int | None = None) -> None:
        """`entries` a ledger and `payload` bytes an entry, where not the class's own."""
        super().__init__(n)
        if entries is not None:
            self.entries_per_ledger = entries
        if payload is not None:
            self.payload = payload

    def metadata(self) -> Iterator[LedgerMetadata]:
        entries = self.entries_per_ledger
        template = make_metadata(
            0,
            self.ids[:E],
            write_quorum=W,
            ack_quorum=A,
            last_entry_id=entries - 1,
            length=self.payload * entries,
        )
        segment = template.segments[0]
        for ledger_id in range(1, self.n + 1):
            ensemble = tuple(self.ids[(ledger_id + k) % self.bookie_count] for k in range(E))
            yield replace(
                template, ledger_id=ledger_id, segments=(replace(segment, bookies=ensemble),)
            )

    def _ledgers(self) -> Iterator[LedgerMetadata]:
        return self.metadata()

    async def _spawn_bookie(self, bookie_id: str, seed: Path) -> asyncio.subprocess.Process:
        # The parent's command line plus the payload size: a small override of the spawn.
        i = self.ids.index(bookie_id)
        args = [
            sys.executable,
            *("-m", "bench.bookie_host", "--zk", self.hosts),
            *("--port", bookie_id.rsplit(":", 1)[1], "--seed", str(seed)),
            *("--stats", str(self.stats_path(i)), "--payload-size", str(self.payload)),
        ]
        with _append(self.work / f"bookie-{i}.log") as log:
            return await asyncio.create_subprocess_exec(
                *args, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
            )

    async def stop_bookie(self, i: int) -> None:
        proc = self.procs[i]
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)

    async def restart_bookie(self, i: int) -> None:
        """Stops bookie `i` and starts it again from its seed: what was added is gone."""
        await self.stop_bookie(i)
        self.procs[i] = await self._spawn_bookie(self.ids[i], self.work / f"bookie-{i}.seed")
        assert self.zk is not None
        deadline = time.monotonic() + 60
        while await self.zk.exists(available_path(ROOT, self.ids[i])) is None:
            if time.monotonic() > deadline or self.procs[i].returncode is not None:
                raise RuntimeError(f"bookie {self.ids[i]} did not come back")
            await asyncio.sleep(0.05)

    def lost_ledgers(self) -> list[LedgerMetadata]:
        lost = self.ids[LOST]
        return [md for md in self.metadata() if lost in md.segments[0].bookies]

    async def restore(self) -> None:
        """The ledgers of the lost bookie back to their first metadata (ours changed it)."""
        assert self.zk is not None
        for md in self.lost_ledgers():
            path = ledger_path(MANAGER, ROOT, md.ledger_id)
            await self.zk.set(path, encode_ledger_metadata(md))

    async def mark(self) -> None:
        assert self.zk is not None
        urm = UnderreplicationManager(self.zk, ROOT)
        for md in self.lost_ledgers():
            await urm.mark_underreplicated(md.ledger_id, [self.ids[LOST]])

    async def run_side(self, side: str, expect: int, *options: str) -> Measured:
        """One measured process (`floor` or `ours`), its phases and CPU as `measure` does."""
        args = [sys.executable, "-m", self.side_module, side, "--zk", self.hosts]
        args += ["--racks", str(self.racks), "--lost", self.ids[LOST]]
        args += ["--target", self.ids[TARGET], "--expect", str(expect)]
        args += ["--entries", str(self.entries_per_ledger), *options]
        err_path = self.work / f"{side}-{time.monotonic_ns()}.err"
        result = WorkerRun()
        with _append(err_path) as err:
            proc = await asyncio.create_subprocess_exec(
                *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err
            )
            assert proc.stdout is not None and proc.stdin is not None
            while line := await proc.stdout.readline():
                doc = json.loads(line)
                name = doc.pop("phase")
                if name == "done":
                    result.done = doc
                    continue
                result.phases[name] = doc
                proc.stdin.write(b"\n")
                await proc.stdin.drain()
            code = await proc.wait()
        if code != 0:
            raise RuntimeError(f"{side} exited {code}:\n{err_path.read_text()[-4000:]}")
        return Measured(result)


# --- the measured sides -----------------------------------------------------------------------


async def _entries(zk: ZkClient, lost: str, entries: int) -> list[tuple[int, int, str]]:
    """(ledger, entry, surviving source) of every entry the lost bookie held."""
    out: list[tuple[int, int, str]] = []
    async for rec in LedgerWalker(zk, ROOT, MANAGER).ledgers():
        md = rec.metadata
        if md is None or lost not in md.segments[0].bookies:
            continue
        ens = md.segments[0].bookies
        index = ens.index(lost)
        for e in stored_entries(0, entries - 1, E, W, index):
            [source] = [ens[i] for i in write_set(e, E, W) if i != index]
            out.append((rec.ledger_id, e, source))
    return out


class _Conn(asyncio.Protocol):
    """One raw v3 connection: requests written as they come, answers handed to `floor`."""

    def __init__(self, floor: _Floor) -> None:
        self.floor = floor
        self.parser = FrameParser()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for payload in self.parser.feed(data):
            self.floor.answer(self, pb.Response.FromString(payload))


class _Floor:
    """Pipelined READ_ENTRY then RECOVERY_ADD, driven by callbacks (no task per request)."""

    def __init__(self, work: list[tuple[int, int, str]]) -> None:
        self.key = master_key(b"")
        self.queues: dict[str, list[tuple[int, int]]] = {}
        for lid, e, source in work:
            self.queues.setdefault(source, []).append((lid, e))
        for q in self.queues.values():
            q.reverse()  # popped from the end
        self.total = len(work)
        self.conns: dict[str, _Conn] = {}
        self.target: _Conn | None = None
        self.reads: dict[int, tuple[str, int, int]] = {}
        self.txn = 0
        self.added = 0
        self.bytes = 0
        self.failed = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def send_read(self, source: str) -> None:
        queue = self.queues[source]
        if not queue:
            return
        lid, e = queue.pop()
        self.txn += 1
        self.reads[self.txn] = (source, lid, e)
        conn = self.conns[source]
        assert conn.transport is not None
        conn.transport.write(encode_message(read_entry_request(self.txn, lid, e)))

    def answer(self, conn: _Conn, resp: pb.Response) -> None:
        txn = resp.header.txnId
        if int(resp.header.operation) == Operation.READ_ENTRY:
            source, lid, e = self.reads.pop(txn)
            self.send_read(source)
            if int(resp.status) != Status.EOK:
                self.count_failure()
                return
            body = resp.readResponse.body
            self.txn += 1
            assert self.target is not None and self.target.transport is not None
            self.target.transport.write(
                encode_message(add_entry_request(self.txn, lid, e, self.key, body, recovery=True))
            )
            self.bytes += len(body)
            return
        if int(resp.status) == Status.EOK:
            self.added += 1
        else:
            self.count_failure()
        if self.added + self.failed == self.total and not self.done.done():
            self.done.set_result(None)

    def count_failure(self) -> None:
        self.failed += 1
        if self.added + self.failed == self.total and not self.done.done():
            self.done.set_result(None)


async def floor_side(zk: ZkClient, args: argparse.Namespace) -> None:
    work = await _entries(zk, args.lost, args.entries)
    floor = _Floor(work)
    loop = asyncio.get_running_loop()
    for bookie in [*floor.queues, args.target]:
        host, port = bookie.rsplit(":", 1)
        _, conn = await loop.create_connection(lambda: _Conn(floor), host, int(port))
        if bookie == args.target:
            floor.target = conn
        else:
            floor.conns[bookie] = conn
    await phase("ready", entries=len(work))
    started = time.monotonic()
    for source in floor.queues:
        for _ in range(FLOOR_WINDOW):
            floor.send_read(source)
    await floor.done
    seconds = time.monotonic() - started
    for c in [*floor.conns.values(), floor.target]:
        if c is not None and c.transport is not None:
            c.transport.close()
    await phase(
        "copy",
        seconds=round(seconds, 4),
        entries=floor.added,
        bytes=floor.bytes,
        failed=floor.failed,
    )


async def ours_side(zk: ZkClient, args: argparse.Namespace) -> None:
    seconds, state = await run_bench_worker(
        zk,
        args,
        lambda state: state.ledgers_replicated >= args.expect,
        ledgers_in_parallel=args.parallel,
    )
    await phase(
        "copy",
        seconds=round(seconds, 4),
        entries=state.entries_written,
        bytes=state.bytes_written,
        ledgers=state.ledgers_replicated,
        failures={str(k): v for k, v in state.failures.items()},
    )


async def run_bench_worker(
    zk: ZkClient,
    args: argparse.Namespace,
    done: Callable[[WorkerState], bool],
    **options: Any,
) -> tuple[float, WorkerState]:
    """The worker benches' measured side: a replication worker on the bench's cluster
    (its rack file, `--set`), `options` to `ReplicationWorker`, phase `ready` said, run
    until `done(state)`; the seconds and the worker's counters."""
    sets = ["checks.progress_interval=3600", f"checks.racks_file={args.racks}", *args.set]
    config = load_config(None, sets)
    state = WorkerState()
    connected, disconnected = asyncio.Event(), asyncio.Event()
    connected.set()
    async with open_context(zk, ROOT, MANAGER, config) as ctx:
        worker = ReplicationWorker(
            ctx, WorkerConnection(connected, disconnected), state, holder="bench", **options
        )
        await phase("ready")
        seconds = await run_worker_until(worker, lambda: done(state))
    return seconds, state


async def run_worker_until(worker: ReplicationWorker, done: Callable[[], bool]) -> float:
    """Runs `worker` until `done()` holds, looked at each time it lets a ledger go (its
    `released` event: no polling); the seconds that took. The worker ending first is an
    error, with its own if it had one."""
    started = time.monotonic()
    task = asyncio.ensure_future(worker.run())
    try:
        while not done():
            if task.done():
                task.result()
                raise RuntimeError("the worker ended")
            worker.released.clear()
            if done():
                break
            await asyncio.wait_for(worker.released.wait(), 120)
        return time.monotonic() - started
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def side_main(args: argparse.Namespace) -> None:
    await run_side(args, floor_side, ours_side)


async def run_side(
    args: argparse.Namespace,
    floor: Callable[[ZkClient, argparse.Namespace], Awaitable[None]],
    ours: Callable[[ZkClient, argparse.Namespace], Awaitable[None]],
) -> None:
    """A side process of a worker bench: `floor` or `ours` (as `args.side` says) on a
    ZooKeeper session, then the `done` phase with the process's usage."""
    async with ZkClient(args.zk, timeout=60) as zk:
        await (floor if args.side == "floor" else ours)(zk, args)
    print(json.dumps({"phase": "done", **usage()}), flush=True)


# --- the bench ----------------------------------------------------------------------------------


def _figure(m: Measured) -> dict[str, Any]:
    copy = m.run.phases["copy"]
    cpu = m.worker_cpu("ready", "copy")
    entries = int(copy["entries"])
    return {
        "s": round(float(copy["seconds"]), 2),
        "entries": entries,
        "entries_per_s": rate(entries, float(copy["seconds"])),
        "mb_per_s": round(int(copy["bytes"]) / 1e6 / float(copy["seconds"]), 2),
        "cpu_us_per_entry": round(cpu * 1e6 / max(entries, 1), 1),
    }


async def measure(n: int) -> dict[str, Any]:
    """`rereplication`: 1 KiB entries, entries/s against the floor."""
    return await _measure(
        min(n, MAX_LEDGERS), ENTRIES, PAYLOAD, name="rereplication", key="entries_per_s", wide=True
    )


async def measure_64k(n: int) -> dict[str, Any]:
    """`rereplication-64k`: 64 KiB entries, MB/s against the floor."""
    return await _measure(
        min(n, MAX_LEDGERS_64K),
        ENTRIES_64K,
        PAYLOAD_64K,
        name="rereplication-64k",
        key="mb_per_s",
        wide=False,
    )


async def _measure(
    ledgers: int, entries: int, payload: int, *, name: str, key: str, wide: bool
) -> dict[str, Any]:
    """Floor and ours alternating on `ledgers` ledgers of `entries` entries of `payload`
    bytes; the ratio is of `key` (entries/s or MB/s)."""
    repeat = max(1, env_int("BENCH_REPEAT", 2))
    load = round(os.getloadavg()[0], 2)
    floors: list[Measured] = []
    ours: list[Measured] = []
    cluster = RereplicationCluster(ledgers, entries=entries, payload=payload)
    async with cluster:
        await cluster.stop_bookie(LOST)
        lost_ledgers = len(cluster.lost_ledgers())
        lost = cluster.ids[LOST]
        expect = sum(
            len(list(stored_entries(0, entries - 1, E, W, md.segments[0].bookies.index(lost))))
            for md in cluster.lost_ledgers()
        )
        for i in range(repeat):
            f = await cluster.run_side("floor", lost_ledgers)
            floors.append(f)
            got = f.run.phases["copy"]
            if got["entries"] != expect or got["failed"]:
                raise RuntimeError(f"floor copied {got}, expected {expect} entries")
            say(f"{name}: floor {i + 1}/{repeat}: {got['seconds']:.1f} s")
            await cluster.restart_bookie(TARGET)
            await cluster.mark()
            o = await cluster.run_side("ours", lost_ledgers)
            ours.append(o)
            got = o.run.phases["copy"]
            if got["entries"] != expect or got["ledgers"] != lost_ledgers:
                raise RuntimeError(f"ours copied {got}, expected {expect} entries")
            say(f"{name}: ours {i + 1}/{repeat}: {got['seconds']:.1f} s")
            await cluster.restart_bookie(TARGET)
            await cluster.restore()
        # Not the figure: the same copy with more in flight (4 ledgers at once, 64
        # entries each), to tell a shallow pipeline from per-entry cost.
        extra: dict[str, Any] = {}
        if wide:
            await cluster.mark()
            w = await cluster.run_side("ours", lost_ledgers, *WIDE)
            if w.run.phases["copy"]["entries"] != expect:
                raise RuntimeError(f"ours {WIDE} copied {w.run.phases['copy']}")
            await cluster.restart_bookie(TARGET)
            await cluster.restore()
            say(f"{name}: ours, {' '.join(WIDE)}: {w.run.phases['copy']['seconds']:.1f} s")
            extra["ours_wide"] = {"options": " ".join(WIDE), **_figure(w)}
    best_floor = min(floors, key=lambda m: float(m.run.phases["copy"]["seconds"]))
    best_ours = min(ours, key=lambda m: float(m.run.phases["copy"]["seconds"]))
    fl, us = _figure(best_floor), _figure(best_ours)
    ratio = round(us[key] / fl[key], 3) if fl[key] else 0.0
    goal = 0.5 if key == "entries_per_s" else 0.7
    return {
        "bench": name,
        "ledgers": ledgers,
        "ledgers_rereplicated": lost_ledgers,
        "entries_per_ledger": entries,
        "payload_bytes": payload,
        "runs": repeat,
        "load_avg_before": load,
        "load_avg_after": round(os.getloadavg()[0], 2),
        "ours": us,
        "floor": fl,
        "ours_ledgers_per_s": rate(lost_ledgers, us["s"]),
        "ratio": ratio,
        "ratio_of": key,
        **extra,
        "all_runs_s": {
            "ours": [_figure(m)["s"] for m in ours],
            "floor": [_figure(m)["s"] for m in floors],
        },
        "target": f"ours >= {goal} x floor ({key})",
        "met": ratio >= goal,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_rereplication")
    parser.add_argument("side", nargs="?", choices=["floor", "ours"])
    parser.add_argument("--zk")
    parser.add_argument("--racks")
    parser.add_argument("--lost")
    parser.add_argument("--target")
    parser.add_argument("--expect", type=int, default=0)
    parser.add_argument("--entries", type=int, default=ENTRIES)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.side is None:
        emit(asyncio.run(measure(bench_n())))
        emit(asyncio.run(measure_64k(bench_n())))
        return
    configure_logging("json", level="WARNING")
    out = os.environ.get("BENCH_CPROFILE")
    if not out:
        asyncio.run(side_main(args))
        return
    # py-spy is not always installed (bench/profile.py); cProfile is, and slows both
    # sides alike: `BENCH_CPROFILE=DIR` writes DIR/<side>[-wide]-<entries>.pstats (not a
    # figure). Timed in the process's CPU seconds, not wall time: on a shared machine a
    # wall-time profile charges to whatever function runs when the process is preempted
    # (and to `send`, where the kernel delivers loopback data to the bookie).
    import cProfile

    with cProfile.Profile(time.process_time) as prof:
        asyncio.run(side_main(args))
    wide = "-wide" if args.set or args.parallel != 1 else ""
    prof.dump_stats(str(Path(out) / f"{args.side}{wide}-{args.entries}.pstats"))


if __name__ == "__main__":
    main()
