"""Several soak seeds in a row (`SOAK_SEEDS`): which seeds, and one verdict over them all.

One seed is one schedule of faults; a harness or a product that passes one
seed may fail the next, so a claim about reliability quotes several. Each seed
is a full run of its own (its own ZooKeeper, bookies, daemons and SOAK_DIR
subfolder); this module only parses the list and combines their summaries.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

#: Figures summed over the seeds (each a count in every seed's summary).
COUNTS = (
    "faults_injected",
    "reportable_faults",
    "reportable_faults_reported",
    "violation_lines",
    "mark_lines",
    "leader_intervals",
)
#: Figures that are lists in each seed's summary, summed as lengths.
LISTS = (
    "false_alarms",
    "missed",
    "unverified",
    "leader_overlaps_raw",
    "leader_overlaps_acting",
    "leader_flaps",
    "blinded",
    "driver_errors",
)
_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_SEEDS = 1000


class SeedsError(ValueError):
    """SOAK_SEEDS is not a list of seeds."""


def parse_seeds(text: str) -> list[int]:
    """`1,2,3` or `1-5` or both mixed; empty: no list (SOAK_SEED applies). Order is kept,
    a seed named twice runs once."""
    seeds: list[int] = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        m = _ITEM.match(item)
        if m is None:
            raise SeedsError(f"SOAK_SEEDS: {item[:20]!r} is not a seed or a range a-b")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo or hi - lo >= MAX_SEEDS:
            raise SeedsError(f"SOAK_SEEDS: bad range {item[:20]!r}")
        seeds += [n for n in range(lo, hi + 1) if n not in seeds]
        if len(seeds) > MAX_SEEDS:
            raise SeedsError(f"SOAK_SEEDS: more than {MAX_SEEDS} seeds")
    return seeds


def combine(summaries: list[dict[str, Any]], workdir: Path) -> dict[str, Any]:
    """One verdict (PASS only if every seed passed), per-seed figures, totals, and a
    readable line per seed."""
    per_seed: list[dict[str, Any]] = []
    totals: dict[str, int] = dict.fromkeys((*COUNTS, *LISTS), 0)
    by_kind: dict[str, dict[str, int]] = {}
    lines: list[str] = []
    for s in summaries:
        row: dict[str, Any] = {
            "seed": s["seed"],
            "verdict": s["verdict"],
            "dir": str(workdir / f"seed-{s['seed']}"),
            "minutes": s["minutes"],
            "failures": s["failures"],
        }
        for key in COUNTS:
            row[key] = int(s.get(key, 0))
            totals[key] += row[key]
        for key in LISTS:
            row[key] = len(s.get(key, []))
            totals[key] += row[key]
        per_seed.append(row)
        for kind, figures in s.get("faults_by_kind", {}).items():
            acc = by_kind.setdefault(kind, {})
            for name, value in figures.items():
                acc[name] = acc.get(name, 0) + int(value)
        lines.append(
            f"seed {s['seed']}: {s['verdict']} ({s['minutes']} min, "
            f"{row['faults_injected']} faults, {row['reportable_faults_reported']}/"
            f"{row['reportable_faults']} reported, {row['false_alarms']} false alarms, "
            f"{row['missed']} missed, {row['leader_overlaps_acting']} acting overlaps, "
            f"{row['leader_flaps']} flaps)"
        )
    verdict = "PASS" if summaries and all(s["verdict"] == "PASS" for s in summaries) else "FAIL"
    return {
        "verdict": verdict,
        "seeds": [s["seed"] for s in summaries],
        "per_seed": per_seed,
        "totals": totals,
        "faults_by_kind": dict(sorted(by_kind.items())),
        "lines": lines,
    }
