"""The tests' throwaway ZooKeeper and etcd start differently, but must stop, restart and be
removed alike, so that a restart test means the same on either store.

What a throwaway server of the tests (ZooKeeper, etcd) does with its process and its
directory, whatever the server: stop it (keeping its data and ports, for a restart),
start it again, remove it.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

#: How often `launch` looks whether the server serves yet.
POLL = 0.05


class ServerProcess:
    """A server run as a child process with a data directory; subclasses `start()` it."""

    def __init__(self, base_dir: Path, own_dir: bool) -> None:
        self.base_dir = base_dir
        #: Whether the directory is ours to remove when the server is destroyed.
        self._own_dir = own_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        raise NotImplementedError

    def launch(
        self,
        command: Sequence[str],
        log_name: str,
        serving: Callable[[float], bool],
        timeout: float,
        failed: Callable[[str], Exception],
        where: str,
    ) -> None:
        """Starts `command` (output to `log_name` in the directory) and returns once
        `serving(seconds left, at most 1)` holds; `failed(message)` is raised when the process
        exits first, or (the process stopped) when it does not serve within `timeout`."""
        log = open(self.base_dir / log_name, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise failed(f"exited with {code}; see {self.base_dir / log_name}")
            if serving(min(1.0, max(deadline - time.monotonic(), 0.01))):
                return
            time.sleep(POLL)
        self.stop()
        raise failed(f"did not serve on {where} within {timeout:g}s")

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

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
