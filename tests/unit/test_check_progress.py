"""A running check's progress: the hook's pace, the total's estimate, state, metrics, status."""

from __future__ import annotations

import asyncio

from auditor.api.convert import progress_json, progress_text, status_json, status_response
from auditor.checks.findings import Check, CheckReport, Coverage
from auditor.checks.progress import HOOK_INTERVAL, Progress, reporting_progress
from auditor.daemon.metrics import Metrics
from auditor.daemon.state import DaemonState, Outcome, RunCompleted, RunFailed, RunState
from auditor.proto import auditor_service_pb2 as pb


class _Log:
    def __init__(self) -> None:
        self.lines: list[dict[str, object]] = []

    def info(self, event: str, **fields: object) -> None:
        self.lines.append({"event": event, **fields})


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- Progress ---------------------------------------------------------------------------


def test_the_hook_hears_the_first_ledger_then_at_most_every_interval() -> None:
    clock, calls = _Clock(), list[tuple[int, int | None]]()
    p = Progress(
        _Log(), "replicas", max_ledger_id=9, clock=clock, on_progress=lambda *a: calls.append(a)
    )
    p.tick(0)
    assert calls == [(1, None)]  # one id seen: no density yet
    clock.now += HOOK_INTERVAL / 2
    p.tick(1)
    assert calls == [(1, None)]
    clock.now += HOOK_INTERVAL / 2
    p.tick(2)
    # 3 ledgers over ids 0..2, of the range 0..9: 10.
    assert calls == [(1, None), (3, 10)]
    for lid in range(3, 10):
        p.tick(lid)
    assert calls[-1] == (3, 10)  # no time passed
    clock.now += HOOK_INTERVAL
    p.tick(10)  # past the largest id read at the start: the range grows with it
    assert calls[-1] == (11, 11)


def test_the_estimate_follows_how_densely_ids_are_used_and_is_never_below_done() -> None:
    p = Progress(_Log(), "metadata", max_ledger_id=1000, clock=_Clock())
    p.tick(1)
    assert p.total_estimate(1) is None
    p.tick(11)  # 2 ledgers over ids 1..11: 1 in 5.5, over 1..1000
    assert p.total_estimate(11) == round(2 * 1000 / 11)
    assert Progress(_Log(), "x", clock=_Clock()).total_estimate(5) is None  # no largest id
    q = Progress(_Log(), "x", max_ledger_id=3, clock=_Clock())
    for lid in (1, 2, 2, 2, 3):  # a walk that sees an id twice still counts each
        q.tick(lid)
    assert q.total_estimate(3) == 5


def test_a_progress_made_inside_reporting_progress_reports_there_only() -> None:
    calls: list[tuple[int, int | None]] = []
    with reporting_progress(lambda *a: calls.append(a)):
        inside = Progress(_Log(), "bookies", clock=_Clock())
    outside = Progress(_Log(), "bookies", clock=_Clock())
    inside.tick(5)
    outside.tick(5)
    assert calls == [(1, None)]
    assert outside.on_progress is None


async def test_reporting_progress_reaches_the_tasks_of_its_run_and_not_others() -> None:
    calls: list[str] = []

    async def run(name: str) -> None:
        Progress(_Log(), name, clock=_Clock()).tick(1)

    async def hooked() -> None:
        with reporting_progress(lambda *_: calls.append("hooked")):
            await asyncio.create_task(run("a"))

    await asyncio.gather(hooked(), run("b"))
    assert calls == ["hooked"]


def test_the_log_line_is_unchanged_by_the_hook() -> None:
    log, clock = _Log(), _Clock()
    p = Progress(
        log, "replicas", interval=10, max_ledger_id=100, clock=clock, on_progress=lambda *_: None
    )
    p.tick(1)
    clock.now += 10
    p.tick(51)
    assert log.lines == [
        {
            "event": "check progress",
            "check": "replicas",
            "ledgers_done": 2,
            "rate_per_s": 0.2,
            "eta_s": 9.8,
        }
    ]


# --- state and metrics -------------------------------------------------------------------


def _value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(f"bookkeeper_auditor_{name}", labels)


def test_progress_is_kept_while_the_check_runs_and_the_series_exist_only_then() -> None:
    m = Metrics()
    state = m.state
    state.check_progress(Check.REPLICAS, 5, 10, "ledgers", 1.0)
    assert state.checks[Check.REPLICAS].progress is None  # not running: ignored
    assert _value(m, "check_progress_ledgers", check="replicas") is None
    state.check_run_state(Check.REPLICAS, RunState.RUNNING, None)
    assert _value(m, "check_progress_ledgers", check="replicas") is None  # no ledger yet
    state.check_progress(Check.REPLICAS, 1, None, "max_ledger_id", 1.0)
    assert _value(m, "check_progress_ledgers", check="replicas") == 1
    assert _value(m, "check_progress_total", check="replicas", total_kind="max_ledger_id") is None
    state.check_progress(Check.REPLICAS, 7, 40, "max_ledger_id", 2.0)
    assert _value(m, "check_progress_ledgers", check="replicas") == 7
    assert _value(m, "check_progress_total", check="replicas", total_kind="max_ledger_id") == 40
    assert _value(m, "check_progress_ledgers", check="placement") is None
    state.check_ended(Check.REPLICAS, RunFailed("boom", 1.0), 3.0)
    assert state.checks[Check.REPLICAS].progress is None
    assert _value(m, "check_progress_ledgers", check="replicas") is None
    assert _value(m, "check_progress_total", check="replicas", total_kind="max_ledger_id") is None
    # A new run starts from nothing; stepping down (a cancelled run) forgets it.
    state.check_run_state(Check.REPLICAS, RunState.RUNNING, None)
    state.check_progress(Check.REPLICAS, 3, 9, "ledgers", 4.0)
    assert _value(m, "check_progress_total", check="replicas", total_kind="ledgers") == 9
    state.check_run_state(Check.REPLICAS, RunState.RUNNING, None)
    assert state.checks[Check.REPLICAS].progress is None
    state.check_progress(Check.REPLICAS, 3, 9, "ledgers", 4.0)
    state.stepped_down()
    assert _value(m, "check_progress_ledgers", check="replicas") is None


def _replicas_report(coverage: Coverage | None) -> CheckReport:
    report = CheckReport(Check.REPLICAS, started_at=1.0, finished_at=2.0)
    report.coverage = coverage
    return report


def test_the_coverage_gauge_is_the_last_replicas_report() -> None:
    m = Metrics()
    how = ("listed", "probed", "unverified")
    assert [_value(m, "replicas_coverage_pairs", how=h) for h in how] == [0, 0, 0]
    m.state.lead(1.0)
    m.state.check_run_state(Check.REPLICAS, RunState.RUNNING, None)
    m.state.check_ended(
        Check.REPLICAS, RunCompleted(_replicas_report(Coverage(20, 5, 1)), 1.0), 2.0
    )
    assert [_value(m, "replicas_coverage_pairs", how=h) for h in how] == [20, 5, 1]
    other = CheckReport(Check.PLACEMENT, started_at=1.0, finished_at=2.0)
    m.state.tallies.record_report(other, 1.0)
    assert [_value(m, "replicas_coverage_pairs", how=h) for h in how] == [20, 5, 1]
    m.state.tallies.record_report(_replicas_report(Coverage(3, 0, 0)), 1.0)
    assert [_value(m, "replicas_coverage_pairs", how=h) for h in how] == [3, 0, 0]
    m.state.stepped_down()
    assert [_value(m, "replicas_coverage_pairs", how=h) for h in how] == [0, 0, 0]


# --- status --------------------------------------------------------------------------------


def test_status_carries_the_progress_through_the_message_and_json() -> None:
    state = DaemonState("me:3181")
    state.check_run_state(Check.REPLICAS, RunState.RUNNING, None)
    state.check_progress(Check.REPLICAS, 12345, 100000, "max_ledger_id", 1_700_000_000.0)
    msg = status_response(state)
    replicas = next(c for c in msg.checks if c.check == "replicas")
    assert replicas.HasField("progress") and replicas.progress.HasField("ledgers_total")
    assert (replicas.progress.ledgers_done, replicas.progress.total_kind) == (
        12345,
        "max_ledger_id",
    )
    doc = status_json(pb.GetStatusResponse.FromString(msg.SerializeToString()))
    assert doc["checks"]["replicas"]["outcome"] == "running"
    assert doc["checks"]["replicas"]["progress"] == {
        "ledgers_done": 12345,
        "ledgers_total": 100000,
        "total_kind": "max_ledger_id",
        "updated": "2023-11-14T22:13:20Z",
    }
    assert doc["checks"]["placement"]["progress"] is None
    assert not next(c for c in msg.checks if c.check == "placement").HasField("progress")

    state.check_progress(Check.REPLICAS, 1, None, "max_ledger_id", 1_700_000_000.0)
    replicas = next(c for c in status_response(state).checks if c.check == "replicas")
    assert not replicas.progress.HasField("ledgers_total")
    assert progress_json(replicas) == {
        "ledgers_done": 1,
        "ledgers_total": None,
        "total_kind": "max_ledger_id",
        "updated": "2023-11-14T22:13:20Z",
    }


def test_status_text_of_a_running_check() -> None:
    def p(done: int, total: int | None, kind: str) -> dict[str, object]:
        return {"ledgers_done": done, "ledgers_total": total, "total_kind": kind, "updated": None}

    running = str(Outcome.RUNNING)
    assert progress_text(running, p(12345, 100000, "max_ledger_id")) == (
        "running, 12,345 of ~100,000 ledgers"
    )
    assert (
        progress_text(running, p(12345, 100000, "ledgers")) == "running, 12,345 of 100,000 ledgers"
    )
    assert progress_text(running, p(1, None, "max_ledger_id")) == "running, 1 ledger so far"
    assert progress_text(running, p(0, None, "ledgers")) == "running, 0 ledgers so far"
    assert progress_text(running, None) == "running"
    assert progress_text("ok", p(5, 5, "ledgers")) == "ok"


def test_the_text_status_shows_a_running_checks_progress_under_its_row() -> None:
    import io

    from auditor.api.convert import status_json, status_response
    from auditor.cli.api_commands import render_status
    from auditor.proto import auditor_service_pb2 as pb

    state = DaemonState("a:1", started_at=1_700_000_000.0)
    state.check_run_state(Check.REPLICAS, RunState.RUNNING, None)
    state.check_progress(Check.REPLICAS, 12_345, 100_000, "max_ledger_id", 1.0)
    msg = status_response(state, now=1_700_000_010.0)
    doc = status_json(pb.GetStatusResponse.FromString(msg.SerializeToString()))
    out = io.StringIO()
    render_status(doc, out)
    lines = out.getvalue().splitlines()
    [row] = [i for i, line in enumerate(lines) if line.startswith("  replicas ")]
    assert lines[row + 1] == f"  {'':<10} running, 12,345 of ~100,000 ledgers"
    assert sum("running, " in line for line in lines) == 1  # the other checks show none
