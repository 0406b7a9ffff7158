"""The worker's take order: the pure ranking of marked ledgers by risk, exactly.

Round robin, for reading the expected values: entry `e` of a segment goes to the
bookies at indexes `(e + k) mod E`, k < W. With E=4, W=2 the write sets are
(0,1), (1,2), (2,3), (3,0).
"""

from __future__ import annotations

from auditor.metadata.model import LedgerMetadata, LedgerState, Segment
from auditor.worker.risk import (
    BUCKETS,
    LedgerShape,
    QueuedLedger,
    Risk,
    rank,
    shape_of,
    summarize,
)

A, B, C, D, E, F, G = (f"{x}:3181" for x in "abcdefg")
ALL = frozenset({A, B, C, D, E, F, G})
RACKS = {A: "/r1", B: "/r1", G: "/r1", C: "/r2", D: "/r2", E: "/r3"}  # F: no rack known
T = 1_700_000_000.0


def ledger(
    segments: tuple[Segment, ...],
    *,
    e: int = 3,
    w: int = 3,
    last: int = 99,
    state: LedgerState = LedgerState.CLOSED,
) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=1,
        format_version=3,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=min(2, w),
        state=state,
        segments=segments,
        last_entry_id=last if state is LedgerState.CLOSED else -1,
    )


def copies(md: LedgerMetadata, missing: set[str], available: frozenset[str] = ALL) -> int | None:
    return rank(shape_of(md), missing, T, available=available, locations=None).copies_left


# --- write sets ------------------------------------------------------------------------


def test_striping_gives_each_rotation_of_the_ensemble() -> None:
    md = ledger((Segment(0, (A, B, C, D)),), e=4, w=2)
    assert shape_of(md) == LedgerShape(((A, B), (B, C), (C, D), (D, A)), 2)


def test_a_segment_shorter_than_its_ensemble_has_only_the_write_sets_it_uses() -> None:
    # Entries 5 and 6 of E=4, W=2 in the second segment: residues 1 and 2.
    md = ledger((Segment(0, (E, F, A, B)), Segment(5, (A, B, C, D))), e=4, w=2, last=6)
    assert shape_of(md).write_sets == ((E, F), (F, A), (A, B), (B, E), (B, C), (C, D))


def test_an_empty_segment_of_a_closed_ledger_holds_nothing() -> None:
    # The second ensemble starts after the last entry: no entry was written to it.
    md = ledger((Segment(0, (A, B, C)), Segment(100, (D, E, F))), last=99)
    assert shape_of(md).write_sets == ((A, B, C), (B, C, A), (C, A, B))


def test_the_open_tail_counts_with_every_write_set() -> None:
    md = ledger((Segment(0, (A, B, F)), Segment(10, (C, D, E))), w=2, state=LedgerState.OPEN)
    # Segment 0 of an open ledger covers entries 0..9; the tail may get any entry.
    assert shape_of(md).write_sets == ((A, B), (B, F), (F, A), (C, D), (D, E), (E, C))
    # The same ledger closed at entry 10: the tail holds that one entry only, at indexes
    # (10 + k) mod 3 = 1, 2 (round robin counts from the entry id, not the segment start).
    closed = ledger((Segment(0, (A, B, F)), Segment(10, (C, D, E))), w=2, last=10)
    assert shape_of(closed).write_sets == ((A, B), (B, F), (F, A), (D, E))


# --- copies left -------------------------------------------------------------------------


def test_copies_left_is_the_worst_write_set() -> None:
    md = ledger((Segment(0, (A, B, C, D)),), e=4, w=2)
    assert copies(md, set()) == 2
    assert copies(md, {A}) == 1
    assert copies(md, {A, C}) == 1  # (A,B) keeps B, (C,D) keeps D, ...
    assert copies(md, {A, B}) == 0  # (A,B) has none


def test_a_bookie_gone_from_the_registry_counts_as_missing() -> None:
    md = ledger((Segment(0, (A, B, C)),))
    assert copies(md, {A}, available=ALL - {B}) == 1
    # The mark's own list counts even when the bookie is registered again.
    assert copies(md, {A}, available=ALL) == 2
    # Without the registry, only the mark.
    risk = rank(shape_of(md), {A}, T, available=None, locations=None)
    assert risk.copies_left == 2


def test_a_mark_without_a_list_is_ranked_by_the_registry_alone() -> None:
    md = ledger((Segment(0, (A, B, C)),))
    assert copies(md, set()) == 3
    assert copies(md, set(), available=ALL - {C}) == 2


def test_a_later_segment_can_be_the_worst() -> None:
    md = ledger((Segment(0, (A, B, C)), Segment(50, (A, D, E))))
    assert copies(md, {D, E}) == 1
    assert copies(md, {B}) == 2


def test_no_metadata_is_unknown_and_a_ledger_without_entries_is_whole() -> None:
    unknown = rank(None, {A}, T, available=ALL, locations=RACKS)
    assert unknown == Risk(None, None, T)
    assert unknown.bucket == "unknown"
    empty = ledger((Segment(0, (A, B, C)),), last=-1)
    assert shape_of(empty).write_sets == ()
    assert rank(shape_of(empty), {A, B}, T, available=ALL, locations=RACKS) == Risk(3, 3, T)


# --- racks left ----------------------------------------------------------------------------


def test_racks_left_is_the_fewest_racks_any_entry_spans() -> None:
    md = ledger((Segment(0, (A, C, E)),))
    shape = shape_of(md)
    assert rank(shape, set(), T, available=ALL, locations=RACKS) == Risk(3, 3, T)
    # C lost: A (/r1) and E (/r3) left.
    assert rank(shape, {C}, T, available=ALL, locations=RACKS) == Risk(2, 2, T)
    both_r1 = ledger((Segment(0, (A, B, E)),))
    assert rank(shape_of(both_r1), {E}, T, available=ALL, locations=RACKS) == Risk(2, 1, T)


def test_a_bookie_of_no_known_rack_is_in_the_default_rack() -> None:
    md = ledger((Segment(0, (A, F, C)),))
    assert rank(shape_of(md), {C}, T, available=ALL, locations=RACKS).racks_left == 2
    assert rank(shape_of(md), {C}, T, available=ALL, locations={}).racks_left == 1


def test_racks_are_a_minimum_of_their_own() -> None:
    # Segment 0 keeps its three copies, all in /r1: one rack failure from loss. Segment 1
    # lost D and keeps two copies in /r2 and /r3. Worst by copies: 2; by racks: 1.
    md = ledger((Segment(0, (A, B, G)), Segment(50, (C, E, D))))
    assert rank(shape_of(md), {D}, T, available=ALL, locations=RACKS) == Risk(2, 1, T)


# --- the order -----------------------------------------------------------------------------


def test_the_order_is_copies_then_racks_then_the_oldest_mark() -> None:
    ranks = {
        "two copies, two racks, old": Risk(2, 2, T),
        "one copy, young": Risk(1, 1, T + 100),
        "two copies, one rack, young": Risk(2, 1, T + 50),
        "one copy, old": Risk(1, 1, T + 1),
        "none left": Risk(0, 0, T + 500),
        "whole": Risk(3, 3, T - 1000),
        "unknown, oldest": Risk(None, None, T - 5000),
        "two copies, no racks known": Risk(2, None, T - 10),
    }
    assert sorted(ranks, key=lambda k: ranks[k].key) == [
        "none left",
        "one copy, old",
        "one copy, young",
        "two copies, one rack, young",
        "two copies, two racks, old",
        "two copies, no racks known",
        "whole",
        "unknown, oldest",
    ]


def test_buckets() -> None:
    assert [Risk(n, None, T).bucket for n in (0, 1, 2, 3, 5)] == ["0", "1", "2", "3+", "3+"]
    assert BUCKETS == ("0", "1", "2", "3+", "unknown")


def test_summary_counts_every_bucket_and_the_oldest_of_each() -> None:
    risks = {
        10: Risk(1, 1, T + 30),
        11: Risk(1, 2, T + 10),
        12: Risk(2, 2, T + 5),
        13: Risk(3, 3, T),
        14: Risk(5, 3, T + 1),
    }
    s = summarize(risks, [(11, True), (10, False), (99, False)], T + 60)
    assert s.ranked_at == T + 60
    assert dict(s.by_copies) == {"0": 0, "1": 2, "2": 1, "3+": 2, "unknown": 0}
    assert dict(s.oldest) == {"1": T + 10, "2": T + 5, "3+": T}
    # A ledger forgotten since the head was read is left out.
    assert s.head == (QueuedLedger(11, risks[11], True), QueuedLedger(10, risks[10], False))
    assert s.total == 5
