"""A scan's progress: partitions' shares, a stage's line, the reporter, and the CLI's bar."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest
import structlog

from auditor.cli.progress import ProgressBar, render_share, scan_detail
from auditor.scan.progress import (
    SCAN_PROGRESS_EVENT,
    PartitionProgress,
    StageTally,
    local_stage,
    reporting_stages,
)

FULL = "#" * 30


def test_a_partition_moves_through_its_checks() -> None:
    p = PartitionProgress(checks=3)
    assert p.share == 0.0
    p.tick(1, None)  # no estimate yet: the count moves, the share does not
    assert (p.ledgers, p.share) == (1, 0.0)
    p.tick(50, 100)
    assert p.ledgers == 50
    assert p.share == pytest.approx(0.5 / 3)
    p.end_check()  # the first check walked 100 ledgers
    p.tick(100, 100)
    assert p.ledgers == 150  # the second check counts on from the first one's 50
    assert p.share == pytest.approx(2 / 3)
    p.end_check()
    p.tick(400, 100)  # an estimate passed: the running check's share stops at its whole
    assert p.share == pytest.approx(1.0)
    p.end_check()
    p.end_check()  # more checks ended than it runs: never beyond the whole
    assert p.share == 1.0
    assert not p.finished
    p.finish()
    assert p.finished and p.share == 1.0


def test_a_local_stage_line() -> None:
    stage = local_stage("scan of 4 id ranges", 4, checks=2)
    stage.started = 10.0
    parts = stage.parts
    assert parts is not None and len(parts) == 4
    parts[0].tick(30, 60)
    parts[0].end_check()
    parts[0].tick(60, 60)
    parts[0].finish()
    parts[1].tick(30, 60)  # a quarter of its two checks
    # shares 1 + 0.25 + 0 + 0 over 4 partitions: 31.25% after 5 s, 11 s to go
    assert stage.fields(15.0) == {
        "stage": "scan of 4 id ranges",
        "partitions_done": 1,
        "partitions": 4,
        "percent": 31.2,
        "ledgers_done": 120,
        "eta_s": 11.0,
    }


def test_a_spark_stage_line_counts_finished_tasks_only() -> None:
    stage = StageTally("scan of 8 id ranges", 8, started=0.0)
    assert stage.fields(3.0) == {
        "stage": "scan of 8 id ranges",
        "partitions_done": 0,
        "partitions": 8,
        "percent": 0.0,
    }
    stage.partitions_done = 2
    assert stage.fields(4.0) == {
        "stage": "scan of 8 id ranges",
        "partitions_done": 2,
        "partitions": 8,
        "percent": 25.0,
        "eta_s": 12.0,
    }
    stage.partitions_done = 9  # never more than there are
    assert stage.fields(4.0)["partitions_done"] == 8
    assert "eta_s" not in stage.fields(4.0)


class _Log:
    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.logged = asyncio.Event()

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append({"event": event, **fields})
        if len(self.lines) >= 3:
            self.logged.set()


async def test_the_reporter_logs_the_running_stage_and_stops_with_the_body() -> None:
    log = _Log()
    stage = StageTally("snapshot of 2 id ranges", 2, started=0.0)
    current: list[StageTally | None] = [None]
    async with reporting_stages(log, lambda: current[0], 0.001, clock=lambda: 1.0):
        current[0] = stage
        await asyncio.wait_for(log.logged.wait(), 10)
    count = len(log.lines)
    await asyncio.sleep(0.01)  # no line after the body: the reporter is gone
    assert len(log.lines) == count
    assert {line["event"] for line in log.lines} == {SCAN_PROGRESS_EVENT}
    assert log.lines[-1]["stage"] == "snapshot of 2 id ranges"


def test_render_share() -> None:
    assert render_share(0.4, "scan: 2/5 partitions", 12.0) == (
        "\r[" + "#" * 12 + "-" * 18 + "] 40% scan: 2/5 partitions, ETA 0:12"
    )
    assert render_share(0.999, "x", None) == "\r[" + "#" * 29 + "-] 99% x, ETA ?"
    assert render_share(1.0, "scan, in 0:07", None) == f"\r[{FULL}] 100% scan, in 0:07"
    assert render_share(-1.0, "x", None) == "\r[" + "-" * 30 + "] 0% x, ETA ?"


def test_scan_detail() -> None:
    fields: dict[str, Any] = {"stage": "scan of 8 id ranges", "partitions_done": 3}
    fields["partitions"] = 8
    assert scan_detail(fields) == "scan of 8 id ranges: 3/8 partitions"
    fields["ledgers_done"] = 12345
    assert scan_detail(fields) == "scan of 8 id ranges: 3/8 partitions, 12,345 ledgers"


def test_a_scan_bar_draws_scan_events_and_drops_the_partitions_own() -> None:
    out = io.StringIO()
    now = [100.0]
    bar = ProgressBar(out, lambda: now[0], scan=True)
    bar.begin("")
    with pytest.raises(structlog.DropEvent):
        bar(None, "info", {"event": "check progress", "check": "placement", "ledgers_done": 5})
    assert out.getvalue() == ""
    event = {
        "event": SCAN_PROGRESS_EVENT,
        "stage": "scan of 2 id ranges",
        "partitions_done": 1,
        "partitions": 2,
        "percent": 50.0,
        "ledgers_done": 700,
        "eta_s": 3.0,
    }
    with pytest.raises(structlog.DropEvent):
        bar(None, "info", event)
    drawn = "\r[" + "#" * 15 + "-" * 15 + "] 50% scan of 2 id ranges: 1/2 partitions, 700 ledgers"
    assert out.getvalue() == drawn + ", ETA 0:03"
    # any other line passes, on a line of its own
    other = {"event": "scan planned"}
    assert bar(None, "info", other) is other
    now[0] = 165.0
    bar.finish_scan("scan")
    assert out.getvalue().endswith(f"\r[{FULL}] 100% scan, in 1:05\n")


def test_a_check_bar_ignores_scan_events_as_log_lines() -> None:
    """Outside a scan (`check`), a "scan progress" event is not the bar's: it passes."""
    bar = ProgressBar(io.StringIO())
    event = {"event": SCAN_PROGRESS_EVENT, "percent": 10.0}
    assert bar(None, "info", event) is event
