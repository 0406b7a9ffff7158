"""`rereplication-small`: what the worker costs per LEDGER when ledgers are small.

Pulsar clusters hold many small ledgers, and there the cost of a repair is not the copy
(ten 1 KiB entries, seven of them on the lost bookie) but what surrounds it: the lock,
the plan, the commit, the verification, the unmark. `rereplication` measures entries
per second on long ledgers; this measures ledgers per second on short ones.

The cluster is `rereplication`'s (`bench.bench_rereplication.RereplicationCluster`:
real ZooKeeper, six bookie processes, bookie i in rack i mod 3, 1 KiB payloads) with
`BENCH_SMALL_N` (default 2,000) closed E3/W2/A2 ledgers of `ENTRIES` (10) entries.
Bookie 0 is stopped; the half of the ledgers that name it are marked as the auditor
marks them, and the placement policy can send each copy only to bookie 3 (the other
bookie of its rack), so both sides do the same work:

* **floor**: one process, raw kazoo and one blocking socket per bookie (as
  `bench/floor.py` and `rereplication`'s floor), no asyncio, nothing decoded beyond what
  the step needs (the metadata protobuf, the responses' status and body). The marks and
  the registered bookies are listed once; then, ONE LEDGER AT A TIME (what our worker
  does by default, `worker.ledgers_in_parallel` = 1; Java's worker too), each step's
  requests pipelined together:
  1. create the ephemeral lock, read the mark, read the ledger's metadata (three
     requests in one round trip: ZooKeeper answers a session's requests in order);
  2. the plan's list requests (GET_LIST_OF_ENTRIES_OF_LEDGER) to the ensemble's
     registered bookies;
  3. each entry the lost bookie held, READ_ENTRY from its surviving copy, and as each
     answer arrives RECOVERY_ADD of its body to bookie 3; every add answered;
  4. the new ensemble written: a multi of the lock's version check and the versioned
     set of the metadata (what our fenced commit is);
  5. the verification's list requests to the new ensemble;
  6. the mark deleted at its version (a multi with the lock check, as ours) and the
     lock deleted, pipelined.
  No digest check, no placement policy, no analysis of the list answers (only their
  status): the floor cannot be undercut, never the other way round.
* **ours**: a `ReplicationWorker` in a process of its own with the default
  configuration, taking the marks until every ledger is repaired
  (`bench.bench_rereplication.ours_side`). Not the figure: one more run of ours with
  four ledgers in flight (`ours_wide`: `worker.ledgers_in_parallel` = 4), to tell
  waiting on round trips from CPU per ledger.

They alternate BENCH_REPEAT times; between runs the metadata and the marks are written
back and bookie 3 is restarted from its seed. After each run every re-replicated
ledger's metadata must name bookie 3 and not bookie 0, and no mark and no lock may be
left. Each side's best run is the figure; CPU is the measured process's (getrusage,
its threads included: kazoo's for the floor), per ledger.

    python -m bench.bench_small_ledgers floor|ours --zk HOSTS --racks FILE
        --lost BOOKIE --target BOOKIE --expect N

runs one measured side (the bench starts it). `BENCH_CPROFILE=DIR` writes
DIR/small-<side>-p<ledgers in flight>.pstats (not a figure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from auditor.bookie.protocol import (
    FrameParser,
    Status,
    add_entry_request,
    encode_message,
    list_request_frame,
    master_key,
    read_entry_request,
)
from auditor.logs import configure_logging
from auditor.metadata.paths import ledger_path
from auditor.metadata.records import encode_lock_data
from auditor.metadata.schedule import write_set
from auditor.metadata.serde import HEADER_PREFIX, decode_ledger_metadata
from auditor.metadata.underreplication import ur_ledger_path, ur_lock_path
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.proto.data_formats_pb2 import LedgerMetadataFormat
from auditor.worker.copy import stored_entries
from auditor.zk import ZkClient
from bench.bench_rereplication import LOST, MANAGER, TARGET, RereplicationCluster, ours_side
from bench.cluster import Measured
from bench.common import ROOT, E, W, emit, env_int, rate, say
from bench.worker import phase, usage

#: Entries per ledger (the shape of `make demo`'s ledgers and of issue #33's target).
ENTRIES = 10
DEFAULT_N = 2000
#: The extra run's option (not the default, not the figure): ledgers in flight at once.
WIDE = ("--parallel", "4")
BASE = f"{ROOT}/underreplication"
_V3 = HEADER_PREFIX + b"3\n"


def small_n() -> int:
    """Ledgers in the cluster (`BENCH_SMALL_N`, default 2,000; half are re-replicated)."""
    return env_int("BENCH_SMALL_N", DEFAULT_N)


class SmallLedgersCluster(RereplicationCluster):
    """`rereplication`'s cluster with ten-entry ledgers and this module's sides."""

    entries_per_ledger = ENTRIES
    side_module = "bench.bench_small_ledgers"


# --- the floor ----------------------------------------------------------------------------------


class _Bookie:
    """One blocking connection: frames written whole, answers read as frames."""

    def __init__(self, bookie_id: str) -> None:
        host, port = bookie_id.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = FrameParser()
        self.ready: list[bytes] = []

    def send(self, frame: bytes) -> None:
        self.sock.sendall(frame)

    def answer(self) -> pb.Response:
        while not self.ready:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("bookie closed the connection")
            self.ready.extend(self.parser.feed(data))
        return pb.Response.FromString(self.ready.pop(0))

    def close(self) -> None:
        self.sock.close()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _decode_v3(data: bytes) -> LedgerMetadataFormat:
    """The metadata's protobuf (the bench cluster writes v3 only)."""
    if not data.startswith(_V3):
        raise ValueError("not v3 ledger metadata")
    pos = len(_V3)
    size = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        size |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    return LedgerMetadataFormat.FromString(data[pos : pos + size])


def _encode_v3(fmt: LedgerMetadataFormat) -> bytes:
    body = fmt.SerializeToString()
    return _V3 + _varint(len(body)) + body


def _ok(resp: pb.Response) -> bool:
    return int(resp.status) == Status.EOK


class _FloorRun:
    """The floor's state: one kazoo client, one socket per bookie, counters."""

    def __init__(self, zk: KazooClient, target: str) -> None:
        self.zk = zk
        self.target = target
        self.bookies: dict[str, _Bookie] = {}
        self.key = master_key(b"")
        self.lock_data = encode_lock_data("floor")
        self.txn = 0
        self.entries = 0
        self.bytes = 0
        self.failed = 0

    def bookie(self, bookie_id: str) -> _Bookie:
        conn = self.bookies.get(bookie_id)
        if conn is None:
            conn = self.bookies[bookie_id] = _Bookie(bookie_id)
        return conn

    def lists(self, lid: int, bookies: list[str]) -> None:
        """One list request to each bookie, all out before the first answer is read."""
        for b in bookies:
            self.txn += 1
            self.bookie(b).send(list_request_frame(self.txn, lid))
        for b in bookies:
            resp = self.bookie(b).answer()
            if not _ok(resp):
                self.failed += 1

    def repair(self, lid: int, available: set[str]) -> None:
        zk = self.zk
        lock = ur_lock_path(BASE, lid)
        mark = ur_ledger_path(BASE, lid)
        md_path = ledger_path(MANAGER, ROOT, lid)
        locked = zk.create_async(lock, self.lock_data, ephemeral=True)
        got_mark = zk.get_async(mark)
        got_md = zk.get_async(md_path)
        locked.get(timeout=60)
        _, mark_stat = got_mark.get(timeout=60)
        md_data, md_stat = got_md.get(timeout=60)
        fmt = _decode_v3(md_data)
        seg = fmt.segment[0]
        ensemble = list(seg.ensembleMember)
        [index] = [i for i, b in enumerate(ensemble) if b not in available]
        self.lists(lid, [b for b in ensemble if b in available])
        # The copy: reads out to each entry's surviving copy, adds as answers come.
        target = self.bookie(self.target)
        per_source: dict[str, int] = {}
        for e in stored_entries(0, fmt.lastEntryId, E, W, index):
            [source] = [ensemble[i] for i in write_set(e, E, W) if i != index]
            self.txn += 1
            self.bookie(source).send(encode_message(read_entry_request(self.txn, lid, e)))
            per_source[source] = per_source.get(source, 0) + 1
        adds = 0
        for source, n in per_source.items():
            conn = self.bookie(source)
            for _ in range(n):
                resp = conn.answer()
                if not _ok(resp):
                    self.failed += 1
                    continue
                body = resp.readResponse.body
                self.txn += 1
                request = add_entry_request(
                    self.txn, lid, resp.readResponse.entryId, self.key, body, recovery=True
                )
                target.send(encode_message(request))
                self.bytes += len(body)
                adds += 1
        for _ in range(adds):
            if _ok(target.answer()):
                self.entries += 1
            else:
                self.failed += 1
        # The commit: the new ensemble, versioned, fenced on the lock.
        seg.ensembleMember[index] = self.target
        commit = zk.transaction()
        commit.check(lock, 0)
        commit.set_data(md_path, _encode_v3(fmt), md_stat.version)
        if not all(r is True or hasattr(r, "version") for r in commit.commit_async().get(60)):
            raise RuntimeError(f"ledger {lid}: commit failed")
        self.lists(lid, list(seg.ensembleMember))
        unmark = zk.transaction()
        unmark.check(lock, 0)
        unmark.delete(mark, mark_stat.version)
        unmarked = unmark.commit_async()
        unlocked = zk.delete_async(lock, 0)
        if not all(r is True for r in unmarked.get(60)):
            raise RuntimeError(f"ledger {lid}: unmark failed")
        unlocked.get(timeout=60)

    def close(self) -> None:
        for conn in self.bookies.values():
            conn.close()


def _marked_ids(zk: KazooClient) -> list[int]:
    """Every marked ledger, by listing the four hex levels (their names spell the id)."""
    out: list[int] = []
    level = [f"{BASE}/ledgers"]
    for _ in range(4):
        results = [(p, zk.get_children_async(p)) for p in level]
        level = [f"{p}/{c}" for p, r in results for c in r.get(timeout=60)]
    leaves = [(p, zk.get_children_async(p)) for p in level]
    for _, r in leaves:
        out.extend(int(name[3:]) for name in r.get(timeout=60))
    return sorted(out)


def floor_side(args: argparse.Namespace) -> None:
    zk = KazooClient(hosts=args.zk, timeout=60)
    zk.start(timeout=60)
    run = _FloorRun(zk, args.target)
    try:
        for b in zk.get_children(f"{ROOT}/available"):
            if b != "readonly":
                run.bookie(b)  # connected before the timed part, as ours connects lazily once
        asyncio.run(phase("ready"))
        started = time.monotonic()
        available = {b for b in zk.get_children(f"{ROOT}/available") if b != "readonly"}
        ledgers = _marked_ids(zk)
        for lid in ledgers:
            run.repair(lid, available)
        seconds = time.monotonic() - started
    finally:
        run.close()
        zk.stop()
        zk.close()
    asyncio.run(
        phase(
            "copy",
            seconds=round(seconds, 4),
            ledgers=len(ledgers),
            entries=run.entries,
            bytes=run.bytes,
            failed=run.failed,
        )
    )


# --- the bench ----------------------------------------------------------------------------------


async def check_repaired(cluster: SmallLedgersCluster) -> None:
    """Every re-replicated ledger names the target and not the lost bookie; no mark and
    no lock is left."""
    zk = cluster.zk
    assert zk is not None
    lost, target = cluster.ids[LOST], cluster.ids[TARGET]
    lids = [md.ledger_id for md in cluster.lost_ledgers()]
    got = await zk.get_many([ledger_path(MANAGER, ROOT, lid) for lid in lids])
    bad = []
    for lid, item in zip(lids, got, strict=True):
        assert item is not None, f"ledger {lid} is gone"
        md = decode_ledger_metadata(item[0], lid)
        ens = md.segments[0].bookies
        if lost in ens or target not in ens:
            bad.append(lid)
    if bad:
        raise RuntimeError(f"{len(bad)} ledgers not repaired, e.g. {bad[:5]}")
    locks = await zk.get_children(f"{BASE}/locks")
    marks = await asyncio.to_thread(_count_marks, cluster.hosts)
    if locks or marks:
        raise RuntimeError(f"left behind: {len(locks)} locks, {marks} marks")


def _count_marks(hosts: str) -> int:
    zk = KazooClient(hosts=hosts, timeout=60)
    zk.start(timeout=60)
    try:
        if zk.exists(f"{BASE}/ledgers") is None:
            return 0
        # Hex directories emptied by an unmark may be gone: count what is there.
        count = 0
        stack = [f"{BASE}/ledgers"]
        while stack:
            path = stack.pop()
            for child in zk.get_children(path):
                if child.startswith("urL"):
                    count += 1
                else:
                    stack.append(f"{path}/{child}")
        return count
    finally:
        zk.stop()
        zk.close()


def _figure(m: Measured, ledgers: int) -> dict[str, Any]:
    copy = m.run.phases["copy"]
    seconds = float(copy["seconds"])
    cpu = m.worker_cpu("ready", "copy")
    return {
        "s": round(seconds, 2),
        "ledgers": ledgers,
        "ledgers_per_s": rate(ledgers, seconds),
        "cpu_us_per_ledger": round(cpu * 1e6 / max(ledgers, 1), 1),
        "entries": int(copy["entries"]),
        "cpu_share": round(cpu / seconds, 2) if seconds else 0.0,
    }


async def measure(n: int) -> dict[str, Any]:
    repeat = max(1, env_int("BENCH_REPEAT", 2))
    load_before = os.getloadavg()
    floors: list[Measured] = []
    ours: list[Measured] = []
    cluster = SmallLedgersCluster(n)
    async with cluster:
        await cluster.stop_bookie(LOST)
        lost = cluster.ids[LOST]
        lost_ledgers = len(cluster.lost_ledgers())
        expect = sum(
            len(list(stored_entries(0, ENTRIES - 1, E, W, md.segments[0].bookies.index(lost))))
            for md in cluster.lost_ledgers()
        )
        for i in range(repeat):
            await cluster.mark()
            f = await cluster.run_side("floor", lost_ledgers)
            got = f.run.phases["copy"]
            if got["entries"] != expect or got["failed"] or got["ledgers"] != lost_ledgers:
                raise RuntimeError(f"floor did {got}, expected {expect} entries")
            await check_repaired(cluster)
            floors.append(f)
            say(f"rereplication-small: floor {i + 1}/{repeat}: {got['seconds']:.1f} s")
            await cluster.restart_bookie(TARGET)
            await cluster.restore()
            await cluster.mark()
            o = await cluster.run_side("ours", lost_ledgers)
            got = o.run.phases["copy"]
            if got["entries"] != expect or got["ledgers"] != lost_ledgers:
                raise RuntimeError(f"ours did {got}, expected {expect} entries")
            await check_repaired(cluster)
            ours.append(o)
            say(f"rereplication-small: ours {i + 1}/{repeat}: {got['seconds']:.1f} s")
            await cluster.restart_bookie(TARGET)
            await cluster.restore()
        # Not the figure (the floor has one ledger in flight): ours with four, to tell
        # how much of a small ledger's time is waiting on round trips.
        await cluster.mark()
        wide = await cluster.run_side("ours", lost_ledgers, *WIDE)
        if wide.run.phases["copy"]["ledgers"] != lost_ledgers:
            raise RuntimeError(f"ours {WIDE} did {wide.run.phases['copy']}")
        await check_repaired(cluster)
        say(f"rereplication-small: ours {' '.join(WIDE)}: {wide.run.phases['copy']['seconds']} s")
    load_after = os.getloadavg()
    best_floor = min(floors, key=lambda m: float(m.run.phases["copy"]["seconds"]))
    best_ours = min(ours, key=lambda m: float(m.run.phases["copy"]["seconds"]))
    fl, us = _figure(best_floor, lost_ledgers), _figure(best_ours, lost_ledgers)
    ratio = round(us["ledgers_per_s"] / fl["ledgers_per_s"], 3) if fl["ledgers_per_s"] else 0.0
    return {
        "bench": "rereplication-small",
        "ledgers": n,
        "ledgers_rereplicated": lost_ledgers,
        "entries_per_ledger": ENTRIES,
        "entries_copied": expect,
        "ledgers_in_flight": 1,
        "runs": repeat,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in load_after],
        "ours": us,
        "floor": fl,
        "ratio": ratio,
        "ours_wide": {"options": " ".join(WIDE), **_figure(wide, lost_ledgers)},
        "all_runs_s": {
            "ours": [float(m.run.phases["copy"]["seconds"]) for m in ours],
            "floor": [float(m.run.phases["copy"]["seconds"]) for m in floors],
        },
        "target": "ours >= 0.5 x floor (ledgers/s)",
        "met": ratio >= 0.5,
    }


async def _ours_main(args: argparse.Namespace) -> None:
    import auditor

    print(f"auditor from {auditor.__file__}", file=sys.stderr, flush=True)
    async with ZkClient(args.zk, timeout=60) as zk:
        await ours_side(zk, args)
    print(json.dumps({"phase": "done", **usage()}), flush=True)


def _side(args: argparse.Namespace) -> None:
    if args.side == "floor":
        floor_side(args)
        print(json.dumps({"phase": "done", **usage()}), flush=True)
    else:
        asyncio.run(_ours_main(args))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_small_ledgers")
    parser.add_argument("side", nargs="?", choices=["floor", "ours"])
    parser.add_argument("--zk")
    parser.add_argument("--racks")
    parser.add_argument("--lost")
    parser.add_argument("--target")
    parser.add_argument("--expect", type=int, default=0)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    # Passed by `RereplicationCluster.run_side` to every side module; ledgers here have
    # ENTRIES entries, always.
    parser.add_argument("--entries", type=int, default=ENTRIES, choices=[ENTRIES])
    args = parser.parse_args()
    if args.side is None:
        emit(asyncio.run(measure(small_n())))
        return
    configure_logging("json", level="WARNING")
    out = os.environ.get("BENCH_CPROFILE")
    if not out:
        _side(args)
        return
    import cProfile

    with cProfile.Profile() as prof:
        _side(args)
    prof.dump_stats(str(Path(out) / f"small-{args.side}-p{args.parallel}.pstats"))


if __name__ == "__main__":
    main()
