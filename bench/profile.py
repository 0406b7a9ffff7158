"""Per-phase py-spy profiles of the measured process: `BENCH_PROFILE=DIR make bench`.

A worker stops between phases, so py-spy can attach (`record --pid`) just
before a phase begins and stop just after it ends: each profile is one phase
and nothing else (no start-up, no cluster set-up). For each phase DIR gets
`TASK-PHASE.txt`, py-spy's collapsed stacks (one "frame;frame;... count"
line per stack; speedscope, inferno and flamegraph.pl read it), and
`TASK-PHASE.top.txt`, the functions with most samples, self and inclusive.

py-spy is not a dependency of the project: `pip install py-spy` into the
venv to use this. Sampling costs the measured process some speed, so
figures of a profiled run are not the benchmark's figures.

    python -m bench.profile FILE.txt   # the summary of a collapsed-stacks file
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import sys
from collections import Counter
from pathlib import Path

RATE = 250
_LINE_NO = re.compile(r":\d+\)$")


class PhaseProfiler:
    """Profiles one process phase by phase (py-spy record, attached by pid)."""

    def __init__(self, out_dir: Path, task: str) -> None:
        self.out_dir = out_dir
        self.task = task
        self.py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self._proc: asyncio.subprocess.Process | None = None
        self._current = out_dir / f"{task}-current.txt"

    async def start(self, pid: int) -> None:
        """Attaches; returns once py-spy samples."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._proc = await asyncio.create_subprocess_exec(
            self.py_spy,
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(RATE),
            "--format",
            "raw",
            "--output",
            str(self._current),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert self._proc.stdout is not None
        while line := await self._proc.stdout.readline():
            if b"Sampling process" in line:
                return
        raise RuntimeError(f"py-spy did not attach to {pid} (exit {await self._proc.wait()})")

    async def stop(self, phase: str) -> Path | None:
        """Stops sampling; the phase's stacks and their summary are written."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        proc.send_signal(signal.SIGINT)
        assert proc.stdout is not None
        await proc.stdout.read()
        await proc.wait()
        if not self._current.exists():
            return None
        path = self.out_dir / f"{self.task}-{phase}.txt"
        self._current.replace(path)
        path.with_suffix(".top.txt").write_text(summarize(path))
        return path


#: Leaf frames of a thread that waits for work: such samples are idle, not cost.
IDLE_LEAVES = ("Condition.wait (threading.py)", "_worker (concurrent/futures/thread.py)")
#: A thread's role, told by a frame on its stack.
ROLES = (
    ("run_forever (asyncio/base_events.py)", "event loop"),
    ("zk_loop (kazoo/protocol/connection.py)", "kazoo I/O thread"),
    ("_thread_worker (kazoo/handlers/threading.py)", "kazoo callback thread"),
)


def _role(frames: list[str]) -> str:
    for frame in frames:
        for marker, role in ROLES:
            if frame.endswith(marker):
                return role
    return "other"


def summarize(path: Path, top: int = 25) -> str:
    """Where the samples went: per thread role (idle waits left out), then the event
    loop's functions with most samples, self and inclusive (each stack counted once)."""
    roles: Counter[str] = Counter()
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    busy = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_LINE_NO.sub(")", f) for f in stack.split(";")]
        if frames[-1] in IDLE_LEAVES:
            idle += n
            continue
        busy += n
        role = _role(frames)
        roles[role] += n
        if role == "event loop":
            own[frames[-1]] += n
            for frame in set(frames):
                inclusive[frame] += n
    if busy == 0:
        return "no samples\n"
    loop = roles["event loop"] or 1
    lines = [f"{busy} busy samples, {idle} idle ({path.name})", "", "threads:"]
    lines += [f"{100 * n / busy:5.1f}%  {r}" for r, n in roles.most_common()]
    lines += ["", "event loop, self:"]
    lines += [f"{100 * n / loop:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines += ["", "event loop, inclusive (frames on nearly every stack left out):"]
    shown = [(f, n) for f, n in inclusive.most_common() if n < 0.98 * loop][:top]
    lines += [f"{100 * n / loop:5.1f}%  {f}" for f, n in shown]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1])), end="")
