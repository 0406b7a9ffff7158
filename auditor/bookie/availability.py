"""Whether a bookie holds every entry it should is read from its compact answer to a list
request, and BookKeeper's own reading of that answer calls entries missing that are there
and walks ledgers entry by entry; the auditor needs a strict decoder and range arithmetic.

Which entries of one ledger a bookie holds: BookKeeper's ``AvailabilityOfEntriesOfLedger``.

A bookie answers GET_LIST_OF_ENTRIES_OF_LEDGER with a compact description of the
entries it stores. The wire form is a 64-byte header (int32 version, int32 number of
groups N, 56 reserved bytes) followed by N 24-byte *sequence groups*, big-endian:
``(int64 first, int64 last, int32 size, int32 period)``. A group is a set of runs of
``size`` consecutive entries whose starts go from ``first`` to ``last`` in steps of
``period`` (``period == 0`` means a single run). The upstream encoder never merges
runs, so real bookies send one group per maximal run, but the format allows periodic
groups and this decoder supports them.

Why this module is not a transliteration of the Java class:

* **The upstream ``getUnavailableEntries`` is wrong.** It walks the expected entries
  one by one and, as soon as the walk is two or more entries past the end of a group,
  stops consulting later groups and reports every later expected entry as missing,
  even when a later group holds it. With striping such as E=5/W=2 a healthy bookie
  is reported as missing most of its entries. Here "missing" means exactly
  "expected and not available" (the same answer as the correct ``isEntryAvailable``),
  so the auditor deliberately disagrees with the Java replicas check on such inputs.
* **Ranges, not entries.** Ledgers can hold millions of entries and one group can
  stand for all of them. Every query here works on ranges: the gaps between (and
  inside) groups are intersected arithmetically with the periodic pattern of entries
  a bookie should hold (round robin: bookie ``i`` stores ``e`` iff
  ``(i - e) mod E < W``). Counting costs O(groups in the segment) with the per-group
  work done by C-level builtins; listing the missing entries costs
  O(groups + missing runs), and results come back as inclusive ``(start, end)``
  ranges. Nothing loops once per entry, so a 10M-entry ledger stored as one group is
  checked in microseconds.

Decoding is strict, because the bytes come from the network: anything malformed
raises :class:`AvailabilityFormatError` and no allocation depends on an unchecked
length field. Beyond what upstream requires (version <= 0, groups sorted by
``first``), this decoder also rejects: a version other than 0 (upstream accepts
negative ones), negative entries, ``size <= 0``, ``last < first``, negative periods,
``period == 0`` with ``last != first`` (a division by zero upstream),
``period > 0`` with ``size >= period`` or ``(last - first)`` not a multiple of
``period`` (upstream would count and test membership inconsistently), groups whose
spans overlap (upstream's floor-group lookup would give wrong answers), and groups
whose end ``last + size`` does not fit in a Java long. Groups that merely touch are
accepted. Trailing bytes after the groups are ignored, as upstream does.
"""

from __future__ import annotations

import heapq
import math
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from itertools import chain, compress, islice, repeat
from operator import add, gt, le, lt, mod, ne, or_, sub
from typing import Final, NamedTuple, NoReturn

from auditor.errors import FormatError

__all__ = [
    "CURRENT_HEADER_VERSION",
    "EMPTY",
    "GROUP_SIZE",
    "HEADER_SIZE",
    "MAX_ENTRY_END",
    "Availability",
    "AvailabilityFormatError",
    "MissingEntries",
    "SequenceGroup",
    "copies_short",
    "expected_count",
    "fewest_copies",
    "holds_every",
    "min_copies",
    "replica_shortfall",
]

HEADER_SIZE: Final = 64
GROUP_SIZE: Final = 24
CURRENT_HEADER_VERSION: Final = 0
#: Exclusive upper bound for entries: a group's end (``last + size``) must fit a Java long.
MAX_ENTRY_END: Final = 2**63 - 1
_INT32_MAX: Final = 2**31 - 1

_HEADER: Final = struct.Struct(">ii56x")
_SWAP: Final = sys.byteorder == "little"
#: The array typecode of a 4-byte signed integer on this platform.
_I32: Final = next(code for code in "ilh" if array(code).itemsize == 4)


#: Up to this many groups, `decode` unpacks with one cached struct per group count.
_SMALL: Final = 32


@lru_cache(maxsize=_SMALL + 1)
def _small_groups(count: int) -> struct.Struct:
    """`count` groups on the wire: (first int64, last int64, size int32, period int32)."""
    return struct.Struct(">" + "qqii" * count)


class AvailabilityFormatError(FormatError, ValueError):
    """Bytes or groups that are not a valid AvailabilityOfEntriesOfLedger."""


class SequenceGroup(NamedTuple):
    """One group as on the wire: runs of ``size`` entries starting at ``first``,
    ``first + period``, ..., ``last`` (a single run when ``period == 0``)."""

    first: int
    last: int
    size: int
    period: int

    @property
    def run_count(self) -> int:
        return 1 if self.period == 0 else (self.last - self.first) // self.period + 1

    @property
    def num_entries(self) -> int:
        return self.run_count * self.size

    @property
    def end(self) -> int:
        """One past the group's final entry."""
        return self.last + self.size


def _fail(message: str) -> NoReturn:
    raise AvailabilityFormatError(message)


class _Stripe:
    """The entries ``e`` with ``(e - offset) mod modulus < width``.

    Bookie ``i`` of an ensemble of E with write quorum W stores exactly
    ``_Stripe(E, W, i - W + 1)``; an explicit range is ``_Stripe(1, 1, 0)``.
    """

    __slots__ = ("_skip", "_tail", "full", "modulus", "offset", "width")

    def __init__(self, modulus: int, width: int, offset: int) -> None:
        self.modulus = modulus
        self.width = width
        self.offset = offset % modulus
        self.full = width >= modulus
        member = [(r - self.offset) % modulus < width for r in range(modulus)]
        tail = [0]
        for is_member in member:
            tail.append(tail[-1] + is_member)
        #: tail[r]: members in [0, r), for 0 <= r <= modulus
        self._tail = tail
        #: skip[r]: distance from a position of residue r to the next member
        self._skip = [0 if member[r] else (self.offset - r) % modulus for r in range(modulus)]

    def upto(self, n: int) -> int:
        """Members in ``[0, n)`` (a cumulative count, consistent for any ``n``)."""
        if self.full:
            return n
        q, r = divmod(n, self.modulus)
        return q * self.width + self._tail[r]

    def between(self, start: int, stop: int) -> int:
        """Members in ``[start, stop)``."""
        if stop <= start:
            return 0
        return self.upto(stop) - self.upto(start)

    def sum_upto(self, values: Sequence[int]) -> int:
        """``sum(self.upto(v) for v in values)`` without a Python-level loop."""
        if self.full:
            return sum(values)
        m = self.modulus
        residues: list[int] = list(map(mod, values, repeat(m)))
        # sum(v // m) == (sum(v) - sum(v % m)) / m exactly
        quotients = (sum(values) - sum(residues)) // m
        tails: int = sum(map(self._tail.__getitem__, residues))
        return self.width * quotients + tails

    def hits(self, starts: Sequence[int], stops: Sequence[int]) -> Iterator[bool]:
        """For each pair, whether ``[start, stop)`` holds a member (C-level, lazy)."""
        if self.full:
            return map(lt, starts, stops)
        gaps = map(sub, stops, starts)
        needed = map(self._skip.__getitem__, map(mod, starts, repeat(self.modulus)))
        return map(gt, gaps, needed)

    def runs(self, start: int, stop: int) -> Iterator[tuple[int, int]]:
        """The members of ``[start, stop)`` as maximal inclusive ranges."""
        if stop <= start:
            return
        if self.full:
            yield (start, stop - 1)
            return
        m, w = self.modulus, self.width
        # the first member run (offset + k*m, length w) that ends at or after start
        k = -((self.offset + w - 1 - start) // m)
        run = self.offset + k * m
        while run < stop:
            yield (max(run, start), min(run + w, stop) - 1)
            run += m

    def block_count(self, start: int, length: int, period: int, count: int) -> int:
        """Members in the ``count`` ranges ``[start + j*period, ... + length)``."""
        if count <= 0 or length <= 0:
            return 0
        if count == 1:
            return self.between(start, start + length)
        if self.full:
            return length * count
        cycle = self.modulus // math.gcd(period, self.modulus)
        total = 0
        for j in range(min(cycle, count)):
            lo = start + j * period
            found = self.between(lo, lo + length)
            if found:
                total += found * ((count - j + cycle - 1) // cycle)
        return total

    def block_runs(
        self, start: int, length: int, period: int, count: int
    ) -> Iterator[tuple[int, int]]:
        """Members of the same ranges, visiting only ranges that hold some."""
        if count <= 0 or length <= 0:
            return
        if count == 1:
            yield from self.runs(start, start + length)
            return
        if self.full:
            for j in range(count):
                lo = start + j * period
                yield (lo, lo + length - 1)
            return
        cycle = self.modulus // math.gcd(period, self.modulus)
        useful = [
            j
            for j in range(min(cycle, count))
            if self.between(start + j * period, start + j * period + length)
        ]
        if not useful:
            return
        for base in range(0, count, cycle):
            for j in useful:
                k = base + j
                if k >= count:
                    return
                lo = start + k * period
                yield from self.runs(lo, lo + length)


def _check_placement(ensemble_size: int, write_quorum: int, bookie_index: int) -> None:
    if ensemble_size < 1:
        raise ValueError(f"ensemble size must be >= 1, got {ensemble_size}")
    if not 1 <= write_quorum <= ensemble_size:
        raise ValueError(f"write quorum must be in [1, {ensemble_size}], got {write_quorum}")
    if not 0 <= bookie_index < ensemble_size:
        raise ValueError(f"bookie index must be in [0, {ensemble_size}), got {bookie_index}")


@lru_cache(maxsize=4096)
def _bookie_stripe(ensemble_size: int, write_quorum: int, bookie_index: int) -> _Stripe:
    # Cached: a replicas run asks for the same few (E, W, i) stripes once per bookie of
    # every ledger, and a stripe is never changed after it is built.
    _check_placement(ensemble_size, write_quorum, bookie_index)
    # e is stored iff (i - e) mod E < W  <=>  (e - (i - W + 1)) mod E < W
    return _Stripe(ensemble_size, write_quorum, bookie_index - write_quorum + 1)


def _check_segment(first: int, last: int) -> None:
    if first < 0:
        raise ValueError(f"segment must start at an entry >= 0, got {first}")


_WHOLE: Final = _Stripe(1, 1, 0)


def expected_count(
    first: int, last: int, ensemble_size: int, write_quorum: int, bookie_index: int
) -> int:
    """How many entries of ``[first, last]`` bookie ``bookie_index`` should store."""
    _check_segment(first, last)
    return _bookie_stripe(ensemble_size, write_quorum, bookie_index).between(first, last + 1)


class MissingEntries:
    """Entries that were expected but are not available, as a lazy range set.

    ``count`` is computed arithmetically; iterating yields maximal inclusive
    ``(start, end)`` ranges in ascending order (consecutive ranges are never adjacent).
    """

    __slots__ = ("_availability", "_count", "_queries")

    def __init__(
        self, availability: Availability, queries: Sequence[tuple[int, int, _Stripe]]
    ) -> None:
        self._availability = availability
        self._queries = tuple(queries)
        self._count: int | None = None

    @property
    def count(self) -> int:
        """Number of missing entries."""
        if self._count is None:
            self._count = sum(
                self._availability._count_missing(start, stop, stripe)
                for start, stop, stripe in self._queries
            )
        return self._count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        if self._count == 0:
            return
        for start, stop, stripe in self._queries:
            yield from self._availability._iter_missing(start, stop, stripe)

    def ranges(self, limit: int | None = None) -> list[tuple[int, int]]:
        """The missing ranges (at most ``limit`` of them) as a list."""
        return list(islice(self, limit))

    def entries(self) -> Iterator[int]:
        """Every missing entry, one by one (only for small results)."""
        for start, end in self:
            yield from range(start, end + 1)

    def first(self) -> int | None:
        """The lowest missing entry, or None."""
        for start, _ in self:
            return start
        return None

    def __repr__(self) -> str:
        return f"MissingEntries(count={self.count})"


class Availability:
    """An immutable set of entry ids, as groups sorted by ``first``."""

    __slots__ = ("_ends", "_firsts", "_lasts", "_periodic", "_periods", "_sizes", "_total")

    _firsts: list[int]
    _lasts: array[int]
    _sizes: array[int]
    _periods: array[int]
    _ends: list[int]
    _periodic: list[int]
    _total: int

    def __init__(self, groups: Iterable[tuple[int, int, int, int]] = ()) -> None:
        """Build from explicit ``(first, last, size, period)`` groups, validated as on decode."""
        columns: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])
        for group in groups:
            first, last, size, period = group
            columns[0].append(first)
            columns[1].append(last)
            columns[2].append(size)
            columns[3].append(period)
        try:
            firsts = array("q", columns[0])
            lasts = array("q", columns[1])
            sizes = array(_I32, columns[2])
            periods = array(_I32, columns[3])
        except OverflowError:
            _fail("a group field does not fit its wire type (int64 first/last, int32 size/period)")
        self._setup(firsts, lasts, sizes, periods)

    # -- construction -------------------------------------------------------------

    def _setup(
        self, firsts: array[int], lasts: array[int], sizes: array[int], periods: array[int]
    ) -> None:
        # firsts and ends are kept as lists: every query bisects and sums them, and
        # iterating a list does not allocate an int per element as an array does.
        n = len(firsts)
        first_list: list[int] = firsts.tolist()
        size_list: list[int] = sizes.tolist()
        end_list: list[int] = []
        periodic: list[int] = []
        total = 0
        if n:
            if any(periods):
                periodic = list(compress(range(n), periods))
            end_list = list(map(add, lasts.tolist() if periodic else first_list, size_list))
            # Once every group has size > 0 and last >= first (checked below) and ends no
            # later than the next one starts, firsts and ends both increase: so the
            # first first is the least entry and the last end the greatest.
            ok = (
                min(size_list) > 0
                and first_list[0] >= 0
                and end_list[-1] <= MAX_ENTRY_END
                and all(map(le, islice(end_list, n - 1), islice(first_list, 1, None)))
            )
            if not periodic:
                ok = ok and lasts == firsts
            elif ok:
                ok = all(map(or_, periods, map(int.__eq__, lasts, firsts))) and all(
                    periods[k] > sizes[k]
                    and lasts[k] >= firsts[k]
                    and (lasts[k] - firsts[k]) % periods[k] == 0
                    for k in periodic
                )
            if not ok:
                _explain(firsts, lasts, sizes, periods)
            total = sum(size_list) + sum(
                (lasts[k] - firsts[k]) // periods[k] * sizes[k] for k in periodic
            )
        set_ = object.__setattr__
        set_(self, "_firsts", first_list)
        set_(self, "_lasts", lasts)
        set_(self, "_sizes", sizes)
        set_(self, "_periods", periods)
        set_(self, "_ends", end_list)
        set_(self, "_periodic", periodic)
        set_(self, "_total", total)

    @classmethod
    def _from_columns(
        cls, firsts: array[int], lasts: array[int], sizes: array[int], periods: array[int]
    ) -> Availability:
        self = cls.__new__(cls)
        self._setup(firsts, lasts, sizes, periods)
        return self

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Availability:
        """Parse the wire form; raise :class:`AvailabilityFormatError` if malformed."""
        if not isinstance(data, bytes):
            data = bytes(data)
        length = len(data)
        if length < HEADER_SIZE:
            _fail(f"{length} bytes is shorter than the {HEADER_SIZE}-byte header")
        version, count = _HEADER.unpack_from(data, 0)
        if version != CURRENT_HEADER_VERSION:
            _fail(f"unsupported header version {version}")
        if count < 0:
            _fail(f"negative number of sequence groups {count}")
        room = (length - HEADER_SIZE) // GROUP_SIZE
        if count > room:
            _fail(f"header announces {count} sequence groups but only {room} fit in {length} bytes")
        if count <= _SMALL:
            # A closed ledger of a few hundred entries has a handful of groups: one
            # struct call is several times cheaper than the arrays below.
            fields = _small_groups(count).unpack_from(data, HEADER_SIZE)
            return cls._from_columns(
                array("q", fields[0::4]),
                array("q", fields[1::4]),
                array(_I32, fields[2::4]),
                array(_I32, fields[3::4]),
            )
        body = memoryview(data)[HEADER_SIZE : HEADER_SIZE + count * GROUP_SIZE]
        wide = array("q")
        wide.frombytes(body)
        narrow = array(_I32)
        narrow.frombytes(body)
        if _SWAP:
            wide.byteswap()
            narrow.byteswap()
        # per group: 3 int64 slots (first, last, size|period) = 6 int32 slots
        return cls._from_columns(wide[0::3], wide[1::3], narrow[4::6], narrow[5::6])

    @classmethod
    def from_groups(cls, groups: Iterable[tuple[int, int, int, int]]) -> Availability:
        """Explicit ``(first, last, size, period)`` groups; same checks as :meth:`decode`."""
        return cls(groups)

    @classmethod
    def from_entries(cls, entries: Iterable[int]) -> Availability:
        """The groups the upstream encoder builds: one group per maximal run.

        Duplicates are dropped and unsorted input is sorted first. Raises
        ValueError for entries outside ``[0, MAX_ENTRY_END)``.
        """
        if isinstance(entries, range) and entries.step == 1:
            return cls.from_runs([(entries.start, len(entries))])
        values = entries if isinstance(entries, list | tuple) else list(entries)
        if not all(map(lt, values, islice(values, 1, None))):
            values = sorted(set(values))
        n = len(values)
        if n == 0:
            return EMPTY
        if values[0] < 0 or values[-1] >= MAX_ENTRY_END:
            raise ValueError(
                f"entries must be in [0, {MAX_ENTRY_END}), got {values[0]}..{values[-1]}"
            )
        breaks = list(
            compress(range(1, n), map(ne, map(sub, islice(values, 1, None), values), repeat(1)))
        )
        firsts = [values[0], *(values[j] for j in breaks)]
        ends = [*(values[j - 1] + 1 for j in breaks), values[-1] + 1]
        return cls._from_sorted_runs(firsts, ends)

    @classmethod
    def from_runs(cls, runs: Iterable[tuple[int, int]]) -> Availability:
        """From ``(start, length)`` runs in any order, possibly overlapping or touching.

        The result equals :meth:`from_entries` of the same entries, without
        materialising them. A run longer than the int32 group size is split into
        touching groups (so memory grows with length / 2**31 for absurdly long runs).
        Empty runs are ignored; negative values raise ValueError.
        """
        items = sorted(runs)
        firsts: list[int] = []
        ends: list[int] = []
        for start, length in items:
            if start < 0 or length < 0:
                raise ValueError(f"runs need start >= 0 and length >= 0, got ({start}, {length})")
            if length == 0:
                continue
            end = start + length
            if end > MAX_ENTRY_END:
                raise ValueError(f"run ({start}, {length}) goes past {MAX_ENTRY_END}")
            if ends and start <= ends[-1]:
                ends[-1] = max(ends[-1], end)
            else:
                firsts.append(start)
                ends.append(end)
        return cls._from_sorted_runs(firsts, ends)

    @classmethod
    def _from_sorted_runs(cls, firsts: list[int], ends: list[int]) -> Availability:
        sizes = list(map(sub, ends, firsts))
        if sizes and max(sizes) > _INT32_MAX:
            split_firsts: list[int] = []
            split_sizes: list[int] = []
            for first, size in zip(firsts, sizes, strict=True):
                while size > _INT32_MAX:
                    split_firsts.append(first)
                    split_sizes.append(_INT32_MAX)
                    first += _INT32_MAX
                    size -= _INT32_MAX
                split_firsts.append(first)
                split_sizes.append(size)
            firsts, sizes = split_firsts, split_sizes
        column = array("q", firsts)
        return cls._from_columns(
            column, array("q", column), array(_I32, sizes), array(_I32, bytes(4 * len(sizes)))
        )

    # -- immutability, equality ---------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Availability is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Availability is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Availability):
            return NotImplemented
        return (
            self._firsts == other._firsts
            and self._lasts == other._lasts
            and self._sizes == other._sizes
            and self._periods == other._periods
        )

    def __hash__(self) -> int:
        return hash((self._lasts.tobytes(), self._sizes.tobytes(), self._periods.tobytes()))

    def __repr__(self) -> str:
        return f"Availability(total={self._total}, groups={len(self._firsts)})"

    # -- encoding -----------------------------------------------------------------

    def encode(self) -> bytes:
        """The wire form, byte-identical to the upstream serializer for the same groups."""
        n = len(self._firsts)
        header = _HEADER.pack(CURRENT_HEADER_VERSION, n)
        if n == 0:
            return header
        wide = array("q", bytes(GROUP_SIZE * n))
        wide[0::3] = array("q", self._firsts)
        wide[1::3] = self._lasts
        sizes = array(_I32, self._sizes)
        periods = array(_I32, self._periods)
        if _SWAP:
            wide.byteswap()
            sizes.byteswap()
            periods.byteswap()
        narrow = array(_I32, wide.tobytes())
        narrow[4::6] = sizes
        narrow[5::6] = periods
        return header + narrow.tobytes()

    # -- queries ------------------------------------------------------------------

    @property
    def total(self) -> int:
        """Number of available entries."""
        return self._total

    @property
    def group_count(self) -> int:
        return len(self._firsts)

    @property
    def groups(self) -> tuple[SequenceGroup, ...]:
        return tuple(map(SequenceGroup, self._firsts, self._lasts, self._sizes, self._periods))

    def contains(self, entry: int) -> bool:
        """Whether ``entry`` is available (bisect to the group with the greatest first <= entry)."""
        k = bisect_right(self._firsts, entry) - 1
        if k < 0 or entry >= self._ends[k]:
            return False
        period = self._periods[k]
        return period == 0 or (entry - self._firsts[k]) % period < self._sizes[k]

    def __contains__(self, entry: object) -> bool:
        return isinstance(entry, int) and self.contains(entry)

    def iter_runs(self) -> Iterator[tuple[int, int]]:
        """Maximal runs of available entries as ``(start, length)``, ascending."""
        pending_start = pending_end = -1
        for first, last, size, period in zip(
            self._firsts, self._lasts, self._sizes, self._periods, strict=True
        ):
            starts = range(first, first + 1) if period == 0 else range(first, last + 1, period)
            for start in starts:
                if start == pending_end:
                    pending_end = start + size
                    continue
                if pending_end >= 0:
                    yield (pending_start, pending_end - pending_start)
                pending_start, pending_end = start, start + size
        if pending_end >= 0:
            yield (pending_start, pending_end - pending_start)

    def entries(self) -> Iterator[int]:
        """Every available entry, ascending (one by one: only for small sets)."""
        for start, length in self.iter_runs():
            yield from range(start, start + length)

    def missing(
        self, first: int, last: int, ensemble_size: int, write_quorum: int, bookie_index: int
    ) -> MissingEntries:
        """Entries of ``[first, last]`` that bookie ``bookie_index`` should hold but lacks.

        Round robin: the bookie stores ``e`` iff ``(bookie_index - e) mod E < W``. An
        empty segment (``last < first``) has nothing missing.
        """
        _check_segment(first, last)
        stripe = _bookie_stripe(ensemble_size, write_quorum, bookie_index)
        return MissingEntries(self, [(first, last + 1, stripe)])

    def missing_count(
        self, first: int, last: int, ensemble_size: int, write_quorum: int, bookie_index: int
    ) -> int:
        """``missing(...).count``."""
        return self.missing(first, last, ensemble_size, write_quorum, bookie_index).count

    def missing_in(self, expected_ranges: Iterable[tuple[int, int]]) -> MissingEntries:
        """Entries of the given inclusive ``(start, end)`` ranges that are not available.

        Ranges may come in any order and may overlap; empty ones (end < start) are ignored.
        """
        merged: list[list[int]] = []
        for start, end in sorted(expected_ranges):
            if start < 0:
                raise ValueError(f"expected ranges need start >= 0, got ({start}, {end})")
            if end < start:
                continue
            if merged and start <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return MissingEntries(self, [(start, end + 1, _WHOLE) for start, end in merged])

    # -- the range arithmetic -----------------------------------------------------

    def _periodic_between(self, lo: int, hi: int) -> list[int]:
        periodic = self._periodic
        return periodic[bisect_left(periodic, lo) : bisect_left(periodic, hi)]

    def _gap_blocks(self, k: int, start: int, stop: int) -> list[tuple[int, int, int, int]]:
        """The gaps inside periodic group ``k`` clipped to ``[start, stop)``, as
        ``(first, length, period, count)`` blocks in ascending order."""
        first, size, period = self._firsts[k], self._sizes[k], self._periods[k]
        runs = (self._lasts[k] - first) // period + 1
        top = runs - 2  # gaps are numbered 0..top; gap j is [first + j*p + size, first + (j+1)*p)
        if top < 0:
            return []
        # whole gaps inside the window: j_lo..j_hi
        j_lo = max(0, -((first + size - start) // period))
        j_hi = min(top, (stop - first) // period - 1)
        blocks: list[tuple[int, int, int, int]] = []

        def partial(j: int) -> None:
            if 0 <= j <= top:
                lo = max(first + j * period + size, start)
                hi = min(first + (j + 1) * period, stop)
                if lo < hi:
                    blocks.append((lo, hi - lo, period, 1))

        partial(j_lo - 1)
        if j_lo <= j_hi:
            blocks.append((first + j_lo * period + size, period - size, period, j_hi - j_lo + 1))
        if j_hi + 1 != j_lo - 1:
            partial(j_hi + 1)
        return blocks

    def _count_missing(self, start: int, stop: int, stripe: _Stripe) -> int:
        """Members of ``stripe`` in ``[start, stop)`` that are not available."""
        if stop <= start:
            return 0
        firsts, ends = self._firsts, self._ends
        lo = bisect_right(firsts, start) - 1  # the group with the greatest first <= start
        hi = bisect_left(firsts, stop)  # groups 0..hi-1 start before stop
        total = 0
        if lo < 0:
            total += stripe.between(start, firsts[0] if hi > 0 else stop)
        g0 = max(lo, 0)
        if hi <= g0:
            return total
        # the gap after each group g0..hi-1, clipped (only the two outer ones need it)
        total += stripe.between(max(ends[g0], start), firsts[g0 + 1] if g0 + 1 < hi else stop)
        if hi - 1 > g0:
            total += stripe.between(ends[hi - 1], stop)
        if hi - g0 >= 3:
            total += stripe.sum_upto(firsts[g0 + 2 : hi]) - stripe.sum_upto(ends[g0 + 1 : hi - 1])
        for k in self._periodic_between(g0, hi):
            total += sum(stripe.block_count(*block) for block in self._gap_blocks(k, start, stop))
        return total

    def _iter_missing(self, start: int, stop: int, stripe: _Stripe) -> Iterator[tuple[int, int]]:
        """Members of ``stripe`` in ``[start, stop)`` that are not available, as ranges."""
        if stop <= start:
            return
        firsts, ends = self._firsts, self._ends
        lo = bisect_right(firsts, start) - 1
        hi = bisect_left(firsts, stop)
        if lo < 0:
            yield from stripe.runs(start, firsts[0] if hi > 0 else stop)
        g0 = max(lo, 0)
        if hi <= g0:
            return
        # groups whose following gap holds something, found without a Python loop per group
        middle: Iterable[int] = ()
        if hi - g0 >= 3:
            middle = compress(
                range(g0 + 1, hi - 1), stripe.hits(ends[g0 + 1 : hi - 1], firsts[g0 + 2 : hi])
            )
        candidates = chain((g0,), middle, (hi - 1,) if hi - 1 > g0 else ())
        periodic = self._periodic_between(g0, hi)
        p = 0
        for k in candidates:
            while p < len(periodic) and periodic[p] <= k:
                for block in self._gap_blocks(periodic[p], start, stop):
                    yield from stripe.block_runs(*block)
                p += 1
            yield from stripe.runs(max(ends[k], start), firsts[k + 1] if k + 1 < hi else stop)


def _explain(
    firsts: array[int], lasts: array[int], sizes: array[int], periods: array[int]
) -> NoReturn:
    """Find the first offending group and raise a precise error."""
    previous_end = -1
    for k, (first, last, size, period) in enumerate(
        zip(firsts, lasts, sizes, periods, strict=True)
    ):
        where = f"sequence group {k} ({first}, {last}, {size}, {period})"
        if first < 0:
            _fail(f"{where}: negative entry")
        if last < first:
            _fail(f"{where}: last run starts before the first")
        if size <= 0:
            _fail(f"{where}: run size must be positive")
        if period < 0:
            _fail(f"{where}: negative period")
        if period == 0 and last != first:
            _fail(f"{where}: period 0 but more than one run")
        if period > 0 and size >= period:
            _fail(f"{where}: runs of a group must not touch or overlap (size >= period)")
        if period > 0 and (last - first) % period:
            _fail(f"{where}: last - first is not a multiple of the period")
        if last + size > MAX_ENTRY_END:
            _fail(f"{where}: entries beyond {MAX_ENTRY_END - 1}")
        if first < previous_end:
            _fail(f"{where}: unsorted, or overlaps the previous group (ending at {previous_end})")
        previous_end = last + size
    _fail("inconsistent sequence groups")  # pragma: no cover - the fast check and this loop agree


EMPTY: Final = Availability()


@lru_cache(maxsize=1024)
def _exact_share(first: int, last: int, ensemble_size: int, write_quorum: int, index: int) -> bytes:
    """The wire form of exactly bookie `index`'s share of ``[first, last]`` as a real
    bookie encodes it (one group per maximal run), or b"" when that takes more than
    `_SMALL` groups (then nothing is compared to it)."""
    stripe = _bookie_stripe(ensemble_size, write_quorum, index)
    runs = list(islice(stripe.runs(first, last + 1), _SMALL + 1))
    if not runs or len(runs) > _SMALL:
        return b""
    return Availability.from_runs((start, end - start + 1) for start, end in runs).encode()


def holds_every(
    data: bytes,
    ensemble_size: int,
    write_quorum: int,
    duties: Sequence[tuple[int, int, int]],
) -> bool:
    """Whether the wire form `data` is an availability :meth:`Availability.decode` takes
    that holds every entry bookie ``index`` should store of each ``(first, last, index)``.

    The common answer of a replicas check (a bookie holding its whole share) is decided
    here from the bytes, without building an `Availability`: first by comparing them
    with the encoding of exactly that share, then, for up to `_SMALL` groups of single
    runs, by counting the share's entries inside the groups. False means "not shown
    here": the bytes may be malformed, periodic, long, or lack entries; the caller
    decodes them and counts what is missing.
    """
    if len(duties) == 1:
        first, last, index = duties[0]
        if first >= 0:
            share = _exact_share(first, last, ensemble_size, write_quorum, index)
            if share and data == share:
                return True
    length = len(data)
    if length < HEADER_SIZE:
        return False
    version, count = _HEADER.unpack_from(data, 0)
    if version != CURRENT_HEADER_VERSION or not 0 <= count <= _SMALL:
        return False
    if count * GROUP_SIZE > length - HEADER_SIZE:
        return False
    fields = _small_groups(count).unpack_from(data, HEADER_SIZE)
    firsts = fields[0::4]
    sizes = fields[2::4]
    if any(fields[3::4]) or fields[1::4] != firsts:
        return False  # periodic groups (or malformed ones): left to the decoder
    ends = list(map(add, firsts, sizes))
    if count and not (
        min(sizes) > 0
        and firsts[0] >= 0
        and ends[-1] <= MAX_ENTRY_END
        and all(map(le, islice(ends, count - 1), islice(firsts, 1, None)))
    ):
        return False
    for first, last, index in duties:
        if first < 0:
            return False
        stripe = _bookie_stripe(ensemble_size, write_quorum, index)
        stop = last + 1
        wanted = stripe.between(first, stop)
        if not wanted:
            continue
        held = 0
        for start, end in zip(firsts, ends, strict=True):
            if end <= first:
                continue
            if start >= stop:
                break
            held += stripe.between(max(start, first), min(end, stop))
        if held != wanted:
            return False
    return True


def _missing_events(runs: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    for start, end in runs:
        yield (start, 1)
        yield (end + 1, -1)


def copies_short(
    write_quorum: int, missing: Iterable[Iterable[tuple[int, int]]]
) -> Iterator[tuple[int, int, int]]:
    """Where entries have fewer than ``write_quorum`` copies, from what each holder lacks.

    ``missing`` has one stream per holder (a bookie's duty in one segment): the
    inclusive ``(start, end)`` ranges it should store and does not, ascending. An
    entry missing from ``d`` streams has ``write_quorum - d`` copies. Yields maximal
    inclusive ``(start, end, copies)`` with ``copies < write_quorum``, ascending (a
    sweep over the streams merged in order). The cost is proportional to the total
    number of missing ranges. This is the one copy count: the replicas check, explain
    and `replica_shortfall` all end here.
    """
    depth = 0
    position = 0
    pending: tuple[int, int, int] | None = None
    for at, delta in heapq.merge(*(_missing_events(ranges) for ranges in missing)):
        if at > position and depth > 0:
            copies = write_quorum - depth
            if pending is not None and pending[1] == position - 1 and pending[2] == copies:
                pending = (pending[0], at - 1, copies)
            else:
                if pending is not None:
                    yield pending
                pending = (position, at - 1, copies)
        position = at
        depth += delta
    if pending is not None:
        yield pending


def fewest_copies(
    shortfall: Iterable[tuple[int, int, int]], write_quorum: int
) -> tuple[int, list[tuple[int, int]]]:
    """The lowest copy count of ``shortfall`` and the ranges where it is reached.

    ``shortfall`` is ascending and disjoint (`copies_short` output, one segment
    after another). The count is ``write_quorum`` when nothing is short; the
    ranges are inclusive, ascending, adjacent ones merged (across segments too).
    """
    lowest = write_quorum
    where: list[tuple[int, int]] = []
    for start, end, copies in shortfall:
        if copies < lowest:
            lowest, where = copies, [(start, end)]
        elif copies == lowest:
            if where and where[-1][1] + 1 == start:
                where[-1] = (where[-1][0], end)
            else:
                where.append((start, end))
    return lowest, where


def replica_shortfall(
    first: int,
    last: int,
    ensemble_size: int,
    write_quorum: int,
    bookies: Sequence[Availability | None],
) -> Iterator[tuple[int, int, int]]:
    """Ranges of ``[first, last]`` stored on fewer than ``write_quorum`` bookies.

    ``bookies[i]`` is the availability reported by ensemble member ``i`` (None for a
    bookie that holds nothing, or did not answer). Yields maximal inclusive
    ``(start, end, copies)`` with ``copies < write_quorum``, ascending (`copies_short`).
    """
    if len(bookies) != ensemble_size:
        raise ValueError(f"need {ensemble_size} bookies, got {len(bookies)}")
    return copies_short(
        write_quorum,
        [
            (bookie or EMPTY).missing(first, last, ensemble_size, write_quorum, i)
            for i, bookie in enumerate(bookies)
        ],
    )


def min_copies(
    first: int,
    last: int,
    ensemble_size: int,
    write_quorum: int,
    bookies: Sequence[Availability | None],
) -> int:
    """The lowest number of copies of any entry in ``[first, last]`` (``write_quorum``
    when nothing is missing), as the replicas check reports it."""
    shortfall = replica_shortfall(first, last, ensemble_size, write_quorum, bookies)
    return fewest_copies(shortfall, write_quorum)[0]
