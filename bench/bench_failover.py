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
  ZooKeeper); `index_load_s` is that load's own duration from its log line.
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
        """The index of the first line from `after` on whose event is `event` (within WAIT s)."""

        def found() -> int | None:
            for i in range(after, len(self.lines)):
                if self.lines[i].get("event") == event:
                    return i
            return None

        async with asyncio.timeout(WAIT), self._changed:
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


async def measure(n: int) -> dict[str, Any]:
    session = float(os.environ.get("BENCH_SESSION_TIMEOUT", "6"))
    load = round(os.getloadavg()[0], 2)
    async with BenchCluster(n) as cluster:
        first = DaemonProcess("a", cluster, session)
        second = DaemonProcess("b", cluster, session)
        try:
            await first.start()
            await first.wait_for("elected auditor")
            await second.start()
            await second.wait_for("daemon started")
            await _votes(cluster, 2)
            started = await first.wait_for("check started")
            old_check = first.lines[started].get("check")
            say(f"failover: leader a runs its first check ({old_check}); SIGKILL")
            killed = first.kill()
            elected = await second.wait_for("elected auditor")
            due = await second.wait_for("check due", elected)
            say(f"failover: b elected after {second.stamp(elected) - killed:.2f} s")
            began = await second.wait_for("check started", due)
            loaded = await second.wait_for("index loaded", elected)
            index_load_s = float(second.lines[loaded].get("seconds", 0.0))
            figure_check = second.lines[due].get("check")
        finally:
            await first.stop()
            await second.stop()
    to_due = round(second.stamp(due) - killed, 2)
    return {
        "bench": "failover",
        "n": n,
        "load_avg_before": load,
        "zk_session_timeout_s": session,
        "killed_during": old_check,
        "to_elected_s": round(second.stamp(elected) - killed, 2),
        "to_first_check_due_s": to_due,
        "first_check": figure_check,
        "to_first_check_started_s": round(second.stamp(began) - killed, 2),
        "index_load_s": round(index_load_s, 2),
        "note": "check started includes the new leader's index load of n ledgers",
        "target": "first check task start <= ZooKeeper session timeout + 2 s",
        "met": to_due <= session + 2,
    }


def main() -> None:
    emit(asyncio.run(measure(bench_n())))


if __name__ == "__main__":
    main()
