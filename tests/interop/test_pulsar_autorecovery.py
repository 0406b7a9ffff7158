"""A real Pulsar broker's ledgers, repaired by Java's AutoRecovery and ours side by side.

Issue 29's "Pulsar's AutoRecovery": the broker (`pulsarbroker.PulsarBroker.over`,
pulsar-broker 4.0.7 with `--only-broker`) writes to three of the suite's real bookies on
Pulsar's metadata driver, so its metadata and the cluster's share one chroot and a bookie
can be stopped alone. Beside it run Java's AutoRecovery (`AutoRecoveryMain`, auditor and
worker) and one `bk-auditor run` daemon (auditor and worker), both on the cluster's
`metadata-store:zk:` URI:

* one auditor on Pulsar's leader key (`<root>/underreplication/leader`), ours, and each
  side's `whoisauditor` names it while Java's elector waits;
* real traffic through Pulsar's Python client: two topics whose managed ledgers roll every
  few entries (E/W/A 2/2/2 over the three bookies), kept by retention (no subscription
  yet), then the namespace is unloaded, which closes every ledger the broker had open:
  what a bookie then loses is closed data ledgers only, so no worker fences a ledger the
  broker is writing. Nothing may load a topic again until the read-back: even the admin
  API's stats do, and a loaded topic opens a new ledger and deletes an empty last one.
  So topic-level policies are off (`BROKER_SETTINGS`): with them, the broker's own reader
  of the namespace's `__change_events` topic was seen to reload that topic within
  milliseconds of the unload, deleting its empty ledger and opening a new one while the
  test looked on;
* the bookie in most of the broker's ledgers (data ledgers of both topics among them)
  stops: our auditor marks exactly the ledgers that name it, and the two workers, under
  the shared locks, repair each of them exactly once between them: no ensemble names the
  lost bookie, the one bookie that was no member took its place and holds every entry
  its positions give it, the metadata was rewritten once per segment that had it;
* a Pulsar consumer reads every message of both topics from the earliest, exact payloads
  in order, through ledgers the workers rewrote.

Which side repaired which ledger is up to the locks; the test prints it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
from collections.abc import AsyncIterator

import pulsar

from auditor.daemon.election import election_path
from auditor.metadata.model import LedgerMetadata, LedgerState, Segment
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.store.port import Event, EventType
from auditor.zk import ZkClient
from tests.interop.conftest import MakeCluster
from tests.interop.pulsarbroker import PulsarBroker, topic_path
from tests.interop.realbk import CALL_TIMEOUT
from tests.interop.test_java_autorecovery import (
    ELECTED,
    IS_LEADER,
    JAVA_LEADS,
    JAVA_REPAIRED,
    assert_holds,
    leader_key_names,
    metadata,
    our_repairs,
    sides,
    until_true,
)
from tests.interop.test_pulsar_driver import both_name

TENANT = "shop"
NAMESPACE = f"{TENANT}/orders"
TOPICS = (f"persistent://{NAMESPACE}/payments", f"persistent://{NAMESPACE}/refunds")
#: Messages per topic: with ledgers rolled every 5 entries, each topic has three data
#: ledgers (5, 5 and 2 entries).
MESSAGES = 12
BROKER_SETTINGS = {
    # Every managed ledger on two of the three bookies, each entry on both: a lost
    # bookie leaves one copy, and exactly one bookie (the third) can take its place.
    "managedLedgerDefaultEnsembleSize": 2,
    "managedLedgerDefaultWriteQuorum": 2,
    "managedLedgerDefaultAckQuorum": 2,
    # No `__change_events` system topic, whose reader reloads it after an unload.
    "systemTopicEnabled": "false",
    "topicLevelPoliciesEnabled": "false",
}
#: What Java's elector on Pulsar's driver (`PulsarLedgerAuditorManager`) logs when another
#: holds the key, with its own id.
JAVA_FOLLOWS = "Auditor leader election state: Following -- BookieId: "
#: The mark's name under the marks' hierarchy (`urL%010d`).
MARK = re.compile(r"/urL(\d{10})$")


def payloads(topic: str) -> list[bytes]:
    """What is sent to `topic`, in order: the consumer must read exactly these back."""
    return [f"{topic} #{i}".encode() for i in range(MESSAGES)]


def produce(broker: PulsarBroker) -> None:
    """The tenant and namespace, then MESSAGES unbatched messages (one entry each) to
    each topic; every producer and the client closed, so nothing reloads the topics once
    the namespace is unloaded."""
    broker.admin("PUT", f"/admin/v2/tenants/{TENANT}", {"allowedClusters": ["standalone"]})
    broker.admin("PUT", f"/admin/v2/namespaces/{NAMESPACE}", {})
    client = pulsar.Client(
        broker.service_url,
        operation_timeout_seconds=int(CALL_TIMEOUT),
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        for topic in TOPICS:
            producer = client.create_producer(
                topic, batching_enabled=False, send_timeout_millis=int(CALL_TIMEOUT * 1000)
            )
            for body in payloads(topic):
                producer.send(body)
            producer.close()
    finally:
        client.close()


def consume(broker: PulsarBroker, topic: str) -> list[bytes]:
    """Every message of `topic` from the earliest, by a new subscription's consumer, in
    the order received: as many as the broker says the topic holds."""
    client = pulsar.Client(
        broker.service_url,
        operation_timeout_seconds=int(CALL_TIMEOUT),
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        consumer = client.subscribe(
            topic, "read-back", initial_position=pulsar.InitialPosition.Earliest
        )
        # Subscribed: the topic is loaded, so its stats count every entry of every ledger
        # (one per message, unbatched).
        stats = broker.admin("GET", f"/admin/v2{topic_path(topic)}/internalStats")
        read = []
        for _ in range(int(stats["numberOfEntries"])):
            message = consumer.receive(timeout_millis=int(CALL_TIMEOUT * 1000))
            read.append(bytes(message.data()))
            consumer.acknowledge(message)
        consumer.close()
        return read
    finally:
        client.close()


async def broker_ledgers(zk: ZkClient, root: str) -> dict[int, tuple[LedgerMetadata, int]]:
    """Every ledger of the cluster with its metadata and znode version. The broker's ids
    are small: all of them are in the hierarchical manager's first bucket, and no other
    bucket exists (asserted, so none is missed)."""
    assert [n for n in await zk.get_children(root) if n.isdigit()] == ["00"]
    assert await zk.get_children(f"{root}/00") == ["0000"]
    names = await zk.get_children(f"{root}/00/0000")
    ids = sorted(int(n[1:]) for n in names if n.startswith("L") and n[1:].isdigit())
    return {ledger: await metadata(zk, root, ledger) for ledger in ids}


def owner(md: LedgerMetadata) -> str | None:
    """The managed ledger a data or cursor ledger belongs to (its Pulsar custom metadata)."""
    for key, value in md.custom_metadata:
        if key == "pulsar/managed-ledger":
            return value.decode()
    return None


def is_data_ledger(md: LedgerMetadata, topic: str) -> bool:
    """Whether `md` is a data ledger of `topic` (`shop/orders/persistent/<local>`)."""
    local = topic.rsplit("/", 1)[1]
    custom = dict(md.custom_metadata)
    return owner(md) == f"{NAMESPACE}/persistent/{local}" and "pulsar/cursor" not in custom


def as_map(md: LedgerMetadata) -> LedgerMetadata:
    """`md` with its custom metadata in key order. BookKeeper keeps custom metadata as a
    map: Java's worker writes it back in the order of the map it read it into, which is
    not always the order the broker wrote (seen on a schema ledger; ours keeps the
    order), and both are the same map."""
    return dataclasses.replace(md, custom_metadata=tuple(sorted(md.custom_metadata)))


class MarkLog:
    """Every mark created under the marks' tree while it is followed (a persistent
    recursive watch, set before the bookie stops), each read the moment its event comes:
    a worker may clear a mark within moments of its making, and the test must still see
    that it was made, and what it named."""

    def __init__(self, zk: ZkClient, root: str) -> None:
        self.zk = zk
        self.urm = UnderreplicationManager(zk, root)
        self.tree = f"{self.urm.base}/ledgers"
        #: Ledger id: its missing replicas, each time it was marked (None: cleared before
        #: it could be read).
        self.marked: dict[int, list[list[str] | None]] = {}
        #: Set when a mark's event came (a waiter looks again).
        self.changed = asyncio.Event()
        self._noting: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def follow(self) -> AsyncIterator[None]:
        await self.zk.ensure_path(self.tree)
        events = await self.zk.watch_tree(self.tree)

        async def note() -> None:
            while True:
                item = await events.get()
                assert isinstance(item, Event), f"the watch on the marks was lost: {item}"
                found = MARK.search(item.path)
                if item.type is EventType.CREATED and found is not None:
                    ledger = int(found.group(1))
                    mark = await self.urm.get(ledger)
                    replicas = None if mark is None else sorted(mark.replicas)
                    self.marked.setdefault(ledger, []).append(replicas)
                self.changed.set()

        self._noting = asyncio.create_task(note())
        try:
            yield
        finally:
            self._noting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._noting
            await self.zk.unwatch_tree(self.tree)

    async def until_done(self, ledgers: set[int], within: float = 60) -> None:
        """Until every one of `ledgers` was marked and no mark is left (the watch that
        wakes this is the log's own: ZooKeeper keeps one persistent watch per path and
        session, so a second on the same tree would share, and remove, it)."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            if self._noting is not None and self._noting.done():
                self._noting.result()  # its failure (the watch lost) is the test's
            self.changed.clear()
            listing = await self.urm.read_marks()
            assert listing.corrupt == []
            left_marked = sorted(listing.by_id())
            if ledgers <= self.marked.keys() and not left_marked:
                return
            left = deadline - asyncio.get_running_loop().time()
            assert left > 0, (
                f"not within {within}s: marks of {sorted(ledgers)} made and cleared "
                f"(made: {self.marked}, left: {left_marked})"
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))


async def test_a_brokers_bookie_lost_repaired_by_either_side_and_read_back(
    real_cluster: MakeCluster,
) -> None:
    """Our auditor leads on Pulsar's key, Java's AutoRecovery waits behind it, both
    `whoisauditor` name ours. The broker writes two topics and its namespace is unloaded
    (every ledger closed). The bookie in most of its ledgers stops: our auditor marks
    exactly the ledgers that name it, each naming it missing; Java's worker and ours
    repair each exactly once between them (the third bookie in the lost one's place,
    holding its entries, the metadata rewritten once per segment that had it, every other
    ledger untouched); a Pulsar consumer reads every message back from the earliest."""
    cluster = real_cluster("sorted", "sorted", "sorted", driver="pulsar")
    root = cluster.ledgers_root
    bookies = {b.bookie_id for b in cluster.bookies}
    broker = PulsarBroker.over(cluster.cluster, cluster.workdir / "broker", BROKER_SETTINGS)
    async with sides(cluster) as (zk, start, java):
        # The broker and our daemon start side by side; Java's follows ours, so ours
        # holds Pulsar's key.
        booting = asyncio.create_task(asyncio.to_thread(broker.start))
        try:
            ours = await start("ours")
            await leader_key_names(zk, root, ours.identity)
            await asyncio.to_thread(java.start)
            await booting
            await both_name(cluster, ours.identity)
            await until_true(lambda: ours.sample(IS_LEADER) == 1, "ours leads")
            assert ours.sample(ELECTED) == 1
            # Java's elector, on Pulsar's driver, follows; its auditor never started.
            follows = JAVA_FOLLOWS + java.bookie_id
            await until_true(lambda: follows in java.log_text(), "Java's elector follows")
            assert JAVA_LEADS not in java.log_text()
            # The key is the one election: neither side voted BookKeeper's way.
            assert await zk.exists(election_path(root)) is None
            await until_true(lambda: ours.sample("bookkeeper_auditor_worker_running") == 1, "ours")

            await asyncio.to_thread(produce, broker)
            # Answered once every topic of the namespace is closed, ledgers included.
            await asyncio.to_thread(broker.admin, "PUT", f"/admin/v2/namespaces/{NAMESPACE}/unload")
            before = await broker_ledgers(zk, root)
            # Unloaded: every ledger closed, so the workers never fence a ledger the
            # broker writes. No subscription exists yet (retention keeps the messages),
            # no system topic, no schema: the two topics' data ledgers are all there is.
            assert {md.state for md, _ in before.values()} == {LedgerState.CLOSED}
            topic_of = {
                ledger: [t for t in TOPICS if is_data_ledger(md, t)]
                for ledger, (md, _) in before.items()
            }
            assert sorted(topic_of.values()) == sorted([[t] for t in TOPICS] * 3), topic_of

            # The bookie to lose: of those holding data ledgers of both topics, the one
            # in most ledgers (the lowest id among equals).
            def holds(bookie: str, topic: str) -> bool:
                return any(is_data_ledger(md, topic) and bookie in md.bookies()
                           for md, _ in before.values())  # fmt: skip

            def count(bookie: str) -> int:
                return sum(bookie in md.bookies() for md, _ in before.values())

            candidates = sorted(b for b in bookies if all(holds(b, t) for t in TOPICS))
            lost = max(candidates, key=count)
            on_lost = {ledger for ledger, (md, _) in before.items() if lost in md.bookies()}

            log = MarkLog(zk, root)
            async with log.follow():
                await asyncio.to_thread(cluster.bookie(lost).stop)
                await log.until_done(on_lost)
            # Exactly the ledgers that named it were marked, each naming it (once: no
            # auditor marked a ledger again), unless cleared before it could be read.
            assert log.marked.keys() == on_lost, (log.marked, on_lost)
            for ledger, seen in log.marked.items():
                assert len(seen) == 1 and seen[0] in ([lost], None), (ledger, seen)

            after = await broker_ledgers(zk, root)
            assert after.keys() == before.keys()
            for ledger, (md, version) in after.items():
                old, old_version = before[ledger]
                if ledger not in on_lost:
                    assert (md, version) == (old, old_version), ledger
                    continue
                # The one bookie that was no member took the lost one's place in each
                # segment that had it, nothing else changed, one rewrite per such
                # segment; it holds every entry its positions give it.
                (spare,) = bookies - old.bookies()
                replaced = tuple(
                    Segment(
                        seg.first_entry_id, tuple(spare if b == lost else b for b in seg.bookies)
                    )
                    for seg in old.segments
                )
                want = dataclasses.replace(old, segments=replaced)
                assert as_map(md) == as_map(want), (ledger, old, md)
                segments = sum(lost in seg.bookies for seg in old.segments)
                assert version == old_version + segments, (ledger, old.segments, md.segments)
                await assert_holds(cluster, md, spare)

            # Each ledger repaired once, by one side or the other; both ran throughout.
            # (Ours logs a repair just after removing its mark: its log is awaited.)
            def repairs() -> tuple[list[int], list[int]]:
                by_java = sorted(map(int, JAVA_REPAIRED.findall(java.log_text())))
                return by_java, sorted(our_repairs(cluster, "ours"))

            def logged() -> bool:
                by_java, by_ours = repairs()
                return set(by_java) | set(by_ours) >= on_lost

            await until_true(logged, "every repair logged")
            by_java, by_ours = repairs()
            assert sorted(by_java + by_ours) == sorted(on_lost), (by_java, by_ours)
            assert java.running and ours.proc.returncode is None
            print(f"lost {lost}: Java's worker repaired {by_java}, ours {by_ours}")

            for topic in TOPICS:
                read = await asyncio.to_thread(consume, broker, topic)
                assert read == payloads(topic), topic
        finally:
            # A start still under way ends first, so that the stop finds its process.
            with contextlib.suppress(Exception):
                await booting
            await asyncio.to_thread(broker.stop)
