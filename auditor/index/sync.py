"""A copy of the metadata is only worth walking if it never falls behind the store without
saying so; the order of the full read and the watch, and what a lost watch does, are what
make sure of that.

Keeping the index current: one full read, then a persistent recursive watch.

The order matters. The watch on the ledgers root is added first, then every
ledger is read; events that arrive meanwhile only mark ledgers dirty, and the
dirty ones are read again once the full read is done. A read issued after an
event returns a state at least as new as that event (ZooKeeper orders a
session's watch events before the data it reads afterwards), so the index
ends up current whatever the interleaving; no event's data is trusted, only
the read it causes. A delete is a read that finds nothing.

A gap (the watch is lost with the connection or the session; events in
between are gone) sends the index back to the start: add the watch again and
read everything again, removing ledgers that are gone. It is logged, counted,
and the index is not `ready` meanwhile, so checks walk ZooKeeper directly
instead of trusting a copy that may have missed changes.

Events for znodes that are not ledgers (bookie registrations, marks, locks,
which all live under the ledgers root) are dropped by the shape of the path.
A znode shaped like a ledger's that cannot be one (its path spells an id
beyond 2^63-1, or its name has the wrong count of digits) is never read: it is
noted as an invalid ledger znode, named as the walk names it, and forgotten
when it is deleted.
"""

from __future__ import annotations

import asyncio
import re
import time
from array import array
from collections.abc import Callable
from typing import Any

from auditor.index.store import MetadataIndex
from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_tree import UnexpectedZnode, misnamed_reason, out_of_range_reason
from auditor.metadata.paths import (
    ETCD_LEDGERS,
    InvalidLedgerIdError,
    check_ledger_id,
    etcd_ledger_id,
)
from auditor.metadata.walk import LedgerWalker
from auditor.store import (
    Event,
    EventType,
    Gap,
    MetadataStore,
    StoreUnavailableError,
    WatchUnsupportedError,
)

# A ledger's path in each tree, with any count of digits in the leaf's name: the
# right count is a ledger (if the id is valid), a wrong one an invalid ledger znode.
_LEGACY = (re.compile(r"^/(\d{2})/(\d{4})/L(\d+)$"), 4)
_LONG = (re.compile(r"^/(\d{3})/(\d{4})/(\d{4})/(\d{4})/L(\d+)$"), 4)
_FLAT = (re.compile(r"^/L(\d+)$"), 10)


def _classify(manager: LedgerManager, root: str, path: str) -> int | UnexpectedZnode | None:
    """The ledger a znode path names, an invalid ledger znode, or None (not ledger-shaped)."""
    if not path.startswith(root + "/"):
        return None
    rel = path[len(root) :]
    if manager is LedgerManager.ETCD:
        return _classify_etcd(rel, path)
    patterns: tuple[tuple[re.Pattern[str], int], ...]
    if manager is LedgerManager.FLAT:
        patterns = (_FLAT,)
    elif manager is LedgerManager.LEGACY_HIERARCHICAL:
        patterns = (_LEGACY,)
    elif manager is LedgerManager.LONG_HIERARCHICAL:
        patterns = (_LONG,)
    else:
        patterns = (_LEGACY, _LONG)
    for pattern, leaf_digits in patterns:
        m = pattern.match(rel)
        if m is None:
            continue
        if len(m.groups()[-1]) != leaf_digits:
            name = "L" + m.groups()[-1]
            return UnexpectedZnode(path, misnamed_reason(name, leaf_digits), invalid_ledger=True)
        try:
            return check_ledger_id(int("".join(m.groups())), where=path)
        except InvalidLedgerIdError as exc:
            return UnexpectedZnode(path, out_of_range_reason(path, exc), invalid_ledger=True)
    return None


def _classify_etcd(rel: str, path: str) -> int | UnexpectedZnode | None:
    """A key of BookKeeper's etcd driver under `<scope>/ledgers/`: its ledger, or an
    invalid ledger key named as the ranged walk names it."""
    head, _, name = rel.lstrip("/").partition("/")
    if head != ETCD_LEDGERS or not name or "/" in name:
        return None
    try:
        return etcd_ledger_id(name, where=path)
    except InvalidLedgerIdError as exc:
        return UnexpectedZnode(path, out_of_range_reason(path, exc), invalid_ledger=True)
    except ValueError as exc:
        return UnexpectedZnode(path, str(exc).removeprefix(f"{path}: "), invalid_ledger=True)


def ledger_id_of(manager: LedgerManager, root: str, path: str) -> int | None:
    """The ledger a znode path names, or None when it is not a valid ledger's znode."""
    found = _classify(manager, root, path)
    return found if isinstance(found, int) else None


def invalid_ledger_znode(manager: LedgerManager, root: str, path: str) -> UnexpectedZnode | None:
    """A znode shaped like a ledger's that cannot be one, named as the walk names it."""
    found = _classify(manager, root, path)
    return found if isinstance(found, UnexpectedZnode) else None


class IndexSync:
    """Runs for as long as the leader leads; `ready` is set while the index is current."""

    def __init__(
        self,
        store: MetadataStore,
        index: MetadataIndex,
        *,
        concurrency: int = 100,
        log: Any,
        on_resync: Callable[[str], None] | None = None,
        retry_delay: float = 1.0,
    ) -> None:
        self.store = store
        self.index = index
        self.concurrency = concurrency
        self.log = log.bind(component="index")
        self.on_resync = on_resync
        self.retry_delay = retry_delay
        self.ready = asyncio.Event()
        self.loads = 0
        self.resyncs = 0
        self.events = 0
        self.rereads = 0
        self.last_load_seconds = 0.0
        self.dirty: set[int] = set()
        #: Notified whenever the index changed after being loaded (reads after events).
        self.changed = asyncio.Condition()
        self.failed: BaseException | None = None
        self._failed = asyncio.Event()
        #: Told after each full load (metrics: size, bytes per ledger).
        self.on_loaded: Callable[[IndexSync], None] | None = None
        self._walker = LedgerWalker(store, index.root, index.manager)

    async def run(self) -> None:
        """Until cancelled; a failure it cannot retry (an old server) ends it, and
        checks then walk ZooKeeper as if there were no index."""
        try:
            while True:
                try:
                    queue = await self._watch()
                    await self._load()
                except StoreUnavailableError as exc:
                    self.log.warning("index load interrupted; starting again", error=str(exc))
                    await asyncio.sleep(self.retry_delay)
                    continue
                self.ready.set()
                reason = await self._follow(queue)
                self.ready.clear()
                self.resyncs += 1
                self.log.warning("index watch lost; reading every ledger again", reason=reason)
                if self.on_resync is not None:
                    self.on_resync(reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failed = exc
            self.ready.clear()
            self._failed.set()
            self.log.error(
                "metadata index stopped; checks walk the metadata store",
                error=f"{type(exc).__name__}: {exc}",
            )

    async def usable(self) -> bool:
        """Waits until the index is current (True) or has given up (False)."""
        if self.ready.is_set():
            return True
        waits = [
            asyncio.ensure_future(self.ready.wait()),
            asyncio.ensure_future(self._failed.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return self.ready.is_set()

    async def _watch(self) -> asyncio.Queue[Event | Gap]:
        while True:
            try:
                return await self.store.watch_tree(self.index.root)
            except WatchUnsupportedError:
                raise
            except StoreUnavailableError as exc:
                self.log.info("index cannot watch yet; retrying", error=str(exc))
                await asyncio.sleep(self.retry_delay)

    async def _load(self) -> None:
        """Reads every ledger; ledgers the index had that the walk did not see are gone."""
        started = time.monotonic()
        self.dirty.clear()  # everything is read now; what changes meanwhile is queued
        before = array("q", self.index.ids())
        pos = 0
        walker = LedgerWalker(self.store, self.index.root, self.index.manager)
        async for batch in walker.raw_batches(concurrency=self.concurrency):
            if pos < len(before):  # (a reload: what the walk passed over is gone)
                for ledger_id, _, _, _ in batch:
                    while pos < len(before) and before[pos] < ledger_id:
                        self.index.remove(before[pos])
                        pos += 1
                    if pos < len(before) and before[pos] == ledger_id:
                        pos += 1
            self.index.put_znodes(batch)
        for ledger_id in before[pos:]:
            self.index.remove(ledger_id)
        self.index.loaded_unexpected(walker.stats)
        if walker.stats.invalid_ledgers:
            self.log.warning(
                "invalid ledger znodes under the ledgers root: not ledgers, not checked",
                count=walker.stats.invalid_ledgers,
                examples=[str(u) for u in walker.stats.unexpected if u.invalid_ledger][:10],
            )
        self.loads += 1
        async with self.changed:
            self.changed.notify_all()
        self.last_load_seconds = time.monotonic() - started
        if self.on_loaded is not None:
            self.on_loaded(self)
        self.log.info(
            "index loaded",
            ledgers=len(self.index),
            seconds=round(self.last_load_seconds, 3),
            bookies=len(self.index.tables.bookies),
        )

    async def _follow(self, queue: asyncio.Queue[Event | Gap]) -> str:
        """Applies events until the watch is lost; returns why it was."""
        while True:
            item = await queue.get()
            while True:
                if isinstance(item, Gap):
                    return item.state
                self._note(item)
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
            try:
                await self._reread()
            except StoreUnavailableError as exc:
                # A read that failed may have been the only news of a change.
                return f"re-read failed: {exc}"

    def _note(self, event: Event) -> None:
        found = _classify(self.index.manager, self.index.root, event.path)
        if isinstance(found, int):
            self.events += 1
            self.dirty.add(found)
        elif isinstance(found, UnexpectedZnode):
            # Its data is never read, so a change is no news. (Beyond the first
            # UNEXPECTED_KEPT, counts are made exact again by the next full load.)
            if event.type == EventType.DELETED:
                self.index.remove_unexpected(found.path)
            elif event.type == EventType.CREATED and found.path not in self.index.unexpected:
                self.log.warning(
                    "invalid ledger znode: not a ledger, not checked", znode=str(found)
                )
                self.index.add_unexpected(found)

    async def _reread(self) -> None:
        """Reads the dirty ledgers again, `concurrency` at a time as one batch each."""
        while self.dirty:
            batch = [self.dirty.pop() for _ in range(min(self.concurrency, len(self.dirty)))]
            reads = await self._walker.read_many(batch)
            for ledger_id, rec in zip(batch, reads, strict=True):
                self.rereads += 1
                if rec is None:
                    self.index.remove(ledger_id)
                else:
                    self.index.put(rec)
        async with self.changed:
            self.changed.notify_all()
