"""Marks and the other under-replication records are shared with BookKeeper's own auditor
and workers, so they are written byte for byte as Java writes them; and there may be a
hundred thousand marks, of which one bad one must not hide the others.

Under-replication state in ZooKeeper, shared with BookKeeper's own auditor and workers.

Byte-compatible with `ZkLedgerUnderreplicationManager`: marks live at
`underreplication/ledgers/<4 x 4 hex>/urL<%010d>` as TextFormat
`UnderreplicatedLedgerFormat`; marking again merges missing replicas (exact
string match) under a version check and refreshes ctime only when something
was added, so replication workers that locked the ledger see the re-mark (their
versioned delete fails) and nothing is lost. The check-ctime znodes are binary
protobuf, the layout and lock data TextFormat, `lostBookieRecoveryDelay` a
decimal string: each exactly as BookKeeper writes it.

Every byte here is untrusted, and one bad mark must not hide the others: a
listing (`list_marks`, `read_marks`) yields each valid mark and each corrupt
one as a `CorruptMark` of its own (path and reason), whether its data does not
decode, its name is not `urL%010d` of a ledger id in 0..2^63-1, or it is not
where BookKeeper keeps that ledger's mark. A corrupt mark whose name spells a
ledger id still marks that ledger (`MarkListing.marked_ids`): the checks that
skip marked ledgers skip it too, as a replication worker would not copy a
ledger twice.

A hundred thousand marks are a hundred thousand directories (each leaf directory holds the
mark of one ledger id), so listing and reading them one request at a time costs a round
trip each (issue #30: 69 s for 100,000). Directories are listed in batches
(`get_children_many`: one ZooKeeper multiRead of `LIST_BATCH` listings), a few batches in
flight, cut from the breadth-first queue in the order BookKeeper's listing visits them and
consumed in that order, so the items come out exactly as a serial listing yields them;
the marks' data is read in `get_many` batches (one ZooKeeper multiRead, one etcd
transaction) of `READ_BATCH`, `READS_IN_FLIGHT` batches at once, as the ledger walk reads
ledgers. What needs no data (a count, the ids marked) reads none.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import re
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from auditor.errors import FormatError
from auditor.metadata.paths import LONG_MAX, check_ledger_id, is_valid_ledger_id
from auditor.metadata.records import (
    UNASSIGNED_CTIME,
    CheckKind,
    RecordFormatError,
    UnderreplicatedLedgerRecord,
    decode_check_ctime,
    decode_lock_data,
    decode_rereplication_layout,
    decode_underreplicated_ledger,
    encode_check_ctime,
    encode_rereplication_layout,
    encode_underreplicated_ledger,
)
from auditor.store import BadVersionError, MetadataStore, NodeExistsError, NoNodeError

_MARK_PREFIX = "urL"
_MARK_NAME = re.compile(r"^urL(\d+)$")
_HEX_DIR = re.compile(r"^[0-9a-f]{4}$")
#: A mark's path below `underreplication/ledgers`: four levels of hex directories.
_HEX_LEVELS = 4
_MAX_CAS_ATTEMPTS = 100
#: What Java's `Integer.parseInt` accepts: ASCII digits and one optional sign.
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
#: Java's `Integer.MAX_VALUE`: the largest `lostBookieRecoveryDelay` BookKeeper can read.
MAX_DELAY_SECONDS = 2**31 - 1
#: Directories listed per `get_children_many` (one multiRead), and such batches in flight.
#: Every leaf directory holds one mark, so a listing a request would be a request a mark
#: (kazoo spends about 150 us of CPU on each: 15 s for 100,000).
LIST_BATCH = 250
LISTINGS_IN_FLIGHT = 4
#: Marks read per `get_many` (one multiRead), and such batches in flight: the walk's
#: shape (`walk.BATCH_MAX`, two or more batches so one is read while another is decoded).
READ_BATCH = 250
READS_IN_FLIGHT = 4
#: A mark exactly as BookKeeper's TextFormat writes one whose replicas are printable ASCII
#: without quote or backslash (every bookie id): its replicas, then its ctime, if any, in
#: decimal (a leading zero would be octal to TextFormat, so none). Such bytes decode here
#: without the general parser, which took 70% of `check all` over 100,000 marks; any
#: other bytes go to the general parser, which gives the same record for these.
_PLAIN_MARK = re.compile(rb'((?:replica: "[ !#-\[\]-~]*"\n)*)(?:ctime: (0|-?[1-9][0-9]{0,18})\n)?')
_PLAIN_REPLICA = re.compile(rb'replica: "([ !#-\[\]-~]*)"\n')
_INT64 = range(-(2**63), 2**63)


def parse_lost_bookie_recovery_delay(data: bytes) -> int | None:
    """The `lostBookieRecoveryDelay` znode's seconds, or None unless they are 0..2^31-1 as
    Java's `Integer.parseInt` reads them (surrounding whitespace forgiven). The one rule:
    the admin reads and the daemon's contained reads both use it."""
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    if not _JAVA_INT.fullmatch(text):
        return None
    value = int(text)
    return value if 0 <= value <= MAX_DELAY_SECONDS else None


class UnderreplicationFormatError(FormatError):
    """An under-replication znode holds bytes BookKeeper would not have written."""


class MarkOutcome(enum.Enum):
    CREATED = "created"
    MERGED = "merged"
    UNCHANGED = "unchanged"


@dataclass(frozen=True, slots=True)
class UnderreplicatedLedger:
    ledger_id: int
    replicas: tuple[str, ...]
    ctime: int  # ms since epoch, or -1 when the mark has none
    znode_version: int = 0


@dataclass(frozen=True, slots=True)
class CorruptMark:
    """A znode among the under-replication marks that is not a valid mark.

    `ledger_id` is the ledger its name spells when that is a valid id (the mark
    still marks it), None when the name spells none.
    """

    path: str
    ledger_id: int | None
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class MarkListing:
    """Every mark under one root: the valid ones and, each on its own, the corrupt ones."""

    marks: list[UnderreplicatedLedger]
    corrupt: list[CorruptMark]

    def by_id(self) -> dict[int, UnderreplicatedLedger]:
        return {ur.ledger_id: ur for ur in self.marks}

    def marked_ids(self) -> set[int]:
        """Every ledger marked: by a valid mark or by a corrupt one that names it."""
        ids = {ur.ledger_id for ur in self.marks}
        ids.update(c.ledger_id for c in self.corrupt if c.ledger_id is not None)
        return ids


def mark_name(ledger_id: int) -> str:
    """`urL%010d`: the name of a ledger's mark and of its replication lock."""
    return f"{_MARK_PREFIX}{check_ledger_id(ledger_id):010d}"


def ur_ledger_path(base: str, ledger_id: int) -> str:
    """`<base>/ledgers/hhhh/hhhh/hhhh/hhhh/urL%010d` for a ledger id."""
    name = mark_name(ledger_id)
    parts = [f"{(ledger_id >> shift) & 0xFFFF:04x}" for shift in (48, 32, 16, 0)]
    return f"{base}/ledgers/{'/'.join(parts)}/{name}"


def ur_lock_path(base: str, ledger_id: int) -> str:
    """`<base>/locks/urL%010d`: a replication worker's lock on a ledger."""
    return f"{base}/locks/{mark_name(ledger_id)}"


def _mark_name_problem(base: str, path: str, name: str) -> tuple[int | None, str | None]:
    """(the ledger a mark's name spells, or None; what is wrong with the mark, or None)."""
    m = _MARK_NAME.match(name)
    if m is None:
        return None, f"mark name {name[:80]!r} is not urL and a ledger id"
    digits = m.group(1)
    significant = digits.lstrip("0") or "0"
    # More digits than any valid id has are not even converted (a name can be kilobytes).
    if len(significant) > len(str(LONG_MAX)) or not is_valid_ledger_id(int(significant)):
        shown = digits if len(digits) <= 24 else f"{digits[:20]}... ({len(digits)} digits)"
        return None, f"mark name spells ledger id {shown}, outside 0..{LONG_MAX}"
    ledger_id = int(significant)
    if name != f"{_MARK_PREFIX}{ledger_id:010d}":
        return ledger_id, (
            f"mark name is not urL%010d: BookKeeper names ledger {ledger_id}'s mark "
            f"{_MARK_PREFIX}{ledger_id:010d}"
        )
    expected = ur_ledger_path(base, ledger_id)
    if path != expected:
        return ledger_id, f"not where BookKeeper keeps the mark of ledger {ledger_id} ({expected})"
    return ledger_id, None


def mark_problem(base: str, path: str, name: str) -> tuple[int | None, str | None]:
    """(the ledger the mark `name` at `path` spells, or None; what is wrong with it, or
    None): the rule that makes a mark corrupt, for the worker that must not take one."""
    return _mark_name_problem(base, path, name)


def encode_mark(replicas: Sequence[str], ctime: int | None) -> bytes:
    stored = None if ctime is None or ctime == UNASSIGNED_CTIME else ctime
    return encode_underreplicated_ledger(UnderreplicatedLedgerRecord(tuple(replicas), stored))


def decode_mark(ledger_id: int, data: bytes, version: int = 0) -> UnderreplicatedLedger:
    try:
        rec = decode_underreplicated_ledger(data)
    except RecordFormatError as exc:
        raise UnderreplicationFormatError(
            f"under-replication mark of ledger {ledger_id} is corrupt: {exc}"
        ) from exc
    return UnderreplicatedLedger(ledger_id, rec.replicas, rec.ctime_or_unassigned, version)


def decode_plain_mark(ledger_id: int, data: bytes, version: int) -> UnderreplicatedLedger | None:
    """The mark in `data` if it is laid out exactly as BookKeeper writes a plain one
    (`_PLAIN_MARK`), else None: the general parser decides (and names what is wrong)."""
    m = _PLAIN_MARK.fullmatch(data)
    if m is None:
        return None
    ctime = UNASSIGNED_CTIME
    if m.group(2) is not None:
        ctime = int(m.group(2))
        if ctime not in _INT64:
            return None
    replicas = tuple(r.decode("ascii") for r in _PLAIN_REPLICA.findall(m.group(1)))
    return UnderreplicatedLedger(ledger_id, replicas, ctime, version)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _abandon(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Cancels what is still in flight when a listing ends early (the caller stopped, or a
    read failed), and retrieves what already failed, so nothing is left running and no
    failure is logged as never retrieved."""
    for future in futures:
        if future.done():
            if not future.cancelled():
                future.exception()
        else:
            future.cancel()


class UnderreplicationManager:
    """One ledgers root's `underreplication` subtree.

    `store_ctime` mirrors BookKeeper's `storeSystemTimeAsLedgerUnderreplicatedMarkTime`
    (default true).
    """

    def __init__(self, store: MetadataStore, root: str, *, store_ctime: bool = True) -> None:
        self.store = store
        self.root = root.rstrip("/")
        self.base = f"{self.root}/underreplication"
        self.store_ctime = store_ctime

    # --- layout ---------------------------------------------------------------

    async def check_layout(self, *, create: bool = True) -> None:
        """Creates `underreplication/LAYOUT` if missing, else insists it is BASIC v1."""
        path = f"{self.base}/LAYOUT"
        if create:
            try:
                await self.store.create(path, encode_rereplication_layout(), makepath=True)
            except NodeExistsError:
                pass
            else:
                await self.store.ensure_path(f"{self.base}/ledgers")
                await self.store.ensure_path(f"{self.base}/locks")
                return
        data, _ = await self.store.get(path)
        try:
            layout = decode_rereplication_layout(data)
        except RecordFormatError as exc:
            raise UnderreplicationFormatError(f"{path} is corrupt: {exc}") from exc
        if not layout.supported:
            found = repr(layout.type[:64]) + ("..." if len(layout.type) > 64 else "")
            raise UnderreplicationFormatError(
                f"{path} is type {found} version {layout.version}; "
                "only BASIC version 1 is supported"
            )
        await self.store.ensure_path(f"{self.base}/ledgers")
        await self.store.ensure_path(f"{self.base}/locks")

    # --- marks ----------------------------------------------------------------

    async def mark_underreplicated(
        self,
        ledger_id: int,
        missing_replicas: Sequence[str],
        *,
        now_ms: int | None = None,
        judged: tuple[str, int] | None = None,
    ) -> MarkOutcome:
        """Marks a ledger, merging with any existing mark; safe against concurrent markers.

        `judged` is the (path, version) of the ledger metadata the mark was decided on:
        the mark is then written only while the ledger is still at that version, in the
        same transaction (NodeChangedError otherwise: the ledger was re-replicated,
        closed or deleted meanwhile, and the caller judges it again). Without it a worker
        that commits a new ensemble between our read and our write would find its
        ledger marked again for bookies it no longer has."""
        path = ur_ledger_path(self.base, ledger_id)
        wanted = list(dict.fromkeys(missing_replicas))
        writer = self.store if judged is None else self.store.guarded(*judged)
        for _ in range(_MAX_CAS_ATTEMPTS):
            ctime = (now_ms if now_ms is not None else _now_ms()) if self.store_ctime else None
            try:
                await writer.create(path, encode_mark(wanted, ctime), makepath=True)
                return MarkOutcome.CREATED
            except NodeExistsError:
                pass
            try:
                data, stat = await self.store.get(path)
            except NoNodeError:
                continue  # removed meanwhile: create again
            existing = decode_mark(ledger_id, data, int(stat.version))
            new = [r for r in wanted if r not in existing.replicas]
            if not new:
                return MarkOutcome.UNCHANGED
            merged_ctime = ctime if self.store_ctime else existing.ctime
            data = encode_mark([*existing.replicas, *new], merged_ctime)
            try:
                await writer.set(path, data, version=int(stat.version))
                return MarkOutcome.MERGED
            except (BadVersionError, NoNodeError):
                continue  # someone else changed or removed it: merge again
        raise UnderreplicationFormatError(
            f"could not mark ledger {ledger_id}: {_MAX_CAS_ATTEMPTS} concurrent updates in a row"
        )

    async def get(self, ledger_id: int) -> UnderreplicatedLedger | None:
        try:
            data, stat = await self.store.get(ur_ledger_path(self.base, ledger_id))
        except NoNodeError:
            return None
        return decode_mark(ledger_id, data, int(stat.version))

    async def get_mark(self, ledger_id: int) -> UnderreplicatedLedger | CorruptMark | None:
        """A ledger's mark, a CorruptMark if its data does not decode, or None."""
        path = ur_ledger_path(self.base, ledger_id)
        try:
            data, stat = await self.store.get(path)
        except NoNodeError:
            return None
        return self._decoded(path, ledger_id, data, int(stat.version))

    @staticmethod
    def _decoded(
        path: str, ledger_id: int, data: bytes, version: int
    ) -> UnderreplicatedLedger | CorruptMark:
        plain = decode_plain_mark(ledger_id, data, version)
        if plain is not None:
            return plain
        try:
            rec = decode_underreplicated_ledger(data)
        except RecordFormatError as exc:
            return CorruptMark(path, ledger_id, f"does not decode: {exc.reason}")
        return UnderreplicatedLedger(ledger_id, rec.replicas, rec.ctime_or_unassigned, version)

    async def _mark_znodes(self) -> AsyncGenerator[tuple[str, int | None, str | None], None]:
        """(path, ledger id or None, what is wrong or None) of every mark and of every other
        znode among them, breadth-first as BookKeeper lists them; listings only.

        Directories are listed in batches (`get_children_many`: one multiRead of up to
        `LIST_BATCH` listings), cut from the breadth-first queue in its order, up to
        `LISTINGS_IN_FLIGHT` batches at once, and consumed in that same order: the order
        is a serial listing's. A directory removed while we list is passed over."""
        top = f"{self.base}/ledgers"
        queue: deque[tuple[str, int]] = deque([(top, 0)])
        window: deque[tuple[list[tuple[str, int]], asyncio.Future[Sequence[list[str] | None]]]]
        window = deque()
        try:
            while queue or window:
                # A batch goes out full, or at once when nothing else is in flight.
                while queue and len(window) < LISTINGS_IN_FLIGHT:
                    if window and len(queue) < LIST_BATCH:
                        break
                    dirs = [queue.popleft() for _ in range(min(LIST_BATCH, len(queue)))]
                    listed = self.store.get_children_many([path for path, _ in dirs])
                    window.append((dirs, asyncio.ensure_future(listed)))
                dirs, pending = window.popleft()
                for (path, depth), found in zip(dirs, await pending, strict=True):
                    if found is None:
                        continue
                    children = sorted(found)
                    if not children and path != top and not self._hex_dir(path, depth):
                        yield (
                            path,
                            None,
                            "neither an under-replication mark nor a directory of marks",
                        )
                    for child in children:
                        if child.startswith(_MARK_PREFIX):
                            child_path = f"{path}/{child}"
                            ledger_id, problem = _mark_name_problem(self.base, child_path, child)
                            yield child_path, ledger_id, problem
                        else:
                            queue.append((f"{path}/{child}", depth + 1))
        finally:
            _abandon(pending for _, pending in window)

    @staticmethod
    def _hex_dir(path: str, depth: int) -> bool:
        return 1 <= depth <= _HEX_LEVELS and _HEX_DIR.match(path.rsplit("/", 1)[1]) is not None

    async def _read_batch(
        self, batch: list[tuple[str, int] | CorruptMark]
    ) -> list[UnderreplicatedLedger | CorruptMark]:
        """A batch of the listing in its order: each mark read (one `get_many` for all of
        them) and decoded, each corrupt one as it is, a mark removed meanwhile left out."""
        found = iter(
            await self.store.get_many([e[0] for e in batch if not isinstance(e, CorruptMark)])
        )
        items: list[UnderreplicatedLedger | CorruptMark] = []
        for entry in batch:
            if isinstance(entry, CorruptMark):
                items.append(entry)
                continue
            got = next(found)
            if got is not None:
                path, ledger_id = entry
                items.append(self._decoded(path, ledger_id, got[0], int(got[1].version)))
        return items

    async def list_marks(self) -> AsyncGenerator[UnderreplicatedLedger | CorruptMark, None]:
        """Every valid mark with its data and every corrupt one, each an item of its own,
        in the listing's order; a mark removed while we list it is skipped. Data is read
        in batches of `READ_BATCH` marks, `READS_IN_FLIGHT` batches ahead of the caller."""
        window: deque[asyncio.Future[list[UnderreplicatedLedger | CorruptMark]]] = deque()
        batch: list[tuple[str, int] | CorruptMark] = []
        try:
            async with aclosing(self._mark_znodes()) as names:
                async for path, ledger_id, problem in names:
                    if problem is not None or ledger_id is None:
                        batch.append(CorruptMark(path, ledger_id, problem or "not a mark"))
                    else:
                        batch.append((path, ledger_id))
                    if len(batch) < READ_BATCH:
                        continue
                    window.append(asyncio.ensure_future(self._read_batch(batch)))
                    batch = []
                    if len(window) >= READS_IN_FLIGHT:
                        for item in await window.popleft():
                            yield item
            if batch:
                window.append(asyncio.ensure_future(self._read_batch(batch)))
            while window:
                for item in await window.popleft():
                    yield item
        finally:
            _abandon(window)

    async def read_marks(self) -> MarkListing:
        """`list_marks`, gathered: the valid marks and the corrupt ones apart."""
        listing = MarkListing([], [])
        async with aclosing(self.list_marks()) as items:
            async for item in items:
                if isinstance(item, CorruptMark):
                    listing.corrupt.append(item)
                else:
                    listing.marks.append(item)
        return listing

    async def list_underreplicated(self) -> AsyncIterator[UnderreplicatedLedger]:
        """The valid marks with their data (corrupt ones are in `list_marks` only)."""
        async with aclosing(self.list_marks()) as items:
            async for item in items:
                if not isinstance(item, CorruptMark):
                    yield item

    async def list_mark_names(self) -> AsyncGenerator[int | CorruptMark, None]:
        """From listings only, no data read, in `list_marks`' order: the ledger id of each
        znode named and placed as BookKeeper names and places a mark, and a CorruptMark for
        every other znode among them (a name that is no mark's, a mark out of place, a
        stray). A mark whose data would not decode is its ledger id here: only reading
        it (`list_marks`) tells."""
        async with aclosing(self._mark_znodes()) as names:
            async for path, ledger_id, problem in names:
                if problem is None and ledger_id is not None:
                    yield ledger_id
                else:
                    yield CorruptMark(path, ledger_id, problem or "not a mark")

    async def marked_ids(self) -> set[int]:
        """Every ledger marked, by a valid mark or a corrupt one that names it
        (`MarkListing.marked_ids`), from listings only: no data read."""
        async with aclosing(self._mark_znodes()) as names:
            return {ledger_id async for _, ledger_id, _ in names if ledger_id is not None}

    async def count_underreplicated(self) -> int:
        """How many ledgers are marked, corrupt marks that name one included: listings only,
        no data reads."""
        async with aclosing(self._mark_znodes()) as names:
            return sum([1 async for _, ledger_id, _ in names if ledger_id is not None])

    async def is_being_replicated(self, ledger_id: int) -> bool:
        return await self.store.exists(ur_lock_path(self.base, ledger_id)) is not None

    async def replication_worker(self, ledger_id: int) -> str | None:
        """Who holds the replication lock of a ledger (LockDataFormat's bookieId)."""
        path = ur_lock_path(self.base, ledger_id)
        try:
            data, _ = await self.store.get(path)
        except NoNodeError:
            return None
        try:
            return decode_lock_data(data)
        except RecordFormatError as exc:
            raise UnderreplicationFormatError(
                f"replication lock of ledger {ledger_id} at {path} is corrupt: {exc}"
            ) from exc

    # --- the disable flag ---------------------------------------------------------

    async def is_replication_enabled(self) -> bool:
        return await self.store.exists(f"{self.base}/disable") is None

    async def disable_replication(self) -> None:
        with contextlib.suppress(NodeExistsError):
            await self.store.create(f"{self.base}/disable", b"", makepath=True)

    async def enable_replication(self) -> None:
        with contextlib.suppress(NoNodeError):
            await self.store.delete(f"{self.base}/disable")

    # --- lostBookieRecoveryDelay -------------------------------------------------

    async def init_lost_bookie_recovery_delay(self, seconds: int) -> None:
        """Creates the znode from config if absent (an existing value wins, as upstream)."""
        with contextlib.suppress(NodeExistsError):
            await self.store.create(
                f"{self.base}/lostBookieRecoveryDelay", str(seconds).encode(), makepath=True
            )

    async def get_lost_bookie_recovery_delay(self) -> int:
        """The delay in seconds; UnderreplicationFormatError, naming the znode, unless it is
        0..2^31-1 as Java's `Integer.parseInt` reads it (surrounding whitespace forgiven)."""
        path = f"{self.base}/lostBookieRecoveryDelay"
        data, _ = await self.store.get(path)
        value = parse_lost_bookie_recovery_delay(data)
        if value is None:
            text = data.decode("ascii", errors="replace").strip()
            if not _JAVA_INT.fullmatch(text):
                raise UnderreplicationFormatError(f"{path} is not an integer: {text[:40]!r}")
            raise UnderreplicationFormatError(
                f"{path} is {text[:40]}, outside 0..{MAX_DELAY_SECONDS} seconds"
            )
        return value

    async def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        path = f"{self.base}/lostBookieRecoveryDelay"
        try:
            await self.store.set(path, str(seconds).encode())
        except NoNodeError:
            await self.init_lost_bookie_recovery_delay(seconds)

    # --- check ctimes -------------------------------------------------------------

    async def get_check_ctime(self, which: CheckKind) -> int:
        path = f"{self.base}/{which.znode}"
        try:
            data, _ = await self.store.get(path)
        except NoNodeError:
            return UNASSIGNED_CTIME
        try:
            return decode_check_ctime(which, data)
        except RecordFormatError as exc:
            raise UnderreplicationFormatError(f"{path} is corrupt: {exc}") from exc

    async def set_check_ctime(self, which: CheckKind, ctime_ms: int) -> None:
        path = f"{self.base}/{which.znode}"
        data = encode_check_ctime(which, ctime_ms)
        try:
            await self.store.set(path, data)
        except NoNodeError:
            try:
                await self.store.create(path, data, makepath=True)
            except NodeExistsError:
                await self.store.set(path, data)
