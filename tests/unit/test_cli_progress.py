"""The CLI's progress bar: rendering, and the structlog processor that draws it."""

from __future__ import annotations

import io

import pytest
import structlog

from auditor.cli.progress import ProgressBar, format_duration, render_bar

FULL = "#" * 30


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0:00"), (12.4, "0:12"), (59.6, "1:00"), (754, "12:34"), (3725, "1:02:05"), (-1, "0:00")],
)
def test_format_duration(seconds: float, shown: str) -> None:
    assert format_duration(seconds) == shown


def test_render_bar() -> None:
    assert (
        render_bar(45_000, 100_000, 9.8)
        == "\r[" + "#" * 13 + "-" * 17 + "] 45% 45,000/~100,000 ledgers, ETA 0:12"
    )
    assert render_bar(0, 100, 0.0) == "\r[" + "-" * 30 + "] 0% 0/~100 ledgers, ETA ?"
    assert render_bar(99, 100, 99.0) == "\r[" + "#" * 29 + "-] 99% 99/~100 ledgers, ETA 0:01"
    # an estimate below what is already done is raised to it; 100% is for the end only
    assert render_bar(50, 40, 1.0) == "\r[" + "#" * 29 + "-] 99% 50/~50 ledgers, ETA 0:00"
    assert render_bar(1_234, None, 5.2) == "\r1,234 ledgers, 0:05"
    assert render_bar(300, 300, 3725, final=True) == f"\r[{FULL}] 100% 300/300 ledgers, in 1:02:05"
    assert render_bar(5, 10, 1.0, width=10) == "\r[#####-----] 50% 5/~10 ledgers, ETA 0:01"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_processor_draws_progress_events_and_passes_the_rest() -> None:
    out = io.StringIO()
    clock = _Clock()
    bar = ProgressBar(out, clock)
    bar.begin("placement")
    clock.now = 110.0
    # 400 done at 40/s with 15 s to go: 400 + 600 = ~1,000
    with pytest.raises(structlog.DropEvent):
        bar(
            None,
            "info",
            {"event": "check progress", "ledgers_done": 400, "rate_per_s": 40.0, "eta_s": 15.0},
        )
    first = "\rcheck placement [" + "#" * 12 + "-" * 18 + "] 40% 400/~1,000 ledgers, ETA 0:15"
    assert out.getvalue() == first
    # another log line: the bar's line is blanked, the event goes on unchanged
    event = {"event": "something else", "x": 1}
    assert bar(None, "warning", dict(event)) == event
    assert out.getvalue() == first + "\r" + " " * len(first) + "\r"
    out.truncate(0)
    out.seek(0)
    # no eta yet: the count alone
    with pytest.raises(structlog.DropEvent):
        bar(None, "info", {"event": "check progress", "ledgers_done": 7, "rate_per_s": 1.0})
    assert out.getvalue() == "\rcheck placement 7 ledgers, 0:10"
    out.truncate(0)
    out.seek(0)
    clock.now = 112.0
    bar.finish(1_000)
    assert out.getvalue() == f"\rcheck placement [{FULL}] 100% 1,000/1,000 ledgers, in 0:12\n"
    # after finish, nothing to blank
    out.truncate(0)
    out.seek(0)
    bar(None, "info", {"event": "placement check finished"})
    bar.abandon()
    assert out.getvalue() == ""


def test_a_shorter_line_covers_the_longer_one() -> None:
    out = io.StringIO()
    bar = ProgressBar(out, _Clock())
    with pytest.raises(structlog.DropEvent):
        bar(None, "info", {"event": "check progress", "ledgers_done": 10_000, "rate_per_s": 1.0})
    long = out.getvalue()
    out.truncate(0)
    out.seek(0)
    bar.abandon()
    assert out.getvalue() == "\n"
    assert long == "\r10,000 ledgers, 0:00"


def test_finish_of_an_empty_check() -> None:
    out = io.StringIO()
    bar = ProgressBar(out, _Clock())
    bar.begin("grace")
    bar.finish(0)
    assert out.getvalue() == f"\rcheck grace [{FULL}] 100% 0/0 ledgers, in 0:00\n"
