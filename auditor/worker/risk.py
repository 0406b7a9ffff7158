"""A worker that takes marks in a shuffled order (Java's) may copy a hundred ledgers that
lost one copy of three while a ledger down to its last copy waits; one more failure then
loses data that was one repair away from safety.

Which marked ledger the worker takes first: the pure ranking of the queue by risk.

Among the ledgers a worker could take, it takes first the one whose worst entry has the
fewest readable copies left, then the one whose copies span the fewest racks, then the
oldest mark.

The rank is computed from what the worker reads anyway, never from bookie answers:

* **Copies left**: the fewest copies any entry of the ledger still has. Round robin gives
  entry `e` of a segment the write set `ensemble[(e + i) % E]` for `i < W`, so a segment
  has at most E distinct write sets (fewer when it holds fewer than E entries) and the
  work per ledger is segments x E x W, whatever its number of entries. A copy is gone when
  its bookie is in the mark's missing-replica list (the auditor's finding: a bookie
  registered again may still lack the entries) or is not in the registry (lost, even if
  the mark predates the loss). The last segment of a ledger that is not closed counts
  with all E write sets: its entries are being written, and are as exposed as any.
* **Racks left**: the fewest racks the surviving copies of any entry span (a separate
  minimum: an entry with three copies in one rack is one rack failure from loss even if
  another entry has two copies in two racks). Bookies no rack source knows share the
  default rack, as the placement policy sees them. Without a rack source this is not
  known and does not order anything.
* **Marked at**: the mark's own ctime field, which BookKeeper's marking refreshes when it
  adds a missing bookie, i.e. when the ledger's risk last grew; else the znode's ctime
  (Java with `storeSystemTimeAsLedgerUnderreplicatedMarkTime=false`); else (etcd keeps no
  times) when this worker first saw the mark.

A mark with no missing-replica list (a placement mark, a mark whose bookies came back,
a mark whose data does not decode) is ranked by the registry alone: with no bookie of its
ledger lost it has all its copies, and waits behind every ledger known to have lost one.
Nothing is known to be at risk there, and the worker re-checks it all the same when it
comes. A mark whose ledger has no metadata (deleted) or metadata that does not decode is
`unknown` and comes last: a deleted ledger only needs its mark removed, and an undecodable
one cannot be repaired by any worker.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from auditor.metadata.model import LedgerMetadata
from auditor.topology.locations import DEFAULT_RACK

#: The `copies_left` label values: 0, 1, 2, then 3 or more, and unknown (no metadata).
BUCKETS = ("0", "1", "2", "3+", "unknown")
#: Where a rank that is not known sorts: after every known one.
_LAST = sys.maxsize


@dataclass(frozen=True, slots=True)
class LedgerShape:
    """What the rank needs of a ledger's metadata: its distinct write sets.

    Kept per marked ledger instead of the metadata (a few tuples, shared between
    ledgers with the same ensembles), so that a change of the registry or of the racks
    re-ranks every mark without reading any ledger again."""

    write_sets: tuple[tuple[str, ...], ...]
    #: The copies an entry has when none is lost (a ledger with no entry has nothing
    #: to lose: it ranks as whole).
    write_quorum: int

    def bookies(self) -> set[str]:
        return {b for ws in self.write_sets for b in ws}


def shape_of(md: LedgerMetadata) -> LedgerShape:
    """The distinct write sets of every entry the ledger holds or may hold."""
    sets: dict[tuple[str, ...], None] = {}
    ranges = list(md.segment_ranges())
    for k, seg in enumerate(ranges):
        size = len(seg.bookies)
        if not size:
            continue
        wq = max(1, min(md.write_quorum, size))
        if not md.closed and k == len(ranges) - 1:
            residues: Iterable[int] = range(size)  # the open tail: any entry may come
        elif seg.empty:
            continue
        elif seg.last - seg.first + 1 >= size:
            residues = range(size)
        else:
            residues = sorted({(seg.first + i) % size for i in range(seg.last - seg.first + 1)})
        for r in residues:
            sets[tuple(seg.bookies[(r + i) % size] for i in range(wq))] = None
    return LedgerShape(tuple(sets), max(1, md.write_quorum))


@dataclass(frozen=True, slots=True)
class Risk:
    """One marked ledger's place in the take order (lower `key` first)."""

    #: The fewest copies an entry has left; None when the ledger's metadata is unknown.
    copies_left: int | None
    #: The fewest racks an entry's copies span; None without rack information.
    racks_left: int | None
    #: Unix seconds (see the module docstring).
    marked_at: float

    @property
    def key(self) -> tuple[int, int, float]:
        copies = _LAST if self.copies_left is None else self.copies_left
        racks = _LAST if self.racks_left is None else self.racks_left
        return (copies, racks, self.marked_at)

    @property
    def bucket(self) -> str:
        """The `copies_left` label: "0", "1", "2", "3+" or "unknown"."""
        if self.copies_left is None:
            return "unknown"
        return str(self.copies_left) if self.copies_left < 3 else "3+"


def rank(
    shape: LedgerShape | None,
    missing: Set[str],
    marked_at: float,
    *,
    available: Set[str] | None,
    locations: Mapping[str, str] | None,
) -> Risk:
    """A marked ledger's risk.

    `missing` are the mark's replicas; `available` the registered bookies (writable or
    read-only; None when the registry was not read: only the mark counts); `locations`
    the racks of bookies (None without a rack source; a bookie absent from it is in the
    default rack)."""
    if shape is None:
        return Risk(None, None, marked_at)
    copies = shape.write_quorum
    racks: int | None = None
    for ws in shape.write_sets:
        alive = [b for b in ws if b not in missing and (available is None or b in available)]
        copies = min(copies, len(alive))
        if locations is not None:
            spread = len({locations.get(b, DEFAULT_RACK) for b in alive})
            racks = spread if racks is None else min(racks, spread)
    if locations is not None and racks is None:
        racks = copies  # no entry: as many racks as copies, nothing to order by
    return Risk(copies, racks, marked_at)


@dataclass(frozen=True, slots=True)
class QueuedLedger:
    """A marked ledger near the head of the take order."""

    ledger_id: int
    risk: Risk
    #: Its lock is held (by this worker, another, Java's, or a bookie's GC).
    in_flight: bool


@dataclass(frozen=True, slots=True)
class QueueRisk:
    """The marked ledgers by risk, as this worker last ranked them (`status`, metrics)."""

    #: When the ranking was made (Unix seconds).
    ranked_at: float
    #: Marked ledgers per `copies_left` bucket, every bucket present.
    by_copies: Mapping[str, int]
    #: Per bucket, when its oldest mark was made (absent for an empty bucket).
    oldest: Mapping[str, float]
    #: The next ledgers in take order, locked ones included (they are taken by then).
    head: tuple[QueuedLedger, ...]

    @property
    def total(self) -> int:
        return sum(self.by_copies.values())


def summarize(risks: Mapping[int, Risk], head: Sequence[tuple[int, bool]], now: float) -> QueueRisk:
    """`QueueRisk` of these ranks; `head` is (ledger id, locked) in take order."""
    counts = dict.fromkeys(BUCKETS, 0)
    oldest: dict[str, float] = {}
    for r in risks.values():
        b = r.bucket
        counts[b] += 1
        if b not in oldest or r.marked_at < oldest[b]:
            oldest[b] = r.marked_at
    queued = tuple(QueuedLedger(lid, risks[lid], locked) for lid, locked in head if lid in risks)
    return QueueRisk(now, counts, oldest, queued)
