"""The daemon keeps each check's last report in memory, and a cluster in trouble can have
millions of violations; a report must still give exact figures without growing with them.

A report's violations with bounded memory: every one counted, the first N kept.

`ViolationLog` keeps the exact figures an operator and a dashboard need (violations,
ledgers per category, the smallest ledger ids of each category as samples) and lists
only the first `limit` violations in report order (ledger id, category, bookie), so
memory is bounded by the limit, not by the number of ledgers in trouble.

Ledgers per category are counted once per (ledger, category): a check adds
one ledger's violations of a category together (several bookies of one
ledger follow each other), so comparing with the last ledger counted in that
category is enough, and no set of ids grows with the cluster. Partial logs of
disjoint ledgers (scan partitions, retry stages) merge by addition.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence

from auditor.checks.violation import Violation

#: Ledger ids kept per category as samples, whatever the listing limit.
SAMPLES_PER_CATEGORY = 100


def order(v: Violation) -> tuple[int, str, str]:
    """Report order: by ledger, then category, then bookie."""
    return (v.ledger_id, str(v.category), v.bookie or "")


class _Samples:
    """The smallest distinct ids seen, at most `size` of them (a max-heap of negated ids)."""

    __slots__ = ("_heap", "_members", "size")

    def __init__(self, size: int = SAMPLES_PER_CATEGORY) -> None:
        self.size = size
        self._heap: list[int] = []
        self._members: set[int] = set()

    def add(self, ledger_id: int) -> None:
        if ledger_id in self._members:
            return
        if len(self._heap) < self.size:
            heapq.heappush(self._heap, -ledger_id)
            self._members.add(ledger_id)
        elif ledger_id < -self._heap[0]:
            evicted = -heapq.heapreplace(self._heap, -ledger_id)
            self._members.discard(evicted)
            self._members.add(ledger_id)

    def sorted(self) -> list[int]:
        return sorted(self._members)


class ViolationLog:
    """The violations of one report. `limit` 0 keeps them all."""

    __slots__ = ("_counts", "_kept", "_last", "_samples", "_sorted", "limit", "total")

    def __init__(self, items: Iterable[Violation] = (), *, limit: int = 0) -> None:
        if limit < 0:
            raise ValueError(f"the listing limit must be >= 0, got {limit}")
        self.limit = limit
        #: Violations added, listed or not.
        self.total = 0
        self._kept: list[Violation] = []
        self._sorted = True
        self._counts: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self._samples: dict[str, _Samples] = {}
        self.extend(items)

    @classmethod
    def restored(
        cls,
        listed: Sequence[Violation],
        *,
        total: int,
        counts: Mapping[str, int],
        samples: Mapping[str, Sequence[int]],
    ) -> ViolationLog:
        """A log as a report document describes it (the listed part may be truncated)."""
        log = cls(limit=len(listed) if total > len(listed) else 0)
        log._kept = sorted(listed, key=order)
        log.total = total
        log._counts = {c: n for c, n in counts.items()}
        for category, ids in samples.items():
            kept = log._samples.setdefault(category, _Samples())
            for i in ids:
                kept.add(i)
        return log

    # --- adding ------------------------------------------------------------------------

    def append(self, v: Violation) -> None:
        self.total += 1
        category = str(v.category)
        if self._last.get(category) != v.ledger_id:
            self._last[category] = v.ledger_id
            self._counts[category] = self._counts.get(category, 0) + 1
        self._samples.setdefault(category, _Samples()).add(v.ledger_id)
        self._kept.append(v)
        self._sorted = False
        if self.limit and len(self._kept) >= 2 * self.limit:
            self._trim()

    def extend(self, items: Iterable[Violation]) -> None:
        for v in items:
            self.append(v)

    def merge(self, other: ViolationLog) -> None:
        """Adds a log of other ledgers (another partition or stage); this log's limit holds.

        The first N of a union are among the first N of each part, so with the
        same limit everywhere (one configuration) the merged listing is exact.
        """
        self.total += other.total
        for category, n in other._counts.items():
            self._counts[category] = self._counts.get(category, 0) + n
        for category, samples in other._samples.items():
            mine = self._samples.setdefault(category, _Samples())
            for i in samples.sorted():
                mine.add(i)
        self._kept.extend(other.listed())
        self._sorted = False
        if self.limit and len(self._kept) > self.limit:
            self._trim()

    def _trim(self) -> None:
        self._kept.sort(key=order)
        del self._kept[self.limit :]
        self._sorted = True

    # --- reading -------------------------------------------------------------------------

    def listed(self) -> list[Violation]:
        """The first `limit` violations (all when unlimited), in report order."""
        if not self._sorted:
            self._kept.sort(key=order)
            if self.limit:
                del self._kept[self.limit :]
            self._sorted = True
        return self._kept

    @property
    def truncated(self) -> bool:
        return self.total > len(self.listed())

    def ledgers(self, category: str) -> int:
        """Ledgers in violation in `category` (each once)."""
        return self._counts.get(category, 0)

    def categories(self) -> list[str]:
        return list(self._counts)

    def samples(self, category: str) -> list[int]:
        """Up to `SAMPLES_PER_CATEGORY` smallest ledger ids in `category`, sorted."""
        kept = self._samples.get(category)
        return kept.sorted() if kept is not None else []

    def __iter__(self) -> Iterator[Violation]:
        return iter(self.listed())

    def __len__(self) -> int:
        """Listed violations; `total` counts them all."""
        return len(self.listed())

    def __bool__(self) -> bool:
        return self.total > 0

    def __getitem__(self, index: int) -> Violation:
        return self.listed()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ViolationLog):
            return self.total == other.total and self.listed() == other.listed()
        if isinstance(other, list):
            return self.total == len(other) and self.listed() == sorted(other, key=order)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ViolationLog(total={self.total}, listed={self.listed()!r})"
