"""A throwaway single-member etcd from Debian's `etcd-server` package (etcd 3.4).

Tests run the etcd adapter against a real server, never a fake: this starts
`/usr/bin/etcd` on free loopback ports (client and peer) with its data in a
temporary directory, and returns once its `/health` endpoint answers healthy
(polled at a short interval, within a deadline). `stop()` keeps the data and the
ports, so a later `start()` is the same server restarted (lease and keys kept, as a
restarted etcd keeps them); `destroy()` removes everything.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from auditor.errors import ServiceUnavailableError
from auditor.testing.zkserver import free_port

ETCD_BIN = Path(os.environ.get("BK_AUDITOR_ETCD", "/usr/bin/etcd"))
#: How often start() looks whether the server serves yet.
_POLL = 0.05


class EtcdServerError(ServiceUnavailableError):
    """The throwaway etcd could not be started."""


def healthy(endpoint: str, timeout: float = 1.0) -> bool:
    """Whether the etcd at `endpoint` answers its health check as healthy."""
    try:
        with urllib.request.urlopen(f"{endpoint}/health", timeout=timeout) as reply:
            return bool(json.loads(reply.read()).get("health") == "true")
    except (OSError, ValueError, urllib.error.URLError):
        return False


class EtcdServer:
    """One single-member etcd cluster; `start()` blocks until it serves (or raises)."""

    def __init__(self, base_dir: Path | None = None, port: int | None = None) -> None:
        self._own_dir = base_dir is None
        self.base_dir = base_dir or Path(tempfile.mkdtemp(prefix="bk-auditor-etcd-"))
        self.port = port or free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hosts(self) -> str:
        """host:port, the form without a scheme."""
        return f"127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            str(ETCD_BIN),
            "--name", "bk-auditor-test",
            "--data-dir", str(self.base_dir / "data"),
            "--listen-client-urls", self.endpoint,
            "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"bk-auditor-test={peer}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", "bk-auditor-test",
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]  # fmt: skip

    def start(self, timeout: float = 30.0) -> None:
        if not ETCD_BIN.exists():
            raise EtcdServerError(
                f"{ETCD_BIN} not found: install Debian's etcd-server package (make test does)"
            )
        log = open(self.base_dir / "etcd.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            self._command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise EtcdServerError(f"etcd exited with {code}; see {self.base_dir}/etcd.log")
            if healthy(self.endpoint, timeout=min(1.0, max(deadline - time.monotonic(), 0.01))):
                return
            time.sleep(_POLL)
        self.stop()
        raise EtcdServerError(f"etcd did not serve on {self.endpoint} within {timeout:g}s")

    def stop(self) -> None:
        """Stops the server, keeping its data and ports (a later start() serves them again)."""
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def restart(self, timeout: float = 30.0) -> None:
        self.stop()
        self.start(timeout)

    def destroy(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
