"""A benchmark's own cluster: a real ZooKeeper, N closed ledgers, a process per bookie.

Every bookie is a `bench.bookie_host` process seeded from a file written
here, so neither the bookies' CPU nor their memory is in the measured
process, and their counters (requests per operation, list requests per
ledger, the most requests in flight at once) are read from the bookies
themselves: SIGUSR2 resets and SIGUSR1 dumps them to a file each.

Ledger k's ensemble is bookies k, k+1, k+2 (mod 6); bookie i sits in rack
i mod 3, so every write quorum spans two racks and the cluster is clean:
every check must find nothing, and every figure is for a full pass.

Measured workloads run as `bench.worker` children (`run_worker`), which
stop after each phase until told to go on, so counters and CPU are read at
phase boundaries exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from auditor.metadata.model import LedgerMetadata
from auditor.metadata.registry import available_path
from auditor.testing.bookie import write_seed_file
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.zkserver import ZooKeeperServer, free_port
from auditor.zk import ZkClient
from bench.common import BOOKIES, ENTRIES, ROOT, A, E, W, cpu_seconds, say, stop_processes
from bench.profile import PhaseProfiler

#: Seconds a bookie has to write its counters after a signal.
STATS_TIMEOUT = 60.0
WORKER_TIMEOUT = 7200.0


def held_runs(position: int, entries: int = ENTRIES) -> list[tuple[int, int]]:
    """The entries the bookie at `position` of the ensemble stores, as half-open runs."""
    runs: list[tuple[int, int]] = []
    for e in range(entries):
        if (position - e) % E < W:
            if runs and runs[-1][1] == e:
                runs[-1] = (runs[-1][0], e + 1)
            else:
                runs.append((e, e + 1))
    return runs


def ensemble_of(ledger_id: int, bookies: int) -> list[int]:
    return [(ledger_id + k) % bookies for k in range(E)]


class BenchZooKeeper(ZooKeeperServer):
    """The tests' throwaway server with a heap sized for N ledgers.

    A ledger's znode costs ZooKeeper about 0.85 KB of heap (measured on
    20,000: 25 MB live after a full GC), so the tests' 256 MB fills up near
    250,000 ledgers and a 3N = 300,000 cluster would spend its time in GC.
    """

    def __init__(self, ledgers: int) -> None:
        super().__init__()
        self.heap_mb = 256 + ledgers * 2 // 1024

    def _jvm_options(self) -> list[str]:
        # After the server's own -Xmx on the command line, and the last one wins.
        return [*super()._jvm_options(), f"-Xmx{self.heap_mb}m"]


def _output(path: Path) -> BinaryIO:
    """A file a child process writes its output to (opened before it starts)."""
    return open(path, "wb")


@dataclass
class ClusterCpu:
    """CPU seconds of the cluster's processes at one moment."""

    zookeeper: float
    bookies: float

    def since(self, before: ClusterCpu) -> dict[str, float]:
        return {
            "zookeeper": round(self.zookeeper - before.zookeeper, 2),
            "bookies": round(self.bookies - before.bookies, 2),
        }


@dataclass
class WorkerRun:
    """What one `bench.worker` reported: its phases in order, and its last line."""

    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    done: dict[str, Any] = field(default_factory=dict)


#: Called at each phase boundary of a worker (the worker waits meanwhile).
OnPhase = Callable[[str, dict[str, Any]], Awaitable[None]]


@dataclass
class Measured:
    """A worker's phases, with the cluster's CPU and the bookies' counters for each.

    Counters are reset when the worker is ready and after every phase, so
    `counters[phase]` is what that phase alone sent.
    """

    run: WorkerRun
    cluster_cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    counters: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def seconds(self, *phases: str) -> float:
        return float(sum(self.run.phases[p]["seconds"] for p in phases))

    def worker_cpu(self, first: str, last: str) -> float:
        """The worker's CPU seconds from the end of phase `first` to the end of `last`."""
        spent = float(self.run.phases[last]["cpu_s"]) - float(self.run.phases[first]["cpu_s"])
        return round(spent, 2)


class BenchCluster:
    """`async with BenchCluster(n) as c:` a cluster of `n` ledgers, torn down on exit."""

    #: Entries of every ledger (a subclass with longer ledgers says so here).
    entries_per_ledger = ENTRIES

    def __init__(self, n: int, *, latency_ms: float = 0.0, bookies: int = BOOKIES) -> None:
        self.n = n
        self.latency_ms = latency_ms
        self.bookie_count = bookies
        self.work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
        self.server = BenchZooKeeper(n)
        self.zk: ZkClient | None = None
        self.ids: list[str] = []
        self.procs: list[asyncio.subprocess.Process] = []
        self.racks = self.work / "racks.json"
        self.setup_s = 0.0
        self.profiled = 0

    @property
    def hosts(self) -> str:
        return self.server.hosts

    async def __aenter__(self) -> BenchCluster:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- set-up -------------------------------------------------------------------------

    async def start(self) -> None:
        started = time.monotonic()
        await asyncio.to_thread(self.server.start)
        self.zk = ZkClient(self.server.hosts, timeout=60)
        await self.zk.start()
        writer = ClusterWriter(self.zk, ROOT)
        await writer.init_cluster()
        ports: set[int] = set()
        while len(ports) < self.bookie_count:
            ports.add(free_port())
        self.ids = [f"127.0.0.1:{p}" for p in sorted(ports)]
        self.racks.write_text(json.dumps({b: f"/rack-{i % 3}" for i, b in enumerate(self.ids)}))
        seeds = await asyncio.to_thread(self._write_seeds)
        for bookie_id, seed in zip(self.ids, seeds, strict=True):
            self.procs.append(await self._spawn_bookie(bookie_id, seed))
        written = await writer.write_ledgers(self._ledgers())
        assert written == self.n
        await self._wait_registered()
        self.setup_s = time.monotonic() - started
        say(
            f"cluster: {self.n} ledgers, {self.bookie_count} bookie processes"
            f"{f', {self.latency_ms:g} ms latency' if self.latency_ms else ''}, "
            f"ready in {self.setup_s:.1f} s"
        )

    def _write_seeds(self) -> list[Path]:
        per_bookie: list[list[tuple[int, list[tuple[int, int]]]]] = [
            [] for _ in range(self.bookie_count)
        ]
        runs = [held_runs(i, self.entries_per_ledger) for i in range(E)]
        for ledger_id in range(1, self.n + 1):
            for position, bookie in enumerate(ensemble_of(ledger_id, self.bookie_count)):
                per_bookie[bookie].append((ledger_id, runs[position]))
        paths = []
        for i, ledgers in enumerate(per_bookie):
            path = self.work / f"bookie-{i}.seed"
            write_seed_file(path, ledgers)
            paths.append(path)
        return paths

    def _ledgers(self) -> Iterator[LedgerMetadata]:
        template = make_metadata(
            0,
            self.ids[:E],
            write_quorum=W,
            ack_quorum=A,
            last_entry_id=ENTRIES - 1,
            length=16 * ENTRIES,
        )
        segment = template.segments[0]
        for ledger_id in range(1, self.n + 1):
            ensemble = tuple(self.ids[b] for b in ensemble_of(ledger_id, self.bookie_count))
            yield replace(
                template, ledger_id=ledger_id, segments=(replace(segment, bookies=ensemble),)
            )

    def stats_path(self, i: int) -> Path:
        return self.work / f"bookie-{i}.stats.json"

    async def _spawn_bookie(self, bookie_id: str, seed: Path) -> asyncio.subprocess.Process:
        i = self.ids.index(bookie_id)
        args = [
            sys.executable,
            "-m",
            "bench.bookie_host",
            "--zk",
            self.hosts,
            "--port",
            bookie_id.rsplit(":", 1)[1],
            "--seed",
            str(seed),
            "--stats",
            str(self.stats_path(i)),
        ]
        if self.latency_ms:
            args += ["--latency-ms", str(self.latency_ms)]
        with _output(self.work / f"bookie-{i}.log") as log:
            return await asyncio.create_subprocess_exec(
                *args, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
            )

    async def _wait_registered(self) -> None:
        """Until every bookie is registered: seeded before it registers, so ready then."""
        assert self.zk is not None
        for i, bookie_id in enumerate(self.ids):
            while True:
                stat, changed = await self.zk.exists_watched(available_path(ROOT, bookie_id))
                if stat is not None:
                    break
                proc = self.procs[i]
                waits = [asyncio.ensure_future(changed.wait()), asyncio.ensure_future(proc.wait())]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for w in waits:
                    w.cancel()
                if proc.returncode is not None:
                    log = (self.work / f"bookie-{i}.log").read_text()[-2000:]
                    raise RuntimeError(f"bookie {bookie_id} exited {proc.returncode}:\n{log}")

    # --- the bookies' counters and the cluster's CPU ----------------------------------------

    async def _signal_stats(self, sig: signal.Signals) -> list[dict[str, Any]]:
        for i, proc in enumerate(self.procs):
            self.stats_path(i).unlink(missing_ok=True)
            proc.send_signal(sig)
        out = []
        deadline = time.monotonic() + STATS_TIMEOUT
        for i in range(len(self.procs)):
            path = self.stats_path(i)
            while not path.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bookie {self.ids[i]} wrote no stats")
                await asyncio.sleep(0.01)
            out.append(json.loads(path.read_text()))
        return out

    async def reset_stats(self) -> None:
        await self._signal_stats(signal.SIGUSR2)

    async def stats(self) -> list[dict[str, Any]]:
        return await self._signal_stats(signal.SIGUSR1)

    def cpu(self) -> ClusterCpu:
        zk_pid = self.server.proc.pid if self.server.proc is not None else 0
        return ClusterCpu(cpu_seconds(zk_pid), sum(cpu_seconds(p.pid) for p in self.procs))

    # --- measured workloads -------------------------------------------------------------------

    async def run_worker(
        self, task: str, *options: str, on_phase: OnPhase | None = None
    ) -> WorkerRun:
        """Runs `bench.worker TASK` against this cluster; `on_phase` at each boundary."""
        args = [sys.executable, "-m", "bench.worker", task, "--zk", self.hosts]
        args += ["--racks", str(self.racks), *options]
        err_path = self.work / f"worker-{task}-{time.monotonic_ns()}.err"
        result = WorkerRun()
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
                        if name == "done":
                            result.done = doc
                            continue
                        result.phases[name] = doc
                        if on_phase is not None:
                            await on_phase(name, doc)
                        proc.stdin.write(b"\n")
                        await proc.stdin.drain()
                    code = await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        if code != 0 or not result.done:
            tail = err_path.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"bench.worker {task} {' '.join(options)} exited {code}:\n{tail}")
        return result

    async def measure(self, task: str, *options: str, counters: bool = True) -> Measured:
        """`run_worker` with the cluster's CPU and (optionally) the bookies' counters per phase.

        With BENCH_PROFILE=DIR, each phase is also profiled (bench/profile.py).
        """
        measured = Measured(WorkerRun())
        last = [self.cpu()]
        profiler = None
        if os.environ.get("BENCH_PROFILE"):
            self.profiled += 1
            label = f"n{self.n}-{self.profiled}-{task}"
            profiler = PhaseProfiler(Path(os.environ["BENCH_PROFILE"]), label)

        async def on_phase(name: str, doc: dict[str, Any]) -> None:
            if profiler is not None:
                await profiler.stop(name)
            now = self.cpu()
            if name != "ready":
                measured.cluster_cpu[name] = now.since(last[0])
                if counters:
                    measured.counters[name] = await self.stats()
            if counters:
                await self.reset_stats()
            if profiler is not None:
                await profiler.start(int(doc["pid"]))
            last[0] = self.cpu()

        try:
            measured.run = await self.run_worker(task, *options, on_phase=on_phase)
        finally:
            if profiler is not None:
                await profiler.stop("exit")
        return measured

    # --- tear-down ------------------------------------------------------------------------

    async def stop(self) -> None:
        await stop_processes(self.procs)
        self.procs.clear()
        if self.zk is not None:
            with contextlib.suppress(Exception):
                await self.zk.close()
            self.zk = None
        await asyncio.to_thread(self.server.destroy)
        shutil.rmtree(self.work, ignore_errors=True)


async def serve(n: int, latency_ms: float) -> None:
    async with BenchCluster(n, latency_ms=latency_ms) as cluster:
        print(json.dumps({"zk": cluster.hosts, "racks": str(cluster.racks)}), flush=True)
        await asyncio.to_thread(sys.stdin.read)


def main() -> None:
    """`python -m bench.cluster N [LATENCY_MS]`: a cluster for profiling a worker by hand.

    Prints {"zk": ..., "racks": ...} once ready and serves until stdin closes.
    """
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    latency = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    asyncio.run(serve(n, latency))


if __name__ == "__main__":
    main()
