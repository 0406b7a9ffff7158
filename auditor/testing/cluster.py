"""Tests and the demo need clusters whose metadata is byte for byte what BookKeeper writes,
and large ones built in seconds.

Writes a BookKeeper cluster's ZooKeeper metadata exactly as BookKeeper 4.17/4.18 does.

What it writes: the ledgers-root layout (LAYOUT, INSTANCEID, available, cookies,
underreplication) and ledger metadata in format v3 by default (v2 and v1 on request).
Bulk creation goes through ZooKeeper multi-ops so that 100k-ledger clusters take
seconds, not minutes.
"""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import Iterable, Sequence
from typing import cast

from auditor.metadata.layout import DEFAULT_LEDGERS_ROOT, Layout, LedgerManager
from auditor.metadata.model import (
    INVALID_ENTRY_ID,
    DigestType,
    LedgerMetadata,
    LedgerState,
    Segment,
)
from auditor.metadata.paths import ledger_path
from auditor.metadata.registry import READONLY, cookie_bytes
from auditor.metadata.serde import encode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.store import MetadataStore, NodeExistsError

Ensembles = Sequence[str] | Sequence[tuple[int, Sequence[str]]]


def normalize_segments(ensembles: Ensembles) -> tuple[Segment, ...]:
    """One ensemble (bookie ids, from entry 0) or `(first_entry_id, bookies)` pairs."""
    if all(isinstance(e, str) for e in ensembles):
        return (Segment(0, tuple(cast(Sequence[str], ensembles))),)
    pairs = cast(Sequence[tuple[int, Sequence[str]]], ensembles)
    return tuple(Segment(int(first), tuple(bookies)) for first, bookies in pairs)


def make_metadata(
    ledger_id: int,
    ensembles: Ensembles,
    *,
    write_quorum: int | None = None,
    ack_quorum: int | None = None,
    state: LedgerState = LedgerState.CLOSED,
    last_entry_id: int = INVALID_ENTRY_ID,
    length: int = 0,
    format_version: int = 3,
    digest_type: DigestType = DigestType.CRC32C,
    password: bytes = b"",
    ctime: int | None = None,
    ctoken: int | None = None,
    custom_metadata: Sequence[tuple[str, bytes]] = (),
) -> LedgerMetadata:
    """Metadata as a BookKeeper client would create (and, when closed, close) it.

    `ensembles` is either one ensemble (a list of bookie ids starting at entry 0)
    or a list of `(first_entry_id, bookies)` segments.
    """
    segments = normalize_segments(ensembles)
    size = len(segments[0].bookies)
    wq = write_quorum if write_quorum is not None else size
    aq = ack_quorum if ack_quorum is not None else wq
    closed = state is LedgerState.CLOSED
    v1 = format_version == 1
    return LedgerMetadata(
        ledger_id=ledger_id,
        format_version=format_version,
        ensemble_size=size,
        write_quorum=wq,
        ack_quorum=wq if v1 else aq,
        state=state,
        segments=segments,
        last_entry_id=last_entry_id if closed else INVALID_ENTRY_ID,
        length=length if closed else 0,
        digest_type=None if v1 else digest_type,
        password=None if v1 else password,
        ctime=ctime if ctime is not None and not v1 else -1,
        ctime_stored=ctime is not None and not v1,
        # BookKeeper draws a random cToken at creation for format > 2.
        ctoken=(ctoken if ctoken is not None else random.randrange(0, 2**63 - 1))
        if format_version >= 3
        else None,
        custom_metadata=tuple(custom_metadata),
    )


class ClusterWriter:
    """Lays out one BookKeeper cluster under `root` in a ZooKeeper."""

    def __init__(
        self,
        store: MetadataStore,
        root: str = DEFAULT_LEDGERS_ROOT,
        manager: LedgerManager = LedgerManager.HIERARCHICAL,
    ) -> None:
        self.store = store
        self.root = root.rstrip("/")
        self.manager = manager
        self._parents: set[str] = set()

    async def init_cluster(self, instance_id: str | None = None) -> str:
        """What `bookkeeper shell initnewcluster` creates. Returns the instance id.

        `LedgerManager.ETCD` (BookKeeper's etcd driver, written through
        `metadata.bk_etcd.BookKeeperEtcdView`, which names its keys): its `ledgers`,
        `buckets` and `underreplication` keys, no id generator node and no
        under-replication layout (that driver has no under-replication manager)."""
        instance = instance_id or str(uuid.uuid4())
        etcd = self.manager is LedgerManager.ETCD
        await self.store.ensure_path(self.root)
        empty = ("ledgers", "buckets", "underreplication") if etcd else ("idgen",)
        for path, data in [
            (f"{self.root}/LAYOUT", Layout.current(self.manager).encode()),
            (f"{self.root}/INSTANCEID", instance.encode()),
            (f"{self.root}/available", b""),
            (f"{self.root}/available/{READONLY}", b""),
            (f"{self.root}/cookies", b""),
            *[(f"{self.root}/{name}", b"") for name in empty],
        ]:
            with contextlib.suppress(NodeExistsError):
                await self.store.create(path, data)
        if not etcd:
            await UnderreplicationManager(self.store, self.root).check_layout()
        return instance

    async def add_cookie(self, bookie_id: str) -> None:
        """A bookie that registered once (its cookie stays when it goes away)."""
        with contextlib.suppress(NodeExistsError):
            await self.store.create(f"{self.root}/cookies/{bookie_id}", cookie_bytes(bookie_id))

    def path(self, ledger_id: int) -> str:
        return ledger_path(self.manager, self.root, ledger_id)

    async def write_ledger(self, md: LedgerMetadata) -> str:
        path = self.path(md.ledger_id)
        await self.store.create(path, encode_ledger_metadata(md), makepath=True)
        return path

    async def write_raw(self, ledger_id: int, data: bytes) -> str:
        """Stores arbitrary bytes as a ledger's metadata (for corrupt-input tests)."""
        path = self.path(ledger_id)
        await self.store.create(path, data, makepath=True)
        return path

    async def write_ledgers(self, mds: Iterable[LedgerMetadata], batch: int = 1000) -> int:
        """Creates many ledgers with multi-ops of `batch` creates; returns how many."""
        count = 0
        pending: list[tuple[str, bytes]] = []
        for md in mds:
            path = self.path(md.ledger_id)
            await self._ensure_parents(path, pending)
            pending.append((path, encode_ledger_metadata(md)))
            count += 1
            if len(pending) >= batch:
                await self.store.create_many(pending)
                pending = []
        if pending:
            await self.store.create_many(pending)
        return count

    async def _ensure_parents(self, path: str, pending: list[tuple[str, bytes]]) -> None:
        parent = path.rsplit("/", 1)[0]
        missing: list[str] = []
        while parent != self.root and parent not in self._parents:
            missing.append(parent)
            parent = parent.rsplit("/", 1)[0]
        for p in reversed(missing):
            self._parents.add(p)
            if await self.store.exists(p) is None:
                pending.append((p, b""))
