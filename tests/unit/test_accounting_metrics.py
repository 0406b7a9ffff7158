"""The false-alarm counter and the staleness gauge, read as a scrape reads them."""

from __future__ import annotations

from collections import Counter

from auditor.checks.findings import ALL_CHECKS, DROP_CAUSES, Check, CheckReport
from auditor.daemon.metrics import Metrics
from auditor.daemon.state import DaemonState
from auditor.daemon.tallies import Tallies
from tests.unit.test_metrics import samples, value

DROPPED = "bookkeeper_auditor_would_be_violations_dropped_total"
AGE = "bookkeeper_auditor_check_last_success_age_seconds"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_dropped_series_exist_at_zero_for_each_check_and_its_causes() -> None:
    found = {
        (dict(labels)["check"], dict(labels)["cause"]): n
        for (name, labels), n in samples(Metrics()).items()
        if name == DROPPED
    }
    assert found == {
        ("replicas", "metadata_changed"): 0,
        ("replicas", "ledger_deleted"): 0,
        ("replicas", "retry_succeeded"): 0,
        ("replicas", "marked_meanwhile"): 0,
        ("ledgers", "metadata_changed"): 0,
        ("ledgers", "ledger_deleted"): 0,
        ("bookies", "bookie_returned"): 0,
        ("bookies", "metadata_changed"): 0,
        ("bookies", "ledger_deleted"): 0,
    }
    assert set(found) == {(str(c), str(d)) for c in ALL_CHECKS for d in DROP_CAUSES[c]}


def test_recorded_reports_add_their_drops() -> None:
    m = Metrics()
    report = CheckReport(
        Check.REPLICAS,
        started_at=10.0,
        finished_at=20.0,
        dropped=Counter({"retry_succeeded": 2, "marked_meanwhile": 1}),
    )
    m.state.tallies.record_report(report, 10.0)
    m.state.tallies.record_report(report, 10.0)
    assert value(m, DROPPED, check="replicas", cause="retry_succeeded") == 4
    assert value(m, DROPPED, check="replicas", cause="marked_meanwhile") == 2
    assert value(m, DROPPED, check="replicas", cause="metadata_changed") == 0
    bookies = CheckReport(
        Check.BOOKIES, started_at=1.0, finished_at=2.0, dropped=Counter({"bookie_returned": 3})
    )
    m.state.tallies.record_report(bookies, 1.0)
    assert value(m, DROPPED, check="bookies", cause="bookie_returned") == 3


def test_staleness_grows_between_scrapes_and_restarts_at_each_success() -> None:
    clock = Clock(1000.0)
    m = Metrics(DaemonState("t:1", tallies=Tallies(clock=clock)))
    # Before any success: since the metrics (the daemon) started.
    clock.now = 1030.0
    assert value(m, AGE, check="replicas") == 30.0
    clock.now = 1090.0
    assert value(m, AGE, check="replicas") == 90.0
    # Elected: a new wait begins, unless a completion is known.
    m.state.lead(m.state.tallies.clock())
    clock.now = 1100.0
    assert value(m, AGE, check="replicas") == 10.0
    m.state.check_recorded(Check.PLACEMENT, 400.0)  # the former leader's run, from ZooKeeper
    assert value(m, AGE, check="placement") == 700.0
    m.state.tallies.record_report(
        CheckReport(Check.REPLICAS, started_at=1095.0, finished_at=1099.5), 4.5
    )
    clock.now = 1160.0
    assert value(m, AGE, check="replicas") == 60.5
    clock.now = 1260.0
    assert value(m, AGE, check="replicas") == 160.5
    assert value(m, AGE, check="placement") == 860.0
    assert value(m, AGE, check="bookies") == 170.0  # elected at 1090, never completed
