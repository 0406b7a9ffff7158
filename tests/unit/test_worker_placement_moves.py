"""Placement repair's pure parts: which copies move, where to, and what they must hold.

Bookie names say their location: `a*` in /ra, `b*` in /rb, `c*` in /rc; `u*` have none
(the policy's default). The default `minNumRacksPerWriteQuorum=2` holds: every write
quorum window (wrapping) must span min(W, 2) racks.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest

from auditor.checks.placement import Adherence, PlacementPolicy, PolicyKind
from auditor.metadata.model import LedgerMetadata, LedgerState, Segment
from auditor.worker.plan import NOT_ADHERING, not_adhering_segments, placement_repairs
from auditor.worker.targets import MOVE_SEARCH_LIMIT, CannotAdhereError, choose_adhering_moves

RACKAWARE = PlacementPolicy()
ENFORCED = PlacementPolicy(enforce_min_racks_per_write_quorum=True)


def rack(bookie: str) -> str | None:
    if bookie.startswith("u"):
        return None
    if bookie.startswith("r"):  # r<k>x<i>: bookie i of rack /r<k>
        return "/" + bookie.split("x")[0]
    return f"/r{bookie[0]}"


def locations(*bookies: str) -> dict[str, str]:
    return {b: loc for b in bookies if (loc := rack(b)) is not None}


def ledger(
    *segments: Sequence[str], w: int, state: LedgerState = LedgerState.CLOSED, last: int = 99
) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=9,
        format_version=3,
        ensemble_size=len(segments[0]),
        write_quorum=w,
        ack_quorum=min(w, 2),
        state=state,
        segments=tuple(Segment(50 * k, tuple(s)) for k, s in enumerate(segments)),
        last_entry_id=last,
    )


def moves(
    md: LedgerMetadata,
    spare: set[str],
    *,
    policy: PlacementPolicy = RACKAWARE,
    seed: int = 1,
    segment: int = 0,
    where: Mapping[str, str] | None = None,
) -> dict[int, str]:
    """`spare` are writable non-members; the members are writable too."""
    writable = spare | md.bookies()
    return choose_adhering_moves(
        md,
        segment,
        writable=writable,
        policy=policy,
        locations=locations(*writable) if where is None else where,
        rng=random.Random(seed),
    )


def after(md: LedgerMetadata, moved: Mapping[int, str], segment: int = 0) -> list[str]:
    return [moved.get(i, b) for i, b in enumerate(md.segments[segment].bookies)]


def adherence(md: LedgerMetadata, ensemble: Sequence[str], policy: PlacementPolicy) -> Adherence:
    return policy.check(ensemble, md.write_quorum, locations(*ensemble)).adherence


# --- the fewest moves ------------------------------------------------------------------


def test_e3_w3_on_one_rack_moves_one_copy_to_the_other_rack() -> None:
    """Upstream's own scenario (testRepairedNotAdheringPlacementPolicyLedgerFragmentsOnRack):
    one move; any of the three positions, either spare of /rb, never a member."""
    md = ledger(["a1", "a2", "a3"], w=3)
    seen: Counter[tuple[int, str]] = Counter()
    for seed in range(200):
        got = moves(md, {"b1", "b2"}, seed=seed)
        assert len(got) == 1
        seen.update(got.items())
    assert set(seen) == {(p, b) for p in range(3) for b in ("b1", "b2")}
    assert min(seen.values()) > 200 / 6 / 3  # uniform among equals, roughly


def test_e3_w2_needs_three_racks_two_moves() -> None:
    """E3/W2's three windows wrap around (0,1), (1,2), (2,0): with two racks one window
    always stays in one rack, so it takes a third rack and two moves."""
    md = ledger(["a1", "a2", "a3"], w=2)
    for seed in range(50):
        got = moves(md, {"b1", "c1"}, seed=seed)
        assert len(got) == 2
        assert sorted(got.values()) == ["b1", "c1"]
        assert adherence(md, after(md, got), RACKAWARE) is Adherence.MEETS_STRICT


def test_e3_w2_with_two_racks_cannot_adhere() -> None:
    md = ledger(["a1", "a2", "a3"], w=2)
    with pytest.raises(CannotAdhereError) as err:
        moves(md, {"b1", "b2", "b3"})
    assert (err.value.ledger_id, err.value.segment_index, err.value.first_entry) == (9, 0, 0)
    assert str(err.value) == (
        "ledger 9 segment 0 (from entry 0) cannot be made to adhere to the placement "
        "policy: write quorum spans 1 rack(s), needs 2, and no move to the 3 writable "
        "bookie(s) outside the ensemble in /rb makes every write quorum adhere"
    )


def test_one_rack_cannot_adhere_and_says_so_the_same_way_each_time() -> None:
    md = ledger(["a1", "a2", "a3"], w=3)
    texts = set()
    for seed in range(5):
        with pytest.raises(CannotAdhereError) as err:
            moves(md, {"a4", "a5"}, seed=seed)
        texts.add(str(err.value))
    assert texts == {
        "ledger 9 segment 0 (from entry 0) cannot be made to adhere to the placement "
        "policy: write quorum spans 1 rack(s), needs 2, and no move to the 2 writable "
        "bookie(s) outside the ensemble in /ra makes every write quorum adhere"
    }


def test_no_spare_bookie_cannot_adhere() -> None:
    md = ledger(["a1", "a2", "a3"], w=3)
    with pytest.raises(CannotAdhereError, match="no move to the 0 writable bookie"):
        moves(md, set())


def test_e4_w2_alternates_two_moves() -> None:
    md = ledger(["a1", "a2", "a3", "a4"], w=2)
    kept: Counter[tuple[int, ...]] = Counter()
    for seed in range(100):
        got = moves(md, {"b1", "b2"}, seed=seed)
        assert sorted(got) in ([0, 2], [1, 3])
        assert sorted(got.values()) == ["b1", "b2"]
        kept[tuple(sorted(got))] += 1
    assert set(kept) == {(0, 2), (1, 3)}


def test_only_the_failing_window_is_broken() -> None:
    """E5/W2 a b a b a: only the wrapping window (4, 0) fails; one copy moves to a third
    rack, at position 0 or 4; nothing else moves."""
    md = ledger(["a1", "b1", "a2", "b2", "a3"], w=2)
    for seed in range(50):
        got = moves(md, {"b3", "c1"}, seed=seed)
        assert got in ({0: "c1"}, {4: "c1"})


def test_a_segment_that_adheres_moves_nothing() -> None:
    md = ledger(["a1", "b1", "c1"], w=2)
    assert moves(md, {"a2", "b2"}) == {}


def test_strict_preferred_to_soft_among_the_fewest_moves() -> None:
    """Zone-aware E3/W3, desired three zones: moving one of z1's two copies to z2 or to
    z3 fixes the crowded upgrade domain; only z3 gives three zones (strict)."""
    policy = PlacementPolicy(kind=PolicyKind.ZONEAWARE)
    where = {
        "m1": "/z1/ud1",
        "m2": "/z1/ud1",
        "m3": "/z2/ud1",
        "s1": "/z2/ud2",
        "s2": "/z3/ud1",
    }
    md = ledger(["m1", "m2", "m3"], w=3)
    for seed in range(30):
        got = moves(md, {"s1", "s2"}, policy=policy, where=where, seed=seed)
        assert got in ({0: "s2"}, {1: "s2"})


def test_a_rule_no_location_changes_is_refused_at_once() -> None:
    policy = PlacementPolicy(kind=PolicyKind.ZONEAWARE)
    md = ledger(["m1", "m2", "m3", "m4", "m5"], w=2)
    where = {b: f"/z{i}/ud1" for i, b in enumerate(["m1", "m2", "m3", "m4", "m5", "s1"])}
    with pytest.raises(CannotAdhereError) as err:
        moves(md, {"s1"}, policy=policy, where=where)
    assert err.value.reason == (
        "ensemble size 5 is not a multiple of write quorum 2; no choice of bookies changes that"
    )


def test_enforce_moves_a_member_off_the_default_rack_and_never_onto_it() -> None:
    md = ledger(["a1", "b1", "u1"], w=2)
    assert adherence(md, md.segments[0].bookies, ENFORCED) is Adherence.FAIL
    for seed in range(20):
        assert moves(md, {"u2", "c1"}, policy=ENFORCED, seed=seed) == {2: "c1"}
    with pytest.raises(CannotAdhereError, match=r"\(1 more in /default-rack, refused"):
        moves(md, {"u2"}, policy=ENFORCED)


def test_past_the_search_limit_moves_are_chosen_one_at_a_time() -> None:
    """E8/W2 on one rack, with 40 one-bookie racks: two moves already cost
    28 x 40^2 > MOVE_SEARCH_LIMIT trial ensembles, so moves are chosen greedily; the
    result adheres, with distinct spare bookies."""
    members = [f"r0x{i}" for i in range(8)]
    spare = {f"r{k}x0" for k in range(1, 41)}
    assert MOVE_SEARCH_LIMIT < 28 * 40**2
    md = ledger(members, w=2)
    for seed in range(3):
        got = moves(md, spare, seed=seed)
        assert 4 <= len(got) <= 8
        assert set(got.values()) <= spare and len(set(got.values())) == len(got)
        assert adherence(md, after(md, got), RACKAWARE) is Adherence.MEETS_STRICT


def test_each_segment_on_its_own_members_of_others_allowed() -> None:
    """Segment 0 adheres; segment 1 needs /rb and /rc, and b1, c1 (members of segment 0
    only) are candidates for it as much as the spare b2."""
    md = ledger(["a1", "b1", "c1"], ["a1", "a2", "a3"], w=2)
    with pytest.raises(ValueError, match="segment index 2"):
        moves(md, {"b2"}, segment=2)
    assert moves(md, {"b2"}, segment=0) == {}
    seen: set[str] = set()
    for seed in range(40):
        got = moves(md, {"b2"}, segment=1, seed=seed)
        assert len(got) == 2 and "c1" in got.values()
        assert not set(got.values()) & set(md.segments[1].bookies)
        seen.update(got.values())
    assert seen == {"b1", "b2", "c1"}


# --- which segments, and what the moved copies must hold -----------------------------


def test_not_adhering_segments_of_a_closed_ledger_only() -> None:
    bad = ["a1", "a2", "a3"]
    good = ["a1", "b1", "c1"]
    where = locations("a1", "a2", "a3", "b1", "c1")
    md = ledger(good, bad, good, bad, w=2, last=199)
    assert not_adhering_segments(md, RACKAWARE, where) == (1, 3)
    for state in (LedgerState.OPEN, LedgerState.IN_RECOVERY):
        opened = ledger(good, bad, w=2, state=state, last=-1)
        assert not_adhering_segments(opened, RACKAWARE, where) == ()
    default = PlacementPolicy(kind=PolicyKind.DEFAULT)
    assert not_adhering_segments(md, default, where) == ()


def test_placement_repairs_hold_what_the_position_holds() -> None:
    """E4/W2, segment 1 is entries 50..99: position 1 stores the entries e with
    (1 - e) mod 4 < 2, runs of two every four (52-53 ... 96-97); its bookie is the first
    source, then the members that share entries with it (positions 0 and 2, not 3)."""
    md = ledger(["b1", "c1", "b2", "c2"], ["a1", "a2", "a3", "a4"], w=2)
    registered = {"a1", "a2", "a3", "a4"}
    [r1, r3] = placement_repairs(md, 1, [3, 1], registered)
    assert (r1.segment_index, r1.first_entry, r1.last_entry) == (1, 50, 99)
    assert (r1.bookie_index, r1.old, r1.why) == (1, "a2", NOT_ADHERING)
    assert r1.sources == ("a2", "a1", "a3")
    assert r1.entries[:2] == ((52, 53), (56, 57))
    assert r1.entries[-1] == (96, 97)
    assert r1.entry_count == 24
    assert (r3.bookie_index, r3.old, r3.sources) == (3, "a4", ("a4", "a1", "a3"))
    assert r3.entries[0] == (50, 51)
    # an unregistered member is no source; an empty segment holds nothing (metadata only)
    assert placement_repairs(md, 1, [1], registered - {"a3"})[0].sources == ("a2", "a1")
    empty = ledger(["a1", "a2", "a3"], w=3, last=-1)
    [r] = placement_repairs(empty, 0, [0], {"a1", "a2", "a3"})
    assert (r.entries, r.entry_count) == ((), 0)
