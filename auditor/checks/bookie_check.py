"""A ledger whose ensemble names a bookie that is gone has lost copies, and finding such
ledgers among millions must cost memory for the affected ledgers only, not for the healthy
majority.

Lost bookies and their ledgers: the pure core of the bookie check.

A bookie is lost when some ensemble of some ledger (any segment, historical
ones included; open and closed ledgers alike) names it and it is neither
writable nor read-only. Ids that never registered at all are lost too: an
ensemble that names them points at data nobody can serve.

Upstream builds a full bookie -> ledgers index of the whole cluster and then
subtracts the available bookies. The available set is known before the walk,
so here each ledger's lost bookies are computed as it goes by
(`its bookies - available`) and only lost bookies get an index entry, as a
flat `array('q')` of ledger ids: memory grows with the ledgers that are
actually affected, never with the healthy majority.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Set
from dataclasses import dataclass

from auditor.checks.findings import Category, Violation, metadata_invalid
from auditor.metadata.model import LedgerMetadata, LedgerState

#: What a `metadata_invalid` violation of this check says about the ledger's bookies.
BOOKIES_UNKNOWN = "unknown: the metadata could not be decoded, so its ensembles were not examined"


@dataclass(frozen=True, slots=True)
class LostBookie:
    """One lost bookie of one ledger, with the segments (by first entry id) naming it."""

    bookie: str
    segments: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LedgerLoss:
    """A ledger with at least one lost bookie; `lost` is sorted by bookie id."""

    ledger_id: int
    state: LedgerState
    znode_version: int
    lost: tuple[LostBookie, ...]

    @property
    def bookies(self) -> tuple[str, ...]:
        """The lost bookies, sorted: the missing replicas its mark lists."""
        return tuple(lb.bookie for lb in self.lost)

    def without(self, returned: Set[str]) -> LedgerLoss | None:
        """This loss minus bookies that came back; None when none is left."""
        kept = tuple(lb for lb in self.lost if lb.bookie not in returned)
        if not kept:
            return None
        if len(kept) == len(self.lost):
            return self
        return LedgerLoss(self.ledger_id, self.state, self.znode_version, kept)


def ledger_loss(
    md: LedgerMetadata, available: Set[str], znode_version: int = 0
) -> LedgerLoss | None:
    """The lost bookies of one ledger given the available set, or None if it has none."""
    found: dict[str, list[int]] = {}
    for seg in md.segments:
        for bookie in seg.bookies:
            if bookie in available:
                continue
            firsts = found.setdefault(bookie, [])
            # A bookie appears at most once per ensemble in valid metadata; the
            # guard keeps the evidence clean even if one did not.
            if not firsts or firsts[-1] != seg.first_entry_id:
                firsts.append(seg.first_entry_id)
    if not found:
        return None
    lost = tuple(LostBookie(b, tuple(found[b])) for b in sorted(found))
    return LedgerLoss(md.ledger_id, md.state, znode_version, lost)


class LostBookieIndex:
    """Lost bookie -> ids of its ledgers, filled one ledger at a time.

    Only lost bookies are indexed (8 bytes per (ledger, lost bookie) pair), so
    a walk over millions of healthy ledgers leaves it empty.
    """

    def __init__(self, available: Iterable[str]) -> None:
        self.available: frozenset[str] = frozenset(available)
        self._ledgers: dict[str, array[int]] = {}

    def add(self, md: LedgerMetadata, znode_version: int = 0) -> LedgerLoss | None:
        """Indexes one ledger; returns its loss (None when all its bookies are available)."""
        loss = ledger_loss(md, self.available, znode_version)
        if loss is not None:
            for lb in loss.lost:
                self._ledgers.setdefault(lb.bookie, array("q")).append(loss.ledger_id)
        return loss

    def forget(self, bookies: Iterable[str]) -> None:
        """Drops bookies that turned out not to be lost (they came back)."""
        for b in bookies:
            self._ledgers.pop(b, None)

    @property
    def lost_bookies(self) -> list[str]:
        return sorted(self._ledgers)

    def ledgers(self, bookie: str) -> array[int]:
        """Ledger ids of a lost bookie, in walk (id) order; empty if it is not lost."""
        return self._ledgers.get(bookie, array("q"))

    def ledger_counts(self) -> dict[str, int]:
        """Number of ledgers per lost bookie (what upstream publishes per bookie)."""
        return {b: len(self._ledgers[b]) for b in sorted(self._ledgers)}

    def __iter__(self) -> Iterator[tuple[str, array[int]]]:
        for b in sorted(self._ledgers):
            yield b, self._ledgers[b]


def loss_violations(loss: LedgerLoss) -> list[Violation]:
    """One `ledgers_on_lost_bookies` violation per (ledger, lost bookie) pair.

    Per pair rather than per ledger so that each violation names its bookie in
    the report's `bookie` field (filterable, like upstream's per-bookie
    publishing); `counts` still counts the ledger once. Each detail also lists
    all the ledger's lost bookies, which is what its mark records.
    """
    state = loss.state.name.lower()
    return [
        Violation(
            loss.ledger_id,
            Category.LEDGERS_ON_LOST_BOOKIES,
            lb.bookie,
            {
                "segments": list(lb.segments),
                "ledger_state": state,
                "missing_replicas": list(loss.bookies),
                "metadata_version": loss.znode_version,
            },
        )
        for lb in loss.lost
    ]


def invalid_metadata_violation(
    ledger_id: int, reason: str, path: str, znode_version: int
) -> Violation:
    """`metadata_invalid` for a ledger whose metadata does not decode: its bookies are unknown."""
    return metadata_invalid(ledger_id, path, znode_version, reason, bookies=BOOKIES_UNKNOWN)
