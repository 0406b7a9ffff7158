"""Whether there was always exactly one acting leader, and whether it kept auditing.

* **Overlaps.** A leader cut off from ZooKeeper only learns that its session is
  gone when it reconnects, so its logged interval can overlap its successor's;
  it pauses its work the moment the connection is suspended. The invariant is
  about acting: within an overlap at most one of the two logs leader work.
* **Flaps.** A leadership that ends by its own step-down less than FLAP seconds
  after it began, with no cluster fault on that daemon (a cut, a kill, a
  ZooKeeper restart) to explain it: an election that cannot hold (issue 21: a
  corrupt ctime made every daemon drop out 3 ms after its election; a garbage
  lostBookieRecoveryDelay, 9 elections a second).
* **Blinded.** While a bad znode is present, a "... failed" line (a check, the
  leader's work, an election attempt) that no cluster fault explains: the bad
  znode stopped something else. Such lines elsewhere are counted, not judged.
* **Gaps.** Stretches with no leader at all, for the record.
"""

from __future__ import annotations

from typing import Any

from soak.faults import Fault
from soak.logs import Line, Span

ACTIONS = frozenset({"check started", "check run", "violation", "marked under-replicated"})
#: A leadership shorter than this that ends by itself is a flap.
FLAP = 2.0
#: How long after a cluster fault its consequences (reconnects, re-elections) may show.
AFTERMATH = 15.0
#: Cluster faults that hit one daemon (`Fault.daemon`).
DAEMON_FAULTS = frozenset(
    {"zk_partition", "session_expire", "leader_kill", "host_restart", "rolling_restart"}
)
#: Leaderless stretches longer than this are listed.
GAP = 15.0


def overlaps(
    spans: list[Span], logs: dict[str, list[Line]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(every raw overlap, those where both daemons logged leader work)."""
    actions = {n: [ln.t for ln in ls if ln.event in ACTIONS] for n, ls in logs.items()}
    raw: list[dict[str, Any]] = []
    acting: list[dict[str, Any]] = []
    for i, a in enumerate(spans):
        for b in spans[i + 1 :]:
            lo, hi = max(a.start, b.start), min(a.end, b.end)
            if a.daemon == b.daemon or lo >= hi:
                continue
            acts_a = [t for t in actions.get(a.daemon, []) if lo <= t <= hi]
            acts_b = [t for t in actions.get(b.daemon, []) if lo <= t <= hi]
            o: dict[str, Any] = {"daemons": [a.daemon, b.daemon], "from": lo}
            o |= {"seconds": round(hi - lo, 3), "actions": [len(acts_a), len(acts_b)]}
            raw.append(o)
            if acts_a and acts_b:
                acting.append(o)
    return raw, acting


def cluster_explains(daemon: str, t: float, faults: list[Fault], run_end: float) -> Fault | None:
    """A cluster fault that may explain trouble of `daemon` at `t`."""
    for f in faults:
        end = (f.repaired or run_end) + AFTERMATH
        if f.kind == "zk_restart" and f.start - 1.0 <= t <= end:
            return f
        if f.kind in DAEMON_FAULTS and f.daemon == daemon and f.start <= t <= end:
            return f
    return None


def flaps(spans: list[Span], faults: list[Fault], run_end: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for s in spans:
        if s.ended != "stepped down" or s.end - s.start >= FLAP:
            continue
        if cluster_explains(s.daemon, s.start, faults, run_end) is not None:
            continue
        bad = [f"{f.kind} {f.target}" for f in faults if f.path and _within(f, s.start, run_end)]
        out.append(
            {
                "daemon": s.daemon,
                "elected": s.start,
                "seconds": round(s.end - s.start, 3),
                "bad_znodes": bad,
            }
        )
    return out


def _within(f: Fault, t: float, run_end: float, after: float = 5.0) -> bool:
    return f.start <= t <= (f.repaired or run_end) + after


def failures(
    lines: list[Line], faults: list[Fault], run_end: float
) -> tuple[list[dict[str, Any]], int]:
    """(failure lines while a bad znode was present and unexplained otherwise, the number
    of unexplained failure lines at other times)."""
    blinded: list[dict[str, Any]] = []
    elsewhere = 0
    bad = [f for f in faults if f.path is not None]
    for ln in lines:
        if "failed" not in ln.event:
            continue
        if cluster_explains(ln.daemon, ln.t, faults, run_end) is not None:
            continue
        during = [f for f in bad if _within(f, ln.t, run_end)]
        if not during:
            elsewhere += 1
            continue
        blinded.append(
            {
                "daemon": ln.daemon,
                "t": ln.t,
                "event": ln.event,
                "check": ln.fields.get("check"),
                "error": str(ln.fields.get("error", ""))[:200],
                "bad_znodes": [f"{f.kind} {f.target}" for f in during],
            }
        )
    return blinded, elsewhere


def elections_during(f: Fault, lines: list[Line], run_end: float) -> int:
    return sum(1 for ln in lines if ln.event == "elected auditor" and _within(f, ln.t, run_end, 0))


def gaps(spans: list[Span], run_end: float) -> list[dict[str, Any]]:
    """Leaderless stretches longer than GAP s after the first election."""
    if not spans:
        return []
    out: list[dict[str, Any]] = []
    covered = sorted((s.start, s.end) for s in spans)
    reach = covered[0][1]
    for start, end in covered[1:]:
        if start - reach > GAP:
            out.append({"from": reach, "seconds": round(start - reach, 1)})
        reach = max(reach, end)
    if run_end - reach > GAP:
        out.append({"from": reach, "seconds": round(run_end - reach, 1)})
    return out
