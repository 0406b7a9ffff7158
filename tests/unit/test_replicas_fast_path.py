"""The replicas check's fast path (a fully replicated ledger judged from its bookies' bytes)
against the full path (decode every availability, `analyse`): the same verdict, always.

`holds_every` may only say True for bytes that decode and lack nothing a duty needs;
`listed_in_full` and `judge_listings` must then give exactly `analyse`'s verdict, and
for the answers real bookies send (one group per run, a few dozen groups at most) the
fast path must also see every fully replicated ledger, or it buys nothing.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from auditor.bookie.availability import (
    EMPTY,
    Availability,
    AvailabilityFormatError,
    holds_every,
)
from auditor.checks.replicas import (
    Listed,
    Verified,
    analyse,
    expectations,
    in_full_verdict,
    judge_listings,
    listed_in_full,
    listing_duties,
)
from auditor.checks.replicas_run import batch_shape
from auditor.metadata.model import LedgerMetadata, LedgerState, Segment

POOL = tuple(f"b{k}:3181" for k in range(7))


@st.composite
def ledgers(draw: st.DrawFn) -> LedgerMetadata:
    """A closed ledger of 1 to 3 segments (some possibly empty), 0 to 60 entries."""
    e = draw(st.integers(1, 5))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    last = draw(st.integers(-1, 60))
    cuts = sorted(draw(st.lists(st.integers(0, max(last, 0) + 1), max_size=2)))
    firsts = [0, *cuts]
    segments = tuple(Segment(first, tuple(draw(st.permutations(POOL))[:e])) for first in firsts)
    return LedgerMetadata(
        ledger_id=7,
        format_version=3,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        state=LedgerState.CLOSED,
        segments=segments,
        last_entry_id=last,
    )


def share(md: LedgerMetadata, bookie: str) -> set[int]:
    """Every entry `bookie` must hold."""
    out: set[int] = set()
    for exp in expectations(md):
        if exp.bookie == bookie:
            seg, e, w = exp.segment, md.ensemble_size, md.write_quorum
            out.update(x for x in range(seg.first, seg.last + 1) if (exp.index - x) % e < w)
    return out


@st.composite
def answer(draw: st.DrawFn, md: LedgerMetadata, bookie: str) -> bytes:
    """What `bookie` might send: its exact share, more, less, nothing, or a periodic form."""
    mine = share(md, bookie)
    kind = draw(st.sampled_from(["exact", "exact", "more", "less", "empty", "random", "periodic"]))
    top = max(md.last_entry_id, 0) + 4
    if kind == "exact":
        held = mine
    elif kind == "more":
        held = mine | set(draw(st.lists(st.integers(0, top), max_size=10)))
    elif kind == "less":
        held = mine - set(draw(st.lists(st.sampled_from(sorted(mine)), min_size=1)) if mine else ())
    elif kind == "empty":
        return EMPTY.encode()
    elif kind == "random":
        held = set(draw(st.lists(st.integers(0, top), max_size=40)))
    else:
        # runs of `size` every `period`, from `first`: a form real bookies never send
        period = draw(st.integers(2, 6))
        size = draw(st.integers(1, period - 1))
        first = draw(st.integers(0, 5))
        runs = draw(st.integers(1, 12))
        return Availability.from_groups(
            [(first, first + (runs - 1) * period, size, period)]
        ).encode()
    return Availability.from_entries(sorted(held)).encode()


@st.composite
def answered_ledgers(draw: st.DrawFn) -> tuple[LedgerMetadata, dict[str, bytes]]:
    md = draw(ledgers())
    return md, {b: draw(answer(md, b)) for b in listing_duties(md)}


def full_path(md: LedgerMetadata, listings: dict[str, bytes]) -> object:
    return analyse(md, {b: Listed(Availability.decode(d)) for b, d in listings.items()})


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answered_ledgers())
def test_the_fast_path_and_the_full_path_agree(
    case: tuple[LedgerMetadata, dict[str, bytes]],
) -> None:
    md, listings = case
    full = full_path(md, listings)
    assert judge_listings(md, listings) == full
    duties = listing_duties(md)
    fast = listed_in_full(md, duties, listings)
    clean = full == in_full_verdict(md, duties)
    if fast:
        assert clean
    decoded = [Availability.decode(d) for d in listings.values()]
    simple = all(a.group_count <= 32 and not any(g.period for g in a.groups) for a in decoded)
    if clean and simple:
        # the answers real bookies send: a fully replicated ledger is seen from the bytes
        assert fast


@settings(max_examples=300, deadline=None)
@given(ledgers())
def test_the_duties_are_the_expectations(md: LedgerMetadata) -> None:
    duties = listing_duties(md)
    flat = [(b, d) for b, mine in duties.items() for d in mine]
    want = [(x.bookie, (x.segment.first, x.segment.last, x.index)) for x in expectations(md)]
    assert sorted(flat) == sorted(want)
    assert list(duties) == list(dict.fromkeys(b for b, _ in want))


@settings(max_examples=300, deadline=None)
@given(answered_ledgers(), st.data())
def test_an_unanswered_or_missing_bookie_is_never_judged_in_full(
    case: tuple[LedgerMetadata, dict[str, bytes]], data: st.DataObject
) -> None:
    md, listings = case
    duties = listing_duties(md)
    assume(duties)
    gone = data.draw(st.sampled_from(sorted(duties)))
    del listings[gone]
    assert not listed_in_full(md, duties, listings)


@settings(max_examples=400, deadline=None)
@given(answered_ledgers(), st.data())
def test_damaged_bytes_are_never_taken_as_a_full_share(
    case: tuple[LedgerMetadata, dict[str, bytes]], data: st.DataObject
) -> None:
    md, listings = case
    duties = listing_duties(md)
    assume(duties)
    bookie = data.draw(st.sampled_from(sorted(duties)))
    good = bytearray(listings[bookie])
    at = data.draw(st.integers(0, len(good) - 1))
    how = data.draw(st.sampled_from(["flip", "cut"]))
    if how == "flip":
        good[at] ^= data.draw(st.integers(1, 255))
    else:
        del good[at:]
    bad = bytes(good)
    e, w = md.ensemble_size, md.write_quorum
    if holds_every(bad, e, w, duties[bookie]):
        # only ever for bytes that decode and hold every entry of the duties
        decoded = Availability.decode(bad)
        for first, last, index in duties[bookie]:
            assert not decoded.missing(first, last, e, w, index)


def test_a_fully_replicated_ledger_from_its_bytes() -> None:
    md = LedgerMetadata(
        ledger_id=9,
        format_version=3,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        state=LedgerState.CLOSED,
        segments=(Segment(0, POOL[:3]),),
        last_entry_id=9,
    )
    listings = {b: Availability.from_entries(sorted(share(md, b))).encode() for b in POOL[:3]}
    verdict = judge_listings(md, listings)
    assert verdict.category is None and verdict.min_copies == 2
    assert verdict.verified == dict.fromkeys(POOL[:3], Verified.LISTED)
    assert verdict == full_path(md, listings)
    # one entry gone from one bookie: judged by the full path, with its evidence
    fewer = dict(listings, **{POOL[0]: Availability.from_entries([0, 2, 3, 5, 6, 8]).encode()})
    assert not listed_in_full(md, listing_duties(md), fewer)
    assert judge_listings(md, fewer) == full_path(md, fewer)
    assert judge_listings(md, fewer).min_copies == 1


def test_bytes_that_do_not_decode_raise_as_the_decoder_does() -> None:
    md = LedgerMetadata(
        ledger_id=9,
        format_version=3,
        ensemble_size=2,
        write_quorum=2,
        ack_quorum=2,
        state=LedgerState.CLOSED,
        segments=(Segment(0, POOL[:2]),),
        last_entry_id=3,
    )
    whole = Availability.from_entries(range(4)).encode()
    overlapping = struct.pack(">ii56x", 0, 2) + struct.pack(">qqiiqqii", 0, 0, 4, 0, 2, 2, 2, 0)
    assert not holds_every(overlapping, 2, 2, [(0, 3, 0)])
    with pytest.raises(AvailabilityFormatError):
        judge_listings(md, {POOL[0]: whole, POOL[1]: overlapping})


@pytest.mark.parametrize(
    ("concurrency", "shape"), [(1, (1, 1)), (2, (1, 2)), (3, (1, 2)), (100, (50, 2)), (0, (1, 1))]
)
def test_batches_never_hold_more_ledgers_than_the_concurrency(
    concurrency: int, shape: tuple[int, int]
) -> None:
    assert batch_shape(concurrency) == shape
    size, depth = shape
    assert size * depth <= max(concurrency, 1)
