"""The standalone-cluster tests ship the project to the executors as an operator does, with
the archive `deploy/spark/pack-venv.sh` makes; making it downloads the dependencies (minutes),
so a test session must not pay that each time.

The packed virtualenv of the tests, kept in the checkout's ignored `.cache/spark-venv/KEY/`.

KEY is a hash of what decides the dependencies (pyproject.toml, constraints.txt, the script,
the interpreter), so a new pin makes a new venv. Within one, the script reinstalls only the
project when the sources changed since the archive was packed (a hash of them, kept beside
it), and nothing is run when they did not: a second `make test` reuses the archive as it
is. A lock file serialises sessions: one packs while others wait, and a session holds the
lock shared while it uses the archive, so no other session repacks it under its feet.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

#: A first pack downloads pyarrow, grpcio and the rest: generous, but never a hung session.
PACK_TIMEOUT = 1200.0
SCRIPT = Path("deploy/spark/pack-venv.sh")


@dataclass(frozen=True)
class PackedVenv:
    """What submit.sh takes as VENV_DIR: `pyspark_venv/` and `pyspark_venv.tar.gz`."""

    directory: Path
    #: Seconds this session spent packing (0.0 when the cached archive was current).
    seconds: float
    #: "reused", "refreshed" (the project reinstalled) or "built" (a new venv).
    how: str
    #: Held shared while the archive is in use; closing it lets other sessions repack.
    lock: IO[bytes]

    @property
    def archive(self) -> Path:
        return self.directory / "pyspark_venv.tar.gz"

    @property
    def python(self) -> Path:
        return self.directory / "pyspark_venv" / "bin" / "python"

    def release(self) -> None:
        self.lock.close()


def _digest(paths: list[Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(str(p).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _sources(repo: Path) -> list[Path]:
    files = [
        p
        for p in sorted((repo / "auditor").rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    ]
    return [repo / "pyproject.toml", repo / "README.md", *files]


def _clean_env() -> dict[str, str]:
    """This process's environment without what would put its own packages in the venv's."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in drop}


def packed_venv(repo: Path, python: str) -> PackedVenv:
    """The current archive of `repo` packed with `python` (a real interpreter path)."""
    script = repo / SCRIPT
    key = _digest(
        [repo / "pyproject.toml", repo / "constraints.txt", script], os.path.realpath(python)
    )[:16]
    directory = repo / ".cache" / "spark-venv" / key
    directory.mkdir(parents=True, exist_ok=True)
    lock = open(directory / ".lock", "wb")  # noqa: SIM115 - returned, closed by release()
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sources = _digest(_sources(repo))
        stamp = directory / ".sources"
        archive = directory / "pyspark_venv.tar.gz"
        began = time.monotonic()
        how = "reused"
        if not (archive.exists() and stamp.exists() and stamp.read_text() == sources):
            had_venv = (directory / "pyspark_venv" / ".pack-venv-stamp").exists()
            stamp.unlink(missing_ok=True)
            done = subprocess.run(
                [str(script), str(directory)],
                env={**_clean_env(), "PYTHON": python},
                capture_output=True,
                timeout=PACK_TIMEOUT,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"pack-venv.sh exited with {done.returncode}: "
                    f"{done.stderr.decode(errors='replace')[-2000:]}"
                )
            stamp.write_text(sources)
            how = "refreshed" if had_venv else "built"
        seconds = time.monotonic() - began if how != "reused" else 0.0
        fcntl.flock(lock, fcntl.LOCK_SH)
    except BaseException:
        lock.close()
        raise
    return PackedVenv(directory, seconds, how, lock)
