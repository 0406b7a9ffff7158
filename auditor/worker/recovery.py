"""The last segment of a ledger that is not closed has no known end (its writer may still be
adding entries, and entries past what it acknowledged may sit on only part of their write
set), so its tail cannot be copied until the ledger is ended as a client's recovery ends it.

Fencing and recovering an open ledger, as BookKeeper's client does, before its tail is copied.

The worker ends the ledger the way any BookKeeper client's recovery open does
(spec §2), and only a closed ledger is repaired:

1. **OPEN -> IN_RECOVERY**, version-checked (a ledger its writer or another
   recoverer closed meanwhile has nothing left to recover: its closed metadata is
   the result).
2. **Fence** every bookie of the last ensemble (READ_ENTRY of entry -1 with
   FENCE_LEDGER and the ledger's master key): from then on the writer's adds get
   EFENCED, so nothing more can be acknowledged behind our back. Each answer gives
   the lastAddConfirmed its last entry carries; the largest is the starting point
   once the answers *cover* every write quorum (`recovery_lac`: no window of WQ
   consecutive positions has AQ positions we did not hear from, so no entry can
   have been acknowledged only by bookies we did not hear from).
3. **Read forward** from LAC+1, entry by entry, from the entry's write set (fencing
   reads at high priority, as Java's `PendingReadOp` sends recovery reads; the fencing
   read of step 2 has none, as `ReadLastConfirmedOp`; digest-verified): an entry is
   part of the ledger once one replica serves it, and the end is reached once
   WQ - AQ + 1 replicas answered that they do not have it (`tail_verdict`: it can
   never have had AQ acknowledgements).
4. **Re-add** each entry found past the LAC to its whole write set with
   RECOVERY_ADD at high priority (as `PendingAddOp`: a read-only member takes it,
   where without the priority it answers EREADONLY and would be replaced for
   nothing), body unchanged.
5. **Close** IN_RECOVERY -> CLOSED with that lastEntryId and length,
   version-checked (`close_recovered`).

Where it differs from the Java client, it is on purpose:

* **Bodies unchanged.** Java re-digests a re-added entry with the recovering
  handle's LAC; we send the body as read, so every replica of an entry stays byte
  for byte the writer's, whichever recoverer wrote it (a repeated recovery after a
  crash writes the same bytes again).
* **The length is the closing entry's own.** The closed length is the length field
  of the body of entry lastEntryId (or, from the body of the entry after it, that
  length minus its payload). Java keeps the length of the fence answer it chose,
  which belongs to a later entry when that entry is then not found.
* **Every write-set member must acknowledge a re-add**, not only AQ of them: the
  closed ledger then starts whole. A member that cannot take it (lost, failing) is
  replaced once for the tail, as Java's recovery ensemble change does (spec §2.6):
  the replacement gets every re-added entry of that position and the closed
  metadata a new segment at LAC+1 (or the last one replaced in place when it
  starts there). A replacement that fails too ends the recovery.
* **A fence answer whose digest does not verify counts as unheard** (Java counts
  it as heard in the coverage rule), and the reads are answered in full, not
  raced: an entry found on any replica is part of the ledger, whatever the others
  say, so the outcome does not depend on which replica answered first.

A recovery that can never succeed is not attempted (`lost_tail`): when the bookies
lost from the last ensemble include an ack quorum of some write set, no fencing read
can cover that write quorum, so no recoverer (ours, or any client's) can learn where
the ledger ends until one of them comes back. Fencing the others would only fail
again every time; the caller reports such a ledger as unrecoverable instead.

Everything a failure leaves is harmless: the ledger stays IN_RECOVERY (the next
attempt, ours or any client's, recovers it again), fenced bookies stay fenced
(as any recovery leaves them), and re-added entries are the writer's own bytes.
Every metadata write goes through the caller's fenced view (the replication
lock), so a worker that lost its lock changes no metadata.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from auditor.bookie.client import BookieClient
from auditor.bookie.protocol import (
    LAST_ADD_CONFIRMED,
    BookieProtocolError,
    Status,
    verify_entry_body,
)
from auditor.bookie.results import EntryRead, ErrorStatus, Ok, Outcome
from auditor.errors import AuditorError
from auditor.metadata.ledger_update import Transform, begin_recovery, close_ledger, update_ledger
from auditor.metadata.model import DigestType, LedgerMetadata, LedgerState, Segment
from auditor.metadata.schedule import write_set
from auditor.store import MetadataStore
from auditor.worker.plan import LOST, Repair

__all__ = [
    "NotCoveredError",
    "ReAddError",
    "Recovered",
    "RecoveryError",
    "RecoveryRefusedError",
    "Replacer",
    "TailLostError",
    "TailReadError",
    "TailVerdict",
    "close_recovered",
    "lost_tail",
    "recover_open_ledger",
    "recovery_lac",
    "tail_verdict",
]

#: Chooses new bookies for `positions` of the last segment of `metadata` (whose last
#: segment is the recovery's current ensemble), never one of `excluded`.
Replacer = Callable[[LedgerMetadata, Sequence[int], Set[str]], Awaitable[Mapping[int, str]]]


class RecoveryError(AuditorError):
    """An open ledger could not be recovered; nothing was closed."""


class RecoveryRefusedError(RecoveryError):
    """A bookie refused the recovery itself: EUA (wrong master key) or EFENCED on a re-add."""


class NotCoveredError(RecoveryError):
    """The fencing reads were not answered by enough bookies to cover every write quorum."""


class TailReadError(RecoveryError):
    """An entry past the LAC was neither found nor shown missing, or a length is unknowable."""


class ReAddError(RecoveryError):
    """A re-added entry was not acknowledged by its whole write set, even after replacement."""


class TailLostError(RecoveryError):
    """No recovery can succeed while lost bookies hold an ack quorum of a write set of the
    last ensemble (`lost_tail`): nothing was attempted."""


@dataclass(frozen=True, slots=True)
class Recovered:
    """How a recovery ended: `metadata` is the ledger as closed (by us or by whoever
    closed it first, `closed_here` says which)."""

    metadata: LedgerMetadata
    closed_here: bool
    #: The starting point (spec §2.3); None when the ledger was closed before fencing.
    lac: int | None = None
    #: Entries found past the LAC and re-added.
    entries_readded: int = 0
    #: Bookies of the last ensemble that answered the fencing read.
    fenced: tuple[str, ...] = ()
    #: Members of the last ensemble replaced for the re-adds: old -> new.
    replaced: Mapping[str, str] = dataclasses.field(default_factory=dict)


# --- the pure rules --------------------------------------------------------------------------


def recovery_lac(
    ensemble_size: int, write_quorum: int, ack_quorum: int, answers: Sequence[int | None]
) -> int | None:
    """The LAC the fencing reads establish, or None while they do not cover the ensemble.

    `answers[i]` is what position i answered: the lastAddConfirmed its last entry
    carries, -1 for "no such ledger/entry here" (a valid answer that holds nothing),
    None when it gave no valid answer. The LAC is the largest answer, valid once one
    answer was heard and every window of `write_quorum` consecutive positions
    (`(i .. i+WQ-1) mod E`) has fewer than `ack_quorum` unheard positions (spec §2.2).
    """
    if len(answers) != ensemble_size or not 1 <= ack_quorum <= write_quorum <= ensemble_size:
        raise ValueError(
            f"{len(answers)} answers for E{ensemble_size}/W{write_quorum}/A{ack_quorum}"
        )
    heard = [a for a in answers if a is not None]
    if not heard:
        return None
    for start in range(ensemble_size):
        unheard = sum(
            1 for k in range(write_quorum) if answers[(start + k) % ensemble_size] is None
        )
        if unheard >= ack_quorum:
            return None
    return max(heard)


class TailVerdict(enum.Enum):
    """What the replicas' answers say about one entry past the LAC."""

    FOUND = "found"  # a replica served it, verified: it is part of the ledger
    MISSING = "missing"  # enough replicas lack it that it was never acknowledged: the end
    UNKNOWN = "unknown"  # neither: the recovery cannot go on


def lost_tail(md: LedgerMetadata, open_tail: Sequence[Repair]) -> str | None:
    """Why no recovery can close `md` while the bookies `open_tail` calls lost (bad
    positions of its last segment) are gone, or None when one can.

    Every other member answering, the fencing reads cover every write quorum unless
    some window of WQ consecutive positions has AQ lost ones (`recovery_lac`): an entry
    may then have been acknowledged by lost bookies alone, and where the ledger ends
    cannot be learnt. A bookie that is registered but silent is not lost: it may answer
    the next time.
    """
    e, w, a = md.ensemble_size, md.write_quorum, md.ack_quorum
    lost = {r.bookie_index for r in open_tail if r.why == LOST}
    if (
        not 1 <= a <= w <= e
        or recovery_lac(e, w, a, [None if i in lost else -1 for i in range(e)]) is not None
    ):
        return None
    last = md.segments[-1]
    windows = ([(start + k) % e for k in range(w)] for start in range(e))
    window = next(ws for ws in windows if sum(1 for i in ws if i in lost) >= a)
    gone = [last.bookies[i] for i in window if i in lost]
    return (
        f"open ledger: its last segment (from entry {last.first_entry_id}) has lost "
        f"{', '.join(gone)}: {len(gone)} of the {w} bookies of the write quorum at "
        f"positions {window}, where {a} acknowledge an entry (E{e}/W{w}/A{a}), so no "
        "fencing read can learn where the ledger ends until one comes back; kept marked "
        "for an operator"
    )


def tail_verdict(write_quorum: int, ack_quorum: int, *, found: bool, absent: int) -> TailVerdict:
    """Found when one replica served the entry; missing when `absent` (replicas that
    answered ENOENTRY/ENOLEDGER) reaches WQ - AQ + 1, so no AQ of its write set can
    have acknowledged it (spec §2.4); otherwise unknown."""
    if found:
        return TailVerdict.FOUND
    if absent >= write_quorum - ack_quorum + 1:
        return TailVerdict.MISSING
    return TailVerdict.UNKNOWN


def close_recovered(
    last_entry_id: int,
    length: int,
    ensemble_key: int | None = None,
    ensemble: Sequence[str] = (),
) -> Transform:
    """`close_ledger` plus the recovery ensemble (spec §2.7): with `ensemble_key`, the
    segment `ensemble` starting there replaces the last one when it starts at the same
    entry and follows it otherwise. A last segment starting after `ensemble_key` is
    refused (RecoveryError): no one adds segments to a ledger in recovery."""
    close = close_ledger(last_entry_id, length)

    def transform(md: LedgerMetadata) -> LedgerMetadata | None:
        closed = close(md)
        if closed is None or ensemble_key is None:
            return closed
        last_key = md.segments[-1].first_entry_id
        new = Segment(ensemble_key, tuple(ensemble))
        if ensemble_key < last_key:
            raise RecoveryError(
                f"ledger {md.ledger_id}: a segment starts at {last_key}, after the recovery "
                f"ensemble's first entry {ensemble_key}, while the ledger was in recovery"
            )
        kept = md.segments[:-1] if ensemble_key == last_key else md.segments
        segments = (*kept, new)
        return dataclasses.replace(closed, segments=segments)

    return transform


# --- the recovery ----------------------------------------------------------------------------


async def recover_open_ledger(
    client: BookieClient,
    fenced_store: MetadataStore,
    store: MetadataStore,
    path: str,
    ledger_id: int,
    *,
    replacer: Replacer | None = None,
    read_timeout: float | None = None,
    add_timeout: float | None = None,
    fallback_digest_type: DigestType = DigestType.CRC32,
    fallback_password: bytes = b"",
    before_write: Callable[[], object] | None = None,
    log: Any = None,
) -> Recovered:
    """Fences, recovers and closes the ledger at `path` (see the module docstring).

    Metadata is read with `store` and written with `fenced_store` (the replication lock's
    view), version-checked. `replacer` chooses new bookies for members of the last
    ensemble that cannot take a re-add (None: such a recovery fails). Bookie requests
    time out after `read_timeout` / `add_timeout` (default: the client's). A ledger
    whose metadata names no digest type or password uses the fallbacks (BookKeeper's
    `digestType` and `passwd`). `before_write` is called right before each metadata
    write (`update_ledger`): the caller's last check of its lock.

    Raises RecoveryError (a subclass says which step failed; nothing closed), what
    `replacer` raises (NoTargetError), LedgerDeletedError, ConcurrentUpdateError,
    FencedOutError (the lock is gone), LedgerMetadataFormatError.
    """
    run = _Recovery(
        client,
        ledger_id,
        replacer=replacer,
        read_timeout=read_timeout,
        add_timeout=add_timeout,
        log=log,
    )
    begun = await update_ledger(
        fenced_store, store, path, ledger_id, begin_recovery(), before_write=before_write
    )
    md = begun.metadata
    if md.closed:
        return Recovered(md, closed_here=False)
    if md.state is not LedgerState.IN_RECOVERY:
        raise RecoveryError(f"ledger {ledger_id} is {md.state.name} after beginning recovery")
    run.bind(
        md,
        md.digest_type if md.digest_type is not None else fallback_digest_type,
        md.password if md.password is not None else fallback_password,
    )
    lac, fenced = await run.fence()
    tail = await run.read_tail(lac)
    if tail:
        last_entry_id = lac + len(tail)
        length = tail[-1].length
    else:
        last_entry_id = lac
        length = await run.length_at(lac)
    replaced, key = await run.readd(lac, tail)
    ensemble = run.current
    transform = close_recovered(last_entry_id, length, key, ensemble)
    closed = await update_ledger(
        fenced_store, store, path, ledger_id, transform, before_write=before_write
    )
    if not closed.metadata.closed:
        raise RecoveryError(f"ledger {ledger_id} is {closed.metadata.state.name} after closing it")
    run.note(
        "open ledger recovered",
        closed_here=closed.written,
        lac=lac,
        last_entry_id=closed.metadata.last_entry_id,
        length=closed.metadata.length,
        entries_readded=len(tail),
        replaced=dict(replaced),
    )
    return Recovered(closed.metadata, closed.written, lac, len(tail), fenced, replaced)


@dataclass(frozen=True, slots=True)
class _Entry:
    entry_id: int
    body: bytes
    #: The body's lastAddConfirmed field: what the writer knew acknowledged when sending it.
    lac: int
    #: The body's length field: the ledger's payload bytes up to and including it.
    length: int
    payload_size: int


class _Recovery:
    """The state of one recovery: the metadata snapshot it works on, bodies seen."""

    def __init__(
        self,
        client: BookieClient,
        ledger_id: int,
        *,
        replacer: Replacer | None,
        read_timeout: float | None,
        add_timeout: float | None,
        log: Any,
    ) -> None:
        self.client = client
        self.lid = ledger_id
        self.replacer = replacer
        self.read_timeout = read_timeout
        self.add_timeout = add_timeout
        self.log = log
        #: Verified bodies seen, by entry id (fence answers and forward reads).
        self.seen: dict[int, _Entry] = {}
        self.md: LedgerMetadata | None = None
        self.digest_type = DigestType.CRC32
        self.password = b""
        #: The last ensemble, as the re-adds use it (members replaced on failure).
        self.current: tuple[str, ...] = ()

    def bind(self, md: LedgerMetadata, digest_type: DigestType, password: bytes) -> None:
        self.md = md
        self.digest_type = digest_type
        self.password = password
        self.current = md.segments[-1].bookies

    def note(self, event: str, **fields: Any) -> None:
        if self.log is not None:
            self.log.info(event, ledger=self.lid, **fields)

    @property
    def meta(self) -> LedgerMetadata:
        assert self.md is not None
        return self.md

    def _verified(self, out: Outcome[EntryRead], entry_id: int | None) -> _Entry | str:
        """The answer's verified body, or why it is not one."""
        if not isinstance(out, Ok):
            return str(out)
        try:
            entry = verify_entry_body(out.value.body, self.digest_type, self.password)
        except BookieProtocolError as exc:
            return str(exc)
        if entry.ledger_id != self.lid or (entry_id is not None and entry.entry_id != entry_id):
            return f"body of ledger {entry.ledger_id} entry {entry.entry_id} returned"
        got = _Entry(
            entry.entry_id,
            out.value.body,
            entry.last_add_confirmed,
            entry.length,
            len(entry.payload),
        )
        self.seen.setdefault(got.entry_id, got)
        return got

    async def _read(
        self, bookie: str, entry_id: int, *, fence: bool, high_priority: bool = False
    ) -> Outcome[EntryRead]:
        return await self.client.read_entry(
            bookie,
            self.lid,
            entry_id,
            fence=fence,
            password=self.password,
            high_priority=high_priority,
            request_timeout=self.read_timeout,
        )

    async def fence(self) -> tuple[int, tuple[str, ...]]:
        """Fences the last ensemble; (the starting LAC, the bookies that answered)."""
        md = self.meta
        ensemble = md.segments[-1].bookies
        outs = await asyncio.gather(
            *(self._read(b, LAST_ADD_CONFIRMED, fence=True) for b in ensemble)
        )
        answers: list[int | None] = []
        why: list[str] = []
        answered: list[str] = []
        for bookie, out in zip(ensemble, outs, strict=True):
            if isinstance(out, ErrorStatus) and out.status is Status.EUA:
                raise RecoveryRefusedError(
                    f"ledger {self.lid}: {bookie} refused the fencing read (EUA: wrong master key)"
                )
            if isinstance(out, ErrorStatus) and out.status in (Status.ENOENTRY, Status.ENOLEDGER):
                answers.append(-1)
                answered.append(bookie)
                continue
            got = self._verified(out, None)
            if isinstance(got, str):
                answers.append(None)
                why.append(f"{bookie}: {got}")
                continue
            answers.append(got.lac)
            answered.append(bookie)
        lac = recovery_lac(md.ensemble_size, md.write_quorum, md.ack_quorum, answers)
        if lac is None:
            raise NotCoveredError(
                f"ledger {self.lid}: the fencing reads to {list(ensemble)} do not cover every "
                f"write quorum (W{md.write_quorum}/A{md.ack_quorum}); no valid answer from "
                + "; ".join(why)
            )
        start = max(lac, md.segments[-1].first_entry_id - 1)
        self.note("open ledger fenced", fenced=answered, lac=start, unanswered=why)
        return start, tuple(answered)

    async def read_tail(self, lac: int) -> list[_Entry]:
        """The entries past `lac` that are part of the ledger, in order."""
        md = self.meta
        ensemble = md.segments[-1].bookies
        tail: list[_Entry] = []
        e = lac + 1
        while True:
            members = [ensemble[i] for i in write_set(e, md.ensemble_size, md.write_quorum)]
            # Recovery reads, as Java's PendingReadOp sends them: fencing, high priority.
            outs = await asyncio.gather(
                *(self._read(b, e, fence=True, high_priority=True) for b in members)
            )
            found: _Entry | None = None
            absent = 0
            why: list[str] = []
            for bookie, out in zip(members, outs, strict=True):
                if isinstance(out, ErrorStatus) and out.status is Status.EUA:
                    raise RecoveryRefusedError(
                        f"ledger {self.lid}: {bookie} refused the recovery read of entry {e} (EUA)"
                    )
                if isinstance(out, ErrorStatus) and out.status in (
                    Status.ENOENTRY,
                    Status.ENOLEDGER,
                ):
                    absent += 1
                    continue
                got = self._verified(out, e)
                if isinstance(got, str):
                    why.append(f"{bookie}: {got}")
                elif found is None:
                    found = got
            match tail_verdict(
                md.write_quorum, md.ack_quorum, found=found is not None, absent=absent
            ):
                case TailVerdict.FOUND:
                    assert found is not None
                    tail.append(found)
                    e += 1
                case TailVerdict.MISSING:
                    return tail
                case TailVerdict.UNKNOWN:
                    raise TailReadError(
                        f"ledger {self.lid}: entry {e} past the LAC {lac} is neither found nor "
                        f"missing from {absent} of its write set {members}: " + "; ".join(why)
                    )

    async def length_at(self, entry_id: int) -> int:
        """The ledger's length up to and including `entry_id` (0 for -1)."""
        if entry_id < 0:
            return 0
        if entry_id in self.seen:
            return self.seen[entry_id].length
        after = self.seen.get(entry_id + 1)
        if after is not None:
            return after.length - after.payload_size
        md = self.meta
        k = max(i for i, s in enumerate(md.segments) if s.first_entry_id <= entry_id)
        ensemble = md.segments[k].bookies
        why: list[str] = []
        for i in write_set(entry_id, md.ensemble_size, md.write_quorum):
            got = self._verified(await self._read(ensemble[i], entry_id, fence=False), entry_id)
            if not isinstance(got, str):
                return got.length
            why.append(f"{ensemble[i]}: {got}")
        raise TailReadError(
            f"ledger {self.lid}: the length at entry {entry_id} cannot be learnt: " + "; ".join(why)
        )

    async def _add(self, bookie: str, entry: _Entry) -> str | None:
        """Re-adds one entry to one bookie; None when acknowledged, else why not."""
        out = await self.client.add_entry(
            bookie,
            self.lid,
            entry.entry_id,
            entry.body,
            password=self.password,
            recovery=True,
            # As Java's recovery adds (PendingAddOp): a read-only member must take it.
            high_priority=True,
            request_timeout=self.add_timeout,
        )
        if isinstance(out, Ok) and out.value == entry.entry_id:
            return None
        if isinstance(out, ErrorStatus) and out.status in (Status.EUA, Status.EFENCED):
            raise RecoveryRefusedError(
                f"ledger {self.lid}: {bookie} refused the re-add of entry {entry.entry_id} "
                f"with {out.status.name}"
            )
        return f"acknowledged entry {out.value}" if isinstance(out, Ok) else str(out)

    async def readd(self, lac: int, tail: Sequence[_Entry]) -> tuple[dict[str, str], int | None]:
        """Re-adds the tail to its write sets; (members replaced, the recovery ensemble's
        first entry, or None when no member was replaced)."""
        md = self.meta
        current = list(self.current)
        replaced: dict[int, str] = {}
        failed: set[str] = set()
        for n, entry in enumerate(tail):
            positions = write_set(entry.entry_id, md.ensemble_size, md.write_quorum)
            outs = await asyncio.gather(*(self._add(current[p], entry) for p in positions))
            bad = {p: why for p, why in zip(positions, outs, strict=True) if why is not None}
            if not bad:
                continue
            if self.replacer is None or any(p in replaced for p in bad):
                raise ReAddError(
                    f"ledger {self.lid}: entry {entry.entry_id} not re-added to "
                    + "; ".join(f"{current[p]}: {why}" for p, why in sorted(bad.items()))
                )
            failed.update(current[p] for p in bad)
            view = dataclasses.replace(
                md,
                segments=(
                    *md.segments[:-1],
                    Segment(md.segments[-1].first_entry_id, tuple(current)),
                ),
            )
            chosen = await self.replacer(view, sorted(bad), frozenset(failed))
            for p in sorted(bad):
                new = chosen[p]
                if new in current or new in failed:
                    raise ReAddError(
                        f"ledger {self.lid}: replacement {new} for {current[p]} is a member "
                        "or failed already"
                    )
                self.note(
                    "recovery ensemble change",
                    position=p,
                    old=current[p],
                    new=new,
                    reason=bad[p],
                    first_entry=lac + 1,
                )
                current[p] = new
                replaced[p] = new
                # The new member gets every re-added entry its position stores, this one too.
                for done in tail[: n + 1]:
                    if p not in write_set(done.entry_id, md.ensemble_size, md.write_quorum):
                        continue
                    why = await self._add(new, done)
                    if why is not None:
                        raise ReAddError(
                            f"ledger {self.lid}: entry {done.entry_id} not re-added to the "
                            f"replacement {new}: {why}"
                        )
        old = md.segments[-1].bookies
        self.current = tuple(current)
        if not replaced:
            return {}, None
        return {old[p]: new for p, new in sorted(replaced.items())}, lac + 1
