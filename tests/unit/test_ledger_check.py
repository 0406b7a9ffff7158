"""The ledger check's pure core: fragments, the probe rule, sampling, verdicts."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditor.bookie.protocol import Status, encode_entry_body
from auditor.bookie.results import (
    EntryRead,
    ErrorStatus,
    LacRead,
    NoAnswer,
    Ok,
    Outcome,
    Unanswered,
)
from auditor.checks.ledger_check import (
    BadBookie,
    BadFragment,
    EntrySelection,
    Fragment,
    Probe,
    ReadFailure,
    Verdict,
    bad_bookie_ids,
    classify_read,
    entry_may_exist,
    entry_ranges,
    evaluate,
    first_stored,
    fragments,
    lac_from_answers,
    last_stored,
    leave_held_alone,
    metadata_problem,
    plan_ledger,
    select_entries,
    single_entry_probe,
    violation_detail,
)
from auditor.metadata.model import DigestType, LedgerMetadata, LedgerState, Segment
from auditor.metadata.schedule import stores_entry
from auditor.testing.cluster import make_metadata

B = [f"10.0.0.{i}:3181" for i in range(8)]


def closed(segments: list[tuple[int, list[str]]], w: int, last: int, a: int = 1) -> LedgerMetadata:
    return make_metadata(
        7, segments, write_quorum=w, ack_quorum=a, last_entry_id=last, length=10 * (last + 1)
    )


def opened(segments: list[tuple[int, list[str]]], w: int) -> LedgerMetadata:
    return make_metadata(7, segments, write_quorum=w, ack_quorum=1, state=LedgerState.OPEN)


def stored(first: int, last: int, e: int, w: int, i: int) -> list[int]:
    return [x for x in range(first, last + 1) if stores_entry(i, x, e, w)]


# --- round robin ------------------------------------------------------------------------


@given(
    st.integers(1, 7).flatmap(
        lambda e: st.tuples(
            st.just(e), st.integers(1, e), st.integers(0, e - 1), st.integers(0, 40)
        )
    ),
    st.integers(-1, 60),
)
def test_first_and_last_stored_match_the_schedule(
    shape: tuple[int, int, int, int], length: int
) -> None:
    e, w, i, first = shape
    last = first + length - 1
    expected = stored(first, last, e, w, i)
    assert first_stored(first, last, e, w, i) == (expected[0] if expected else None)
    assert last_stored(first, last, e, w, i) == (expected[-1] if expected else None)


def test_first_and_last_stored_examples() -> None:
    # E=3 W=2: bookie 2 stores 1, 2, 4, 5, 7, ... (entries e with (2 - e) mod 3 < 2)
    assert first_stored(0, 9, 3, 2, 2) == 1
    assert last_stored(0, 9, 3, 2, 2) == 8
    # E=5 W=2: bookie 0 stores 0, 4, 5, 9, 10, ...; nothing in [1, 3]
    assert first_stored(1, 3, 5, 2, 0) is None
    assert last_stored(1, 3, 5, 2, 0) is None
    assert first_stored(5, 4, 3, 3, 0) is None  # empty range


# --- sampling ---------------------------------------------------------------------------

shapes = st.integers(1, 6).flatmap(
    lambda e: st.tuples(st.just(e), st.integers(1, e), st.integers(0, e - 1))
)


@settings(max_examples=400)
@given(shapes, st.integers(0, 50), st.integers(0, 400), st.integers(0, 100), st.integers(0, 2**32))
def test_selection_follows_the_percentage_rule(
    shape: tuple[int, int, int], start: int, length: int, pct: int, seed: int
) -> None:
    e, w, i = shape
    all_stored = stored(start, start + length - 1, e, w, i)
    if not all_stored:
        return
    fs, ls = all_stored[0], all_stored[-1]
    sel = select_entries(fs, ls, e, w, i, pct, random.Random(seed))
    entries = list(sel)
    # deterministic, ascending, stored, in range, first and last included
    assert entries == list(sel)
    assert entries == sorted(set(entries))
    assert all(stores_entry(i, x, e, w) and fs <= x <= ls for x in entries)
    assert entries[0] == fs and entries[-1] == ls
    assert sel.count() == len(entries)
    span = ls - fs + 1
    n = span * pct // 100
    if fs == ls or n >= span:
        assert entries == [x for x in all_stored if fs <= x <= ls]
        return
    if n == 0:
        assert entries == [fs, ls]
        return
    width = span // n
    assert (sel.buckets, sel.bucket_width) == (n, width)
    picks = [x for x in entries if x not in (fs, ls)]
    assert len(entries) <= n + 2
    per_bucket = [0] * n
    for x in picks:
        k = (x - fs) // width
        assert k < n, "a pick outside every bucket"
        per_bucket[k] += 1
    assert max(per_bucket) <= 1
    if w == e:  # every id is stored: exactly one pick per bucket survives
        for k in range(n):
            lo, hi = fs + k * width, fs + (k + 1) * width - 1
            assert any(lo <= x <= hi for x in entries)


def test_selection_examples() -> None:
    rng = random.Random(1)
    # default 0%: first and last only
    assert list(select_entries(0, 99, 3, 3, 0, 0, rng)) == [0, 99]
    # 100%: every stored entry (E=3 W=2 bookie 0 stores 0, 2, 3, 5, 6, 8, 9)
    assert list(select_entries(0, 9, 3, 2, 0, 100, rng)) == [0, 2, 3, 5, 6, 8, 9]
    assert stored(0, 9, 3, 2, 0) == [0, 2, 3, 5, 6, 8, 9]
    assert select_entries(0, 9, 3, 2, 0, 100, rng).count() == len(stored(0, 9, 3, 2, 0))
    # one stored entry
    assert list(select_entries(5, 5, 3, 1, 2, 0, rng)) == [5]
    # integer arithmetic: 100 * 29 // 100 == 29 buckets (floating point would give 28)
    assert select_entries(0, 99, 1, 1, 0, 29, rng).buckets == 29
    with pytest.raises(ValueError):
        select_entries(0, 9, 3, 3, 0, 101, rng)


def test_full_selection_of_a_huge_fragment_is_lazy() -> None:
    sel = select_entries(0, 10**12, 3, 2, 1, 100, random.Random(0))
    # two of every three; the last cycle is cut after its first two, both stored
    assert sel.count() == 2 * ((10**12 + 1) // 3) + 2
    it = iter(sel)
    assert [next(it) for _ in range(5)] == [0, 1, 3, 4, 6]


# --- fragments and the probe rule --------------------------------------------------------


def test_fragments_of_a_closed_ledger() -> None:
    md = closed([(0, B[:3]), (10, B[1:4]), (25, B[2:5])], w=2, last=30)
    assert [(f.segment, f.first, f.last, f.bookies) for f in fragments(md)] == [
        (0, 0, 9, tuple(B[:3])),
        (1, 10, 24, tuple(B[1:4])),
        (2, 25, 30, tuple(B[2:5])),
    ]
    assert single_entry_probe(md) is None


def test_closed_ledger_segments_are_clipped_at_the_last_entry() -> None:
    md = closed([(0, B[:3]), (10, B[1:4])], w=2, last=5)
    assert [(f.first, f.last) for f in fragments(md)] == [(0, 5), (10, 5)]
    assert fragments(md)[1].empty


def test_empty_closed_ledger_has_one_empty_fragment_and_no_probe() -> None:
    md = closed([(0, B[:3])], w=3, last=-1)
    [f] = fragments(md)
    assert (f.first, f.last, f.empty) == (0, -1, True)
    assert single_entry_probe(md) is None


def test_open_ledger_ends_at_the_lac_raised_to_the_segment_start() -> None:
    md = opened([(0, B[:3]), (10, B[1:4])], w=2)
    assert [(f.first, f.last) for f in fragments(md, 17)] == [(0, 9), (10, 17)]
    assert single_entry_probe(md, 17) is None
    # LAC below the last segment: raised to its start, and the probe rule applies
    assert [(f.first, f.last) for f in fragments(md, 4)] == [(0, 9), (10, 10)]
    assert single_entry_probe(md, 4) == Probe(10, ((1, B[2]), (2, B[3])))
    # unknown LAC behaves as -1
    assert single_entry_probe(md, None) == Probe(10, ((1, B[2]), (2, B[3])))


def test_single_entry_last_segment_of_a_closed_ledger_is_probed_on_its_write_set() -> None:
    md = closed([(0, B[:3]), (5, B[3:6])], w=2, last=5)
    assert single_entry_probe(md) == Probe(5, ((2, B[5]), (0, B[3])))


def test_entry_may_exist_unless_every_reply_proves_absence() -> None:
    absent = [ErrorStatus(Status.ENOENTRY), ErrorStatus(Status.ENOLEDGER)]
    assert not entry_may_exist(absent)
    assert entry_may_exist([*absent, ErrorStatus(Status.EIO)])
    assert entry_may_exist([*absent, NoAnswer(Unanswered.TIMEOUT)])
    assert entry_may_exist([*absent, None])  # not asked: unavailable
    assert entry_may_exist([Ok(EntryRead(7, 0, b"", None))])


def test_planning_without_the_probe_answer_is_refused() -> None:
    md = closed([(0, B[:3])], w=3, last=0)
    with pytest.raises(ValueError, match="probed"):
        plan_ledger(md, None, B, 0, random.Random(0))
    skipped = plan_ledger(md, None, B, 0, random.Random(0), last_entry_may_exist=False)
    assert skipped.last_fragment_skipped and skipped.checks == () and skipped.fragments == ()
    checked = plan_ledger(md, None, B, 0, random.Random(0), last_entry_may_exist=True)
    assert [list(c.entries or ()) for c in checked.checks] == [[0], [0], [0]]


# --- plans ---------------------------------------------------------------------------------


def test_plan_verdicts() -> None:
    # E=3 W=1, entries 0 and 1: bookie 2 stores nothing in the fragment.
    md = closed([(0, B[:3])], w=1, last=1)
    plan = plan_ledger(md, None, B[:3], 0, random.Random(0))
    assert [(c.index, c.verdict, c.first_stored, c.last_stored) for c in plan.checks] == [
        (0, Verdict.READ, 0, 0),
        (1, Verdict.READ, 1, 1),
        (2, Verdict.NOTHING_STORED, None, None),
    ]
    # the same bookie unavailable: bad without reads (BOOKKEEPER-742)
    plan = plan_ledger(md, None, B[:2], 0, random.Random(0))
    assert plan.checks[2].verdict is Verdict.UNAVAILABLE and plan.checks[2].entries is None
    [bad] = evaluate(plan, {})
    assert bad.bad == (BadBookie(2, B[2], True),)


def test_empty_fragment_flags_only_unavailable_bookies() -> None:
    md = closed([(0, B[:3])], w=3, last=-1)
    assert evaluate(plan_ledger(md, None, B, 0, random.Random(0)), {}) == []
    plan = plan_ledger(md, None, [B[0], B[2]], 0, random.Random(0))
    [bad] = evaluate(plan, {})
    assert [b.bookie for b in bad.bad] == [B[1]]


metadata = st.integers(1, 5).flatmap(
    lambda e: st.tuples(
        st.just(e),
        st.integers(1, e),
        st.lists(st.integers(1, 30), min_size=0, max_size=3),
        st.sampled_from([LedgerState.CLOSED, LedgerState.OPEN, LedgerState.IN_RECOVERY]),
        st.integers(-1, 120),
    )
)


@settings(max_examples=300)
@given(metadata, st.sets(st.integers(0, 7)), st.integers(0, 100), st.integers(0, 2**32))
def test_plan_reads_only_stored_entries_inside_fragments_up_to_the_lac(
    shape: tuple[int, int, list[int], LedgerState, int],
    up: set[int],
    pct: int,
    seed: int,
) -> None:
    e, w, gaps, state, end = shape
    starts = [0]
    for g in gaps:
        starts.append(starts[-1] + g)
    segs = [(s, B[k % 8 : k % 8 + e] + B[: max(0, k % 8 + e - 8)]) for k, s in enumerate(starts)]
    md = make_metadata(
        9,
        segs,
        write_quorum=w,
        ack_quorum=1,
        state=state,
        last_entry_id=end if state is LedgerState.CLOSED else -1,
    )
    lac = None if state is LedgerState.CLOSED else end
    available = frozenset(B[i] for i in up)
    probe = single_entry_probe(md, lac)
    for answer in [None] if probe is None else [True, False]:
        plan = plan_ledger(
            md, lac, available, pct, random.Random(seed), last_entry_may_exist=answer
        )
        limit = md.last_entry_id if state is LedgerState.CLOSED else max(end, starts[-1])
        for c in plan.checks:
            f = c.fragment
            assert f.last <= limit or f.segment < len(starts) - 1
            if c.bookie not in available:
                assert c.verdict is Verdict.UNAVAILABLE
                continue
            want = stored(f.first, f.last, e, w, c.index)
            if not want:
                assert c.verdict is Verdict.NOTHING_STORED
                continue
            assert c.verdict is Verdict.READ and c.entries is not None
            got = list(c.entries)
            assert set(got) <= set(want)
            assert got[0] == want[0] and got[-1] == want[-1]
            if pct == 0:
                assert got == sorted({want[0], want[-1]})
            if pct == 100:
                assert got == want
        if answer is False:
            assert plan.last_fragment_skipped
            assert all(c.fragment.segment < len(starts) - 1 for c in plan.checks)


# --- LAC ----------------------------------------------------------------------------------


def body(ledger: int, entry: int, lac: int, digest: DigestType = DigestType.CRC32C) -> bytes:
    return encode_entry_body(ledger, entry, lac, 16 * (entry + 1), b"x" * 16, digest)


def test_lac_is_the_largest_vouched_for() -> None:
    md = opened([(0, B[:3])], w=3)
    lac_blob = (7).to_bytes(8, "big") + (12).to_bytes(8, "big") + b"\0" * 4
    answers: list[Outcome[LacRead]] = [
        Ok(LacRead(7, None, body(7, 9, 8))),
        Ok(LacRead(7, lac_blob, body(7, 10, 9))),
        NoAnswer(Unanswered.TIMEOUT),
    ]
    assert lac_from_answers(md, answers).lac == 12
    got = lac_from_answers(md, answers[:1])
    assert (got.lac, got.answered, got.asked) == (8, 1, 1)
    # a last entry whose digest does not verify, or of another ledger, is ignored
    bad = bytearray(body(7, 20, 19))
    bad[-1] ^= 1
    assert lac_from_answers(md, [Ok(LacRead(7, None, bytes(bad)))]).lac == -1
    assert lac_from_answers(md, [Ok(LacRead(7, None, body(8, 20, 19)))]).lac == -1
    # ENOENTRY is an answer without an LAC; silence is no answer
    assert lac_from_answers(md, [ErrorStatus(Status.ENOENTRY)]).lac == -1
    none = lac_from_answers(md, [NoAnswer(Unanswered.TIMEOUT), ErrorStatus(Status.EIO)])
    assert (none.lac, none.answered, none.asked) == (None, 0, 2)


# --- reads and evaluation --------------------------------------------------------------------


def test_classify_read() -> None:
    md = closed([(0, B[:3])], w=3, last=5)
    assert classify_read(md, 3, Ok(EntryRead(7, 3, body(7, 3, 2), 2))) is None
    assert classify_read(md, 3, ErrorStatus(Status.ENOENTRY)) == "ENOENTRY"
    assert classify_read(md, 3, NoAnswer(Unanswered.TIMEOUT, "x")) == "timeout"
    corrupt = bytearray(body(7, 3, 2))
    corrupt[40] ^= 0xFF
    assert classify_read(md, 3, Ok(EntryRead(7, 3, bytes(corrupt), 2))) == "digest mismatch"
    assert classify_read(md, 3, Ok(EntryRead(7, 3, body(7, 4, 3), 3))) == (
        "body is ledger 7 entry 4"
    )
    assert (classify_read(md, 3, Ok(EntryRead(7, 3, b"short", 3))) or "").startswith("undecodable")
    # no digest type in the metadata (format v1): only the header is checked
    v1 = replace(md, digest_type=None, password=None)
    assert classify_read(v1, 3, Ok(EntryRead(7, 3, bytes(corrupt), 2))) is None


def test_evaluate_and_detail() -> None:
    md = closed([(0, B[:3]), (10, [B[0], B[1], B[3]])], w=2, last=19)
    plan = plan_ledger(md, None, [B[0], B[1], B[2]], 0, random.Random(0))
    k = next(i for i, c in enumerate(plan.checks) if c.fragment.segment == 0 and c.index == 1)
    bad = evaluate(plan, {k: [ReadFailure(9, "ENOENTRY")]})
    assert [(b.fragment.segment, [x.bookie for x in b.bad]) for b in bad] == [
        (0, [B[1]]),
        (1, [B[3]]),
    ]
    assert bad_bookie_ids(bad) == [B[1], B[3]]
    detail = violation_detail(md, 4, plan, bad, reads=11)
    assert detail == {
        "metadata_version": 4,
        "state": "CLOSED",
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 1,
        "last_entry_id": 19,
        "bad_bookies": [B[1], B[3]],
        "entries_read": 11,
        "fragments": [
            {
                "segment": 0,
                "first_entry": 0,
                "last_entry": 9,
                "ensemble": B[:3],
                "bad_bookies": [
                    {
                        "index": 1,
                        "bookie": B[1],
                        "first_stored": 0,
                        "last_stored": 9,
                        "reason": "read_failed",
                        "failed_entries": [[9, 9]],
                        "errors": {"ENOENTRY": 1},
                    }
                ],
            },
            {
                "segment": 1,
                "first_entry": 10,
                "last_entry": 19,
                "ensemble": [B[0], B[1], B[3]],
                "bad_bookies": [
                    {
                        "index": 2,
                        "bookie": B[3],
                        "first_stored": 10,
                        "last_stored": 19,
                        "reason": "unavailable",
                        "detail": "bookie is neither writable nor read-only",
                    }
                ],
            },
        ],
    }


def test_entry_ranges() -> None:
    assert entry_ranges([5, 1, 2, 3, 9, 10, 2]) == [[1, 3], [5, 5], [9, 10]]
    assert entry_ranges([]) == []


def test_metadata_problem() -> None:
    md = closed([(0, B[:3])], w=2, last=5)
    assert metadata_problem(md) is None
    assert "write quorum" in (metadata_problem(replace(md, write_quorum=4)) or "")
    assert "ack quorum" in (metadata_problem(replace(md, ack_quorum=0)) or "")
    assert metadata_problem(replace(md, segments=())) == "no ensembles"
    two = (Segment(0, tuple(B[:3])), Segment(0, tuple(B[1:4])))
    assert "starts at entry 0" in (metadata_problem(replace(md, segments=two)) or "")
    short = (Segment(0, tuple(B[:2])),)
    assert "has 2 bookies" in (metadata_problem(replace(md, segments=short)) or "")


def test_fragment_and_selection_are_values() -> None:
    f = Fragment(0, 0, 9, tuple(B[:3]), 3, 3)
    assert f == Fragment(0, 0, 9, tuple(B[:3]), 3, 3) and not f.empty
    assert EntrySelection(0, 9, 3, 3, 0) == EntrySelection(0, 9, 3, 3, 0)


def test_leave_held_alone_drops_held_bookies_and_fragments_left_with_none() -> None:
    """The restart rule: a bookie whose lost-bookie delay runs is not a bad bookie yet."""
    f0 = Fragment(0, 0, 4, tuple(B[:3]), 3, 3)
    f1 = Fragment(1, 5, 9, (B[0], B[3], B[2]), 3, 3)
    only_held = BadFragment(f0, (BadBookie(1, B[1], True),))
    mixed = BadFragment(f1, (BadBookie(1, B[3], True), BadBookie(2, B[2], False)))
    assert leave_held_alone([only_held, mixed], frozenset({B[1], B[3]})) == [
        BadFragment(f1, (BadBookie(2, B[2], False),))
    ]
    assert leave_held_alone([only_held, mixed], frozenset()) == [only_held, mixed]
