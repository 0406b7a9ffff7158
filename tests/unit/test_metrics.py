"""Metrics: exact series names and labels, what a report does to them, /metrics over HTTP.

Also checks that the alert rules, their promtool tests, the Grafana dashboard
and the runbook only name series that exist and anchors that exist.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.bookie.protocol import Status
from auditor.bookie.results import CannotList, ErrorStatus, NoAnswer, Ok, Unanswered
from auditor.checks.findings import (
    ALL_CHECKS,
    CATEGORIES,
    Category,
    Check,
    CheckReport,
    InvalidZnode,
    InvalidZnodeLog,
    Violation,
)
from auditor.checks.tally import ViolationLog
from auditor.daemon.metrics import BOOKIE_OPS, OUTCOMES, Metrics, bookie_status
from auditor.daemon.state import RunCompleted
from auditor.selftest.harness import SelfTestResult
from auditor.worker.risk import QueueRisk

ROOT = Path(__file__).resolve().parents[2]
#: Where the rules' runbook links point (a placeholder: see alerts.yaml's header).
RUNBOOK_BASE = "https://github.com/example/bookkeeper-auditor/blob/main/docs/runbook.md"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(m: Metrics) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(m.exposition().decode()):
        for s in family.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def value(m: Metrics, name: str, **labels: str) -> float:
    return samples(m)[name, frozenset(labels.items())]


def names_of(m: Metrics) -> set[str]:
    return {name for name, _ in samples(m)}


# --- the series -------------------------------------------------------------------

LISTED = {
    "bookkeeper_auditor_violations_total": {"check", "category"},
    "bookkeeper_auditor_ledgers_in_violation": {"check", "category"},
    "bookkeeper_auditor_check_duration_seconds_bucket": {"check", "le"},
    "bookkeeper_auditor_check_duration_seconds_count": {"check"},
    "bookkeeper_auditor_check_duration_seconds_sum": {"check"},
    "bookkeeper_auditor_check_runs_total": {"check", "outcome"},
    "bookkeeper_auditor_is_leader": set(),
    "bookkeeper_auditor_election_attempts_total": set(),
    "bookkeeper_auditor_ledgers_marked_underreplicated_total": {"reason"},
    "bookkeeper_auditor_bookie_requests_total": {"op", "status"},
    "bookkeeper_auditor_retry_queue_ledgers": set(),
    "bookkeeper_auditor_lost_bookies": set(),
    "bookkeeper_auditor_underreplicated_ledgers": set(),
    "bookkeeper_auditor_leadership_decisions_total": {"reason"},
    "bookkeeper_auditor_election_backoff_seconds": set(),
    "bookkeeper_auditor_duplicate_identity": set(),
    "bookkeeper_auditor_znode_invalid": {"znode"},
    "bookkeeper_auditor_invalid_znodes": {"check"},
    "bookkeeper_auditor_underreplication_marks_invalid": set(),
    "bookkeeper_auditor_check_consecutive_failures": {"check"},
    "bookkeeper_auditor_zookeeper_connected": set(),
    "bookkeeper_auditor_zookeeper_reconnects_total": set(),
    "bookkeeper_auditor_zookeeper_suspensions_total": set(),
    "bookkeeper_auditor_zookeeper_sessions_lost_total": set(),
}


def test_every_listed_series_exists_at_construction_with_its_labels() -> None:
    s = samples(Metrics())
    for name, labels in LISTED.items():
        found = [dict(lbl) for n, lbl in s if n == name]
        assert found, name
        assert all(set(lbl) == labels for lbl in found), (name, found)
    text = Metrics().exposition().decode()
    # The last-success gauge has no sample until a check succeeds (absent = unknown).
    assert "# TYPE bookkeeper_auditor_check_last_success_timestamp_seconds gauge" in text


def test_counters_are_pre_initialised_for_every_label_value() -> None:
    m = Metrics()
    s = samples(m)
    for check in ALL_CHECKS:
        for category in CATEGORIES[check]:
            labels = frozenset({"check": str(check), "category": str(category)}.items())
            assert s["bookkeeper_auditor_violations_total", labels] == 0
            assert s["bookkeeper_auditor_ledgers_in_violation", labels] == 0
    # The daemon never runs the metadata-only check (the others report bad metadata).
    assert not any(dict(labels).get("check") == "metadata" for _, labels in s)

    def at(name: str, **labels: str) -> float:
        return s[name, frozenset(labels.items())]

    for check in ALL_CHECKS:
        for outcome in OUTCOMES:
            assert at("bookkeeper_auditor_check_runs_total", check=check, outcome=outcome) == 0
        assert at("bookkeeper_auditor_ledgers_marked_underreplicated_total", reason=check) == 0
        assert at("bookkeeper_auditor_check_duration_seconds_count", check=check) == 0
    for op in BOOKIE_OPS:
        assert at("bookkeeper_auditor_bookie_requests_total", op=op, status="ok") == 0
    assert at("bookkeeper_auditor_is_leader") == 0
    assert at("bookkeeper_auditor_replication_enabled") == 1


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.state.tallies.election_attempt()
    assert value(a, "bookkeeper_auditor_election_attempts_total") == 1
    assert value(b, "bookkeeper_auditor_election_attempts_total") == 0


# --- what the daemon reports ------------------------------------------------------


def replicas_report() -> CheckReport:
    def v(ledger: int, category: Category, bookie: str | None = "b1:3181") -> Violation:
        return Violation(ledger, category, bookie, {})

    return CheckReport(
        check=Check.REPLICAS,
        started_at=1_700_000_000.0,
        finished_at=1_700_000_042.5,
        violations=ViolationLog(
            [
                v(1, Category.NO_REPLICA),
                v(1, Category.NO_REPLICA, "b2:3181"),  # same ledger, other bookie: counts once
                v(2, Category.BELOW_ACK_QUORUM),
                v(3, Category.BELOW_WRITE_QUORUM),
                v(4, Category.BELOW_WRITE_QUORUM),
            ]
        ),
        marked_underreplicated=[1, 2, 2, 3],
    )


def test_record_report_counts_ledgers_and_sets_the_last_run() -> None:
    m = Metrics()
    m.state.tallies.record_report(replicas_report(), 42.5)
    m.state.tallies.record_report(replicas_report(), 30.0)
    total = "bookkeeper_auditor_violations_total"
    gauge = "bookkeeper_auditor_ledgers_in_violation"
    assert value(m, total, check="replicas", category="no_replica") == 2
    assert value(m, total, check="replicas", category="below_ack_quorum") == 2
    assert value(m, total, check="replicas", category="below_write_quorum") == 4
    assert value(m, total, check="replicas", category="metadata_invalid") == 0
    assert value(m, gauge, check="replicas", category="no_replica") == 1
    assert value(m, gauge, check="replicas", category="below_write_quorum") == 2
    runs = "bookkeeper_auditor_check_runs_total"
    assert value(m, runs, check="replicas", outcome="violations") == 2
    assert value(m, runs, check="replicas", outcome="ok") == 0
    assert value(m, "bookkeeper_auditor_check_duration_seconds_count", check="replicas") == 2
    assert value(m, "bookkeeper_auditor_check_duration_seconds_sum", check="replicas") == 72.5
    assert (
        value(m, "bookkeeper_auditor_check_duration_seconds_bucket", check="replicas", le="60.0")
        == 2
    )
    assert (
        value(m, "bookkeeper_auditor_check_duration_seconds_bucket", check="replicas", le="30.0")
        == 1
    )
    assert (
        value(m, "bookkeeper_auditor_check_last_success_timestamp_seconds", check="replicas")
        == 1_700_000_042.5
    )
    marked = "bookkeeper_auditor_ledgers_marked_underreplicated_total"
    assert value(m, marked, reason="replicas") == 6  # 3 distinct ledgers per run
    assert value(m, marked, reason="bookies") == 0

    # A clean run: the gauges drop to zero, the counters keep their history.
    m.state.tallies.record_report(
        CheckReport(check=Check.REPLICAS, started_at=1.0, finished_at=2.0), 1.0
    )
    assert value(m, gauge, check="replicas", category="no_replica") == 0
    assert value(m, total, check="replicas", category="no_replica") == 2
    assert value(m, runs, check="replicas", outcome="ok") == 1


def test_bookie_check_report_sets_lost_bookies() -> None:
    m = Metrics()
    report = CheckReport(
        check=Check.BOOKIES,
        started_at=1.0,
        finished_at=2.0,
        violations=ViolationLog([Violation(7, Category.LEDGERS_ON_LOST_BOOKIES, "b9:3181", {})]),
        marked_underreplicated=[7],
        lost_bookies=["b9:3181", "b8:3181"],
    )
    # The bookie check's report names the lost bookies the gauge counts.
    m.state.check_ended(Check.BOOKIES, RunCompleted(report, 0.5), 2.0)
    assert m.state.lost_bookies == ("b9:3181", "b8:3181")
    assert value(m, "bookkeeper_auditor_lost_bookies") == 2
    assert (
        value(m, "bookkeeper_auditor_ledgers_marked_underreplicated_total", reason="bookies") == 1
    )
    assert (
        value(
            m,
            "bookkeeper_auditor_violations_total",
            check="bookies",
            category="ledgers_on_lost_bookies",
        )
        == 1
    )


def test_failures_skips_and_gauges() -> None:
    m = Metrics()
    m.state.tallies.record_failure(Check.LEDGERS, 3.0)
    m.state.tallies.record_skip(Check.LEDGERS)
    m.state.tallies.record_skip(Check.LEDGERS)
    runs = "bookkeeper_auditor_check_runs_total"
    assert value(m, runs, check="ledgers", outcome="failed") == 1
    assert value(m, runs, check="ledgers", outcome="skipped") == 2
    assert value(m, "bookkeeper_auditor_check_duration_seconds_count", check="ledgers") == 1
    assert ("bookkeeper_auditor_check_last_success_timestamp_seconds") not in names_of(m)
    m.state.check_recorded(Check.LEDGERS, 1234.0)
    m.state.check_interval(Check.LEDGERS, 604800)
    assert (
        value(m, "bookkeeper_auditor_check_last_success_timestamp_seconds", check="ledgers") == 1234
    )
    assert value(m, "bookkeeper_auditor_check_interval_seconds", check="ledgers") == 604800
    m.state.tallies.election_attempt()
    m.state.tallies.election_attempt()
    m.state.tallies.bookie_request("read_entry", "ok")
    m.state.tallies.bookie_request("read_entry", "timeout")
    m.state.retry_queue = 5
    m.state.lost_bookies = ("b1:3181",)
    m.state.tallies.underreplicated = 17
    m.state.leader = "b1:3181"
    m.state.replication_enabled = False
    assert value(m, "bookkeeper_auditor_election_attempts_total") == 2
    assert value(m, "bookkeeper_auditor_bookie_requests_total", op="read_entry", status="ok") == 1
    assert (
        value(m, "bookkeeper_auditor_bookie_requests_total", op="read_entry", status="timeout") == 1
    )
    assert value(m, "bookkeeper_auditor_retry_queue_ledgers") == 5
    assert value(m, "bookkeeper_auditor_lost_bookies") == 1
    assert value(m, "bookkeeper_auditor_underreplicated_ledgers") == 17
    assert value(m, "bookkeeper_auditor_leader_elected") == 1
    assert value(m, "bookkeeper_auditor_replication_enabled") == 0


def test_stepping_down_zeroes_the_last_run_gauges() -> None:
    m = Metrics()
    m.state.lead(m.state.tallies.clock())
    m.state.tallies.record_report(replicas_report(), 1.0)
    gauge = "bookkeeper_auditor_ledgers_in_violation"
    assert value(m, gauge, check="replicas", category="no_replica") == 1
    m.state.lead(m.state.tallies.clock())  # still leading: nothing changes
    assert value(m, gauge, check="replicas", category="no_replica") == 1
    m.state.stepped_down()
    assert value(m, "bookkeeper_auditor_is_leader") == 0
    assert value(m, gauge, check="replicas", category="no_replica") == 0
    # The counters are history and stay.
    assert (
        value(m, "bookkeeper_auditor_violations_total", check="replicas", category="no_replica")
        == 1
    )


def test_invalid_znodes_are_gauges_of_each_last_report_and_make_a_run_violations() -> None:
    m = Metrics()
    m.state.lead(m.state.tallies.clock())
    gauge, marks = (
        "bookkeeper_auditor_invalid_znodes",
        "bookkeeper_auditor_underreplication_marks_invalid",
    )
    for check in ALL_CHECKS:
        assert value(m, gauge, check=str(check)) == 0
    assert value(m, marks) == 0
    corrupt = [InvalidZnode(f"/ledgers/underreplication/ledgers/x/urL{i}", "bad") for i in (1, 2)]
    grace = CheckReport(Check.GRACE, 1.0, 2.0, invalid_znodes=InvalidZnodeLog(corrupt))
    grace.invalid_znodes.count_unlisted(1)  # a third, counted but not listed
    m.state.check_ended(Check.GRACE, RunCompleted(grace, 1.0), 2.0)
    beyond = InvalidZnode("/ledgers/922/3372/0368/5477/L5808", "beyond")
    bookies = CheckReport(Check.BOOKIES, 1.0, 2.0, invalid_znodes=InvalidZnodeLog([beyond]))
    m.state.check_ended(Check.BOOKIES, RunCompleted(bookies, 1.0), 2.0)
    assert value(m, gauge, check="grace") == 3
    assert value(m, gauge, check="bookies") == 1
    assert value(m, gauge, check="replicas") == 0
    assert value(m, marks) == 3  # the grace check's: corrupt marks only
    # A run with invalid znodes and no violation is a run with findings, as `check` exits 1.
    runs = "bookkeeper_auditor_check_runs_total"
    assert value(m, runs, check="grace", outcome="violations") == 1
    assert value(m, runs, check="grace", outcome="ok") == 0
    assert m.state.checks[Check.GRACE].outcome == "violations"
    # The next clean run clears the gauge; the bookie check's count is not the marks'.
    m.state.check_ended(Check.GRACE, RunCompleted(CheckReport(Check.GRACE, 3.0, 4.0), 1.0), 4.0)
    assert (value(m, gauge, check="grace"), value(m, marks)) == (0, 0)
    assert value(m, gauge, check="bookies") == 1
    assert m.state.checks[Check.GRACE].outcome == "ok"
    # A follower shows none of the last leadership's.
    m.state.check_ended(Check.GRACE, RunCompleted(grace, 1.0), 5.0)
    m.state.stepped_down()
    assert (value(m, gauge, check="bookies"), value(m, gauge, check="grace")) == (0, 0)
    assert value(m, marks) == 0


def test_the_worker_queue_by_copies_left_and_the_age_of_its_oldest_marks() -> None:
    m = Metrics()
    m.state.tallies.clock = lambda: 1000.0
    names = names_of(m)
    # Before the worker ranked the queue the series are absent, not a queue of zero.
    assert "bookkeeper_auditor_worker_marked_ledgers" not in names
    assert "bookkeeper_auditor_worker_oldest_marked_ledger_age_seconds" not in names
    by = {"0": 0, "1": 3, "2": 7, "3+": 1, "unknown": 0}
    m.state.worker.queue = QueueRisk(990.0, by, {"1": 100.0, "2": 400.0, "3+": 1200.0}, ())
    for bucket, n in by.items():
        assert value(m, "bookkeeper_auditor_worker_marked_ledgers", copies_left=bucket) == n
    age = "bookkeeper_auditor_worker_oldest_marked_ledger_age_seconds"
    assert {b: value(m, age, copies_left=b) for b in by} == {
        "0": 0.0,  # empty
        "1": 900.0,
        "2": 600.0,
        "3+": 0.0,  # marked "in the future" by a clock ahead of ours: never negative
        "unknown": 0.0,
    }


def test_bookie_status_labels() -> None:
    assert bookie_status(Ok(1)) == "ok"
    assert bookie_status(ErrorStatus(Status.ENOLEDGER)) == "enoledger"
    assert bookie_status(NoAnswer(Unanswered.TIMEOUT)) == "timeout"
    assert bookie_status(NoAnswer(Unanswered.NOT_RESOLVED)) == "not_resolved"
    assert bookie_status(CannotList("b:1", 0.0)) == "cannot_list"
    assert bookie_status(object()) == "unknown"


# --- /metrics over HTTP -----------------------------------------------------------


async def http(port: int, request: bytes) -> tuple[str, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await read_response(reader, head=request.startswith(b"HEAD "))
    finally:
        writer.close()


async def read_response(
    reader: asyncio.StreamReader, head: bool = False
) -> tuple[str, dict[str, str], bytes]:
    status = (await reader.readline()).decode().strip()
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    body = b"" if head else await reader.readexactly(int(headers["content-length"]))
    if head:
        assert await reader.read() == b""  # no body follows a HEAD answer
    return status, headers, body


async def test_http_serves_metrics_on_an_ephemeral_port() -> None:
    m = Metrics()
    m.state.tallies.underreplicated = 3
    await m.start_http("127.0.0.1", 0)
    try:
        assert m.http_port
        status, headers, body = await http(
            m.http_port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert status == "HTTP/1.1 200 OK"
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        assert b"bookkeeper_auditor_underreplicated_ledgers 3.0" in body

        # What Prometheus sends: OpenMetrics, gzip, keep-alive; two requests on one connection.
        reader, writer = await asyncio.open_connection("127.0.0.1", m.http_port)
        scrape = (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
            b"Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n"
            b"Accept-Encoding: gzip\r\n\r\n"
        )
        for _ in range(2):
            writer.write(scrape)
            await writer.drain()
            status, headers, body = await read_response(reader)
            assert status == "HTTP/1.1 200 OK"
            assert headers["content-type"].startswith("application/openmetrics-text")
            assert headers["content-encoding"] == "gzip"
            assert gzip.decompress(body).rstrip().endswith(b"# EOF")
        writer.close()

        status, headers, body = await http(m.http_port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
        assert status == "HTTP/1.1 200 OK" and int(headers["content-length"]) > 0
        status, _, _ = await http(m.http_port, b"GET /nope HTTP/1.0\r\n\r\n")
        assert status == "HTTP/1.1 404 Not Found"
        status, _, _ = await http(m.http_port, b"POST /metrics HTTP/1.0\r\n\r\n")
        assert status == "HTTP/1.1 405 Method Not Allowed"
        status, _, _ = await http(m.http_port, b"garbage\r\n\r\n")
        assert status == "HTTP/1.1 400 Bad Request"

        # An idle keep-alive connection does not hold stop_http up.
        _, idle = await asyncio.open_connection("127.0.0.1", m.http_port)
        await asyncio.sleep(0)
    finally:
        m.stop_http()
    m.stop_http()  # twice is fine
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", m.http_port)
    idle.close()
    with pytest.raises(RuntimeError):
        await m.start_http("127.0.0.1", 0)
        await m.start_http("127.0.0.1", 0)
    m.stop_http()


# --- alerts, dashboard and runbook agree with the series --------------------------

_SERIES = re.compile(r"\bbookkeeper_auditor_[a-z_]+")


def exported_families() -> set[str]:
    m = Metrics()
    m.state.check_recorded(Check.REPLICAS, 1.0)
    m.state.check_interval(Check.REPLICAS, 1.0)
    m.state.cluster_check_completed(Check.REPLICAS, 1.0)
    m.state.selftest_done([SelfTestResult("replicas", 1)], 1.0)
    m.state.tallies.at_risk["bookie", "b1:3181", "no_copy"] = 1  # as a risk report sets it
    m.state.tallies.pulsar_ledgers["t/ns", "missing"] = 1  # as a Pulsar audit sets them
    m.state.tallies.pulsar_bytes["t/ns", "missing"] = 1
    m.state.worker.queue = QueueRisk(1.0, {"1": 1}, {"1": 1.0}, ())  # as a worker ranks
    return names_of(m)


def test_alerts_and_dashboard_name_only_exported_series() -> None:
    exported = exported_families()
    for path in (
        ROOT / "deploy/prometheus/alerts.yaml",
        ROOT / "deploy/prometheus/alerts_test.yaml",
        ROOT / "deploy/grafana/bk-auditor.json",
    ):
        used = set(_SERIES.findall(path.read_text()))
        assert used, path
        assert used <= exported, (path, used - exported)


def test_every_alert_has_a_runbook_section_and_promtool_tests() -> None:
    rules = (ROOT / "deploy/prometheus/alerts.yaml").read_text()
    tests = (ROOT / "deploy/prometheus/alerts_test.yaml").read_text()
    runbook = (ROOT / "docs/runbook.md").read_text()
    alerts = re.findall(r"^\s+- alert: (\w+)$", rules, re.M)
    assert len(alerts) == len(set(alerts)) >= 8
    anchors = {h.strip().lower() for h in re.findall(r"^## (.+)$", runbook, re.M)}
    # Absolute links (Alertmanager, Slack and PagerDuty show them as they are), all from
    # one base that points at docs/runbook.md.
    links = re.findall(r"runbook_url: (\S+)#(\w+)$", rules, re.M)
    assert {base for base, _ in links} == {RUNBOOK_BASE}
    urls = [anchor for _, anchor in links]
    assert sorted(urls) == sorted(a.lower() for a in alerts)
    assert set(urls) <= anchors
    for block in re.split(r"^\s+- alert: ", rules, flags=re.M)[1:]:
        for key in ("for:", "severity:", "summary:", "description:", "runbook_url:"):
            assert key in block, (block.split()[0], key)
    # Each alert is tested quiet (exp_alerts: []) and firing (a non-empty exp_alerts).
    tested = Counter(re.findall(r"alertname: (\w+), exp_alerts: \[\]\}", tests))
    firing = Counter(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n", tests))
    for alert in alerts:
        assert tested[alert] >= 1, f"{alert} never tested quiet"
        assert firing[alert] >= 1, f"{alert} never tested firing"


def test_dashboard_is_valid_json_with_unique_panel_ids() -> None:
    dash = json.loads((ROOT / "deploy/grafana/bk-auditor.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert dash["uid"] == "bk-auditor"
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert all(e.count("(") == e.count(")") for e in exprs)
    # Every query is narrowed by the cluster and job variables (the job's by the cluster's).
    variables = [v["name"] for v in dash["templating"]["list"]]
    assert variables == ["datasource", "cluster", "job"]
    assert all('cluster=~"$cluster",job=~"$job"' in e for e in exprs), exprs
    # process_* series exist on every exporter: only the daemons' are shown.
    daemons = (
        ' and on (instance, job) bookkeeper_auditor_build_info{cluster=~"$cluster",job=~"$job"}'
    )
    for e in exprs:
        if "process_" in e:
            assert e.endswith(daemons), e
    titles = {p["title"] for p in dash["panels"]}
    assert {"Resident memory", "ZooKeeper connected", "Consecutive failed runs"} <= titles
