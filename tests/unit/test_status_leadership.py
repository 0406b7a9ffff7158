"""Leadership in `status` and in the metrics: the decisions a daemon took, a duplicate
identity, a back-off, unusable znodes; from the state to the gRPC message, the
`status --json` document, the text, and the series."""

from __future__ import annotations

import io

import pytest

from auditor.api.convert import status_json, status_response
from auditor.cli.api_commands import DECISIONS_SHOWN, render_status
from auditor.daemon.leadership import (
    DuplicateIdentity,
    Elected,
    Event,
    LeadershipMachine,
    OtherElectionLeader,
    Started,
    WorkFailed,
    leader_backoff,
)
from auditor.daemon.metrics import ZNODES, Metrics
from auditor.daemon.state import DECISIONS_KEPT, DaemonState, OtherElection
from auditor.daemon.tallies import Tallies
from tests.unit.test_metrics import samples, value

T0 = 1_700_000_000.0
VOTE = "/ledgers/underreplication/auditorelection/abcV_0000000001"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def lived(state: DaemonState, machine: LeadershipMachine) -> None:
    """Started, elected, failed (backing off) at T0..T0+2."""
    events: list[Event] = [Started(), Elected(VOTE), WorkFailed("Boom: the layout")]
    for i, event in enumerate(events):
        state.record_decision(machine.decide(event, T0 + i))


def test_decisions_duplicate_backoff_and_znodes_travel_to_status_json() -> None:
    state = DaemonState("a:1", started_at=T0)
    machine = LeadershipMachine(leader_backoff(initial=4.0, maximum=4.0))
    lived(state, machine)
    failed = state.decisions[-1]
    assert state.backoff_until == T0 + 2 + failed.backoff
    state.znode_invalid("lostBookieRecoveryDelay", "b'abc'", "the configured 30 s", T0 + 1)
    doc = status_json(status_response(state, now=T0 + 3))
    assert doc["election_phase"] == "backing_off"
    assert [(d["action"], d["reason"]) for d in doc["decisions"]] == [
        ("vote", "started"),
        ("lead", "elected"),
        ("back_off", "leader_work_failed"),
    ]
    assert doc["decisions"][1] == {
        "at": "2023-11-14T22:13:21Z",
        "action": "lead",
        "reason": "elected",
        "message": "elected auditor",
        "detail": VOTE,
        "backoff_s": None,
    }
    last = doc["decisions"][2]
    assert last["detail"] == "Boom: the layout"
    assert last["backoff_s"] == round(failed.backoff, 3) and 2.0 <= last["backoff_s"] <= 4.0
    assert last["message"].startswith("leader work failed; stepping down; voting again in ")
    assert doc["backoff_until"] is not None and doc["duplicate_identity"] is None
    assert doc["invalid_znodes"] == {
        "lostBookieRecoveryDelay": {
            "value": "b'abc'",
            "using": "the configured 30 s",
            "since": "2023-11-14T22:13:21Z",
        }
    }

    out = io.StringIO()
    render_status(doc, out)
    text = out.getvalue()
    assert (
        "  election: backing_off in the bookkeeper election (voting again at 2023-11-14T22:13:2"
        in text
    )
    assert (
        "  znode lostBookieRecoveryDelay holds b'abc', which is unusable "
        "(since 2023-11-14T22:13:21Z); using the configured 30 s\n" in text
    )
    assert "  last leadership decisions:\n" in text
    assert "    2023-11-14T22:13:21Z  elected             elected auditor [" + VOTE + "]\n" in text
    assert "leader_work_failed  leader work failed; stepping down" in text
    assert "DUPLICATE IDENTITY" not in text


def test_a_refused_daemon_says_so_everywhere() -> None:
    state = DaemonState("a:1", started_at=T0)
    machine = LeadershipMachine()
    state.record_decision(machine.decide(Started(), T0))
    state.record_decision(machine.decide(DuplicateIdentity(VOTE), T0 + 5))
    assert (state.duplicate_vote, state.duplicate_since) == (VOTE, T0 + 5)
    doc = status_json(status_response(state))
    assert doc["election_phase"] == "refused"
    assert doc["duplicate_identity"] == {"vote": VOTE, "since": "2023-11-14T22:13:25Z"}
    out = io.StringIO()
    render_status(doc, out)
    assert (
        f"  DUPLICATE IDENTITY: vote {VOTE} of another ZooKeeper session carries this "
        "daemon's identity (since 2023-11-14T22:13:25Z); this daemon refuses to vote\n"
    ) in out.getvalue()
    m = Metrics(state)
    assert value(m, "bookkeeper_auditor_duplicate_identity") == 1
    assert (
        value(m, "bookkeeper_auditor_leadership_decisions_total", reason="duplicate_identity") == 1
    )


def test_only_the_last_decisions_are_kept_and_shown_but_all_are_counted() -> None:
    state = DaemonState("a:1")
    machine = LeadershipMachine()
    state.record_decision(machine.decide(Started(), T0))
    for i in range(100):
        state.record_decision(machine.decide(Elected(f"{VOTE}{i}"), T0 + i))
    assert len(state.decisions) == DECISIONS_KEPT
    assert state.decisions[-1].detail == f"{VOTE}99"
    doc = status_json(status_response(state))
    assert len(doc["decisions"]) == DECISIONS_KEPT
    out = io.StringIO()
    render_status(doc, out)
    listed = out.getvalue().split("last leadership decisions:\n")[1].splitlines()
    assert len([line for line in listed if line.startswith("    2023")]) == DECISIONS_SHOWN
    m = Metrics(state)
    assert value(m, "bookkeeper_auditor_leadership_decisions_total", reason="elected") == 100
    assert value(m, "bookkeeper_auditor_leadership_decisions_total", reason="started") == 1


def test_the_leadership_series_exist_at_zero_and_are_read_at_scrape_time() -> None:
    clock = Clock(T0)
    state = DaemonState("a:1", tallies=Tallies(clock=clock))
    m = Metrics(state)
    s = samples(m)
    decisions = {
        dict(labels)["reason"]: n
        for (name, labels), n in s.items()
        if name == "bookkeeper_auditor_leadership_decisions_total"
    }
    assert set(decisions) >= {"elected", "session_lost", "leader_work_failed", "task_ended"}
    assert set(decisions.values()) == {0}
    znodes = {
        dict(labels)["znode"]: n
        for (name, labels), n in s.items()
        if name == "bookkeeper_auditor_znode_invalid"
    }
    assert znodes == dict.fromkeys(ZNODES, 0)
    assert value(m, "bookkeeper_auditor_duplicate_identity") == 0
    assert value(m, "bookkeeper_auditor_election_backoff_seconds") == 0
    machine = LeadershipMachine(leader_backoff(initial=10.0, maximum=10.0))
    lived(state, machine)
    wait = state.decisions[-1].backoff
    clock.now = T0 + 2
    assert value(m, "bookkeeper_auditor_election_backoff_seconds") == pytest.approx(wait)
    clock.now = T0 + 4
    assert value(m, "bookkeeper_auditor_election_backoff_seconds") == pytest.approx(wait - 2)
    clock.now = T0 + 100
    assert value(m, "bookkeeper_auditor_election_backoff_seconds") == 0
    state.znode_invalid("replicascheckctime", "b'x'", "absent", T0)
    assert value(m, "bookkeeper_auditor_znode_invalid", znode="replicascheckctime") == 1
    assert (
        value(m, "bookkeeper_auditor_leadership_decisions_total", reason="leader_work_failed") == 1
    )


def test_the_other_election_travels_to_status_json_text_and_metrics() -> None:
    state = DaemonState("a:1", started_at=T0, election="pulsar")
    machine = LeadershipMachine()
    state.record_decision(machine.decide(Started(), T0))
    holder = "10.0.0.9:3181 at /ledgers/underreplication/auditorelection/V_0000000004"
    state.record_decision(machine.decide(OtherElectionLeader("bookkeeper", holder), T0 + 1))
    state.other_election = OtherElection(
        "bookkeeper", "/ledgers/underreplication/auditorelection/V_0000000004", "10.0.0.9:3181", T0
    )
    doc = status_json(status_response(state, now=T0 + 3))
    assert (doc["election_phase"], doc["election"]) == ("other_election", "pulsar")
    assert doc["other_election"] == {
        "election": "bookkeeper",
        "path": "/ledgers/underreplication/auditorelection/V_0000000004",
        "holder": "10.0.0.9:3181",
        "since": "2023-11-14T22:13:20Z",
    }
    out = io.StringIO()
    render_status(doc, out)
    text = out.getvalue()
    assert "  election: other_election in the pulsar election\n" in text
    assert (
        "  OTHER ELECTION: the bookkeeper election is held by 10.0.0.9:3181 at "
        "/ledgers/underreplication/auditorelection/V_0000000004 (since 2023-11-14T22:13:20Z)"
    ) in text
    metrics = Metrics()
    metrics.bind(state)
    assert value(metrics, "bookkeeper_auditor_election_info", election="pulsar") == 1
    other = "bookkeeper_auditor_other_election_leader"
    assert value(metrics, other, election="bookkeeper") == 1
    assert (
        "bookkeeper_auditor_other_election_leader",
        frozenset({("election", "pulsar")}),
    ) not in (samples(metrics))
    state.other_election = None
    assert value(metrics, other, election="bookkeeper") == 0
