"""A ledger moved by `recover` must be as safe as one repaired from a mark, so the worker's
loop and the command repair by the same steps, kept apart from how either chooses ledgers
and holds their locks.

One ledger's repair, once its lock is held: plan, copy, commit, verify, unmark.

The worker's loop (`worker/loop.py`) takes marked ledgers and decides how long to hold
a lock after a failure; `recover` locks the ledgers of the bookies it is told to empty
and moves them (`replace`).

* **Plan** with the replicas check's own analysis (`worker/plan.py`): a position is
  bad when its bookie is lost or lacks entries it must hold (or is to be replaced); a
  registered bookie that did not answer is unknown, not bad, and the ledger waits.
* **Re-verify** the bookies the mark names that the plan found holding everything
  (`worker/reverify.py`, `_reverify`): a listing cannot show a corrupt or unreadable copy
  (the deep scrub's marks), so each such bookie's share is read back and judged as the
  scrub judges it; a segment where its copy is bad gets a new bookie like any other bad
  position (`why` `corrupt_copy`, `unreadable_copy`), and a bookie that stops answering
  keeps the mark (`unknown_bookies`, the failed-ledger delay), never "healthy". Marks
  written by Java's auditor are treated alike: nothing in a mark says who wrote it.
* **Copy** only what the bad position must hold, verified, unchanged, to a target the
  placement policy allows (`worker/targets.py`, `worker/copy.py`). The copy stops the
  moment the ZooKeeper connection is suspended: a worker that may have lost its lock
  writes nothing more.
* **Commit** the ensemble change only once the target acknowledged every entry, with a
  version check, fenced on the lock (`metadata/ledger_update.py`): a process whose
  session is gone cannot change metadata. One write per segment; a segment with an
  unreadable entry is never committed.
* **Verify** by planning again from fresh metadata and fresh bookie answers; only an
  empty plan unmarks (versioned: a mark changed since the lock was taken stays).
* **Placement** (`repairedPlacementPolicyNotAdheringBookieEnabled`, the worker only, not
  `recover`): once a closed ledger's data is whole, each segment that fails the
  placement policy has the fewest copies moved that make it adhere
  (`worker/targets.choose_adhering_moves`), through the same copy, commit and
  verification; the mark goes only when every segment adheres. Upstream repairs data
  loss first and leaves placement to a later attempt; here both happen under one lock.
  A segment that cannot be made to adhere (too few racks) is a `no_target` failure:
  reported once (later attempts with the same reason are `Outcome.reported`), the
  mark kept and the ledger retried after upstream's failed-ledger delay, as upstream
  leaves it.
* The under-replicated tail of a ledger that is not closed is never copied: its
  closed segments are repaired and the outcome says `open_ledger`. Once the caller has
  held the lock for `openLedgerRereplicationGracePeriod`, `recover_open_tail` fences
  and recovers the ledger if it is still open with a bad position in its last segment
  (`worker/recovery.py`, as BookKeeper's client does), so the next take repairs a
  closed ledger.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from auditor.checks.context import CheckContext
from auditor.checks.placement_run import placement_policy
from auditor.checks.replicas import BookieAnswer, Listed, expectations
from auditor.checks.replicas_run import bookie_answers
from auditor.errors import AuditorError
from auditor.metadata.ledger_update import (
    ConcurrentUpdateError,
    EnsembleConflictError,
    LedgerDeletedError,
    replace_bookies,
    update_ledger,
)
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.paths import ledger_path
from auditor.metadata.registry import BookieSet
from auditor.metadata.replication import ReplicationQueue, TakenLedger
from auditor.metadata.serde import LedgerMetadataFormatError, decode_ledger_metadata
from auditor.metadata.underreplication import ur_ledger_path
from auditor.store import NoNodeError, Stat
from auditor.topology.racks import open_rack_resolver
from auditor.worker.copy import CopyResult, CopyTask, FragmentCopier
from auditor.worker.plan import (
    LedgerPlan,
    Repair,
    bad_copy_repair,
    not_adhering_segments,
    placement_repairs,
    plan_ledger,
)
from auditor.worker.recovery import Recovered, TailLostError, lost_tail, recover_open_ledger
from auditor.worker.registry_view import RegistryView
from auditor.worker.reverify import reverify_bookie
from auditor.worker.state import Failure, InHand, WorkerState
from auditor.worker.targets import (
    CannotAdhereError,
    NoTargetError,
    choose_adhering_moves,
    choose_targets,
)

T = TypeVar("T")


class Connection(Protocol):
    """The owner's view of its ZooKeeper session."""

    @property
    def connected(self) -> asyncio.Event:
        """Set while connected."""

    @property
    def disconnected(self) -> asyncio.Event:
        """Set while suspended or lost (cleared on reconnecting)."""


@dataclass(frozen=True, slots=True)
class WorkerConnection:
    """A `Connection` from two events kept by the owner (the daemon, the CLI)."""

    connected: asyncio.Event
    disconnected: asyncio.Event


class Disconnected(AuditorError):
    """The ZooKeeper connection was suspended mid-repair: nothing more was written."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one locked ledger's repair ended."""

    done: bool
    failure: Failure | None = None
    detail: str = ""
    #: Fragments (segment positions) committed to metadata on this attempt.
    committed: int = 0
    #: Entry ranges no bookie could serve (UNRECOVERABLE).
    unreadable: tuple[tuple[int, int], ...] = ()
    #: Whether the mark was removed (a done repair of a marked ledger).
    unmarked: bool = False
    #: The same failure, word for word, was reported for this ledger before (a
    #: placement refusal): the caller logs it quietly.
    reported: bool = False


def ranges_text(ranges: Iterable[tuple[int, int]]) -> str:
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def describe(r: Repair) -> str:
    """One line per fragment for logs and `status` ("?": no entry known, e.g. an open tail)."""
    end = str(r.last_entry) if r.last_entry >= r.first_entry else "?"
    return (
        f"segment {r.segment_index} [{r.first_entry}-{end}] position {r.bookie_index} "
        f"{r.old} ({r.why})"
    )


#: Placement refusals remembered (per ledger, the newest kept) to report each once.
REFUSALS_KEPT = 10_000

#: Seconds a rack resolver (its sources and the locations it learnt) is reused before the
#: rack sources are read again: one read per ledger would run a topology script or read
#: Pulsar's rack znode for every ledger; never reading again would miss rack changes.
RACKS_REFRESH = 300.0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where replacement bookies may go for one ledger: the candidates, the policy, racks."""

    writable: frozenset[str]
    policy: Any
    locations: dict[str, str]

    def targets(
        self, md: LedgerMetadata, repairs: Sequence[Repair], rng: random.Random
    ) -> Iterator[tuple[int, list[Repair], dict[int, str] | NoTargetError]]:
        """Per segment (in order): its repairs and their targets, or why there are none."""
        by_segment: dict[int, list[Repair]] = {}
        for r in repairs:
            by_segment.setdefault(r.segment_index, []).append(r)
        for seg_index, seg_repairs in sorted(by_segment.items()):
            try:
                chosen: dict[int, str] | NoTargetError = choose_targets(
                    md,
                    seg_index,
                    [r.bookie_index for r in seg_repairs],
                    writable=self.writable,
                    policy=self.policy,
                    locations=self.locations,
                    rng=rng,
                )
            except NoTargetError as exc:
                chosen = exc
            yield seg_index, seg_repairs, chosen


class PlacementSource:
    """Builds a ledger's `Placement`, reusing one rack resolver for `RACKS_REFRESH` s."""

    def __init__(self, ctx: CheckContext, *, log: Any, clock: Callable[[], float] = time.monotonic):
        self.ctx = ctx
        self.log = log
        self.clock = clock
        self._resolver: Any = None
        self._opened = 0.0

    async def placement(
        self, md: LedgerMetadata, registered: BookieSet, replace: Set[str] = frozenset()
    ) -> Placement:
        """`replace` (bookies being emptied: `recover A,B`) are never targets: moving A's
        copy to B would leave B to empty again (upstream excludes every source too)."""
        now = self.clock()
        if self._resolver is None or now - self._opened >= RACKS_REFRESH:
            ctx = self.ctx
            self._resolver = await open_rack_resolver(ctx.store, ctx.root, ctx.config, log=self.log)
            self._opened = now
        writable = registered.writable - frozenset(replace)
        known = registered.available | md.bookies()
        locations = await self._resolver.locations(sorted(known | writable))
        policy = placement_policy(
            self.ctx.config.bookkeeper, frozenset(known | writable), locations
        )
        return Placement(frozenset(writable), policy, locations)


class LedgerRepairer:
    """Repairs ledgers whose locks `queue` holds, through `ctx`'s ZooKeeper and bookies."""

    def __init__(
        self,
        ctx: CheckContext,
        queue: ReplicationQueue,
        conn: Connection,
        state: WorkerState,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        log: Any,
    ) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.config = ctx.config
        self.queue = queue
        self.conn = conn
        self.state = state
        self.rng = rng if rng is not None else random.Random()
        self.clock = clock
        self.log = log
        self.placements = PlacementSource(ctx, log=log)
        #: Per ledger being repaired, the metadata last committed (for `_read_for_verify`).
        self._wrote: dict[int, LedgerMetadata] = {}
        #: Per ledger being repaired, the metadata last read and what it was decoded from.
        self._read_as: dict[int, tuple[LedgerMetadata, tuple[bytes, Stat]]] = {}
        #: The registered bookies, listed again only when they may have changed.
        self.registry = RegistryView(ctx.store, ctx.root)
        #: The last placement refusal per ledger (`_cannot_adhere`), so that each is
        #: reported once; forgotten once the ledger is done.
        self._refusals: dict[int, str] = {}
        bk = self.config.bookkeeper
        self.copier = FragmentCopier(
            ctx.bookies,
            batch=max(1, bk.rereplicationEntryBatchSize),
            bytes_per_second=float(max(bk.replicationRateByBytes, 0)),
            read_timeout=float(bk.readEntryTimeout),
            add_timeout=float(bk.readEntryTimeout),
            fallback_digest_type=bk.recovery_digest_type,
            fallback_password=bk.recovery_password,
            observer=self._counted,
        )

    # --- small steps ---------------------------------------------------------------------------

    def step(self, lid: int, step: str, fragments: tuple[str, ...] | None = None) -> None:
        held = self.state.in_hand.get(lid)
        if held is not None:
            self.state.in_hand[lid] = InHand(
                lid, held.since, step, held.fragments if fragments is None else fragments
            )

    def path(self, lid: int) -> str:
        return ledger_path(self.ctx.manager, self.ctx.root, lid)

    async def read(self, lid: int, *, keep: bool = False) -> LedgerMetadata | None:
        """The ledger's metadata (None: deleted). With `keep`, what was read is kept for
        the commit of this repair (`_known`) until the repair ends."""
        try:
            data, stat = await self.store.get(self.path(lid))
        except NoNodeError:
            self._read_as.pop(lid, None)
            return None
        md = decode_ledger_metadata(data, lid, int(stat.ctime))
        if keep:
            self._read_as[lid] = (md, (data, stat))
        return md

    def _known(self, lid: int, md: LedgerMetadata) -> tuple[bytes, Stat] | None:
        """The bytes and stat `md` was decoded from, if it is the metadata this repair
        last read (a commit tries its write from them: `update_ledger`'s `known`)."""
        seen = self._read_as.get(lid)
        return seen[1] if seen is not None and seen[0] is md else None

    async def read_with_registry(self, lid: int) -> tuple[LedgerMetadata | None, BookieSet]:
        """The ledger's metadata and the bookies registered, read together (one round trip
        where there were two in turn): what each plan starts from."""
        md, registered = await asyncio.gather(self.read(lid, keep=True), self.registry.read())
        return md, registered

    async def plan(
        self,
        md: LedgerMetadata,
        taken: TakenLedger,
        replace: Set[str] = frozenset(),
        registered: BookieSet | None = None,
        answers: Mapping[str, BookieAnswer] | None = None,
    ) -> LedgerPlan:
        """The ledger's plan from fresh bookie answers; `registered` is the registry read
        with `md` (`read_with_registry`), read here when not given; `answers` are the
        bookies' answers for exactly `md`'s expectations, asked here when not given."""
        if registered is None:
            registered = await self.registry.read()
        if answers is None:
            answers = await bookie_answers(self.ctx, md)
        return plan_ledger(
            md,
            registered=registered.available,
            answers=answers,
            mark_replicas=taken.missing_replicas,
            replace=replace,
        )

    async def _read_for_verify(
        self, lid: int
    ) -> tuple[LedgerMetadata | None, BookieSet, Mapping[str, BookieAnswer] | None]:
        """The verification's fresh metadata and registry and, when this repair has just
        committed, the bookies' answers asked at the same time, for the ensembles it
        wrote: what the verification would ask once the metadata is back, asked a round
        trip sooner (after the commit all the same). They are used only if the metadata
        read back expects exactly what the committed one did (else None: asked again)."""
        wrote = self._wrote.pop(lid, None)
        if wrote is None:
            md, registered = await self.read_with_registry(lid)
            return md, registered, None
        early = asyncio.ensure_future(bookie_answers(self.ctx, wrote))
        try:
            md, registered = await self.read_with_registry(lid)
            if md is None or expectations(md) != expectations(wrote):
                return md, registered, None
            return md, registered, await early
        finally:
            if not early.done():
                early.cancel()
                await asyncio.gather(early, return_exceptions=True)

    def _counted(self, event: Any) -> None:
        """The copier's counts, into the state the metrics read."""
        self.state.entries_read += event.entries_read
        self.state.entries_written += event.entries_written
        self.state.bytes_read += event.bytes_read
        self.state.bytes_written += event.bytes_written

    # --- the repair ----------------------------------------------------------------------------

    async def repair(self, taken: TakenLedger, replace: Set[str] = frozenset()) -> Outcome:
        """Plans, copies, commits and verifies one ledger; unmarks it when it is whole."""
        try:
            outcome = await self._repair(taken, replace)
        finally:
            self._read_as.pop(taken.ledger_id, None)
            self._wrote.pop(taken.ledger_id, None)
        if outcome.done:
            self._refusals.pop(taken.ledger_id, None)
        return outcome

    async def _repair(self, taken: TakenLedger, replace: Set[str]) -> Outcome:
        lid = taken.ledger_id
        try:
            md, registered = await self.read_with_registry(lid)
        except LedgerMetadataFormatError as exc:
            return Outcome(False, Failure.ERROR, f"metadata does not decode: {exc}")
        if md is None:  # deleted: nothing to repair, the mark goes (upstream §1.4)
            unmarked = await self.queue.mark_replicated(taken)
            # The mark's path is named: it may be one whose bytes never decoded (taken all
            # the same, as Java's worker takes it), and this line is all that says it went.
            self.log.info(
                "ledger no longer exists; its mark goes",
                ledger=lid,
                mark=ur_ledger_path(self.queue.base, lid),
                removed=unmarked,
            )
            return Outcome(True, unmarked=unmarked)
        answers = await bookie_answers(self.ctx, md)
        plan = await self.plan(md, taken, replace, registered, answers)
        if plan.skipped is not None and not plan.repairs and not plan.open_tail:
            return Outcome(False, Failure.ERROR, f"cannot be planned: {plan.skipped}")
        if not plan.repairs and not plan.open_tail and plan.unknown:
            return Outcome(
                False, Failure.UNKNOWN_BOOKIES, f"no answer from {', '.join(plan.unknown)}"
            )
        if plan.skipped is None:
            bad, failed = await self._reverify(taken, md, plan, registered, answers, replace)
            if failed is not None:
                return failed
            if bad:
                merged = sorted(
                    (*plan.repairs, *bad), key=lambda r: (r.segment_index, r.bookie_index)
                )
                plan = dataclasses.replace(plan, repairs=tuple(merged))
        if not plan.repairs and not plan.open_tail:
            placed = await self._place(taken, md, replace, registered)
            if placed is not None:
                committed, failed = placed
                return failed or await self.verify(taken, committed, replace, placed=True)
            unmarked = await self.queue.mark_replicated(taken)
            self.state.ledgers_found_healthy += 1
            self.log.info("ledger has every copy; nothing to copy", ledger=lid, unmarked=unmarked)
            return Outcome(True, unmarked=unmarked)
        committed, failed = await self._repair_segments(
            taken, md, plan.repairs, registered, replace
        )
        if failed is not None:
            return failed
        if plan.open_tail:
            tail = "; ".join(describe(r) for r in plan.open_tail)
            return Outcome(
                False,
                Failure.OPEN_LEDGER,
                f"open ledger: its last segment is under-replicated ({tail})",
                committed,
            )
        return await self.verify(taken, committed, replace)

    async def _reverify(
        self,
        taken: TakenLedger,
        md: LedgerMetadata,
        plan: LedgerPlan,
        registered: BookieSet,
        answers: Mapping[str, BookieAnswer],
        replace: Set[str],
    ) -> tuple[tuple[Repair, ...], Outcome | None]:
        """The repairs for the bad copies of the bookies the mark names that the plan
        found with nothing missing (`worker/reverify.py`), or the failure that keeps the
        mark: a bookie that stopped answering (`unknown_bookies`, the failed-ledger delay).

        A mark names the bookies it is about; one that is registered and lists its share
        may still hold it rotten (the deep scrub marks corrupt and unreadable copies). A
        mark names a bookie for a reason, and Java's auditor and ours write the same mark
        (no field says why), so every mark naming a live bookie of the ledger is
        re-verified before the ledger is called whole, whoever wrote it: one read of that
        bookie's share of the ledger costs less than unmarking a ledger with a bad copy
        left in place. Bookies not registered (lost: the plan replaces them), silent in
        the plan (unknown: the mark stays anyway) or being emptied (`replace`) are not
        read."""
        up = registered.available
        members = md.bookies()
        suspects = [
            b
            for b in dict.fromkeys(taken.missing_replicas)
            if b in members and b in up and b not in replace and b not in plan.unknown
        ]
        if not suspects:
            return (), None
        lid = taken.ledger_id
        bk = self.config.bookkeeper
        digest = md.digest_type if md.digest_type is not None else bk.recovery_digest_type
        password = md.password if md.password is not None else bk.recovery_password
        planned = {(r.segment_index, r.old) for r in (*plan.repairs, *plan.open_tail)}
        out: list[Repair] = []
        self.step(lid, "re-verifying")
        for bookie in suspects:
            answer = answers.get(bookie)
            found = await self._while_connected(
                reverify_bookie(
                    self.ctx.bookies,
                    md,
                    bookie,
                    listing=answer.availability if isinstance(answer, Listed) else None,
                    digest_type=digest,
                    password=password,
                    window=max(1, bk.rereplicationEntryBatchSize),
                    read_timeout=float(bk.readEntryTimeout),
                ),
                "re-verification",
            )
            self.state.entries_reverified += found.sound + sum(
                sum(b.counts.values()) for b in found.bad.values()
            )
            if found.silent is not None:
                detail = (
                    f"re-verifying the copies on {bookie}, named by the mark: no answer "
                    f"({found.silent}); the mark stays"
                )
                return (), Outcome(False, Failure.UNKNOWN_BOOKIES, detail)
            for k, bad in sorted(found.bad.items()):
                self.log.warning(
                    "bad copies found on a bookie the mark names; it is replaced there",
                    ledger=lid,
                    bookie=bookie,
                    segment=k,
                    reason=bad.why,
                    bad_copies=dict(bad.counts),
                    evidence={str(e): why for e, why in bad.evidence.items()},
                )
                if (k, bookie) not in planned:
                    out.append(bad_copy_repair(md, k, bad.bookie_index, bad.why, up))
            if not found.bad:
                self.log.info(
                    "copies re-verified sound on a bookie the mark names",
                    ledger=lid,
                    bookie=bookie,
                    entries=found.sound,
                )
        return tuple(out), None

    async def _repair_segments(
        self,
        taken: TakenLedger,
        md: LedgerMetadata,
        repairs: tuple[Repair, ...],
        registered: BookieSet,
        replace: Set[str] = frozenset(),
    ) -> tuple[int, Outcome | None]:
        """Copies and commits segment by segment; (fragments committed, a failure or None).
        Targets are chosen among `registered`, the registry the plan judged with (read
        with the metadata, moments before: a target gone since fails its adds, and the
        attempt with them)."""
        placement = await self.placements.placement(md, registered, replace)
        work = placement.targets(md, repairs, self.rng)
        return await self._copy_and_commit(taken, md, work, registered, replace)

    async def _copy_and_commit(
        self,
        taken: TakenLedger,
        md: LedgerMetadata,
        work: Iterable[tuple[int, list[Repair], dict[int, str] | NoTargetError]],
        registered: BookieSet,
        replace: Set[str] = frozenset(),
    ) -> tuple[int, Outcome | None]:
        """Per segment: copies its repairs to their targets, then commits them in one
        version-checked write fenced on the lock (never a segment with an unreadable
        entry); (fragments committed, a failure or None)."""
        lid = taken.ledger_id
        committed = 0
        unreadable: list[tuple[int, int]] = []
        unavailable: list[str] = []
        # Bookies not registered now that neither the mark nor the operator (`replace`:
        # `recover`, `decommission`) names: the auditor has not declared them lost (a
        # host restarting within lostBookieRecoveryDelay, say), so the copies they hold
        # are away, not gone.
        # (`registered` is the registry the targets were chosen from: read once.)
        named = set(taken.missing_replicas) | set(replace)
        up = registered.available
        away = frozenset(b for b in md.bookies() if b not in up and b not in named)
        for seg_index, seg_repairs, targets in work:
            if isinstance(targets, NoTargetError):
                return committed, Outcome(False, Failure.NO_TARGET, str(targets), committed)
            lines = tuple(f"{describe(r)} -> {targets[r.bookie_index]}" for r in seg_repairs)
            self.step(lid, "copying", lines)
            self.log.info("copying fragments", ledger=lid, fragments=list(lines))
            results: list[CopyResult] = []
            for r in seg_repairs:
                task = CopyTask(
                    ledger_id=lid,
                    metadata=md,
                    segment_index=seg_index,
                    bookie_index=r.bookie_index,
                    target=targets[r.bookie_index],
                    entries=r.entries,
                    sources=r.sources,
                    away=away,
                )
                res = await self._copy(task)
                results.append(res)
                unreadable.extend(res.unreadable)
                if res.failure is not None:
                    detail = f"{describe(r)} -> {targets[r.bookie_index]}: {res.failure}"
                    return committed, Outcome(False, Failure.TARGET_FAILED, detail, committed)
                if res.unavailable:
                    # A source failed or stalled: the segment cannot be committed now,
                    # and its other positions would wait on the same source.
                    unavailable.append(
                        f"{describe(r)}: entries {ranges_text(res.unavailable)} not served "
                        f"({res.unavailable_why})"
                    )
                    break
            if any(res.unreadable or res.unavailable for res in results):
                continue  # never commit a copy that lacks entries
            self.step(lid, "committing")
            first = md.segments[seg_index].first_entry_id
            replacements = {r.old: targets[r.bookie_index] for r in seg_repairs}
            try:
                result = await update_ledger(
                    self.queue.fenced(taken),
                    self.store,
                    self.path(lid),
                    lid,
                    replace_bookies(first, replacements),
                    # The session looked at again once the read is back, just before
                    # the write (a session that ended meanwhile writes nothing).
                    before_write=lambda: self.queue.fenced(taken),
                    # The metadata this plan was made on, as read under the lock: the
                    # write is tried from it (version-checked), not after a new read.
                    known=self._known(lid, md),
                )
            except LedgerDeletedError:
                unmarked = await self.queue.mark_replicated(taken)
                return committed, Outcome(True, committed=committed, unmarked=unmarked)
            except (ConcurrentUpdateError, EnsembleConflictError) as exc:
                # The metadata moved under us (a writer's ensemble change, another
                # repair): nothing is written; the next attempt plans on what is there.
                return committed, Outcome(False, Failure.METADATA_CONFLICT, str(exc), committed)
            if result.written:
                committed += len(seg_repairs)
                self.state.fragments_replicated += len(seg_repairs)
                self.state.fragments_by_reason.update(r.why for r in seg_repairs)
                self.log.info(
                    "fragments committed",
                    ledger=lid,
                    segment_first_entry=first,
                    replaced=replacements,
                    reasons={r.old: r.why for r in seg_repairs},
                    metadata_version=result.version,
                )
            md = result.metadata
            if result.written:
                self._wrote[lid] = md
        if unreadable:
            merged = tuple(sorted(set(unreadable)))
            detail = (
                f"entries with no readable copy anywhere: {ranges_text(merged)}; "
                "kept marked for an operator"
            )
            if unavailable:
                detail += "; besides, a source failed on " + "; ".join(unavailable)
            return committed, Outcome(False, Failure.UNRECOVERABLE, detail, committed, merged)
        if unavailable:
            # Not loss: a source that errs or stalls may hold the entry. Retried after
            # upstream's failed-ledger delay, as any passing failure.
            detail = "a source failed or did not answer: " + "; ".join(unavailable)
            return committed, Outcome(False, Failure.SOURCE_FAILED, detail, committed)
        return committed, None

    async def _copy(self, task: CopyTask) -> CopyResult:
        """The copy, stopped the moment the ZooKeeper connection is suspended."""
        if self.conn.disconnected.is_set():
            raise Disconnected("metadata store connection suspended before the copy")
        copy = asyncio.ensure_future(self.copier.copy(task))
        lost = asyncio.ensure_future(self.conn.disconnected.wait())
        try:
            await asyncio.wait([copy, lost], return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not copy.done():
                copy.cancel()
            await asyncio.gather(copy, lost, return_exceptions=True)
        if copy.cancelled():
            raise Disconnected("metadata store connection suspended: copy stopped")
        return copy.result()

    async def recover_open_tail(self, taken: TakenLedger) -> Recovered | None:
        """After `openLedgerRereplicationGracePeriod`, the lock still held (spec §1.9):
        fences, recovers and closes the ledger if it is still open and its last segment
        still has a bad position. None when there is nothing to recover: the ledger was
        deleted, its writer closed it, or its last segment has no bad position any more
        (the writer replaced the bookie). The mark stays either way.

        Raises RecoveryError (nothing closed; TailLostError, before anything is
        written, when lost bookies hold an ack quorum of a write set of the last
        ensemble: no recovery can succeed), Disconnected, FencedOutError, and what
        reading ZooKeeper raises.
        """
        lid = taken.ledger_id
        self.step(lid, "recovering")
        md = await self.read(lid)
        if md is None or md.closed:
            why = "deleted" if md is None else "closed by its writer"
            self.log.info("open ledger needs no recovery", ledger=lid, why=why)
            return None
        plan = await self.plan(md, taken)
        if not plan.open_tail:
            self.log.info(
                "open ledger needs no recovery",
                ledger=lid,
                why="its last segment has no bad position any more",
            )
            return None
        lost = lost_tail(md, plan.open_tail)
        if lost is not None:
            raise TailLostError(lost)  # nothing fenced: it could only fail, every time
        tail = "; ".join(describe(r) for r in plan.open_tail)
        self.log.info("recovering open ledger", ledger=lid, open_tail=tail)
        bk = self.config.bookkeeper
        timeout = float(bk.readEntryTimeout)
        work = recover_open_ledger(
            self.ctx.bookies,
            self.queue.fenced(taken),
            self.store,
            self.path(lid),
            lid,
            replacer=self._replacements,
            read_timeout=timeout,
            add_timeout=timeout,
            fallback_digest_type=bk.recovery_digest_type,
            fallback_password=bk.recovery_password,
            before_write=lambda: self.queue.fenced(taken),
            log=self.log,
        )
        return await self._while_connected(work, "recovery")

    async def _replacements(
        self, md: LedgerMetadata, positions: Sequence[int], excluded: Set[str]
    ) -> Mapping[int, str]:
        """New bookies for members of the last ensemble that failed a re-add."""
        p = await self.placements.placement(md, await self.ctx.registered())
        return choose_targets(
            md,
            len(md.segments) - 1,
            list(positions),
            writable=p.writable - excluded,
            policy=p.policy,
            locations=p.locations,
            rng=self.rng,
        )

    async def _while_connected(self, work: Coroutine[Any, Any, T], what: str) -> T:
        """`work`, stopped the moment the ZooKeeper connection is suspended."""
        if self.conn.disconnected.is_set():
            work.close()
            raise Disconnected(f"metadata store connection suspended before the {what}")
        task = asyncio.ensure_future(work)
        lost = asyncio.ensure_future(self.conn.disconnected.wait())
        try:
            await asyncio.wait([task, lost], return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not task.done():
                task.cancel()
            await asyncio.gather(task, lost, return_exceptions=True)
        if task.cancelled():
            raise Disconnected(f"metadata store connection suspended: {what} stopped")
        return task.result()

    async def _place(
        self,
        taken: TakenLedger,
        md: LedgerMetadata,
        replace: Set[str],
        registered: BookieSet | None = None,
    ) -> tuple[int, Outcome | None] | None:
        """Moves copies so that each failing segment of a closed ledger adheres to the
        placement policy; (fragments committed, a failure or None), or None when nothing
        is to move: `repairedPlacementPolicyNotAdheringBookieEnabled` is off, the caller
        is `recover` (it empties bookies; upstream's does not look at placement either),
        or every segment adheres. Segments are independent: those that can adhere are
        moved even when another cannot (that one is the failure)."""
        if replace or not self.config.bookkeeper.repairedPlacementPolicyNotAdheringBookieEnabled:
            return None
        failing, placement, registered = await self._not_adhering(md, registered)
        if not failing:
            return None
        work: list[tuple[int, list[Repair], dict[int, str] | NoTargetError]] = []
        refusals: list[str] = []
        for k in failing:
            try:
                moves = choose_adhering_moves(
                    md,
                    k,
                    writable=placement.writable,
                    policy=placement.policy,
                    locations=placement.locations,
                    rng=self.rng,
                )
            except CannotAdhereError as exc:
                refusals.append(str(exc))
                continue
            work.append((k, list(placement_repairs(md, k, moves, registered.available)), moves))
        committed, failed = await self._copy_and_commit(taken, md, work, registered)
        if failed is None and refusals:
            failed = self._cannot_adhere(taken.ledger_id, refusals, committed)
        return committed, failed

    async def _not_adhering(
        self, md: LedgerMetadata, registered: BookieSet | None = None
    ) -> tuple[tuple[int, ...], Placement, BookieSet]:
        """The segments failing the placement policy, with the placement and registry
        they were judged with (`registered`: the one read with `md`, else read here)."""
        if registered is None:
            registered = await self.registry.read()
        placement = await self.placements.placement(md, registered)
        return (
            not_adhering_segments(md, placement.policy, placement.locations),
            placement,
            registered,
        )

    def _cannot_adhere(self, lid: int, refusals: Sequence[str], committed: int) -> Outcome:
        """A placement refusal, `reported` when this ledger's last one said the same."""
        detail = "; ".join(refusals) + "; its mark stays"
        reported = self._refusals.pop(lid, None) == detail
        self._refusals[lid] = detail
        while len(self._refusals) > REFUSALS_KEPT:
            del self._refusals[next(iter(self._refusals))]
        return Outcome(False, Failure.NO_TARGET, detail, committed, reported=reported)

    async def verify(
        self,
        taken: TakenLedger,
        committed: int,
        replace: Set[str] = frozenset(),
        *,
        placed: bool = False,
    ) -> Outcome:
        """Plans again from fresh metadata and answers; unmarks only an empty plan, and
        (`repairedPlacementPolicyNotAdheringBookieEnabled`) a ledger whose segments all
        adhere: copies not moved yet are moved now, then verified again; after the moves
        (`placed`) a segment still failing is a failed verification."""
        lid = taken.ledger_id
        self.step(lid, "verifying")
        md, registered, answers = await self._read_for_verify(lid)
        if md is None:
            unmarked = await self.queue.mark_replicated(taken)
            return Outcome(True, committed=committed, unmarked=unmarked)
        plan = await self.plan(md, taken, replace, registered, answers)
        if plan.repairs or plan.open_tail or plan.unknown:
            left = "; ".join(describe(r) for r in (*plan.repairs, *plan.open_tail))
            unknown = f"; no answer from {', '.join(plan.unknown)}" if plan.unknown else ""
            return Outcome(
                False, Failure.VERIFY_FAILED, f"still to repair: {left}{unknown}", committed
            )
        if not placed:
            moved = await self._place(taken, md, replace, registered)
            if moved is not None:
                more, failed = moved
                if failed is not None:
                    return dataclasses.replace(failed, committed=committed + failed.committed)
                return await self.verify(taken, committed + more, replace, placed=True)
        elif self.config.bookkeeper.repairedPlacementPolicyNotAdheringBookieEnabled:
            failing, _, _ = await self._not_adhering(md, registered)
            if failing:
                where = ", ".join(str(k) for k in failing)
                return Outcome(
                    False,
                    Failure.VERIFY_FAILED,
                    f"segment(s) {where} still fail the placement policy",
                    committed,
                )
        unmarked = await self.queue.mark_replicated(taken)
        self.state.ledgers_replicated += 1
        self.log.info(
            "ledger re-replicated", ledger=lid, fragments=committed, mark_removed=unmarked
        )
        return Outcome(True, committed=committed, unmarked=unmarked)
