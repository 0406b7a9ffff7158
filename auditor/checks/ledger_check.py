"""Whether every bookie can still serve the entries the metadata says it holds is learnt only
by reading entries, and reading every entry of every ledger is out of the question; which
to read, and what the answers mean, are decided here without I/O.

The ledger check's analysis (BookKeeper's LedgerChecker), with no I/O.

As upstream, it reads a sample: per fragment and bookie, the first and last entry that
bookie must store, plus `auditorLedgerVerificationPercentage` of the span between them.

The driver (`ledger_check_run`) does the talking; this module decides what to
ask and what the answers mean, in three steps a test can drive with plain
values:

1. `single_entry_probe(md, lac)`: whether the last fragment holds a single
   candidate entry whose existence must be probed first (upstream's rule: a
   last segment of one entry, or an open ledger whose LAC is below its last
   segment, may hold nothing at all, and reading would raise a false alarm);
   `entry_may_exist(replies)` turns the probe's replies into the answer.
2. `plan_ledger(md, lac, available, pct, rng, ...)`: the fragments, and per
   (fragment, bookie index) what to read, or why nothing is read.
3. `evaluate(plan, failures)`: the bad fragments, each with its bad bookies.

Everything is arithmetic on the round-robin schedule (bookie `i` stores entry
`e` iff `(i - e) mod E < W`), so a fragment of millions of entries is planned
in constant time; the entries to read are a lazy `EntrySelection`.

Where this differs from upstream, deliberately:

* Sampling uses exact integer arithmetic (`floor(len * pct / 100)`), where
  upstream multiplies by `pct / 100.0` and can lose one entry to rounding.
* A closed ledger's segments are clipped at its `lastEntryId`: metadata whose
  non-last segment extends beyond the close would otherwise make us read
  entries that were never written.
* An entry body that comes back is checked (ids in its header, and its digest
  when the metadata names the digest type): a corrupt entry is as unreadable
  to a client as a missing one. Upstream only looks at the status.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from auditor.bookie.availability import expected_count
from auditor.bookie.protocol import (
    BookieProtocolError,
    DigestMismatchError,
    EntryHeader,
    Status,
    decode_entry_header,
    verify_entry_body,
)
from auditor.bookie.results import EntryRead, ErrorStatus, LacRead, NoAnswer, Ok, Outcome
from auditor.metadata.model import INVALID_ENTRY_ID, DigestType, LedgerMetadata, LedgerState
from auditor.metadata.schedule import (
    first_stored,
    last_stored,
    stores_entry,
    write_set,
)
from auditor.metadata.schedule import (
    run_offset as _run_offset,
)

__all__ = [
    "BadBookie",
    "BadFragment",
    "BookieCheck",
    "EntrySelection",
    "Fragment",
    "LacAnswer",
    "LedgerPlan",
    "Probe",
    "ReadFailure",
    "Verdict",
    "bad_bookie_ids",
    "classify_read",
    "entry_may_exist",
    "entry_ranges",
    "evaluate",
    "first_stored",
    "fragments",
    "lac_from_answers",
    "last_stored",
    "metadata_problem",
    "plan_ledger",
    "select_entries",
    "single_entry_probe",
    "violation_detail",
]

#: Statuses that prove an entry is absent (upstream adds the client-side
#: NoSuchLedgerExistsOnMetadataServer, which never comes from a bookie).
_ABSENT = frozenset({Status.ENOENTRY, Status.ENOLEDGER})


# --- round-robin arithmetic ---------------------------------------------------------


def _stored_runs(
    first: int, last: int, ensemble_size: int, write_quorum: int, index: int
) -> Iterator[tuple[int, int]]:
    """The stored entries of `[first, last]` as inclusive runs, ascending."""
    start = first_stored(first, last, ensemble_size, write_quorum, index)
    if start is None:
        return
    if write_quorum >= ensemble_size:
        yield (start, last)
        return
    offset = _run_offset(ensemble_size, write_quorum, index)
    run = start - (start - offset) % ensemble_size
    while run <= last:
        yield (max(run, first), min(run + write_quorum - 1, last))
        run += ensemble_size


# --- fragments -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fragment:
    """Entries `[first, last]` of one segment (`last < first`: nothing to read)."""

    segment: int
    first: int
    last: int
    bookies: tuple[str, ...]
    ensemble_size: int
    write_quorum: int

    @property
    def empty(self) -> bool:
        return self.last < self.first


def _end_of_last_segment(md: LedgerMetadata, lac: int | None) -> int:
    """Where the last segment ends: lastEntryId when closed, else the LAC raised to its start.

    An unknown LAC (`None`: no bookie answered) counts as INVALID_ENTRY_ID, so
    the single-entry probe decides whether the last segment holds anything.
    """
    start = md.segments[-1].first_entry_id
    if md.state is LedgerState.CLOSED:
        return md.last_entry_id
    return max(INVALID_ENTRY_ID if lac is None else lac, start)


def fragments(md: LedgerMetadata, lac: int | None = None) -> list[Fragment]:
    """Every segment as a fragment; `lac` matters only for a ledger that is not closed.

    Non-last segments of an open ledger are taken whole: BookKeeper starts a new
    ensemble only after everything before it was confirmed, so they are at or
    below the LAC whatever the bookies report.
    """
    out: list[Fragment] = []
    n = len(md.segments)
    closed = md.state is LedgerState.CLOSED
    for k, seg in enumerate(md.segments):
        if k + 1 < n:
            last = md.segments[k + 1].first_entry_id - 1
            if closed:
                last = min(last, md.last_entry_id)
        else:
            last = _end_of_last_segment(md, lac)
        out.append(
            Fragment(k, seg.first_entry_id, last, seg.bookies, md.ensemble_size, md.write_quorum)
        )
    return out


@dataclass(frozen=True, slots=True)
class Probe:
    """Entry `entry_id` must be probed on these (index, bookie) before the last fragment."""

    entry_id: int
    targets: tuple[tuple[int, str], ...]


def single_entry_probe(md: LedgerMetadata, lac: int | None = None) -> Probe | None:
    """The probe upstream sends when the last segment's start equals its end, else None."""
    seg = md.segments[-1]
    if _end_of_last_segment(md, lac) != seg.first_entry_id:
        return None
    e = seg.first_entry_id
    targets = tuple((i, seg.bookies[i]) for i in write_set(e, md.ensemble_size, md.write_quorum))
    return Probe(e, targets)


def entry_may_exist(replies: Iterable[Outcome[EntryRead] | None]) -> bool:
    """Upstream's verdict: the entry may exist unless every reply proves it absent.

    `None` stands for a bookie that was not asked because it is unavailable
    (upstream's client fails such a read at once, which is not a proof of absence).
    """
    for reply in replies:
        if not (isinstance(reply, ErrorStatus) and reply.status in _ABSENT):
            return True
    return False


# --- the LAC of a ledger that is not closed ---------------------------------------------


@dataclass(frozen=True, slots=True)
class LacAnswer:
    """The LAC learnt from the last segment's bookies.

    `lac` is None when no bookie gave a usable answer (`answered == 0`). A bookie
    that answered ENOENTRY or ENOLEDGER counts as an answer without an LAC (a
    writer that crashed before its first entry leaves exactly that).
    """

    lac: int | None
    answered: int
    asked: int


def lac_from_answers(md: LedgerMetadata, answers: Iterable[Outcome[LacRead]]) -> LacAnswer:
    """The largest LAC any bookie vouches for (explicit LAC, or its last entry's header).

    The last entry's own id is not confirmed, only the LAC it carries; a last
    entry whose digest does not verify is ignored.
    """
    best: int | None = None
    answered = asked = 0
    for outcome in answers:
        asked += 1
        if isinstance(outcome, ErrorStatus):
            if outcome.status in _ABSENT:
                answered += 1
                best = INVALID_ENTRY_ID if best is None else best
            continue
        if not isinstance(outcome, Ok):
            continue
        answered += 1
        found = INVALID_ENTRY_ID
        read = outcome.value
        explicit = read.explicit_lac
        if (
            explicit is not None
            and read.lac_body is not None
            and _blob_ledger(read) == md.ledger_id
        ):
            found = max(found, explicit)
        if read.last_entry_body is not None:
            entry = _entry_lac(md, read.last_entry_body)
            if entry is not None:
                found = max(found, entry)
        best = found if best is None else max(best, found)
    return LacAnswer(best, answered, asked)


def _blob_ledger(read: LacRead) -> int | None:
    body = read.lac_body
    return None if body is None or len(body) < 8 else int.from_bytes(body[:8], "big", signed=True)


def _entry_lac(md: LedgerMetadata, body: bytes) -> int | None:
    try:
        head = _checked_header(md, body)
    except BookieProtocolError:
        return None
    return head.last_add_confirmed if head.ledger_id == md.ledger_id else None


def _checked_header(md: LedgerMetadata, body: bytes) -> EntryHeader:
    """The body's header, after checking its digest when the metadata allows it.

    A digest can be checked when the metadata names its type (format v2 and
    later) and, for HMAC, holds the password. Raises `BookieProtocolError`
    (`DigestMismatchError` for a wrong digest).
    """
    digest = md.digest_type
    if digest is None or (digest is DigestType.HMAC and md.password is None):
        return decode_entry_header(body)
    entry = verify_entry_body(body, digest, md.password or b"")
    return EntryHeader(entry.ledger_id, entry.entry_id, entry.last_add_confirmed, entry.length)


# --- what to read ---------------------------------------------------------------------


class Verdict(enum.Enum):
    """Why a (fragment, bookie) pair is, or is not, read."""

    #: Entries are read; the pair is bad if any read fails.
    READ = "read"
    #: The bookie stores nothing in the fragment and is available: nothing to check.
    NOTHING_STORED = "nothing_stored"
    #: Neither writable nor read-only: bad without reads (BOOKKEEPER-742 for empty fragments).
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True, slots=True)
class EntrySelection:
    """The entries to read from one bookie in one fragment, ascending, generated lazily.

    Either every stored entry of `[first, last]` (`every`), or `first`, `last`
    and one uniformly random entry from each of `buckets` buckets of width
    `bucket_width` starting at `first`, kept only if this bookie stores it
    (upstream's sampling). Random draws come from `seed`, so iterating twice
    gives the same entries.
    """

    first: int
    last: int
    ensemble_size: int
    write_quorum: int
    index: int
    every: bool = False
    buckets: int = 0
    bucket_width: int = 0
    seed: int = 0

    def __iter__(self) -> Iterator[int]:
        if self.every:
            for a, b in _stored_runs(
                self.first, self.last, self.ensemble_size, self.write_quorum, self.index
            ):
                yield from range(a, b + 1)
            return
        yield self.first
        previous = self.first
        rng = random.Random(self.seed)
        for k in range(self.buckets):
            e = self.first + k * self.bucket_width + rng.randrange(self.bucket_width)
            if e != previous and stores_entry(self.index, e, self.ensemble_size, self.write_quorum):
                yield e
                previous = e
        if self.last != previous:
            yield self.last

    def count(self) -> int:
        """How many entries a full iteration yields (arithmetic when `every`)."""
        if self.every:
            return expected_count(
                self.first, self.last, self.ensemble_size, self.write_quorum, self.index
            )
        return sum(1 for _ in self)


def select_entries(
    first: int,
    last: int,
    ensemble_size: int,
    write_quorum: int,
    index: int,
    pct: int,
    rng: random.Random,
) -> EntrySelection:
    """Upstream's choice for stored span `[first, last]` (both stored by `index`).

    With `len = last - first + 1` and `n = floor(len * pct / 100)`: a single
    stored entry is read alone; if `n >= len` every stored entry is read;
    otherwise `first`, `last`, and one random pick per bucket of width
    `floor(len / n)` when `n > 0`. The percentage is of the span, not of the
    stored entries; picks the bookie does not store are dropped, so about
    `pct`% of its stored entries are read.
    """
    if not 0 <= pct <= 100:
        raise ValueError(f"verification percentage must be in 0..100, got {pct}")
    length = last - first + 1
    n = length * pct // 100
    if first == last or n >= length:
        return EntrySelection(first, last, ensemble_size, write_quorum, index, every=True)
    if n == 0:
        return EntrySelection(first, last, ensemble_size, write_quorum, index)
    return EntrySelection(
        first,
        last,
        ensemble_size,
        write_quorum,
        index,
        buckets=n,
        bucket_width=length // n,
        seed=rng.getrandbits(64),
    )


@dataclass(frozen=True, slots=True)
class BookieCheck:
    """One (fragment, bookie index) pair and what checking it takes."""

    fragment: Fragment
    index: int
    bookie: str
    verdict: Verdict
    first_stored: int | None
    last_stored: int | None
    #: Set exactly when `verdict` is READ.
    entries: EntrySelection | None = None


@dataclass(frozen=True, slots=True)
class LedgerPlan:
    ledger_id: int
    fragments: tuple[Fragment, ...]
    checks: tuple[BookieCheck, ...]
    #: The LAC used for the last segment (None for a closed ledger or an unknown LAC).
    lac: int | None = None
    #: The single-entry probe found the last fragment's only entry absent everywhere.
    last_fragment_skipped: bool = False


def plan_ledger(
    md: LedgerMetadata,
    lac: int | None,
    available: Iterable[str] | frozenset[str],
    pct: int,
    rng: random.Random,
    *,
    last_entry_may_exist: bool | None = None,
) -> LedgerPlan:
    """What to check in one ledger.

    `available` is the bookies that are writable or read-only now. When
    `single_entry_probe(md, lac)` is not None its answer must be passed as
    `last_entry_may_exist`; False drops the last fragment, as upstream does.
    """
    probe = single_entry_probe(md, lac)
    if probe is not None and last_entry_may_exist is None:
        raise ValueError(
            f"ledger {md.ledger_id}: entry {probe.entry_id} must be probed before planning"
        )
    avail = available if isinstance(available, frozenset) else frozenset(available)
    frags = fragments(md, lac)
    skipped = probe is not None and last_entry_may_exist is False
    if skipped:
        frags = frags[:-1]
    checks: list[BookieCheck] = []
    for f in frags:
        for i, bookie in enumerate(f.bookies):
            fs = first_stored(f.first, f.last, f.ensemble_size, f.write_quorum, i)
            ls = last_stored(f.first, f.last, f.ensemble_size, f.write_quorum, i)
            if bookie not in avail:
                checks.append(BookieCheck(f, i, bookie, Verdict.UNAVAILABLE, fs, ls))
            elif fs is None or ls is None:
                checks.append(BookieCheck(f, i, bookie, Verdict.NOTHING_STORED, None, None))
            else:
                sel = select_entries(fs, ls, f.ensemble_size, f.write_quorum, i, pct, rng)
                checks.append(BookieCheck(f, i, bookie, Verdict.READ, fs, ls, sel))
    return LedgerPlan(
        md.ledger_id,
        tuple(frags),
        tuple(checks),
        lac=None if md.state is LedgerState.CLOSED else lac,
        last_fragment_skipped=skipped,
    )


# --- judging the reads ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadFailure:
    entry_id: int
    reason: str


def classify_read(md: LedgerMetadata, entry_id: int, outcome: Outcome[EntryRead]) -> str | None:
    """Why a read does not count as the entry being served, or None when it does."""
    if isinstance(outcome, ErrorStatus):
        return outcome.status.name
    if isinstance(outcome, NoAnswer):
        return outcome.reason.value
    try:
        head = _checked_header(md, outcome.value.body)
        ids = (head.ledger_id, head.entry_id)
    except DigestMismatchError:
        return "digest mismatch"
    except BookieProtocolError as exc:
        return f"undecodable entry: {exc}"
    if ids != (md.ledger_id, entry_id):
        return f"body is ledger {ids[0]} entry {ids[1]}"
    return None


@dataclass(frozen=True, slots=True)
class BadBookie:
    index: int
    bookie: str
    unavailable: bool
    failures: tuple[ReadFailure, ...] = ()


@dataclass(frozen=True, slots=True)
class BadFragment:
    fragment: Fragment
    bad: tuple[BadBookie, ...]
    #: The checks of this fragment, for evidence (what each bookie should hold).
    checks: tuple[BookieCheck, ...] = field(default=(), compare=False)


def evaluate(plan: LedgerPlan, failures: Mapping[int, Sequence[ReadFailure]]) -> list[BadFragment]:
    """The fragments with at least one bad bookie.

    `failures[k]` lists the failed reads of `plan.checks[k]` (absent or empty:
    every read succeeded).
    """
    by_fragment: dict[int, list[BadBookie]] = {}
    checks_of: dict[int, list[BookieCheck]] = {}
    for k, check in enumerate(plan.checks):
        seg = check.fragment.segment
        checks_of.setdefault(seg, []).append(check)
        if check.verdict is Verdict.UNAVAILABLE:
            by_fragment.setdefault(seg, []).append(BadBookie(check.index, check.bookie, True))
        elif check.verdict is Verdict.READ:
            failed = tuple(failures.get(k, ()))
            if failed:
                by_fragment.setdefault(seg, []).append(
                    BadBookie(check.index, check.bookie, False, failed)
                )
    return [
        BadFragment(f, tuple(by_fragment[f.segment]), tuple(checks_of[f.segment]))
        for f in plan.fragments
        if f.segment in by_fragment
    ]


def leave_held_alone(bad: Iterable[BadFragment], held: Set[str]) -> list[BadFragment]:
    """`bad` without the bookies in `held`, and without fragments left with no bad bookie.

    Held bookies are those whose lost-bookie delay is still running: they may
    only be restarting, so their fragments are not reported or marked until the
    delay has run out (upstream's fix for apache/bookkeeper#3817 does the same
    for bookies waiting for their audit).
    """
    if not held:
        return list(bad)
    kept: list[BadFragment] = []
    for frag in bad:
        rest = tuple(b for b in frag.bad if b.bookie not in held)
        if rest:
            kept.append(BadFragment(frag.fragment, rest, frag.checks))
    return kept


def bad_bookie_ids(bad: Iterable[BadFragment]) -> list[str]:
    """Every bad bookie once, in order of first appearance (the replicas to mark missing)."""
    seen: dict[str, None] = {}
    for frag in bad:
        for b in frag.bad:
            seen.setdefault(b.bookie, None)
    return list(seen)


def entry_ranges(entries: Iterable[int]) -> list[list[int]]:
    """Entry ids as sorted inclusive `[first, last]` ranges (for evidence)."""
    out: list[list[int]] = []
    for e in sorted(set(entries)):
        if out and out[-1][1] + 1 == e:
            out[-1][1] = e
        else:
            out.append([e, e])
    return out


def violation_detail(
    md: LedgerMetadata,
    znode_version: int,
    plan: LedgerPlan,
    bad: Sequence[BadFragment],
    *,
    lac: LacAnswer | None = None,
    reads: int = 0,
) -> dict[str, Any]:
    """JSON-ready evidence for `unreadable_fragments`."""
    frags: list[dict[str, Any]] = []
    for bf in bad:
        f = bf.fragment
        bookies: list[dict[str, Any]] = []
        for b in bf.bad:
            check = next((c for c in bf.checks if c.index == b.index), None)
            item: dict[str, Any] = {
                "index": b.index,
                "bookie": b.bookie,
                "first_stored": None if check is None else check.first_stored,
                "last_stored": None if check is None else check.last_stored,
            }
            if b.unavailable:
                item["reason"] = "unavailable"
                item["detail"] = "bookie is neither writable nor read-only"
            else:
                item["reason"] = "read_failed"
                reasons: dict[str, int] = {}
                for r in b.failures:
                    reasons[r.reason] = reasons.get(r.reason, 0) + 1
                item["failed_entries"] = entry_ranges(r.entry_id for r in b.failures)[:100]
                item["errors"] = dict(sorted(reasons.items()))
            bookies.append(item)
        frags.append(
            {
                "segment": f.segment,
                "first_entry": f.first,
                "last_entry": f.last,
                "ensemble": list(f.bookies),
                "bad_bookies": bookies,
            }
        )
    detail: dict[str, Any] = {
        "metadata_version": znode_version,
        "state": md.state.name,
        "ensemble_size": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "last_entry_id": md.last_entry_id,
        "bad_bookies": bad_bookie_ids(bad),
        "fragments": frags,
        "entries_read": reads,
    }
    if md.state is not LedgerState.CLOSED:
        detail["lac"] = plan.lac
        if lac is not None:
            detail["lac_answers"] = {"answered": lac.answered, "asked": lac.asked}
    return detail


def metadata_problem(md: LedgerMetadata) -> str | None:
    """A broken invariant the check cannot work with, or None.

    The decoder rejects all of these already; this guards metadata that reached
    the check some other way, so the arithmetic above never meets nonsense.
    """
    if not 1 <= md.ack_quorum <= md.write_quorum <= md.ensemble_size:
        return (
            f"need ensemble size >= write quorum >= ack quorum >= 1, got "
            f"{md.ensemble_size}/{md.write_quorum}/{md.ack_quorum}"
        )
    if not md.segments:
        return "no ensembles"
    previous = -1
    for k, seg in enumerate(md.segments):
        if seg.first_entry_id < 0 or (k > 0 and seg.first_entry_id <= previous):
            return f"ensemble {k} starts at entry {seg.first_entry_id}, after {previous}"
        if len(seg.bookies) != md.ensemble_size:
            return (
                f"ensemble at entry {seg.first_entry_id} has {len(seg.bookies)} bookies, "
                f"ensemble size is {md.ensemble_size}"
            )
        previous = seg.first_entry_id
    return None
