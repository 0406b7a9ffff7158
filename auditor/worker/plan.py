"""The daemon's worker, the `recover` command and the Spark job must agree on which ensemble
positions are bad, and a ledger the worker calls repaired must be one the replicas check
calls clean.

What to repair in one ledger, and what must wait for fencing: the worker's pure plan.

The decision is one pure function of the metadata, the bookie registry and the
bookies' answers (`plan_ledger`), and reuses the replicas check's own analysis
(`checks/replicas.analyse`) rather than a second reading of the answers.

A position of a segment is bad when its bookie is

* **lost**: not registered, neither writable nor read-only. A read-only bookie
  still serves reads, so it is not lost (BookKeeper's checker says the same;
  upstream's open-ledger test counts it as missing and fences a live ledger,
  spec §1.7 quirk, which we do not copy);
* **requested**: the caller asks to move it (`recover BOOKIE` of a live bookie);
* **missing_entries**: registered, and the replicas analysis found entries of
  this segment it must hold and lacks. Any bookie, named in the mark or not:
  upstream's worker re-checks the whole ledger and ignores the mark's list
  (spec §1.5), and a copy we know is missing is a copy to make now.

A registered bookie we could not learn about is *unknown*, never bad: one that
did not answer, or one named in the mark whose state cannot be listed or probed
(the mark says it is suspect; only evidence may clear it). Unknown bookies are
listed so that the worker keeps the mark and tries again later. A bookie not in
the mark that cannot be listed is counted as holding its entries, as the
replicas check counts it.

Open ledgers (spec §1.6 step 1, §1.7, §1.9). The last segment of a ledger that is
not closed has no known end and may still be written: its bad positions go to
`open_tail` and are never copied before the ledger is fenced and recovered.
Every earlier segment is treated as closed. A writer adds a segment at its
last-add-confirmed + 1 (or replaces the last ensemble in place while that is
still empty), so every entry of an earlier segment was acknowledged before the
segment after it existed, and the metadata gives its exact range. Upstream's
extra rule (PR #3917: an earlier segment is "not closed" while the handle's LAC
is below the last segment's start) exists because its copier reads through a
ledger handle that refuses entries above the LAC it read from the bookies; our
copier reads each entry straight from the bookies that hold it, so that limit
does not apply and a lost bookie in an earlier segment is repaired at once.

Placement (`not_adhering_segments`, `placement_repairs`). With BookKeeper's
`repairedPlacementPolicyNotAdheringBookieEnabled`, a closed ledger whose data is
whole may still have segments whose ensemble fails the placement policy; upstream's
worker (`getNeedRepairedPlacementNotAdheringFragments`, spec §1.5 (b)) takes every
such segment of a closed ledger, and none of a ledger that is not closed. The copies
of the positions chosen to move (`worker/targets.choose_adhering_moves`) are
planned like any other repair, with `why` `NOT_ADHERING`: the bookie there now is
healthy and the first source.

Entry ranges are computed per run of the round-robin schedule, never per entry.
A position holds its runs of W consecutive entries every E entries, so for
E == W a segment is one range, and for E > W only the entries the position
holds are listed (upstream copies the contiguous span, spec §6 item 4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from auditor.checks.ledger_check import metadata_problem
from auditor.checks.placement import Adherence, PlacementPolicy
from auditor.checks.replicas import BookieAnswer, Verified, analyse
from auditor.metadata.model import INVALID_ENTRY_ID, LedgerMetadata
from auditor.metadata.schedule import first_stored, run_offset

#: `Repair.why`: the bookie is neither writable nor read-only.
LOST = "lost"
#: `Repair.why`: the caller asked for the bookie to be replaced.
REQUESTED = "requested"
#: `Repair.why`: registered, but lacks entries of the segment it must hold.
MISSING_ENTRIES = "missing_entries"
#: `Repair.why`: healthy, moved so that the segment adheres to the placement policy.
NOT_ADHERING = "not_adhering"
#: `Repair.why`: registered and listing its share, but a copy read back fails its digest
#: or ids (`worker/reverify.py`; the deep scrub's category of the same name).
CORRUPT_COPY = "corrupt_copy"
#: `Repair.why`: registered and listing its share, but a listed copy cannot be read (EIO,
#: or "no such entry" for an entry it lists).
UNREADABLE_COPY = "unreadable_copy"


@dataclass(frozen=True, slots=True)
class Repair:
    """One ensemble position to give a new bookie, and what the new bookie must hold.

    `last_entry < first_entry` is an empty segment. In `LedgerPlan.open_tail` the
    segment's end is not known yet: `last_entry` is -1 and `entries` is empty.
    """

    #: Index into `metadata.segments`.
    segment_index: int
    #: The segment's entry range (inclusive).
    first_entry: int
    last_entry: int
    #: The ensemble position to replace, and the bookie there now.
    bookie_index: int
    old: str
    #: Inclusive ranges this position holds under round robin: what the copier
    #: copies; () when it holds nothing (a metadata-only swap, as upstream does).
    entries: tuple[tuple[int, int], ...]
    #: Registered members of the segment that may hold some of those entries, best
    #: first: healthy, then unknown, then those that are bad themselves but still
    #: hold part of their share (only they may hold an entry another bad position
    #: also lost). Lost bookies are never listed; a `REQUESTED` bookie comes last.
    sources: tuple[str, ...]
    #: `LOST`, `REQUESTED`, `MISSING_ENTRIES`, `NOT_ADHERING`, `CORRUPT_COPY` or
    #: `UNREADABLE_COPY`.
    why: str

    @property
    def entry_count(self) -> int:
        return sum(last - first + 1 for first, last in self.entries)


@dataclass(frozen=True, slots=True)
class LedgerPlan:
    """Everything one ledger needs, from one reading of metadata and answers."""

    #: Positions of closed segments: safe to copy now. Ordered by segment, then position.
    repairs: tuple[Repair, ...]
    #: Positions in the last segment of a ledger that is not closed: never copied
    #: before the ledger is fenced and recovered (or the writer replaces them).
    open_tail: tuple[Repair, ...]
    #: Why nothing could be planned (metadata the schedule cannot work with), else None.
    skipped: str | None
    #: Registered bookies whose holdings could not be learnt: the plan may be
    #: incomplete, and the mark must stay until they answer.
    unknown: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        """Nothing to repair, nothing waiting, nothing unknown: the mark may go."""
        return self.skipped is None and not (self.repairs or self.open_tail or self.unknown)


def stored_ranges(
    first: int, last: int, ensemble_size: int, write_quorum: int, index: int
) -> tuple[tuple[int, int], ...]:
    """The entries of `[first, last]` stored at `index`, as inclusive ranges in order.

    One range per run of the round-robin schedule (W consecutive entries every E),
    clipped to the segment; a single range when E == W.
    """
    start = first_stored(first, last, ensemble_size, write_quorum, index)
    if start is None:
        return ()
    if write_quorum >= ensemble_size:
        return ((first, last),)
    # The run holding `start` begins where (run - offset) mod E == 0.
    run = start - (start - run_offset(ensemble_size, write_quorum, index)) % ensemble_size
    starts = range(run, last + 1, ensemble_size)
    ends = range(
        run + write_quorum - 1, run + write_quorum - 1 + len(starts) * ensemble_size, ensemble_size
    )
    out = list(zip(starts, ends, strict=True))
    out[0] = (max(out[0][0], first), out[0][1])
    out[-1] = (out[-1][0], min(out[-1][1], last))
    return tuple(out)


def _may_share(i: int, j: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether positions `i` and `j` are ever in one write set (they can hold the same entry)."""
    d = (j - i) % ensemble_size
    return d < write_quorum or ensemble_size - d < write_quorum


def plan_ledger(
    md: LedgerMetadata,
    *,
    registered: Set[str],
    answers: Mapping[str, BookieAnswer] | None,
    mark_replicas: Sequence[str] = (),
    replace: Set[str] = frozenset(),
) -> LedgerPlan:
    """The repairs one ledger needs now, those waiting for fencing, and what is unknown.

    `registered` is every writable or read-only bookie. `answers` are the bookies'
    answers about this ledger as the replicas check gathers them
    (`checks/replicas_run.bookie_answers`); None plans from the registry alone
    (nothing is judged missing or unknown). `mark_replicas` are the bookies the
    mark names. `replace` are bookies to move even though registered (`recover`).
    """
    problem = metadata_problem(md)
    if problem is not None:
        return LedgerPlan((), (), problem)
    closed = md.closed
    # Not closed: the last segment has no known end (decoded metadata says -1 already;
    # forcing it keeps anything else from judging a segment still being written).
    judged = md if closed else dataclasses.replace(md, last_entry_id=INVALID_ENTRY_ID)
    lacking: set[tuple[int, str]] = set()
    unknown: set[str] = set()
    if answers is not None:
        verdict = analyse(judged, answers)
        lacking = {(m.segment_first, m.bookie) for m in verdict.missing}
        suspects = set(mark_replicas)
        # Silent bookies (no answer, or not asked), and suspects nothing could be learnt of.
        unlearnt = set(verdict.unanswered) | {
            bookie
            for bookie, how in verdict.verified.items()
            if how is Verified.UNVERIFIED and bookie in suspects
        }
        unknown = {b for b in unlearnt if b in registered and b not in replace}
    e, w = md.ensemble_size, md.write_quorum
    last_index = len(md.segments) - 1
    repairs: list[Repair] = []
    tail: list[Repair] = []
    for k, seg in enumerate(judged.segment_ranges()):
        open_segment = not closed and k == last_index
        bad: dict[int, str] = {}
        for i, bookie in enumerate(seg.bookies):
            if bookie not in registered:
                bad[i] = LOST
            elif bookie in replace:
                bad[i] = REQUESTED
            elif not open_segment and (seg.first, bookie) in lacking:
                bad[i] = MISSING_ENTRIES
        for i, why in bad.items():
            old = seg.bookies[i]
            ranked: list[tuple[int, int, str]] = []
            for j, other in enumerate(seg.bookies):
                if j == i or other == old or other not in registered:
                    continue
                if not _may_share(i, j, e, w):
                    continue
                rank = 2 if j in bad else 1 if other in unknown else 0
                ranked.append((rank, j, other))
            sources = tuple(dict.fromkeys(b for _, _, b in sorted(ranked)))
            if why == REQUESTED:
                # A live bookie being emptied still holds its share: a source of last
                # resort (the only one for write quorum 1).
                sources = (*[b for b in sources if b != old], old)
            if open_segment:
                tail.append(Repair(k, seg.first, INVALID_ENTRY_ID, i, old, (), sources, why))
            else:
                entries = stored_ranges(seg.first, seg.last, e, w, i)
                repairs.append(Repair(k, seg.first, seg.last, i, old, entries, sources, why))
    return LedgerPlan(tuple(repairs), tuple(tail), None, tuple(sorted(unknown)))


def not_adhering_segments(
    md: LedgerMetadata, policy: PlacementPolicy, locations: Mapping[str, str]
) -> tuple[int, ...]:
    """Indexes of the segments whose ensemble fails `policy`: those a placement repair
    moves copies of. Only a closed ledger has any: an open ledger's last ensemble may
    still change, and upstream's worker skips it too."""
    if not md.closed:
        return ()
    return tuple(
        k
        for k, seg in enumerate(md.segments)
        if policy.check(seg.bookies, md.write_quorum, locations).adherence is Adherence.FAIL
    )


def placement_repairs(
    md: LedgerMetadata, segment_index: int, positions: Iterable[int], registered: Set[str]
) -> tuple[Repair, ...]:
    """The copies that move `positions` of closed segment `segment_index`, in position
    order. Each new bookie must hold what the position holds; the bookie there now holds
    all of it and is read first, then the registered members that share entries with it.
    """
    e, w = md.ensemble_size, md.write_quorum
    seg = list(md.segment_ranges())[segment_index]
    out: list[Repair] = []
    for i in sorted(positions):
        old = seg.bookies[i]
        others = [
            b
            for j, b in enumerate(seg.bookies)
            if j != i and b in registered and _may_share(i, j, e, w)
        ]
        out.append(
            Repair(
                segment_index,
                seg.first,
                seg.last,
                i,
                old,
                stored_ranges(seg.first, seg.last, e, w, i),
                (old, *others),
                NOT_ADHERING,
            )
        )
    return tuple(out)


def bad_copy_repair(
    md: LedgerMetadata, segment_index: int, position: int, why: str, registered: Set[str]
) -> Repair:
    """The copy that replaces the bookie at `position` of closed segment `segment_index`,
    whose copies there were read back bad (`why`: `CORRUPT_COPY`, `UNREADABLE_COPY`, or
    `MISSING_ENTRIES` for one gone since its listing). The new bookie must hold the
    position's whole share; the registered members that share entries with it are read
    first, and the bookie itself last: most of its copies may be sound, and the copy
    verifies every body it reads, so its bad ones are skipped, never written."""
    e, w = md.ensemble_size, md.write_quorum
    seg = list(md.segment_ranges())[segment_index]
    old = seg.bookies[position]
    others = tuple(
        b
        for j, b in enumerate(seg.bookies)
        if j != position and b in registered and _may_share(position, j, e, w)
    )
    return Repair(
        segment_index,
        seg.first,
        seg.last,
        position,
        old,
        stored_ranges(seg.first, seg.last, e, w, position),
        (*others, old),
        why,
    )
