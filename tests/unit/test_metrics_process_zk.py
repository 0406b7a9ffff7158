"""Metrics: process series, the ZooKeeper session, consecutive failures, no `_created`."""

from __future__ import annotations

import sys

import pytest
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from auditor.checks.findings import ALL_CHECKS, Check, CheckReport
from auditor.daemon.metrics import Metrics


def value(m: Metrics, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(m.exposition().decode()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    raise KeyError(name, labels)


def test_no_created_samples_are_exported() -> None:
    m = Metrics()
    m.state.tallies.record_failure(Check.LEDGERS, 1.0)
    m.state.tallies.election_attempt()
    text = m.exposition().decode()
    assert "_created" not in text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_process_series_are_exported() -> None:
    m = Metrics()
    assert value(m, "process_resident_memory_bytes") > 0
    assert value(m, "process_open_fds") > 0
    assert value(m, "process_cpu_seconds_total") >= 0
    assert value(m, "process_max_fds") > 0


def test_zookeeper_session_state_and_transitions() -> None:
    m = Metrics()
    t = m.state.tallies
    assert value(m, "bookkeeper_auditor_zookeeper_connected") == 0
    m.state.zk_connected = True
    t.zk_connected()  # the first connection is no reconnect
    assert value(m, "bookkeeper_auditor_zookeeper_connected") == 1
    assert value(m, "bookkeeper_auditor_zookeeper_reconnects_total") == 0
    m.state.zk_connected = False
    t.zk_suspended()
    assert value(m, "bookkeeper_auditor_zookeeper_connected") == 0
    assert value(m, "bookkeeper_auditor_zookeeper_suspensions_total") == 1
    t.zk_connected()
    t.zk_connected()  # a repeated CONNECTED without a drop between is not another one
    assert value(m, "bookkeeper_auditor_zookeeper_reconnects_total") == 1
    t.zk_suspended()
    t.zk_session_lost()
    t.zk_connected()
    assert value(m, "bookkeeper_auditor_zookeeper_suspensions_total") == 2
    assert value(m, "bookkeeper_auditor_zookeeper_sessions_lost_total") == 1
    assert value(m, "bookkeeper_auditor_zookeeper_reconnects_total") == 2


def test_consecutive_failures_count_until_a_completion_or_a_step_down() -> None:
    m = Metrics()
    name = "bookkeeper_auditor_check_consecutive_failures"
    for check in ALL_CHECKS:
        assert value(m, name, check=str(check)) == 0
    m.state.lead(m.state.tallies.clock())
    for _ in range(3):
        m.state.tallies.record_failure(Check.LEDGERS, 1.0)
    m.state.tallies.record_skip(Check.LEDGERS)  # a skip neither fails nor completes
    assert value(m, name, check="ledgers") == 3
    assert value(m, name, check="replicas") == 0
    m.state.tallies.record_report(
        CheckReport(check=Check.LEDGERS, started_at=1.0, finished_at=2.0), 1.0
    )
    assert value(m, name, check="ledgers") == 0
    m.state.tallies.record_failure(Check.LEDGERS, 1.0)
    assert value(m, name, check="ledgers") == 1
    m.state.stepped_down()
    assert value(m, name, check="ledgers") == 0


def test_a_registry_with_process_series_keeps_its_own() -> None:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    m = Metrics(registry=registry)
    assert b"bookkeeper_auditor_is_leader" in m.exposition()
