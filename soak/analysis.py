"""What the soak asserts, computed from the daemons' logs and the fault timeline.

The pieces: `soak.logs` (reading the logs, leadership intervals),
`soak.leadership` (one acting leader, flaps, checks blinded by a bad znode),
`soak.alarms` (false alarms, missed reports). `judge` is pure (logs, intervals,
faults in; figures out) so that tests can feed it made-up timelines;
`analyse` reads a finished run's files and calls it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from soak import adversarial, alarms, leadership, repairs
from soak.cluster import Incarnation, SoakCluster
from soak.faults import Fault
from soak.logs import Line, Span, read_log
from soak.logs import leadership as spans_of

GRACE = alarms.GRACE
#: Descriptors a soak daemon may hold once it has led and copied: its listeners, its
#: ZooKeeper connection and a connection to each of the six bookies from the checks' client
#: and from the worker's (24-31 measured with real workers). An incarnation that starts
#: as a quiet follower and later leads and copies gains a dozen without leaking any
#: (seed 5151: 19 -> 31); growth past this is judged a leak.
FD_CEILING = 40


def analyse(c: SoakCluster, faults: list[Fault], run_end: float) -> dict[str, Any]:
    logs: dict[str, list[Line]] = {}
    spans: list[Span] = []
    for d in c.daemons:
        for inc in d.incarnations:
            lines = read_log(d.name, inc)
            logs.setdefault(d.name, []).extend(lines)
            spans += spans_of(d.name, lines, inc.ended, inc.killed, run_end)
    every_line = [ln for ls in logs.values() for ln in ls]
    ever = {lid: set(bookies) for lid, bookies in c.ever_bookies.items()}
    for lid, given in repairs.bookies_given(every_line).items():
        ever.setdefault(lid, set()).update(given)
    result = judge(logs, spans, faults, ever, run_end)
    result["real_worker"] = repairs.figures(sorted(every_line, key=lambda ln: ln.t))
    resources: dict[str, Any] = {}
    grew: list[str] = []
    for d in c.daemons:
        # An `idle_http` siege holds up to 300 connections against one daemon on purpose:
        # its samples say nothing about a leak (they once put a siege's tail in the last
        # window and counted the daemon as grown).
        sieges = [
            (f.start, (f.end or run_end) + 5.0)
            for f in faults
            if f.kind == "idle_http" and f.target == d.name
        ]
        for n, inc in enumerate(d.incarnations):
            r = _flatness(inc, sieges)
            resources[f"{d.name}#{n}"] = r
            if r.get("verdict") == "grew":
                grew.append(f"{d.name}#{n}")
    return result | {"resources": resources, "resources_grew": grew}


def judge(
    logs: dict[str, list[Line]],
    spans: list[Span],
    faults: list[Fault],
    ever_bookies: dict[int, set[str]],
    run_end: float,
) -> dict[str, Any]:
    lines = sorted((ln for ls in logs.values() for ln in ls), key=lambda ln: ln.t)
    raw_overlaps, acting_overlaps = leadership.overlaps(spans, logs)
    false = alarms.false_alarms(lines, faults, ever_bookies, run_end)
    missed, unverified, pairs = alarms.reports(lines, faults, run_end)
    blinded, failures_elsewhere = leadership.failures(lines, faults, run_end)
    flapped = leadership.flaps(spans, faults, run_end)

    named: dict[str, int] = {}
    for entry in false:
        for desc in entry["during"]:
            kind = desc.split(" ", 1)[0]
            named[kind] = named.get(kind, 0) + 1
    by_kind: dict[str, dict[str, int]] = {}
    for f in faults:
        k = by_kind.setdefault(
            f.kind,
            {"injected": 0, "survived": 0, "expected_reports": 0, "reported": 0},
        )
        k["injected"] += 1
        k["survived"] += 1 if f.survived else 0
        if f.expect or f.require_evidence:
            k["expected_reports"] += 1
            k["reported"] += 1 if f.reported else 0
    for kind, n in named.items():
        by_kind.setdefault(
            kind, {"injected": 0, "survived": 0, "expected_reports": 0, "reported": 0}
        )["false_alarms_during"] = n

    bad = [
        {
            "kind": f.kind,
            "path": f.path,
            "seconds": round(f.end - f.start, 1),
            "named": f.reported,
            "elections_during": leadership.elections_during(f, lines, run_end),
            "note": f.note,
        }
        for f in faults
        if f.path is not None
    ]
    violations = sum(1 for ln in lines if ln.event == "violation")
    return {
        "leader_intervals": len(spans),
        "leader_overlaps_raw": raw_overlaps,
        "leader_overlaps_acting": acting_overlaps,
        "leader_flaps": flapped,
        "leaderless_gaps": leadership.gaps(spans, run_end),
        "violation_lines": violations,
        "mark_lines": sum(1 for ln in lines if ln.event == "marked under-replicated"),
        "faults_by_kind": by_kind,
        "reportable_faults": sum(1 for f in faults if f.expect or f.require_evidence),
        "reportable_faults_reported": sum(
            1 for f in faults if (f.expect or f.require_evidence) and f.reported
        ),
        "reported_ledger_category_pairs": pairs,
        "missed": missed,
        "unverified": unverified,
        "false_alarms": false,
        "blinded": blinded,
        "failures_elsewhere": failures_elsewhere,
        "bad_znodes": bad,
        "election_loops": adversarial.election_loops(faults, lines, run_end),
        "led_beside_held_votes": adversarial.led_beside(faults, spans, run_end),
        "http_lockouts": adversarial.http_lockouts(faults, run_end),
    }


def _flatness(inc: Incarnation, skip: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:
    """First minutes after warm-up against the last minutes; too short to judge: 'short'.
    Samples taken within `skip` (start, end) intervals are left out."""
    s = [x for x in inc.samples if not any(a <= x[0] <= b for a, b in skip)]
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
    grew = rss1 > rss0 * 1.2 or (fd1 > fd0 + 10 and fd1 > FD_CEILING)
    return {
        "verdict": "grew" if grew else "flat",
        "seconds": round(life),
        "rss_kb": [int(rss0), int(rss1)],
        "fds": [int(fd0), int(fd1)],
        "rss_max_kb": max(x[1] for x in s),
        "fds_max": max(x[2] for x in s),
    }
