"""`bk-auditor check` as an operator runs it: exit codes, one JSON object, config errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.cli import bk, one_json
from auditor.testing.harness import test_cluster
from auditor.testing.zkserver import free_port
from auditor.zk import ZkClient

FAST = ["--set", "checks.retry_delay=0.1", "--set", "readEntryTimeout=1"]


async def test_replicas_json_schema_and_exit_codes(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=12)
        await tc.writer.write_ledger(2, tc.ids, write_quorum=3, ack_quorum=2, num_entries=12)
        code, out, err = await bk("check", "replicas", "--zk", zk.hosts, "--json", *FAST)
        assert code == 0, err
        doc = one_json(out)
        assert set(doc) == {
            "check",
            "started_at",
            "finished_at",
            "ledgers_checked",
            "ledgers_skipped",
            "counts",
            "violations",
            "marked_underreplicated",
            "violations_total",
            "violations_truncated",
            "samples",
            "would_be_violations_dropped",
            "false_alarm_share",
            "invalid_znodes",
            "coverage",
        }
        assert doc["check"] == "replicas"
        assert doc["started_at"].endswith("Z") and doc["finished_at"] >= doc["started_at"]
        assert doc["ledgers_checked"] == 2
        assert doc["counts"] == {
            "no_replica": 0,
            "below_ack_quorum": 0,
            "below_write_quorum": 0,
            "bookie_unavailable_registered": 0,
            "underreplicated_past_grace_period": 0,
            "metadata_invalid": 0,
        }
        assert doc["coverage"] == {"listed": 6, "probed": 0, "unverified": 0}
        assert doc["samples"] == {c: [] for c in doc["counts"]}
        assert (
            doc["violations_total"],
            doc["violations_truncated"],
            doc["would_be_violations_dropped"],
            doc["false_alarm_share"],
        ) == (0, False, {}, 0.0)

        tc.bookies[2].drop_entries(2, [5])
        code, out, err = await bk("check", "replicas", "--zk", zk.hosts, "--json", *FAST)
        assert code == 1, err
        doc = one_json(out)
        assert doc["counts"]["below_write_quorum"] == 1
        assert [(v["ledger_id"], v["category"], v["bookie"]) for v in doc["violations"]] == [
            (2, "below_write_quorum", None)
        ]
        assert doc["violations"][0]["detail"]["worst_entries"] == [[5, 5]]
        assert doc["marked_underreplicated"] == []
        # Without --mark nothing was written.
        assert await zk.get_children("/ledgers/underreplication/ledgers") == []

        code, out, err = await bk("check", "replicas", "--zk", zk.hosts, "--mark", *FAST)
        assert code == 1
        assert "below_write_quorum" in out and "marked under-replicated: [2]" in out
        ur = await UnderreplicationManager(zk, "/ledgers").get(2)
        assert ur is not None and ur.replicas == (tc.ids[2],)


async def test_grace_check_and_all(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=4)
        urm = UnderreplicationManager(zk, "/ledgers")
        await urm.mark_underreplicated(1, ["gone:3181"], now_ms=1_000_000)  # long ago
        await urm.mark_underreplicated(9, ["gone:3181"])  # just now
        code, out, _ = await bk(
            "check", "grace", "--zk", zk.hosts, "--json",
            "--set", "underreplicatedLedgerRecoveryGracePeriod=3600",
        )  # fmt: skip
        assert code == 1
        doc = one_json(out)
        assert doc["ledgers_checked"] == 2
        assert [(v["ledger_id"], v["category"]) for v in doc["violations"]] == [
            (1, "underreplicated_past_grace_period")
        ]
        assert doc["violations"][0]["detail"]["replicas"] == ["gone:3181"]
        # Grace period 0 (BookKeeper's default): the check is off.
        code, out, _ = await bk("check", "grace", "--zk", zk.hosts, "--json")
        assert code == 0
        assert one_json(out)["ledgers_skipped"] == {"grace_period_disabled": 2}


async def test_config_file_and_bad_config(zk: ZkClient, tmp_path: Path) -> None:
    async with test_cluster(zk, 3) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=4)
        cfg = tmp_path / "auditor.toml"
        cfg.write_text(
            "[bookkeeper]\nunderreplicatedLedgerRecoveryGracePeriod = 1\n"
            "[checks]\nretry_delay = 0.1\n"
        )
        code, out, err = await bk("check", "grace", "--zk", zk.hosts, "--config", str(cfg))
        assert code == 0, err
        assert "check grace: 0 ledgers checked" in out
        for bad, needle in [
            ("[bookkeeper]\nauditorLedgerVerificationPercentage = 150\n", "0..100"),
            ("[bookkeeper]\nnoSuchKey = 1\n", "unknown key bookkeeper.noSuchKey"),
            ("[bookkeeper\n", "not valid TOML"),
            ("[checks]\nretry_attempts = 'many'\n", "checks.retry_attempts must be an integer"),
        ]:
            cfg.write_text(bad)
            code, out, err = await bk("check", "grace", "--zk", zk.hosts, "--config", str(cfg))
            assert code == 2
            assert out == ""
            assert needle in err and "Traceback" not in err
            assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("which", ["replicas", "grace"])
async def test_unreachable_zookeeper_is_exit_2(which: str) -> None:
    code, out, err = await bk(
        "check", which, "--zk", f"127.0.0.1:{free_port()}", "--timeout", "1", "--json"
    )
    assert code == 2 and out == ""
    assert "cannot connect to ZooKeeper" in err and "Traceback" not in err


async def test_check_all_json_and_every_single_check(zk: ZkClient) -> None:
    async with test_cluster(zk, 4) as tc:
        b = tc.ids
        await tc.writer.write_ledger(1, b[0:3], write_quorum=2, num_entries=10)
        await tc.writer.write_ledger(2, b[1:4], write_quorum=2, num_entries=10)
        racks = {b[0]: "/r1", b[1]: "/r1", b[2]: "/r2", b[3]: "/r3"}
        group = {bid: {"rack": rack, "hostname": "127.0.0.1"} for bid, rack in racks.items()}
        await zk.create("/bookies", json.dumps({"default": group}).encode())
        await tc.bookies[3].crash()  # ledger 2 loses a bookie
        code, out, err = await bk("check", "all", "--zk", zk.hosts, "--json", *FAST)
        assert code == 1, err
        doc = one_json(out)
        assert doc["check"] == "all"
        reports = doc["reports"]
        assert list(reports) == ["bookies", "ledgers", "placement", "replicas", "grace"]
        assert reports["bookies"]["lost_bookies"] == [b[3]]
        assert reports["bookies"]["counts"]["ledgers_on_lost_bookies"] == 1
        assert reports["ledgers"]["counts"]["unreadable_fragments"] == 1
        assert [v["ledger_id"] for v in reports["ledgers"]["violations"]] == [2]
        # Ledger 1: write set {b0,b1} sits in one rack, not adhering; ledger 2 spans 3 racks.
        assert reports["placement"]["counts"]["placement_not_adhering"] == 1
        assert [v["ledger_id"] for v in reports["placement"]["violations"]] == [1]
        # The crashed bookie is unregistered: the replicas check leaves it to the bookie check.
        assert reports["replicas"]["violations"] == []
        assert reports["grace"]["ledgers_checked"] == 0
        for which in ("bookies", "ledgers", "placement"):
            code, out, _ = await bk("check", which, "--zk", zk.hosts, "--json", *FAST)
            assert code == 1
            assert one_json(out) == {
                **reports[which],
                "started_at": one_json(out)["started_at"],
                "finished_at": one_json(out)["finished_at"],
            }
        # Nothing was written without --mark.
        assert await zk.get_children("/ledgers/underreplication/ledgers") == []


async def test_metadata_check_reports_undecodable_ledgers_only(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=4)
        await tc.cluster.write_raw(2, b"BookieMetadataFormatVersion\t3\n\x07garbage")
        await tc.writer.write_ledger(3, tc.ids, write_quorum=2, num_entries=4)
        code, out, err = await bk("check", "metadata", "--zk", zk.hosts, "--json")
        assert code == 1, err
        doc = one_json(out)
        assert (doc["check"], doc["ledgers_checked"], doc["counts"]) == (
            "metadata",
            3,
            {"metadata_invalid": 1},
        )
        [v] = doc["violations"]
        assert (v["ledger_id"], v["detail"]["path"]) == (2, "/ledgers/00/0000/L0002")
