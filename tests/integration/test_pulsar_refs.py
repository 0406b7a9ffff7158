"""Pulsar's ledger references read from a real ZooKeeper, from a tree in Pulsar's own bytes."""

from __future__ import annotations

import asyncio

from auditor.metadata.pulsar.reader import read_managed_ledger, read_pulsar_refs, read_schema
from auditor.metadata.pulsar.refs import BadPulsarZnode, CursorRecord, LedgerRef, RefKind
from auditor.testing.harness import test_cluster
from auditor.testing.pulsar import CompressionType, Cursor, PulsarWriter
from auditor.zk import ZkClient

A = "persistent://shop/orders/payments"
ML_A = "shop/orders/persistent/payments"
B = "persistent://shop/orders/refunds"
ML_B = "shop/orders/persistent/refunds"
OLD = "persistent://legacy/us-east/orders/events"  # a pre-2.0 namespace (with a cluster)
ML_OLD = "legacy/us-east/orders/persistent/events"


async def test_refs_of_a_written_tree(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        w = PulsarWriter.of(tc, root="/pulsar")
        await w.topic(
            A,
            ledgers=[10, 11, 12],
            cursors={"sub": Cursor(ledger=20), "idle": Cursor(mark_delete=(11, 2))},
            offloaded=[10],
            bk_deleted=[10],
            compression=CompressionType.LZ4,
        )
        await w.compaction(A, compacted_ledger=30)
        await w.cursor(A, "delayed", Cursor(ledger=21, buckets={(11, 12): 31}))
        await w.topic(B, ledgers=[13], compression=CompressionType.ZLIB)
        await w.topic(OLD, ledgers=[14])
        await w.topic("persistent://shop/orders/empty")
        await w.schema(A, ledgers=[40, 41])
        await w.schema(OLD, ledgers=[42])  # schema id legacy/orders/events: no cluster
        await w.topic("persistent://shop/orders/gone", ledgers=[15], cursors={"s": Cursor(22)})
        await w.delete_topic("persistent://shop/orders/gone")

        got = await read_pulsar_refs(zk, "/pulsar")

        # The writer's side: offloaded-and-deleted ledger 10 is not in BookKeeper, the rest
        # is; the compressed znodes carry MetaStoreImpl's header.
        assert await zk.exists(tc.cluster.path(10)) is None
        for lid in (11, 12, 13, 14, 15, 20, 21, 22, 30, 31, 40, 41, 42):
            assert await zk.exists(tc.cluster.path(lid)) is not None, lid
        data, _ = await zk.get(f"/pulsar/managed-ledgers/{ML_A}")
        assert data[:2] == b"\x47\x78" and data[6:8] == b"\x08\x01"  # LZ4
        data, _ = await zk.get(f"/pulsar/managed-ledgers/{ML_B}")
        assert data[6:8] == b"\x08\x02"  # ZLIB
        for parent in ("shop", "shop/orders", "shop/orders/persistent"):  # created empty
            assert (await zk.get(f"/pulsar/managed-ledgers/{parent}"))[0] == b""

    base = "/pulsar/managed-ledgers"
    za, zb, zold = f"{base}/{ML_A}", f"{base}/{ML_B}", f"{base}/{ML_OLD}"
    ns = "shop/orders"
    size = 3 * 16
    expected = [
        LedgerRef(10, RefKind.LEDGER, ML_A, A, ns, za, None, True, 3, size),
        LedgerRef(11, RefKind.LEDGER, ML_A, A, ns, za, None, False, 3, size),
        LedgerRef(12, RefKind.LEDGER, ML_A, A, ns, za),
        LedgerRef(13, RefKind.LEDGER, ML_B, B, ns, zb),
        LedgerRef(14, RefKind.LEDGER, ML_OLD, OLD, "legacy/us-east/orders", zold),
        LedgerRef(20, RefKind.CURSOR, ML_A, A, ns, f"{za}/sub", "sub"),
        LedgerRef(21, RefKind.CURSOR, ML_A, A, ns, f"{za}/delayed", "delayed"),
        LedgerRef(30, RefKind.COMPACTED, ML_A, A, ns, f"{za}/__compaction", "__compaction"),
        LedgerRef(31, RefKind.DELAYED_BUCKET, ML_A, A, ns, f"{za}/delayed", "delayed"),
        LedgerRef(
            40,
            RefKind.SCHEMA,
            "shop/orders/payments",
            None,
            ns,
            "/pulsar/schemas/shop/orders/payments",
        ),
        LedgerRef(
            41,
            RefKind.SCHEMA,
            "shop/orders/payments",
            None,
            ns,
            "/pulsar/schemas/shop/orders/payments",
        ),
        LedgerRef(
            42,
            RefKind.SCHEMA,
            "legacy/orders/events",
            None,
            "legacy/orders",
            "/pulsar/schemas/legacy/orders/events",
        ),
    ]
    assert sorted((r for rs in got.refs.values() for r in rs), key=repr) == sorted(
        expected, key=repr
    )
    assert got.managed_ledgers == {ML_A, ML_B, ML_OLD, "shop/orders/persistent/empty"}
    assert sorted(got.cursors, key=lambda c: c.name) == [
        CursorRecord(ML_A, "__compaction", f"{za}/__compaction", None),
        CursorRecord(ML_A, "delayed", f"{za}/delayed", 21),
        CursorRecord(ML_A, "idle", f"{za}/idle", None),
        CursorRecord(ML_A, "sub", f"{za}/sub", 20),
    ]
    assert got.schemas == {"shop/orders/payments", "legacy/orders/events"}
    assert got.bad_znodes == []
    assert 15 not in got and 22 not in got  # the deleted topic's ledgers: referenced by nobody


async def test_corrupt_znodes_named_the_rest_read(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        w = PulsarWriter.of(tc)
        await w.topic(A, ledgers=[10], cursors={"sub": Cursor(ledger=20)})
        await w.topic(B, ledgers=[11])
        bad_ml = await w.raw_managed_ledger("shop/orders/persistent/broken", b"\x0a\x02\x10\x01")
        bad_cursor = await w.raw_cursor(ML_B, "sub", b"not a cursor")
        bad_schema = await w.raw_schema("shop/orders/payments", b"\xff\xff")

        got = await read_pulsar_refs(zk)

        assert sorted(got.refs) == [10, 11, 20]
        assert got.bad_znodes == [
            BadPulsarZnode(bad_ml, "ManagedLedgerInfo without required ledgerInfo[0].ledgerId"),
            BadPulsarZnode(bad_cursor, got.bad_znodes[1].reason),
            BadPulsarZnode(bad_schema, got.bad_znodes[2].reason),
        ]
        assert got.bad_znodes[1].reason.startswith("not a ManagedCursorInfo")
        assert got.bad_znodes[2].reason.startswith("not a SchemaLocator")
        # The broken managed ledger exists (its znode was read), it names no ledger.
        assert "shop/orders/persistent/broken" in got.managed_ledgers

        one = await read_managed_ledger(zk, "", ML_A)
        assert sorted(one.refs) == [10, 20] and one.managed_ledgers == {ML_A}
        gone = await read_managed_ledger(zk, "", "shop/orders/persistent/nothing")
        assert gone.refs == {} and gone.managed_ledgers == set()
        schema = await read_schema(zk, "", "shop/orders/payments")
        assert [b.path for b in schema.bad_znodes] == [bad_schema]


async def test_topics_deleted_while_read_are_skipped(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        w = PulsarWriter.of(tc)
        topics = [f"persistent://t/ns/topic-{i}" for i in range(40)]
        for i, topic in enumerate(topics):
            await w.topic(
                topic, ledgers=[100 + i], cursors={"s": Cursor(200 + i)}, write_ledgers=False
            )
        deleting = asyncio.gather(*(w.delete_topic(t) for t in topics[::2]))
        got = await read_pulsar_refs(zk)
        await deleting
        kept = [100 + i for i in range(1, 40, 2)] + [200 + i for i in range(1, 40, 2)]
        # Every topic left is read whole; a deleted one is absent or read whole, never an error.
        assert set(kept) <= set(got.refs)
        assert got.bad_znodes == []
        for i in range(0, 40, 2):
            name = f"t/ns/persistent/topic-{i}"
            if 100 + i in got:
                assert name in got.managed_ledgers
