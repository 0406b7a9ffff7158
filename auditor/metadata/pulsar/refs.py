"""A ledger Pulsar lists but BookKeeper lost is data loss for that topic, and a ledger Pulsar
created but lists nowhere is leaked storage; telling them apart needs Pulsar's side as plain
values that the reader, the test writer and the audit's pure core share.

Which ledgers a Pulsar cluster references, and from where: the model the Pulsar audit joins.

Pulsar keeps its own record of the ledgers it owns, apart from BookKeeper's:
each managed ledger (a topic's storage) lists its ledgers in `ManagedLedgerInfo`,
each of its cursors names a cursor ledger (`ManagedCursorInfo.cursorsLedgerId`)
and may name more in its properties (the compacted ledger of `__compaction`,
delayed-delivery buckets), and each topic's schema history is a list of
positions in schema ledgers (`SchemaLocator`). This module holds that side as
plain values: the reader (`reader.py`) builds them from
ZooKeeper, the test writer writes the same shapes, and the audit's pure core
(`auditor.checks.pulsar_audit`) takes them without any I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


class RefKind(enum.StrEnum):
    """Why Pulsar needs a ledger."""

    #: One of a managed ledger's data ledgers (`ManagedLedgerInfo.ledgerInfo`).
    LEDGER = "ledger"
    #: A cursor's ledger of mark-delete positions (`ManagedCursorInfo.cursorsLedgerId`).
    CURSOR = "cursor"
    #: A ledger holding schema versions (`SchemaLocator`'s index entries).
    SCHEMA = "schema"
    #: A topic's compacted ledger (the `__compaction` cursor's `CompactedTopicLedger`).
    COMPACTED = "compacted"
    #: A delayed-delivery bucket snapshot (a cursor property naming a ledger).
    DELAYED_BUCKET = "delayed_bucket"


@dataclass(frozen=True, slots=True)
class LedgerRef:
    """One reference from Pulsar's metadata to one ledger."""

    ledger_id: int
    kind: RefKind
    #: The managed ledger's name (`tenant/ns/persistent/topic`), or for a schema the
    #: schema id (`tenant/ns/topic`): what owns the reference.
    owner: str
    #: `persistent://tenant/ns/topic`, when the owner is a topic's.
    topic: str | None
    #: `tenant/ns` (or `tenant/cluster/ns` for pre-2.0 namespaces).
    namespace: str
    #: The znode the reference was read from (evidence in reports).
    znode: str
    #: For cursor references: the cursor's name.
    cursor: str | None = None
    #: The ledger's data is in tiered storage (`offloadContext.complete`): its
    #: BookKeeper copy may be gone without any data being lost.
    offloaded: bool = False
    #: What Pulsar recorded of the ledger (`LedgerInfo.entries` / `.size`), if anything.
    entries: int | None = None
    size: int | None = None


@dataclass(frozen=True, slots=True)
class CursorRecord:
    """A cursor znode as read: which ledger it depends on (None: positions kept in the znode)."""

    managed_ledger: str
    name: str
    znode: str
    ledger_id: int | None


@dataclass(frozen=True, slots=True)
class BadPulsarZnode:
    """A znode of Pulsar's tree that could not be read as what its place says it is."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class PulsarRefs:
    """Everything Pulsar's metadata references, by ledger id.

    A ledger may be referenced more than once (a schema ledger shared by
    versions, a ledger listed by a managed ledger and a compacted cursor);
    `refs[ledger_id]` keeps every reference.
    """

    refs: dict[int, list[LedgerRef]] = field(default_factory=dict)
    #: Every managed ledger read (names), with or without ledgers.
    managed_ledgers: set[str] = field(default_factory=set)
    cursors: list[CursorRecord] = field(default_factory=list)
    #: Schema ids read (`tenant/ns/topic`).
    schemas: set[str] = field(default_factory=set)
    #: Znodes that could not be read as what they should be: named, never skipped silently.
    bad_znodes: list[BadPulsarZnode] = field(default_factory=list)

    def add(self, ref: LedgerRef) -> None:
        self.refs.setdefault(ref.ledger_id, []).append(ref)

    def add_all(self, refs: Iterable[LedgerRef]) -> None:
        for r in refs:
            self.add(r)

    def references(self, ledger_id: int) -> list[LedgerRef]:
        return self.refs.get(ledger_id, [])

    def __contains__(self, ledger_id: object) -> bool:
        return ledger_id in self.refs

    def ledger_ids(self) -> Iterator[int]:
        return iter(self.refs)

    def merge(self, other: PulsarRefs) -> None:
        """Adds `other`'s references (a partial read of another part of the tree)."""
        for refs in other.refs.values():
            self.add_all(refs)
        self.managed_ledgers |= other.managed_ledgers
        self.cursors.extend(other.cursors)
        self.schemas |= other.schemas
        self.bad_znodes.extend(other.bad_znodes)
