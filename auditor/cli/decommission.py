"""`bk-auditor decommission BOOKIE`: empty a bookie that takes no writes, then remove its cookie.

BookKeeper's `decommissionbookie` (spec replication-worker.md §4.2) with the changes the
issue asks for:

* **Which bookies.** A writable bookie is refused (exit 1, nothing written): new
  ledgers would keep landing on it. Upstream refuses a read-only one too; we take it,
  but since a read-only bookie still serves reads, no worker (Java's or ours) finds its
  ledgers under-replicated: a mark naming it is judged whole and removed. So a
  read-only bookie's ledgers are moved by this command itself, exactly as `recover`
  moves them (each locked, planned with the bookie `requested`, copied from it and the
  other holders, committed, verified), and `--no-wait` is refused for it. A stopped
  (unregistered) bookie is lost to the workers: its ledgers are marked
  under-replicated with it as the missing replica, and the workers (any daemon with
  `worker.enabled`, or Java's AutoRecovery) move them.
* **No audit trigger and no fixed 30 s sleep**: we write the marks ourselves (the
  bookie check would write the same ones, after `lostBookieRecoveryDelay`), so the
  wait can begin at once and does not depend on who leads the auditor election.
* **The wait** follows each remaining ledger with a data watch (a safety
  re-read every `SAFETY_REREAD` seconds covers watches lost with a session), prints a
  progress line whenever the count of ledgers naming the bookie changes, and ends
  when none does. Upstream polls with no overall timeout and can wait forever
  (apache/bookkeeper#3887, e.g. an unrecoverable ledger): `--wait-timeout SECONDS`
  ends ours with exit 1 and a line saying how many ledgers still name the bookie. (The
  cluster flags' `--timeout` is already each metadata store call's limit.) If the bookie
  registers as writable again meanwhile, the wait stops with exit 1.
* Only then is the cookie deleted (read, then deleted at the version read: a bookie
  that rewrote it meanwhile keeps it). A missing cookie is a note, as upstream's warning.

Output: progress on stderr (`--json`: one object per progress step on stdout), then a
summary on stdout (`--json`: one final object with `"summary": true`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from auditor.checks.context import CheckContext, open_context
from auditor.cli.argtypes import MAX_DURATION, seconds
from auditor.cli.cluster import target_of_args
from auditor.cli.options import bind, cluster_args, config_args
from auditor.cli.recover import (
    LedgerMover,
    followed,
    ledgers_naming,
    parse_bookies,
    refuse_unknown,
)
from auditor.config import AuditorConfig, load_config
from auditor.errors import AuditorError, ConfigError
from auditor.metadata.cluster import ClusterTarget, connect
from auditor.metadata.paths import ledger_path
from auditor.metadata.registry import cookie_path
from auditor.metadata.serde import LedgerMetadataFormatError, decode_ledger_metadata
from auditor.metadata.underreplication import MarkOutcome
from auditor.store import BadVersionError, NoNodeError
from auditor.worker.loop import default_lock_holder

#: Seconds between re-reads of every remaining ledger, watches or not (a watch is lost
#: with its session, and a re-read costs one read per remaining ledger).
SAFETY_REREAD = 30.0
#: Ledger ids a timeout line names (the count is exact).
IDS_SHOWN = 10


class BookieWritableError(AuditorError):
    """The bookie is writable: it would keep taking new ledgers."""


class DecommissionIncompleteError(AuditorError):
    """The wait ended (timeout, the bookie came back, ledgers not moved): the cookie stays."""


class UndecodableLedgersError(AuditorError):
    """Ledgers whose metadata does not decode may name the bookie: it cannot be shown empty.

    Upstream's `decommissionbookie` aborts there too. Going on would end with the cookie
    deleted and the operator told the bookie is empty, when those ledgers may still need it.
    """


def _count(n: int) -> str:
    return f"{n} ledger{'s' * (n != 1)}"


def _ids(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:IDS_SHOWN]))
    return shown + (", ..." if len(ids) > IDS_SHOWN else "")


@dataclass
class Progress:
    """Where progress goes: lines on stderr, or JSON objects on stdout."""

    bookie: str
    as_json: bool
    out: TextIO
    err: TextIO
    started: float

    def step(self, event: str, text: str, **fields: Any) -> None:
        if self.as_json:
            doc = {"bookie": self.bookie, "event": event, **fields}
            self.out.write(json.dumps(doc) + "\n")
            self.out.flush()
        else:
            self.err.write(f"decommission {self.bookie}: {text}\n")
            self.err.flush()


class NameWait:
    """Until no ledger of a set names `bookie`: data watches, re-reads, a deadline."""

    def __init__(
        self,
        ctx: CheckContext,
        bookie: str,
        ledgers: list[int],
        *,
        progress: Progress,
        safety: float = SAFETY_REREAD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self.bookie = bookie
        self.remaining = set(ledgers)
        self.progress = progress
        self.safety = safety
        self.clock = clock
        self._wake = asyncio.Event()
        self._fired: set[int] = set(ledgers)
        self._watchers: dict[int, asyncio.Task[None]] = {}

    async def _still_names(self, lid: int) -> bool:
        """Reads the ledger with a watch; whether it still names the bookie."""
        path = ledger_path(self.ctx.manager, self.ctx.root, lid)
        try:
            data, _, changed = await self.ctx.store.get_watched(path)
        except NoNodeError:
            return False  # deleted: it names nobody
        old = self._watchers.pop(lid, None)
        if old is not None:
            old.cancel()

        async def relay() -> None:
            await changed.wait()
            self._fired.add(lid)
            self._wake.set()

        self._watchers[lid] = asyncio.ensure_future(relay())
        try:
            md = decode_ledger_metadata(data, lid)
        except LedgerMetadataFormatError:
            return True  # cannot tell: it stays until it decodes
        return self.bookie in md.bookies()

    async def _writable_again(self) -> bool:
        return self.bookie in (await self.ctx.registered()).writable

    async def run(self, within: float | None) -> list[int]:
        """The ledgers still naming the bookie when it ends: [] done, else timed out."""
        deadline = None if within is None else self.clock() + within
        shown: int | None = None
        try:
            while True:
                self._wake.clear()
                todo, self._fired = self._fired, set()
                for lid in sorted(todo & self.remaining):
                    if not await self._still_names(lid):
                        self.remaining.discard(lid)
                        self._drop(lid)
                if len(self.remaining) != shown:
                    shown = len(self.remaining)
                    self.progress.step(
                        "waiting",
                        f"{_count(shown)} still {'names' if shown == 1 else 'name'} it",
                        remaining=shown,
                        elapsed_s=round(time.monotonic() - self.progress.started, 1),
                    )
                if not self.remaining:
                    return []
                if await self._writable_again():
                    left = sorted(self.remaining)
                    raise DecommissionIncompleteError(
                        f"{self.bookie} registered again as a writable bookie; stopped with "
                        f"{_count(len(left))} still naming it ({_ids(left)}); the cookie stays"
                    )
                pause = self.safety
                if deadline is not None:
                    pause = min(pause, deadline - self.clock())
                    if pause <= 0:
                        return sorted(self.remaining)
                try:
                    await asyncio.wait_for(self._wake.wait(), pause)
                except TimeoutError:
                    if deadline is not None and self.clock() >= deadline:
                        self._fired |= self.remaining  # one last look before giving up
                        deadline = self.clock()
                        continue
                    self._fired |= self.remaining  # the safety re-read
        finally:
            for t in self._watchers.values():
                t.cancel()
            await asyncio.gather(*self._watchers.values(), return_exceptions=True)

    def _drop(self, lid: int) -> None:
        t = self._watchers.pop(lid, None)
        if t is not None:
            t.cancel()


async def delete_cookie(ctx: CheckContext, bookie: str, progress: Progress) -> bool:
    """Deletes `cookies/<bookie>` at the version read; False when there was none."""
    path = cookie_path(ctx.root, bookie)
    try:
        _, stat = await ctx.store.get(path)
    except NoNodeError:
        progress.err.write(f"bk-auditor: note: no cookie to remove at {path}\n")
        return False
    try:
        await ctx.store.delete(path, int(stat.version))
    except NoNodeError:
        progress.err.write(f"bk-auditor: note: no cookie to remove at {path}\n")
        return False
    except BadVersionError:
        raise DecommissionIncompleteError(
            f"{path} changed while it was being deleted (has {bookie} started again?); "
            "it was not deleted"
        ) from None
    return True


async def cmd_decommission(
    target: ClusterTarget,
    config: AuditorConfig,
    bookie_text: str,
    *,
    wait: bool,
    wait_timeout: float | None,
    as_json: bool,
    ignore_undecodable: bool = False,
    holder: str | None = None,
    safety: float = SAFETY_REREAD,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    from auditor.logs import configure_logging, get_logger

    bookies = parse_bookies(bookie_text)
    if len(bookies) != 1:
        raise ConfigError("decommission takes one bookie at a time")
    [bookie] = bookies
    if wait_timeout is not None and wait_timeout <= 0:
        raise ConfigError(f"--wait-timeout must be positive, got {wait_timeout:g}")
    configure_logging(level=logging.WARNING)
    log = get_logger("auditor.decommission")
    progress = Progress(bookie, as_json, out, err, time.monotonic())
    summary: dict[str, Any] = {"summary": True, "bookie": bookie}
    async with (
        connect(target) as (store, manager),
        open_context(store, target.root, manager, config) as ctx,
    ):
        ctx.log = log
        registered = await ctx.registered()
        if bookie in registered.writable:
            raise BookieWritableError(
                f"{bookie} is writable: make it read-only or stop it first "
                "(a writable bookie keeps taking new ledgers); nothing was written"
            )
        readonly = bookie in registered.readonly
        if readonly and not wait:
            raise ConfigError(
                f"--no-wait: {bookie} is read-only, so this command moves its ledgers "
                "itself (workers leave a bookie that serves reads alone); run it without "
                "--no-wait"
            )
        found = await ledgers_naming(ctx, [bookie])
        await refuse_unknown(ctx, found)
        if found.undecodable and not ignore_undecodable:
            raise UndecodableLedgersError(
                f"the metadata of {_count(len(found.undecodable))} does not decode "
                f"({_ids(list(found.undecodable))}); any of them may name {bookie}, so it "
                "cannot be shown empty; nothing was written. Repair or delete them, or pass "
                "--ignore-undecodable to decommission without them"
            )
        ledgers = list(found.ledgers)
        summary.update(
            state="read-only" if readonly else "not registered",
            ledgers=len(ledgers),
            metadata_invalid=list(found.undecodable),
        )
        if found.undecodable:
            err.write(
                f"bk-auditor: note: {len(found.undecodable)} ledgers' metadata does not "
                f"decode; they may name {bookie} and are not followed: "
                f"{_ids(list(found.undecodable))}\n"
            )
        if readonly:
            await _move_here(ctx, bookie, ledgers, progress, holder, log, summary)
        else:
            await _mark(ctx, bookie, ledgers, progress, summary)
            if not await ctx.urm.is_replication_enabled():
                err.write(
                    "bk-auditor: note: auto-recovery is disabled (underreplication/disable): "
                    "no worker takes the marks until it is enabled\n"
                )
        if not wait:
            summary.update(waited=False, cookie_deleted=False)
            _finish(out, as_json, summary, f"{bookie}: not waiting (--no-wait); the cookie stays")
            return 0
        left = await NameWait(ctx, bookie, ledgers, progress=progress, safety=safety).run(
            wait_timeout
        )
        if left:
            raise DecommissionIncompleteError(
                f"decommission of {bookie} timed out after {wait_timeout:g}s: "
                f"{_count(len(left))} still {'names' if len(left) == 1 else 'name'} it "
                f"({_ids(left)}); the marks and the cookie stay"
            )
        if await _writable(ctx, bookie):
            raise DecommissionIncompleteError(
                f"{bookie} registered again as a writable bookie; the cookie stays"
            )
        deleted = await delete_cookie(ctx, bookie, progress)
    summary.update(waited=True, cookie_deleted=deleted)
    what = f"cookie {cookie_path(target.root, bookie)} deleted" if deleted else "no cookie"
    _finish(out, as_json, summary, f"decommissioned {bookie}: no ledger names it; {what}")
    return 0


async def _writable(ctx: CheckContext, bookie: str) -> bool:
    return bookie in (await ctx.registered()).writable


async def _mark(
    ctx: CheckContext,
    bookie: str,
    ledgers: list[int],
    progress: Progress,
    summary: dict[str, Any],
) -> None:
    """Marks every ledger naming the bookie, with it as the missing replica."""
    outcomes = dict.fromkeys((o.value for o in MarkOutcome), 0)
    for lid in ledgers:
        outcomes[(await ctx.urm.mark_underreplicated(lid, [bookie])).value] += 1
    n = len(ledgers)
    progress.step(
        "marked",
        f"marked {_count(n)} under-replicated "
        f"({outcomes['created']} new, {outcomes['merged']} merged, "
        f"{outcomes['unchanged']} already marked)",
        marked=n,
        **outcomes,
    )
    summary.update(marked=n)


async def _move_here(
    ctx: CheckContext,
    bookie: str,
    ledgers: list[int],
    progress: Progress,
    holder: str | None,
    log: Any,
    summary: dict[str, Any],
) -> None:
    """A read-only bookie: every ledger moved by this command, as `recover` moves it."""
    failed: list[str] = []
    async with followed(ctx.store) as conn:
        mover = LedgerMover(ctx, conn, {bookie}, holder=holder or default_lock_holder(), log=log)
        try:
            for i, lid in enumerate(ledgers, 1):
                r = await mover.move(lid)
                progress.step("ledger", f"[{i}/{len(ledgers)}] {r.line()}", **r.to_json())
                if not r.ok:
                    failed.append(r.line())
        finally:
            with contextlib.suppress(AuditorError):
                await mover.close()
    summary.update(moved=len(ledgers) - len(failed))
    if failed:
        raise DecommissionIncompleteError(
            f"{len(failed)} of {len(ledgers)} ledgers were not moved off {bookie}; the "
            f"cookie stays (first: {failed[0]})"
        )


def _finish(out: TextIO, as_json: bool, summary: dict[str, Any], text: str) -> None:
    out.write((json.dumps(summary) if as_json else text) + "\n")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "decommission",
        help="empty a read-only or stopped bookie, then delete its cookie "
        "(BookKeeper's decommissionbookie)",
    )
    p.add_argument("bookie", metavar="BOOKIE", help="the bookie id")
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="mark its ledgers and return (a stopped bookie only); the cookie stays",
    )
    p.add_argument(
        "--ignore-undecodable",
        action="store_true",
        help="go on although some ledgers' metadata does not decode (they may name the "
        "bookie and are not followed); without it, such ledgers stop the command",
    )
    p.add_argument(
        "--wait-timeout",
        type=seconds(MAX_DURATION),
        default=None,
        metavar="SECONDS",
        help="give up waiting after this long (exit 1); default: wait until done",
    )
    cluster_args(p)
    config_args(p)
    bind(p, decommission_command)


async def decommission_command(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    return await cmd_decommission(
        target_of_args(args, config),
        config,
        args.bookie,
        wait=not args.no_wait,
        wait_timeout=args.wait_timeout,
        as_json=args.json,
        ignore_undecodable=args.ignore_undecodable,
    )
