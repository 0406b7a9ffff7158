"""`failover`: seconds from SIGKILL of the leading daemon to the new leader's first check.

A cluster of N ledgers and two `bk-auditor run` daemons (ZooKeeper session
timeout BENCH_SESSION_TIMEOUT, default 6 s). The first one is started alone
so it leads; the second joins the election; once the leader has begun its
first check (its index loaded, the check under way), it is killed with
SIGKILL, so nothing is handed over: its vote disappears only when ZooKeeper
expires its session. Times come from the survivor's JSON log lines:

* `elected`: "elected auditor";
* `first_check_due`: "check due", the moment the first check's task begins
  (the figure the target is about);
* `first_check_started`: "check started", when that check actually runs,
  which includes loading the new leader's metadata index (N ledgers from
  ZooKeeper) when it has none yet; `index_load_s` is that load's own duration
  from its log line.

Where the daemon keeps a standby index on followers (`daemon.standby_index`,
the default where it exists), the leader is killed only once the follower
has logged "index loaded", so the figure is a warm standby's fail-over.
`failover-1m` (bench/bench_big.py) is the same figure at BENCH_BIG_N ledgers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from datetime import datetime
from typing import Any

from auditor.daemon.election import election_path
from auditor.testing.zkserver import free_port
from bench.cluster import BenchCluster
from bench.common import ROOT, bench_n, emit, say

WAIT = 600.0


class DaemonProcess:
    """One `bk-auditor run` child whose JSON log lines are kept, parsed, as they come."""

    def __init__(self, name: str, cluster: BenchCluster, session_timeout: float) -> None:
        self.name = name
        self.cluster = cluster
        self.session_timeout = session_timeout
        self.lines: list[dict[str, Any]] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._changed = asyncio.Condition()
        self._reader: asyncio.Task[None] | None = None
        #: Seconds `wait_for` waits for a line.
        self.wait = WAIT

    async def start(self) -> None:
        api, metrics = free_port(), free_port()
        sets = [
            f"daemon.identity=bench-{self.name}:{api}",
            "daemon.jitter=0",
            f"daemon.zk_session_timeout={self.session_timeout:g}",
            "api.host=127.0.0.1",
            f"api.port={api}",
            "metrics.host=127.0.0.1",
            f"metrics.port={metrics}",
            "auditorPeriodicBookieCheckInterval=3600",
            "auditorPeriodicCheckInterval=3600",
            "auditorPeriodicPlacementPolicyCheckInterval=3600",
            "auditorReplicasCheckInterval=3600",
            "underreplicatedLedgerRecoveryGracePeriod=3600",
            f"checks.racks_file={self.cluster.racks}",
            "checks.progress_interval=3600",
            "worker.enabled=false",  # the figure is the auditor's fail-over
        ]
        args = [sys.executable, "-m", "auditor", "run", "--zk", self.cluster.hosts]
        for s in sets:
            args += ["--set", s]
        self.proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            try:
                doc = json.loads(line)
            except ValueError:
                doc = {"event": line.decode(errors="replace").rstrip()}
            if not isinstance(doc, dict):
                continue
            async with self._changed:
                self.lines.append(doc)
                self._changed.notify_all()
        async with self._changed:
            self.lines.append({"event": "<exited>"})
            self._changed.notify_all()

    async def wait_for(self, event: str, after: int = 0) -> int:
        """The index of the first line from `after` on whose event is `event` (within `wait` s)."""

        def found() -> int | None:
            for i in range(after, len(self.lines)):
                if self.lines[i].get("event") == event:
                    return i
            return None

        async with asyncio.timeout(self.wait), self._changed:
            while (at := found()) is None:
                if self.lines and self.lines[-1].get("event") == "<exited>":
                    raise RuntimeError(f"daemon {self.name} exited:\n{self.tail()}")
                await self._changed.wait()
        return at

    def tail(self) -> str:
        return "\n".join(json.dumps(line) for line in self.lines[-20:])

    def stamp(self, i: int) -> float:
        return datetime.fromisoformat(str(self.lines[i]["timestamp"])).timestamp()

    def kill(self) -> float:
        """SIGKILL; returns the wall-clock time it was sent."""
        assert self.proc is not None
        at = time.time()
        os.kill(self.proc.pid, signal.SIGKILL)
        return at

    async def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 60)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


async def _votes(cluster: BenchCluster, count: int) -> None:
    """Until the election has `count` votes."""
    zk = cluster.zk
    assert zk is not None
    path = election_path(ROOT)
    await zk.ensure_path(path)
    while True:
        children, changed = await zk.get_children_watched(path)
        if len(children) >= count:
            return
        await changed.wait()


def standby_index() -> bool:
    """Whether this daemon keeps a standby index on followers (`daemon.standby_index`)."""
    try:
        from auditor.daemon.config.sections import DaemonSection
    except ImportError:
        return False
    return bool(getattr(DaemonSection(), "standby_index", False))


async def run_on(cluster: BenchCluster, n: int, name: str = "failover") -> dict[str, Any]:
    """The fail-over figure on a running cluster of `n` ledgers, named `name`."""
    session = float(os.environ.get("BENCH_SESSION_TIMEOUT", "6"))
    load = round(os.getloadavg()[0], 2)
    standby = standby_index()
    standby_loaded_s: float | None = None
    first = DaemonProcess("a", cluster, session)
    second = DaemonProcess("b", cluster, session)
    first.wait = second.wait = max(WAIT, n / 100)  # index loads of large clusters
    try:
        await first.start()
        await first.wait_for("elected auditor")
        await second.start()
        await second.wait_for("daemon started")
        await _votes(cluster, 2)
        if standby:
            # The follower keeps an index too: the figure is about a warm standby, so
            # the leader dies only once the follower's index is loaded.
            at = await second.wait_for("index loaded")
            standby_loaded_s = float(second.lines[at].get("seconds", 0.0))
            say(f"{name}: follower b's standby index loaded ({standby_loaded_s:.1f} s)")
        started = await first.wait_for("check started")
        old_check = first.lines[started].get("check")
        say(f"{name}: leader a runs its first check ({old_check}); SIGKILL")
        killed = first.kill()
        kill_line = len(second.lines)
        elected = await second.wait_for("elected auditor")
        due = await second.wait_for("check due", elected)
        say(f"{name}: b elected after {second.stamp(elected) - killed:.2f} s")
        began = await second.wait_for("check started", due)
        # The index the first check read: loaded after the kill (no standby), or before.
        loads = [i for i in range(began) if second.lines[i].get("event") == "index loaded"]
        index_load_s = float(second.lines[loads[-1]].get("seconds", 0.0)) if loads else 0.0
        loaded_after_kill = bool(loads) and loads[-1] >= kill_line
        figure_check = second.lines[due].get("check")
    finally:
        await first.stop()
        await second.stop()
    to_due = round(second.stamp(due) - killed, 2)
    return {
        "bench": name,
        "n": n,
        "load_avg_before": load,
        "zk_session_timeout_s": session,
        "standby_index": standby,
        "standby_index_load_s": standby_loaded_s,
        "killed_during": old_check,
        "to_elected_s": round(second.stamp(elected) - killed, 2),
        "to_first_check_due_s": to_due,
        "first_check": figure_check,
        "to_first_check_started_s": round(second.stamp(began) - killed, 2),
        "index_load_s": round(index_load_s, 2),
        "index_loaded_after_kill": loaded_after_kill,
        "note": "check started includes the new leader's index load of n ledgers when it "
        "had no standby index",
        "target": "first check task start <= ZooKeeper session timeout + 2 s",
        "met": to_due <= session + 2,
    }


async def measure(n: int) -> dict[str, Any]:
    async with BenchCluster(n) as cluster:
        return await run_on(cluster, n)


def main() -> None:
    emit(asyncio.run(measure(bench_n())))


if __name__ == "__main__":
    main()
