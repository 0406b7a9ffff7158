"""`marks`: a hundred thousand under-replication marks (issue #30, item 6).

One ZooKeeper holding BENCH_MARKS_N marks (default 100,000) of ledgers 1..N, as
BookKeeper lays them out (`underreplication/ledgers/hhhh/hhhh/hhhh/hhhh/urL%010d`: every
mark in a leaf directory of its own, so N marks are N listings), each missing two of six
bookies, with a ctime; no ledgers, no bookies. Against it, each in a process of its own:

* the one-shot CLI as an operator runs it, from process start to exit, wall time and the
  child's CPU from `os.wait4`: `bk-auditor list-underreplicated --json` (`list`; every
  mark read, its JSON checked: N lines), `--count-only --json` (`count`; listings only,
  `{"count": N, "corrupt": 0}` checked) and `check all --json` (`check_all`: the
  replicas check reads every mark once at its start, the grace check once more to judge
  them; its report checked: the grace check saw N marks);
* the floor (`python -m bench.bench_marks floor --zk HOSTS`): the cheapest code making
  the same listings and reads, a raw `KazooClient` and no asyncio. The tree is listed
  level by level, each level's directories as multiRead requests of 250 getChildren
  (`MultiList`: names only), all of a level in flight together (one `get_children_async`
  a directory costs kazoo about 150 us of CPU: 15 s for 100,000 marks); `list` is that
  alone, `read` adds every mark's data, read as multiRead requests of 250 getData
  (`bench.floor.MultiGet`: the data kept, the stats skipped), four in flight, and nothing
  decoded. Its CPU is its own process's (`resource.getrusage`, kazoo's thread included).

Floor and CLI runs alternate BENCH_REPEAT times (default 2); each figure is the best of
its runs. `BENCH_MARKS_SRC=DIR` times the CLI of another source tree (a `git worktree` of
an older commit, say), for a before and after on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import struct
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from kazoo.protocol.serialization import multiheader_struct

from bench.cluster import BenchZooKeeper
from bench.common import emit, env_int, rate, run_timed, say
from bench.floor import MultiGet, multi_read_body

ROOT = "/ledgers"
BASE = f"{ROOT}/underreplication"
#: Znodes created per ZooKeeper multi (a transaction: far below its 1 MiB request limit),
#: and such transactions in flight while the marks are written.
CREATE_BATCH = 2_000
CREATES_IN_FLIGHT = 8
#: The floor's reads: getData ops per multiRead, and multiReads in flight.
FLOOR_MULTI = 250
FLOOR_DEPTH = 4
CLI_TIMEOUT = 3600.0
BOOKIES = [f"10.0.0.{i}:3181" for i in range(1, 7)]
CTIME = 1_700_000_000_000
_MH = multiheader_struct
_I32 = struct.Struct(">i")
_GET_CHILDREN = 8
_LIST_HEAD = _MH.pack(_GET_CHILDREN, False, -1)


def bench_marks_n() -> int:
    return env_int("BENCH_MARKS_N", 100_000)


# --- the cluster ------------------------------------------------------------------------


def _hex_dirs(ledger_id: int) -> list[str]:
    return [f"{(ledger_id >> shift) & 0xFFFF:04x}" for shift in (48, 32, 16, 0)]


def _creates(n: int) -> list[list[tuple[str, bytes]]]:
    """Every znode of marks 1..n in batches for `create_many`: each batch's directories
    before their marks, and every directory above the leaves in the first batch."""
    from auditor.metadata.underreplication import encode_mark, ur_ledger_path

    upper: dict[str, None] = {}
    leaves: list[tuple[str, bytes]] = []
    for ledger_id in range(1, n + 1):
        parts = _hex_dirs(ledger_id)
        for depth in range(1, 4):
            upper.setdefault(f"{BASE}/ledgers/{'/'.join(parts[:depth])}")
        replicas = [BOOKIES[ledger_id % 6], BOOKIES[(ledger_id + 1) % 6]]
        leaves.append((f"{BASE}/ledgers/{'/'.join(parts)}", b""))
        leaves.append((ur_ledger_path(BASE, ledger_id), encode_mark(replicas, CTIME)))
    first = [(path, b"") for path in upper]
    return [first] + [leaves[i : i + CREATE_BATCH] for i in range(0, len(leaves), CREATE_BATCH)]


async def write_marks(hosts: str, n: int) -> float:
    """The cluster's metadata and marks 1..n; seconds it took."""
    from auditor.metadata.underreplication import UnderreplicationManager
    from auditor.testing.cluster import ClusterWriter
    from auditor.zk import ZkClient

    started = time.monotonic()
    async with ZkClient(hosts, timeout=120) as zk:
        await ClusterWriter(zk, ROOT).init_cluster()
        await UnderreplicationManager(zk, ROOT).check_layout()
        batches = _creates(n)
        await zk.create_many(batches[0])
        slots = asyncio.Semaphore(CREATES_IN_FLIGHT)

        async def one(batch: list[tuple[str, bytes]]) -> None:
            async with slots:
                await zk.create_many(batch)

        await asyncio.gather(*(one(b) for b in batches[1:]))
    return time.monotonic() - started


# --- the floor --------------------------------------------------------------------------


def floor(hosts: str) -> dict[str, Any]:
    """The floor's phases: `list` (listings only) and `read` (listings and every mark's
    data), each with its wall and CPU seconds and what it found."""
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=hosts, timeout=60)
    zk.start(timeout=60)
    try:
        out: dict[str, Any] = {}
        for phase in ("list", "read"):
            cpu0 = _cpu()
            t0 = time.monotonic()
            marks, listings = _floor_list(zk)
            found = _floor_read(zk, marks) if phase == "read" else 0
            out[phase] = {
                "seconds": time.monotonic() - t0,
                "cpu_s": _cpu() - cpu0,
                "marks": len(marks),
                "listings": listings,
                "read": found,
            }
        return out
    finally:
        zk.stop()
        zk.close()


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class MultiList:
    """One multiRead of getChildren ops (kazoo's connection sends it as its own requests);
    the reply parsed to each directory's names (None for a listing that failed)."""

    __slots__ = ("paths",)
    type = 22

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def serialize(self) -> bytes:
        return multi_read_body(_LIST_HEAD, self.paths)

    def deserialize(self, buffer: bytes, offset: int) -> list[list[str] | None]:
        out: list[list[str] | None] = []
        while True:
            kind, done, _ = _MH.unpack_from(buffer, offset)
            offset += _MH.size
            if done:
                return out
            if kind != _GET_CHILDREN:  # an error result: its code
                offset += 4
                out.append(None)
                continue
            (count,) = _I32.unpack_from(buffer, offset)
            offset += 4
            names = []
            for _ in range(max(count, 0)):
                (length,) = _I32.unpack_from(buffer, offset)
                offset += 4
                names.append(buffer[offset : offset + length].decode())
                offset += length
            out.append(names)


def _floor_list(zk: Any) -> tuple[list[str], int]:
    """Every mark's path, breadth-first with sorted children (BookKeeper's order): each
    level's directories in multiRead batches of FLOOR_MULTI getChildren, all in flight."""
    chroot = zk.chroot or ""
    marks: list[str] = []
    level = [f"{BASE}/ledgers"]
    listings = 0
    while level:
        pending = []
        for i in range(0, len(level), FLOOR_MULTI):
            batch = level[i : i + FLOOR_MULTI]
            result = zk.handler.async_result()
            zk._call(MultiList([chroot + p for p in batch]), result)
            pending.append((batch, result))
        listings += len(level)
        level = []
        for batch, result in pending:
            for path, names in zip(batch, result.get(), strict=True):
                for name in sorted(names or ()):
                    if name.startswith("urL"):
                        marks.append(f"{path}/{name}")
                    else:
                        level.append(f"{path}/{name}")
    return marks, listings


def _floor_read(zk: Any, paths: list[str]) -> int:
    """Every mark's data, multiRead batches of FLOOR_MULTI, FLOOR_DEPTH in flight, in
    order; how many were there."""
    chroot = zk.chroot or ""

    def submit(start: int) -> Any:
        result = zk.handler.async_result()
        zk._call(MultiGet([chroot + p for p in paths[start : start + FLOOR_MULTI]]), result)
        return result

    starts = iter(range(0, len(paths), FLOOR_MULTI))
    window: deque[Any] = deque(submit(i) for i in islice(starts, FLOOR_DEPTH))
    found = 0
    while window:
        datas = window.popleft().get()
        window.extend(submit(i) for i in islice(starts, 1))
        found += sum(1 for data in datas if data is not None)
    return found


# --- the runs ---------------------------------------------------------------------------


@dataclass
class Run:
    seconds: float
    cpu_s: float
    maxrss_kb: int
    code: int
    out: str


def _run(args: list[str], work: Path, tag: str, cwd: Path | None = None) -> Run:
    """One process to its end (call in a thread): wall and CPU seconds, stdout."""
    out_path, err_path = work / f"{tag}.out", work / f"{tag}.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BK_AUDITOR_")}
    if cwd is not None:
        env["PYTHONPATH"] = str(cwd)
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        code, seconds, ru = run_timed(args, out, err, cwd=cwd, env=env)
    text = out_path.read_text()
    if code not in (0, 1):
        tail = err_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(args[2:5])} exited {code}:\n{tail}")
    return Run(seconds, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, code, text)


def _cli(hosts: str, work: Path, tag: str, src: Path | None, *args: str) -> Run:
    return _run([sys.executable, "-m", "auditor", *args, "--zk", hosts], work, tag, src)


def _check_list(run: Run, n: int) -> None:
    lines = run.out.splitlines()
    docs = [json.loads(line) for line in lines[:1] + lines[-1:]]
    if run.code != 0 or len(lines) != n or docs[0]["ledger_id"] != 1:
        raise RuntimeError(f"list-underreplicated: {len(lines)} lines, exit {run.code}")
    if docs[-1]["ledger_id"] != n or any("corrupt" in d for d in docs):
        raise RuntimeError(f"list-underreplicated: ends at {docs[-1]}")


def _check_count(run: Run, n: int) -> None:
    if run.code != 0 or json.loads(run.out) != {"count": n, "corrupt": 0}:
        raise RuntimeError(f"list-underreplicated --count-only: {run.out!r}, exit {run.code}")


def _check_all(run: Run, n: int) -> None:
    doc = json.loads(run.out)
    grace = doc["reports"].get("grace", {})
    seen = grace.get("ledgers_checked", 0) + sum(grace.get("ledgers_skipped", {}).values())
    if seen != n or doc.get("failed"):
        raise RuntimeError(f"check all: grace saw {seen} marks of {n}; failed {doc.get('failed')}")


def _figure(runs: list[Run], n: int) -> dict[str, Any]:
    best = min(runs, key=lambda r: r.seconds)
    return {
        "seconds": round(best.seconds, 2),
        "marks_per_s": rate(n, best.seconds),
        "cpu_s": round(best.cpu_s, 2),
        "cpu_us_per_mark": round(best.cpu_s / n * 1e6, 1),
        "maxrss_mb": round(best.maxrss_kb / 1024, 1),
        "runs_s": [round(r.seconds, 2) for r in runs],
    }


def _source() -> Path | None:
    """BENCH_MARKS_SRC: the source tree whose CLI is timed (None: this one)."""
    raw = os.environ.get("BENCH_MARKS_SRC", "").strip()
    return Path(raw).resolve() if raw else None


def _floor_figure(floors: list[dict[str, Any]], phase: str, n: int) -> dict[str, Any]:
    best = min((doc[phase] for doc in floors), key=lambda d: float(d["seconds"]))
    return {
        "seconds": round(best["seconds"], 2),
        "marks_per_s": rate(n, best["seconds"]),
        "cpu_s": round(best["cpu_s"], 2),
        "listings": best["listings"],
    }


async def measure(n: int) -> dict[str, Any]:
    """The `marks` figure over n marks."""
    repeat = env_int("BENCH_REPEAT", 2)
    src = _source()
    server = BenchZooKeeper(2 * n)
    work = Path(tempfile.mkdtemp(prefix="bench-marks-"))
    try:
        await asyncio.to_thread(server.start)
        setup_s = await write_marks(server.hosts, n)
        say(f"marks: {n} marks written in {setup_s:.1f} s")
        hosts = server.hosts
        runs: dict[str, list[Run]] = {"list": [], "count": [], "check_all": []}
        floors: list[dict[str, Any]] = []
        for i in range(repeat):
            floor_run = await asyncio.to_thread(
                _run,
                [sys.executable, "-m", "bench.bench_marks", "floor", "--zk", hosts],
                work,
                f"floor-{i}",
            )
            doc = json.loads(floor_run.out)
            if doc["read"]["marks"] != n or doc["read"]["read"] != n:
                raise RuntimeError(f"the floor found {doc['read']} of {n} marks")
            floors.append(doc)
            listed, read = doc["list"]["seconds"], doc["read"]["seconds"]
            say(f"marks: floor list {listed:.2f} s, read {read:.2f} s")
            for name, args, check in (
                ("list", ("list-underreplicated", "--json"), _check_list),
                ("count", ("list-underreplicated", "--count-only", "--json"), _check_count),
                ("check_all", ("check", "all", "--json"), _check_all),
            ):
                run = await asyncio.to_thread(_cli, hosts, work, f"{name}-{i}", src, *args)
                check(run, n)
                runs[name].append(run)
                say(f"marks: {name} {run.seconds:.2f} s, {run.cpu_s:.2f} s CPU")
        floor_doc = {phase: _floor_figure(floors, phase, n) for phase in ("list", "read")}
        figure: dict[str, Any] = {
            "bench": "marks",
            "n": n,
            "source": str(src) if src is not None else "this tree",
            "setup_s": round(setup_s, 1),
            "load_avg": [round(x, 2) for x in os.getloadavg()],
            "floor": floor_doc,
        }
        for name, its_runs in runs.items():
            figure[name] = _figure(its_runs, n)
        figure["list"]["x_floor"] = round(
            floor_doc["read"]["seconds"] / figure["list"]["seconds"], 2
        )
        figure["count"]["x_floor"] = round(
            floor_doc["list"]["seconds"] / figure["count"]["seconds"], 2
        )
        return figure
    finally:
        await asyncio.to_thread(server.destroy)
        await asyncio.to_thread(shutil.rmtree, work, True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_marks")
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("floor", help="the floor's phases against a ZooKeeper holding marks")
    f.add_argument("--zk", required=True)
    sub.add_parser("measure", help="the whole figure (as `BENCH_ONLY=marks python -m bench`)")
    args = parser.parse_args()
    if args.command == "floor":
        print(json.dumps(floor(args.zk)), flush=True)
    else:
        emit(asyncio.run(measure(bench_marks_n())))


if __name__ == "__main__":
    main()
