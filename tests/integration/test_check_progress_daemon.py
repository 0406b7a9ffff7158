"""A running check's progress (state, metrics, `status`) and the replicas coverage gauge.

The daemon runs in this process against the real ZooKeeper and emulated bookies. The
daemon's own progress hook is wrapped: at each call (every ledger, with the hook's
interval set to 0), after the daemon recorded it, the wrapper reads the state, a
scrape and `status --json` as built from the gRPC message, mid-run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from auditor.api.convert import progress_text, status_json, status_response
from auditor.checks import progress as progress_module
from auditor.checks.context import CheckContext
from auditor.checks.findings import Check
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.daemon.term import LeaderTerms
from auditor.testing.harness import test_cluster
from auditor.testing.inprocess import fast_config, running, until
from auditor.testing.observe import events_of
from auditor.zk import ZkClient

pytestmark = pytest.mark.slow

PREFIX = "bookkeeper_auditor"


@dataclass(frozen=True)
class Seen:
    """One call of the progress hook, as everything that reports it showed it then."""

    check: Check
    done: int
    total: int | None
    total_kind: str
    metric_done: float | None
    metric_total: float | None
    json: dict[str, Any] | None
    text: str


def _watch(monkeypatch: pytest.MonkeyPatch, metrics: Metrics, seen: list[Seen]) -> None:
    monkeypatch.setattr(progress_module, "HOOK_INTERVAL", 0.0)
    original = LeaderTerms._on_progress

    def wrapped(
        self: LeaderTerms, ctx: CheckContext, check: Check, done: int, estimate: int | None
    ) -> None:
        original(self, ctx, check, done, estimate)
        p = self.state.checks[check].progress
        assert p is not None
        doc = status_json(status_response(self.state))["checks"][str(check)]
        labels = {"check": str(check)}
        seen.append(
            Seen(
                check,
                p.done,
                p.total,
                p.total_kind,
                metrics.registry.get_sample_value(f"{PREFIX}_check_progress_ledgers", labels),
                metrics.registry.get_sample_value(
                    f"{PREFIX}_check_progress_total", {**labels, "total_kind": p.total_kind}
                ),
                doc["progress"],
                progress_text(doc["outcome"], doc["progress"]),
            )
        )

    monkeypatch.setattr(LeaderTerms, "_on_progress", wrapped)


def _coverage(metrics: Metrics) -> dict[str, float | None]:
    return {
        how: metrics.registry.get_sample_value(f"{PREFIX}_replicas_coverage_pairs", {"how": how})
        for how in ("listed", "probed", "unverified")
    }


async def _first_replicas_run(daemon: Daemon) -> None:
    replicas = daemon.state.checks[Check.REPLICAS]
    await until(
        events_of(daemon).check_ended, lambda: replicas.last_finished is not None, "replicas run"
    )


async def test_progress_while_walking_the_index_and_coverage_after(
    zk: ZkClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledgers = 5
    seen: list[Seen] = []
    metrics = Metrics()
    _watch(monkeypatch, metrics, seen)
    async with test_cluster(zk, 3) as tc:
        for lid in range(1, ledgers + 1):
            await tc.writer.write_ledger(lid, tc.ids, write_quorum=2, num_entries=4)
        cfg = fast_config(zk.hosts, "progress-auditor:1", ["auditorPeriodicCheckInterval=0"])
        async with running(cfg, metrics) as daemon:
            assert _coverage(metrics) == {"listed": 0, "probed": 0, "unverified": 0}
            await _first_replicas_run(daemon)
            replicas = [s for s in seen if s.check is Check.REPLICAS]
            # Every ledger of the walk, out of the index's size, as state, metrics and status.
            assert [(s.done, s.total, s.total_kind) for s in replicas] == [
                (n, ledgers, "ledgers") for n in range(1, ledgers + 1)
            ]
            assert [(s.metric_done, s.metric_total) for s in replicas] == [
                (float(n), float(ledgers)) for n in range(1, ledgers + 1)
            ]
            assert [s.json for s in replicas] == [
                {
                    "ledgers_done": n,
                    "ledgers_total": ledgers,
                    "total_kind": "ledgers",
                    "updated": s.json["updated"] if s.json else None,
                }
                for n, s in zip(range(1, ledgers + 1), replicas, strict=True)
            ]
            assert all(s.json and s.json["updated"] for s in replicas)
            assert replicas[1].text == "running, 2 of 5 ledgers"
            # The other walking checks of the first round reported too.
            assert {Check.BOOKIES, Check.PLACEMENT} <= {s.check for s in seen}

            # Ended: no progress anywhere, and the coverage of the run: 5 ledgers with
            # 3 bookies each, every copy listed.
            assert daemon.state.checks[Check.REPLICAS].progress is None
            for name in ("check_progress_ledgers", "check_progress_total"):
                assert (
                    metrics.registry.get_sample_value(f"{PREFIX}_{name}", {"check": "replicas"})
                    is None
                )
            doc = status_json(status_response(daemon.state))["checks"]["replicas"]
            assert doc["progress"] is None
            assert progress_text(doc["outcome"], doc["progress"]) == doc["outcome"]
            assert _coverage(metrics) == {"listed": 15.0, "probed": 0.0, "unverified": 0.0}
            report = daemon.state.checks[Check.REPLICAS].last_report
            assert report is not None and report.coverage is not None
            assert report.coverage.to_json() == {"listed": 15, "probed": 0, "unverified": 0}


async def test_progress_estimated_from_the_largest_id_without_an_index(
    zk: ZkClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Seen] = []
    metrics = Metrics()
    _watch(monkeypatch, metrics, seen)
    async with test_cluster(zk, 3) as tc:
        for lid in (10, 20, 30, 40, 50):
            await tc.writer.write_ledger(lid, tc.ids, write_quorum=2, num_entries=2)
        cfg = fast_config(
            zk.hosts,
            "progress-auditor:2",
            [
                "auditorPeriodicCheckInterval=0",
                "daemon.metadata_index=false",
                "daemon.standby_index=false",
            ],
        )
        async with running(cfg, metrics) as daemon:
            await _first_replicas_run(daemon)
            replicas = [s for s in seen if s.check is Check.REPLICAS]
            # Ids 10..50 used every 10: after the first id, done * 41 / (id - 9).
            assert [(s.done, s.total, s.total_kind) for s in replicas] == [
                (1, None, "max_ledger_id"),
                (2, 7, "max_ledger_id"),
                (3, 6, "max_ledger_id"),
                (4, 5, "max_ledger_id"),
                (5, 5, "max_ledger_id"),
            ]
            assert [(s.metric_done, s.metric_total) for s in replicas] == [
                (1.0, None),
                (2.0, 7.0),
                (3.0, 6.0),
                (4.0, 5.0),
                (5.0, 5.0),
            ]
            assert [s.text for s in replicas] == [
                "running, 1 ledger so far",
                "running, 2 of ~7 ledgers",
                "running, 3 of ~6 ledgers",
                "running, 4 of ~5 ledgers",
                "running, 5 of ~5 ledgers",
            ]
            assert replicas[0].json == {
                "ledgers_done": 1,
                "ledgers_total": None,
                "total_kind": "max_ledger_id",
                "updated": replicas[0].json["updated"] if replicas[0].json else None,
            }
            assert _coverage(metrics) == {"listed": 15.0, "probed": 0.0, "unverified": 0.0}
