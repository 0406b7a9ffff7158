"""What the soak asserts, computed from the daemons' logs and the fault timeline.

Leadership: intervals from "elected auditor" to "no longer the auditor" (or
the SIGKILL, or the end). A leader cut off from ZooKeeper keeps its interval
in its log until it reconnects and learns the session is gone, while another
daemon is elected after the session timeout; it pauses its work the moment
the connection is suspended, so two raw intervals may overlap. The invariant
is about acting: within an overlap, at most one of the two may log leader
work (a check started or run, a violation, a mark). Both are counted.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from soak.cluster import Daemon, Incarnation, SoakCluster
from soak.faults import Fault

ACTIONS = frozenset({"check started", "check run", "violation", "marked under-replicated"})
#: After a repair, checks already under way may still report what they saw.
GRACE = 20.0


@dataclass
class Line:
    t: float
    daemon: str
    event: str
    fields: dict[str, Any]


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def read_log(daemon: str, inc: Incarnation) -> list[Line]:
    lines: list[Line] = []
    for raw in inc.log.read_bytes().splitlines():
        try:
            rec = json.loads(raw)
            lines.append(Line(_epoch(rec["timestamp"]), daemon, str(rec["event"]), rec))
        except (ValueError, KeyError, TypeError):
            continue  # a traceback or a line cut by SIGKILL
    return lines


def leadership(d: Daemon, inc: Incarnation, lines: list[Line], end: float) -> list[list[float]]:
    spans: list[list[float]] = []
    for ln in lines:
        if ln.event == "elected auditor":
            spans.append([ln.t, end])
        elif ln.event == "no longer the auditor" and spans and spans[-1][1] == end:
            spans[-1][1] = ln.t
    stop = inc.ended if inc.ended is not None else end
    for s in spans:
        s[1] = min(s[1], stop)
    return spans


def analyse(c: SoakCluster, faults: list[Fault], run_end: float) -> dict[str, Any]:
    logs: dict[str, list[Line]] = {}
    spans: list[tuple[str, float, float]] = []
    for d in c.daemons:
        for inc in d.incarnations:
            lines = read_log(d.name, inc)
            logs.setdefault(d.name, []).extend(lines)
            spans += [(d.name, a, b) for a, b in leadership(d, inc, lines, run_end)]
    actions = {n: [ln.t for ln in ls if ln.event in ACTIONS] for n, ls in logs.items()}
    raw_overlaps: list[dict[str, Any]] = []
    acting_overlaps: list[dict[str, Any]] = []
    for i, (na, a0, a1) in enumerate(spans):
        for nb, b0, b1 in spans[i + 1 :]:
            lo, hi = max(a0, b0), min(a1, b1)
            if na == nb or lo >= hi:
                continue
            acts_a = [t for t in actions[na] if lo <= t <= hi]
            acts_b = [t for t in actions[nb] if lo <= t <= hi]
            o = {"daemons": [na, nb], "from": lo, "seconds": round(hi - lo, 3)}
            o |= {"actions": [len(acts_a), len(acts_b)]}
            raw_overlaps.append(o)
            if acts_a and acts_b:
                acting_overlaps.append(o)

    violations = [ln for ls in logs.values() for ln in ls if ln.event == "violation"]
    explaining = [f for f in faults if f.explains]

    def explains(f: Fault, v: Line) -> bool:
        """A violation naming a bookie is explained only by a fault of that bookie."""
        lid = v.fields.get("ledger_id")
        named = v.fields.get("bookie")
        if named:
            on = named == f.target and isinstance(lid, int) and named in c.ever_bookies.get(lid, ())
        else:
            on = isinstance(lid, int) and f.target in c.ever_bookies.get(lid, set())
        return (
            f.start <= v.t <= (f.repaired or run_end) + GRACE
            and str(v.fields.get("category")) in f.explains
            and on
        )

    false_alarms: dict[tuple[Any, ...], dict[str, Any]] = {}
    for v in violations:
        if not any(explains(f, v) for f in explaining):
            key = (v.fields.get("ledger_id"), v.fields.get("category"), v.fields.get("check"))
            entry = false_alarms.setdefault(
                key,
                {
                    "ledger_id": key[0],
                    "category": key[1],
                    "check": key[2],
                    "bookie": v.fields.get("bookie"),
                    "first": v.t,
                    "daemon": v.daemon,
                    "lines": 0,
                },
            )
            entry["lines"] += 1

    by_kind: dict[str, dict[str, int]] = {}
    missed: list[dict[str, Any]] = []
    reported_pairs = 0
    for f in faults:
        k = by_kind.setdefault(
            f.kind, {"injected": 0, "survived": 0, "expected_reports": 0, "reported": 0}
        )
        k["injected"] += 1
        if f.survived:
            k["survived"] += 1
        if not f.expect:
            continue
        k["expected_reports"] += 1
        hits = [
            v
            for v in violations
            if v.fields.get("ledger_id") in f.ledgers
            and str(v.fields.get("category")) in f.expect
            and f.start <= v.t <= (f.repaired or run_end) + GRACE
        ]
        pairs = {(v.fields.get("ledger_id"), v.fields.get("category")) for v in hits}
        reported_pairs += len(pairs)
        all_marked = f.marked == len(f.ledgers)
        # The replicas check skips ledgers already marked under-replicated (as upstream):
        # when another fault's consequences marked them all, the marks are the report.
        if (hits and (all_marked or not f.require_marks)) or (all_marked and not f.require_marks):
            k["reported"] += 1
        else:
            missed.append(
                {
                    "kind": f.kind,
                    "target": f.target,
                    "start": f.start,
                    "seconds": round(f.end - f.start, 1),
                    "ledgers": len(f.ledgers),
                    "reported_ledgers": len({p[0] for p in pairs}),
                    "marked": f.marked,
                }
            )

    resources: dict[str, Any] = {}
    flat_failures: list[str] = []
    for d in c.daemons:
        for n, inc in enumerate(d.incarnations):
            r = _flatness(inc)
            resources[f"{d.name}#{n}"] = r
            if r.get("verdict") == "grew":
                flat_failures.append(f"{d.name}#{n}")

    return {
        "leader_intervals": len(spans),
        "leader_overlaps_raw": raw_overlaps,
        "leader_overlaps_acting": acting_overlaps,
        "violation_lines": len(violations),
        "faults_by_kind": by_kind,
        "reportable_faults": sum(1 for f in faults if f.expect),
        "reportable_faults_reported": sum(k["reported"] for k in by_kind.values()),
        "reported_ledger_category_pairs": reported_pairs,
        "missed": missed,
        "false_alarms": sorted(false_alarms.values(), key=lambda e: float(e["first"])),
        "resources": resources,
        "resources_grew": flat_failures,
    }


def _flatness(inc: Incarnation) -> dict[str, Any]:
    """First minutes after warm-up against the last minutes; too short to judge: 'short'."""
    s = inc.samples
    if len(s) < 4:
        return {"verdict": "short", "samples": len(s)}
    t0, t1 = s[0][0], s[-1][0]
    life = t1 - t0
    warm = min(120.0, 0.15 * life)
    window = min(120.0, 0.25 * life)
    if life < 240.0:
        return {"verdict": "short", "seconds": round(life), "samples": len(s)}
    first = [x for x in s if t0 + warm <= x[0] <= t0 + warm + window]
    last = [x for x in s if x[0] >= t1 - window]
    rss0, rss1 = statistics.median(x[1] for x in first), statistics.median(x[1] for x in last)
    fd0, fd1 = statistics.median(x[2] for x in first), statistics.median(x[2] for x in last)
    grew = rss1 > rss0 * 1.2 or fd1 > fd0 + 10
    return {
        "verdict": "grew" if grew else "flat",
        "seconds": round(life),
        "rss_kb": [int(rss0), int(rss1)],
        "fds": [int(fd0), int(fd1)],
        "rss_max_kb": max(x[1] for x in s),
        "fds_max": max(x[2] for x in s),
    }
