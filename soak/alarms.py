"""What the daemons said about the data, judged against the fault timeline.

* A **false alarm** is a "violation" line or a "marked under-replicated" line
  that no fault explains. A fault explains a line while it lasts and for GRACE
  seconds after its repair, if the line's category is one the fault may cause
  and the line is about the fault's bookie (named by it, or, when it names no
  bookie, about a ledger the bookie held). A mark is about the bookies it
  lists as missing. Each false alarm names the faults under way that touch it
  (`during`), so a restart that was treated as a failure says which restart.
* The **restart rule** (issue 21): a bookie back within lostBookieRecoveryDelay
  causes nothing, unless another bookie was lost while it was gone (a second
  loss starts the audit at once, as upstream does): a `bookie_crash_short` or
  host restart overlapping another bookie's absence explains what a lost bookie
  explains.
* A **missed report** is a reportable fault with no line of an expected
  category on its ledgers (and, for losses, not every ledger marked), or a bad
  znode that must be named (`require_evidence`) that no line named by path
  while a check that reads it ran.
"""

from __future__ import annotations

from typing import Any

from soak.faults import DATA_CATEGORIES, Fault
from soak.logs import Line

#: After a repair, checks already under way may still report what they saw.
GRACE = 20.0
#: Faults during which their bookie is unregistered for a while.
SILENT_LOSSES = frozenset({"bookie_crash_short", "host_restart", "rolling_restart"})
#: How close two absences must come for a leader to have seen both bookies missing.
OVERLAP_SLACK = 1.0
#: Categories a corrupt mark must not be reported under (they are about data).
NOT_A_MARK_REPORT = DATA_CATEGORIES | {
    "underreplicated_past_grace_period",
    "placement_not_adhering",
    "placement_softly_adhering",
}
#: The checks that read what each bad znode is: if one ran, the znode must have been named.
READERS = {
    "bad_mark": frozenset({"replicas", "grace"}),
    "bad_ledger_znode": frozenset({"bookies", "ledgers", "placement", "replicas"}),
}


def window(f: Fault, run_end: float) -> tuple[float, float]:
    return f.start, (f.repaired or run_end) + GRACE


def concurrent_loss(f: Fault, faults: list[Fault], run_end: float) -> Fault | None:
    """Another fault whose bookie was unregistered while `f`'s was."""
    for g in faults:
        if g is f or g.bookie is None or g.bookie == f.bookie:
            continue
        for a0, a1 in f.down:
            for b0, b1 in g.down:
                a_end, b_end = a1 or run_end, b1 or run_end
                if a0 - OVERLAP_SLACK <= b_end and b0 - OVERLAP_SLACK <= a_end:
                    return g
    return None


def effective_explains(f: Fault, faults: list[Fault], run_end: float) -> frozenset[str]:
    if f.explains:
        return frozenset(f.explains)
    if f.kind in SILENT_LOSSES and concurrent_loss(f, faults, run_end) is not None:
        return DATA_CATEGORIES
    return frozenset()


def _about_bookie(f: Fault, ln: Line, ever_bookies: dict[int, set[str]]) -> bool:
    lid = ln.fields.get("ledger_id")
    if f.bookie is None or not isinstance(lid, int):
        return False
    if ln.event == "marked under-replicated":
        missing = ln.fields.get("missing_replicas") or []
        if missing:
            return f.bookie in missing
        return f.bookie in ever_bookies.get(lid, set())
    named = ln.fields.get("bookie")
    if named:
        return bool(named == f.bookie and named in ever_bookies.get(lid, set()))
    return f.bookie in ever_bookies.get(lid, set())


def _about_znode(f: Fault, ln: Line) -> bool:
    if f.path is not None and ln.mentions(f.path):
        return True
    return f.ledger_id is not None and ln.fields.get("ledger_id") == f.ledger_id


def names_bad_znode(f: Fault, ln: Line) -> bool:
    """A violation that is the expected report of bad znode `f` (named by its path)."""
    if f.path is None or not ln.mentions(f.path):
        return False
    category = str(ln.fields.get("category"))
    if f.kind == "bad_mark":
        return category not in NOT_A_MARK_REPORT
    if f.kind == "bad_ledger_znode":
        return "metadata_invalid" in category or "unexpected" in category
    return False


def explained_by(
    f: Fault,
    ln: Line,
    explains: frozenset[str],
    ever_bookies: dict[int, set[str]],
    run_end: float,
) -> bool:
    lo, hi = window(f, run_end)
    if not lo <= ln.t <= hi:
        return False
    if f.path is not None:
        return ln.event == "violation" and names_bad_znode(f, ln)
    if ln.event == "violation" and str(ln.fields.get("category")) not in explains:
        return False
    if ln.event == "marked under-replicated" and not explains:
        return False
    return _about_bookie(f, ln, ever_bookies)


def touches(f: Fault, ln: Line, ever_bookies: dict[int, set[str]], run_end: float) -> bool:
    """Whether `ln` happened while `f` (or its grace) lasted and is about what `f` hit."""
    lo, hi = window(f, run_end)
    if not lo <= ln.t <= hi:
        return False
    if f.path is not None:
        return _about_znode(f, ln)
    if f.bookie is not None:
        return _about_bookie(f, ln, ever_bookies)
    lid = ln.fields.get("ledger_id")
    return isinstance(lid, int) and lid in f.ledgers


def false_alarms(
    lines: list[Line], faults: list[Fault], ever_bookies: dict[int, set[str]], run_end: float
) -> list[dict[str, Any]]:
    """Violation and mark lines no fault explains, one entry per (ledger, category, check)."""
    explains = {id(f): effective_explains(f, faults, run_end) for f in faults}
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for ln in lines:
        if ln.event not in ("violation", "marked under-replicated"):
            continue
        if any(explained_by(f, ln, explains[id(f)], ever_bookies, run_end) for f in faults):
            continue
        category = ln.fields.get("category") if ln.event == "violation" else "(marked)"
        key = (ln.fields.get("ledger_id"), category, ln.fields.get("check"))
        entry = out.get(key)
        if entry is None:
            during = [
                f"{f.kind} {f.target} at {f.start:.1f}"
                for f in faults
                if touches(f, ln, ever_bookies, run_end)
            ]
            entry = out[key] = {
                "ledger_id": key[0],
                "category": category,
                "check": key[2],
                "bookie": ln.fields.get("bookie") or ln.fields.get("missing_replicas"),
                "first": ln.t,
                "daemon": ln.daemon,
                "during": during,
                "lines": 0,
            }
        entry["lines"] += 1
    return sorted(out.values(), key=lambda e: float(e["first"]))


def reports(
    lines: list[Line], faults: list[Fault], run_end: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(missed reports, bad znodes whose report could not be verified, reported pairs)."""
    violations = [ln for ln in lines if ln.event == "violation"]
    missed: list[dict[str, Any]] = []
    unverified: list[dict[str, Any]] = []
    pairs_total = 0
    for f in faults:
        lo, hi = window(f, run_end)
        if f.require_evidence:
            named = [ln for ln in lines if lo <= ln.t <= hi and _names(f, ln)]
            f.reported = bool(named)
            if named:
                continue
            readers = READERS.get(f.kind, frozenset())
            ran = [
                ln
                for ln in lines
                if ln.event == "check run"
                and ln.fields.get("check") in readers
                and f.start <= ln.t <= hi
            ]
            entry = {"kind": f.kind, "path": f.path, "start": f.start}
            entry["seconds"] = round(f.end - f.start, 1)
            entry["reader_runs"] = len(ran)
            (missed if ran else unverified).append(entry)
            continue
        if not f.expect:
            continue
        hits = [
            v
            for v in violations
            if v.fields.get("ledger_id") in f.ledgers
            and str(v.fields.get("category")) in f.expect
            and lo <= v.t <= hi
        ]
        pairs = {(v.fields.get("ledger_id"), v.fields.get("category")) for v in hits}
        pairs_total += len(pairs)
        all_marked = f.marked == len(f.ledgers)
        # The replicas check skips ledgers already marked under-replicated (as upstream):
        # when another fault's consequences marked them all, the marks are the report.
        f.reported = bool(
            (hits and (all_marked or not f.require_marks)) or (all_marked and not f.require_marks)
        )
        if not f.reported:
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
    return missed, unverified, pairs_total


def _names(f: Fault, ln: Line) -> bool:
    """A line that names bad znode `f` by its path and is not a failure."""
    if f.path is None or not ln.mentions(f.path) or "failed" in ln.event:
        return False
    if ln.event == "violation":
        return names_bad_znode(f, ln)
    return True
