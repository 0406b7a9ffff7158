"""`bk-auditor recover BOOKIE[,BOOKIE]`: move every ledger off those bookies, now, from here.

BookKeeper's shell `recover` (spec replication-worker.md §4.1), on the worker's own
parts, so that a ledger moved from the command line is moved exactly as a worker moves
it: planned with the replicas analysis (`worker/plan.py`, the named bookies `requested`),
targets chosen by the placement policy (`worker/targets.py`; a named bookie is never a
target), copied verified and unchanged, committed with a version check fenced on the
ledger's replication lock, verified from fresh answers (`worker/repair.py`).

Differences from upstream, each for a reason:

* Each ledger is **locked** first, as Java's `acquireUnderreplicatedLedger` locks (the
  ephemeral `underreplication/locks/urL%010d`, marked or not): upstream's `recover` takes
  no lock and may copy the same data as a worker at the same time. A ledger whose lock
  another process holds (a worker, a bookie's garbage collector, another `recover`) is
  skipped and named with its holder, never waited for. A mark is left alone (no mark
  version is recorded): the worker that takes it later finds the ledger whole.
* The last segment of a ledger that is not closed is never copied here (the repairer
  says `open_ledger`): its closed segments are moved and the ledger is reported. Upstream
  fences such a ledger at once, cutting off a live writer; the writer replaces a bookie
  of its own last ensemble anyway.
* A bookie id that no ledger names, that is not registered and has no cookie is refused
  (exit 2), before anything is written: it is almost always a typo, and "0 ledgers
  moved" would read as success.
* No confirmation prompt (`-f`): this is a command for scripts as much as for people;
  `--dry-run` shows the plan first.

Output: a line per ledger on stderr as it goes (`--json`: one object per ledger on
stdout), then a summary on stdout (`--json`: one final object with `"summary": true`).
Exit 0 when every ledger naming the bookies was moved (or no longer names them), 1 when
some were not (each listed with why), 2 for bad input, 3 when the metadata store is unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import re
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence, Set
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from auditor.checks.context import CheckContext, open_context
from auditor.checks.replicas_run import bookie_answers
from auditor.cli.cluster import target_of_args
from auditor.cli.options import bind, cluster_args, config_args
from auditor.config import AuditorConfig, load_config
from auditor.errors import AuditorError, ConfigError, shown_name
from auditor.metadata.cluster import ClusterTarget, connect
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.registry import all_known_bookies
from auditor.metadata.replication import ReplicationQueue
from auditor.metadata.serde import LedgerMetadataFormatError
from auditor.metadata.underreplication import UnderreplicatedLedger, UnderreplicationManager
from auditor.store import FencedOutError, MetadataStore, SessionState, StoreUnavailableError
from auditor.worker.loop import default_lock_holder
from auditor.worker.plan import plan_ledger
from auditor.worker.repair import (
    Disconnected,
    LedgerRepairer,
    Outcome,
    PlacementSource,
    WorkerConnection,
    describe,
)
from auditor.worker.state import Failure, InHand, WorkerState
from auditor.worker.targets import NoTargetError

#: BookKeeper's BookieId rule: letters, digits and `:._-`; "readonly" is the registry's
#: directory, never an id.
BOOKIE_ID = re.compile(r"[A-Za-z0-9:._-]+")

#: A ledger's outcomes besides the worker's `Failure` reasons.
MOVED = "moved"
NO_LONGER_NAMED = "no_longer_named"  # the metadata changed meanwhile: nothing of ours left
LOCKED = "locked"  # another process holds the ledger's replication lock: skipped
PLANNED = "planned"  # --dry-run: what a real run would do
UNDECODABLE = "metadata_invalid"  # the metadata does not decode: it may name the bookie


class UnknownBookieError(ConfigError):
    """A bookie id no ledger, registration or cookie knows: a typo, most likely."""


def parse_bookies(text: str, what: str = "BOOKIE") -> tuple[str, ...]:
    """`a:3181,b:3181` as ids, in order, each once; ConfigError naming a bad one."""
    ids = [part.strip() for part in text.split(",")]
    if not any(ids):
        raise ConfigError(f"{what}: give a bookie id (host:port, or the bookie's bookieId)")
    for bookie in ids:
        if not bookie:
            raise ConfigError(f"{what}: an empty bookie id in {shown_name(text)}")
        if BOOKIE_ID.fullmatch(bookie) is None or bookie == "readonly":
            raise ConfigError(
                f"{what}: {shown_name(bookie)} is not a bookie id "
                "(letters, digits and ':', '.', '_', '-' only)"
            )
    return tuple(dict.fromkeys(ids))


@dataclass(frozen=True, slots=True)
class Found:
    """The ledgers whose metadata names any of the bookies, in id order."""

    ledgers: tuple[int, ...]
    #: Per bookie, how many of them name it.
    per_bookie: dict[str, int]
    #: Ledgers whose metadata does not decode: they may name a bookie, nobody can tell.
    undecodable: tuple[int, ...] = ()


async def ledgers_naming(ctx: CheckContext, bookies: Sequence[str]) -> Found:
    """One walk of the ledger tree (the checks' walker): who names which bookie."""
    wanted = set(bookies)
    ledgers: list[int] = []
    undecodable: list[int] = []
    per_bookie = dict.fromkeys(bookies, 0)
    async for rec in ctx.walker().ledgers():
        if rec.metadata is None:
            undecodable.append(rec.ledger_id)
            continue
        named = rec.metadata.bookies() & wanted
        if named:
            ledgers.append(rec.ledger_id)
            for b in named:
                per_bookie[b] += 1
    return Found(tuple(sorted(ledgers)), per_bookie, tuple(sorted(undecodable)))


async def refuse_unknown(ctx: CheckContext, found: Found) -> None:
    """UnknownBookieError for a bookie no ledger names, not registered, without a cookie."""
    registered = await ctx.registered()
    cookies = await all_known_bookies(ctx.store, ctx.root)
    for bookie, n in found.per_bookie.items():
        if n == 0 and bookie not in registered.available and bookie not in cookies:
            raise UnknownBookieError(
                f"unknown bookie {shown_name(bookie)}: no ledger names it, it is not "
                "registered and it has no cookie (a typo?); nothing was written"
            )


def moves_between(before: LedgerMetadata, after: LedgerMetadata | None) -> tuple[str, ...]:
    """The ensemble positions that changed, one line each (segments matched by first entry)."""
    if after is None:
        return ()
    old = {s.first_entry_id: s.bookies for s in before.segments}
    lines: list[str] = []
    for k, seg in enumerate(after.segment_ranges()):
        was = old.get(seg.first)
        if was is None or len(was) != len(seg.bookies):
            continue
        last = str(seg.last) if seg.last >= seg.first or after.closed else "open"
        for i, (a, b) in enumerate(zip(was, seg.bookies, strict=True)):
            if a != b:
                lines.append(f"segment {k} [{seg.first}-{last}] position {i} {a} -> {b}")
    return tuple(lines)


@dataclass(frozen=True, slots=True)
class LedgerResult:
    """How one ledger came out (or, with --dry-run, what would be done to it)."""

    ledger_id: int
    outcome: str
    #: One line per fragment: moved (or, with --dry-run, planned) "... old -> new".
    fragments: tuple[str, ...] = ()
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in (MOVED, NO_LONGER_NAMED, PLANNED)

    def to_json(self) -> dict[str, Any]:
        return {
            "ledger_id": self.ledger_id,
            "outcome": self.outcome,
            "fragments": list(self.fragments),
            "detail": self.detail or None,
        }

    def line(self) -> str:
        text = f"ledger {self.ledger_id}: {self.outcome}"
        if self.fragments:
            text += ": " + "; ".join(self.fragments)
        if self.detail:
            text += f" ({self.detail})"
        return text


# --- the connection, as the repairer must see it -----------------------------------------


@asynccontextmanager
async def followed(store: MetadataStore) -> AsyncIterator[WorkerConnection]:
    """Events that follow the session, so that a copy stops the moment it is suspended."""
    connected, disconnected = asyncio.Event(), asyncio.Event()
    (connected if store.connected else disconnected).set()
    states = store.states()

    async def follow() -> None:
        async for st in states:
            if st == SessionState.CONNECTED:
                disconnected.clear()
                connected.set()
            else:
                connected.clear()
                disconnected.set()

    task = asyncio.ensure_future(follow())
    try:
        yield WorkerConnection(connected, disconnected)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await states.aclose()


# --- moving ------------------------------------------------------------------------------


async def holder_of(urm: UnderreplicationManager, ledger_id: int) -> str:
    """Who holds a ledger's lock (LockDataFormat's bookieId), for the line saying so."""
    try:
        holder = await urm.replication_worker(ledger_id)
    except AuditorError as exc:  # a lock whose data does not decode
        return f"a holder whose lock data does not decode ({exc})"
    return holder if holder else "a holder that names no one"


class LedgerMover:
    """Moves ledgers off `bookies`, one locked ledger at a time (`recover`, `decommission`)."""

    def __init__(
        self,
        ctx: CheckContext,
        conn: WorkerConnection,
        bookies: Set[str],
        *,
        holder: str,
        log: Any,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ctx = ctx
        self.bookies = frozenset(bookies)
        self.clock = clock
        self.queue = ReplicationQueue(ctx.store, ctx.root, holder)
        self.state = WorkerState(enabled=True, running=True)
        self.repairer = LedgerRepairer(ctx, self.queue, conn, self.state, clock=clock, log=log)
        self.urm = UnderreplicationManager(ctx.store, ctx.root)

    async def move(self, ledger_id: int) -> LedgerResult:
        taken = await self.queue.acquire(ledger_id)
        if taken is None:
            holder = await holder_of(self.urm, ledger_id)
            return LedgerResult(ledger_id, LOCKED, (), f"its replication lock is held by {holder}")
        try:
            try:
                before = await self.repairer.read(ledger_id)
            except LedgerMetadataFormatError as exc:
                return LedgerResult(ledger_id, UNDECODABLE, (), str(exc))
            if before is None:
                return LedgerResult(ledger_id, NO_LONGER_NAMED, (), "the ledger was deleted")
            self.state.in_hand[ledger_id] = InHand(ledger_id, self.clock(), "planning")
            try:
                outcome = await self.repairer.repair(taken, replace=self.bookies)
            except (Disconnected, FencedOutError) as exc:
                outcome = Outcome(False, Failure.LOCK_LOST, str(exc))
            except (ConfigError, StoreUnavailableError):
                raise  # the same for every ledger: the run ends with it
            except AuditorError as exc:
                outcome = Outcome(False, Failure.ERROR, f"{type(exc).__name__}: {exc}")
            finally:
                self.state.in_hand.pop(ledger_id, None)
            try:
                after = await self.repairer.read(ledger_id)
            except LedgerMetadataFormatError:
                after = None
        finally:
            with contextlib.suppress(StoreUnavailableError):
                await self.queue.release(taken)
        moved = moves_between(before, after)
        if outcome.done:
            still = after is not None and bool(after.bookies() & self.bookies)
            if still:  # cannot be: the verification planned them all away
                return LedgerResult(ledger_id, str(Failure.VERIFY_FAILED), moved, "still named")
            return LedgerResult(ledger_id, MOVED if moved else NO_LONGER_NAMED, moved)
        assert outcome.failure is not None
        return LedgerResult(ledger_id, str(outcome.failure), moved, outcome.detail)

    async def close(self) -> None:
        await self.queue.close()


class LedgerPlanner:
    """`--dry-run`: the plan and the targets a real run would start from; writes nothing."""

    def __init__(self, ctx: CheckContext, bookies: Set[str], *, log: Any) -> None:
        self.ctx = ctx
        self.bookies = frozenset(bookies)
        self.log = log
        self.urm = UnderreplicationManager(ctx.store, ctx.root)
        self.rng = random.Random()
        self.placements = PlacementSource(ctx, log=log)

    async def plan(self, ledger_id: int) -> LedgerResult:
        ctx = self.ctx
        rec = await ctx.walker().read(ledger_id)
        if rec is None:
            return LedgerResult(ledger_id, NO_LONGER_NAMED, (), "the ledger was deleted")
        if rec.metadata is None:
            return LedgerResult(ledger_id, UNDECODABLE, (), str(rec.error))
        md = rec.metadata
        mark = await self.urm.get_mark(ledger_id)
        replicas = mark.replicas if isinstance(mark, UnderreplicatedLedger) else ()
        registered = await ctx.registered()
        plan = plan_ledger(
            md,
            registered=registered.available,
            answers=await bookie_answers(ctx, md),
            mark_replicas=replicas,
            replace=self.bookies,
        )
        holder = None
        if await self.urm.is_being_replicated(ledger_id):
            holder = await holder_of(self.urm, ledger_id)
        if plan.skipped is not None and not plan.repairs and not plan.open_tail:
            return LedgerResult(
                ledger_id, str(Failure.ERROR), (), f"cannot be planned: {plan.skipped}"
            )
        placement = await self.placements.placement(md, registered, self.bookies)
        lines: list[str] = []
        problems: list[str] = []
        for _, repairs, targets in placement.targets(md, plan.repairs, self.rng):
            if isinstance(targets, NoTargetError):
                problems.append(f"{Failure.NO_TARGET}: {targets}")
                lines.extend(f"{describe(r)} -> (no target)" for r in repairs)
                continue
            lines.extend(f"{describe(r)} -> {targets[r.bookie_index]}" for r in repairs)
        lines.extend(f"{describe(r)} -> not moved: the ledger is open" for r in plan.open_tail)
        if holder is not None:
            problems.insert(0, f"would be skipped: its replication lock is held by {holder}")
            outcome = LOCKED
        elif problems:
            outcome = str(Failure.NO_TARGET)
        elif plan.open_tail:
            outcome = str(Failure.OPEN_LEDGER)
            problems.append("the last segment of an open ledger is never copied")
        elif plan.unknown:
            outcome = str(Failure.UNKNOWN_BOOKIES)
            problems.append(f"no answer from {', '.join(plan.unknown)}")
        else:
            outcome = PLANNED if lines else NO_LONGER_NAMED
        return LedgerResult(ledger_id, outcome, tuple(lines), "; ".join(problems))


# --- the command -------------------------------------------------------------------------


@dataclass
class Summary:
    bookies: tuple[str, ...]
    dry_run: bool
    found: Found
    results: list[LedgerResult] = field(default_factory=list)

    @property
    def not_moved(self) -> list[LedgerResult]:
        return [r for r in self.results if not r.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "summary": True,
            "bookies": list(self.bookies),
            "dry_run": self.dry_run,
            "ledgers": len(self.found.ledgers),
            "per_bookie": self.found.per_bookie,
            "moved": sum(1 for r in self.results if r.outcome == MOVED),
            "planned": sum(1 for r in self.results if r.outcome == PLANNED),
            "no_longer_named": sum(1 for r in self.results if r.outcome == NO_LONGER_NAMED),
            "not_moved": [r.to_json() for r in self.not_moved],
            "metadata_invalid": list(self.found.undecodable),
        }

    def lines(self) -> list[str]:
        names = ", ".join(self.bookies)
        n = len(self.found.ledgers)
        if self.dry_run:
            verb = "names" if n == 1 else "name"
            head = f"dry run: {n} ledger{'s' * (n != 1)} {verb} {names}; nothing was written"
        else:
            moved = sum(1 for r in self.results if r.outcome == MOVED)
            gone = sum(1 for r in self.results if r.outcome == NO_LONGER_NAMED)
            head = (
                f"recover {names}: {n} ledger{'s' * (n != 1)} named "
                f"{'it' if len(self.bookies) == 1 else 'them'}; {moved} moved, "
                f"{gone} no longer named, {len(self.not_moved)} not moved"
            )
        out = [head]
        out.extend(f"  not moved: {r.line()}" for r in self.not_moved if not self.dry_run)
        out.extend(f"  {r.line()}" for r in self.not_moved if self.dry_run)
        if self.found.undecodable:
            shown = ", ".join(map(str, self.found.undecodable[:10]))
            more = " ..." if len(self.found.undecodable) > 10 else ""
            out.append(
                f"  metadata that does not decode (may name them; not looked at): {shown}{more}"
            )
        return out

    @property
    def exit_code(self) -> int:
        return 1 if self.not_moved or self.found.undecodable else 0


def emit_result(
    r: LedgerResult,
    index: int,
    total: int,
    *,
    as_json: bool,
    dry_run: bool,
    out: TextIO,
    err: TextIO,
) -> None:
    if as_json:
        out.write(json.dumps(r.to_json()) + "\n")
        out.flush()
    elif dry_run:
        out.write(r.line() + "\n")
    else:
        err.write(f"[{index}/{total}] {r.line()}\n")
        err.flush()


async def cmd_recover(
    target: ClusterTarget,
    config: AuditorConfig,
    bookies_text: str,
    *,
    dry_run: bool,
    as_json: bool,
    holder: str | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    from auditor.logs import configure_logging, get_logger

    bookies = parse_bookies(bookies_text)
    configure_logging(level=logging.WARNING)
    log = get_logger("auditor.recover")
    async with (
        connect(target) as (store, manager),
        open_context(store, target.root, manager, config) as ctx,
    ):
        ctx.log = log
        found = await ledgers_naming(ctx, bookies)
        await refuse_unknown(ctx, found)
        summary = Summary(bookies, dry_run, found)
        total = len(found.ledgers)
        if dry_run:
            planner = LedgerPlanner(ctx, set(bookies), log=log)
            for i, lid in enumerate(found.ledgers, 1):
                r = await planner.plan(lid)
                summary.results.append(r)
                emit_result(r, i, total, as_json=as_json, dry_run=True, out=out, err=err)
        else:
            async with followed(store) as conn:
                mover = LedgerMover(
                    ctx, conn, set(bookies), holder=holder or default_lock_holder(), log=log
                )
                try:
                    for i, lid in enumerate(found.ledgers, 1):
                        r = await mover.move(lid)
                        summary.results.append(r)
                        emit_result(r, i, total, as_json=as_json, dry_run=False, out=out, err=err)
                finally:
                    with contextlib.suppress(AuditorError):
                        await mover.close()
    if as_json:
        out.write(json.dumps(summary.to_json()) + "\n")
    else:
        for line in summary.lines():
            out.write(line + "\n")
    return summary.exit_code


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "recover",
        help="move every ledger off bookies now (BookKeeper's shell recover); "
        "exit 0 all moved, 1 some not",
    )
    p.add_argument("bookies", metavar="BOOKIE[,BOOKIE...]", help="bookie ids, comma separated")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print each ledger's planned fragment moves; write nothing",
    )
    cluster_args(p)
    config_args(p)
    bind(p, recover_command)


async def recover_command(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    return await cmd_recover(
        target_of_args(args, config),
        config,
        args.bookies,
        dry_run=args.dry_run,
        as_json=args.json,
    )
