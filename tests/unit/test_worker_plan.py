"""The worker's plan: which positions are bad, what each must hold, what waits for fencing.

Round robin, for reading the expected values: entry `e` of a segment goes to the
bookies at indexes `(e + k) mod E`, k < W. With E=3, W=2 over entries 0..9:
index 0 holds 0, 2, 3, 5, 6, 8, 9; index 1 holds 0, 1, 3, 4, 6, 7, 9;
index 2 holds 1, 2, 4, 5, 7, 8.
"""

from __future__ import annotations

import itertools

import pytest

from auditor.bookie.availability import EMPTY, Availability
from auditor.checks.replicas import BookieAnswer, Listed, Probed, Unanswered, Unverified
from auditor.metadata.model import LedgerMetadata, LedgerState, Segment
from auditor.metadata.schedule import stores_entry
from auditor.worker.plan import (
    LOST,
    MISSING_ENTRIES,
    REQUESTED,
    LedgerPlan,
    Repair,
    plan_ledger,
    stored_ranges,
)

A1, B1, C1, D1, E1 = "a1:3181", "b1:3181", "c1:3181", "d1:3181", "e1:3181"
LEDGER = 7

#: What index 0, 1, 2 hold of entries 0..9 with E=3, W=2.
HOLDS_0 = ((0, 0), (2, 3), (5, 6), (8, 9))
HOLDS_1 = ((0, 1), (3, 4), (6, 7), (9, 9))
HOLDS_2 = ((1, 2), (4, 5), (7, 8))


def ledger(
    e: int = 3,
    w: int = 2,
    a: int = 2,
    last: int = 9,
    segments: tuple[Segment, ...] = (Segment(0, (A1, B1, C1)),),
    state: LedgerState = LedgerState.CLOSED,
) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LEDGER,
        format_version=3,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        state=state,
        segments=segments,
        last_entry_id=last if state is LedgerState.CLOSED else -1,
    )


def holds(ranges: tuple[tuple[int, int], ...]) -> Listed:
    return Listed(Availability.from_entries(e for lo, hi in ranges for e in range(lo, hi + 1)))


def full(md: LedgerMetadata, *bookies: str) -> dict[str, BookieAnswer]:
    """Every bookie holds every entry (more than its share: harmless)."""
    everything = Listed(Availability.from_entries(range(max(md.last_entry_id, 0) + 100)))
    return dict.fromkeys(bookies, everything)


# --- stored_ranges -------------------------------------------------------------------


def test_stored_ranges_e3_w2() -> None:
    assert stored_ranges(0, 9, 3, 2, 0) == HOLDS_0
    assert stored_ranges(0, 9, 3, 2, 1) == HOLDS_1
    assert stored_ranges(0, 9, 3, 2, 2) == HOLDS_2


def test_stored_ranges_e_equals_w_is_one_range() -> None:
    assert stored_ranges(5, 1_000_000_000, 3, 3, 1) == ((5, 1_000_000_000),)


def test_stored_ranges_empty_or_none_held() -> None:
    assert stored_ranges(10, 9, 3, 2, 0) == ()
    # E=3, W=2, entry 0 alone goes to 0 and 1, not 2
    assert stored_ranges(0, 0, 3, 2, 2) == ()


def test_stored_ranges_large_ledger_in_runs() -> None:
    got = stored_ranges(0, 9_999_999, 5, 2, 3)
    assert len(got) == 2_000_000
    assert got[:2] == ((2, 3), (7, 8))
    assert got[-1] == (9_999_997, 9_999_998)


@pytest.mark.parametrize(("e", "w"), [(e, w) for e in range(1, 6) for w in range(1, e + 1)])
def test_stored_ranges_matches_the_schedule_entry_by_entry(e: int, w: int) -> None:
    for first, last, index in itertools.product(range(0, 8), range(-1, 14), range(e)):
        expected = [x for x in range(first, last + 1) if stores_entry(index, x, e, w)]
        got = stored_ranges(first, last, e, w, index)
        assert [x for lo, hi in got for x in range(lo, hi + 1)] == expected
        # maximal ranges: never adjacent
        assert all(b[0] > a[1] + 1 for a, b in itertools.pairwise(got))


# --- closed ledgers ------------------------------------------------------------------


def test_lost_bookie_in_closed_ledger() -> None:
    md = ledger()
    plan = plan_ledger(md, registered={B1, C1, D1}, answers=full(md, B1, C1))
    assert plan == LedgerPlan(
        repairs=(Repair(0, 0, 9, 0, A1, HOLDS_0, (B1, C1), LOST),),
        open_tail=(),
        skipped=None,
        unknown=(),
    )
    assert plan.repairs[0].entry_count == 7
    assert not plan.clean


def test_healthy_ledger_is_clean() -> None:
    md = ledger()
    plan = plan_ledger(md, registered={A1, B1, C1}, answers=full(md, A1, B1, C1))
    assert plan == LedgerPlan((), (), None, ())
    assert plan.clean


def test_bookie_named_in_the_mark_lacking_entries() -> None:
    md = ledger()
    lacks_4 = holds(((0, 1), (3, 3), (6, 7), (9, 9)))
    answers: dict[str, BookieAnswer] = {A1: holds(HOLDS_0), B1: lacks_4, C1: holds(HOLDS_2)}
    plan = plan_ledger(md, registered={A1, B1, C1}, answers=answers, mark_replicas=[B1])
    assert plan.repairs == (Repair(0, 0, 9, 1, B1, HOLDS_1, (A1, C1), MISSING_ENTRIES),)
    assert plan.open_tail == ()
    assert plan.unknown == ()


def test_bookie_lacking_entries_is_repaired_even_if_the_mark_does_not_name_it() -> None:
    md = ledger()
    answers: dict[str, BookieAnswer] = {
        A1: holds(HOLDS_0),
        B1: holds(HOLDS_1),
        C1: holds(((1, 2), (4, 5))),
    }
    plan = plan_ledger(md, registered={A1, B1, C1}, answers=answers, mark_replicas=[A1])
    assert plan.repairs == (Repair(0, 0, 9, 2, C1, HOLDS_2, (A1, B1), MISSING_ENTRIES),)


def test_probed_absence_is_missing() -> None:
    md = ledger()
    answers: dict[str, BookieAnswer] = {
        A1: holds(HOLDS_0),
        B1: Probed({0: True, 9: False}),
        C1: holds(HOLDS_2),
    }
    plan = plan_ledger(md, registered={A1, B1, C1}, answers=answers)
    assert [(r.bookie_index, r.why) for r in plan.repairs] == [(1, MISSING_ENTRIES)]


def test_read_only_member_is_not_bad_and_is_a_source() -> None:
    md = ledger()
    # C1 is read-only: registered (available), not writable
    plan = plan_ledger(md, registered={B1, C1}, answers=full(md, B1, C1))
    assert plan.repairs == (Repair(0, 0, 9, 0, A1, HOLDS_0, (B1, C1), LOST),)


def test_unanswered_registered_bookie_is_unknown_not_repaired() -> None:
    md = ledger()
    answers: dict[str, BookieAnswer] = {
        A1: holds(HOLDS_0),
        B1: Unanswered("timeout"),
        C1: holds(HOLDS_2),
    }
    plan = plan_ledger(md, registered={A1, B1, C1}, answers=answers)
    assert plan == LedgerPlan((), (), None, (B1,))
    assert not plan.clean


def test_not_asked_registered_bookie_is_unknown() -> None:
    md = ledger()
    plan = plan_ledger(md, registered={A1, B1, C1}, answers={A1: holds(HOLDS_0)})
    assert plan.unknown == (B1, C1)
    assert plan.repairs == ()


def test_unknown_and_lost_together() -> None:
    md = ledger()
    answers: dict[str, BookieAnswer] = {B1: Unanswered("timeout"), C1: holds(HOLDS_2)}
    plan = plan_ledger(md, registered={B1, C1}, answers=answers)
    # the lost one is repaired; the silent one is a source of last resort but first
    # among the members that are not bad
    assert plan.repairs == (Repair(0, 0, 9, 0, A1, HOLDS_0, (C1, B1), LOST),)
    assert plan.unknown == (B1,)


def test_unverified_counts_as_holding_unless_the_mark_names_it() -> None:
    md = ledger()
    answers: dict[str, BookieAnswer] = {A1: holds(HOLDS_0), B1: Unverified(), C1: holds(HOLDS_2)}
    assert plan_ledger(md, registered={A1, B1, C1}, answers=answers).clean
    marked = plan_ledger(md, registered={A1, B1, C1}, answers=answers, mark_replicas=[B1])
    assert marked == LedgerPlan((), (), None, (B1,))


def test_lost_bookie_that_answers_nothing_is_lost_not_unknown() -> None:
    md = ledger()
    answers: dict[str, BookieAnswer] = {
        A1: Unanswered("refused"),
        B1: holds(HOLDS_1),
        C1: holds(HOLDS_2),
    }
    plan = plan_ledger(md, registered={B1, C1}, answers=answers, mark_replicas=[A1])
    assert [(r.old, r.why) for r in plan.repairs] == [(A1, LOST)]
    assert plan.unknown == ()


def test_two_bad_positions_two_repairs_and_bad_sources_last() -> None:
    md = ledger()
    lacks_4 = holds(((0, 1), (3, 3), (6, 7), (9, 9)))
    answers: dict[str, BookieAnswer] = {B1: lacks_4, C1: holds(HOLDS_2)}
    plan = plan_ledger(md, registered={B1, C1}, answers=answers)
    # Entry 0 is on A1 and B1 only: B1, bad itself, must stay a source for A1's share.
    assert plan.repairs == (
        Repair(0, 0, 9, 0, A1, HOLDS_0, (C1, B1), LOST),
        Repair(0, 0, 9, 1, B1, HOLDS_1, (C1,), MISSING_ENTRIES),
    )


def test_requested_bookie_is_replaced_and_still_a_source() -> None:
    md = ledger()
    plan = plan_ledger(md, registered={A1, B1, C1}, answers=full(md, A1, B1, C1), replace={A1})
    assert plan.repairs == (Repair(0, 0, 9, 0, A1, HOLDS_0, (B1, C1, A1), REQUESTED),)
    other = plan_ledger(md, registered={A1, B1, C1}, answers=full(md, A1, B1, C1), replace={B1})
    assert other.repairs == (Repair(0, 0, 9, 1, B1, HOLDS_1, (A1, C1, B1), REQUESTED),)
    assert other.repairs[0].sources == (A1, C1, B1)


def test_without_answers_only_the_registry_decides() -> None:
    md = ledger()
    plan = plan_ledger(md, registered={B1, C1}, answers=None, mark_replicas=[B1])
    assert plan == LedgerPlan((Repair(0, 0, 9, 0, A1, HOLDS_0, (B1, C1), LOST),), (), None, ())


def test_e_greater_than_w_repairs_only_round_robin_entries_and_sources_that_share() -> None:
    # E=5, W=2: index 0 holds entries e with (0 - e) mod 5 < 2: 0, 4, 5, 9, 10, ...
    bookies = (A1, B1, C1, D1, E1)
    md = ledger(e=5, w=2, last=11, segments=(Segment(0, bookies),))
    plan = plan_ledger(md, registered={B1, C1, D1, E1}, answers=full(md, B1, C1, D1, E1))
    # only positions 1 and 4 ever share a write set with position 0
    assert plan.repairs == (Repair(0, 0, 11, 0, A1, ((0, 0), (4, 5), (9, 10)), (B1, E1), LOST),)


def test_position_holding_nothing_in_a_short_segment_is_a_metadata_swap() -> None:
    # E=3, W=2, one entry: it goes to positions 0 and 1; position 2 holds nothing
    md = ledger(last=0)
    plan = plan_ledger(md, registered={A1, B1}, answers=full(md, A1, B1))
    assert plan.repairs == (Repair(0, 0, 0, 2, C1, (), (A1, B1), LOST),)


# --- empty segments ------------------------------------------------------------------


def test_empty_closed_ledger_lost_member_is_metadata_only() -> None:
    md = ledger(last=-1)
    plan = plan_ledger(md, registered={A1, C1}, answers={})
    assert plan == LedgerPlan((Repair(0, 0, -1, 1, B1, (), (A1, C1), LOST),), (), None, ())


def test_empty_last_segment_of_closed_ledger_is_metadata_only() -> None:
    segs = (Segment(0, (A1, B1, C1)), Segment(10, (A1, B1, D1)))
    md = ledger(last=9, segments=segs)
    answers = full(md, B1, C1)
    plan = plan_ledger(md, registered={B1, C1, D1}, answers=answers)
    assert plan.repairs == (
        Repair(0, 0, 9, 0, A1, HOLDS_0, (B1, C1), LOST),
        Repair(1, 10, 9, 0, A1, (), (B1, D1), LOST),
    )


# --- ledgers that are not closed -----------------------------------------------------


@pytest.mark.parametrize("state", [LedgerState.OPEN, LedgerState.IN_RECOVERY])
def test_open_ledger_last_segment_goes_to_open_tail_only(state: LedgerState) -> None:
    md = ledger(state=state)
    plan = plan_ledger(md, registered={B1, C1}, answers={})
    assert plan == LedgerPlan((), (Repair(0, 0, -1, 0, A1, (), (B1, C1), LOST),), None, ())


def test_open_ledger_earlier_segments_are_repaired_now() -> None:
    segs = (Segment(0, (A1, B1, C1)), Segment(10, (A1, B1, D1)))
    md = ledger(segments=segs, state=LedgerState.OPEN)
    answers: dict[str, BookieAnswer] = {B1: holds(HOLDS_1), C1: holds(HOLDS_2)}
    plan = plan_ledger(md, registered={B1, C1, D1}, answers=answers)
    assert plan == LedgerPlan(
        (Repair(0, 0, 9, 0, A1, HOLDS_0, (B1, C1), LOST),),
        (Repair(1, 10, -1, 0, A1, (), (B1, D1), LOST),),
        None,
        (),
    )


def test_open_ledger_tail_members_are_never_unknown_or_missing() -> None:
    segs = (Segment(0, (A1, B1, C1)), Segment(10, (A1, B1, D1)))
    md = ledger(segments=segs, state=LedgerState.OPEN)
    # D1 is only in the open segment: not asked, yet not unknown; nothing is bad
    answers: dict[str, BookieAnswer] = {A1: holds(HOLDS_0), B1: holds(HOLDS_1), C1: holds(HOLDS_2)}
    plan = plan_ledger(md, registered={A1, B1, C1, D1}, answers=answers, mark_replicas=[D1])
    assert plan.clean


def test_open_ledger_read_only_tail_member_is_not_fenced_for() -> None:
    md = ledger(state=LedgerState.OPEN)
    # C1 read-only: available, so not lost (upstream's quirk would fence the ledger)
    assert plan_ledger(md, registered={A1, B1, C1}, answers={}).clean


# --- metadata the plan cannot work with ---------------------------------------------


def test_bad_metadata_is_skipped() -> None:
    md = ledger(segments=(Segment(0, (A1, B1)),))
    plan = plan_ledger(md, registered=set(), answers=None)
    assert plan == LedgerPlan((), (), "ensemble at entry 0 has 2 bookies, ensemble size is 3", ())
    assert not plan.clean


def test_empty_answers_mean_empty_listings() -> None:
    md = ledger()
    answers: dict[str, BookieAnswer] = {A1: Listed(EMPTY), B1: holds(HOLDS_1), C1: holds(HOLDS_2)}
    plan = plan_ledger(md, registered={A1, B1, C1}, answers=answers)
    assert plan.repairs == (Repair(0, 0, 9, 0, A1, HOLDS_0, (B1, C1), MISSING_ENTRIES),)
