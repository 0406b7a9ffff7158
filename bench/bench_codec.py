"""`codec`: entry-availability range arithmetic versus a brute-force set, on a 1M-entry ledger.

Each line of output is one JSON object (`"bench": "codec"`, one per shape).
``decode_ms`` is the shared cost of parsing the bookie's answer; ``missing_ms``
is the range computation (count plus the list of missing ranges); ``brute_ms``
builds a Python set of the available entries and loops over every expected
entry; ``speedup`` is ``brute_ms / missing_ms``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import TypeVar

from auditor.bookie.availability import Availability
from bench.common import emit

ENTRIES = 1_000_000
ENSEMBLE, QUORUM, BOOKIE = 3, 2, 0

T = TypeVar("T")


def best_of(repeat: int, action: Callable[[], T]) -> tuple[float, T]:
    """The fastest of ``repeat`` runs, in seconds, and the last result."""
    best = float("inf")
    result: T | None = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - started)
    assert result is not None
    return best, result


def brute_force(availability: Availability, first: int, last: int) -> list[int]:
    held: set[int] = set()
    for start, length in availability.iter_runs():
        held.update(range(start, start + length))
    return [e for e in range(first, last + 1) if (BOOKIE - e) % ENSEMBLE < QUORUM and e not in held]


def shapes() -> list[tuple[str, Availability]]:
    return [
        ("one_group", Availability.from_runs([(0, ENTRIES)])),
        (
            "every_1000th_missing",
            Availability.from_runs([(k + 1, 999) for k in range(0, ENTRIES, 1000)]),
        ),
        (
            "striped_e3_w2_bookie0",
            Availability.from_entries(
                e for e in range(ENTRIES) if (BOOKIE - e) % ENSEMBLE < QUORUM
            ),
        ),
    ]


def missing_ranges(availability: Availability) -> tuple[int, list[tuple[int, int]]]:
    result = availability.missing(0, ENTRIES - 1, ENSEMBLE, QUORUM, BOOKIE)
    return result.count, result.ranges()


def figures() -> Iterator[dict[str, object]]:
    for name, built in shapes():
        data = built.encode()
        decode_s, availability = best_of(5, partial(Availability.decode, data))
        missing_s, (count, found) = best_of(5, partial(missing_ranges, availability))
        brute_s, brute = best_of(2, partial(brute_force, availability, 0, ENTRIES - 1))
        assert count == len(brute)
        assert [e for start, end in found for e in range(start, end + 1)] == brute
        yield {
            "bench": "codec",
            "shape": name,
            "entries": ENTRIES,
            "groups": availability.group_count,
            "bytes": len(data),
            "missing": count,
            "decode_ms": round(decode_s * 1e3, 3),
            "missing_ms": round(missing_s * 1e3, 3),
            "brute_ms": round(brute_s * 1e3, 3),
            "speedup": round(brute_s / missing_s, 1),
            "speedup_with_decode": round((decode_s + brute_s) / (decode_s + missing_s), 1),
        }


def main() -> None:
    for figure in figures():
        emit(figure)


if __name__ == "__main__":
    main()
