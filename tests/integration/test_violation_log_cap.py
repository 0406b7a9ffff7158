"""Bounded violation log lines in a real run (issue #18, "Bounded logs"): a lost bookie with
thousands of ledgers, through the bookie check against a real ZooKeeper and emulated bookies.
The setting comes from the run's configuration (`checks.violation_log_limit`); the report,
its JSON and its counts stay complete."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from auditor.checks.bookie_check_run import run_bookie_check
from auditor.checks.findings import CheckReport
from auditor.testing.cluster import make_metadata
from auditor.testing.harness import TestCluster, test_cluster
from auditor.zk import ZkClient

Logs = list[MutableMapping[str, Any]]
GHOST = "192.0.2.1:1000"
LOST = "ledgers_on_lost_bookies"
INVALID = "metadata_invalid"
SUMMARY = "violation log lines suppressed"
LEDGERS = 2000


def events(logs: Logs, event: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == event]


async def run(tc: TestCluster, overrides: list[str]) -> CheckReport:
    async with tc.context(overrides=overrides) as ctx:
        return await run_bookie_check(ctx)


async def test_a_lost_bookie_with_thousands_of_ledgers_logs_the_limit_and_one_summary(
    zk: ZkClient, info_logs: Logs
) -> None:
    async with test_cluster(zk, 3) as tc:
        b = tc.ids
        ids = range(1, LEDGERS + 1)
        await tc.cluster.write_ledgers(make_metadata(i, [b[i % 3], GHOST]) for i in ids)
        for i in (LEDGERS + 1, LEDGERS + 2):
            await tc.cluster.write_raw(i, b"BookieMetadataFormatVersion\t3\n\xff\xff\xff")

        report = await run(tc, ["checks.violation_log_limit=25"])
        lost = [e for e in events(info_logs, "violation") if e["category"] == LOST]
        invalid = [e for e in events(info_logs, "violation") if e["category"] == INVALID]
        assert len(lost) == 25 and len(invalid) == 2
        assert all(e["bookie"] == GHOST and e["check"] == "bookies" for e in lost)
        assert events(info_logs, SUMMARY) == [
            {
                "event": SUMMARY,
                "log_level": "warning",
                "check": "bookies",
                "logged": {INVALID: 2, LOST: 25},
                "suppressed": {INVALID: 0, LOST: LEDGERS - 25},
                "limit": 25,
            }
        ]
        out = report.to_json()
        assert out["counts"] == {LOST: LEDGERS, INVALID: 2}
        assert out["violations_total"] == LEDGERS + 2
        assert sorted(v["ledger_id"] for v in out["violations"]) == list(range(1, LEDGERS + 3))
        assert report.ledgers_checked == LEDGERS + 2

        # The default bound: 100 per category.
        info_logs.clear()
        again = await run(tc, [])
        assert len(events(info_logs, "violation")) == 100 + 2
        (summary,) = events(info_logs, SUMMARY)
        assert summary["logged"] == {INVALID: 2, LOST: 100}
        assert summary["suppressed"] == {INVALID: 0, LOST: LEDGERS - 100}
        assert again.to_json()["counts"] == out["counts"]


async def test_a_run_under_the_limit_logs_every_violation_and_no_summary(
    zk: ZkClient, info_logs: Logs
) -> None:
    async with test_cluster(zk, 3) as tc:
        b = tc.ids
        await tc.cluster.write_ledgers(make_metadata(i, [b[0], GHOST]) for i in range(1, 11))
        report = await run(tc, ["checks.violation_log_limit=10"])
        assert sorted(e["ledger_id"] for e in events(info_logs, "violation")) == list(range(1, 11))
        assert events(info_logs, SUMMARY) == []
        assert report.counts()[LOST] == 10
