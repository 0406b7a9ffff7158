"""A test cluster may hold millions of entries, so an emulated bookie can keep nothing per
entry it was seeded with, yet must give back what a client wrote byte for byte.

How an emulated bookie holds entries: seeded runs built on read, added bodies kept as sent.

Seeded ledgers are sorted half-open runs of entry ids with a body
factory, and a body is generated when it is read. Entries that arrive over
the wire (ADD_ENTRY) are kept byte for byte beside the runs. `Storage` says
which of BookKeeper's ledger storages the emulator imitates, which changes
only how it answers a request to list a ledger's entries.
"""

from __future__ import annotations

import enum
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from typing import Final

from auditor.bookie.availability import Availability
from auditor.bookie.protocol import ENTRY_HEADER_SIZE, decode_entry_header, encode_entry_body
from auditor.metadata.model import DigestType

__all__ = [
    "DB_STORAGES",
    "BodyFactory",
    "Ledger",
    "Storage",
    "as_runs",
    "bookie_lac",
    "default_body",
    "make_body_factory",
    "max_lac",
    "note_added",
]

#: Builds the stored body of a seeded entry: (ledger_id, entry_id) -> body.
BodyFactory = Callable[[int, int], bytes]


class Storage(enum.StrEnum):
    """Which ledger storage is imitated: it decides how GET_LIST_OF_ENTRIES_OF_LEDGER is
    answered, which copy of an entry added twice is kept, and how the LAC a read reports
    (`maxLAC`) is tracked. Each difference was seen on a real 4.17.2 bookie
    (tests/interop/test_conformance.py)."""

    #: SortedLedgerStorage (upstream default): answers with the availability encoding.
    #: An entry added again while its first copy is still in the memtable keeps the
    #: first copy (a real bookie flushes its memtable every `flushInterval`; the
    #: emulator does at `BookieEmulator.flush`). The LAC is the highest any add carried.
    SORTED = "sorted"
    #: InterleavedLedgerStorage: lists as SORTED does; an entry added again is replaced.
    INTERLEAVED = "interleaved"
    #: DbLedgerStorage: ENOLEDGER for unknown ledgers, no answer at all for held ones;
    #: an entry added again is replaced. Its LAC is looked up in the last entry when
    #: first asked for (or when READ_LAC or WRITE_LAC touch the ledger) and only then
    #: follows the adds, so adds before that moment do not count.
    DBLEDGER = "dbledger"
    #: DbLedgerStorage with numReadWorkerThreads=0: closes the connection for held ones.
    DBLEDGER_NO_WORKERS = "dbledger-noworkers"


#: The modes that imitate DbLedgerStorage, whatever they do with list requests.
DB_STORAGES: Final = frozenset({Storage.DBLEDGER, Storage.DBLEDGER_NO_WORKERS})


def make_body_factory(
    payload_size: int = 16, digest_type: DigestType = DigestType.CRC32C, password: bytes = b""
) -> BodyFactory:
    """Bodies of a writer that wrote `payload_size`-byte payloads, entry after entry.

    The payload is the ledger id and entry id (big-endian int64 each), cut or
    zero-padded to `payload_size`; lastAddConfirmed is entry - 1 and the length
    field counts all payloads up to this entry, as a sequential writer would.
    """

    def body(ledger_id: int, entry_id: int) -> bytes:
        stamp = ledger_id.to_bytes(8, "big", signed=True) + entry_id.to_bytes(8, "big", signed=True)
        payload = stamp[:payload_size].ljust(payload_size, b"\0")
        return encode_entry_body(
            ledger_id,
            entry_id,
            entry_id - 1,
            (entry_id + 1) * payload_size,
            payload,
            digest_type,
            password,
        )

    return body


default_body: Final = make_body_factory()


def as_runs(entries: Iterable[int | range]) -> list[tuple[int, int]]:
    """Entries given as ints and step-1 ranges, as sorted half-open (start, stop) runs."""
    items: Iterable[int | range] = [entries] if isinstance(entries, range) else entries
    runs: list[tuple[int, int]] = []
    singles: list[int] = []
    for item in items:
        if isinstance(item, range):
            if item.step != 1:
                raise ValueError(f"entry ranges must have step 1, got {item}")
            if len(item):
                runs.append((item.start, item.stop))
        else:
            singles.append(int(item))
    if singles:
        singles.sort()
        start = prev = singles[0]
        for e in singles[1:]:
            if e > prev + 1:
                runs.append((start, prev + 1))
                start = e
            prev = e
        runs.append((start, prev + 1))
    runs.sort()
    if runs and runs[0][0] < 0:
        raise ValueError(f"entry ids must be >= 0, got {runs[0][0]}")
    return runs


class Ledger:
    """One ledger's entries: seeded runs (bodies built on read) plus bodies received."""

    __slots__ = (
        "_availability",
        "_last_body",
        "bodies",
        "factories",
        "fenced",
        "lac",
        "lac_body",
        "lac_tracked",
        "master_key",
        "memtable",
        "starts",
        "stops",
    )

    def __init__(self, key: bytes | None = None) -> None:
        # Seeded runs: parallel sorted lists, disjoint half-open [start, stop).
        self.starts: list[int] = []
        self.stops: list[int] = []
        self.factories: list[BodyFactory] = []
        self.bodies: dict[int, bytes] = {}
        self.master_key = key
        self.fenced = False
        self.lac_body: bytes | None = None
        #: The LAC the ledger storage keeps for the ledger (None: not known yet, it is
        #: looked up in the last entry when asked for), and whether adds update it.
        self.lac: int | None = None
        self.lac_tracked = False
        #: Entries added over the wire and not yet flushed (SortedLedgerStorage only).
        self.memtable: set[int] = set()
        self._availability: Availability | None = None
        #: Highest key of `bodies`, or None when unknown (recomputed on demand).
        self._last_body: int | None = None

    def _run_of(self, entry: int) -> int:
        i = bisect_right(self.starts, entry) - 1
        return i if i >= 0 and entry < self.stops[i] else -1

    def has(self, entry: int) -> bool:
        return entry in self.bodies or self._run_of(entry) >= 0

    def body(self, ledger_id: int, entry: int) -> bytes | None:
        stored = self.bodies.get(entry)
        if stored is not None:
            return stored
        i = self._run_of(entry)
        return None if i < 0 else self.factories[i](ledger_id, entry)

    def last_entry(self) -> int | None:
        candidates = []
        if self.stops:
            candidates.append(self.stops[-1] - 1)
        if self.bodies:
            if self._last_body is None:
                self._last_body = max(self.bodies)
            candidates.append(self._last_body)
        return max(candidates) if candidates else None

    def availability(self) -> Availability:
        if self._availability is None:
            runs = [(s, e - s) for s, e in zip(self.starts, self.stops, strict=True)]
            runs.extend((e, 1) for e in self.bodies)
            self._availability = Availability.from_runs(runs)
        return self._availability

    def put(self, entry: int, body: bytes) -> None:
        self.bodies[entry] = body
        self._availability = None
        if self._last_body is not None and entry > self._last_body:
            self._last_body = entry

    def remove(self, start: int, stop: int) -> None:
        """Forgets every entry in [start, stop), and the LAC kept beside them (lost data
        is a lost bookie's: it looks its LAC up again in what is left)."""
        self._availability = None
        self.lac, self.lac_tracked = None, False
        self.memtable.difference_update([e for e in self.memtable if start <= e < stop])
        if self.bodies:
            for e in [e for e in self.bodies if start <= e < stop]:
                del self.bodies[e]
            self._last_body = None
        i = bisect_right(self.stops, start)  # first run ending after start
        j = bisect_left(self.starts, stop)  # runs before j begin before stop
        if i >= j:
            return
        keep_s: list[int] = []
        keep_e: list[int] = []
        keep_f: list[BodyFactory] = []
        if self.starts[i] < start:
            keep_s.append(self.starts[i])
            keep_e.append(start)
            keep_f.append(self.factories[i])
        if self.stops[j - 1] > stop:
            keep_s.append(stop)
            keep_e.append(self.stops[j - 1])
            keep_f.append(self.factories[j - 1])
        self.starts[i:j] = keep_s
        self.stops[i:j] = keep_e
        self.factories[i:j] = keep_f

    def seed(self, runs: list[tuple[int, int]], factory: BodyFactory) -> None:
        """Adds sorted runs (replacing whatever they cover) without a loop per entry.

        Seeded entries count as flushed long ago; the LAC is looked up in them anew.
        """
        self._availability = None
        self.lac, self.lac_tracked = None, False
        merged: list[tuple[int, int]] = []
        for start, stop in runs:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
            else:
                merged.append((start, stop))
        if not self.starts and not self.bodies:
            self.starts = [r[0] for r in merged]
            self.stops = [r[1] for r in merged]
            self.factories = [factory] * len(merged)
            return
        for start, stop in merged:
            if self.bodies or bisect_right(self.stops, start) < bisect_left(self.starts, stop):
                self.remove(start, stop)
        combined = sorted(
            [*zip(self.starts, self.stops, self.factories, strict=True)]
            + [(s, e, factory) for s, e in merged],
            key=lambda run: run[0],
        )
        self.starts = [r[0] for r in combined]
        self.stops = [r[1] for r in combined]
        self.factories = [r[2] for r in combined]


def max_lac(ledger: Ledger, ledger_id: int) -> int:
    """The LAC the ledger's last entry carries (-1 if there is none or it is unreadable)."""
    last = ledger.last_entry()
    body = None if last is None else ledger.body(ledger_id, last)
    if body is None or len(body) < ENTRY_HEADER_SIZE:
        return -1
    return decode_entry_header(body).last_add_confirmed


def bookie_lac(ledger: Ledger, ledger_id: int) -> int:
    """The LAC a read reports (`maxLAC`): the one kept, else looked up in the last entry
    and kept from then on (every ledger storage does so)."""
    if ledger.lac is None:
        ledger.lac = max_lac(ledger, ledger_id)
        ledger.lac_tracked = True
    return ledger.lac


def note_added(ledger: Ledger, ledger_id: int, entry: int, body: bytes, storage: Storage) -> None:
    """Stores an added entry as the imitated ledger storage does, LAC included.

    SortedLedgerStorage's memtable keeps the first copy of an entry until it is flushed;
    the others replace it. Sorted and Interleaved keep the highest LAC any add carried
    (the first add starts from what the entries already held carry, standing for the
    adds that put them there); DbLedgerStorage only once the LAC was looked up.
    """
    sorted_kept = storage is Storage.SORTED and entry in ledger.memtable
    if storage in (Storage.SORTED, Storage.INTERLEAVED) and not ledger.lac_tracked:
        bookie_lac(ledger, ledger_id)
    if not sorted_kept:
        ledger.put(entry, body)
        if storage is Storage.SORTED:
            ledger.memtable.add(entry)
    if ledger.lac_tracked and len(body) >= ENTRY_HEADER_SIZE:
        lac = decode_entry_header(body).last_add_confirmed
        ledger.lac = lac if ledger.lac is None else max(ledger.lac, lac)
