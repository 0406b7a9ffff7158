"""`pulsar-audit` on a real ZooKeeper and emulated bookies: exact findings and rollups.

The cluster (namespace `shop/orders`, 3 bookies, E=3 W=2, 3 entries of 16 bytes each):

* topic `a`: ledgers 10 (entry 1 lost on every bookie: missing, entries 1-1),
  11 (its metadata deleted: missing, no metadata), 12 (open, current);
  cursor `sub` on ledger 20 (open, as a loaded topic's); schema ledger 40;
* topic `b`: ledgers 30 (offloaded, gone from BookKeeper: not missing), 32 (its
  metadata does not decode: `metadata_invalid`, not missing), 31 (open);
  cursor `gone` on ledger 25, whose metadata is deleted (dangling cursor);
* topic `old`, deleted: its ledgers 50 and 51 are left, two days old (orphans);
* ledger 60, created for `old` a moment ago (young: not yet an orphan);
* ledger 70, no Pulsar metadata (not Pulsar's: never an orphan).
"""

from __future__ import annotations

import json
import time

from auditor.checks.findings import Category, Check, CheckReport, Violation
from auditor.checks.pulsar_audit import LedgerVerdicts, delete_command
from auditor.checks.pulsar_audit_run import verdicts_of
from auditor.cli.pulsar_audit import audit_cluster
from auditor.config import load_config
from auditor.metadata.cluster import ClusterTarget
from auditor.metadata.paths import ledger_path
from auditor.testing.cli import bk
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.pulsar import Cursor, PulsarWriter, managed_ledger_metadata
from auditor.testing.zkdump import dump_tree
from auditor.zk import ZkClient

FAST = ["checks.retry_delay=0.1", "readEntryTimeout=1", "checks.pulsar_orphan_grace=3600"]
TOPIC_A = "persistent://shop/orders/a"
TOPIC_B = "persistent://shop/orders/b"
TOPIC_OLD = "persistent://shop/orders/old"
ML_OLD = "shop/orders/persistent/old"
SIZE = 3 * 16  # a closed ledger's length: 3 entries of 16 bytes
TWO_DAYS_AGO_MS = int((time.time() - 2 * 86400) * 1000)


async def build(tc: TestCluster) -> PulsarWriter:
    w = PulsarWriter.of(tc)
    await w.topic(TOPIC_A, ledgers=[10, 11, 12], cursors={"sub": Cursor(ledger=20)})
    await w.schema(TOPIC_A, ledgers=[40])
    await w.topic(
        TOPIC_B,
        ledgers=[30, 32, 31],
        offloaded=[30],
        bk_deleted=[30],
        cursors={"gone": Cursor(ledger=25)},
    )
    await w.topic(TOPIC_OLD, ledgers=[50, 51], open_last=False, write_ledgers=False)
    for lid in (50, 51):
        await tc.writer.write_ledger(
            lid,
            tc.ids,
            write_quorum=2,
            num_entries=3,
            ctime=TWO_DAYS_AGO_MS,
            custom_metadata=managed_ledger_metadata(ML_OLD),
        )
    await w.delete_topic(TOPIC_OLD)
    await w.ledger(60, managed_ledger_metadata(ML_OLD))
    await w.ledger(70)
    for b in tc.bookies:
        b.drop_entries(10, [1])
    for lid in (11, 25):
        await tc.store.delete(ledger_path(tc.cluster.manager, tc.root, lid))
    await tc.store.set(ledger_path(tc.cluster.manager, tc.root, 32), b"not ledger metadata")
    return w


def target(zk: ZkClient, tc: TestCluster) -> ClusterTarget:
    return ClusterTarget(zk.hosts, tc.root, None, 10.0)


async def test_findings_rollups_and_nothing_written(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        await build(tc)
        ids = tc.ids
        before = await dump_tree(zk)
        report, audit = await audit_cluster(target(zk, tc), load_config(None, FAST), replicas=True)
        assert await dump_tree(zk) == before  # nothing written to ZooKeeper

    found = {(v.ledger_id, str(v.category)) for v in report.violations}
    assert found == {
        (10, "missing"),
        (11, "missing"),
        (25, "dangling_cursor"),
        (32, "metadata_invalid"),
        (50, "orphan"),
        (51, "orphan"),
    }
    detail = {v.ledger_id: v.detail for v in report.violations}
    assert detail[10]["reason"] == "no replica"
    assert detail[10]["entries"] == [[1, 1]]
    assert detail[10]["topic"] == TOPIC_A
    assert detail[11]["reason"] == "no metadata"
    assert detail[11]["topic"] == TOPIC_A
    assert detail[25]["cursor"] == "gone"
    assert detail[25]["topic"] == TOPIC_B
    for lid in (50, 51):
        assert detail[lid]["size"] == SIZE
        assert detail[lid]["namespace"] == "shop/orders"
        assert detail[lid]["command"] == delete_command(lid)
        assert detail[lid]["age_s"] >= 2 * 86400 - 60
    assert report.check is Check.PULSAR
    assert not report.invalid_znodes
    assert audit.young == 1  # ledger 60
    assert audit.unaged.count == 0

    doc = audit.to_json()
    (ns,) = doc["namespaces"]
    assert ns["namespace"] == "shop/orders"
    # Referenced: 10, 12, 20, 40 (a); 30, 31, 32, 25 (b); 11 (a, no metadata).
    assert ns["ledgers"] == 9
    assert ns["missing"] == 2
    assert ns["dangling_cursors"] == 1
    assert ns["orphans"] == 2
    assert ns["orphan_bytes"] == 2 * SIZE
    assert ns["under_replicated"] == 1  # ledger 10
    assert ns["under_replicated_bytes"] == SIZE
    # No rack map: every bookie in the default rack, so the closed ledgers on the
    # bookies (10, 40) adhere softly at best; the cursor ledger 20 is open, as a loaded
    # topic's is (the placement check judges closed ledgers).
    assert ns["unplaced"] == 2
    assert ns["unplaced_bytes"] == SIZE + 16  # the schema ledger holds one entry
    topics = {row["topic"]: row for row in doc["topics"]}
    # a's schema ledger 40 counts under a.
    assert set(topics) == {TOPIC_A, TOPIC_B, TOPIC_OLD}
    assert topics[TOPIC_A]["ledgers"] == 5
    assert topics[TOPIC_A]["missing"] == 2
    assert topics[TOPIC_B]["dangling_cursors"] == 1
    assert topics[TOPIC_OLD]["orphans"] == 2
    assert ns == {
        "namespace": "shop/orders",
        "ledgers": 9,
        # 10, 11 (Pulsar's size), 30 (offloaded: Pulsar's), 32 (undecodable: Pulsar's): 48
        # each; 40: 16; the open 12 and 31, the open cursor ledger 20 and the cursor
        # ledger 25 (no metadata) unsized.
        "bytes": 4 * SIZE + 16,
        "unsized": 4,
        "under_replicated": 1,
        "under_replicated_bytes": SIZE,
        "unplaced": 2,
        "unplaced_bytes": SIZE + 16,
        "missing": 2,
        "missing_bytes": 2 * SIZE,
        "dangling_cursors": 1,
        "orphans": 2,
        "orphan_bytes": 2 * SIZE,
    }
    # One bookie's loss: 10 (entries on every bookie) and 40 (one entry, on the
    # ensemble's first two bookies) would fall below the ack quorum; the cursor ledger 20
    # is open, and the risk analysis judges closed ledgers only.
    at_risk = {(r["domain"], r["name"]): r["by_namespace"] for r in doc["at_risk"]}
    assert at_risk == {
        ("bookie", ids[0]): {"shop/orders": 2},
        ("bookie", ids[1]): {"shop/orders": 2},
        ("bookie", ids[2]): {"shop/orders": 1},
    }


async def test_cli_exit_codes_json_and_a_bad_znode(zk: ZkClient) -> None:
    sets = [a for kv in FAST for a in ("--set", kv)]
    async with test_cluster(zk, 3) as tc:
        w = PulsarWriter.of(tc)
        await w.topic(TOPIC_A, ledgers=[10, 11], cursors={"sub": Cursor(ledger=20)})
        code, out, err = await bk("pulsar-audit", "--zk", zk.hosts, "--json", *sets)
        assert code == 0, err
        doc = json.loads(out)
        assert doc["violations"] == []
        assert doc["replicas_checked"] is True
        assert doc["pulsar"]["namespaces"][0]["ledgers"] == 3

        await tc.store.delete(ledger_path(tc.cluster.manager, tc.root, 10))
        bad = await w.raw_cursor("shop/orders/persistent/a", "broken", b"\xff\xfe not a cursor")
        code, out, err = await bk(
            "pulsar-audit", "--zk", zk.hosts, "--json", "--no-replicas", *sets
        )
        assert code == 1, err
        doc = json.loads(out)
        assert {(v["ledger_id"], v["category"]) for v in doc["violations"]} == {(10, "missing")}
        assert [z["path"] for z in doc["invalid_znodes"]["listed"]] == [bad]
        assert doc["replicas_checked"] is False

        code, out, err = await bk("pulsar-audit", "--zk", zk.hosts, "--no-replicas", *sets)
        assert code == 1, err
        assert "missing covers ledgers without metadata only" in out
        assert "ledger         10" in out
        assert bad in out

    code, out, err = await bk("pulsar-audit", "--zk", zk.hosts, "--pulsar-root", "pulsar")
    assert code == 2
    assert err.strip() == (
        "bk-auditor: error: --pulsar-root must be an absolute path without a trailing /, "
        "got 'pulsar'"
    )
    code, out, err = await bk("pulsar-audit", "--zk", "127.0.0.1:1", "--set", "zkTimeout=1000")
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_verdicts_of_reports() -> None:
    """The replicas report's `no_replica` ranges, its and placement's violations, the marks."""
    replicas = CheckReport(Check.REPLICAS, 0.0)
    replicas.violations.append(
        Violation(1, Category.NO_REPLICA, None, {"worst_entries": [[3, 4], [9, 9]]})
    )
    replicas.violations.append(Violation(2, Category.BELOW_ACK_QUORUM, None, {}))
    replicas.violations.append(Violation(5, Category.METADATA_INVALID, None, {}))
    placement = CheckReport(Check.PLACEMENT, 0.0)
    placement.violations.append(Violation(2, Category.PLACEMENT_SOFTLY_ADHERING, None, {}))
    placement.violations.append(Violation(5, Category.METADATA_INVALID, None, {}))
    assert verdicts_of([replicas, placement], {7}) == {
        1: LedgerVerdicts(((3, 4), (9, 9)), False, True, False),
        2: LedgerVerdicts((), False, True, True),
        7: LedgerVerdicts((), True, False, False),
    }


async def test_pulsar_tree_elsewhere_and_text_output(zk: ZkClient) -> None:
    """Pulsar's tree under another root, named through `--pulsar-zk` and `--pulsar-root`."""
    sets = [a for kv in FAST for a in ("--set", kv)]
    async with test_cluster(zk, 3) as tc:
        w = PulsarWriter(tc.writer, tc.ids, root="/pulsar")
        await w.topic(TOPIC_A, ledgers=[10, 11])
        await w.topic(TOPIC_OLD, ledgers=[50], open_last=False, write_ledgers=False)
        await tc.writer.write_ledger(
            50,
            tc.ids,
            write_quorum=2,
            num_entries=3,
            ctime=TWO_DAYS_AGO_MS,
            custom_metadata=managed_ledger_metadata(ML_OLD),
        )
        await w.delete_topic(TOPIC_OLD)
        # Looked for at ZooKeeper's root, Pulsar's tree is not there: that is said, and no
        # ledger is an orphan for want of references nobody read (10 and 11 are live).
        code, out, err = await bk("pulsar-audit", "--zk", zk.hosts, "--json", *sets)
        assert code == 1, err
        wrong = json.loads(out)
        assert wrong["violations"] == []
        (bad,) = wrong["invalid_znodes"]["listed"]
        assert bad["path"] == "/managed-ledgers"
        assert "no Pulsar metadata under /" in bad["reason"]
        assert wrong["pulsar"]["orphans_held"] == {"count": 1, "ledgers": [50]}  # past the grace
        args = ["--zk", zk.hosts, "--pulsar-zk", zk.hosts, "--pulsar-root", "/pulsar", *sets]
        code, out, err = await bk("pulsar-audit", "--json", *args)
        assert code == 1, err
        doc = json.loads(out)
        assert {(v["ledger_id"], v["category"]) for v in doc["violations"]} == {(50, "orphan")}
        assert doc["pulsar"]["namespaces"][0]["ledgers"] == 2
        code, out, err = await bk("pulsar-audit", *args)
        assert code == 1, err
        assert delete_command(50) in out
        assert "shop/orders" in out
        assert "namespaces at risk from one loss:" in out


async def test_pulsars_tree_on_another_zookeeper_is_read_there(zk: ZkClient) -> None:
    """`checks.pulsar_metadata_zk`: Pulsar's own metadata kept on another ZooKeeper (here a
    chroot of its own) is read there, with the cluster's session for the ledgers."""
    async with test_cluster(zk, 3) as tc:
        w = PulsarWriter.of(tc, "/pulsar-meta")
        await w.topic(TOPIC_A, ledgers=[10, 11, 12])
        await tc.store.delete(ledger_path(tc.cluster.manager, tc.root, 11))
        here, _ = await audit_cluster(target(zk, tc), load_config(None, FAST), replicas=False)
        apart = load_config(None, [*FAST, f"checks.pulsar_metadata_zk={zk.hosts}/pulsar-meta"])
        there, _ = await audit_cluster(target(zk, tc), apart, replicas=False)
    # The cluster's own ZooKeeper holds no managed ledgers at its root: nothing is Pulsar's.
    assert {(v.ledger_id, str(v.category)) for v in here.violations} == set()
    assert {(v.ledger_id, str(v.category)) for v in there.violations} == {(11, "missing")}
