"""The replicas check's pure core: duties, probes, the verdict of every category, its evidence.

Round robin, for reading the expected values: entry `e` of a segment goes to the
bookies at indexes `(e + k) mod E`, k < W. With E=3, W=2 that is
index 0: 0, 2, 3, 5, ...; index 1: 0, 1, 3, 4, ...; index 2: 1, 2, 4, 5, ...
With E = W = 3 every bookie holds every entry.
"""

from __future__ import annotations

import pytest

from auditor.bookie.availability import EMPTY, Availability
from auditor.checks.findings import Category, Coverage, SkipReason, Violation
from auditor.checks.replicas import (
    EVIDENCE_LIMIT,
    BookieAnswer,
    Expectation,
    Listed,
    MissingOnBookie,
    Probed,
    ReplicasVerdict,
    Unanswered,
    Unverified,
    Verified,
    analyse,
    expectations,
    probe_entries,
    segment_shortfall,
    skip_reason,
    unanswered_registered,
    verdict_violations,
)
from auditor.metadata.model import LedgerMetadata, LedgerState, Segment, SegmentRange

B0, B1, B2, B3 = "b0:3181", "b1:3181", "b2:3181", "b3:3181"
LEDGER = 42


def ledger(
    e: int,
    w: int,
    a: int,
    last: int,
    segments: tuple[Segment, ...] | None = None,
    state: LedgerState = LedgerState.CLOSED,
) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=LEDGER,
        format_version=3,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        state=state,
        segments=segments or (Segment(0, (B0, B1, B2)[:e]),),
        last_entry_id=last,
    )


def holds(*entries: int) -> Listed:
    return Listed(Availability.from_entries(entries))


def holds_range(first: int, last: int, *without: int) -> Listed:
    return Listed(Availability.from_entries(e for e in range(first, last + 1) if e not in without))


#: Ten entries, every bookie holds every one (E = W = 3, A = 2).
FULL3 = ledger(3, 3, 2, 9)
#: Two segments of five entries each; the second replaces b2 with b3.
TWO_SEGMENTS = ledger(3, 3, 2, 9, (Segment(0, (B0, B1, B2)), Segment(5, (B0, B1, B3))))


def healthy(md: LedgerMetadata) -> dict[str, BookieAnswer]:
    return {b: holds_range(0, md.last_entry_id) for b in md.bookies()}


# --- which ledgers, which duties, which probes --------------------------------------------


@pytest.mark.parametrize(
    ("state", "last", "reason"),
    [
        (LedgerState.OPEN, 9, SkipReason.OPEN),
        (LedgerState.IN_RECOVERY, 9, SkipReason.IN_RECOVERY),
        (LedgerState.CLOSED, -1, SkipReason.EMPTY),
        (LedgerState.CLOSED, 9, None),
        (LedgerState.CLOSED, 0, None),
    ],
)
def test_only_closed_ledgers_with_entries_are_judged(
    state: LedgerState, last: int, reason: SkipReason | None
) -> None:
    assert skip_reason(ledger(3, 2, 2, last, state=state)) is reason


def test_expectations_name_each_bookie_of_each_segment_that_holds_an_entry() -> None:
    md = ledger(3, 2, 2, 9, (Segment(0, (B0, B1, B2)), Segment(5, (B0, B3, B2))))
    s0 = SegmentRange(0, 4, (B0, B1, B2))
    s1 = SegmentRange(5, 9, (B0, B3, B2))
    assert expectations(md) == [
        Expectation(s0, B0, 0),
        Expectation(s0, B1, 1),
        Expectation(s0, B2, 2),
        Expectation(s1, B0, 0),
        Expectation(s1, B3, 1),
        Expectation(s1, B2, 2),
    ]


def test_a_bookie_outside_every_write_set_and_empty_segments_have_no_duty() -> None:
    # Entry 0 goes to indexes 0 and 1 only; the second segment is empty (5 > 4).
    one_entry = ledger(3, 2, 2, 0)
    seg = SegmentRange(0, 0, (B0, B1, B2))
    assert expectations(one_entry) == [Expectation(seg, B0, 0), Expectation(seg, B1, 1)]
    emptied = ledger(3, 2, 2, 4, (Segment(0, (B0, B1, B2)), Segment(5, (B0, B1, B3))))
    assert [(x.bookie, x.segment.first) for x in expectations(emptied)] == [
        (B0, 0),
        (B1, 0),
        (B2, 0),
    ]
    assert expectations(ledger(3, 2, 2, -1)) == []


def test_probes_read_each_segments_first_and_last_stored_entry() -> None:
    md = ledger(3, 2, 2, 5)
    assert probe_entries(md, B0) == [0, 5]  # holds 0, 2, 3, 5
    assert probe_entries(md, B1) == [0, 4]  # holds 0, 1, 3, 4
    assert probe_entries(md, B2) == [1, 5]  # holds 1, 2, 4, 5
    split = ledger(3, 2, 2, 5, (Segment(0, (B0, B1, B2)), Segment(3, (B0, B3, B2))))
    assert probe_entries(split, B0) == [0, 2, 3, 5]
    assert probe_entries(split, B1) == [0, 1]
    assert probe_entries(split, B3) == [3, 4]
    assert probe_entries(split, "elsewhere:3181") == []
    assert probe_entries(ledger(3, 2, 2, 0), B0) == [0]  # first and last are one entry


# --- the verdict, category by category -----------------------------------------------------


def test_every_copy_present_is_no_category() -> None:
    v = analyse(FULL3, healthy(FULL3))
    assert v == ReplicasVerdict(
        LEDGER,
        None,
        3,
        (),
        (),
        {},
        {B0: Verified.LISTED, B1: Verified.LISTED, B2: Verified.LISTED},
    )
    assert not v.potentially_faulty
    assert v.bookies_missing_entries == []


def test_one_copy_short_is_below_write_quorum() -> None:
    answers = healthy(FULL3) | {B0: holds_range(0, 9, 4, 5)}
    v = analyse(FULL3, answers)
    assert (v.category, v.min_copies, v.worst_entries) == (
        Category.BELOW_WRITE_QUORUM,
        2,
        ((4, 5),),
    )
    assert v.missing == (MissingOnBookie(0, 9, B0, ((4, 5),), 2),)
    assert v.bookies_missing_entries == [B0]


def test_fewer_copies_than_the_ack_quorum_is_below_ack_quorum() -> None:
    answers = healthy(FULL3) | {B0: holds_range(0, 9, 4, 5), B1: holds_range(0, 9, 5, 6)}
    v = analyse(FULL3, answers)
    # Entry 5 lacks two copies (1 left < A = 2); 4 and 6 lack one each.
    assert (v.category, v.min_copies, v.worst_entries) == (Category.BELOW_ACK_QUORUM, 1, ((5, 5),))
    assert v.missing == (
        MissingOnBookie(0, 9, B0, ((4, 5),), 2),
        MissingOnBookie(0, 9, B1, ((5, 6),), 2),
    )
    assert v.bookies_missing_entries == [B0, B1]


def test_an_entry_on_no_bookie_is_no_replica() -> None:
    answers = {B0: holds_range(0, 9, 7), B1: holds_range(0, 9, 7, 8), B2: Listed(EMPTY)}
    v = analyse(FULL3, answers)
    assert (v.category, v.min_copies, v.worst_entries) == (Category.NO_REPLICA, 0, ((7, 7),))
    assert v.missing == (
        MissingOnBookie(0, 9, B0, ((7, 7),), 1),
        MissingOnBookie(0, 9, B1, ((7, 8),), 2),
        MissingOnBookie(0, 9, B2, ((0, 9),), 10),
    )


def test_worst_entries_merge_across_segments_and_missing_is_per_segment() -> None:
    md = TWO_SEGMENTS
    answers = healthy(md) | {B0: holds_range(0, 9, 4, 5)}
    v = analyse(md, answers)
    assert (v.category, v.min_copies, v.worst_entries) == (
        Category.BELOW_WRITE_QUORUM,
        2,
        ((4, 5),),
    )
    assert v.missing == (
        MissingOnBookie(0, 4, B0, ((4, 4),), 1),
        MissingOnBookie(5, 9, B0, ((5, 5),), 1),
    )


def test_the_worst_segment_decides_and_equal_ones_are_all_listed() -> None:
    md = TWO_SEGMENTS
    # Segment 0: entry 1 has 2 copies; segment 1: entries 6 and 8 have 1 copy each.
    answers = healthy(md) | {
        B0: holds_range(0, 9, 1, 6, 8),
        B1: holds_range(0, 9, 6, 8),
    }
    v = analyse(md, answers)
    assert (v.category, v.min_copies, v.worst_entries) == (
        Category.BELOW_ACK_QUORUM,
        1,
        ((6, 6), (8, 8)),
    )


def test_a_probed_bookie_counts_only_the_entries_read() -> None:
    md = ledger(3, 2, 2, 5)
    # b1 holds 0, 1, 3, 4: the probe read 0 (there) and 4 (gone); 1 and 3 are unknown.
    answers = healthy(md) | {B1: Probed({0: True, 4: False})}
    v = analyse(md, answers)
    assert (v.category, v.min_copies, v.worst_entries) == (Category.BELOW_ACK_QUORUM, 1, ((4, 4),))
    assert v.missing == (MissingOnBookie(0, 5, B1, ((4, 4),), 1),)
    assert v.verified == {B0: Verified.LISTED, B1: Verified.PROBED, B2: Verified.LISTED}


def test_a_probe_ignores_entries_outside_the_bookies_share() -> None:
    md = ledger(3, 2, 2, 5)
    # Entry 2 is not b1's (it goes to b0 and b2): its absence there is no shortfall.
    v = analyse(md, healthy(md) | {B1: Probed({0: True, 2: False, 4: True})})
    assert (v.category, v.missing) == (None, ())


def test_a_silent_bookie_is_potentially_faulty_and_counted_as_holding_everything() -> None:
    answers = healthy(FULL3) | {B2: Unanswered("timeout after 5s")}
    v = analyse(FULL3, answers)
    assert (v.category, v.min_copies, v.worst_entries, v.missing) == (None, 3, (), ())
    assert v.unanswered == {B2: "timeout after 5s"}
    assert v.verified[B2] is Verified.UNVERIFIED
    assert v.potentially_faulty


def test_a_bookie_without_an_answer_was_not_asked() -> None:
    answers = healthy(FULL3)
    del answers[B1]
    assert analyse(FULL3, answers).unanswered == {B1: "not asked"}


def test_an_unverified_bookie_is_neither_missing_nor_silent() -> None:
    answers = healthy(FULL3) | {B2: Unverified()}
    v = analyse(FULL3, answers)
    assert (v.category, v.unanswered, v.potentially_faulty) == (None, {}, False)
    assert v.verified == {B0: Verified.LISTED, B1: Verified.LISTED, B2: Verified.UNVERIFIED}


def test_a_shortfall_and_a_silent_bookie_together() -> None:
    answers = healthy(FULL3) | {B0: holds_range(0, 9, 3), B2: Unanswered("EIO")}
    v = analyse(FULL3, answers)
    assert (v.category, v.min_copies, v.unanswered) == (
        Category.BELOW_WRITE_QUORUM,
        2,
        {B2: "EIO"},
    )


def test_coverage_counts_each_bookie_by_how_it_was_verified() -> None:
    answers: dict[str, BookieAnswer] = {
        B0: holds_range(0, 9),
        B1: Probed({0: True, 9: True}),
        B2: Unanswered("unreachable"),
    }
    assert analyse(FULL3, answers).coverage() == Coverage(listed=1, probed=1, unverified=1)
    assert analyse(TWO_SEGMENTS, healthy(TWO_SEGMENTS)).coverage() == Coverage(listed=4)


def test_evidence_is_capped_but_counts_are_exact() -> None:
    md = ledger(3, 3, 2, 399)
    # b0 lacks every odd entry: 200 one-entry gaps.
    v = analyse(md, healthy(md) | {B0: holds(*range(0, 400, 2))})
    assert v.min_copies == 2
    assert v.worst_entries == tuple((x, x) for x in range(1, 2 * EVIDENCE_LIMIT, 2))
    (only,) = v.missing
    assert (only.count, len(only.ranges), only.ranges[-1]) == (200, EVIDENCE_LIMIT, (199, 199))


# --- what a final verdict reports ---------------------------------------------------------


def test_evidence_of_a_verdict() -> None:
    answers = healthy(FULL3) | {B0: holds_range(0, 9, 4, 5), B2: Unanswered("timeout after 5s")}
    v = analyse(FULL3, answers)
    assert v.evidence(FULL3, 7) == {
        "copies_found": 2,
        "write_quorum": 3,
        "ack_quorum": 2,
        "ensemble_size": 3,
        "worst_entries": [[4, 5]],
        "missing": [{"segment": [0, 9], "bookie": B0, "entries": [[4, 5]], "count": 2}],
        "unanswered": {B2: "timeout after 5s"},
        "verified": {B0: "listed", B1: "listed", B2: "unverified"},
        "metadata_version": 7,
    }


def test_only_registered_silent_bookies_are_reported() -> None:
    answers = healthy(FULL3) | {B1: Unanswered("EIO"), B2: Unanswered("timeout")}
    v = analyse(FULL3, answers)
    assert unanswered_registered(v, {B0, B2}) == [B2]
    assert unanswered_registered(v, {B0}) == []
    assert unanswered_registered(v, {B2, B1}) == [B1, B2]


def test_verdict_violations_are_the_category_then_each_silent_registered_bookie() -> None:
    md = TWO_SEGMENTS
    answers = healthy(md) | {
        B0: holds_range(0, 9, 8),
        B1: Unanswered("EIO"),
        B3: Unanswered("timeout"),
    }
    v = analyse(md, answers)
    found = verdict_violations(md, v, 4, {B0, B1, B2}, 3)  # b3 is not registered
    assert found == [
        Violation(LEDGER, Category.BELOW_WRITE_QUORUM, None, v.evidence(md, 4)),
        Violation(
            LEDGER,
            Category.BOOKIE_UNAVAILABLE_REGISTERED,
            B1,
            {"reason": "EIO", "attempts": 3, "segments": [[0, 4], [5, 9]], "metadata_version": 4},
        ),
    ]
    assert verdict_violations(FULL3, analyse(FULL3, healthy(FULL3)), 4, {B0}, 1) == []


def test_segment_shortfall_counts_as_analyse_does() -> None:
    md = ledger(3, 2, 2, 5)
    answers: dict[str, BookieAnswer] = {
        B0: holds(0, 2, 3),  # lacks 5
        B1: Probed({0: True, 4: False}),  # lacks 4; 1 and 3 unknown
        B2: Unanswered("timeout"),  # unknown: counted as present
    }
    (seg,) = md.segment_ranges()
    assert list(segment_shortfall(md, seg, answers)) == [(4, 5, 1)]
    assert list(segment_shortfall(md, seg, healthy(md))) == []
