"""`bk-auditor check` on a terminal draws a progress bar; in a pipe it logs progress lines.

Real ZooKeeper, the CLI in a child process whose stderr is a pseudo-terminal (or a pipe).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

from auditor.testing.cli import on_a_terminal
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.zk import ZkClient

LEDGERS = 300
ENSEMBLE = ["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"]
FULL = "#" * 30
#: One drawing of the bar (text up to the next carriage return or line end).
BAR = re.compile(r"\rcheck placement ([^\r\n]*)")
#: The bar along the way: with an estimate of the total, or the count so far.
ALONG = re.compile(
    r"(\[[#-]{30}\] \d+% [\d,]+/~[\d,]+ ledgers, ETA (\d+:\d\d|\?)|[\d,]+ ledgers, \d+:\d\d) *"
)


async def _cluster(zk: ZkClient) -> None:
    w = ClusterWriter(zk)
    await w.init_cluster()
    await w.write_ledgers(make_metadata(i, ENSEMBLE, write_quorum=2) for i in range(1, LEDGERS + 1))


def _run_in_a_pipe(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "auditor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


async def test_a_bar_on_a_terminal_ending_at_100(zk: ZkClient) -> None:
    await _cluster(zk)
    # a short interval of the user's own: it is kept, so the bar is drawn along the way too
    args = ("check", "placement", "--zk", zk.hosts, "--set", "checks.progress_interval=0.001")
    rc, out, shown = await asyncio.to_thread(on_a_terminal, *args)
    assert rc in (0, 1), shown
    assert out.startswith(f"check placement: {LEDGERS} ledgers checked"), out
    bars = BAR.findall(shown)
    assert bars, shown
    assert re.fullmatch(rf"\[{FULL}\] 100% {LEDGERS}/{LEDGERS} ledgers, in 0:\d\d *", bars[-1])
    for drawn in bars[:-1]:  # along the way: a bar with an estimate, or the count so far
        assert re.fullmatch(ALONG, drawn) and "100%" not in drawn, drawn
    # the bar takes the place of the progress log line; the other log lines stay
    assert "check progress" not in shown
    assert "placement check finished" in shown
    # the last drawing ends its line
    assert re.search(rf"\[{FULL}\] 100% {LEDGERS}/{LEDGERS} ledgers, in 0:\d\d *\n", shown)


async def test_no_progress_on_a_terminal(zk: ZkClient) -> None:
    await _cluster(zk)
    args = ["check", "placement", "--zk", zk.hosts, "--no-progress"]
    args += ["--set", "checks.progress_interval=0.001"]
    rc, _, shown = await asyncio.to_thread(on_a_terminal, *args)
    assert rc in (0, 1), shown
    assert "\r" not in shown
    assert "check progress" in shown


async def test_log_lines_in_a_pipe(zk: ZkClient) -> None:
    await _cluster(zk)
    args = ("check", "placement", "--zk", zk.hosts, "--set", "checks.progress_interval=0.001")
    rc, _, err = await asyncio.to_thread(_run_in_a_pipe, *args)
    assert rc in (0, 1), err
    assert "\r" not in err
    progress = [line for line in err.splitlines() if "check progress" in line]
    assert progress, err
    assert "check=placement" in progress[0] and "ledgers_done=" in progress[0], progress[0]
