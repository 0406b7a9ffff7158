"""A progress bar with an ETA for `check` when stderr is a terminal.

The checks already say how far they are: every `checks.progress_interval` seconds their
`Progress` logs a "check progress" line (`ledgers_done`, `rate_per_s`, and `eta_s` once the
id range is known). On a terminal the CLI puts `ProgressBar` first in structlog's chain:
it turns each of those events into one redrawn line on stderr,

    \\r[############------------------] 40% 1,200/~3,000 ledgers, ETA 0:12

and drops the log line; every other log line still passes, on a line of its own. When a
check ends, its bar is drawn once more at 100% with the ledgers it walked and the time it
took. The interval becomes `BAR_INTERVAL` unless the user set one. Not on a terminal
(a pipe, a file, journald) or with `--no-progress`, nothing changes: the periodic
"check progress" log line, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import structlog

#: The event `auditor.checks.progress.Progress` logs.
PROGRESS_EVENT = "check progress"
#: Seconds between two redraws of the bar (`checks.progress_interval` on a terminal).
BAR_INTERVAL = 0.5
BAR_WIDTH = 30


def format_duration(seconds: float) -> str:
    """`M:SS`, or `H:MM:SS` from an hour on (rounded to the second)."""
    total = max(round(seconds), 0)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def render_bar(
    done: int, total: int | None, elapsed: float, *, final: bool = False, width: int = BAR_WIDTH
) -> str:
    """One state of the bar, starting with `\\r`. `total` is an estimate (`~`); None: not
    known yet (no bar, the count and the time so far). Only `final` (`done` is all there
    was) shows 100%."""
    if final:
        took = format_duration(elapsed)
        return f"\r[{'#' * width}] 100% {done:,}/{done:,} ledgers, in {took}"
    if total is None or total <= 0:
        return f"\r{done:,} ledgers, {format_duration(elapsed)}"
    total = max(total, done)
    share = done / total  # below 1 until `final`: an estimate reached is not the end
    filled = min(int(share * width), width - 1)
    bar = "#" * filled + "-" * (width - filled)
    percent = min(int(share * 100), 99)
    eta = elapsed * (total - done) / done if done else None
    shown_eta = format_duration(eta) if eta is not None else "?"
    return f"\r[{bar}] {percent}% {done:,}/~{total:,} ledgers, ETA {shown_eta}"


class ProgressBar:
    """The structlog processor that draws the bar; `begin` and `finish` frame each check."""

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.clock = clock
        self.name = ""
        self.started = clock()
        self._shown = 0  # characters of the bar on the screen's last line (0: none)

    def begin(self, name: str) -> None:
        self.name = name
        self.started = self.clock()

    def finish(self, done: int) -> None:
        """The check walked `done` ledgers: the bar at 100%, and a new line."""
        self._draw(render_bar(done, done, self.clock() - self.started, final=True))
        self.stream.write("\n")
        self.stream.flush()
        self._shown = 0

    def abandon(self) -> None:
        """The check stopped without a report: the bar's line is left as it is."""
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = 0

    def _draw(self, line: str) -> None:
        text = f"\rcheck {self.name} {line[1:]}" if self.name else line
        pad = max(self._shown - len(text), 0)
        self.stream.write(text + " " * pad)
        self.stream.flush()
        self._shown = len(text)

    def __call__(
        self, logger: Any, method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        if event_dict.get("event") != PROGRESS_EVENT:
            if self._shown:  # a log line goes on a clean line; the next event redraws
                self.stream.write("\r" + " " * self._shown + "\r")
                self._shown = 0
            return event_dict
        done = int(event_dict.get("ledgers_done", 0))
        rate = float(event_dict.get("rate_per_s", 0.0))
        eta = event_dict.get("eta_s")
        total = round(done + rate * float(eta)) if eta is not None else None
        self._draw(render_bar(done, total, self.clock() - self.started))
        raise structlog.DropEvent


def stderr_is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def install_bar(stream: TextIO) -> ProgressBar:
    """Puts a bar first in structlog's processors (after `configure_logging`)."""
    bar = ProgressBar(stream)
    processors = list(structlog.get_config()["processors"])
    structlog.configure(processors=[bar, *processors])
    return bar
