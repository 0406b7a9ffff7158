"""Before moving racks or taking bookies away, an operator wants to know what the checks
will say afterwards; the prediction is made by the checks' own code, so that it is what the
check will say once the change is made.

What a planned change would do, predicted from metadata alone: the pure what-if core.

Two kinds of change:

* **Placement** (a new rack map, another `minNumRacksPerWriteQuorum`): every
  closed ledger is judged by the placement core twice, with today's policy and
  locations and with the changed ones; the report lists the ledgers whose
  category changes, and both totals.
* **Decommission** (bookies taken away): the bookie check's own selection,
  `bookie_check.ledger_loss`, is run against today's available set less those
  bookies, so `would_be_marked` is exactly what the bookie check marks once
  they are gone. For closed ledgers the copies left per write set are counted
  too (`risk.worst_severity`): the ledgers that would be below their ack
  quorum, or without any copy, until re-replication has run.

Ledger ids are kept in full (8 bytes each, in `array('q')`): a what-if is a
one-shot planning tool, and its answer is the list.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from auditor.analysis.risk import Severity, worst_severity
from auditor.checks.bookie_check import LedgerLoss, ledger_loss
from auditor.checks.findings import Category
from auditor.checks.placement import PlacementPolicy, analyse_ledger
from auditor.metadata.model import LedgerMetadata

PLACEMENT_CATEGORIES = (Category.PLACEMENT_NOT_ADHERING, Category.PLACEMENT_SOFTLY_ADHERING)


# --- placement ---------------------------------------------------------------------


def placement_change(
    md: LedgerMetadata,
    today: PlacementPolicy,
    today_locations: Mapping[str, str],
    predicted: PlacementPolicy,
    predicted_locations: Mapping[str, str],
) -> tuple[Category | None, Category | None]:
    """The placement category of a closed ledger today and after the change."""
    before = analyse_ledger(md, today, today_locations).category
    after = analyse_ledger(md, predicted, predicted_locations).category
    return before, after


@dataclass
class PlacementTally:
    today: Counter[Category] = field(default_factory=Counter)
    predicted: Counter[Category] = field(default_factory=Counter)
    newly: dict[Category, array[int]] = field(
        default_factory=lambda: {c: array("q") for c in PLACEMENT_CATEGORIES}
    )
    no_longer: dict[Category, array[int]] = field(
        default_factory=lambda: {c: array("q") for c in PLACEMENT_CATEGORIES}
    )

    def add(self, ledger_id: int, before: Category | None, after: Category | None) -> None:
        if before is not None:
            self.today[before] += 1
        if after is not None:
            self.predicted[after] += 1
        if before == after:
            return
        if after is not None:
            self.newly[after].append(ledger_id)
        if before is not None:
            self.no_longer[before].append(ledger_id)

    @property
    def worse(self) -> bool:
        return any(self.newly[c] for c in PLACEMENT_CATEGORIES)

    def to_json(self) -> dict[str, Any]:
        return {
            "today": {str(c): self.today[c] for c in PLACEMENT_CATEGORIES},
            "predicted": {str(c): self.predicted[c] for c in PLACEMENT_CATEGORIES},
            "newly": {str(c): sorted(self.newly[c]) for c in PLACEMENT_CATEGORIES},
            "no_longer": {str(c): sorted(self.no_longer[c]) for c in PLACEMENT_CATEGORIES},
        }


# --- decommission ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DecommissionEffect:
    """One ledger after the change: the bookie check's loss, and its copies (closed only)."""

    loss: LedgerLoss | None
    lost_today: bool
    before: Severity
    after: Severity


def decommission_effect(
    md: LedgerMetadata,
    available_today: Set[str],
    available_after: Set[str],
    znode_version: int = 0,
) -> DecommissionEffect:
    loss = ledger_loss(md, available_after, znode_version)
    lost_today = loss is not None and ledger_loss(md, available_today) is not None
    if not md.closed or loss is None:
        return DecommissionEffect(loss, lost_today, Severity.OK, Severity.OK)
    before = worst_severity(md, lambda b: b not in available_today)
    after = worst_severity(md, lambda b: b not in available_after)
    return DecommissionEffect(loss, lost_today, before, after)


@dataclass
class DecommissionTally:
    bookies: Sequence[str]
    would_be_marked: array[int] = field(default_factory=lambda: array("q"))
    newly_underreplicated: array[int] = field(default_factory=lambda: array("q"))
    worse: dict[Severity, array[int]] = field(
        default_factory=lambda: {
            Severity.BELOW_ACK_QUORUM: array("q"),
            Severity.NO_COPY: array("q"),
        }
    )
    per_bookie: Counter[str] = field(default_factory=Counter)

    def add(self, ledger_id: int, effect: DecommissionEffect) -> None:
        if effect.loss is None:
            return
        self.would_be_marked.append(ledger_id)
        if not effect.lost_today:
            self.newly_underreplicated.append(ledger_id)
        for lb in effect.loss.lost:
            if lb.bookie in self.bookies:
                self.per_bookie[lb.bookie] += 1
        if effect.after > effect.before:
            self.worse[effect.after].append(ledger_id)

    @property
    def has_effect(self) -> bool:
        return bool(self.would_be_marked)

    def to_json(self) -> dict[str, Any]:
        return {
            "bookies": list(self.bookies),
            "ledgers_per_bookie": {b: self.per_bookie[b] for b in self.bookies},
            "would_be_marked": sorted(self.would_be_marked),
            "newly_underreplicated": sorted(self.newly_underreplicated),
            "below_ack_quorum": sorted(self.worse[Severity.BELOW_ACK_QUORUM]),
            "no_copy": sorted(self.worse[Severity.NO_COPY]),
        }
