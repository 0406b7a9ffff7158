"""The Pulsar storage audit against the metadata a real Apache Pulsar broker wrote.

One standalone broker for the module (`pulsarbroker.PulsarBroker`: pulsar-broker 4.0.7,
its bookie on Pulsar's driver, its whole tree under a chroot of the session's ZooKeeper),
and real traffic through Pulsar's own Python client and admin REST API:

* topics in two namespaces (`shop/orders`, `shop/billing`), a partitioned topic, topics
  whose names Pulsar encodes (`:`, `=`, a space, non-ASCII);
* ledgers rolled every few entries (kept by retention), a subscription on every topic
  whose cursor persists its position to a ledger of its own;
* a schema with two versions, a topic compacted through the admin API, a deleted topic;
* a ledger leaked on purpose: made by BookKeeper's client with the custom metadata a
  managed ledger's data ledger has, referenced by nothing.

`bk-auditor pulsar-audit` then accounts for every ledger the broker uses (nothing missing,
no orphan), reports the leaked ledger as an orphan only once it is past the grace, and a
ledger deleted from BookKeeper under a live topic as missing, with its topic.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar
import pytest
from pulsar.schema import Integer, JsonSchema, Record, String

from auditor.metadata.model import LedgerState
from auditor.metadata.serde import decode_ledger_metadata
from auditor.testing.cli import bk
from auditor.testing.zkserver import ZooKeeperServer
from auditor.zk import ZkClient
from tests.interop.pulsarbroker import (
    ENTRIES_PER_LEDGER,
    PulsarBroker,
    topic_path,
)
from tests.interop.realbk import (
    CALL_TIMEOUT,
    InteropError,
    JavaClient,
    temp_dir,
)

TENANT = "shop"
PAYMENTS = "persistent://shop/orders/payments"  # compacted
INVOICES = "persistent://shop/billing/invoices"
COLON = "persistent://shop/orders/orders:eu"
SPACE = "persistent://shop/orders/with space"
ACCENT = "persistent://shop/orders/zürich"
EQUALS = "persistent://shop/billing/tax=vat"
PARTITIONED = "persistent://shop/orders/parts"
PARTITIONS = 3
ITEMS = "persistent://shop/billing/items"  # two schema versions
DOOMED = "persistent://shop/billing/doomed"  # deleted
PLAIN = (PAYMENTS, INVOICES, COLON, SPACE, ACCENT, EQUALS)
SUBSCRIPTION = "audit-sub"
#: Messages per topic: ledgers of ENTRIES_PER_LEDGER entries roll twice.
MESSAGES = 12
#: Pulsar's custom metadata of a managed ledger's data ledger (what the leak pretends).
LEAK_OWNER = "shop/orders/persistent/payments"
#: How long a wait on the broker's work (compaction) may take.
DEADLINE = 60.0


class ItemV1(Record):  # type: ignore[misc]  # pulsar-client is untyped
    _namespace = "bkauditor"
    name = String()


class ItemV2(Record):  # type: ignore[misc]
    _namespace = "bkauditor"
    name = String()
    qty = Integer()


@dataclass(frozen=True, slots=True)
class Traffic:
    broker: PulsarBroker
    leaked: int
    leaked_at: float  # time.time() once it was closed


def _produce_and_consume(client: pulsar.Client, topic: str, keyed: bool) -> None:
    """MESSAGES messages (unbatched: one entry each; keyed for compaction, else spread
    round-robin over partitions) read by the subscription, which exists before the first
    is sent and acknowledges all but the last of each partition one by one: every cursor
    persists a position mid-topic to its ledger."""
    consumer = client.subscribe(
        topic, SUBSCRIPTION, initial_position=pulsar.InitialPosition.Earliest
    )
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(MESSAGES):
        if keyed:
            producer.send(f"{topic} #{i}".encode(), partition_key=f"key-{i % 3}")
        else:
            producer.send(f"{topic} #{i}".encode())
    producer.close()
    by_partition: dict[str, list[pulsar.Message]] = {}
    for _ in range(MESSAGES):
        message = consumer.receive(timeout_millis=int(CALL_TIMEOUT * 1000))
        by_partition.setdefault(message.topic_name(), []).append(message)
    for messages in by_partition.values():
        for message in sorted(messages, key=lambda m: m.message_id())[:-1]:
            consumer.acknowledge(message)
    consumer.close()


def _compact(broker: PulsarBroker, topic: str) -> None:
    """Compaction through the admin API, awaited by polling its status (nothing to watch)."""
    path = f"/admin/v2{topic_path(topic)}/compaction"
    broker.admin("PUT", path)
    deadline = time.monotonic() + DEADLINE
    while True:
        status = broker.admin("GET", path)
        if status["status"] == "SUCCESS":
            return
        if status["status"] == "ERROR" or time.monotonic() > deadline:
            raise InteropError(f"compaction of {topic}: {status}")
        time.sleep(0.2)


def _leak(broker: PulsarBroker, classes: Path) -> int:
    """A ledger with a data ledger's custom metadata, written and closed by BookKeeper's
    own client (BkClient's `create` with `custom`), that nothing references."""
    client = JavaClient(broker.cluster, classes, broker.base_dir)
    try:
        answer = client.ok(
            "create",
            ensemble=1,
            write=1,
            ack=1,
            digest="CRC32C",
            entries=3,
            custom={
                "application": "pulsar",
                "component": "managed-ledger",
                "pulsar/managed-ledger": LEAK_OWNER,
            },
        )
    finally:
        client.kill()
    return int(answer["ledger"])


@pytest.fixture(scope="module")
def traffic(zk_server: ZooKeeperServer, interop_classes: Path) -> Iterator[Traffic]:
    workdir = temp_dir("bk-interop-broker-")
    broker = PulsarBroker(zk_server.hosts, f"pulsar-{uuid.uuid4().hex[:10]}", workdir)
    broker.start()
    try:
        broker.admin("PUT", f"/admin/v2/tenants/{TENANT}", {"allowedClusters": ["standalone"]})
        for namespace in ("orders", "billing"):
            broker.admin("PUT", f"/admin/v2/namespaces/{TENANT}/{namespace}", {})
        # The second schema adds a field without a default: allowed by this policy only.
        broker.admin(
            "PUT",
            f"/admin/v2/namespaces/{TENANT}/billing/schemaCompatibilityStrategy",
            "ALWAYS_COMPATIBLE",
        )
        broker.admin("PUT", f"/admin/v2{topic_path(PARTITIONED)}/partitions", PARTITIONS)
        client = pulsar.Client(
            broker.service_url,
            operation_timeout_seconds=int(CALL_TIMEOUT),
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
        try:
            for topic in (*PLAIN, PARTITIONED, DOOMED):
                _produce_and_consume(client, topic, keyed=topic != PARTITIONED)
            schemas = [(ITEMS, ItemV1, ItemV1(name="a")), (ITEMS, ItemV2, ItemV2(name="b", qty=2))]
            # A schema of a topic whose name Pulsar encodes.
            schemas.append((COLON, ItemV1, ItemV1(name="c")))
            for topic, version, item in schemas:
                producer = client.create_producer(topic, schema=JsonSchema(version))
                producer.send(item)
                producer.close()
        finally:
            client.close()
        _compact(broker, PAYMENTS)
        _compact(broker, COLON)
        broker.admin("DELETE", f"/admin/v2{topic_path(DOOMED)}?force=true")
        leaked = _leak(broker, interop_classes)
        yield Traffic(broker, leaked, time.time())
    except BaseException:
        print(broker.log_tail(80))
        raise
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class BkLedger:
    ledger: int
    closed: bool
    custom: dict[str, str]


async def bookkeeper_ledgers(traffic: Traffic) -> dict[int, BkLedger]:
    """Every ledger of the broker's BookKeeper, read from its metadata (Pulsar's driver
    keeps them at the hierarchical paths under `/<chroot>/ledgers`)."""
    root = traffic.broker.cluster.ledgers_root
    out: dict[int, BkLedger] = {}
    async with ZkClient(traffic.broker.zk_hosts, timeout=10.0) as zk:

        async def walk(path: str, depth: int) -> None:
            for name in await zk.get_children(path):
                child = f"{path}/{name}"
                if name.startswith("L") and name[1:].isdigit():
                    data, _ = await zk.get(child)
                    md = decode_ledger_metadata(data, int(name[1:]))
                    custom = {k: v.decode(errors="replace") for k, v in md.custom_metadata}
                    out[md.ledger_id] = BkLedger(
                        md.ledger_id, md.state == LedgerState.CLOSED, custom
                    )
                elif name.isdigit() and depth < 4:
                    await walk(child, depth + 1)

        await walk(root, 0)
    return out


async def audit(traffic: Traffic, *args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = await bk(
        "pulsar-audit",
        "--metadata-service-uri",
        traffic.broker.cluster.uri,
        "--json",
        "--top",
        "100",
        *args,
        within=120,
    )
    assert code in (0, 1), err
    doc: dict[str, Any] = json.loads(out)
    return code, doc


def found(doc: dict[str, Any]) -> list[tuple[int, str]]:
    return sorted((v["ledger_id"], v["category"]) for v in doc["violations"])


async def test_every_ledger_the_broker_uses_is_accounted_for(traffic: Traffic) -> None:
    """Nothing missing, no orphan: every ledger in BookKeeper but the leaked one is
    referenced by Pulsar's tree (data ledgers of every live topic, cursor ledgers, schema
    versions, the compacted ledger), and the leaked one, younger than the grace, is no
    orphan yet. The traffic made every kind of ledger the audit must account for."""
    ledgers = await bookkeeper_ledgers(traffic)
    assert traffic.leaked in ledgers
    components = {lg.custom.get("component") for lg in ledgers.values()}
    assert components == {"managed-ledger", "schema", "compacted-ledger"}
    # The compacted ledger names its topic decoded, the schema its id encoded.
    compacted = {lg.custom.get("pulsar/compactedTopic") for lg in ledgers.values()}
    assert compacted == {None, PAYMENTS, COLON}
    schema_ids = {lg.custom.get("pulsar/schemaId") for lg in ledgers.values()}
    assert {"shop/billing/items", "shop/orders/orders%3Aeu"} <= schema_ids
    owners = {lg.custom.get("pulsar/managed-ledger") for lg in ledgers.values()}
    # Encoded names as the broker writes them; the deleted topic's ledgers are gone.
    assert {
        "shop/orders/persistent/orders%3Aeu",
        "shop/orders/persistent/with+space",
        "shop/orders/persistent/z%C3%BCrich",
        "shop/billing/persistent/tax%3Dvat",
        *(f"shop/orders/persistent/parts-partition-{i}" for i in range(PARTITIONS)),
    } <= owners
    assert "shop/billing/persistent/doomed" not in owners
    cursors = {
        lg.custom["pulsar/managed-ledger"]
        for lg in ledgers.values()
        if lg.custom.get("pulsar/cursor") == SUBSCRIPTION
    }
    assert len(cursors) == len(PLAIN) + PARTITIONS
    rolled = [
        lg
        for lg in ledgers.values()
        if lg.closed
        and lg.custom.get("pulsar/managed-ledger") == "shop/orders/persistent/orders%3Aeu"
        and "pulsar/cursor" not in lg.custom
    ]
    assert len(rolled) >= MESSAGES // ENTRIES_PER_LEDGER
    schemas = [
        lg for lg in ledgers.values() if lg.custom.get("pulsar/schemaId") == "shop/billing/items"
    ]
    assert len(schemas) == 2

    code, doc = await audit(traffic, "--set", "checks.pulsar_orphan_grace=3600")
    assert (code, found(doc)) == (0, [])
    assert doc["counts"] == dict.fromkeys(doc["counts"], 0)
    assert doc["invalid_znodes"]["total"] == 0
    rollups = doc["pulsar"]
    assert rollups["totals"]["ledgers"] == len(ledgers) - 1
    assert rollups["unreferenced_young"] == 1
    topics = {t["topic"] for t in rollups["topics"]}
    assert set(PLAIN) <= topics
    assert {f"{PARTITIONED}-partition-{i}" for i in range(PARTITIONS)} <= topics
    assert not any("doomed" in t for t in topics)
    assert {n["namespace"] for n in rollups["namespaces"]} == {"shop/orders", "shop/billing"}


@dataclass
class Row:
    """What the broker's admin API says one rollup row must hold."""

    ledgers: set[int]
    bytes: int = 0
    unsized: int = 0
    #: The bytes of the current ledgers (`currentLedgerSize`): in the broker's
    #: `storageSize`, not in BookKeeper's metadata until those ledgers close.
    current: int = 0

    @classmethod
    def of(cls, sizes: dict[int, int | None], current: int) -> Row:
        """A row of ledgers and their sizes (None: open, sized by nothing)."""
        return cls(
            set(sizes),
            sum(size or 0 for size in sizes.values()),
            sum(size is None for size in sizes.values()),
            current,
        )


def brokers_rows(broker: PulsarBroker) -> tuple[dict[str, Row], dict[str, Row]]:
    """Per topic and per namespace, the ledgers and bytes the broker's admin API reports
    for every topic of the two namespaces, system topics included (`internalStats`):
    its data ledgers (the current one open, so sized by nothing), its cursors' ledgers
    (open while the topic is loaded: no size anywhere), its compacted ledger, its
    schema's ledgers. Each topic's `storageSize` is checked to be its closed ledgers'
    sizes plus its current ledger's, so the rows tie to the figure operators see."""
    topics: dict[str, Row] = {}
    namespaces: dict[str, Row] = {}
    for namespace in (f"{TENANT}/orders", f"{TENANT}/billing"):
        listed = broker.admin("GET", f"/admin/v2/persistent/{namespace}?includeSystemTopic=true")
        per_ledger: dict[int, int | None] = {}
        for topic in listed:
            stats = broker.admin("GET", f"/admin/v2{topic_path(topic)}/internalStats")
            storage = broker.admin("GET", f"/admin/v2{topic_path(topic)}/stats")["storageSize"]
            current = stats["ledgers"][-1]["ledgerId"] if stats["state"] == "LedgerOpened" else -1
            own: dict[int, int | None] = {}
            for info in stats["ledgers"]:
                own[info["ledgerId"]] = None if info["ledgerId"] == current else info["size"]
            assert (
                storage
                == stats["totalSize"]
                == (sum(size or 0 for size in own.values()) + stats["currentLedgerSize"])
            ), topic
            for cursor in stats["cursors"].values():
                if cursor["cursorLedger"] >= 0:
                    own[cursor["cursorLedger"]] = None
            for info in (stats["compactedLedger"], *stats.get("schemaLedgers", [])):
                if info["ledgerId"] >= 0:
                    own[info["ledgerId"]] = info["size"]
            topics[topic] = Row.of(own, stats["currentLedgerSize"])
            per_ledger.update(own)  # a schema shared by partitions counts once
        namespaces[namespace] = Row.of(per_ledger, sum(topics[t].current for t in listed))
    return topics, namespaces


async def test_rollups_agree_with_the_brokers_admin_api(traffic: Traffic) -> None:
    """Every topic's and namespace's rollup row holds exactly the ledgers, bytes and
    unsized ledgers the broker's admin API reports, system topics and schemas included.

    The stated tolerance is the bytes of the open ledgers and nothing else: BookKeeper
    records a ledger's length only when it closes, so a topic's current ledger (and each
    cursor's ledger) is counted in `unsized` with no bytes, where the broker's
    `storageSize` includes `currentLedgerSize`. Every closed ledger's size agrees to the
    byte. (A closed cursor ledger would count bytes the admin API does not show; a
    loaded topic's cursor ledgers are open, and the broker deletes one it rolls off.)"""
    topics, namespaces = brokers_rows(traffic.broker)
    assert {PAYMENTS, EQUALS, ITEMS, f"persistent://{TENANT}/orders/__change_events"} <= set(topics)
    assert topics[ITEMS].bytes > 0 and topics[COLON].current > 0
    _, doc = await audit(traffic)
    rollups = doc["pulsar"]
    ours_topics = {row["topic"]: row for row in rollups["topics"]}
    ours_namespaces = {row["namespace"]: row for row in rollups["namespaces"]}
    assert set(ours_topics) == set(topics)
    assert set(ours_namespaces) == set(namespaces)
    for name, want in (*topics.items(), *namespaces.items()):
        got = ours_topics.get(name) or ours_namespaces[name]
        assert (got["ledgers"], got["bytes"], got["unsized"]) == (
            len(want.ledgers),
            want.bytes,
            want.unsized,
        ), name
    # The tolerance is exercised: some topics' current ledgers hold bytes.
    assert sum(row.current for row in namespaces.values()) > 0


async def test_the_leaked_ledger_is_an_orphan_once_past_the_grace(traffic: Traffic) -> None:
    """With a grace of two seconds, once the leaked ledger is older than that it is the
    one orphan, owned by the topic its custom metadata names; nothing else is reported."""
    grace = 2.0
    # Time has to pass; nothing to watch.
    await asyncio.sleep(max(0.0, traffic.leaked_at + grace + 1.0 - time.time()))
    code, doc = await audit(traffic, "--set", f"checks.pulsar_orphan_grace={grace:g}")
    assert (code, found(doc)) == (1, [(traffic.leaked, "orphan")])
    detail = doc["violations"][0]["detail"]
    assert (detail["topic"], detail["namespace"], detail["kind"]) == (
        PAYMENTS,
        "shop/orders",
        "managed-ledger",
    )
    assert detail["command"] == f"bookkeeper shell deleteledger -ledgerid {traffic.leaked} -force"
    assert detail["size_known"] is True
    # Pulsar's root named twice (it is relative to the URI's chroot): no Pulsar tree
    # there, said so, and no orphan, the leak held back with the rest.
    chroot = f"/{traffic.broker.chroot}"
    code, doc = await audit(
        traffic, "--set", f"checks.pulsar_orphan_grace={grace:g}", "--pulsar-root", chroot
    )
    assert (code, found(doc)) == (1, [])
    assert [z["path"] for z in doc["invalid_znodes"]["listed"]] == [f"{chroot}/managed-ledgers"]
    assert traffic.leaked in doc["pulsar"]["orphans_held"]["ledgers"]


async def test_a_ledger_deleted_under_a_live_topic_is_missing_with_its_topic(
    traffic: Traffic, interop_classes: Path
) -> None:
    """A rolled (closed) data ledger of the topic whose name Pulsar encodes is deleted
    from BookKeeper by BookKeeper's own client: it is `missing`, with that topic under its
    real name; nothing else is reported (the leak is still within the default grace)."""
    ledgers = await bookkeeper_ledgers(traffic)
    victim = min(
        lg.ledger
        for lg in ledgers.values()
        if lg.closed
        and lg.custom.get("pulsar/managed-ledger") == "shop/orders/persistent/orders%3Aeu"
        and "pulsar/cursor" not in lg.custom
    )
    client = JavaClient(traffic.broker.cluster, interop_classes, traffic.broker.base_dir)
    try:
        await asyncio.to_thread(client.ok, "delete", ledger=victim)
    finally:
        await asyncio.to_thread(client.kill)
    code, doc = await audit(traffic)
    assert (code, found(doc)) == (1, [(victim, "missing")])
    detail = doc["violations"][0]["detail"]
    assert (detail["topic"], detail["namespace"]) == (COLON, "shop/orders")
    assert detail["reason"] == "no metadata"


async def test_the_scan_finds_what_pulsar_audit_finds(traffic: Traffic, tmp_path: Path) -> None:
    """`scan --checks replicas,placement,pulsar` (in process, three id ranges) on the
    broker's cluster: its Pulsar findings and rollups are `pulsar-audit`'s on the same
    state, the leak an orphan past a short grace and the ledger deleted under a live
    topic missing (the test before this deleted it), with their topics."""
    grace = ("--set", "checks.pulsar_orphan_grace=2")
    await asyncio.sleep(max(0.0, traffic.leaked_at + 3.0 - time.time()))
    code, doc = await audit(traffic, *grace)
    assert code == 1
    want = {(v["ledger_id"], v["category"], v["detail"].get("topic")) for v in doc["violations"]}
    assert {(category, topic) for _, category, topic in want} == {
        ("missing", COLON),
        ("orphan", PAYMENTS),
    }
    out = tmp_path / "scan"
    code, _, err = await bk(
        "scan",
        "--metadata-service-uri",
        traffic.broker.cluster.uri,
        "--partitions",
        "3",
        "--checks",
        "replicas,placement,pulsar",
        "--out",
        str(out),
        "--no-progress",
        *grace,
        within=180,
    )
    assert code == 1, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    report = summary["reports"]["pulsar"]
    got = {(v["ledger_id"], v["category"], v["detail"].get("topic")) for v in report["violations"]}
    assert got == want
    assert report["counts"] == doc["counts"]
    rows = ("totals", "namespaces", "topics", "unreferenced_young", "at_risk")
    assert {k: summary["pulsar"][k] for k in rows} == {k: doc["pulsar"][k] for k in rows}
