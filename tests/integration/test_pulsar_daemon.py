"""The daemon's Pulsar audit (`[pulsar] interval`): its report, rollups, page rows and metrics.

A small copy of the demo's cluster with its Pulsar topics (`build_pulsar_topics`:
a lost ledger, an orphan) under a real in-process daemon serving the HTTP views.
The audit is off by default; on, it runs after the first round and its report
and rollups are served at `/reports/pulsar`, its per-namespace rows on the page
and in the `pulsar_*` metrics (the `[pulsar] top` namespaces, then "other").
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from auditor.checks.findings import Check
from auditor.daemon.config import load_daemon_config
from auditor.daemon.metrics import Metrics
from auditor.testing.seeded import PULSAR_EXPECTED, build_pulsar_topics
from auditor.zk import ZkClient
from tests.integration.test_http_views import _until, request, seed, serving, stop_all


def test_the_audit_is_off_by_default() -> None:
    cfg = load_daemon_config(None, ["daemon.zk=127.0.0.1:2181"], env={})
    assert cfg.pulsar.interval == 0
    assert cfg.pulsar.top == 20


async def test_reports_page_and_metrics(zk: ZkClient) -> None:
    bookies = await seed(zk)
    await build_pulsar_topics(zk, bookies)
    try:
        async with serving(zk, "pulsar-auditor:1", ["pulsar.interval=3600", "pulsar.top=1"]) as (
            daemon,
            views,
        ):
            state = daemon.state
            await _until(
                "the pulsar audit",
                lambda: (
                    Check.PULSAR in state.checks
                    and state.checks[Check.PULSAR].last_report is not None
                ),
            )
            got = await request(views.port, "/reports/pulsar")
            assert got.status == 200
            doc = got.json()
            assert doc["check"] == "pulsar"
            found = {
                c: {v["ledger_id"] for v in doc["violations"] if v["category"] == c}
                for c in PULSAR_EXPECTED
            }
            assert found == PULSAR_EXPECTED
            rows = {r["namespace"]: r for r in doc["pulsar"]["namespaces"]}
            assert set(rows) == {"acme/iot", "public/default"}
            assert rows["acme/iot"]["missing"] == 1 and rows["acme/iot"]["orphans"] == 1
            assert rows["public/default"]["missing"] == 0
            assert doc["pulsar"]["topics_total"] >= 3
            # The risk joined as pulsar-audit joins it: one bookie's loss hurts both namespaces.
            at_risk = {r["name"]: r for r in doc["pulsar"]["at_risk"] if r["domain"] == "bookie"}
            assert at_risk and all(
                set(r["by_namespace"]) == {"acme/iot", "public/default"} for r in at_risk.values()
            ), doc["pulsar"]["at_risk"]

            # The page: a Pulsar section with the metrics' rows (top 1, then "other").
            page = (await request(views.port, "/")).text
            assert "<h2>Pulsar</h2>" in page
            section = page.split("<h2>Pulsar</h2>", 1)[1].split("<h2>", 1)[0]
            assert "<td>acme/iot</td>" in section and "<td>other</td>" in section
            assert "public/default" not in section  # summed under "other"

            status = await request(views.port, "/status")
            assert status.status == 200
            assert status.json()["checks"]["pulsar"]["interval_s"] == 3600

            metrics = Metrics(state)
            series: dict[tuple[str, str], float] = {}
            for family in text_string_to_metric_families(metrics.exposition().decode()):
                for s in family.samples:
                    if s.name == "bookkeeper_auditor_pulsar_ledgers":
                        series[s.labels["pulsar_namespace"], s.labels["state"]] = s.value
            assert {ns for ns, _ in series} == {"acme/iot", "other"}
            assert series["acme/iot", "missing"] == 1
            assert series["acme/iot", "orphan"] == 1
            assert series["other", "referenced"] == rows["public/default"]["ledgers"]
            assert series["other", "missing"] == 0
    finally:
        await stop_all(bookies)


async def test_no_pulsar_report_while_off(zk: ZkClient) -> None:
    bookies = await seed(zk)
    try:
        async with serving(zk, "pulsar-auditor:2", first_round=False) as (daemon, views):
            assert Check.PULSAR not in daemon.state.checks
            got = await request(views.port, "/reports/pulsar")
            assert got.status == 404
            assert "<h2>Pulsar</h2>" not in (await request(views.port, "/")).text
    finally:
        await stop_all(bookies)
