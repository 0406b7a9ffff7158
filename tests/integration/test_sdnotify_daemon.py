"""What systemd hears from `bk-auditor run`: READY, STATUS lines by phase, STOPPING.

Two daemons run as real processes against the real ZooKeeper, each with its own
AF_UNIX datagram socket as `$NOTIFY_SOCKET`, the way systemd starts a `Type=notify`
unit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from auditor.testing.harness import test_cluster
from auditor.testing.zkserver import free_port
from auditor.zk import ZkClient


class Notified:
    """One daemon's notify socket and every line it sent (WATCHDOG=1 pings aside)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.lines: list[str] = []

    async def until(self, wanted: Callable[[str], bool], within: float = 30.0) -> str:
        """The first line so far, or to come, that `wanted` accepts."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + within
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if wanted(line):
                    return line
            seen = len(self.lines)
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"not sent within {within} s; got {self.lines}"
            with contextlib.suppress(TimeoutError):
                data = await asyncio.wait_for(loop.sock_recv(self.sock, 4096), remaining)
                self.lines += [x for x in data.decode().splitlines() if x != "WATCHDOG=1"]

    def close(self) -> None:
        self.sock.close()


@contextlib.asynccontextmanager
async def daemon(
    zk_hosts: str, name: str, notify: Notified
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    api, metrics = free_port(), free_port()
    identity = f"{name}:{api}"
    args = [
        "run", "--zk", zk_hosts,
        "--set", f"daemon.identity={identity}",
        "--set", "daemon.zk_session_timeout=4",
        "--set", "api.host=127.0.0.1", "--set", f"api.port={api}",
        "--set", "metrics.host=127.0.0.1", "--set", f"metrics.port={metrics}",
        "--set", "auditorPeriodicBookieCheckInterval=3600",
        "--set", "auditorPeriodicCheckInterval=0",
        "--set", "auditorPeriodicPlacementPolicyCheckInterval=3600",
        "--set", "auditorReplicasCheckInterval=0",
        "--set", "daemon.jitter=0",
        "--set", "worker.enabled=false",
    ]  # fmt: skip
    env = {**os.environ, "NOTIFY_SOCKET": str(notify.path)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "auditor", *args, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield proc, identity
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_status_lines_through_leading_following_and_a_handover(
    zk: ZkClient, tmp_path: Path
) -> None:
    a_sock, b_sock = Notified(tmp_path / "a.sock"), Notified(tmp_path / "b.sock")
    try:
        async with test_cluster(zk, 1), daemon(zk.hosts, "alpha", a_sock) as (a, alpha):
            await a_sock.until(lambda x: x == "READY=1")
            # The first line, before ZooKeeper answers; then the first checks of the
            # leader (the placement check never ran on this cluster: it runs at once).
            assert a_sock.lines[0] == "STATUS=waiting for ZooKeeper"
            await a_sock.until(lambda x: x.startswith("STATUS=leading; last check "))
            async with daemon(zk.hosts, "beta", b_sock) as (b, _):
                await b_sock.until(lambda x: x == "READY=1")
                await b_sock.until(lambda x: x == f"STATUS=following {alpha}")
                a.send_signal(signal.SIGTERM)
                await a_sock.until(lambda x: x == "STOPPING=1")
                assert "STATUS=stopping: handing over leadership" in a_sock.lines
                assert await asyncio.wait_for(a.wait(), 30) == 0
                await b_sock.until(lambda x: x.startswith("STATUS=leading; "))
                b.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(b.wait(), 30) == 0
        # Sent on changes only: no line twice in a row.
        for lines in (a_sock.lines, b_sock.lines):
            statuses = [x for x in lines if x.startswith("STATUS=")]
            assert all(x != y for x, y in itertools.pairwise(statuses)), statuses
    finally:
        a_sock.close()
        b_sock.close()


async def test_a_configuration_error_exits_2(tmp_path: Path) -> None:
    """The unit's RestartPreventExitStatus=2: a bad setting is not restarted forever."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "auditor", "run", "--zk", "127.0.0.1:1",
        "--set", "api.port=not-a-port",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, err.decode()
