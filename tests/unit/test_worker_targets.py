"""The worker's target choice: candidates, placement first, then upstream's rack order.

Bookie names say their rack: `a*` in /ra, `b*` in /rb, `c*` in /rc, `d*` in /rd;
`u*` have no location (the policy's default). With W=2 and the default
`minNumRacksPerWriteQuorum=2`, every pair of neighbours (wrapping) must span two racks.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence

import pytest

from auditor.checks.placement import Adherence, PlacementPolicy, PolicyKind
from auditor.metadata.model import LedgerMetadata, LedgerState, Segment
from auditor.worker.targets import SEARCH_LIMIT, NoTargetError, choose_targets

RACKS = {"a": "/ra", "b": "/rb", "c": "/rc", "d": "/rd", "e": "/re", "f": "/rf"}
RACKAWARE = PlacementPolicy()
ENFORCED = PlacementPolicy(enforce_min_racks_per_write_quorum=True)
DEFAULT = PlacementPolicy(kind=PolicyKind.DEFAULT)


def loc(*bookies: str) -> dict[str, str]:
    return {b: RACKS[b[0]] for b in bookies if b[0] in RACKS}


def ledger(ensemble: Sequence[str], w: int = 2, segments: int = 1) -> LedgerMetadata:
    segs = tuple(Segment(10 * k, tuple(ensemble)) for k in range(segments))
    return LedgerMetadata(
        ledger_id=5,
        format_version=3,
        ensemble_size=len(ensemble),
        write_quorum=w,
        ack_quorum=min(w, 2),
        state=LedgerState.CLOSED,
        segments=segs,
        last_entry_id=10 * segments - 1,
    )


def choose(
    md: LedgerMetadata,
    bad: Sequence[int],
    writable: set[str],
    *,
    policy: PlacementPolicy = RACKAWARE,
    locations: Mapping[str, str] | None = None,
    seed: int = 1,
    segment: int = 0,
) -> dict[int, str]:
    everyone = set(writable) | md.bookies()
    return choose_targets(
        md,
        segment,
        bad,
        writable=writable,
        policy=policy,
        locations=loc(*everyone) if locations is None else locations,
        rng=random.Random(seed),
    )


def choices(
    md: LedgerMetadata,
    bad: Sequence[int],
    writable: set[str],
    *,
    policy: PlacementPolicy = RACKAWARE,
) -> set[str]:
    """Every target seen over 200 seeds."""
    seen: set[str] = set()
    for seed in range(200):
        seen.update(choose(md, bad, writable, policy=policy, seed=seed).values())
    return seen


# --- rack-aware ----------------------------------------------------------------------


def test_lost_bookie_e3_w2_over_three_racks_keeps_the_spread() -> None:
    md = ledger(["a1", "b1", "c1"])
    # b2 would put two /rb neighbours together; a2 keeps /ra, /rb, /rc
    assert choose(md, [0], {"b1", "c1", "a2", "b2", "c2"}) == {0: "a2"}


def test_a_new_rack_when_the_old_rack_has_no_spare() -> None:
    md = ledger(["a1", "b1", "c1"])
    assert choose(md, [0], {"b1", "c1", "b2", "c2", "d1"}) == {0: "d1"}


def test_same_rack_first_random_among_equals() -> None:
    md = ledger(["a1", "b1", "c1"])
    # a2, a3: same rack (first in upstream's order); d1, d2: a new rack, also adhering
    assert choices(md, [0], {"b1", "c1", "a2", "a3", "d1", "d2"}) == {"a2", "a3"}


def test_adhering_beats_the_same_rack() -> None:
    # A badly placed ensemble: a1 and a2 neighbours in /ra. Upstream's same-rack step
    # takes a3 and stays failing; b1 makes the segment adhere.
    md = ledger(["a1", "a2", "c1"])
    assert choose(md, [0], {"a2", "c1", "a3", "b1", "c2"}) == {0: "b1"}


def test_failing_choice_taken_when_nothing_adheres() -> None:
    md = ledger(["a1", "b1", "c1"])
    # only /rb and /rc spares: each makes one window fail; a copy beats none
    assert choices(md, [0], {"b1", "c1", "b2", "c2"}) == {"b2", "c2"}


def test_fewer_failing_windows_preferred_when_the_segment_fails_anyway() -> None:
    # E4 W2: a1 | a2 already fail (window 0). Replacing position 2 (c1, lost):
    # a3 would also fail windows 1 and 2, b2 fails window 2 (b2, b1), d1 fails none.
    md = ledger(["a1", "a2", "c1", "b1"])
    assert choose(md, [2], {"a1", "a2", "b1", "a3", "b2", "d1"}) == {2: "d1"}


def test_two_bad_positions_get_two_distinct_targets() -> None:
    md = ledger(["a1", "b1", "c1"])
    assert choose(md, [0, 1], {"c1", "a2", "b2", "c2"}) == {0: "a2", 1: "b2"}
    # only one rack left: both from it, never the same bookie
    for seed in range(50):
        got = choose(md, [0, 1], {"c1", "a2", "a3"}, seed=seed)
        assert sorted(got.values()) == ["a2", "a3"]


def test_two_positions_chosen_jointly() -> None:
    # E3 W2, c1 stays in /rc; positions 0 and 1 need two different racks other
    # than /rc: only the pair (/ra, /rb) in either order adheres.
    md = ledger(["a1", "b1", "c1"])
    writable = {"c1", "a2", "b2", "c2", "c3"}
    for seed in range(50):
        got = choose(md, [0, 1], writable, seed=seed)
        assert sorted(got.values()) == ["a2", "b2"]


def test_read_only_and_members_never_targets() -> None:
    md = ledger(["a1", "b1", "c1"])
    # a2 is read-only: not writable, so never offered. Members b1, c1 are writable.
    with pytest.raises(NoTargetError) as err:
        choose(md, [0], {"b1", "c1"})
    assert err.value.ledger_id == 5
    assert err.value.segment_index == 0
    assert err.value.positions == (0,)
    assert str(err.value) == (
        "ledger 5 segment 0 (from entry 0): no replacement for position(s) 0: "
        "0 writable bookie(s) outside the ensemble for 1 position(s)"
    )


def test_a_registration_no_bookie_id_can_be_is_never_a_target() -> None:
    """Names under `available/` are untrusted: `evil host!`, `a/b` and the reserved
    `readonly` are passed over (default policy: any valid one would do), and when only
    such names are left, the reason counts them."""
    md = ledger(["a1", "b1", "c1"])
    bad = {"evil host!", "readonly", "dé1"}
    assert choices(md, [0], {"d1", *bad}, policy=DEFAULT) == {"d1"}
    with pytest.raises(NoTargetError) as err:
        choose(md, [0], {"b1", *bad}, policy=DEFAULT, locations={})
    assert str(err.value).endswith(
        "0 writable bookie(s) outside the ensemble for 1 position(s) "
        "(3 more registered under names no bookie id can be)"
    )


def test_not_enough_candidates_for_two_positions() -> None:
    md = ledger(["a1", "b1", "c1"], segments=2)
    with pytest.raises(NoTargetError, match=r"segment 1 \(from entry 10\).* 1 writable bookie"):
        choose(md, [0, 1], {"c1", "d1"}, segment=1)


def test_unknown_location_is_the_default_rack() -> None:
    md = ledger(["a1", "b1", "c1"])
    # u1 has no location: /default-rack, a rack no member uses (tier 1, adheres)
    assert choose(md, [0], {"b1", "c1", "b2", "u1"}) == {0: "u1"}


# --- enforceMinNumRacksPerWriteQuorum ------------------------------------------------


def test_enforce_refuses_the_default_rack() -> None:
    md = ledger(["a1", "b1", "c1"])
    with pytest.raises(NoTargetError, match=r"1 more in /default-rack, refused"):
        choose(md, [0], {"b1", "c1", "u1"}, policy=ENFORCED)


def test_enforce_refuses_anywhere_when_it_fails() -> None:
    md = ledger(["a1", "b1", "c1"])
    with pytest.raises(NoTargetError, match="with enforceMinNumRacksPerWriteQuorum"):
        choose(md, [0], {"b1", "c1", "b2", "c2"}, policy=ENFORCED)
    # without enforce the same cluster gets a (failing) copy
    assert choose(md, [0], {"b1", "c1", "b2"}) == {0: "b2"}


def test_enforce_takes_anywhere_when_it_adheres() -> None:
    # E4 W2 a1 b1 c1 b2: a1 lost; no /ra spare, no unused rack; c2 is "anywhere" in
    # upstream's order (which refuses it with enforce) but the segment adheres with it.
    md = ledger(["a1", "b1", "c1", "b2"])
    assert choose(md, [0], {"b1", "c1", "b2", "c2"}, policy=ENFORCED) == {0: "c2"}


def test_enforce_keeps_a_same_rack_choice_even_if_the_segment_fails() -> None:
    # already failing elsewhere (a2 | a3); the same-rack choice is allowed, as upstream
    md = ledger(["b1", "a2", "a3", "c1"])
    assert choose(md, [0], {"a2", "a3", "c1", "b2"}, policy=ENFORCED) == {0: "b2"}


# --- other policies ------------------------------------------------------------------


def test_default_policy_random_writable_non_member() -> None:
    md = ledger(["a1", "b1", "c1"])
    writable = {"b1", "c1", "b2", "u1", "a2"}
    assert choices(md, [0], writable, policy=DEFAULT) == {"b2", "u1", "a2"}
    assert choose(md, [0], writable, policy=DEFAULT, seed=3) == choose(
        md, [0], writable, policy=DEFAULT, seed=3
    )


def test_zoneaware_strict_before_soft() -> None:
    zones = {
        "z1": "/z1/u1",
        "z2": "/z2/u1",
        "z3": "/z3/u1",
        "z2b": "/z2/u2",
        "z4": "/z4/u1",
    }
    policy = PlacementPolicy(kind=PolicyKind.ZONEAWARE)
    md = ledger(["z1", "z2", "z3"], w=3)
    # z2b: zones z2 (two domains), z3: two zones < desired 3 -> soft; z4: three -> strict
    got = choose(md, [0], {"z2", "z3", "z2b", "z4"}, policy=policy, locations=zones)
    assert got == {0: "z4"}
    assert policy.check(["z2b", "z2", "z3"], 3, zones).adherence is Adherence.MEETS_SOFT


def test_regionaware_spreads_regions() -> None:
    where = {"x1": "/r1/a", "x2": "/r1/b", "y1": "/r2/a", "y2": "/r2/b"}
    policy = PlacementPolicy(kind=PolicyKind.REGIONAWARE, cluster_regions=frozenset({"r1", "r2"}))
    md = ledger(["x1", "y1"], w=2)
    assert choose(md, [0], {"y1", "x2", "y2"}, policy=policy, locations=where) == {0: "x2"}


# --- the best achievable, checked by brute force --------------------------------------


def _best_adherence(
    md: LedgerMetadata, bad: Sequence[int], pool: list[str], locations: Mapping[str, str]
) -> Adherence:
    best = Adherence.FAIL
    for picks in itertools.permutations(pool, len(bad)):
        trial = list(md.segments[0].bookies)
        for p, b in zip(bad, picks, strict=True):
            trial[p] = b
        best = max(best, RACKAWARE.check(trial, md.write_quorum, locations).adherence)
    return best


def test_result_always_reaches_the_best_adherence_any_candidate_allows() -> None:
    rng = random.Random(20261127)
    names = [f"{r}{i}" for r in "abcd" for i in range(1, 4)]
    for _ in range(300):
        e = rng.randint(2, 5)
        w = rng.randint(1, e)
        ensemble = rng.sample(names, e)
        md = ledger(ensemble, w=w)
        bad = sorted(rng.sample(range(e), rng.randint(1, min(2, e))))
        outside = [n for n in names if n not in ensemble]
        writable = set(rng.sample(outside, rng.randint(len(bad), 5))) | set(ensemble)
        locations = loc(*names)
        got = choose(md, bad, writable, seed=rng.randint(0, 10**6))
        picked = list(got.values())
        assert sorted(got) == bad
        assert len(set(picked)) == len(picked)
        assert all(b in writable and b not in ensemble for b in picked)
        trial = list(ensemble)
        for p, b in got.items():
            trial[p] = b
        pool = sorted(writable - set(ensemble))
        assert RACKAWARE.check(trial, w, locations).adherence is _best_adherence(
            md, bad, pool, locations
        )


def test_many_positions_and_racks_fall_back_to_one_at_a_time() -> None:
    racks = [f"/r{i}" for i in range(20)]
    ensemble = [f"m{i}" for i in range(5)]
    spares = [f"s{i}" for i in range(20)]
    where = {b: racks[i] for i, b in enumerate(ensemble)} | {
        s: racks[i] for i, s in enumerate(spares)
    }
    assert len(racks) ** 3 > SEARCH_LIMIT
    md = ledger(ensemble, w=3)
    got = choose(md, [0, 2, 4], set(spares), locations=where)
    assert sorted(got) == [0, 2, 4]
    trial = list(ensemble)
    for p, b in got.items():
        trial[p] = b
    # each took its old rack (index i of spares is in rack i, as member i was)
    assert got == {0: "s0", 2: "s2", 4: "s4"}
    assert RACKAWARE.check(trial, 3, where).adherence is Adherence.MEETS_STRICT


def test_bad_arguments() -> None:
    md = ledger(["a1", "b1", "c1"])
    with pytest.raises(ValueError, match="segment index 1"):
        choose(md, [0], {"a2"}, segment=1)
    with pytest.raises(ValueError, match="not distinct"):
        choose(md, [0, 0], {"a2", "a3"})
    with pytest.raises(ValueError, match="not distinct"):
        choose(md, [3], {"a2"})
    assert choose(md, [], {"a2"}) == {}
