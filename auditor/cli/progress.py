"""A progress bar with an ETA for `check`, `scan` and `snapshot` when stderr is a terminal.

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

`scan` and `snapshot` (either engine) draw the same bar from the scan driver's
"scan progress" events instead (`auditor.scan.progress`): the stage, partitions done,
ledgers walked where the engine knows them, and an ETA from the stage's share done;
the partitions' own "check progress" lines are dropped while the bar shows.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import structlog

from auditor.config import AuditorConfig, ChecksConfig
from auditor.scan.progress import SCAN_PROGRESS_EVENT

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


def render_share(share: float, detail: str, eta: float | None, *, width: int = BAR_WIDTH) -> str:
    """A bar drawn from a share of the work (a scan's stage), starting with `\\r`; below 100%
    until the stage says it is done."""
    share = min(max(share, 0.0), 1.0)
    filled = min(int(share * width), width if share >= 1 else width - 1)
    bar = "#" * filled + "-" * (width - filled)
    percent = 100 if share >= 1 else min(int(share * 100), 99)
    shown_eta = format_duration(eta) if eta is not None else "?"
    tail = "" if share >= 1 else f", ETA {shown_eta}"
    return f"\r[{bar}] {percent}% {detail}{tail}"


def scan_detail(fields: MutableMapping[str, Any]) -> str:
    """`scan of 8 id ranges: 3/8 partitions, 12,345 ledgers` from a "scan progress" event."""
    text = (
        f"{fields.get('stage', 'scan')}: "
        f"{int(fields.get('partitions_done', 0))}/{int(fields.get('partitions', 0))} partitions"
    )
    if "ledgers_done" in fields:
        text += f", {int(fields['ledgers_done']):,} ledgers"
    return text


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

    def __init__(
        self, stream: TextIO, clock: Callable[[], float] = time.monotonic, *, scan: bool = False
    ) -> None:
        self.stream = stream
        self.clock = clock
        #: Drawing a scan's or a snapshot's stages ("scan progress") instead of one check's.
        self.scan = scan
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

    def finish_scan(self, what: str) -> None:
        """The scan or snapshot ended: one last line at 100%, and a new line."""
        took = format_duration(self.clock() - self.started)
        self._draw(render_share(1.0, f"{what}, in {took}", None))
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
        event = event_dict.get("event")
        if self.scan and event in (PROGRESS_EVENT, SCAN_PROGRESS_EVENT):
            if event == PROGRESS_EVENT:  # a partition's own walk: the scan's bar says it
                raise structlog.DropEvent
            eta = event_dict.get("eta_s")
            share = float(event_dict.get("percent", 0.0)) / 100
            line = render_share(
                share, scan_detail(event_dict), float(eta) if eta is not None else None
            )
            self._draw(line)
            raise structlog.DropEvent
        if event != PROGRESS_EVENT:
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


def install_bar(stream: TextIO, *, scan: bool = False) -> ProgressBar:
    """Puts a bar first in structlog's processors (after `configure_logging`)."""
    bar = ProgressBar(stream, scan=scan)
    processors = list(structlog.get_config()["processors"])
    structlog.configure(processors=[bar, *processors])
    return bar


def progress_bar(
    args: argparse.Namespace, config: AuditorConfig, *, scan: bool = False
) -> tuple[ProgressBar | None, AuditorConfig]:
    """A bar on a terminal unless `--no-progress` (and its redraw interval, unless the
    user chose one)."""
    if args.no_progress or not stderr_is_terminal(sys.stderr):
        return None, config
    bar = install_bar(sys.stderr, scan=scan)
    if config.checks.progress_interval == ChecksConfig().progress_interval:
        checks = dataclasses.replace(config.checks, progress_interval=BAR_INTERVAL)
        config = dataclasses.replace(config, checks=checks)
    return bar, config
