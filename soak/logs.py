"""The daemons' JSON logs as the soak's analysis reads them, and leadership rebuilt from them.

Leadership: intervals from "elected auditor" to "no longer the auditor" (or
the SIGKILL, or the end of the run). A leader cut off from ZooKeeper keeps its
interval in its log until it reconnects and learns the session is gone, while
another daemon is elected after the session timeout; so two raw intervals may
overlap, and `soak.leadership` judges what each did meanwhile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from soak.cluster import Incarnation


@dataclass
class Line:
    t: float
    daemon: str
    event: str
    fields: dict[str, Any]
    #: The line as logged, to find a znode's path in any field.
    raw: str = ""

    def mentions(self, text: str) -> bool:
        return text in self.raw


@dataclass
class Span:
    """One leadership interval of one daemon; `ended`: how it ended."""

    daemon: str
    start: float
    end: float
    #: "stepped down" (its own log said so), "killed" (SIGKILL), or "run end".
    ended: str


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def parse_lines(daemon: str, data: bytes) -> list[Line]:
    lines: list[Line] = []
    for raw in data.splitlines():
        try:
            rec = json.loads(raw)
            t = _epoch(rec["timestamp"])
            lines.append(Line(t, daemon, str(rec["event"]), rec, raw.decode(errors="replace")))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a traceback or a line cut by SIGKILL
    return lines


def read_log(daemon: str, inc: Incarnation) -> list[Line]:
    return parse_lines(daemon, inc.log.read_bytes())


def leadership(
    daemon: str, lines: list[Line], stopped: float | None, killed: bool, run_end: float
) -> list[Span]:
    """The intervals of one incarnation (`stopped`: when it ended, if it did)."""
    spans: list[Span] = []
    for ln in lines:
        if ln.event == "elected auditor":
            spans.append(Span(daemon, ln.t, run_end, "run end"))
        elif ln.event == "no longer the auditor" and spans and spans[-1].ended == "run end":
            spans[-1].end = ln.t
            spans[-1].ended = "stepped down"
    stop = stopped if stopped is not None else run_end
    for s in spans:
        if s.end > stop:
            s.end = stop
            s.ended = "killed" if killed else "run end"
    return spans
