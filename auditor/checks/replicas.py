"""Whether every entry of a closed ledger still has its copies is the question the auditor
exists for, and the driver, `explain`, the self-test and the worker's plan must answer it
identically.

The BP-34 durability contract, as a pure function of metadata and bookie answers.

For a closed ledger, every entry must have write-quorum copies on the bookies
of its write set. Each ensemble bookie answers once per ledger (what it holds,
as an availability encoding), or is probed by reads when it cannot list
(DbLedgerStorage), or does not answer at all. From that we compute, per entry,
how many of its write set lack it (on ranges, with the copy count the bookie
layer owns, `availability.copies_short`), and the ledger's worst entry decides
its category: `no_replica`, `below_ack_quorum` or `below_write_quorum`.

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

Also here, because the driver and `explain` must agree on them: which ledgers
are judged at all (`skip_reason`), and the violations a final verdict reports
(`verdict_violations`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from auditor.bookie.availability import Availability, copies_short, fewest_copies, holds_every
from auditor.checks.findings import Category, Coverage, SkipReason, Violation
from auditor.metadata.model import LedgerMetadata, LedgerState, SegmentRange
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

_NOT_ASKED = Unanswered("not asked")


@dataclass(frozen=True, slots=True)
class Expectation:
    """One bookie's duty in one segment: it must hold its round-robin share of [first, last]."""

    segment: SegmentRange
    bookie: str
    index: int


#: Enum members as module constants: looked up once per ledger on the hot path.
_CLOSED = LedgerState.CLOSED
_OPEN = LedgerState.OPEN


def skip_reason(md: LedgerMetadata) -> SkipReason | None:
    """Why the check leaves a ledger alone: only closed ledgers with entries are judged."""
    state = md.state
    if state is not _CLOSED:
        return SkipReason.OPEN if state is _OPEN else SkipReason.IN_RECOVERY
    if md.last_entry_id < 0:
        return SkipReason.EMPTY
    return None


def segment_expectations(md: LedgerMetadata, seg: SegmentRange) -> Iterator[Expectation]:
    """The bookies of one segment that must hold at least one of its entries."""
    e, w = md.ensemble_size, md.write_quorum
    if seg.empty:
        return
    for i, bookie in enumerate(seg.bookies):
        if first_stored(seg.first, seg.last, e, w, i) is not None:
            yield Expectation(seg, bookie, i)


def expectations(md: LedgerMetadata) -> list[Expectation]:
    """Every (segment, bookie) pair that must hold at least one entry of a closed ledger."""
    return [exp for seg in md.segment_ranges() for exp in segment_expectations(md, seg)]


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

    def coverage(self) -> Coverage:
        """This ledger's (bookie) pairs by how they were verified."""
        out = Coverage()
        for how in self.verified.values():
            if how is Verified.LISTED:
                out.listed += 1
            elif how is Verified.PROBED:
                out.probed += 1
            else:
                out.unverified += 1
        return out

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


def unanswered_registered(verdict: ReplicasVerdict, registered: Set[str]) -> list[str]:
    """The bookies a final verdict reports as `bookie_unavailable_registered`.

    Only registered ones: a silent bookie that is not registered is lost, and
    lost bookies are the bookie check's finding, not this one's.
    """
    return sorted(b for b in verdict.unanswered if b in registered)


def segment_shortfall(
    md: LedgerMetadata, seg: SegmentRange, answers: Mapping[str, BookieAnswer]
) -> Iterator[tuple[int, int, int]]:
    """Ranges of one segment with fewer than write-quorum known copies: `(first, last, copies)`.

    Counted as `analyse` counts them: a copy is missing only when a listing or
    a probe says so.
    """
    e, w = md.ensemble_size, md.write_quorum
    return copies_short(
        w,
        [
            _missing_ranges(exp, answers.get(exp.bookie, _NOT_ASKED), e, w)[0]
            for exp in segment_expectations(md, seg)
        ],
    )


def analyse(
    md: LedgerMetadata,
    answers: Mapping[str, BookieAnswer],
    expected: Sequence[Expectation] | None = None,
) -> ReplicasVerdict:
    """The durability verdict of one closed ledger from its bookies' answers.

    `answers` has one entry per distinct bookie that must hold entries; a
    bookie without an answer is treated as unanswered. `expected` is
    `expectations(md)` when the caller has it already.
    """
    e, w, a = md.ensemble_size, md.write_quorum, md.ack_quorum
    missing: list[MissingOnBookie] = []
    unanswered: dict[str, str] = {}
    verified: dict[str, Verified] = {}
    by_segment: dict[int, list[list[tuple[int, int]]]] = {}
    for exp in expectations(md) if expected is None else expected:
        answer = answers.get(exp.bookie, _NOT_ASKED)
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
            by_segment.setdefault(exp.segment.first, []).append(ranges)
            missing.append(
                MissingOnBookie(
                    exp.segment.first,
                    exp.segment.last,
                    exp.bookie,
                    tuple(ranges[:EVIDENCE_LIMIT]),
                    count,
                )
            )
    # Segments in entry order, so the worst ranges come out ascending and merge across them.
    copies, worst = fewest_copies(
        (short for streams in by_segment.values() for short in copies_short(w, streams)), w
    )
    category: Category | None = None
    if copies < w:
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
        tuple(worst[:EVIDENCE_LIMIT]),
        tuple(missing),
        unanswered,
        verified,
    )


# --- the common case, judged from the bytes -----------------------------------------------

#: One bookie's duties in one ledger: `(first, last, index)` per segment it must hold
#: entries of (the `Expectation`s of that bookie, as plain numbers).
Duties = dict[str, list[tuple[int, int, int]]]


def listing_duties(md: LedgerMetadata) -> Duties:
    """The bookies that must hold entries of a closed ledger, each with its duties: the
    same pairs as `expectations(md)`, keyed by bookie, in the order first met.

    The duties of an ensemble position depend on the ledger's shape only (sizes and
    segment boundaries), not on which bookies fill it; most ledgers of a cluster share a
    few shapes, so a shape's duties are computed once (`_shape_duties`) and each ledger
    only puts its bookies' names on them."""
    key = (
        md.ensemble_size,
        md.write_quorum,
        md.last_entry_id,
        *[(seg.first_entry_id, len(seg.bookies)) for seg in md.segments],
    )
    shape = _SHAPES.get(key)
    if shape is None:
        shape = _shape_duties(md)
        if len(_SHAPES) >= _SHAPES_KEPT:
            _SHAPES.clear()
        _SHAPES[key] = shape
    segments = md.segments
    out: Duties = {}
    for seg_index, i, duty in shape:
        bookie = segments[seg_index].bookies[i]
        found = out.get(bookie)
        if found is None:
            out[bookie] = [duty]
        else:
            found.append(duty)
    return out


#: How many ledger shapes `listing_duties` keeps (cleared when full: a cluster whose
#: ledgers all differ in shape pays what it paid before, plus a dict lookup).
_SHAPES_KEPT = 4096
_SHAPES: dict[tuple[object, ...], tuple[tuple[int, int, tuple[int, int, int]], ...]] = {}


def _shape_duties(md: LedgerMetadata) -> tuple[tuple[int, int, tuple[int, int, int]], ...]:
    """Per (segment, position) with entries to hold, in order: `(segment index,
    position, (first, last, position))`."""
    e, w = md.ensemble_size, md.write_quorum
    out: list[tuple[int, int, tuple[int, int, int]]] = []
    for seg_index, seg in enumerate(md.segment_ranges()):
        first, last = seg.first, seg.last
        if last < first:
            continue
        for i in range(len(seg.bookies)):
            if first_stored(first, last, e, w, i) is not None:
                out.append((seg_index, i, (first, last, i)))
    return tuple(out)


def listed_in_full(md: LedgerMetadata, duties: Duties, listings: Mapping[str, bytes]) -> bool:
    """Whether every bookie with duties listed (its availability's wire form in
    `listings`, as bytes) every entry it must hold: the ledger is then fully replicated,
    and its verdict is `in_full_verdict`. False means "not shown from the bytes": decode
    them and `analyse` (the same verdict whenever this says True)."""
    e, w = md.ensemble_size, md.write_quorum
    for bookie, mine in duties.items():
        data = listings.get(bookie)
        if data is None or not holds_every(data, e, w, mine):
            return False
    return True


def in_full_verdict(md: LedgerMetadata, bookies: Iterable[str]) -> ReplicasVerdict:
    """The verdict `analyse` gives a closed ledger whose `bookies` (those with duties) each
    listed all they must hold: nothing missing, no category, write-quorum copies."""
    listed = Verified.LISTED
    return ReplicasVerdict(
        md.ledger_id, None, max(md.write_quorum, 0), (), (), {}, dict.fromkeys(bookies, listed)
    )


def judge_listings(md: LedgerMetadata, listings: Mapping[str, bytes]) -> ReplicasVerdict:
    """The verdict of a closed ledger whose bookies answered with these wire forms (a
    bookie without one is unanswered): from the bytes when they show it fully replicated,
    else decoded and analysed. Raises `AvailabilityFormatError` for bytes that do not
    decode, as `Availability.decode` does."""
    duties = listing_duties(md)
    if listed_in_full(md, duties, listings):
        return in_full_verdict(md, duties)
    answers = {b: Listed(Availability.decode(data)) for b, data in listings.items()}
    return analyse(md, answers)


def unavailable_violation(
    md: LedgerMetadata, bookie: str, reason: str, attempts: int, version: int
) -> Violation:
    """`bookie_unavailable_registered`: a registered bookie that did not answer `attempts` times."""
    return Violation(
        md.ledger_id,
        Category.BOOKIE_UNAVAILABLE_REGISTERED,
        bookie,
        {
            "reason": reason,
            "attempts": attempts,
            "segments": [[s.first, s.last] for s in md.segment_ranges() if bookie in s.bookies],
            "metadata_version": version,
        },
    )


def verdict_violations(
    md: LedgerMetadata,
    verdict: ReplicasVerdict,
    version: int,
    registered: Set[str],
    attempts: int | Mapping[str, int],
) -> list[Violation]:
    """What a final verdict reports: its category, then each silent registered bookie.

    `attempts`: how many looks in a row a silent bookie did not answer, one count for
    all of them, or per bookie: the replicas run's re-checks are counted per (ledger,
    bookie) (`replicas_retry`), and a silent bookie missing from the mapping has not
    had its re-checks yet, so it is not reported.
    """
    found: list[Violation] = []
    if verdict.category is not None:
        found.append(Violation(md.ledger_id, verdict.category, None, verdict.evidence(md, version)))
    for bookie in unanswered_registered(verdict, registered):
        looks = attempts if isinstance(attempts, int) else attempts.get(bookie)
        if looks is not None:
            found.append(
                unavailable_violation(md, bookie, verdict.unanswered[bookie], looks, version)
            )
    return found
