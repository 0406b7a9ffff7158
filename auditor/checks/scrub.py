"""BP-34 checks what bookies say they hold, from their index; a copy whose bytes rotted on
disk, an entry the index lists but the entry log lost, or two copies of one entry that differ
are found only when a reader needs them. The deep scrub reads every copy, and its judgement of
what came back must be the same for the driver, `explain` and the tests, so it is a pure
function here.

The deep scrub's verdict on one closed ledger, from what each bookie returned for each entry.

Per entry, each bookie of its write set (the round-robin schedule of its segment) was
asked for it with READ_ENTRY and returned one of:
- `Body`: the stored bytes. Verified with the ledger's digest type and password
  (`protocol.verify_entry_body`: CRC32, CRC32C, HMAC-SHA1); a digest that fails, a body
  too short for its header and digest, or a header naming another ledger or entry is a
  `corrupt_copy`. DUMMY has no digest: only the header check applies, and the copies
  are compared with each other.
- `ABSENT` (NoSuchEntry / NoSuchLedger): when the bookie's listing (its index) names the
  entry, the index has it but the store cannot return it: `unreadable_copy`. Otherwise
  the copy is missing, which is the replicas check's finding, not this one's: counted.
- `Failed`: the bookie answered with an error status (EIO and the like): it has the
  entry in hand and cannot return it: `unreadable_copy`.
- `Silent`: no answer (timeout, unreachable). Nothing is known; the driver looks again
  after a delay (BP-34), and a bookie still silent is the replicas check's business.

Copies whose digest passed are compared by payload: when they differ, the entry has
`divergent_copies`. Only the payload is compared, never the header's last-add-confirmed
or length: ledger recovery re-adds entries with its own LAC, so valid copies of one entry
legitimately differ there (their digests cover it and pass). The bookies reported are
those outside the largest group of equal copies, or all of them when no group is the
largest (nothing says which copy is right). Divergent copies are reported, never marked:
a worker could copy either one.

A ledger's findings are folded entry by entry (`LedgerScrub.add`), so a driver keeps no
body longer than one entry's judgement.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from auditor.bookie.availability import Availability
from auditor.bookie.protocol import (
    BookieProtocolError,
    Status,
    decode_entry_body,
    verify_entry_body,
)
from auditor.bookie.results import EntryRead, ErrorStatus, Ok, Outcome
from auditor.checks.findings import Category, Violation
from auditor.metadata.model import DigestType, LedgerMetadata
from auditor.metadata.schedule import write_set

__all__ = [
    "ABSENT",
    "EVIDENCE_LIMIT",
    "REPAIRABLE",
    "Absent",
    "Body",
    "Copy",
    "CopyFinding",
    "EntryVerdict",
    "Failed",
    "LedgerScrub",
    "Silent",
    "as_copy",
    "entry_ranges",
    "entry_write_sets",
    "judge_copy",
    "judge_entry",
    "scrub_ledger",
]

#: Entries (as ranges) and reasons a violation carries at most.
EVIDENCE_LIMIT: Final = 100


@dataclass(frozen=True, slots=True)
class Body:
    """The bookie returned these bytes for the entry."""

    data: bytes


class Absent(enum.Enum):
    """The bookie answered NoSuchEntry (or NoSuchLedger)."""

    ABSENT = "absent"


ABSENT: Final = Absent.ABSENT


@dataclass(frozen=True, slots=True)
class Failed:
    """The bookie answered with an error status other than "no such entry"."""

    reason: str


@dataclass(frozen=True, slots=True)
class Silent:
    """No answer came (timeout, unreachable, disconnected)."""

    reason: str


Copy = Body | Absent | Failed | Silent

_ABSENT_STATUSES: Final = frozenset({Status.ENOENTRY, Status.ENOLEDGER})


def as_copy(out: Outcome[EntryRead] | Outcome[bytes]) -> Copy:
    """What a READ_ENTRY came to, as the judge takes it: the scrub and the replication
    worker's re-verification (`worker/reverify.py`) must read an answer the same way.
    Only EIO is the bookie failing on an entry it has; any other error status (a
    throttle, an authorisation refusal) says nothing about the copy, like no answer.
    (`read_entry` answers an `EntryRead`; `start_read_entry`, the body alone.)"""
    if isinstance(out, Ok):
        value = out.value
        return Body(value if isinstance(value, bytes) else value.body)
    if isinstance(out, ErrorStatus):
        if out.status in _ABSENT_STATUSES:
            return ABSENT
        if out.status is Status.EIO:
            return Failed(str(out))
    return Silent(str(out))


@dataclass(frozen=True, slots=True)
class CopyFinding:
    """One copy of one entry found bad: on which bookie, in which category, why."""

    ledger_id: int
    entry_id: int
    bookie: str
    category: Category
    reason: str


@dataclass(frozen=True, slots=True)
class EntryVerdict:
    """One entry's judgement."""

    entry_id: int
    findings: tuple[CopyFinding, ...] = ()
    #: Bookies whose copy passed its digest (all of them for DUMMY with a sound header).
    verified: tuple[str, ...] = ()
    #: Payload bytes of the verified copies.
    bytes_verified: int = 0
    #: Bookies that answered "no such entry" without listing it (missing: the replicas
    #: check's finding).
    absent: tuple[str, ...] = ()
    #: Bookies that did not answer, with why.
    silent: Mapping[str, str] = field(default_factory=dict)


def entry_write_sets(md: LedgerMetadata) -> Iterator[tuple[int, tuple[str, ...]]]:
    """Every entry of a closed ledger with the bookies that must hold it, in entry order."""
    e, w = md.ensemble_size, md.write_quorum
    for seg in md.segment_ranges():
        for entry in range(seg.first, seg.last + 1):
            yield entry, tuple(seg.bookies[i] for i in write_set(entry, e, w))


def _body_fault(
    ledger_id: int, entry_id: int, data: bytes, digest_type: DigestType, password: bytes
) -> tuple[str | None, bytes]:
    """Why a returned body is not a sound copy of the entry (None: it is), and its payload."""
    try:
        if digest_type is DigestType.DUMMY:
            body = decode_entry_body(data, digest_type)
        else:
            body = verify_entry_body(data, digest_type, password)
    except BookieProtocolError as exc:
        return str(exc), b""
    if (body.ledger_id, body.entry_id) != (ledger_id, entry_id):
        return f"body is of ledger {body.ledger_id} entry {body.entry_id}", body.payload
    return None, body.payload


def judge_copy(
    ledger_id: int,
    entry_id: int,
    bookie: str,
    copy: Copy,
    digest_type: DigestType,
    password: bytes = b"",
    listing: Availability | None = None,
) -> CopyFinding | Body | Absent | Silent:
    """One copy's judgement: a finding (corrupt or unreadable), `Body` of the sound copy's
    payload, `ABSENT` (a missing copy: not listed, or no listing), or `Silent`.

    The deep scrub judges each copy of an entry with it (`judge_entry`), and the worker's
    re-verification of one bookie's copies (`worker/reverify.py`) calls it alone: one
    judgement of a copy for both, and no per-entry verdict built where one copy is read.
    """
    if isinstance(copy, Body):
        fault, payload = _body_fault(ledger_id, entry_id, copy.data, digest_type, password)
        if fault is None:
            return Body(payload)
        return CopyFinding(ledger_id, entry_id, bookie, Category.CORRUPT_COPY, fault)
    if copy is ABSENT:
        if listing is not None and listing.contains(entry_id):
            return CopyFinding(
                ledger_id,
                entry_id,
                bookie,
                Category.UNREADABLE_COPY,
                "listed by the bookie, but read as no such entry",
            )
        return ABSENT
    if isinstance(copy, Failed):
        return CopyFinding(ledger_id, entry_id, bookie, Category.UNREADABLE_COPY, copy.reason)
    return copy


def judge_entry(
    ledger_id: int,
    entry_id: int,
    copies: Mapping[str, Copy],
    digest_type: DigestType,
    password: bytes = b"",
    listings: Mapping[str, Availability] | None = None,
) -> EntryVerdict:
    """The verdict on one entry from what each bookie of its write set returned.

    `listings`: what the bookies that could list said they hold (a bookie not in it
    could not list, or was not asked: its "no such entry" is a missing copy).
    """
    findings: list[CopyFinding] = []
    payloads: dict[str, bytes] = {}
    absent: list[str] = []
    silent: dict[str, str] = {}
    for bookie in sorted(copies):
        listing = None if listings is None else listings.get(bookie)
        judged = judge_copy(
            ledger_id, entry_id, bookie, copies[bookie], digest_type, password, listing
        )
        if isinstance(judged, Body):
            payloads[bookie] = judged.data
        elif isinstance(judged, CopyFinding):
            findings.append(judged)
        elif judged is ABSENT:
            absent.append(bookie)
        elif isinstance(judged, Silent):
            silent[bookie] = judged.reason
    findings.extend(_divergent(ledger_id, entry_id, payloads))
    return EntryVerdict(
        entry_id,
        tuple(findings),
        tuple(payloads),
        sum(len(p) for p in payloads.values()),
        tuple(absent),
        silent,
    )


def _divergent(ledger_id: int, entry_id: int, payloads: Mapping[str, bytes]) -> list[CopyFinding]:
    """`divergent_copies` of the sound copies: the bookies outside the one largest group of
    equal payloads (all of them when there is no one largest)."""
    if len(payloads) < 2:
        return []
    # The common case, every copy alike, by comparison (memcmp) alone: grouping hashes
    # every payload, a pass over each body as long as its digest check (64 KiB entries).
    first, *others = payloads.values()
    if all(p == first for p in others):
        return []
    groups: dict[bytes, list[str]] = {}
    for bookie, payload in payloads.items():
        groups.setdefault(payload, []).append(bookie)
    if len(groups) < 2:
        return []
    ranked = sorted(groups.values(), key=len, reverse=True)
    majority = ranked[0] if len(ranked[0]) > len(ranked[1]) else []
    described = "; ".join(
        f"{', '.join(g)}: {len(p)} bytes" for p, g in sorted(groups.items(), key=lambda i: i[1])
    )
    return [
        CopyFinding(
            ledger_id,
            entry_id,
            bookie,
            Category.DIVERGENT_COPIES,
            f"payloads differ ({len(groups)} versions: {described})",
        )
        for bookie in sorted(payloads)
        if bookie not in majority
    ]


#: The categories a copy is marked under-replicated for (replaced by the worker).
REPAIRABLE: Final = frozenset({Category.CORRUPT_COPY, Category.UNREADABLE_COPY})


@dataclass(slots=True)
class _Bad:
    """One (category, bookie)'s bad copies in a ledger: how many, and the smallest
    `EVIDENCE_LIMIT` entries with their reasons (entries may come in any order)."""

    count: int = 0
    kept: dict[int, str] = field(default_factory=dict)

    def add(self, entry: int, reason: str) -> None:
        self.count += 1
        self.kept[entry] = reason
        if len(self.kept) >= 2 * EVIDENCE_LIMIT:
            self.kept = dict(sorted(self.kept.items())[:EVIDENCE_LIMIT])

    def evidence(self) -> tuple[list[list[int]], dict[str, str]]:
        """The smallest entries kept, as inclusive ranges, and their reasons."""
        entries = sorted(self.kept)[:EVIDENCE_LIMIT]
        return entry_ranges(entries), {str(e): self.kept[e] for e in entries}


def entry_ranges(entries: list[int]) -> list[list[int]]:
    """Sorted entry ids as inclusive `[first, last]` runs: what a finding's evidence and
    `explain --scrub` show."""
    ranges: list[list[int]] = []
    for e in entries:
        if ranges and ranges[-1][1] == e - 1:
            ranges[-1][1] = e
        else:
            ranges.append([e, e])
    return ranges


@dataclass(slots=True)
class LedgerScrub:
    """A ledger's verdict, folded entry by entry (in any order)."""

    ledger_id: int
    entries: int = 0
    copies_verified: int = 0
    bytes_verified: int = 0
    copies_absent: int = 0
    #: Bookie -> why it did not answer (the last reason seen).
    silent: dict[str, str] = field(default_factory=dict)
    copies_silent: int = 0
    _bad: dict[tuple[Category, str], _Bad] = field(default_factory=dict)

    def add(self, verdict: EntryVerdict) -> None:
        self.entries += 1
        self.copies_verified += len(verdict.verified)
        self.bytes_verified += verdict.bytes_verified
        self.copies_absent += len(verdict.absent)
        self.copies_silent += len(verdict.silent)
        self.silent.update(verdict.silent)
        for f in verdict.findings:
            bad = self._bad.get((f.category, f.bookie))
            if bad is None:
                bad = self._bad[f.category, f.bookie] = _Bad()
            bad.add(f.entry_id, f.reason)

    @property
    def found(self) -> bool:
        return bool(self._bad)

    def bad_copies(self) -> dict[tuple[str, str], int]:
        """(category, bookie) -> bad copies, for tests and summaries."""
        return {(str(c), b): bad.count for (c, b), bad in sorted(self._bad.items())}

    def to_mark(self) -> list[str]:
        """The bookies whose corrupt or unreadable copies are to be replaced."""
        return sorted({b for c, b in self._bad if c in REPAIRABLE})

    def violations(self, md: LedgerMetadata, version: int) -> list[Violation]:
        """One violation per (category, bookie), in category then bookie order."""
        out: list[Violation] = []
        for (category, bookie), bad in sorted(self._bad.items()):
            ranges, reasons = bad.evidence()
            detail: dict[str, Any] = {
                "entries": ranges,
                "count": bad.count,
                "reasons": reasons,
                "digest_type": None if md.digest_type is None else md.digest_type.name,
                "metadata_version": version,
            }
            out.append(Violation(md.ledger_id, category, bookie, detail))
        return out


def scrub_ledger(
    md: LedgerMetadata,
    copies: Mapping[int, Mapping[str, Copy]],
    digest_type: DigestType,
    password: bytes = b"",
    listings: Mapping[str, Availability] | None = None,
) -> LedgerScrub:
    """A whole ledger at once: `copies[entry][bookie]` for each entry and bookie of its
    write set (a bookie left out is taken as silent: "not asked")."""
    out = LedgerScrub(md.ledger_id)
    for entry, bookies in entry_write_sets(md):
        given = copies.get(entry, {})
        asked: dict[str, Copy] = {b: given.get(b, _NOT_ASKED) for b in bookies}
        out.add(judge_entry(md.ledger_id, entry, asked, digest_type, password, listings))
    return out


_NOT_ASKED: Final = Silent("not asked")
