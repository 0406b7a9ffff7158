"""`check replicas` over etcd against its floor: `etcd-floor`, `etcd-replicas`.

One cluster on etcd, laid out as Pulsar's `EtcdMetadataStore` keeps BookKeeper's tree
(each ZooKeeper path an etcd key, no keys for parents: `/ledgers/00/0000/L0001` holds
ledger 1's metadata; `metadata-store:etcd:http://127.0.0.1:PORT` is the
metadataServiceUri): a real etcd (`auditor.testing.etcdserver.EtcdServer`, Debian's etcd
3.4), BENCH_ETCD_N closed ledgers (default BENCH_N, 100,000; E=3 W=2 A=2, 10 entries,
ledger k on bookies k, k+1, k+2 mod 6, as `bench/cluster.py` lays them out) and six
emulated bookies,
each in a process of its own (`python -m bench.bench_etcd bookie`: `bench.bookie_host`
on etcd), seeded from files and registering themselves through `EtcdStore` (cookie, then
the ephemeral `/ledgers/available/<id>` under their lease). `LAYOUT`, `INSTANCEID` and
the rest of `initnewcluster`'s tree are written by `ClusterWriter` through `EtcdStore`;
the ledger keys by `EtcdStore.create_many` (transactions of 128 puts, each key's absence
compared, as Pulsar's batched creates), 16 transactions in flight.

Then, alternating BENCH_REPEAT times (default 2), each in a process of its own:

* the floor (`python -m bench.bench_etcd floor`): one thread of ours, no asyncio, no task
  or future per request: etcd's KV `Range` (aetcd's generated stub on a synchronous grpc
  channel) over the whole `/ledgers/` prefix, in pages of BENCH_ETCD_PAGE keys (default
  1,000, the walk's page) with the next page asked for as soon as one arrives; each
  ledger key's value decoded only to its ensemble bookies
  (`bench.floor.ensemble_bookies`), and one GET_LIST_OF_ENTRIES_OF_LEDGER per distinct
  ensemble bookie through `bench.floor`'s raw non-blocking sockets (`Bookie`, `pump`,
  `finish`), served between pages. Phases: `floor` (all of it, overlapped), `floor-sorted`
  (the same with every range read asking etcd to sort ASCEND by KEY, as the walk's
  `read_range` asks), `etcd-reads` and `etcd-reads-sorted` (the reads and the decoding
  alone, each way; they must give the same ids in the same, increasing, order),
  `bookie-requests` (the requests alone, encoded before the clock starts);
* ours: `bk-auditor check replicas --metadata-service-uri metadata-store:etcd:... --json`,
  from process start to exit, CPU from `os.wait4`; its report must count all N ledgers
  and no violation.

Why two floors: etcd returns a range's keys in key order whether or not a sort is asked
for, but given any sort order it drops the limit, reads the whole rest of the range,
sorts it and truncates (etcd 3.4's `applierV3backend.Range`: "fetch everything; sort and
truncate afterwards"); so paging through N keys with a sort costs etcd O(N^2 / page).
`floor` is the cheapest way to the same data; `floor-sorted` asks for the sort the walk
asks for (the walk reads `<root>/DD/` spans, here one, `00`, holding every ledger).

The cluster's CPU (etcd's and the bookies') is read around each run, so both figures
say where the CPU went. `python -m bench.bench_etcd serve N` keeps such a cluster up
(prints its metadataServiceUri) for profiling by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from auditor.etcd import EtcdStore
from auditor.etcd.store import prefix_end
from auditor.metadata.layout import LedgerManager
from auditor.metadata.paths import ledger_path
from auditor.metadata.serde import encode_ledger_metadata
from auditor.testing.bookie import write_seed_file
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.etcdserver import EtcdServer
from auditor.testing.zkserver import free_port
from bench.bench_scrutiny import CliRun, _check_cli, _check_report_time, _us, run_check_cli
from bench.cluster import _output, ensemble_of, held_runs
from bench.common import (
    BOOKIES,
    ENTRIES,
    ROOT,
    A,
    E,
    W,
    bench_n,
    cpu_seconds,
    emit,
    env_int,
    rate,
    say,
    stop_processes,
)

#: Keys a floor range read asks for at once (BENCH_ETCD_PAGE overrides).
PAGE = 1000
#: Ledger keys a transaction creates (etcd 3.4's default --max-txn-ops) and how many
#: such transactions are in flight while the cluster is written.
TXN_OPS = 128
TXNS_IN_FLIGHT = 16
CLI_TIMEOUT = 7200.0
WORKER_TIMEOUT = 7200.0
#: The floor's phases and the phase each one's CPU is counted from.
FLOOR_PHASES = {
    "floor": "ready",
    "floor-sorted": "floor",
    "etcd-reads": "floor-sorted",
    "etcd-reads-sorted": "etcd-reads",
    "bookie-requests": "prepared",
}


def bench_etcd_n() -> int:
    """Ledgers of the etcd cluster: BENCH_ETCD_N, else BENCH_N (default 100,000)."""
    return env_int("BENCH_ETCD_N", bench_n())


def uri_of(endpoint: str) -> str:
    return f"metadata-store:etcd:{endpoint}"


# --- the cluster -----------------------------------------------------------------------------


@dataclass
class EtcdCpu:
    etcd: float
    bookies: float

    def since(self, before: EtcdCpu) -> dict[str, float]:
        return {
            "etcd": round(self.etcd - before.etcd, 2),
            "bookies": round(self.bookies - before.bookies, 2),
        }


class EtcdCluster:
    """`async with EtcdCluster(n) as c:` etcd, n ledgers, six bookie processes; torn down
    on exit (processes stopped, files removed)."""

    def __init__(self, n: int, bookies: int = BOOKIES) -> None:
        self.n = n
        self.bookie_count = bookies
        self.work = Path(tempfile.mkdtemp(prefix="bench-etcd-"))
        self.server = EtcdServer(self.work / "etcd")
        self.store: EtcdStore | None = None
        self.ids: list[str] = []
        self.procs: list[asyncio.subprocess.Process] = []
        self.setup_s = 0.0

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def uri(self) -> str:
        return uri_of(self.server.endpoint)

    async def __aenter__(self) -> EtcdCluster:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        started = time.monotonic()
        (self.work / "etcd").mkdir()
        await asyncio.to_thread(self.server.start)
        self.store = EtcdStore([self.server.endpoint], timeout=120)
        await self.store.start()
        await ClusterWriter(self.store, ROOT).init_cluster()
        ports: set[int] = set()
        while len(ports) < self.bookie_count:
            ports.add(free_port())
        self.ids = [f"127.0.0.1:{p}" for p in sorted(ports)]
        seeds = await asyncio.to_thread(self._write_seeds)
        for i, seed in enumerate(seeds):
            self.procs.append(await self._spawn_bookie(i, seed))
        written = await self._write_ledgers()
        await self._wait_registered()
        self.setup_s = time.monotonic() - started
        say(
            f"etcd cluster: {self.n} ledgers ({written:.1f} s to write), "
            f"{self.bookie_count} bookie processes, ready in {self.setup_s:.1f} s"
        )

    def _write_seeds(self) -> list[Path]:
        per_bookie: list[list[tuple[int, list[tuple[int, int]]]]] = [
            [] for _ in range(self.bookie_count)
        ]
        runs = [held_runs(i, ENTRIES) for i in range(E)]
        for ledger_id in range(1, self.n + 1):
            for position, bookie in enumerate(ensemble_of(ledger_id, self.bookie_count)):
                per_bookie[bookie].append((ledger_id, runs[position]))
        paths = []
        for i, ledgers in enumerate(per_bookie):
            path = self.work / f"bookie-{i}.seed"
            write_seed_file(path, ledgers)
            paths.append(path)
        return paths

    def _items(self) -> list[tuple[str, bytes]]:
        template = make_metadata(
            0,
            self.ids[:E],
            write_quorum=W,
            ack_quorum=A,
            last_entry_id=ENTRIES - 1,
            length=16 * ENTRIES,
        )
        segment = template.segments[0]
        items = []
        for ledger_id in range(1, self.n + 1):
            ensemble = tuple(self.ids[b] for b in ensemble_of(ledger_id, self.bookie_count))
            md = replace(
                template, ledger_id=ledger_id, segments=(replace(segment, bookies=ensemble),)
            )
            path = ledger_path(LedgerManager.HIERARCHICAL, ROOT, ledger_id)
            items.append((path, encode_ledger_metadata(md)))
        return items

    async def _write_ledgers(self) -> float:
        """Every ledger key (no parent keys: Pulsar's store writes none), TXNS_IN_FLIGHT
        transactions of TXN_OPS creates at once; returns the seconds it took."""
        assert self.store is not None
        store = self.store
        items = await asyncio.to_thread(self._items)
        started = time.monotonic()
        chunks = iter([items[i : i + TXN_OPS] for i in range(0, len(items), TXN_OPS)])

        async def writer() -> None:
            for chunk in chunks:
                await store.create_many(chunk)

        await asyncio.gather(*(writer() for _ in range(TXNS_IN_FLIGHT)))
        return time.monotonic() - started

    async def _spawn_bookie(self, i: int, seed: Path) -> asyncio.subprocess.Process:
        args = [
            sys.executable, "-m", "bench.bench_etcd", "bookie",
            "--etcd", self.server.endpoint,
            "--port", self.ids[i].rsplit(":", 1)[1],
            "--seed", str(seed),
        ]  # fmt: skip
        with _output(self.work / f"bookie-{i}.log") as log:
            return await asyncio.create_subprocess_exec(
                *args, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
            )

    async def _wait_registered(self) -> None:
        assert self.store is not None
        deadline = time.monotonic() + 300
        while True:
            for i, proc in enumerate(self.procs):
                if proc.returncode is not None:
                    log = (self.work / f"bookie-{i}.log").read_text()[-2000:]
                    raise RuntimeError(f"bookie {self.ids[i]} exited {proc.returncode}:\n{log}")
            with contextlib.suppress(Exception):
                if set(self.ids) <= set(await self.store.get_children(f"{ROOT}/available")):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError("the bookies did not register within 300 s")
            await asyncio.sleep(0.1)

    def cpu(self) -> EtcdCpu:
        etcd_pid = self.server.proc.pid if self.server.proc is not None else 0
        return EtcdCpu(cpu_seconds(etcd_pid), sum(cpu_seconds(p.pid) for p in self.procs))

    async def stop(self) -> None:
        await stop_processes(self.procs)
        self.procs.clear()
        if self.store is not None:
            with contextlib.suppress(Exception):
                await self.store.close()
            self.store = None
        await asyncio.to_thread(self.server.destroy)
        shutil.rmtree(self.work, ignore_errors=True)


# --- the measured processes ------------------------------------------------------------------


@dataclass
class FloorRun:
    """The floor process's phases, with the cluster's CPU spent in each."""

    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    cluster_cpu: dict[str, dict[str, float]] = field(default_factory=dict)

    def seconds(self, phase: str) -> float:
        return float(self.phases[phase]["seconds"])

    def cpu(self, phase: str) -> float:
        return float(self.phases[phase]["cpu_s"]) - float(self.phases[FLOOR_PHASES[phase]]["cpu_s"])


async def run_floor(cluster: EtcdCluster) -> FloorRun:
    """`python -m bench.bench_etcd floor` to its end; it stops after each phase until told
    to go on, so the cluster's CPU is read at the phase boundaries."""
    args = [sys.executable, "-m", "bench.bench_etcd", "floor", "--etcd", cluster.endpoint]
    err_path = cluster.work / f"floor-{time.monotonic_ns()}.err"
    run = FloorRun()
    last = cluster.cpu()
    with _output(err_path) as err:
        proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err
        )
        assert proc.stdout is not None and proc.stdin is not None
        try:
            async with asyncio.timeout(WORKER_TIMEOUT):
                while line := await proc.stdout.readline():
                    doc = json.loads(line)
                    name = doc.pop("phase")
                    now = cluster.cpu()
                    if name != "done":
                        run.phases[name] = doc
                        run.cluster_cpu[name] = now.since(last)
                        proc.stdin.write(b"\n")
                        await proc.stdin.drain()
                    last = cluster.cpu()
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    if code != 0 or "bookie-requests" not in run.phases:
        tail = err_path.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"the etcd floor exited {code}:\n{tail}")
    return run


def run_cli(cluster: EtcdCluster, tag: str) -> tuple[CliRun, dict[str, float]]:
    """`bk-auditor check replicas --json` on the cluster's etcd, to its end (call in a
    thread); its run and the cluster's CPU meanwhile."""
    args = [
        sys.executable, "-m", "auditor", "check", "replicas", "--json",
        "--metadata-service-uri", cluster.uri,
    ]  # fmt: skip
    before = cluster.cpu()
    run = run_check_cli(args, cluster.work, "replicas", tag)
    return run, cluster.cpu().since(before)


def check_floor(run: FloorRun, n: int) -> None:
    """Raises unless every phase saw all n ledgers and every request was answered EOK."""
    p = run.phases
    f = p["floor"]
    for name in ("floor", "floor-sorted"):
        w = p[name]
        if w["ledgers"] != n or w["ok"] != w["requests"] or w["unknown_bookies"]:
            raise RuntimeError(f"etcd {name}: {w} (n={n})")
    if p["floor-sorted"]["requests"] != f["requests"]:
        raise RuntimeError(f"etcd floor-sorted: {p['floor-sorted']}, floor: {f}")
    r = p["etcd-reads"]
    if r["ledgers"] != n or not r["in_order"]:
        raise RuntimeError(f"etcd floor etcd-reads: {r} (n={n})")
    r = p["etcd-reads-sorted"]
    if r["ledgers"] != n or not r["same_order"]:
        raise RuntimeError(f"etcd floor etcd-reads-sorted: {r} (n={n})")
    b = p["bookie-requests"]
    if b["ok"] != b["requests"] or b["requests"] != f["requests"]:
        raise RuntimeError(f"etcd floor bookie-requests: {b}")


# --- the figures -----------------------------------------------------------------------------


def _cpu_split(client_s: float, cluster: dict[str, float], n: int) -> dict[str, float]:
    """CPU µs a ledger: the measured process's, etcd's and the bookies' (all processes)."""
    return {
        "client": _us(client_s, n),
        "etcd": _us(cluster["etcd"], n),
        "bookies": _us(cluster["bookies"], n),
    }


def floor_figure(floors: list[FloorRun], n: int, common: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"bench": "etcd-floor", **common}
    for name in FLOOR_PHASES:
        best = min(floors, key=lambda r: r.seconds(name))
        doc = best.phases[name]
        seconds = best.seconds(name)
        cpu = best.cpu(name)
        fig: dict[str, Any] = {"seconds": round(seconds, 2)}
        if name in ("floor", "floor-sorted"):
            fig |= {
                "ledgers_per_s": rate(n, seconds),
                "cpu_us_per_ledger": _us(cpu, n),
                "requests": doc["requests"],
                "pages": doc["pages"],
                "keys": doc["keys"],
            }
        elif name in ("etcd-reads", "etcd-reads-sorted"):
            fig |= {
                "keys": doc["keys"],
                "pages": doc["pages"],
                "ledger_keys_per_s": rate(n, seconds),
                "cpu_us_per_ledger": _us(cpu, n),
            }
        else:
            requests = int(doc["requests"])
            fig |= {
                "requests": requests,
                "requests_per_s": rate(requests, seconds),
                "cpu_us_per_request": _us(cpu, requests),
            }
        fig["cpu_us_per_ledger_split"] = _cpu_split(cpu, best.cluster_cpu[name], n)
        fig["all_runs_s"] = [round(r.seconds(name), 2) for r in floors]
        out[name] = fig
    out["how"] = (
        "bench/bench_etcd.py floor: one thread, aetcd's KV stub on a synchronous grpc "
        "channel, Range over the /ledgers/ prefix in pages of "
        f"{common['page']} keys (the next asked for as one arrives), values parsed to "
        "their ensembles (bench.floor.ensemble_bookies), one pre-encoded "
        "GET_LIST_OF_ENTRIES_OF_LEDGER per (ledger, ensemble bookie) on bench.floor's raw "
        "sockets, served between pages; floor and etcd-reads ask for no sort (etcd returns "
        "keys in key order anyway), floor-sorted and etcd-reads-sorted ask for "
        "ASCEND by KEY as the walk does, which etcd 3.4 serves by reading the whole rest "
        "of the range for every page; etcd-reads and bookie-requests are each part alone; "
        "cpu_us_per_ledger_split: the floor process's, etcd's and the six bookies' CPU"
    )
    return out


def replicas_figure(
    runs: list[tuple[CliRun, dict[str, float]]],
    floor: dict[str, Any],
    n: int,
    common: dict[str, Any],
) -> dict[str, Any]:
    best, cluster = min(runs, key=lambda r: r[0].seconds)
    floor_rate = floor["floor"]["ledgers_per_s"]
    sorted_rate = floor["floor-sorted"]["ledgers_per_s"]
    ours_rate = rate(n, best.seconds)
    ratio = round(ours_rate / floor_rate, 3) if floor_rate else 0.0
    return {
        "bench": "etcd-replicas",
        **common,
        "command": "bk-auditor check replicas --json --metadata-service-uri "
        "metadata-store:etcd:http://127.0.0.1:PORT",
        "seconds": round(best.seconds, 2),
        "ledgers_per_s": ours_rate,
        "check_s": _check_report_time(best.report),
        "cpu_us_per_ledger": _us(best.cpu_s, n),
        "cpu_s": round(best.cpu_s, 2),
        "peak_rss_mb": round(best.maxrss_kb / 1024, 1),
        "cpu_us_per_ledger_split": _cpu_split(best.cpu_s, cluster, n),
        "floor_ledgers_per_s": floor_rate,
        "floor_cpu_us_per_ledger": floor["floor"]["cpu_us_per_ledger"],
        "floor_cpu_us_per_ledger_split": floor["floor"]["cpu_us_per_ledger_split"],
        "ratio": ratio,
        "floor_sorted_ledgers_per_s": sorted_rate,
        "ratio_to_floor_sorted": round(ours_rate / sorted_rate, 3) if sorted_rate else 0.0,
        "all_runs_s": [round(r.seconds, 2) for r, _ in runs],
        "note": "wall time from process start to exit (interpreter start-up, imports and "
        "etcd connection included); check_s is the report's own started/finished; "
        "cpu_us_per_ledger_split: the CLI's, etcd's and the six bookies' CPU",
    }


async def measure(n: int) -> list[dict[str, Any]]:
    repeat = max(1, env_int("BENCH_REPEAT", 2))
    load = round(os.getloadavg()[0], 2)
    floors: list[FloorRun] = []
    ours: list[tuple[CliRun, dict[str, float]]] = []
    async with EtcdCluster(n) as cluster:
        for i in range(repeat):
            f = await run_floor(cluster)
            check_floor(f, n)
            floors.append(f)
            say(
                f"etcd: floor {i + 1}/{repeat}: {f.seconds('floor'):.1f} s "
                f"(etcd reads alone {f.seconds('etcd-reads'):.1f} s, "
                f"bookie requests alone {f.seconds('bookie-requests'):.1f} s)"
            )
            run, spent = await asyncio.to_thread(run_cli, cluster, str(i))
            _check_cli(run, n)
            ours.append((run, spent))
            say(f"etcd: check replicas {i + 1}/{repeat}: {run.seconds:.1f} s")
    common = {"n": n, "runs": repeat, "load_avg_before": load, "page": _page()}
    floor = floor_figure(floors, n, common)
    return [floor, replicas_figure(ours, floor, n, common)]


# --- the floor process -----------------------------------------------------------------------


def _page() -> int:
    return env_int("BENCH_ETCD_PAGE", PAGE)


#: A ledger key of the 2-4-4 tree (ids below 10^10) and of the 3-4-4-4-4 tree.
_LEDGER_KEY = re.compile(
    rb"^/ledgers/(?:(\d{2})/(\d{4})/L(\d{4})|(\d{3})/(\d{4})/(\d{4})/(\d{4})/L(\d{4}))$"
)


def floor_main(endpoint: str) -> None:
    """The floor (the module docstring); phases as bench.floor reports them."""
    import grpc
    from aetcd import rpc

    from bench import floor as raw

    channel = grpc.insecure_channel(
        endpoint.split("://", 1)[-1], options=[("grpc.max_receive_message_length", -1)]
    )
    kv = rpc.KVStub(channel)
    page = _page()
    below = f"{ROOT}/".encode()
    end = prefix_end(below)

    def ranged(key: bytes, sort: bool) -> Any:
        if sort:
            return rpc.RangeRequest(
                key=key,
                range_end=end,
                limit=page,
                sort_order=rpc.RangeRequest.ASCEND,
                sort_target=rpc.RangeRequest.KEY,
            )
        return rpc.RangeRequest(key=key, range_end=end, limit=page)

    available = f"{ROOT}/available/".encode()
    reply = kv.Range(
        rpc.RangeRequest(key=available, range_end=prefix_end(available), keys_only=True),
        timeout=60,
    )
    names = {bytes(k.key)[len(available) :].split(b"/", 1)[0].decode() for k in reply.kvs}
    names.discard("readonly")

    class EtcdFloor(raw.Floor):
        """bench.floor's bookie side (sockets, pump, finish, counts), etcd for the reads."""

        def __init__(self) -> None:
            self.root = ROOT
            self.by_id = {}
            for b in sorted(names):
                host, port = b.rsplit(":", 1)
                self.by_id[b] = raw.Bookie((host, int(port)))
            self.bookies = list(self.by_id.values())
            self.znodes = 0
            self.pages = 0

        def close(self) -> None:
            for b in self.bookies:
                b.sock.close()
            channel.close()

        def read_etcd(self, on_ledger: Any, between: Any, sort: bool = False) -> None:
            """Every ledger key's (id, value) to `on_ledger` in key order, `between`
            after each page; the next page is asked for before this one is worked on.
            `sort`: ask etcd to sort by key, as the walk does (the same keys in the same
            order: etcd's index is in key order; but see the module docstring)."""
            self.znodes = self.pages = 0
            match = _LEDGER_KEY.match
            pending = kv.Range.future(ranged(below, sort), timeout=600)
            while pending is not None:
                reply = pending.result()
                kvs = reply.kvs
                pending = None
                if reply.more and kvs:
                    pending = kv.Range.future(ranged(kvs[-1].key + b"\0", sort), timeout=600)
                self.pages += 1
                self.znodes += len(kvs)
                for item in kvs:
                    m = match(item.key)
                    if m is not None:
                        on_ledger(int(b"".join(g for g in m.groups() if g)), item.value)
                if between is not None:
                    between()

    floor = EtcdFloor()
    try:
        raw.phase("ready", bookies=len(floor.bookies))
        # floor (floor-sorted): reads, decoding, requests and answers, overlapped.
        by_id = floor.by_id

        def whole(name: str, sort: bool) -> None:
            floor.reset_counts()
            counts = {"ledgers": 0, "unknown": 0}

            def on_ledger(lid: int, data: bytes) -> None:
                counts["ledgers"] += 1
                request = raw.list_request(lid)
                for bookie_id in raw.ensemble_bookies(lid, data):
                    b = by_id.get(bookie_id)
                    if b is None:
                        counts["unknown"] += 1
                        continue
                    b.queue.append(request)
                    b.sent += 1

            def between() -> None:
                floor.pump(0)

            started = time.monotonic()
            floor.read_etcd(on_ledger, between, sort)
            floor.finish()
            seconds = time.monotonic() - started
            raw.phase(
                name,
                seconds=round(seconds, 4),
                ledgers=counts["ledgers"],
                unknown_bookies=counts["unknown"],
                keys=floor.znodes,
                pages=floor.pages,
                **floor.counts(),
            )

        whole("floor", sort=False)
        whole("floor-sorted", sort=True)
        # etcd-reads: the same reads and decoding, no requests (the pairs kept).
        pairs: list[tuple[int, set[str]]] = []
        append = pairs.append

        def keep(lid: int, data: bytes) -> None:
            append((lid, raw.ensemble_bookies(lid, data)))

        started = time.monotonic()
        floor.read_etcd(keep, None)
        seconds = time.monotonic() - started
        ids = [lid for lid, _ in pairs]
        raw.phase(
            "etcd-reads",
            seconds=round(seconds, 4),
            ledgers=len(pairs),
            keys=floor.znodes,
            pages=floor.pages,
            in_order=all(a < b for a, b in itertools.pairwise(ids)),
        )
        # etcd-reads-sorted: the same, etcd asked to sort by key as the walk asks.
        sorted_ids: list[int] = []
        started = time.monotonic()
        floor.read_etcd(lambda lid, data: sorted_ids.append(lid), None, sort=True)
        seconds = time.monotonic() - started
        raw.phase(
            "etcd-reads-sorted",
            seconds=round(seconds, 4),
            ledgers=len(sorted_ids),
            keys=floor.znodes,
            pages=floor.pages,
            same_order=sorted_ids == ids,
        )
        ids.clear()
        sorted_ids.clear()
        raw.phase("prepared", **raw.prepare(floor, pairs))
        del pairs
        raw.phase("bookie-requests", **raw.run_bookie_requests(floor))
    finally:
        floor.close()
    from bench.worker import usage

    print(json.dumps({"phase": "done", **usage()}), flush=True)


# --- a bookie on etcd ------------------------------------------------------------------------


async def bookie_main(endpoint: str, port: int, seed: str) -> None:
    """One emulated bookie registered in etcd (bench.bookie_host's bookie, on etcd)."""
    from auditor.testing.bookie import BookieEmulator

    async with EtcdStore([endpoint], timeout=60) as store:
        emulator = BookieEmulator(store, host="127.0.0.1", port=port, ledgers_root=ROOT)
        emulator.load_seed_file(seed)
        await emulator.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await emulator.stop()


async def serve(n: int) -> None:
    async with EtcdCluster(n) as cluster:
        print(json.dumps({"uri": cluster.uri, "ledgers": n}), flush=True)
        await asyncio.to_thread(sys.stdin.read)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_etcd")
    sub = parser.add_subparsers(dest="task")
    sub.add_parser("bench", help="the figures (the default)")
    p = sub.add_parser("floor", help="the floor process (phases on stdout)")
    p.add_argument("--etcd", required=True)
    p = sub.add_parser("bookie", help="one emulated bookie registered in etcd")
    p.add_argument("--etcd", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seed", required=True)
    p = sub.add_parser("serve", help="a cluster of N ledgers until stdin closes")
    p.add_argument("n", type=int, nargs="?", default=100_000)
    args = parser.parse_args()
    if args.task == "floor":
        floor_main(args.etcd)
    elif args.task == "bookie":
        asyncio.run(bookie_main(args.etcd, args.port, args.seed))
    elif args.task == "serve":
        asyncio.run(serve(args.n))
    else:
        for figure in asyncio.run(measure(bench_etcd_n())):
            emit(figure)


if __name__ == "__main__":
    main()
