"""Under-replication state in ZooKeeper, shared with BookKeeper's own auditor and workers.

Byte-compatible with `ZkLedgerUnderreplicationManager`: marks live at
`underreplication/ledgers/<4 x 4 hex>/urL<%010d>` as TextFormat
`UnderreplicatedLedgerFormat`; marking again merges missing replicas (exact
string match) under a version check and refreshes ctime only when something
was added, so replication workers that locked the ledger see the re-mark (their
versioned delete fails) and nothing is lost. The check-ctime znodes are binary
protobuf, the layout and lock data TextFormat, `lostBookieRecoveryDelay` a
decimal string: each exactly as BookKeeper writes it.
"""

from __future__ import annotations

import contextlib
import enum
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from auditor.errors import FormatError
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
from auditor.zk import BadVersionError, NodeExistsError, NoNodeError, ZkClient

_UR_LEAF = re.compile(r"urL(\d+)$")
_MAX_CAS_ATTEMPTS = 100


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


def ur_ledger_path(base: str, ledger_id: int) -> str:
    """`<base>/ledgers/hhhh/hhhh/hhhh/hhhh/urL%010d` for a ledger id."""
    parts = [f"{(ledger_id >> shift) & 0xFFFF:04x}" for shift in (48, 32, 16, 0)]
    return f"{base}/ledgers/{'/'.join(parts)}/urL{ledger_id:010d}"


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


def _now_ms() -> int:
    return int(time.time() * 1000)


class UnderreplicationManager:
    """One ledgers root's `underreplication` subtree.

    `store_ctime` mirrors BookKeeper's `storeSystemTimeAsLedgerUnderreplicatedMarkTime`
    (default true).
    """

    def __init__(self, zk: ZkClient, root: str, *, store_ctime: bool = True) -> None:
        self.zk = zk
        self.root = root.rstrip("/")
        self.base = f"{self.root}/underreplication"
        self.store_ctime = store_ctime

    # --- layout ---------------------------------------------------------------

    async def check_layout(self, *, create: bool = True) -> None:
        """Creates `underreplication/LAYOUT` if missing, else insists it is BASIC v1."""
        path = f"{self.base}/LAYOUT"
        if create:
            try:
                await self.zk.create(path, encode_rereplication_layout(), makepath=True)
            except NodeExistsError:
                pass
            else:
                await self.zk.ensure_path(f"{self.base}/ledgers")
                await self.zk.ensure_path(f"{self.base}/locks")
                return
        data, _ = await self.zk.get(path)
        try:
            layout = decode_rereplication_layout(data)
        except RecordFormatError as exc:
            raise UnderreplicationFormatError(f"{path} is corrupt: {exc}") from exc
        if not layout.supported:
            raise UnderreplicationFormatError(
                f"{path} is type {layout.type!r} version {layout.version}; "
                "only BASIC version 1 is supported"
            )
        await self.zk.ensure_path(f"{self.base}/ledgers")
        await self.zk.ensure_path(f"{self.base}/locks")

    # --- marks ----------------------------------------------------------------

    async def mark_underreplicated(
        self, ledger_id: int, missing_replicas: Sequence[str], *, now_ms: int | None = None
    ) -> MarkOutcome:
        """Marks a ledger, merging with any existing mark; safe against concurrent markers."""
        path = ur_ledger_path(self.base, ledger_id)
        wanted = list(dict.fromkeys(missing_replicas))
        for _ in range(_MAX_CAS_ATTEMPTS):
            ctime = (now_ms if now_ms is not None else _now_ms()) if self.store_ctime else None
            try:
                await self.zk.create(path, encode_mark(wanted, ctime), makepath=True)
                return MarkOutcome.CREATED
            except NodeExistsError:
                pass
            try:
                data, stat = await self.zk.get(path)
            except NoNodeError:
                continue  # removed meanwhile: create again
            existing = decode_mark(ledger_id, data, int(stat.version))
            new = [r for r in wanted if r not in existing.replicas]
            if not new:
                return MarkOutcome.UNCHANGED
            merged_ctime = ctime if self.store_ctime else existing.ctime
            data = encode_mark([*existing.replicas, *new], merged_ctime)
            try:
                await self.zk.set(path, data, version=int(stat.version))
                return MarkOutcome.MERGED
            except (BadVersionError, NoNodeError):
                continue  # someone else changed or removed it: merge again
        raise UnderreplicationFormatError(
            f"could not mark ledger {ledger_id}: {_MAX_CAS_ATTEMPTS} concurrent updates in a row"
        )

    async def get(self, ledger_id: int) -> UnderreplicatedLedger | None:
        try:
            data, stat = await self.zk.get(ur_ledger_path(self.base, ledger_id))
        except NoNodeError:
            return None
        return decode_mark(ledger_id, data, int(stat.version))

    async def _mark_paths(self) -> AsyncIterator[tuple[int, str]]:
        """(ledger id, znode path) of every mark, breadth-first as BookKeeper lists them."""
        queue: deque[str] = deque([f"{self.base}/ledgers"])
        while queue:
            path = queue.popleft()
            try:
                children = sorted(await self.zk.get_children(path))
            except NoNodeError:
                continue
            for child in children:
                m = _UR_LEAF.match(child)
                if child.startswith("urL") and m:
                    yield int(m.group(1)), f"{path}/{child}"
                else:
                    queue.append(f"{path}/{child}")

    async def list_underreplicated(self) -> AsyncIterator[UnderreplicatedLedger]:
        """Every mark with its data; one removed while we list it is skipped."""
        async for ledger_id, path in self._mark_paths():
            try:
                data, stat = await self.zk.get(path)
            except NoNodeError:
                continue
            yield decode_mark(ledger_id, data, int(stat.version))

    async def count_underreplicated(self) -> int:
        """How many ledgers are marked: listings only, no data reads."""
        return sum([1 async for _ in self._mark_paths()])

    async def is_being_replicated(self, ledger_id: int) -> bool:
        return await self.zk.exists(f"{self.base}/locks/urL{ledger_id:010d}") is not None

    async def replication_worker(self, ledger_id: int) -> str | None:
        """Who holds the replication lock of a ledger (LockDataFormat's bookieId)."""
        try:
            data, _ = await self.zk.get(f"{self.base}/locks/urL{ledger_id:010d}")
        except NoNodeError:
            return None
        try:
            return decode_lock_data(data)
        except RecordFormatError as exc:
            raise UnderreplicationFormatError(
                f"replication lock of ledger {ledger_id} is corrupt: {exc}"
            ) from exc

    # --- the disable flag ---------------------------------------------------------

    async def is_replication_enabled(self) -> bool:
        return await self.zk.exists(f"{self.base}/disable") is None

    async def disable_replication(self) -> None:
        with contextlib.suppress(NodeExistsError):
            await self.zk.create(f"{self.base}/disable", b"", makepath=True)

    async def enable_replication(self) -> None:
        with contextlib.suppress(NoNodeError):
            await self.zk.delete(f"{self.base}/disable")

    # --- lostBookieRecoveryDelay -------------------------------------------------

    async def init_lost_bookie_recovery_delay(self, seconds: int) -> None:
        """Creates the znode from config if absent (an existing value wins, as upstream)."""
        with contextlib.suppress(NodeExistsError):
            await self.zk.create(
                f"{self.base}/lostBookieRecoveryDelay", str(seconds).encode(), makepath=True
            )

    async def get_lost_bookie_recovery_delay(self) -> int:
        path = f"{self.base}/lostBookieRecoveryDelay"
        data, _ = await self.zk.get(path)
        text = data.decode("ascii", errors="replace").strip()
        try:
            return int(text)
        except ValueError as exc:
            raise UnderreplicationFormatError(f"{path} is not an integer: {text[:40]!r}") from exc

    async def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        path = f"{self.base}/lostBookieRecoveryDelay"
        try:
            await self.zk.set(path, str(seconds).encode())
        except NoNodeError:
            await self.init_lost_bookie_recovery_delay(seconds)

    # --- check ctimes -------------------------------------------------------------

    async def get_check_ctime(self, which: CheckKind) -> int:
        path = f"{self.base}/{which.znode}"
        try:
            data, _ = await self.zk.get(path)
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
            await self.zk.set(path, data)
        except NoNodeError:
            try:
                await self.zk.create(path, data, makepath=True)
            except NodeExistsError:
                await self.zk.set(path, data)
