"""The deep scrub's pure core: each copy's verdict, divergence, a ledger's violations, and
the byte budget.

Round robin, for reading the expected values: entry `e` goes to the bookies at indexes
`(e + k) mod E`, k < W. With E=3, W=2: entry 0 on b0, b1; entry 1 on b1, b2; entry 2 on
b2, b0; entry 3 on b0, b1 ...
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditor.bookie.availability import Availability
from auditor.bookie.protocol import encode_entry_body
from auditor.checks.findings import Category, Violation
from auditor.checks.scrub import (
    ABSENT,
    EVIDENCE_LIMIT,
    Body,
    Copy,
    CopyFinding,
    EntryVerdict,
    Failed,
    LedgerScrub,
    Silent,
    entry_write_sets,
    judge_entry,
    scrub_ledger,
)
from auditor.checks.scrub_pace import ByteBudget
from auditor.metadata.model import DigestType, LedgerMetadata
from auditor.testing.cluster import make_metadata

B0, B1, B2 = "b0:3181", "b1:3181", "b2:3181"
L = 42
DIGESTS = [DigestType.CRC32, DigestType.CRC32C, DigestType.HMAC]
PASSWORD = b"secret"


def body(
    entry: int,
    payload: bytes = b"",
    digest: DigestType = DigestType.CRC32C,
    *,
    ledger: int = L,
    lac: int | None = None,
    password: bytes = PASSWORD,
) -> bytes:
    data = payload or f"payload of {entry}".encode()
    last = entry - 1 if lac is None else lac
    return encode_entry_body(ledger, entry, last, 100 + entry, data, digest, password)


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def cats(v: EntryVerdict) -> list[tuple[str, str]]:
    return [(f.bookie, str(f.category)) for f in v.findings]


# --- one entry -------------------------------------------------------------------------


@pytest.mark.parametrize("digest", DIGESTS)
def test_sound_copies_pass_and_count_their_payload(digest: DigestType) -> None:
    copies: dict[str, Copy] = {b: Body(body(3, b"abcd", digest)) for b in (B0, B1)}
    v = judge_entry(L, 3, copies, digest, PASSWORD)
    assert v == EntryVerdict(3, (), (B0, B1), 8, (), {})


@pytest.mark.parametrize("digest", DIGESTS)
def test_a_flipped_byte_is_a_corrupt_copy_whatever_byte(digest: DigestType) -> None:
    good = body(3, b"abcd", digest)
    for at in range(len(good)):
        copies: dict[str, Copy] = {B0: Body(good), B1: Body(flip(good, at))}
        v = judge_entry(L, 3, copies, digest, PASSWORD)
        assert cats(v) == [(B1, "corrupt_copy")], at
        assert v.verified == (B0,)


def test_corrupt_copy_reasons_are_exact() -> None:
    good = body(3, b"abcd", DigestType.CRC32C)
    v = judge_entry(
        L,
        3,
        {B0: Body(flip(good, len(good) - 1)), B1: Body(good[:20]), B2: Body(body(4))},
        DigestType.CRC32C,
        PASSWORD,
    )
    assert v.findings == (
        CopyFinding(
            L, 3, B0, Category.CORRUPT_COPY, "CRC32C digest mismatch for ledger 42 entry 3"
        ),
        CopyFinding(
            L,
            3,
            B1,
            Category.CORRUPT_COPY,
            "entry body of 20 bytes is shorter than the 32-byte header",
        ),
        CopyFinding(L, 3, B2, Category.CORRUPT_COPY, "body is of ledger 42 entry 4"),
    )


def test_hmac_with_the_wrong_password_is_corrupt() -> None:
    data = body(0, b"x", DigestType.HMAC, password=b"other")
    v = judge_entry(L, 0, {B0: Body(data)}, DigestType.HMAC, PASSWORD)
    assert cats(v) == [(B0, "corrupt_copy")]


def test_copies_that_differ_only_in_lac_are_not_divergent() -> None:
    """Recovery re-adds entries with its own LAC: valid copies differ in the header."""
    copies: dict[str, Copy] = {B0: Body(body(5, lac=4)), B1: Body(body(5, lac=2))}
    assert judge_entry(L, 5, copies, DigestType.CRC32C, PASSWORD).findings == ()


def test_divergent_copies_name_the_minority() -> None:
    copies: dict[str, Copy] = {
        B0: Body(body(1, b"one")),
        B1: Body(body(1, b"one")),
        B2: Body(body(1, b"two")),
    }
    v = judge_entry(L, 1, copies, DigestType.CRC32C, PASSWORD)
    assert v.findings == (
        CopyFinding(
            L,
            1,
            B2,
            Category.DIVERGENT_COPIES,
            f"payloads differ (2 versions: {B0}, {B1}: 3 bytes; {B2}: 3 bytes)",
        ),
    )
    assert v.verified == (B0, B1, B2)


def test_divergent_copies_without_a_majority_name_every_copy() -> None:
    copies: dict[str, Copy] = {B0: Body(body(1, b"one")), B1: Body(body(1, b"three"))}
    v = judge_entry(L, 1, copies, DigestType.CRC32C, PASSWORD)
    assert cats(v) == [(B0, "divergent_copies"), (B1, "divergent_copies")]


def test_dummy_compares_copies_byte_for_byte_and_checks_the_header() -> None:
    d = DigestType.DUMMY
    good = body(2, b"same", d)
    rotten = body(2, b"samf", d)
    v = judge_entry(L, 2, {B0: Body(good), B1: Body(good), B2: Body(rotten)}, d)
    assert cats(v) == [(B2, "divergent_copies")]
    v = judge_entry(L, 2, {B0: Body(good), B1: Body(body(7, b"same", d))}, d)
    assert cats(v) == [(B1, "corrupt_copy")]
    assert judge_entry(L, 2, {B0: Body(good), B1: Body(good)}, d).findings == ()


def test_a_corrupt_copy_is_not_also_divergent() -> None:
    good = body(1, b"one")
    copies: dict[str, Copy] = {B0: Body(good), B1: Body(flip(good, 37))}
    assert cats(judge_entry(L, 1, copies, DigestType.CRC32C, PASSWORD)) == [(B1, "corrupt_copy")]


def test_unreadable_absent_failed_and_silent() -> None:
    listed = {B0: Availability.from_entries([3]), B1: Availability.from_entries([2])}
    copies: dict[str, Copy] = {
        B0: ABSENT,  # listed, not returned: unreadable
        B1: ABSENT,  # not listed: missing
        B2: Failed("EIO"),
        "b3:3181": Silent("timeout"),
        "b4:3181": ABSENT,  # could not list: missing
    }
    v = judge_entry(L, 3, copies, DigestType.CRC32C, PASSWORD, listed)
    assert v.findings == (
        CopyFinding(
            L, 3, B0, Category.UNREADABLE_COPY, "listed by the bookie, but read as no such entry"
        ),
        CopyFinding(L, 3, B2, Category.UNREADABLE_COPY, "EIO"),
    )
    assert v.absent == (B1, "b4:3181")
    assert v.silent == {"b3:3181": "timeout"}
    assert v.verified == ()


# --- a ledger --------------------------------------------------------------------------


def md3(digest: DigestType = DigestType.CRC32C, last: int = 5) -> LedgerMetadata:
    return make_metadata(
        L, [B0, B1, B2], write_quorum=2, last_entry_id=last, digest_type=digest, password=PASSWORD
    )


def test_write_sets_follow_round_robin_across_segments() -> None:
    md = make_metadata(
        L, [(0, [B0, B1, B2]), (3, [B2, B0, "b3:3181"])], write_quorum=2, last_entry_id=4
    )
    assert list(entry_write_sets(md)) == [
        (0, (B0, B1)),
        (1, (B1, B2)),
        (2, (B2, B0)),
        (3, (B2, B0)),
        (4, (B0, "b3:3181")),
    ]


def test_a_clean_ledger_has_no_violation() -> None:
    md = md3()
    copies = {e: {b: Body(body(e)) for b in bs} for e, bs in entry_write_sets(md)}
    s = scrub_ledger(md, copies, DigestType.CRC32C, PASSWORD)
    assert (s.entries, s.copies_verified, s.found, s.violations(md, 7)) == (6, 12, False, [])


def test_a_ledger_violation_per_category_and_bookie_with_exact_evidence() -> None:
    md = md3()
    copies: dict[int, dict[str, Copy]] = {
        e: {b: Body(body(e)) for b in bs} for e, bs in entry_write_sets(md)
    }
    copies[0][B0] = Body(flip(body(0), 40))
    copies[3][B0] = Body(flip(body(3), 40))
    copies[4][B1] = Failed("EIO")
    copies[5][B2] = Body(body(5, b"other"))
    s = scrub_ledger(md, copies, DigestType.CRC32C, PASSWORD)
    assert s.to_mark() == [B0, B1]
    mismatch = "CRC32C digest mismatch for ledger 42 entry {}"
    assert s.violations(md, 7) == [
        Violation(
            L,
            Category.CORRUPT_COPY,
            B0,
            {
                "entries": [[0, 0], [3, 3]],
                "count": 2,
                "reasons": {"0": mismatch.format(0), "3": mismatch.format(3)},
                "digest_type": "CRC32C",
                "metadata_version": 7,
            },
        ),
        Violation(
            L,
            Category.DIVERGENT_COPIES,
            B0,
            {
                "entries": [[5, 5]],
                "count": 1,
                "reasons": {"5": f"payloads differ (2 versions: {B0}: 12 bytes; {B2}: 5 bytes)"},
                "digest_type": "CRC32C",
                "metadata_version": 7,
            },
        ),
        Violation(
            L,
            Category.DIVERGENT_COPIES,
            B2,
            {
                "entries": [[5, 5]],
                "count": 1,
                "reasons": {"5": f"payloads differ (2 versions: {B0}: 12 bytes; {B2}: 5 bytes)"},
                "digest_type": "CRC32C",
                "metadata_version": 7,
            },
        ),
        Violation(
            L,
            Category.UNREADABLE_COPY,
            B1,
            {
                "entries": [[4, 4]],
                "count": 1,
                "reasons": {"4": "EIO"},
                "digest_type": "CRC32C",
                "metadata_version": 7,
            },
        ),
    ]


def test_a_bookie_left_out_is_silent_not_asked() -> None:
    md = md3(last=0)
    s = scrub_ledger(md, {0: {B0: Body(body(0))}}, DigestType.CRC32C, PASSWORD)
    assert (s.silent, s.copies_silent, s.found) == ({B1: "not asked"}, 1, False)


def test_evidence_keeps_the_smallest_entries_and_counts_them_all_in_any_order() -> None:
    s = LedgerScrub(L)
    entries = list(range(3 * EVIDENCE_LIMIT))
    for e in reversed(entries):
        s.add(EntryVerdict(e, (CopyFinding(L, e, B0, Category.CORRUPT_COPY, "x"),)))
    (v,) = s.violations(md3(), 1)
    assert v.detail["count"] == 3 * EVIDENCE_LIMIT
    assert v.detail["entries"] == [[0, EVIDENCE_LIMIT - 1]]
    assert len(v.detail["reasons"]) == EVIDENCE_LIMIT


# --- properties ------------------------------------------------------------------------

_copy_kind = st.sampled_from(
    ["good", "flipped", "other", "absent", "listed_absent", "eio", "silent"]
)


@settings(max_examples=300)
@given(
    digest=st.sampled_from(DIGESTS),
    kinds=st.lists(_copy_kind, min_size=1, max_size=5),
    at=st.integers(min_value=0, max_value=10_000),
)
def test_every_copy_gets_exactly_its_verdict(digest: DigestType, kinds: list[str], at: int) -> None:
    """Each copy lands in exactly one of verified / corrupt / unreadable / absent / silent,
    by its kind; divergence is named exactly when two sound payloads differ."""
    good = body(9, b"the payload", digest)
    other = body(9, b"another payload", digest)
    bookies = [f"b{i}:3181" for i in range(len(kinds))]
    copies: dict[str, Copy] = {}
    listed: dict[str, Availability] = {}
    for b, kind in zip(bookies, kinds, strict=True):
        if kind == "good":
            copies[b] = Body(good)
        elif kind == "flipped":
            copies[b] = Body(flip(good, at % len(good)))
        elif kind == "other":
            copies[b] = Body(other)
        elif kind in ("absent", "listed_absent"):
            copies[b] = ABSENT
            if kind == "listed_absent":
                listed[b] = Availability.from_entries([9])
        elif kind == "eio":
            copies[b] = Failed("EIO")
        else:
            copies[b] = Silent("timeout")
    v = judge_entry(L, 9, copies, digest, PASSWORD, listed)
    by_bookie = dict(zip(bookies, kinds, strict=True))
    corrupt = {f.bookie for f in v.findings if f.category is Category.CORRUPT_COPY}
    unreadable = {f.bookie for f in v.findings if f.category is Category.UNREADABLE_COPY}
    divergent = {f.bookie for f in v.findings if f.category is Category.DIVERGENT_COPIES}
    assert corrupt == {b for b, k in by_bookie.items() if k == "flipped"}
    assert unreadable == {b for b, k in by_bookie.items() if k in ("eio", "listed_absent")}
    assert set(v.verified) == {b for b, k in by_bookie.items() if k in ("good", "other")}
    assert set(v.absent) == {b for b, k in by_bookie.items() if k == "absent"}
    assert set(v.silent) == {b for b, k in by_bookie.items() if k == "silent"}
    n_good = sum(k == "good" for k in kinds)
    n_other = sum(k == "other" for k in kinds)
    if n_good and n_other:
        if n_good > n_other:
            assert divergent == {b for b, k in by_bookie.items() if k == "other"}
        elif n_other > n_good:
            assert divergent == {b for b, k in by_bookie.items() if k == "good"}
        else:
            assert divergent == set(v.verified)
    else:
        assert divergent == set()
    # The ledger-level fold marks exactly the corrupt and unreadable copies' bookies.
    s = LedgerScrub(L)
    s.add(v)
    assert s.to_mark() == sorted(corrupt | unreadable)


@settings(max_examples=200)
@given(
    rate=st.integers(min_value=1, max_value=10_000),
    reads=st.lists(
        st.tuples(st.integers(min_value=0, max_value=5_000), st.floats(0, 2)), max_size=60
    ),
)
def test_the_budget_never_lets_more_than_rate_times_time_plus_burst_and_one_read(
    rate: int, reads: list[tuple[int, float]]
) -> None:
    """A reader that waits `delay()` before each read (reads one at a time) has sent at
    most rate * elapsed + burst + its last read's bytes."""
    now = [0.0]
    budget = ByteBudget(rate, clock=lambda: now[0])
    sent = 0
    for size, pause in reads:
        now[0] += pause
        while (wait := budget.delay()) > 0:
            now[0] += wait
        assert sent <= rate * now[0] + budget.burst + 1e-6
        budget.spend(size)
        sent += size


def test_budget_delay_is_the_debt_over_the_rate() -> None:
    now = [0.0]
    budget = ByteBudget(100, clock=lambda: now[0])
    assert budget.delay() == 0.0
    budget.spend(350)  # 100 in the bucket: 250 in debt
    assert budget.delay() == 2.5
    now[0] = 1.0
    assert budget.delay() == 1.5
    now[0] = 10.0
    assert budget.delay() == 0.0
    unlimited = ByteBudget(0)
    unlimited.spend(10**12)
    assert unlimited.delay() == 0.0
    with pytest.raises(ValueError, match="rate must be >= 0"):
        ByteBudget(-1)
