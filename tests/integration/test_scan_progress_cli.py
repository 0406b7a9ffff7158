"""`bk-auditor scan` and `snapshot` show how far they are: a bar on a terminal, lines in a pipe.

Real ZooKeeper, the CLI in a child process (the in-process engine; the Spark engine's
progress is in `test_scan_progress_spark.py`).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from auditor.testing.cli import bk, on_a_terminal
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.zk import ZkClient

LEDGERS = 2000
ENSEMBLE = ["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"]
FULL = "#" * 30
FAST = ("--set", "checks.progress_interval=0.001")
#: One drawing of the bar (up to the next carriage return or line end).
DRAWN = re.compile(r"\r(\[[#-]{30}\] [^\r\n]*)")


async def _cluster(zk: ZkClient) -> None:
    w = ClusterWriter(zk)
    await w.init_cluster()
    await w.write_ledgers(make_metadata(i, ENSEMBLE, write_quorum=2) for i in range(1, LEDGERS + 1))


def _along(stage: str, walked: int) -> re.Pattern[str]:
    """The bar along the way: below 100% with an ETA, or the stage done (the scan is not:
    its driver still writes the output)."""
    return re.compile(
        rf"\[[#-]{{30}}\] (\d|[1-9]\d)% {stage}: [0-2]/2 partitions, [\d,]+ ledgers, "
        r"ETA (\d+:\d\d|\?) *"
        rf"|\[#{{30}}\] 100% {stage}: 2/2 partitions, {walked:,} ledgers *"
    )


@pytest.mark.parametrize(
    ("command", "stage", "walked", "done"),
    [
        # two checks walk every ledger
        (("scan", "--checks", "placement,metadata"), "scan of 2 id ranges", 2 * LEDGERS, "scan"),
        (("snapshot",), "snapshot of 2 id ranges", LEDGERS, "snapshot"),
    ],
)
async def test_a_bar_on_a_terminal_ending_at_100(
    zk: ZkClient, tmp_path: Path, command: tuple[str, ...], stage: str, walked: int, done: str
) -> None:
    await _cluster(zk)
    args = (*command, "--zk", zk.hosts, "--partitions", "2", "--out", str(tmp_path / "o"), *FAST)
    rc, _, shown = await asyncio.to_thread(on_a_terminal, *args)
    assert rc in (0, 1), shown
    drawn = DRAWN.findall(shown)
    assert drawn, shown
    assert re.fullmatch(rf"\[{FULL}\] 100% {done}, in 0:\d\d *", drawn[-1]), drawn[-1]
    along = drawn[:-1]
    assert along, shown  # a 2,000-ledger walk outlasts many 1 ms intervals
    for line in along:
        assert _along(stage, walked).fullmatch(line), line
    # the bar takes the place of the progress lines, the partitions' own included
    assert "scan progress" not in shown and "check progress" not in shown
    assert re.search(rf"\[{FULL}\] 100% {done}, in 0:\d\d *\n", shown)


async def test_no_bar_with_no_progress(zk: ZkClient, tmp_path: Path) -> None:
    await _cluster(zk)
    args = ("snapshot", "--zk", zk.hosts, "--out", str(tmp_path / "o"), "--no-progress", *FAST)
    rc, _, shown = await asyncio.to_thread(on_a_terminal, *args)
    assert rc == 0, shown
    assert "\r" not in shown
    assert "scan progress" in shown


async def test_progress_lines_in_a_pipe(zk: ZkClient, tmp_path: Path) -> None:
    await _cluster(zk)
    rc, _, err = await bk(
        "scan",
        "--checks",
        "placement",
        "--zk",
        zk.hosts,
        "--partitions",
        "2",
        "--out",
        str(tmp_path / "o"),
        *FAST,
    )
    assert rc in (0, 1), err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if "scan progress" in line]
    assert lines, err
    for line in lines:
        assert "stage='scan of 2 id ranges'" in line and "partitions=2" in line, line
        assert re.search(r"partitions_done=[0-2] ", line) and "ledgers_done=" in line, line
