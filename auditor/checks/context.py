"""The CLI, the daemon and a scan's partitions each give a driver its store, bookie client,
configuration and permission to mark in their own way; one bundle lets every driver be
written once, and holds the one switch for writes.

The I/O a check driver needs, bundled: ZooKeeper, the bookie client, config, marking.

Analysis cores never see this; drivers take it, gather inputs, call the core,
and record what it found. Marking goes through `mark_underreplicated` so that
`--mark` (or the daemon's leadership) is the single switch for writes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from auditor.bookie.client import BookieClient
from auditor.bookie.tls import bookie_tls
from auditor.checks.findings import Check, CheckReport, LedgerOutcome, PendingMark
from auditor.checks.progress import reporting_progress
from auditor.checks.tally import ViolationLog
from auditor.config import AuditorConfig
from auditor.logs import get_logger
from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_tree import IdRange
from auditor.metadata.paths import ledger_path
from auditor.metadata.registry import BookieSet, read_bookies, resolve_bookie
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.metadata.walk import LedgerWalker, Walker
from auditor.store import MetadataStore, NodeChangedError

if TYPE_CHECKING:
    from auditor.index.sync import IndexSync

#: How often a mark is tried on a ledger whose metadata keeps changing under it (as
#: `reread.MAX_REANALYSES` for a report).
MAX_MARK_LOOKS = 3


@dataclass
class CheckContext:
    store: MetadataStore
    root: str
    manager: LedgerManager
    bookies: BookieClient
    config: AuditorConfig
    #: Whether this run may write under-replication marks.
    mark: bool = False
    clock: Callable[[], float] = time.time
    log: Any = field(default_factory=get_logger)
    #: Only ledgers in this range are walked (one partition of a scan).
    id_range: IdRange | None = None
    #: Told how each ledger came out, once per ledger and check (a scan's coverage rows).
    on_ledger: Callable[[LedgerOutcome], None] | None = None
    #: When set, marks are collected here instead of written: a scan writes them
    #: once, from its driver, after the retry stages.
    deferred_marks: list[PendingMark] | None = None
    #: Told how many ledgers wait for the replicas check's delayed re-check.
    on_retry_queue: Callable[[int], None] | None = None
    #: Told, while a check walks, (check, ledgers done, an estimate of the ledgers the walk
    #: will see or None): on its first ledger, then at most every 0.5 s
    #: (`checks.progress.HOOK_INTERVAL`). Active inside `reporting_progress(check)`.
    on_progress: Callable[[Check, int, int | None], None] | None = None
    #: The leader's metadata index; walks read it while it is current.
    index: IndexSync | None = None
    #: Bookies whose lost-bookie delay is pending (the daemon's restart rule): the
    #: checks leave their fragments alone, since they may only be restarting.
    held_bookies: Callable[[], frozenset[str]] = field(default=lambda: frozenset())
    #: Whether a lost-bookie audit follows the checks (the daemon's leader: its delay and
    #: the restart rule): a bookie that goes away while a check reads it is then left to
    #: that audit. A one-shot check has no audit after it and reports it (upstream's rule).
    defer_gone_bookies: bool = False

    def __post_init__(self) -> None:
        self.urm = UnderreplicationManager(
            self.store,
            self.root,
            store_ctime=self.config.bookkeeper.storeSystemTimeAsLedgerUnderreplicatedMarkTime,
        )

    def new_report(self, check: Check, **fields: Any) -> CheckReport:
        """An empty report of `check`, listing at most `checks.max_violations_listed`."""
        limit = self.config.checks.max_violations_listed
        return CheckReport(
            check, started_at=self.clock(), violations=ViolationLog(limit=limit), **fields
        )

    def reporting_progress(self, check: Check) -> AbstractContextManager[None]:
        """Around one run of `check`: its walk's `Progress` reports to `on_progress`."""
        hook = self.on_progress
        return reporting_progress(None if hook is None else partial(hook, check))

    def walker(self) -> Walker:
        if self.index is not None and self.index.ready.is_set():
            from auditor.index.store import IndexWalker

            return IndexWalker(self.index.index, self.store, self.id_range)
        return LedgerWalker(self.store, self.root, self.manager, self.id_range)

    def outcome(self, outcome: LedgerOutcome) -> None:
        if self.on_ledger is not None:
            self.on_ledger(outcome)

    async def registered(self) -> BookieSet:
        return await read_bookies(self.store, self.root)

    async def mark_underreplicated(
        self,
        report: CheckReport,
        ledger_id: int,
        missing: Sequence[str],
        *,
        version: int | None = None,
    ) -> bool:
        """Marks a ledger if this run may write; returns whether it did.

        With `version` (of the ledger's metadata the mark was decided on) the mark is
        written only while the ledger is still at that version, in the same transaction.
        If it changed meanwhile (a worker's commit is the common case: the index, or a
        long walk, a moment behind it), the metadata is read again and the mark kept for
        the `missing` bookies its ensembles still name: none left (the worker replaced
        them, or the ledger is gone), nothing is marked; some left (closed meanwhile,
        say), those are marked at the new version. `MAX_REANALYSES` looks at most."""
        if self.deferred_marks is not None:
            self.deferred_marks.append(PendingMark(report.check, ledger_id, tuple(missing)))
            return False
        if not self.mark:
            return False
        wanted = list(missing)
        for _ in range(MAX_MARK_LOOKS):
            judged = None if version is None else (self.ledger_path(ledger_id), version)
            try:
                outcome = await self.urm.mark_underreplicated(ledger_id, wanted, judged=judged)
            except NodeChangedError:
                again = await self.fresh_walker().read(ledger_id)
                named = (
                    set() if again is None or again.metadata is None else again.metadata.bookies()
                )
                still = [b for b in wanted if b in named]
                self.log.info(
                    "ledger changed before its mark; judged again",
                    ledger_id=ledger_id,
                    old_version=version,
                    new_version=None if again is None else again.znode_version,
                    still_named=still,
                    check=str(report.check),
                )
                if again is None or not still:
                    return False
                wanted, version = still, again.znode_version
                continue
            report.marked_underreplicated.append(ledger_id)
            self.log.info(
                "marked under-replicated",
                ledger_id=ledger_id,
                missing_replicas=wanted,
                outcome=outcome.value,
                check=str(report.check),
            )
            return True
        self.log.warning(
            "metadata kept changing; not marked this run",
            ledger_id=ledger_id,
            attempts=MAX_MARK_LOOKS,
            check=str(report.check),
        )
        return False

    def ledger_path(self, ledger_id: int) -> str:
        return ledger_path(self.manager, self.root, ledger_id)

    def fresh_walker(self) -> LedgerWalker:
        """Reads the store itself (never the index): for second looks."""
        return LedgerWalker(self.store, self.root, self.manager)


@asynccontextmanager
async def open_context(
    store: MetadataStore,
    root: str,
    manager: LedgerManager,
    config: AuditorConfig,
    *,
    mark: bool = False,
    id_range: IdRange | None = None,
) -> AsyncIterator[CheckContext]:
    """A context whose bookie client resolves ids through the cluster's registry."""

    async def resolve(bookie_id: str) -> tuple[str, int] | None:
        return await resolve_bookie(store, root, bookie_id)

    client = BookieClient(
        resolve,
        request_timeout=config.read_timeout,
        max_in_flight=config.checks.bookie_max_in_flight,
        list_capability_ttl=config.checks.list_capability_ttl,
        tls=bookie_tls(config.bookkeeper),
    )
    try:
        yield CheckContext(store, root, manager, client, config, mark=mark, id_range=id_range)
    finally:
        await client.close()
