"""`scan --checks ...,pulsar` on both engines against `pulsar-audit`, and nothing written.

The cluster is `test_pulsar_audit`'s (`build`), with ledger 20 marked under-replicated:
a ledger whose entry has no copy, one without metadata, a dangling cursor, an offloaded
ledger gone from BookKeeper, an undecodable ledger, two orphans of a deleted topic, a
young unreferenced ledger and a ledger that is not Pulsar's. The scan (in process,
then on Spark `local[2]`) runs the replicas and placement checks and the Pulsar pass
per id range; its Pulsar findings
(the violations dataset and `summary.json`) must be exactly `pulsar-audit --json`'s,
its rollups per namespace and topic the same, and ZooKeeper's whole tree unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.cli import bk
from auditor.testing.harness import test_cluster
from auditor.testing.zkdump import dump_tree
from auditor.zk import ZkClient
from tests.integration.test_pulsar_audit import FAST, build

pytestmark = pytest.mark.slow

Finding = tuple[int, str, str | None]


def _findings(violations: list[dict[str, Any]]) -> set[Finding]:
    """(ledger, category, topic) of every Pulsar violation."""
    return {(v["ledger_id"], v["category"], v["detail"].get("topic")) for v in violations}


def _rows(doc: dict[str, Any]) -> dict[str, Any]:
    """The rollups both runs must agree on."""
    return {k: doc[k] for k in ("totals", "namespaces", "topics", "unreferenced_young", "at_risk")}


async def test_scan_on_both_engines_finds_what_pulsar_audit_finds(
    zk: ZkClient, tmp_path: Path
) -> None:
    sets = [a for kv in FAST for a in ("--set", kv)]
    async with test_cluster(zk, 3) as tc:
        await build(tc)
        # A marked ledger counts as under-replicated in the rollups, whatever found it.
        await UnderreplicationManager(zk, tc.root).mark_underreplicated(20, [tc.ids[0]])
        before = await dump_tree(zk)
        code, out, err = await bk("pulsar-audit", "--zk", zk.hosts, "--json", *sets)
        assert code == 1, err
        audited = json.loads(out)
        assert audited["pulsar"]["totals"]["under_replicated"] == 2  # 10 (no copy) and 20
        want = _findings(audited["violations"])
        assert {(lid, cat) for lid, cat, _ in want} == {
            (10, "missing"),
            (11, "missing"),
            (25, "dangling_cursor"),
            (32, "metadata_invalid"),
            (50, "orphan"),
            (51, "orphan"),
        }

        for engine, extra in (
            ("asyncio", ["--partitions", "3"]),
            ("spark", ["--master", "local[2]", "--partitions", "3"]),
        ):
            out_dir = tmp_path / engine
            code, _, err = await bk(
                "scan",
                "--zk",
                zk.hosts,
                "--engine",
                engine,
                *extra,
                "--checks",
                "replicas,placement,pulsar",
                "--out",
                str(out_dir),
                *sets,
                within=300,
            )
            assert code == 1, (engine, err[-2000:])
            summary = json.loads((out_dir / "summary.json").read_text())
            assert list(summary["reports"]) == ["placement", "replicas", "pulsar"], engine
            report = summary["reports"]["pulsar"]
            assert _findings(report["violations"]) == want, engine
            assert report["counts"] == audited["counts"], engine
            assert report["ledgers_checked"] == audited["ledgers_checked"], engine
            assert _rows(summary["pulsar"]) == _rows(audited["pulsar"]), engine
            rows = ds.dataset(str(out_dir / "violations"), format="parquet").to_table()
            pulsar_rows = [r for r in rows.to_pylist() if r["check"] == "pulsar"]
            got = {
                (r["ledger_id"], r["category"], json.loads(r["evidence"]).get("topic"))
                for r in pulsar_rows
            }
            assert got == want, engine
            assert len(pulsar_rows) == len(want), engine
        # The Pulsar audit alone: what pulsar-audit finds without asking the bookies.
        code, out, err = await bk(
            "pulsar-audit", "--zk", zk.hosts, "--json", "--no-replicas", *sets
        )
        assert code == 1, err
        alone = json.loads(out)
        out_dir = tmp_path / "alone"
        code, _, err = await bk(
            "scan", "--zk", zk.hosts, "--checks", "pulsar", "--out", str(out_dir), *sets
        )
        assert code == 1, err[-2000:]
        summary = json.loads((out_dir / "summary.json").read_text())
        assert list(summary["reports"]) == ["pulsar"]
        assert _findings(summary["reports"]["pulsar"]["violations"]) == _findings(
            alone["violations"]
        )
        assert (10, "missing") not in {(i, c) for i, c, _ in _findings(alone["violations"])}
        # Neither the audit nor the scans wrote anything to ZooKeeper.
        assert await dump_tree(zk) == before
