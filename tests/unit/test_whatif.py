"""The pure what-if core: placement before/after, and the decommission tally."""

from __future__ import annotations

from dataclasses import replace

from auditor.analysis.risk import Severity
from auditor.analysis.whatif import (
    DecommissionTally,
    PlacementTally,
    decommission_effect,
    placement_change,
)
from auditor.checks.findings import Category
from auditor.checks.placement import PlacementPolicy
from auditor.metadata.model import LedgerState
from auditor.testing.cluster import make_metadata

B = [f"b{i}:3181" for i in range(5)]
NOT = Category.PLACEMENT_NOT_ADHERING


def test_placement_change_with_a_new_map_and_min_racks() -> None:
    md = make_metadata(7, [B[0], B[1], B[2]], write_quorum=2, last_entry_id=9)
    today = PlacementPolicy()
    spread = {B[0]: "/r1", B[1]: "/r2", B[2]: "/r3"}
    moved = spread | {B[1]: "/r1"}
    assert placement_change(md, today, spread, today, spread) == (None, None)
    assert placement_change(md, today, spread, today, moved) == (None, NOT)
    assert placement_change(md, today, moved, today, spread) == (NOT, None)
    three = replace(today, min_racks_per_write_quorum=3)
    w3 = make_metadata(8, [B[0], B[1], B[2]], write_quorum=3, last_entry_id=9)
    assert placement_change(w3, today, moved, three, moved) == (None, NOT)

    tally = PlacementTally()
    tally.add(7, None, NOT)
    tally.add(8, NOT, None)
    tally.add(9, NOT, NOT)
    tally.add(10, None, None)
    assert tally.worse
    assert tally.to_json() == {
        "today": {"placement_not_adhering": 2, "placement_softly_adhering": 0},
        "predicted": {"placement_not_adhering": 2, "placement_softly_adhering": 0},
        "newly": {"placement_not_adhering": [7], "placement_softly_adhering": []},
        "no_longer": {"placement_not_adhering": [8], "placement_softly_adhering": []},
    }


def test_decommission_uses_the_bookie_checks_selection_and_counts_copies() -> None:
    everyone = frozenset(B)
    after = everyone - {B[0]}
    tally = DecommissionTally((B[0],))
    # W=2, A=2 on b0: below the ack quorum; W=3, A=2: still fine; not on b0: untouched.
    on_b0 = make_metadata(1, [B[0], B[1], B[2]], write_quorum=2, last_entry_id=9)
    spare = make_metadata(2, [B[0], B[1], B[2]], write_quorum=3, ack_quorum=2, last_entry_id=9)
    elsewhere = make_metadata(3, [B[2], B[3], B[4]], write_quorum=2, last_entry_id=9)
    # An open ledger is marked by the bookie check too; its copies are not counted.
    open_md = make_metadata(4, [B[0], B[3]], state=LedgerState.OPEN)
    # Already on a lost bookie (b4 gone today): marked again, not newly.
    lost_today = make_metadata(5, [B[0], B[4]], write_quorum=1, ack_quorum=1, last_entry_id=3)
    for md in (on_b0, spare, elsewhere, open_md):
        tally.add(md.ledger_id, decommission_effect(md, everyone, after))
    gone_b4 = everyone - {B[4]}
    effect = decommission_effect(lost_today, gone_b4, gone_b4 - {B[0]})
    assert (effect.lost_today, effect.before, effect.after) == (
        True,
        Severity.NO_COPY,
        Severity.NO_COPY,
    )
    tally.add(5, effect)
    assert tally.to_json() == {
        "bookies": [B[0]],
        "ledgers_per_bookie": {B[0]: 4},
        "would_be_marked": [1, 2, 4, 5],
        "newly_underreplicated": [1, 2, 4],
        "below_ack_quorum": [1],
        "no_copy": [],
    }
    assert tally.has_effect
