"""A mark names a bookie whose copies are bad, and a bookie that lists every entry it should
hold may still hold them rotten (the deep scrub's marks: a corrupt or unreadable copy is
listed like a sound one). Planning from listings alone would call such a ledger whole and
unmark it with the bad copy still there, so before a marked ledger is called whole the
worker reads the named bookie's copies and judges them as the scrub does.

Re-verifying one bookie's copies of one ledger: read each entry it should hold, judge it.

* **What is read.** Every entry the bookie's positions store under round robin, in every
  segment whose range is known (all of a closed ledger's; all but the last of one that
  is not closed, whose tail may still be written), with a plain READ_ENTRY (never
  fencing). Only that bookie is read: the other copies are read by the copy, which
  verifies each one and skips a bad source for another.
* **How it is judged.** By the deep scrub's own judgement of a copy (`checks/scrub.
  judge_copy`, `as_copy`), with the ledger's digest type and password (BookKeeper's `digestType`
  and `passwd` when the metadata names none, as the copy reads it): a body whose digest
  or ids fail is `corrupt_copy`; EIO, or "no such entry" for an entry the bookie lists,
  is `unreadable_copy`. "No such entry" for an entry it does not list is a missing copy
  (it went since the listing): `missing_entries`. Every such segment needs a new bookie.
* **Silence is not health.** A read with no answer (timeout, connection lost, a
  throttle) stops the re-verification at once: nothing more is read, and the caller
  keeps the mark and retries after the failed-ledger delay. Calling the copies sound on
  a silent bookie would unmark the very ledger the mark is about.
* **Bounded.** At most `window` reads are in flight (the worker's
  `rereplicationEntryBatchSize`, the bound a copy keeps on one bookie) and each has the
  bookie client's `readEntryTimeout`, so one bookie's share of one ledger costs at most
  ceil(entries / window) timeouts, and the first silent read ends it. The share is what
  the copy would read anyway were the bookie replaced, and it is read once per take of a
  mark that would otherwise be removed: cheap next to a wrong unmark. The reads are
  driven by their answers (`start_read_entry`), as the copy's are: no task or future
  per entry, since a ledger's share may be tens of thousands of entries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

from auditor.bookie.availability import Availability
from auditor.bookie.client import BookieClient
from auditor.bookie.results import Outcome
from auditor.checks.findings import Category
from auditor.checks.scrub import Body, CopyFinding, Silent, as_copy, judge_copy
from auditor.metadata.model import DigestType, LedgerMetadata
from auditor.worker.copy import stored_entries
from auditor.worker.plan import CORRUPT_COPY, MISSING_ENTRIES, UNREADABLE_COPY

__all__ = ["BadSegment", "Reverified", "reverify_bookie"]

#: Bad entries and reasons kept per segment for the logs (the count is exact).
EVIDENCE_KEPT = 10


@dataclass(slots=True)
class BadSegment:
    """One segment in which the bookie's copy must be replaced, and why."""

    segment_index: int
    #: Position of the bookie in the segment's ensemble.
    bookie_index: int
    #: Bad copies found, by reason (`corrupt_copy`, `unreadable_copy`, `missing_entries`).
    counts: dict[str, int] = field(default_factory=dict)
    #: The first bad entries found with why (at most `EVIDENCE_KEPT`).
    evidence: dict[int, str] = field(default_factory=dict)

    @property
    def why(self) -> str:
        """The reason the bookie is replaced: corrupt before unreadable before missing."""
        for reason in (CORRUPT_COPY, UNREADABLE_COPY, MISSING_ENTRIES):
            if self.counts.get(reason):
                return reason
        return MISSING_ENTRIES

    def add(self, entry: int, reason: str, detail: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if len(self.evidence) < EVIDENCE_KEPT:
            self.evidence[entry] = detail


@dataclass(slots=True)
class Reverified:
    """What re-reading one bookie's share of one ledger found."""

    bookie: str
    #: Segments whose copy on the bookie is bad, by segment index.
    bad: dict[int, BadSegment] = field(default_factory=dict)
    #: Entries read and found sound.
    sound: int = 0
    #: Why the bookie stopped answering (None: every read was answered).
    silent: str | None = None


def _duties(md: LedgerMetadata, bookie: str) -> Iterator[tuple[int, int, int]]:
    """(segment index, position, entry) for every entry `bookie` must hold whose segment
    has a known end, in segment then entry order."""
    segments = list(md.segment_ranges())
    known = len(segments) if md.closed else len(segments) - 1
    e, w = md.ensemble_size, md.write_quorum
    for k in range(known):
        seg = segments[k]
        if bookie not in seg.bookies:
            continue
        i = seg.bookies.index(bookie)
        for entry in stored_entries(seg.first, seg.last, e, w, i):
            yield k, i, entry


async def reverify_bookie(
    client: BookieClient,
    md: LedgerMetadata,
    bookie: str,
    *,
    listing: Availability | None,
    digest_type: DigestType,
    password: bytes,
    window: int,
    read_timeout: float,
) -> Reverified:
    """Reads and judges every entry `bookie` must hold of `md` (see the module).

    `listing` is what the bookie listed of the ledger (None: it could not list), so
    that "no such entry" for a listed entry is told from a missing one."""
    run = _Run(client, md, bookie, listing, digest_type, password, max(1, window), read_timeout)
    try:
        run.fill()
        if run.in_flight:
            await run.done
    finally:
        run.stopped = True  # cancelled: no read is sent after this
    return run.out


class _Run:
    """One re-verification's sliding window, driven by the answers (`start_read_entry`:
    no task or future per read, as the copy reads; the whole ledger's share is read)."""

    def __init__(
        self,
        client: BookieClient,
        md: LedgerMetadata,
        bookie: str,
        listing: Availability | None,
        digest_type: DigestType,
        password: bytes,
        window: int,
        read_timeout: float,
    ) -> None:
        self.client = client
        self.lid = md.ledger_id
        self.bookie = bookie
        self.listing = listing
        self.digest_type = digest_type
        self.password = password
        self.window = window
        self.read_timeout = read_timeout
        self.duties = _duties(md, bookie)
        self.out = Reverified(bookie)
        self.in_flight = 0
        self.stopped = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def fill(self) -> None:
        """Sends reads until `window` are in flight or none is left to send."""
        while self.in_flight < self.window and not self.stopped:
            duty = next(self.duties, None)
            if duty is None:
                return
            self.in_flight += 1
            self.client.start_read_entry(
                self.bookie,
                self.lid,
                duty[2],
                partial(self._answered, duty),
                request_timeout=self.read_timeout,
            )

    def _answered(self, duty: tuple[int, int, int], answer: Outcome[bytes]) -> None:
        self.in_flight -= 1
        try:
            self._judge(duty, answer)
            self.fill()
        except Exception as exc:  # a callback must not raise: the awaiting caller does
            self.stopped = True
            if not self.done.done():
                self.done.set_exception(exc)
            return
        if self.in_flight == 0 and not self.done.done():
            self.done.set_result(None)

    def _judge(self, duty: tuple[int, int, int], answer: Outcome[bytes]) -> None:
        if self.stopped:
            return
        k, i, entry = duty
        out = self.out
        judged = judge_copy(
            self.lid,
            entry,
            self.bookie,
            as_copy(answer),
            self.digest_type,
            self.password,
            self.listing,
        )
        if isinstance(judged, Body):
            out.sound += 1
            return
        if isinstance(judged, Silent):
            out.silent = f"entry {entry}: {judged.reason}"
            self.stopped = True
            return
        bad = out.bad.get(k)
        if bad is None:
            bad = out.bad[k] = BadSegment(k, i)
        if isinstance(judged, CopyFinding):
            why = CORRUPT_COPY if judged.category is Category.CORRUPT_COPY else UNREADABLE_COPY
            bad.add(entry, why, judged.reason)
        else:  # absent and not listed: gone since the listing
            bad.add(entry, MISSING_ENTRIES, "no such entry, not listed")
