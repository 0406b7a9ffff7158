"""What the daemons' real workers said they did, judged from their logs (pure).

Three things come out of the worker's lines:

* **figures**: ledgers taken, fragments committed, ledgers re-replicated, failed
  attempts by reason, per daemon and in total;
* **every bookie a ledger was given** (`replaced` of each "fragments committed"):
  the false-alarm rule explains a line about a ledger by a fault of any bookie the
  ledger ever had, and the driver's own reads of the metadata can miss an ensemble
  that a worker committed and changed again between two of them;
* **risk order**: each take logs the copies left of the ledger taken, how many other
  marked ledgers were free beside it (no lock known on them) and the fewest copies left
  among those (`copies_left`, `free_beside`, `fewest_copies_left_waiting`), computed
  from the ranks at that moment, not from the heap the take used. A take of a ledger
  with more copies left than the fewest free beside it is a break of the order; riskier
  ledgers that other workers held locked are not free, and are no break.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from soak.logs import Line

TAKEN = "ledger taken for re-replication"
COMMITTED = "fragments committed"
REPLICATED = "ledger re-replicated"
NOT_REPLICATED = "ledger not re-replicated"


def bookies_given(lines: list[Line]) -> dict[int, set[str]]:
    """Ledger id -> the bookies workers committed into it."""
    out: dict[int, set[str]] = {}
    for ln in lines:
        if ln.event != COMMITTED:
            continue
        lid = ln.fields.get("ledger")
        replaced = ln.fields.get("replaced")
        if isinstance(lid, int) and isinstance(replaced, dict):
            out.setdefault(lid, set()).update(str(b) for b in replaced.values())
    return out


def risk_order_breaks(lines: list[Line]) -> list[dict[str, Any]]:
    """Takes of a ledger while one with fewer copies left waited for that worker."""
    breaks = []
    for ln in lines:
        if ln.event != TAKEN:
            continue
        left = ln.fields.get("copies_left")
        fewest = ln.fields.get("fewest_copies_left_waiting")
        if isinstance(left, int) and isinstance(fewest, int) and fewest < left:
            breaks.append(
                {
                    "daemon": ln.daemon,
                    "t": round(ln.t, 3),
                    "ledger": ln.fields.get("ledger"),
                    "copies_left": left,
                    "fewest_copies_left_waiting": fewest,
                }
            )
    return breaks


def figures(lines: list[Line]) -> dict[str, Any]:
    """What the workers did, and the ledgers any of them found unrecoverable."""
    by_daemon: dict[str, Counter[str]] = {}
    reasons: Counter[str] = Counter()
    unrecoverable: set[int] = set()
    ordered_takes = 0
    for ln in lines:
        if ln.event not in (TAKEN, COMMITTED, REPLICATED, NOT_REPLICATED):
            continue
        by_daemon.setdefault(ln.daemon, Counter())[ln.event] += 1
        beside = ln.fields.get("free_beside")
        if ln.event == TAKEN and isinstance(beside, int) and beside > 0:
            ordered_takes += 1
        if ln.event == NOT_REPLICATED:
            reason = str(ln.fields.get("reason"))
            reasons[reason] += 1
            lid = ln.fields.get("ledger")
            if reason == "unrecoverable" and isinstance(lid, int):
                unrecoverable.add(lid)
    total: Counter[str] = Counter()
    for c in by_daemon.values():
        total.update(c)
    breaks = risk_order_breaks(lines)
    return {
        "ledgers_taken": total[TAKEN],
        "fragments_committed_lines": total[COMMITTED],
        "ledgers_re_replicated": total[REPLICATED],
        "attempts_failed": dict(sorted(reasons.items())),
        "by_daemon": {d: dict(c) for d, c in sorted(by_daemon.items())},
        "unrecoverable": sorted(unrecoverable),
        "takes_with_others_waiting": ordered_takes,
        "risk_order_breaks": breaks,
    }
