"""The pure pieces of the worker's re-verification: one copy's judgement (shared with the
deep scrub), how a READ_ENTRY answer becomes a copy, the repair a bad segment gets, and
which reason a segment with several kinds of bad copies is replaced for.

E=3, W=2: entry e on positions (e mod 3) and (e + 1 mod 3).
"""

from __future__ import annotations

from auditor.bookie.availability import Availability
from auditor.bookie.protocol import Status, encode_entry_body
from auditor.bookie.results import EntryRead, ErrorStatus, NoAnswer, Ok, Unanswered
from auditor.checks.findings import Category
from auditor.checks.scrub import ABSENT, Body, CopyFinding, Failed, Silent, as_copy, judge_copy
from auditor.metadata.model import DigestType
from auditor.testing.cluster import make_metadata
from auditor.worker.plan import CORRUPT_COPY, MISSING_ENTRIES, UNREADABLE_COPY, bad_copy_repair
from auditor.worker.reverify import BadSegment

B0, B1, B2, B3 = "b0:3181", "b1:3181", "b2:3181", "b3:3181"
L = 7
PW = b"pw"


def body(entry: int, payload: bytes = b"payload") -> bytes:
    return encode_entry_body(L, entry, entry - 1, 10, payload, DigestType.CRC32C, PW)


def test_judge_copy_each_kind() -> None:
    good = body(3)
    assert judge_copy(L, 3, B0, Body(good), DigestType.CRC32C, PW) == Body(b"payload")
    rotten = good[:-1] + bytes([good[-1] ^ 1])
    assert judge_copy(L, 3, B0, Body(rotten), DigestType.CRC32C, PW) == CopyFinding(
        L, 3, B0, Category.CORRUPT_COPY, f"CRC32C digest mismatch for ledger {L} entry 3"
    )
    # Another entry's body, digest sound: corrupt too.
    assert judge_copy(L, 4, B0, Body(good), DigestType.CRC32C, PW) == CopyFinding(
        L, 4, B0, Category.CORRUPT_COPY, f"body is of ledger {L} entry 3"
    )
    listed = Availability.from_entries([3])
    assert judge_copy(L, 3, B0, ABSENT, DigestType.CRC32C, PW, listed) == CopyFinding(
        L, 3, B0, Category.UNREADABLE_COPY, "listed by the bookie, but read as no such entry"
    )
    assert judge_copy(L, 4, B0, ABSENT, DigestType.CRC32C, PW, listed) is ABSENT
    assert judge_copy(L, 3, B0, ABSENT, DigestType.CRC32C, PW) is ABSENT
    assert judge_copy(L, 3, B0, Failed("EIO"), DigestType.CRC32C, PW) == CopyFinding(
        L, 3, B0, Category.UNREADABLE_COPY, "EIO"
    )
    assert judge_copy(L, 3, B0, Silent("timeout"), DigestType.CRC32C, PW) == Silent("timeout")


def test_as_copy_from_both_read_answers() -> None:
    data = body(1)
    assert as_copy(Ok(data)) == Body(data)
    assert as_copy(Ok(EntryRead(L, 1, data, None))) == Body(data)
    assert as_copy(ErrorStatus(Status.ENOENTRY)) is ABSENT
    assert as_copy(ErrorStatus(Status.ENOLEDGER)) is ABSENT
    assert isinstance(as_copy(ErrorStatus(Status.EIO)), Failed)
    # A throttle or no answer says nothing about the copy.
    assert isinstance(as_copy(ErrorStatus(Status.ETOOMANYREQUESTS)), Silent)
    assert isinstance(as_copy(NoAnswer(Unanswered.TIMEOUT)), Silent)


def test_bad_copy_repair_reads_the_others_first_and_the_bookie_last() -> None:
    md = make_metadata(L, [(0, [B0, B1, B2]), (6, [B0, B1, B3])], write_quorum=2, last_entry_id=11)
    r = bad_copy_repair(md, 1, 0, CORRUPT_COPY, frozenset({B0, B1, B2, B3}))
    assert (r.segment_index, r.first_entry, r.last_entry, r.bookie_index, r.old) == (
        1,
        6,
        11,
        0,
        B0,
    )
    # Position 0 of [6, 11] holds 6 (0, 1), 8 (2, 0), 9 (0, 1), 11 (2, 0).
    assert r.entries == ((6, 6), (8, 9), (11, 11))
    assert (r.sources, r.why) == ((B1, B3, B0), CORRUPT_COPY)
    # A member not registered is never a source.
    assert bad_copy_repair(md, 1, 0, CORRUPT_COPY, frozenset({B0, B3})).sources == (B3, B0)


def test_a_segment_is_replaced_for_its_worst_kind_of_bad_copy() -> None:
    seg = BadSegment(0, 1)
    seg.add(4, MISSING_ENTRIES, "gone")
    assert seg.why == MISSING_ENTRIES
    seg.add(7, UNREADABLE_COPY, "EIO")
    assert seg.why == UNREADABLE_COPY
    seg.add(9, CORRUPT_COPY, "digest")
    assert seg.why == CORRUPT_COPY
    assert seg.counts == {MISSING_ENTRIES: 1, UNREADABLE_COPY: 1, CORRUPT_COPY: 1}
    assert seg.evidence == {4: "gone", 7: "EIO", 9: "digest"}
