"""Tests of the Pulsar audit need both sides of a Pulsar cluster, its tree in the bytes a
broker writes and the ledgers it names on the bookies, including what a broker leaves
behind when things go wrong.

Writes a Pulsar cluster's metadata as Pulsar's brokers do, over ledgers on the emulated bookies.

The two sides: Pulsar's tree in
ZooKeeper (`/admin/policies`, `/managed-ledgers`, `/schemas`, under `root`) in
the exact bytes a broker writes (`auditor.metadata.pulsar.formats`), and the
ledgers it names, written to the bookies with the custom metadata Pulsar's
brokers put on them (`LedgerMetadataUtils`). Intermediate znodes are created
empty, as Pulsar's metadata store creates parents.

API (everything is a coroutine but the constructor and `Cursor`)::

    w = PulsarWriter(ledger_writer, bookie_ids, root="")   # or PulsarWriter.of(test_cluster)
    await w.namespace("t/ns")                    # /admin/policies/t and /admin/policies/t/ns
    name = await w.topic(                        # -> "t/ns/persistent/a" (the managed ledger)
        "persistent://t/ns/a",
        ledgers=[10, 11, 12],                    # ManagedLedgerInfo, oldest first; the last one
                                                 # is the open current ledger (open_last=True)
        cursors={"sub": Cursor(ledger=20), "idle": Cursor()},  # Cursor(): cursorsLedgerId -1;
                                                 # a cursor ledger is open (ledger_open)
        offloaded=[10],                          # offloadContext.complete
        bk_deleted=[10],                         # offloaded and gone from BookKeeper (not written)
        compression=CompressionType.LZ4,         # MetaStoreImpl's metadata compression
    )
    await w.compaction("persistent://t/ns/a", compacted_ledger=30)  # the __compaction cursor
    await w.schema("persistent://t/ns/a", ledgers=[40, 41])          # one ledger per version
    await w.system_topic("t/ns", ledger=60, schema_ledger=61)        # __change_events
    await w.delete_topic("persistent://t/ns/a")   # znodes gone, its ledgers left on the bookies
    await w.ledger(50, owner_metadata)           # a bare ledger (a leak), any custom metadata
    await w.raw_managed_ledger(name, b"...")     # arbitrary bytes (corrupt-input tests)
    await w.raw_cursor(name, "sub", b"...")
    await w.raw_schema("t/ns/a", b"...")

Every ledger a call names is written to the bookies (entries and metadata) unless
it is in `bk_deleted` or `write_ledgers=False` is passed, with the custom metadata
a broker sets (`managed_ledger_metadata`, `compacted_ledger_metadata`,
`schema_metadata`). Bucket snapshot ledgers carry only `application=pulsar`
(the bucket storage's own keys are not reproduced). Metadata is written as
current brokers write it (binary, compressed on request); the TextFormat of the
oldest brokers is covered by the decoders' unit tests, not written here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from auditor.metadata.model import LedgerState
from auditor.metadata.pulsar.formats import (
    COMPACTED_TOPIC_LEDGER,
    COMPACTION_CURSOR,
    bucket_key,
    encode_cursor_info,
    encode_managed_ledger_info,
)
from auditor.metadata.pulsar.naming import managed_ledger_of_topic, schema_id_of_topic
from auditor.proto import pulsar_ml_formats_pb2 as ml
from auditor.proto import pulsar_schema_formats_pb2 as sc
from auditor.store import MetadataStore, NodeExistsError, NoNodeError
from auditor.testing.harness import TestCluster
from auditor.testing.writer import LedgerWriter

CompressionType = ml.CompressionType
CustomMetadata = list[tuple[str, bytes]]

#: A namespace's bundle boundaries as a broker creates them (four bundles).
DEFAULT_BUNDLES = ("0x00000000", "0x40000000", "0x80000000", "0xc0000000", "0xffffffff")
#: The rate and quota maps a broker writes empty in a new namespace's policies.
_EMPTY_POLICY_MAPS = (
    "backlog_quota_map",
    "clusterDispatchRate",
    "topicDispatchRate",
    "subscriptionDispatchRate",
    "replicatorDispatchRate",
    "clusterSubscribeRate",
    "publishMaxMessageRate",
    "latency_stats_sample_rate",
)
#: The system topic each namespace gets for topic-level policies.
CHANGE_EVENTS = "__change_events"


def managed_ledger_metadata(managed_ledger: str, cursor: str | None = None) -> CustomMetadata:
    """A managed ledger's (or, with `cursor`, a cursor ledger's) custom metadata."""
    out = [
        ("application", b"pulsar"),
        ("component", b"managed-ledger"),
        ("pulsar/managed-ledger", managed_ledger.encode()),
    ]
    if cursor is not None:
        out.append(("pulsar/cursor", cursor.encode()))
    return out


def _signed(value: int) -> int:
    """The low 64 bits as Java's long."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >> 63 else value


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def compacted_ledger_metadata(
    topic: str, ledger_id: int = -1, entry_id: int = -1
) -> CustomMetadata:
    """A compacted ledger's custom metadata; `pulsar/compactedTo` is the MessageIdData
    (ledgerId = 1, entryId = 2, batch_size = 6) of the last message compacted: a real
    4.0.7 broker writes `batch_size` 0 too (`08 06 10 01 30 00`)."""
    to = b"\x08" + _varint(ledger_id) + b"\x10" + _varint(entry_id) + b"\x30\x00"
    return [
        ("application", b"pulsar"),
        ("component", b"compacted-ledger"),
        ("pulsar/compactedTopic", topic.encode()),
        ("pulsar/compactedTo", to),
    ]


def schema_metadata(schema_id: str) -> CustomMetadata:
    return [
        ("application", b"pulsar"),
        ("component", b"schema"),
        ("pulsar/schemaId", schema_id.encode()),
    ]


@dataclass(frozen=True)
class Cursor:
    """A cursor znode. `ledger`: its cursor ledger (None: `cursorsLedgerId` -1, the
    position kept in the znode). `compacted_ledger`: the `CompactedTopicLedger`
    property (what the `__compaction` cursor holds). `buckets`: delayed-delivery
    bucket snapshots, `(start ledger, end ledger) -> snapshot ledger id`."""

    ledger: int | None = None
    mark_delete: tuple[int, int] = (-1, -1)
    compacted_ledger: int | None = None
    buckets: Mapping[tuple[int, int], int] = field(default_factory=dict)
    #: More cursor properties (`StringProperty`), written as given.
    properties: Mapping[str, str] = field(default_factory=dict)
    #: The cursor ledger is open, as a loaded topic's is (a broker writes each
    #: mark-delete to it and closes it only when it rolls to a new one or unloads).
    ledger_open: bool = True


class PulsarWriter:
    """Writes Pulsar's tree under `root` and its ledgers on `bookies`."""

    def __init__(
        self,
        writer: LedgerWriter,
        bookies: Sequence[str],
        root: str = "",
        *,
        cluster: str = "standalone",
        entries: int = 3,
    ) -> None:
        self.writer = writer
        self.store: MetadataStore = writer.cluster.store
        self.bookies = list(bookies)
        self.root = root.rstrip("/")
        self.cluster = cluster
        #: Entries written to each ledger (the open current ledger too).
        self.entries = entries
        #: Each managed ledger's last entry written (ledger, entry): what compaction reaches.
        self._last: dict[str, tuple[int, int]] = {}

    @classmethod
    def of(cls, tc: TestCluster, root: str = "") -> PulsarWriter:
        return cls(tc.writer, tc.ids, root)

    # --- paths -----------------------------------------------------------------

    def managed_ledger_path(self, name: str) -> str:
        return f"{self.root}/managed-ledgers/{name}"

    def schema_path(self, schema_id: str) -> str:
        return f"{self.root}/schemas/{schema_id}"

    # --- ledgers ---------------------------------------------------------------

    async def ledger(
        self,
        ledger_id: int,
        custom_metadata: Iterable[tuple[str, bytes]] = (),
        *,
        entries: int | None = None,
        state: LedgerState = LedgerState.CLOSED,
    ) -> None:
        """One ledger on the bookies (entries, then metadata), as Pulsar's client writes it."""
        ensemble = self.bookies[: min(3, len(self.bookies))]
        await self.writer.write_ledger(
            ledger_id,
            ensemble,
            write_quorum=min(2, len(ensemble)),
            num_entries=self.entries if entries is None else entries,
            state=state,
            custom_metadata=list(custom_metadata),
        )

    # --- tenants and namespaces -------------------------------------------------

    async def _put(self, path: str, data: bytes) -> None:
        try:
            await self.store.create(path, data, makepath=True)
        except NodeExistsError:
            await self.store.set(path, data)

    async def tenant(self, tenant: str) -> None:
        """`/admin/policies/<tenant>`: TenantInfo JSON (admin roles, allowed clusters)."""
        doc = {"adminRoles": [], "allowedClusters": [self.cluster]}
        with contextlib.suppress(NodeExistsError):
            await self.store.create(
                f"{self.root}/admin/policies/{tenant}", json.dumps(doc).encode(), makepath=True
            )

    async def namespace(self, namespace: str) -> None:
        """`/admin/policies/<tenant>/<ns>` (and the tenant) and
        `/admin/local-policies/<tenant>/<ns>`, as pulsar-broker 4.0.7's admin API writes
        them for a namespace created with no policies: Pulsar's `Policies` with its four
        default bundles (`defaultNumberOfNamespaceBundles`), and the bundles again in the
        local policies."""
        await self.tenant(namespace.split("/", 1)[0])
        bundles = {"boundaries": list(DEFAULT_BUNDLES), "numBundles": len(DEFAULT_BUNDLES) - 1}
        policies = {
            "auth_policies": {
                "namespace_auth": {},
                "destination_auth": {},
                "subscription_auth_roles": {},
            },
            "replication_clusters": [self.cluster],
            "allowed_clusters": [],
            "bundles": bundles,
            **{key: {} for key in _EMPTY_POLICY_MAPS},
            "deleted": False,
            "encryption_required": False,
            "subscription_auth_mode": "None",
            "offload_threshold": -1,
            "offload_threshold_in_seconds": -1,
            "schema_compatibility_strategy": "UNDEFINED",
            "schema_validation_enforced": False,
            "subscription_types_enabled": [],
            "properties": {},
            "migrated": False,
        }
        local = {"bundles": bundles, "migrated": False}
        for base, doc in (("policies", policies), ("local-policies", local)):
            with contextlib.suppress(NodeExistsError):
                await self.store.create(
                    f"{self.root}/admin/{base}/{namespace}",
                    json.dumps(doc, separators=(",", ":")).encode(),
                    makepath=True,
                )

    async def system_topic(self, namespace: str, ledger: int, schema_ledger: int) -> str:
        """The namespace's `__change_events` topic, as a broker with topic-level policies
        (the default) creates it when the namespace's first topic loads: one open ledger,
        a `__compaction` cursor with no ledger yet, and its Avro schema's one version."""
        topic = f"persistent://{namespace}/{CHANGE_EVENTS}"
        name = await self.topic(topic, ledgers=[ledger])
        await self.cursor(topic, COMPACTION_CURSOR, Cursor(mark_delete=(ledger, -1)))
        await self.schema(topic, ledgers=[schema_ledger])
        return name

    # --- topics ----------------------------------------------------------------

    async def topic(
        self,
        topic: str,
        ledgers: Sequence[int] = (),
        *,
        cursors: Mapping[str, Cursor] | None = None,
        offloaded: Iterable[int] = (),
        bk_deleted: Iterable[int] = (),
        compression: int = CompressionType.NONE,
        open_last: bool = True,
        write_ledgers: bool = True,
    ) -> str:
        """A topic's managed ledger znode with `ledgers`, its cursors, its ledgers on the
        bookies (each with the managed ledger's custom metadata). Returns the managed
        ledger's name."""
        name = managed_ledger_of_topic(topic)
        await self.namespace(name.rsplit("/", 2)[0])
        off, gone = set(offloaded), set(bk_deleted)
        info = ml.ManagedLedgerInfo()
        now = int(time.time() * 1000)
        for i, lid in enumerate(ledgers):
            li = info.ledgerInfo.add()
            li.ledgerId = lid
            current = open_last and i == len(ledgers) - 1 and lid not in off
            if current:
                # A real broker writes the current ledger with `timestamp` 0, and no
                # entries or size (seen against pulsar-broker 4.0.7).
                li.timestamp = 0
            else:
                li.entries = self.entries
                li.size = self.entries * self.writer.payload_size
                li.timestamp = now
            if lid in off or lid in gone:
                u = uuid.uuid4().int
                ctx = li.offloadContext
                ctx.uidMsb, ctx.uidLsb = _signed(u >> 64), _signed(u)
                ctx.complete = True
                ctx.bookkeeperDeleted = lid in gone
                ctx.timestamp = now
                ctx.driverMetadata.name = "filesystem"
            if write_ledgers and lid not in gone:
                state = LedgerState.OPEN if current else LedgerState.CLOSED
                await self.ledger(lid, managed_ledger_metadata(name), state=state)
        await self._put(
            self.managed_ledger_path(name), encode_managed_ledger_info(info, compression)
        )
        if ledgers:
            self._last[name] = (ledgers[-1], self.entries - 1)
        for cname, cursor in (cursors or {}).items():
            await self.cursor(
                topic, cname, cursor, compression=compression, write_ledgers=write_ledgers
            )
        return name

    async def cursor(
        self,
        topic: str,
        name: str,
        cursor: Cursor,
        *,
        compression: int = CompressionType.NONE,
        write_ledgers: bool = True,
    ) -> str:
        """One cursor znode under the topic's managed ledger (which must exist); its
        cursor ledger, compacted ledger and bucket ledgers written to the bookies."""
        ml_name = managed_ledger_of_topic(topic)
        info = ml.ManagedCursorInfo()
        info.cursorsLedgerId = -1 if cursor.ledger is None else cursor.ledger
        info.markDeleteLedgerId, info.markDeleteEntryId = cursor.mark_delete
        info.lastActive = int(time.time() * 1000)
        if cursor.compacted_ledger is not None:
            prop = info.properties.add()
            prop.name, prop.value = COMPACTED_TOPIC_LEDGER, cursor.compacted_ledger
        for (start, end), lid in cursor.buckets.items():
            sp = info.cursorProperties.add()
            sp.name, sp.value = bucket_key(start, end), str(lid)
        for key, value in cursor.properties.items():
            sp = info.cursorProperties.add()
            sp.name, sp.value = key, value
        if write_ledgers:
            if cursor.ledger is not None:
                state = LedgerState.OPEN if cursor.ledger_open else LedgerState.CLOSED
                await self.ledger(
                    cursor.ledger, managed_ledger_metadata(ml_name, name), state=state
                )
            if cursor.compacted_ledger is not None:
                await self.ledger(
                    cursor.compacted_ledger,
                    compacted_ledger_metadata(topic, *self._last.get(ml_name, (-1, -1))),
                )
            for lid in cursor.buckets.values():
                await self.ledger(lid, [("application", b"pulsar")])
        path = f"{self.managed_ledger_path(ml_name)}/{name}"
        await self._put(path, encode_cursor_info(info, compression))
        return path

    async def compaction(self, topic: str, compacted_ledger: int, ledger: int | None = None) -> str:
        """The `__compaction` cursor, its `CompactedTopicLedger` naming `compacted_ledger`
        (whose `pulsar/compactedTo` is the topic's last entry, as a broker that compacted
        the whole topic writes), its own cursor ledger `ledger` if given (a real broker's
        has one once compaction ran), its mark-delete at that last entry."""
        last = self._last.get(managed_ledger_of_topic(topic), (-1, -1))
        return await self.cursor(
            topic,
            COMPACTION_CURSOR,
            Cursor(ledger=ledger, mark_delete=last, compacted_ledger=compacted_ledger),
        )

    async def delete_topic(self, topic: str) -> None:
        """The topic's znodes removed (cursors, then the managed ledger), as a broker that
        deleted its metadata but not (yet) its ledgers leaves it."""
        path = self.managed_ledger_path(managed_ledger_of_topic(topic))
        try:
            children = await self.store.get_children(path)
        except NoNodeError:
            return
        for c in children:
            with contextlib.suppress(NoNodeError):
                await self.store.delete(f"{path}/{c}")
        with contextlib.suppress(NoNodeError):
            await self.store.delete(path)

    # --- schemas ---------------------------------------------------------------

    async def schema(
        self, topic_or_id: str, ledgers: Sequence[int], *, write_ledgers: bool = True
    ) -> str:
        """A schema history: version i stored as entry 0 of `ledgers[i]` (Pulsar creates a
        ledger per version), the locator listing every version. Takes a topic or a schema
        id (`tenant/ns/topic`); returns the locator's path."""
        schema_id = schema_id_of_topic(topic_or_id) if "://" in topic_or_id else topic_or_id
        locator = sc.SchemaLocator()
        for version, lid in enumerate(ledgers):
            if write_ledgers:
                await self.ledger(lid, schema_metadata(schema_id), entries=1)
            entry = locator.index.add()
            entry.version = version
            entry.position.ledgerId, entry.position.entryId = lid, 0
            entry.hash = hashlib.sha256(f"{schema_id}:{version}".encode()).digest()
        if ledgers:
            locator.info.CopyFrom(locator.index[-1])
        path = self.schema_path(schema_id)
        await self._put(path, locator.SerializeToString())
        return path

    # --- raw bytes -------------------------------------------------------------

    async def raw_managed_ledger(self, name: str, data: bytes) -> str:
        path = self.managed_ledger_path(name)
        await self._put(path, data)
        return path

    async def raw_cursor(self, managed_ledger: str, cursor: str, data: bytes) -> str:
        path = f"{self.managed_ledger_path(managed_ledger)}/{cursor}"
        await self._put(path, data)
        return path

    async def raw_schema(self, schema_id: str, data: bytes) -> str:
        path = self.schema_path(schema_id)
        await self._put(path, data)
        return path
