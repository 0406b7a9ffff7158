"""AvailabilityOfEntriesOfLedger: upstream vectors, properties against brute force, fuzzing."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from itertools import islice
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from auditor.bookie.availability import (
    EMPTY,
    HEADER_SIZE,
    MAX_ENTRY_END,
    Availability,
    AvailabilityFormatError,
    SequenceGroup,
    copies_short,
    expected_count,
    fewest_copies,
    min_copies,
    replica_shortfall,
)
from auditor.errors import FormatError
from tests.vectors import load

VECTORS: dict[str, Any] = load("availability.json")

Group = tuple[int, int, int, int]


# -- helpers --------------------------------------------------------------------------


def wire(groups: Iterable[Group], *, version: int = 0, count: int | None = None) -> bytes:
    """The §2.1 layout, built independently of the code under test."""
    groups = list(groups)
    header = struct.pack(">ii", version, len(groups) if count is None else count) + bytes(56)
    return header + b"".join(struct.pack(">qqii", *g) for g in groups)


def stores(e: int, ensemble: int, quorum: int, bookie: int) -> bool:
    """Round robin, straight from the write set definition: [(e + k) mod E for k < W]."""
    return bookie in [(e + k) % ensemble for k in range(quorum)]


def to_ranges(entries: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for e in sorted(entries):
        if out and e == out[-1][1] + 1:
            out[-1] = (out[-1][0], e)
        else:
            out.append((e, e))
    return out


def group_entries(groups: Iterable[Group]) -> set[int]:
    found: set[int] = set()
    for first, last, size, period in groups:
        starts = [first] if period == 0 else range(first, last + 1, period)
        for start in starts:
            found.update(range(start, start + size))
    return found


# -- upstream vectors -----------------------------------------------------------------


@pytest.mark.parametrize("case", VECTORS["encode"], ids=lambda c: str(c["entries"])[:40])
def test_encode_vectors(case: dict[str, Any]) -> None:
    entries: list[int] = case["entries"]
    groups = [tuple(g) for g in case["groups"]]
    availability = Availability.from_entries(entries)
    assert [tuple(g) for g in availability.groups] == groups
    assert availability.total == case["total"] == len(set(entries))
    assert all(availability.contains(e) for e in entries)
    encoded = availability.encode()
    assert encoded == wire(groups)
    assert len(encoded) == HEADER_SIZE + 24 * len(groups)
    decoded = Availability.decode(encoded)
    assert decoded == availability
    assert decoded.total == case["total"]
    assert all(e in decoded for e in entries)
    assert list(decoded.entries()) == sorted(set(entries))


@pytest.mark.parametrize("case", VECTORS["not_available"], ids=lambda c: str(c["entries"])[:40])
def test_not_available_vectors(case: dict[str, Any]) -> None:
    availability = Availability.decode(Availability.from_entries(case["entries"]).encode())
    for entry in case["absent"]:
        assert not availability.contains(entry)
        assert entry not in availability


@pytest.mark.parametrize(
    "case", VECTORS["unavailable_of_expected"], ids=lambda c: str(c["expected"])[:40]
)
def test_unavailable_vectors(case: dict[str, Any]) -> None:
    availability = Availability.from_entries(case["available"])
    result = availability.missing_in((e, e) for e in case["expected"])
    assert list(result.entries()) == case["missing"]
    assert result.count == len(case["missing"])
    assert bool(result) == bool(case["missing"])


def test_upstream_bug_row_gets_the_correct_answer() -> None:
    # Java's getUnavailableEntries reports [3..11]; 10 and 11 are available.
    availability = Availability.from_entries([0, 1, 2, 10, 11])
    assert availability.missing_in([(0, 11)]).ranges() == [(3, 9)]
    bug_rows = [r for r in VECTORS["unavailable_of_expected"] if "note" in r]
    assert bug_rows and bug_rows[0]["missing"] == [3, 4, 5, 6, 7, 8, 9]


def test_upstream_bug_striping_example() -> None:
    # §2.3: E=5, W=2, bookie 0 holds [0,4,5,9,10,...]; Java reports 4,5,9,10,... missing.
    held = [e for e in range(31) if stores(e, 5, 2, 0)]
    assert held[:5] == [0, 4, 5, 9, 10]
    availability = Availability.from_entries(held)
    assert availability.missing(0, 30, 5, 2, 0).count == 0
    assert availability.missing_in((e, e) for e in held).ranges() == []
    for ensemble, quorum in [(4, 2), (5, 3), (6, 2), (3, 2)]:
        for bookie in range(ensemble):
            mine = Availability.from_entries(
                e for e in range(200) if stores(e, ensemble, quorum, bookie)
            )
            assert mine.missing_count(0, 199, ensemble, quorum, bookie) == 0


@pytest.mark.parametrize("case", VECTORS["decode_only"], ids=lambda c: str(c["groups"]))
def test_decode_only_vectors(case: dict[str, Any]) -> None:
    groups = [tuple(g) for g in case["groups"]]
    availability = Availability.decode(wire(groups))
    assert list(availability.entries()) == case["entries"]
    assert availability.total == len(case["entries"])
    assert [tuple(g) for g in availability.groups] == groups
    assert availability.encode() == wire(groups)
    for e in range(-1, 12):
        assert availability.contains(e) == (e in case["entries"])


@pytest.mark.parametrize("case", VECTORS["serialized_hex"], ids=lambda c: str(c["entries"]))
def test_serialized_hex_vectors(case: dict[str, Any]) -> None:
    data = bytes.fromhex(case["hex"])
    assert Availability.from_entries(case["entries"]).encode() == data
    assert list(Availability.decode(data).entries()) == case["entries"]


def test_spec_serialized_examples() -> None:
    # Spec §2.4, transcribed from the prose rather than the json.
    assert Availability.from_entries([]).encode() == bytes(64)
    assert EMPTY.encode() == bytes(64)
    expected_012 = bytes.fromhex(
        "0000000000000001" + "00" * 56 + "000000000000000000000000000000000000000300000000"
    )
    assert len(expected_012) == 88
    assert Availability.from_entries([0, 1, 2]).encode() == expected_012
    body = "".join(f"{e:016x}{e:016x}0000000200000000" for e in (1, 4, 7))
    expected_6 = bytes.fromhex("0000000000000003" + "00" * 56 + body)
    assert len(expected_6) == 136
    assert Availability.from_entries([1, 2, 4, 5, 7, 8]).encode() == expected_6


def test_empty() -> None:
    assert EMPTY.total == 0
    assert not EMPTY.contains(100)
    assert EMPTY.group_count == 0
    assert Availability.decode(bytes(64)) == EMPTY
    assert EMPTY.missing_in([(100, 105)]).ranges() == [(100, 105)]
    assert EMPTY.missing_in([]).count == 0


def test_trailing_bytes_are_ignored() -> None:
    data = Availability.from_entries([1, 2, 3]).encode()
    assert Availability.decode(data + b"\xff" * 30) == Availability.decode(data)
    assert Availability.decode(bytearray(data)) == Availability.decode(memoryview(data))


def test_round_robin_vectors() -> None:
    # Spec §8.
    assert [expected_count(3, 5, 3, 3, i) for i in range(3)] == [3, 3, 3]
    assert expected_count(0, 0, 3, 2, 2) == 0
    assert expected_count(3, 3, 3, 2, 2) == 0
    assert expected_count(4, 4, 3, 2, 2) == 1
    for i in range(5):
        assert expected_count(100, 122, 5, 3, i) == sum(stores(e, 5, 3, i) for e in range(100, 123))
        missing = EMPTY.missing(100, 122, 5, 3, i)
        assert list(missing.entries()) == [e for e in range(100, 123) if stores(e, 5, 3, i)]


# -- constructors ---------------------------------------------------------------------


def test_from_entries_sorts_and_accepts_ranges() -> None:
    assert Availability.from_entries([8, 1, 2, 2, 5, 7, 4]) == Availability.from_entries(
        [1, 2, 4, 5, 7, 8]
    )
    assert Availability.from_entries(range(3, 10)) == Availability.from_entries(list(range(3, 10)))
    assert Availability.from_entries(iter([3, 1, 2])).groups == (SequenceGroup(1, 1, 3, 0),)
    with pytest.raises(ValueError):
        Availability.from_entries([-1, 0])
    with pytest.raises(ValueError):
        Availability.from_entries([MAX_ENTRY_END])


def test_from_runs() -> None:
    assert Availability.from_runs([(5, 4), (1, 3), (3, 1), (20, 0)]) == Availability.from_entries(
        [1, 2, 3, 5, 6, 7, 8]
    )
    with pytest.raises(ValueError):
        Availability.from_runs([(-1, 3)])
    with pytest.raises(ValueError):
        Availability.from_runs([(0, -3)])
    # longer than an int32 group size: split into touching groups, still one run
    huge = Availability.from_runs([(10, 2**32 + 5)])
    assert huge.group_count == 3
    assert huge.total == 2**32 + 5
    assert list(huge.iter_runs()) == [(10, 2**32 + 5)]
    assert Availability.decode(huge.encode()) == huge


def test_group_helpers() -> None:
    group = SequenceGroup(1, 7, 2, 3)
    assert (group.run_count, group.num_entries, group.end) == (3, 6, 9)
    assert SequenceGroup(4, 4, 2, 0).num_entries == 2
    availability = Availability([(0, 0, 2, 0), (2, 2, 1, 0), (10, 20, 1, 5)])
    assert list(availability.iter_runs()) == [(0, 3), (10, 1), (15, 1), (20, 1)]
    assert "total=6" in repr(availability)
    assert hash(availability) == hash(Availability.decode(availability.encode()))
    assert availability != EMPTY
    with pytest.raises(AttributeError):
        availability._total = 3
    with pytest.raises(AttributeError):
        del availability._total


def test_argument_validation() -> None:
    availability = Availability.from_entries([1, 2])
    with pytest.raises(ValueError):
        availability.missing(0, 5, 0, 1, 0)
    with pytest.raises(ValueError):
        availability.missing(0, 5, 3, 4, 0)
    with pytest.raises(ValueError):
        availability.missing(0, 5, 3, 0, 0)
    with pytest.raises(ValueError):
        availability.missing(0, 5, 3, 2, 3)
    with pytest.raises(ValueError):
        availability.missing(-1, 5, 3, 2, 0)
    with pytest.raises(ValueError):
        availability.missing_in([(-2, 4)])
    assert availability.missing(6, 5, 3, 2, 0).count == 0  # empty segment
    assert availability.missing_in([(4, 3)]).ranges() == []


# -- malformed input ------------------------------------------------------------------

MALFORMED: list[tuple[str, bytes]] = [
    ("empty", b""),
    ("short header", bytes(63)),
    ("version 1", wire([], version=1)),
    ("negative version", wire([], version=-1)),
    ("negative count", wire([], count=-1)),
    ("huge count", wire([], count=2**31 - 1)),
    ("truncated group", wire([(1, 1, 2, 0)])[:-1]),
    ("count beyond groups", wire([(1, 1, 2, 0)], count=2)),
    ("negative first", wire([(-1, -1, 2, 0)])),
    ("last before first", wire([(5, 4, 1, 1)])),
    ("zero size", wire([(1, 1, 0, 0)])),
    ("negative size", wire([(1, 1, -3, 0)])),
    ("negative period", wire([(1, 5, 1, -4)])),
    ("period 0 with last != first", wire([(1, 7, 2, 0)])),
    ("size >= period", wire([(1, 7, 3, 3)])),
    ("size >= period, single run", wire([(1, 1, 3, 2)])),
    ("uneven period", wire([(1, 8, 2, 3)])),
    ("end overflows a long", wire([(MAX_ENTRY_END - 1, MAX_ENTRY_END - 1, 2, 0)])),
    ("unsorted", wire([(10, 10, 1, 0), (1, 1, 1, 0)])),
    ("overlapping", wire([(1, 1, 5, 0), (3, 3, 5, 0)])),
    ("overlapping periodic spans", wire([(0, 6, 1, 3), (1, 1, 1, 0)])),
    ("duplicate group", wire([(1, 1, 1, 0), (1, 1, 1, 0)])),
]


@pytest.mark.parametrize(("name", "data"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_is_rejected(name: str, data: bytes) -> None:
    with pytest.raises(AvailabilityFormatError):
        Availability.decode(data)


def test_error_type_hierarchy() -> None:
    assert issubclass(AvailabilityFormatError, FormatError)
    with pytest.raises(FormatError, match="unsupported header version 1"):
        Availability.decode(wire([], version=1))
    with pytest.raises(AvailabilityFormatError, match="group 1"):
        Availability.decode(wire([(1, 1, 5, 0), (3, 3, 5, 0)]))
    with pytest.raises(AvailabilityFormatError):
        Availability([(0, 0, 2**31, 0)])  # size does not fit an int32


def test_touching_groups_are_accepted() -> None:
    availability = Availability.decode(wire([(0, 0, 2, 0), (2, 2, 3, 0), (5, 11, 1, 3)]))
    assert list(availability.entries()) == [0, 1, 2, 3, 4, 5, 8, 11]
    assert availability.missing_in([(0, 12)]).ranges() == [(6, 7), (9, 10), (12, 12)]


# -- properties against brute force ---------------------------------------------------

entry_sets = st.sets(st.integers(0, 300), max_size=120)


@st.composite
def periodic_groups(draw: st.DrawFn) -> list[Group]:
    groups: list[Group] = []
    position = draw(st.integers(0, 30))
    for _ in range(draw(st.integers(0, 6))):
        position += draw(st.integers(0, 8))  # 0: touching the previous group
        size = draw(st.integers(1, 6))
        runs = draw(st.integers(1, 8))
        single = runs == 1 and draw(st.booleans())
        period = 0 if single else draw(st.integers(size + 1, size + 9))
        last = position + (runs - 1) * period
        groups.append((position, last, size, period))
        position = last + size
    return groups


@st.composite
def availabilities(draw: st.DrawFn) -> tuple[Availability, set[int]]:
    if draw(st.booleans()):
        entries = draw(entry_sets)
        return Availability.from_entries(entries), entries
    groups = draw(periodic_groups())
    return Availability.decode(wire(groups)), group_entries(groups)


@st.composite
def placements(draw: st.DrawFn) -> tuple[int, int, int]:
    ensemble = draw(st.integers(1, 8))
    quorum = draw(st.integers(1, ensemble))
    return ensemble, quorum, draw(st.integers(0, ensemble - 1))


@given(entry_sets, st.randoms(use_true_random=False))
def test_round_trip(entries: set[int], rnd: Any) -> None:
    shuffled = list(entries) * 2
    rnd.shuffle(shuffled)
    availability = Availability.from_entries(shuffled)
    assert availability == Availability.from_entries(sorted(entries))
    data = availability.encode()
    decoded = Availability.decode(data)
    assert decoded == availability
    assert decoded.encode() == data
    assert list(decoded.entries()) == sorted(entries)
    assert decoded.total == len(entries)
    # the upstream encoder: one group per maximal run, never merged
    runs = to_ranges(entries)
    assert [tuple(g) for g in decoded.groups] == [(s, s, e - s + 1, 0) for s, e in runs]
    assert Availability.from_runs([(s, e - s + 1) for s, e in runs]) == availability
    for e in range(-2, 305):
        assert decoded.contains(e) == (e in entries)


@given(periodic_groups())
def test_periodic_groups_round_trip(groups: list[Group]) -> None:
    data = wire(groups)
    availability = Availability.decode(data)
    expected = group_entries(groups)
    assert availability.encode() == data
    assert availability.total == len(expected)
    assert list(availability.entries()) == sorted(expected)
    assert [(s, s + n - 1) for s, n in availability.iter_runs()] == to_ranges(expected)
    top = max(expected, default=0) + 3
    for e in range(top):
        assert availability.contains(e) == (e in expected)


@settings(max_examples=300)
@given(availabilities(), placements(), st.integers(0, 320), st.integers(-3, 330))
def test_missing_matches_brute_force(
    avail: tuple[Availability, set[int]], placement: tuple[int, int, int], first: int, span: int
) -> None:
    availability, entries = avail
    ensemble, quorum, bookie = placement
    last = first + span
    brute = [
        e for e in range(first, last + 1) if (bookie - e) % ensemble < quorum and e not in entries
    ]
    result = availability.missing(first, last, ensemble, quorum, bookie)
    assert result.count == len(brute)
    assert availability.missing_count(first, last, ensemble, quorum, bookie) == len(brute)
    # maximal, sorted, non-adjacent ranges
    assert result.ranges() == to_ranges(brute)
    assert result.first() == (brute[0] if brute else None)
    assert expected_count(first, last, ensemble, quorum, bookie) == sum(
        stores(e, ensemble, quorum, bookie) for e in range(first, last + 1)
    )


@given(
    availabilities(),
    st.lists(st.tuples(st.integers(0, 330), st.integers(-2, 40)), max_size=6),
)
def test_missing_in_matches_brute_force(
    avail: tuple[Availability, set[int]], spans: list[tuple[int, int]]
) -> None:
    availability, entries = avail
    ranges = [(start, start + length) for start, length in spans]
    wanted = {e for start, end in ranges for e in range(start, end + 1)}
    brute = sorted(wanted - entries)
    result = availability.missing_in(ranges)
    assert result.count == len(brute)
    assert result.ranges() == to_ranges(brute)


@settings(max_examples=150)
@given(st.data(), placements(), st.integers(0, 100), st.integers(-1, 150))
def test_replica_shortfall_matches_brute_force(
    data: st.DataObject, placement: tuple[int, int, int], first: int, span: int
) -> None:
    ensemble, quorum, _ = placement
    last = first + span
    bookies: list[Availability | None] = []
    held: list[set[int]] = []
    for _ in range(ensemble):
        entries = data.draw(st.sets(st.integers(0, 260), max_size=160))
        if data.draw(st.booleans()):
            bookies.append(None)
            held.append(set())
        else:
            bookies.append(Availability.from_entries(entries))
            held.append(entries)
    copies = [
        sum(e in held[(e + k) % ensemble] for k in range(quorum)) for e in range(first, last + 1)
    ]
    brute: list[tuple[int, int, int]] = []
    for offset, n in enumerate(copies):
        e = first + offset
        if n >= quorum:
            continue
        if brute and brute[-1][1] == e - 1 and brute[-1][2] == n:
            brute[-1] = (brute[-1][0], e, n)
        else:
            brute.append((e, e, n))
    assert list(replica_shortfall(first, last, ensemble, quorum, bookies)) == brute
    assert min_copies(first, last, ensemble, quorum, bookies) == min(copies, default=quorum)


def test_replica_shortfall_needs_whole_ensemble() -> None:
    with pytest.raises(ValueError):
        list(replica_shortfall(0, 10, 3, 2, [EMPTY]))


def test_copies_short_sweeps_what_each_holder_lacks() -> None:
    # W = 3; holder streams as a segment's duties give them (ascending, possibly touching).
    lacks = [[(2, 4), (9, 9)], [(4, 6)], [(5, 5), (6, 6)], []]
    assert list(copies_short(3, lacks)) == [(2, 3, 2), (4, 6, 1), (9, 9, 2)]
    assert list(copies_short(3, [])) == []


def test_copies_short_merges_equal_neighbours_only() -> None:
    assert list(copies_short(2, [[(0, 1), (2, 3)], [(4, 4)]])) == [(0, 4, 1)]
    assert list(copies_short(2, [[(0, 3)], [(2, 5)]])) == [(0, 1, 1), (2, 3, 0), (4, 5, 1)]


def test_fewest_copies_and_where_across_segments() -> None:
    # Two segments in turn: the lowest count is 1, reached at 4..5 (touching across the
    # boundary, so merged) and at 9.
    shortfall = [(1, 1, 2), (4, 4, 1), (5, 5, 1), (7, 7, 2), (9, 9, 1)]
    assert fewest_copies(shortfall, 3) == (1, [(4, 5), (9, 9)])
    assert fewest_copies([(3, 3, 0), (8, 8, 1)], 2) == (0, [(3, 3)])
    assert fewest_copies([], 3) == (3, [])


# -- fuzzing ---------------------------------------------------------------------------


def check_decode(data: bytes) -> None:
    """Decoding either fails with AvailabilityFormatError or gives a self-consistent value."""
    try:
        availability = Availability.decode(data)
    except AvailabilityFormatError:
        return
    n = availability.group_count
    assert availability.encode() == data[:8] + bytes(56) + data[64 : 64 + 24 * n]
    assert availability.total >= 0
    # A legal periodic group can stand for 2^40 runs: look at a bounded prefix only.
    runs = list(islice(availability.iter_runs(), 10_001))
    if len(runs) <= 10_000:
        assert sum(length for _, length in runs) == availability.total
    assert availability.missing_in([(0, 50)]).count >= 0


fuzz = settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=500)


@fuzz
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data: bytes) -> None:
    check_decode(data)


@fuzz
@given(st.integers(-3, 12), st.binary(max_size=24 * 10 + 7))
def test_fuzz_valid_header_random_groups(count: int, body: bytes) -> None:
    check_decode(struct.pack(">ii", 0, count) + bytes(56) + body)


@st.composite
def small_groups(draw: st.DrawFn) -> bytes:
    """Groups with small random fields (valid or not), so validation branches are reached."""
    field = st.integers(-3, 40)
    groups = draw(st.lists(st.tuples(field, field, field, field), max_size=6))
    return wire(groups)


@fuzz
@given(small_groups())
def test_fuzz_small_fields(data: bytes) -> None:
    check_decode(data)


@fuzz
@given(
    availabilities(),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(-30, 0),
)
def test_fuzz_mutated_encodings(
    avail: tuple[Availability, set[int]], flips: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(avail[0].encode())
    for position, value in flips:
        data[position % len(data)] = value
    check_decode(bytes(data))
    check_decode(bytes(data[: len(data) + cut]))


# -- scale (deterministic; timings live in bench/bench_codec.py) -----------------------


def test_ten_million_entries_in_one_group() -> None:
    availability = Availability.decode(Availability.from_runs([(0, 10_000_000)]).encode())
    assert availability.group_count == 1
    assert availability.total == 10_000_000
    for bookie in range(3):
        result = availability.missing(0, 9_999_999, 3, 2, bookie)
        assert result.count == 0
        assert result.ranges() == []
    # two entries past the end: 10_000_001 is bookie 0's ((0 - e) mod 3 == 1 < 2)
    assert availability.missing(0, 10_000_001, 3, 2, 0).ranges() == [(10_000_001, 10_000_001)]


def test_hundred_thousand_gaps() -> None:
    # every 100th entry of 0..9_999_999 is missing: 100k groups
    availability = Availability.from_runs([(k * 100 + 1, 99) for k in range(100_000)])
    data = availability.encode()
    assert len(data) == 64 + 24 * 100_000
    availability = Availability.decode(data)
    assert availability.total == 9_900_000
    for bookie in range(3):
        holes = [e for e in range(0, 10_000_000, 100) if (bookie - e) % 3 < 2]
        result = availability.missing(0, 9_999_999, 3, 2, bookie)
        assert result.count == len(holes)
        assert result.ranges() == [(e, e) for e in holes]
    every_hole = availability.missing_in([(0, 9_999_999)])
    assert every_hole.count == 100_000


def test_no_per_entry_work() -> None:
    # Sizes no per-entry loop could get through: the answers must come from arithmetic.
    trillion = Availability.from_runs([(0, 2**40)])
    assert trillion.group_count == 513  # split into int32-sized touching groups
    assert trillion.missing_count(0, 2**40 - 1, 3, 2, 1) == 0
    tail = trillion.missing(0, 2**40 + 4, 3, 2, 1)
    assert tail.count == expected_count(2**40, 2**40 + 4, 3, 2, 1)
    # one periodic group holding every even entry below 2**41
    evens = Availability([(0, 2**41, 1, 2)])
    assert evens.total == 2**40 + 1
    assert evens.missing(0, 2**41, 2, 1, 0).count == 0
    assert evens.missing(0, 2**41, 2, 1, 0).ranges() == []
    odds = evens.missing(0, 2**41, 2, 1, 1)
    assert odds.count == 2**40
    assert odds.ranges(limit=3) == [(1, 1), (3, 3), (5, 5)]
    assert evens.missing(2**40 + 1, 2**40 + 5, 4, 2, 1).ranges() == [
        (2**40 + 1, 2**40 + 1),
        (2**40 + 5, 2**40 + 5),
    ]


@pytest.mark.parametrize("groups", [0, 1, 5, 32, 33, 200])
def test_decode_small_and_large_paths_agree(groups: int) -> None:
    """Up to 32 groups decode with one struct call, beyond with arrays: same sets, same
    refusals."""
    # Every third entry missing: one group per run of two; some periodic groups too.
    runs = [(3 * k, 2) for k in range(groups)]
    plain = Availability.from_runs(runs)
    assert plain.group_count == groups
    assert Availability.decode(plain.encode()) == plain
    periodic = Availability.from_groups([(1000 * k, 1000 * k + 90, 2, 10) for k in range(groups)])
    assert Availability.decode(periodic.encode()) == periodic
    assert list(Availability.decode(periodic.encode()).iter_runs()) == list(periodic.iter_runs())
    if groups:
        # A group that ends after the next one starts is refused the same way on both.
        bad = bytearray(plain.encode())
        struct.pack_into(">q", bad, 64 + 24 * (groups - 1), -5)
        with pytest.raises(AvailabilityFormatError):
            Availability.decode(bytes(bad))
