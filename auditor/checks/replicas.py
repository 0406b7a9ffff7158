"""The BP-34 durability contract, as a pure function of metadata and bookie answers.

For a closed ledger, every entry must have write-quorum copies on the bookies
of its write set. Each ensemble bookie answers once per ledger (what it holds,
as an availability encoding), or is probed by reads when it cannot list
(DbLedgerStorage), or does not answer at all. From that we compute, per entry,
how many of its write set lack it, and the ledger's worst entry decides its
category: `no_replica`, `below_ack_quorum` or `below_write_quorum`.

Two deliberate differences from BookKeeper's `AuditorReplicasCheckTask`:
- Missing entries are "expected and not available", computed on ranges, not
  with upstream's `getUnavailableEntries`, which reports every later entry as
  missing once it walks two or more entries past a group (false alarms for
  ensemble size minus write quorum >= 2).
- A bookie that did not answer is neither counted as missing nor ignored: the
  ledger is "potentially faulty" and the driver re-checks it later; the core
  reports it in `unanswered` so the driver can decide.

Copies are counted optimistically for bookies we know nothing about (not
answered, or entries a probe did not read): a violation is only ever claimed
for copies we know are missing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from auditor.bookie.availability import Availability
from auditor.checks.findings import Category
from auditor.metadata.model import LedgerMetadata, SegmentRange
from auditor.metadata.schedule import first_stored, last_stored, stores_entry

#: How many ranges of evidence a violation carries at most.
EVIDENCE_LIMIT = 100


class Verified(enum.Enum):
    LISTED = "listed"
    PROBED = "probed"
    UNVERIFIED = "unverified"


@dataclass(frozen=True, slots=True)
class Listed:
    """The bookie listed what it holds (ENOLEDGER is an empty listing)."""

    availability: Availability


@dataclass(frozen=True, slots=True)
class Probed:
    """The bookie cannot list; these entries were read: True = present, False = absent."""

    entries: Mapping[int, bool]


@dataclass(frozen=True, slots=True)
class Unanswered:
    """Nothing usable came back (error status, timeout, unreachable)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Unverified:
    """The bookie cannot list and probing is off: nothing is known."""

    reason: str = "cannot list entries; probing disabled"


BookieAnswer = Listed | Probed | Unanswered | Unverified


@dataclass(frozen=True, slots=True)
class Expectation:
    """One bookie's duty in one segment: it must hold its round-robin share of [first, last]."""

    segment: SegmentRange
    bookie: str
    index: int


def expectations(md: LedgerMetadata) -> list[Expectation]:
    """Every (segment, bookie) pair that must hold at least one entry of a closed ledger."""
    out: list[Expectation] = []
    e, w = md.ensemble_size, md.write_quorum
    for seg in md.segment_ranges():
        if seg.empty:
            continue
        for i, bookie in enumerate(seg.bookies):
            if first_stored(seg.first, seg.last, e, w, i) is not None:
                out.append(Expectation(seg, bookie, i))
    return out


def probe_entries(md: LedgerMetadata, bookie: str) -> list[int]:
    """What to read from a bookie that cannot list: its first and last entry per segment."""
    entries: set[int] = set()
    for exp in expectations(md):
        if exp.bookie != bookie:
            continue
        seg, e, w = exp.segment, md.ensemble_size, md.write_quorum
        for entry in (
            first_stored(seg.first, seg.last, e, w, exp.index),
            last_stored(seg.first, seg.last, e, w, exp.index),
        ):
            if entry is not None:
                entries.add(entry)
    return sorted(entries)


@dataclass(frozen=True, slots=True)
class MissingOnBookie:
    segment_first: int
    segment_last: int
    bookie: str
    ranges: tuple[tuple[int, int], ...]  # inclusive, capped at EVIDENCE_LIMIT
    count: int


@dataclass(frozen=True, slots=True)
class ReplicasVerdict:
    ledger_id: int
    category: Category | None
    #: Fewest copies any entry has (write quorum when nothing is missing).
    min_copies: int
    #: Entries with that fewest number of copies, as inclusive ranges (capped).
    worst_entries: tuple[tuple[int, int], ...]
    missing: tuple[MissingOnBookie, ...]
    unanswered: dict[str, str]
    verified: dict[str, Verified] = field(default_factory=dict)

    @property
    def potentially_faulty(self) -> bool:
        return bool(self.unanswered)

    @property
    def bookies_missing_entries(self) -> list[str]:
        return sorted({m.bookie for m in self.missing})

    def evidence(self, md: LedgerMetadata, znode_version: int) -> dict[str, Any]:
        return {
            "copies_found": self.min_copies,
            "write_quorum": md.write_quorum,
            "ack_quorum": md.ack_quorum,
            "ensemble_size": md.ensemble_size,
            "worst_entries": [list(r) for r in self.worst_entries],
            "missing": [
                {
                    "segment": [m.segment_first, m.segment_last],
                    "bookie": m.bookie,
                    "entries": [list(r) for r in m.ranges],
                    "count": m.count,
                }
                for m in self.missing
            ],
            "unanswered": dict(self.unanswered),
            "verified": {b: v.value for b, v in sorted(self.verified.items())},
            "metadata_version": znode_version,
        }


def _missing_ranges(
    exp: Expectation, answer: BookieAnswer, e: int, w: int
) -> tuple[list[tuple[int, int]], int]:
    """Missing entries of one expectation: all ranges (for counting) and their total."""
    seg = exp.segment
    if isinstance(answer, Listed):
        missing = answer.availability.missing(seg.first, seg.last, e, w, exp.index)
        if not missing:
            return [], 0
        return list(missing), missing.count
    if isinstance(answer, Probed):
        absent = sorted(
            entry
            for entry, present in answer.entries.items()
            if not present
            and seg.first <= entry <= seg.last
            and stores_entry(exp.index, entry, e, w)
        )
        return [(x, x) for x in absent], len(absent)
    return [], 0


def _worst(ranges: Iterable[tuple[int, int]]) -> tuple[int, list[tuple[int, int]]]:
    """The highest number of overlapping ranges, and where it is reached (a sweep line)."""
    events: list[tuple[int, int]] = []
    for a, b in ranges:
        events.append((a, 1))
        events.append((b + 1, -1))
    if not events:
        return 0, []
    events.sort()
    depth = best = 0
    where: list[tuple[int, int]] = []
    i = 0
    n = len(events)
    while i < n:
        pos = events[i][0]
        while i < n and events[i][0] == pos:
            depth += events[i][1]
            i += 1
        if i < n and depth > 0:
            end = events[i][0] - 1
            if depth > best:
                best, where = depth, [(pos, end)]
            elif depth == best:
                if where and where[-1][1] + 1 == pos:
                    where[-1] = (where[-1][0], end)
                else:
                    where.append((pos, end))
    return best, where


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(b, out[-1][1]))
        else:
            out.append((a, b))
    return out


def unanswered_registered(verdict: ReplicasVerdict, registered: Set[str]) -> list[str]:
    """The bookies a final verdict reports as `bookie_unavailable_registered`.

    Only registered ones: a silent bookie that is not registered is lost, and
    lost bookies are the bookie check's finding, not this one's.
    """
    return sorted(b for b in verdict.unanswered if b in registered)


def analyse(md: LedgerMetadata, answers: Mapping[str, BookieAnswer]) -> ReplicasVerdict:
    """The durability verdict of one closed ledger from its bookies' answers.

    `answers` has one entry per distinct bookie that must hold entries; a
    bookie without an answer is treated as unanswered.
    """
    e, w, a = md.ensemble_size, md.write_quorum, md.ack_quorum
    missing: list[MissingOnBookie] = []
    unanswered: dict[str, str] = {}
    verified: dict[str, Verified] = {}
    worst_m = 0
    worst_where: list[tuple[int, int]] = []
    by_segment: dict[int, list[tuple[int, int]]] = {}
    for exp in expectations(md):
        answer = answers.get(exp.bookie, Unanswered("not asked"))
        if isinstance(answer, Unanswered):
            unanswered[exp.bookie] = answer.reason
            verified[exp.bookie] = Verified.UNVERIFIED
            continue
        if isinstance(answer, Unverified):
            verified[exp.bookie] = Verified.UNVERIFIED
            continue
        verified.setdefault(
            exp.bookie, Verified.LISTED if isinstance(answer, Listed) else Verified.PROBED
        )
        ranges, count = _missing_ranges(exp, answer, e, w)
        if count:
            by_segment.setdefault(exp.segment.first, []).extend(ranges)
            missing.append(
                MissingOnBookie(
                    exp.segment.first,
                    exp.segment.last,
                    exp.bookie,
                    tuple(ranges[:EVIDENCE_LIMIT]),
                    count,
                )
            )
    for ranges in by_segment.values():
        m, where = _worst(ranges)
        if m > worst_m:
            worst_m, worst_where = m, where
        elif m == worst_m and m > 0:
            worst_where.extend(where)
    copies = w - worst_m
    category: Category | None = None
    if worst_m > 0:
        if copies <= 0:
            category = Category.NO_REPLICA
        elif copies < a:
            category = Category.BELOW_ACK_QUORUM
        else:
            category = Category.BELOW_WRITE_QUORUM
    return ReplicasVerdict(
        md.ledger_id,
        category,
        max(copies, 0),
        tuple(_merged(worst_where)[:EVIDENCE_LIMIT]),
        tuple(missing),
        unanswered,
        verified,
    )
