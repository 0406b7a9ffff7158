"""Pulsar's view: violations grouped by the topic owning each ledger (custom metadata)."""

from __future__ import annotations

import json
from pathlib import Path

from auditor.analysis.explain_run import explain_ledger
from auditor.api.convert import report_from_json
from auditor.checks.findings import Check
from auditor.checks.owners import Owner
from auditor.proto import auditor_service_pb2 as pb
from auditor.testing.cli import bk
from auditor.testing.harness import test_cluster
from auditor.zk import ZkClient
from tests.integration.test_api import open_api, sample_state

FAST = ["--set", "checks.retry_delay=0.1", "--set", "readEntryTimeout=1"]
ML_A = "shop/orders/persistent/payments"
ML_B = "shop/orders/persistent/refunds"
TOPIC_A = "persistent://shop/orders/payments"
TOPIC_B = "persistent://shop/orders/refunds"


def pulsar(managed_ledger: str, cursor: str | None = None) -> list[tuple[str, bytes]]:
    out = [
        ("application", b"pulsar"),
        ("component", b"managed-ledger"),
        ("pulsar/managed-ledger", managed_ledger.encode()),
    ]
    if cursor is not None:
        out.append(("pulsar/cursor", cursor.encode()))
    return out


def owner_json(managed_ledger: str, topic: str, cursor: str | None = None) -> dict[str, str]:
    out = {
        "key": topic,
        "application": "pulsar",
        "component": "managed-ledger",
        "managed_ledger": managed_ledger,
        "topic": topic,
    }
    if cursor is not None:
        out["cursor"] = cursor
    return out


async def test_report_groups_violations_by_topic(zk: ZkClient, tmp_path: Path) -> None:
    async with test_cluster(zk, 3) as tc:
        ledgers = {
            10: pulsar(ML_A),
            11: pulsar(ML_A),
            12: pulsar(ML_B),
            13: [],
            14: pulsar(ML_A),
            15: pulsar(ML_A, "sub-1"),
        }
        for lid, custom in ledgers.items():
            await tc.writer.write_ledger(
                lid, tc.ids, write_quorum=2, num_entries=6, custom_metadata=custom
            )
        # Index 1 of an E=3/W=2 ensemble holds 0,1,3,4; index 2 holds 1,2,4,5.
        for lid in (10, 11, 13, 15):
            tc.bookies[1].drop_entries(lid, [3])  # one of two copies: below ack quorum
        tc.bookies[1].drop_entries(12, [1])
        tc.bookies[2].drop_entries(12, [1])  # entry 1 of 12 has no copy left
        code, out, err = await bk("check", "replicas", "--zk", zk.hosts, "--json", *FAST)
        assert code == 1, err
        doc = json.loads(out)
        assert doc["by_owner"] == {
            TOPIC_A: {"below_ack_quorum": 3},
            TOPIC_B: {"no_replica": 1},
        }
        owners = {v["ledger_id"]: v.get("owner") for v in doc["violations"]}
        assert owners == {
            10: owner_json(ML_A, TOPIC_A),
            11: owner_json(ML_A, TOPIC_A),
            12: owner_json(ML_B, TOPIC_B),
            13: None,
            15: owner_json(ML_A, TOPIC_A, "sub-1"),
        }
        assert "owner" not in next(v for v in doc["violations"] if v["ledger_id"] == 13)
        # The daemon's report travels as this document: the CLI rebuilds the same grouping.
        again = report_from_json(doc)
        assert again.to_json()["by_owner"] == doc["by_owner"]

        code, out, _ = await bk("check", "replicas", "--zk", zk.hosts, *FAST)
        assert code == 1
        lines = out.splitlines()
        at = lines.index("  by owner (ledgers per category):")
        assert lines[at + 1 : at + 3] == [
            f"    {TOPIC_A}  below_ack_quorum=3",
            f"    {TOPIC_B}  no_replica=1",
        ]

        # The bulk scan's summary groups the same way (owners read by its driver).
        scan = tmp_path / "scan"
        code, _, err = await bk(
            "scan", "--checks", "replicas", "--zk", zk.hosts, *FAST, "--out", str(scan)
        )
        assert code == 1, err
        summary = json.loads((scan / "summary.json").read_text())
        assert summary["reports"]["replicas"]["by_owner"] == doc["by_owner"]

        async with tc.context() as ctx:
            explained = await explain_ledger(ctx, 15)
        assert explained["owner"] == owner_json(ML_A, TOPIC_A, "sub-1")
        assert explained["metadata"]["custom_metadata"] == {
            "application": "pulsar",
            "component": "managed-ledger",
            "pulsar/cursor": "sub-1",
            "pulsar/managed-ledger": ML_A,
        }


async def test_no_owner_no_grouping(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=6)
        tc.bookies[1].drop_entries(1, [3])
        code, out, err = await bk("check", "replicas", "--zk", zk.hosts, "--json", *FAST)
        assert code == 1, err
        doc = json.loads(out)
        assert "by_owner" not in doc
        assert [set(v) for v in doc["violations"]] == [
            {"ledger_id", "category", "bookie", "detail"}
        ]


async def test_list_violations_carries_and_filters_owners(zk: ZkClient) -> None:
    state = sample_state()
    report = state.checks[Check.REPLICAS].last_report
    assert report is not None
    a, b = Owner(TOPIC_A, topic=TOPIC_A), Owner(TOPIC_B, topic=TOPIC_B)
    report.owners.update({3: a, 7: a, 12: b})
    api = await open_api(zk, state=state)
    try:
        got = [
            (v.check, v.ledger_id, v.category, v.owner)
            async for v in api.stub.ListViolations(pb.ListViolationsRequest(), timeout=10)
        ]
        assert got == [
            ("placement", 3, "placement_not_adhering", ""),
            ("placement", 9, "placement_softly_adhering", ""),
            ("replicas", 3, "below_ack_quorum", TOPIC_A),
            ("replicas", 3, "bookie_unavailable_registered", TOPIC_A),
            ("replicas", 7, "no_replica", TOPIC_A),
            ("replicas", 12, "below_write_quorum", TOPIC_B),
        ]
        only_a = [
            (v.ledger_id, v.category)
            async for v in api.stub.ListViolations(
                pb.ListViolationsRequest(owner=TOPIC_A), timeout=10
            )
        ]
        assert only_a == [
            (3, "below_ack_quorum"),
            (3, "bookie_unavailable_registered"),
            (7, "no_replica"),
        ]
        resp = await api.stub.GetReport(pb.GetReportRequest(check="replicas"), timeout=10)
        assert json.loads(resp.report_json)["by_owner"] == {
            TOPIC_A: {"below_ack_quorum": 1, "bookie_unavailable_registered": 1, "no_replica": 1},
            TOPIC_B: {"below_write_quorum": 1},
        }
    finally:
        await api.channel.close()
        await api.server.stop(0)
