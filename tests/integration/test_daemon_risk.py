"""The leader's periodic risk report and its `ledgers_at_risk` series.

The daemon runs in this process (the emulated bookies share its loop) on the
three-rack cluster of `test_risk_whatif`; the racks file changes between two
reports, and the second report's series replace the first's entirely.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from auditor.daemon.metrics import Metrics
from auditor.testing.harness import test_cluster
from auditor.testing.inprocess import fast_config, running
from auditor.testing.observe import events_of
from auditor.zk import ZkClient
from tests.integration.test_risk_whatif import RACKS, three_racks

SERIES = "bookkeeper_auditor_ledgers_at_risk"


def at_risk(metrics: Metrics, domain: str, name: str, severity: str) -> float | None:
    labels = {"domain": domain, "name": name, "severity": severity}
    value: float | None = metrics.registry.get_sample_value(SERIES, labels)
    return value


def series(metrics: Metrics) -> set[tuple[str, str, str, float]]:
    return {
        (s.labels["domain"], s.labels["name"], s.labels["severity"], s.value)
        for family in metrics.registry.collect()
        if family.name == SERIES
        for s in family.samples
    }


async def test_the_leader_publishes_the_top_domains_at_risk(
    zk: ZkClient, tmp_path: Path, info_logs: list[MutableMapping[str, Any]]
) -> None:
    async with test_cluster(zk, 6) as tc:
        await three_racks(tc)
        b = tc.ids
        racks = tmp_path / "racks.json"
        racks.write_text(json.dumps(dict(zip(b, RACKS, strict=True))))
        cfg = fast_config(
            zk.hosts,
            "risk-auditor:1",
            [f"checks.racks_file={racks}", "risk.top=2", "risk.interval=0.5"],
        )
        metrics = Metrics()
        async with running(cfg, metrics) as daemon:
            await asyncio.wait_for(events_of(daemon).risk_reported.wait(), 60)
            report = daemon.risk_report
            assert report is not None and report.ledgers_checked == 5
            # From the leader's metadata index: no ZooKeeper read per ledger.
            started = [e for e in info_logs if e["event"] == "risk report started"]
            assert started and all(e["metadata"] == "index" for e in started)
            assert series(metrics) == {
                ("rack", "/rack-a", "below_ack_quorum", 1.0),
                ("rack", "/rack-a", "no_copy", 2.0),
                ("rack", "/rack-b", "below_ack_quorum", 2.0),
                ("rack", "/rack-b", "no_copy", 1.0),
                ("bookie", b[0], "below_ack_quorum", 3.0),
                ("bookie", b[0], "no_copy", 0.0),
                ("bookie", b[2], "below_ack_quorum", 3.0),
                ("bookie", b[2], "no_copy", 0.0),
            }
            assert (
                metrics.registry.get_sample_value(
                    "bookkeeper_auditor_risk_last_run_timestamp_seconds"
                )
                or 0
            ) >= report.started_at

            # Regions now, and racks that no longer hold whole write quorums: the next
            # report's series replace these (no stale /rack-a).
            spread = ["/east/r1", "/east/r2", "/west/r3", "/east/r1", "/east/r2", "/west/r3"]
            racks.write_text(json.dumps(dict(zip(b, spread, strict=True))))
            while at_risk(metrics, "rack", "/rack-a", "no_copy") is not None:
                events_of(daemon).risk_reported.clear()
                await asyncio.wait_for(events_of(daemon).risk_reported.wait(), 30)
            got = series(metrics)
            assert {(d, n) for d, n, _, _ in got if d == "rack"} <= {
                ("rack", r) for r in set(spread)
            }
            # East holds a whole write set of each of ledgers 1-4 ((b4, b0), (b0, b1),
            # (b3, b4), (b1, b0)) and two of ledger 5's three copies.
            assert ("region", "east", "no_copy", 4.0) in got
            assert ("region", "east", "below_ack_quorum", 1.0) in got
            assert ("region", "west", "no_copy", 0.0) in got
        # A node that no longer leads publishes no risk.
        assert series(metrics) == set()
