"""Every check walks every ledger, and on a large cluster a walk of one ZooKeeper read per
ledger takes long and loads ZooKeeper; the leader keeps the metadata in memory, so that its
walks are a pass over memory instead.

The leader's in-memory ledger metadata index, and a walker that reads from it.

`IndexWalker` has the interface of `LedgerWalker` (records in id order, stats,
`max_ledger_id`, `read`), so the check drivers do not know which one they were given.
`read` still goes to ZooKeeper: it is the fresh look BP-34 asks for before a violation
is reported, and that must not come from a cache.

Znodes the walk could not take as ledgers (`UnexpectedZnode`, a path spelling
an id beyond 2^63-1 for one) are kept beside the records, from the last full
load and, for invalid ledger znodes, from events since; an `IndexWalker` hands
them out in its stats as a ZooKeeper walk would, so the daemon names them too.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterable, Iterator

from auditor.index.decode import pack_decoded, pack_v3
from auditor.index.packed import (
    Tables,
    error_of,
    is_error,
    pack,
    pack_error,
    unpack,
    version_of,
)
from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_tree import UNEXPECTED_KEPT, IdRange, UnexpectedZnode, WalkStats
from auditor.metadata.paths import ledger_path
from auditor.metadata.serde import LedgerMetadataFormatError
from auditor.metadata.walk import LedgerRecord, LedgerWalker, RawLedger
from auditor.store import MetadataStore

#: Records handed out per turn of the event loop while iterating (a walk of
#: millions of ledgers must not starve the bookie client and the API).
YIELD_EVERY = 512


class MetadataIndex:
    """Ledger id -> packed metadata, for one ledgers root."""

    def __init__(self, root: str, manager: LedgerManager) -> None:
        self.root = root.rstrip("/")
        self.manager = manager
        self.tables = Tables()
        self._records: dict[int, bytes] = {}
        #: Unexpected znodes by path (the first UNEXPECTED_KEPT), and how many there are.
        self.unexpected: dict[str, UnexpectedZnode] = {}
        self.unexpected_count = 0
        self.invalid_ledgers = 0

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, ledger_id: int) -> bool:
        return ledger_id in self._records

    def put(self, rec: LedgerRecord) -> None:
        if rec.metadata is not None:
            self._records[rec.ledger_id] = pack(rec.metadata, rec.znode_version, self.tables)
        else:
            reason = rec.error.reason if rec.error is not None else "metadata missing"
            self._records[rec.ledger_id] = pack_error(reason, rec.znode_version, self.tables)

    def put_znodes(self, znodes: Iterable[RawLedger]) -> None:
        """Ledgers straight from their znodes' bytes: what `put` would store for their
        decoded records, without the records (`decode.pack_znode`, inlined: the load's
        loop runs once a ledger)."""
        records = self._records
        tables = self.tables
        for ledger_id, _, data, stat in znodes:
            version, ctime = int(stat.version), int(stat.ctime)
            record = pack_v3(data, version, ctime, tables)
            if record is None:
                record = pack_decoded(ledger_id, data, version, ctime, tables)
            records[ledger_id] = record

    def remove(self, ledger_id: int) -> None:
        self._records.pop(ledger_id, None)

    def loaded_unexpected(self, stats: WalkStats) -> None:
        """What a full walk found besides ledgers replaces what was known."""
        self.unexpected = {u.path: u for u in stats.unexpected}
        self.unexpected_count = stats.unexpected_count
        self.invalid_ledgers = stats.invalid_ledgers

    def add_unexpected(self, znode: UnexpectedZnode) -> None:
        if znode.path in self.unexpected:
            return
        self.unexpected_count += 1
        self.invalid_ledgers += znode.invalid_ledger
        if len(self.unexpected) < UNEXPECTED_KEPT:
            self.unexpected[znode.path] = znode

    def remove_unexpected(self, path: str) -> None:
        gone = self.unexpected.pop(path, None)
        if gone is not None:
            self.unexpected_count -= 1
            self.invalid_ledgers -= gone.invalid_ledger

    def note_unexpected(self, stats: WalkStats) -> None:
        """Adds what is known besides ledgers to a walk's stats."""
        stats.unexpected.extend(list(self.unexpected.values())[:UNEXPECTED_KEPT])
        stats.unexpected_count += self.unexpected_count
        stats.invalid_ledgers += self.invalid_ledgers

    def ids(self) -> list[int]:
        return sorted(self._records)

    def get(self, ledger_id: int) -> LedgerRecord | None:
        record = self._records.get(ledger_id)
        if record is None:
            return None
        return self._record(ledger_id, record)

    def _record(self, ledger_id: int, record: bytes) -> LedgerRecord:
        path = ledger_path(self.manager, self.root, ledger_id)
        version = version_of(record)
        if is_error(record):
            error = LedgerMetadataFormatError(ledger_id, error_of(record, self.tables))
            return LedgerRecord(ledger_id, path, None, version, error)
        return LedgerRecord(ledger_id, path, unpack(ledger_id, record, self.tables), version)

    def records(self, id_range: IdRange | None = None) -> Iterator[LedgerRecord]:
        """Every ledger in id order (a snapshot of the ids; later removals are skipped)."""
        for ledger_id in self.ids():
            if id_range is not None and ledger_id not in id_range:
                continue
            record = self._records.get(ledger_id)
            if record is not None:
                yield self._record(ledger_id, record)

    def bytes_per_ledger(self) -> float:
        """What the index costs per ledger: the dict, its keys, the packed records,
        and the interned tables, divided by the number of ledgers."""
        n = len(self._records)
        if n == 0:
            return 0.0
        total = sys.getsizeof(self._records)
        total += sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in self._records.items())
        for table in (self.tables.bookies, self.tables.passwords, self.tables.reasons):
            total += sys.getsizeof(table.values) + sys.getsizeof(table.numbers)
            total += sum(sys.getsizeof(v) for v in table.values)
        return total / n


class IndexWalker:
    """A `LedgerWalker` whose walk reads the index; fresh reads go to ZooKeeper."""

    def __init__(
        self, index: MetadataIndex, store: MetadataStore, id_range: IdRange | None = None
    ) -> None:
        self.index = index
        self.id_range = id_range
        self.stats = WalkStats()
        self._walker = LedgerWalker(store, index.root, index.manager, id_range)

    async def max_ledger_id(self) -> int | None:
        ids = self.index.ids()
        return ids[-1] if ids else None

    async def ledgers(self, concurrency: int = 64) -> AsyncIterator[LedgerRecord]:
        if self.id_range is None or self.id_range.last:
            # One range of a partitioned walk names them, as a ZooKeeper walk does.
            self.index.note_unexpected(self.stats)
        for n, rec in enumerate(self.index.records(self.id_range), 1):
            self.stats.ledgers += 1
            if rec.error is not None:
                self.stats.corrupt += 1
            yield rec
            if n % YIELD_EVERY == 0:
                await asyncio.sleep(0)

    async def ledger_ids(self) -> AsyncIterator[int]:
        async for rec in self.ledgers():
            yield rec.ledger_id

    async def read(self, ledger_id: int, path: str | None = None) -> LedgerRecord | None:
        return await self._walker.read(ledger_id, path)
