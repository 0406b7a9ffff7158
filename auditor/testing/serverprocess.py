"""What a throwaway server of the tests (ZooKeeper, etcd) does with its process and its
directory, whatever the server: stop it (keeping its data and ports, for a restart),
start it again, remove it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Self


class ServerProcess:
    """A server run as a child process with a data directory; subclasses `start()` it."""

    def __init__(self, base_dir: Path, own_dir: bool) -> None:
        self.base_dir = base_dir
        #: Whether the directory is ours to remove when the server is destroyed.
        self._own_dir = own_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        raise NotImplementedError

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
