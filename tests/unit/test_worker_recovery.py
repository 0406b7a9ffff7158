"""Open-ledger recovery's pure rules: the LAC's quorum coverage, the tail's stop rule, the close.

The rules decide what a recovery closes a ledger at, so each is pinned with exact
cases: which fence answers establish a LAC (spec §2.2), when an entry past it is
found, missing or unknown (§2.4), and what the closing metadata holds (§2.7).
"""

from __future__ import annotations

import pytest

from auditor.bookie.protocol import decode_request, read_entry_request
from auditor.metadata.model import LedgerMetadata, LedgerState, Segment
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.worker.plan import LOST, MISSING_ENTRIES, REQUESTED, Repair
from auditor.worker.recovery import (
    RecoveryError,
    TailVerdict,
    close_recovered,
    lost_tail,
    recovery_lac,
    tail_verdict,
)

# --- recovery_lac: the quorum-coverage rule --------------------------------------------------


@pytest.mark.parametrize(
    ("e", "w", "a", "answers", "lac"),
    [
        # E3/W2/A2: one silent member leaves at most one unheard per window: covered.
        (3, 2, 2, [None, 7, 5], 7),
        (3, 2, 2, [4, None, 9], 9),
        # ... two adjacent silent members fill a window (positions 0, 1): not covered.
        (3, 2, 2, [None, None, 5], None),
        # E3/W2/A2 positions 2 and 0 form the window (2, 0): not covered.
        (3, 2, 2, [None, 5, None], None),
        # Every member says "nothing here": covered, the LAC is -1.
        (3, 2, 2, [-1, -1, -1], -1),
        # "Nothing here" is a valid answer and counts as heard.
        (3, 2, 2, [None, -1, 3], 3),
        # E3/W3/A2: one silent member is fine, two are not.
        (3, 3, 2, [None, 2, 2], 2),
        (3, 3, 2, [None, None, 2], None),
        # A1: any silent member may alone have acknowledged an entry.
        (3, 2, 1, [None, 8, 8], None),
        (3, 3, 1, [8, 8, 8], 8),
        # E5/W3/A2: silent 0 and 2 share the window (0, 1, 2); 0 and 3 share (3, 4, 0).
        (5, 3, 2, [None, 1, None, 1, 1], None),
        (5, 3, 2, [None, 1, 1, None, 1], None),
        (5, 3, 2, [None, 1, 1, 1, 1], 1),
        # E5/W2/A2: silent 0 and 2 are never in one window: covered.
        (5, 2, 2, [None, 4, None, 6, 2], 6),
        # Nobody heard: never a LAC, whatever the quorums.
        (3, 3, 3, [None, None, None], None),
        # E3/W3/A3: two silent members of three are fewer than AQ in the one window.
        (3, 3, 3, [None, None, 0], 0),
    ],
)
def test_recovery_lac_is_the_largest_answer_once_every_write_quorum_is_covered(
    e: int, w: int, a: int, answers: list[int | None], lac: int | None
) -> None:
    assert recovery_lac(e, w, a, answers) == lac


def test_recovery_lac_refuses_answers_that_do_not_match_the_ensemble() -> None:
    with pytest.raises(ValueError, match="2 answers for E3/W2/A2"):
        recovery_lac(3, 2, 2, [1, 2])
    with pytest.raises(ValueError):
        recovery_lac(3, 2, 3, [1, 2, 3])  # AQ above WQ


# --- tail_verdict: the stop rule past the LAC --------------------------------------------------


@pytest.mark.parametrize(
    ("w", "a", "found", "absent", "verdict"),
    [
        (2, 2, True, 1, TailVerdict.FOUND),  # one copy is enough to be part of the ledger
        (2, 2, False, 1, TailVerdict.MISSING),  # W2/A2: one "no" and it was never acked
        (2, 2, False, 0, TailVerdict.UNKNOWN),  # both silent
        (3, 2, False, 1, TailVerdict.UNKNOWN),  # W3/A2: the other two may have acked it
        (3, 2, False, 2, TailVerdict.MISSING),
        (3, 3, False, 1, TailVerdict.MISSING),
        (3, 1, False, 2, TailVerdict.UNKNOWN),  # W3/A1: only all three "no" prove it
        (3, 1, False, 3, TailVerdict.MISSING),
        (3, 1, True, 2, TailVerdict.FOUND),
    ],
)
def test_tail_verdict(w: int, a: int, found: bool, absent: int, verdict: TailVerdict) -> None:
    assert tail_verdict(w, a, found=found, absent=absent) is verdict


# --- lost_tail: a recovery that can never succeed -----------------------------------------------


def _open(e: int, w: int, a: int) -> LedgerMetadata:
    bookies = tuple(f"b{i}:3181" for i in range(e))
    return LedgerMetadata(
        ledger_id=7,
        format_version=3,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        state=LedgerState.OPEN,
        segments=(Segment(0, tuple(f"old{i}:3181" for i in range(e))), Segment(20, bookies)),
    )


def _tail(md: LedgerMetadata, bad: dict[int, str]) -> list[Repair]:
    last = md.segments[-1]
    return [Repair(1, 20, -1, i, last.bookies[i], (), (), why) for i, why in bad.items()]


@pytest.mark.parametrize(
    ("e", "w", "a", "bad", "window"),
    [
        # E1/W1/A1: the one bookie lost.
        (1, 1, 1, {0: LOST}, [0]),
        # E3/W2/A2: one lost member leaves each write quorum a live one: recoverable.
        (3, 2, 2, {0: LOST}, None),
        # ... two adjacent lost members are a whole write quorum.
        (3, 2, 2, {0: LOST, 1: LOST}, [0, 1]),
        # E3/W3/A2: two lost of the one write quorum are an ack quorum.
        (3, 3, 2, {1: LOST, 2: LOST}, [0, 1, 2]),
        # E3/W2/A1: any lost member alone may have acknowledged an entry.
        (3, 2, 1, {2: LOST}, [1, 2]),
        # E5/W2/A2: lost 0 and 2 are never in one write quorum: recoverable.
        (5, 2, 2, {0: LOST, 2: LOST}, None),
        # Registered members (silent, or to be moved) may answer: never a reason.
        (3, 2, 2, {0: LOST, 1: MISSING_ENTRIES}, None),
        (1, 1, 1, {0: REQUESTED}, None),
    ],
)
def test_lost_tail_names_the_write_quorum_lost_bookies_leave_uncovered(
    e: int, w: int, a: int, bad: dict[int, str], window: list[int] | None
) -> None:
    md = _open(e, w, a)
    why = lost_tail(md, _tail(md, bad))
    if window is None:
        assert why is None
        return
    gone = [f"b{i}:3181" for i in window if bad.get(i) == LOST]
    assert why == (
        f"open ledger: its last segment (from entry 20) has lost {', '.join(gone)}: "
        f"{len(gone)} of the {w} bookies of the write quorum at positions {window}, where "
        f"{a} acknowledge an entry (E{e}/W{w}/A{a}), so no fencing read can learn where "
        "the ledger ends until one comes back; kept marked for an operator"
    )


# --- close_recovered: the closing metadata -----------------------------------------------------


def _metadata(state: LedgerState, segments: tuple[Segment, ...]) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=7,
        format_version=3,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        state=state,
        segments=segments,
    )


SEGS = (Segment(0, ("a", "b", "c")), Segment(10, ("a", "b", "d")))


def test_close_recovered_closes_a_ledger_in_recovery_with_its_last_entry_and_length() -> None:
    md = _metadata(LedgerState.IN_RECOVERY, SEGS)
    closed = close_recovered(11, 192)(md)
    assert closed is not None
    assert (closed.state, closed.last_entry_id, closed.length, closed.segments) == (
        LedgerState.CLOSED,
        11,
        192,
        SEGS,
    )


def test_close_recovered_adds_the_recovery_ensemble_after_the_last_segment() -> None:
    md = _metadata(LedgerState.IN_RECOVERY, SEGS)
    closed = close_recovered(13, 224, 12, ("e", "b", "d"))(md)
    assert closed is not None
    assert closed.segments == (*SEGS, Segment(12, ("e", "b", "d")))
    assert (closed.state, closed.last_entry_id, closed.length) == (LedgerState.CLOSED, 13, 224)


def test_close_recovered_replaces_the_last_segment_when_the_ensemble_starts_there() -> None:
    md = _metadata(LedgerState.IN_RECOVERY, SEGS)
    closed = close_recovered(10, 176, 10, ("e", "b", "d"))(md)
    assert closed is not None
    assert closed.segments == (SEGS[0], Segment(10, ("e", "b", "d")))


def test_close_recovered_refuses_a_segment_added_during_recovery() -> None:
    md = _metadata(LedgerState.IN_RECOVERY, SEGS)
    with pytest.raises(RecoveryError, match="a segment starts at 10"):
        close_recovered(9, 160, 9, ("e", "b", "c"))(md)


@pytest.mark.parametrize("state", [LedgerState.OPEN, LedgerState.CLOSED])
def test_close_recovered_writes_nothing_unless_the_ledger_is_in_recovery(
    state: LedgerState,
) -> None:
    md = _metadata(state, SEGS)
    assert close_recovered(11, 192)(md) is None
    assert close_recovered(11, 192, 10, ("e", "b", "d"))(md) is None


# --- the fencing read on the wire --------------------------------------------------------------


def test_a_fencing_read_carries_fence_ledger_and_the_master_key() -> None:
    # WIRE §1.8: "Fence read, txnId=5, ledger 5, entry 0, masterKey=00..13" as Java writes
    # it (flag first); field order does not matter to a decoder, so compare the messages.
    java = bytes.fromhex("0a06 0803 1001 1805 a206 1d a00601 0805 1000 1a14") + bytes(range(20))
    ours = read_entry_request(5, 5, 0, fence_key=bytes(range(20)))
    assert decode_request(java) == ours
    assert len(ours.SerializeToString()) == 0x28
    assert ours.readRequest.flag == pb.ReadRequest.FENCE_LEDGER


def test_recovery_reads_carry_javas_high_priority_and_the_fencing_read_none() -> None:
    # PendingReadOp: FLAG_HIGH_PRIORITY | FLAG_DO_FENCING (header priority 100);
    # ReadLastConfirmedOp: FLAG_DO_FENCING alone.
    recovery = read_entry_request(6, 5, 10, fence_key=bytes(20), high_priority=True)
    assert (recovery.header.priority, recovery.readRequest.flag) == (
        100,
        pb.ReadRequest.FENCE_LEDGER,
    )
    fencing = read_entry_request(7, 5, -1, fence_key=bytes(20))
    assert not fencing.header.HasField("priority")


def test_a_plain_read_never_fences() -> None:
    plain = read_entry_request(1, 5, 0)
    assert not plain.readRequest.HasField("flag")
    assert not plain.readRequest.HasField("masterKey")
