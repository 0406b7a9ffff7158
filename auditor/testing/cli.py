"""The CLI's contract (its exit status, exactly what it prints on stdout and stderr) is only
testable in a child process, where nothing of the test's own process (logging set-up, event
loop) leaks into it.

Running `bk-auditor` as a user does, in a child process, for the CLI tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any


async def bk(
    *args: str, within: float = 120, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """`bk-auditor ARGS...`: exit status, stdout and stderr (`env`: the whole environment)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "auditor",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=None if env is None else dict(env),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), within)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def on_a_terminal(*args: str, within: float = 120) -> tuple[int, str, str]:
    """`bk-auditor ARGS...` with stderr on a pseudo-terminal (blocking: run it in a thread):
    exit status, stdout, and what the terminal showed (line ends as `\\n`)."""
    master, slave = pty.openpty()
    # stdout to a file: a pipe nobody reads until the terminal closes would fill and stall
    # the child on a long report
    with tempfile.TemporaryFile() as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "auditor", *args], stdout=stdout, stderr=slave
        )
        os.close(slave)
        shown = bytearray()
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        os.close(master)
        code = proc.wait(within)
        stdout.seek(0)
        out = stdout.read().decode()
    return code, out, shown.decode().replace("\r\n", "\n")


def one_json(stdout: str) -> dict[str, Any]:
    """The one JSON document a `--json` command prints, and nothing else."""
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    doc: dict[str, Any] = json.loads(lines[0])
    return doc
