"""What every benchmark shares: the figure stream, progress lines, sizes, the machine.

Stdout carries figures only, one JSON object a line, so `make bench | jq` and
a later comparison of two runs need no parsing of prose; progress and
diagnostics go to stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: The cluster shape of issue #7: closed ledgers of 10 entries, E=3, W=2, A=2, 6 bookies.
ENTRIES = 10
E, W, A = 3, 2, 2
BOOKIES = 6
ROOT = "/ledgers"

_T0 = time.monotonic()


def emit(figure: dict[str, Any]) -> None:
    print(json.dumps(figure), flush=True)


def say(message: str) -> None:
    print(f"[bench {time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    return int(raw) if raw.strip() else default


def bench_n() -> int:
    """N of the issue: ledgers in the measured cluster (BENCH_N, default 100,000)."""
    return env_int("BENCH_N", 100_000)


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


# --- processes ----------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one live process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(rest[11]) + int(rest[12])) / TICK


# --- the machine ---------------------------------------------------------------------


def _proc_field(path: str, key: str) -> str:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return ""


def _first_line(args: list[str]) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if lines else "unknown"


def zookeeper_version() -> str:
    jar = Path(os.environ.get("BK_AUDITOR_ZK_JAR", "/usr/share/java/zookeeper.jar"))
    version = _first_line(["dpkg-query", "-W", "-f", "${Version}", "zookeeper"])
    return f"{version} ({jar})"


def machine() -> dict[str, Any]:
    mem_kb = _proc_field("/proc/meminfo", "MemTotal").split()
    return {
        "cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor(),
        "cores": os.cpu_count(),
        "ram_gb": round(int(mem_kb[0]) / 2**20, 1) if mem_kb else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "java": _first_line(["java", "-version"]),
        "zookeeper": zookeeper_version(),
    }


async def stop_processes(procs: list[asyncio.subprocess.Process]) -> None:
    """SIGTERM to each process still running, then each waited for (killed after 30 s)."""
    for proc in procs:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def run_timed(
    args: list[str],
    out: Any,
    err: Any,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int, float, Any]:
    """Runs `args` to its end, stdout and stderr to the open files `out` and `err`:
    (exit code, wall seconds, the child's `resource.struct_rusage` from `os.wait4`, so its
    CPU is its own). Interrupted, the child is killed and reaped."""
    started = time.monotonic()
    proc = subprocess.Popen(
        args, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=cwd, env=env
    )
    try:
        _, status, ru = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return os.waitstatus_to_exitcode(status), time.monotonic() - started, ru
