"""The leadership decision machine, without ZooKeeper: every event in every phase, the
back-off's growth, cap and reset, and whole sequences as the daemon lives them."""

from __future__ import annotations

import random

import pytest

from auditor.daemon.leadership import (
    DETAIL_LIMIT,
    SHORT_TERM,
    Action,
    BackoffElapsed,
    CampaignFailed,
    ConfigReloaded,
    Connected,
    Decision,
    DuplicateCleared,
    DuplicateIdentity,
    Elected,
    Event,
    FencedOut,
    LeadershipMachine,
    OtherElectionCleared,
    OtherElectionLeader,
    Phase,
    Reason,
    SessionLost,
    Started,
    StepDownRequested,
    StopRequested,
    Suspended,
    SuspendedTooLong,
    TaskEnded,
    VoteLost,
    WorkEnded,
    WorkFailed,
    leader_backoff,
)

S, V, L, B, R, OE, X, E = (
    Phase.STARTING,
    Phase.VOTING,
    Phase.LEADING,
    Phase.BACKING_OFF,
    Phase.REFUSED,
    Phase.OTHER_ELECTION,
    Phase.STOPPING,
    Phase.ENDED,
)
ALL_PHASES = (S, V, L, B, R, OE, X, E)
CARRY = Action.CARRY_ON

#: Every event, with the reason it is counted under.
EVENTS: list[tuple[Event, Reason]] = [
    (Started(), Reason.STARTED),
    (Connected(), Reason.CONNECTED),
    (Suspended(), Reason.SUSPENDED),
    (SessionLost(), Reason.SESSION_LOST),
    (SuspendedTooLong(4.0), Reason.SUSPENDED_TOO_LONG),
    (Elected("/v/V_1"), Reason.ELECTED),
    (CampaignFailed("boom"), Reason.CAMPAIGN_FAILED),
    (VoteLost(), Reason.VOTE_LOST),
    (FencedOut("refused"), Reason.FENCED_OUT),
    (WorkFailed("Oops: bad"), Reason.LEADER_WORK_FAILED),
    (WorkEnded(), Reason.LEADER_WORK_ENDED),
    (StopRequested("SIGTERM"), Reason.STOP_REQUESTED),
    (StepDownRequested("test"), Reason.STEP_DOWN_REQUESTED),
    (ConfigReloaded(), Reason.CONFIG_RELOADED),
    (DuplicateIdentity("/v/xV_2"), Reason.DUPLICATE_IDENTITY),
    (DuplicateCleared(), Reason.DUPLICATE_CLEARED),
    (
        OtherElectionLeader("pulsar", "a:1 at /l/underreplication/leader"),
        Reason.OTHER_ELECTION_LEADER,
    ),
    (OtherElectionCleared(), Reason.OTHER_ELECTION_CLEARED),
    (BackoffElapsed(), Reason.BACKOFF_ELAPSED),
    (TaskEnded("election", "cancelled"), Reason.TASK_ENDED),
]

#: (event type, phase) -> (action, phase after) where it is not "carry on, unchanged".
#: The session timeout passing (SuspendedTooLong) is given while disconnected.
CHANGES: dict[tuple[type, Phase], tuple[Action, Phase]] = {
    (Started, S): (Action.VOTE, V),
    (Connected, L): (Action.RESUME, L),
    (Suspended, L): (Action.PAUSE, L),
    (SessionLost, L): (Action.STEP_DOWN, V),
    (SuspendedTooLong, L): (Action.STEP_DOWN, V),
    (Elected, V): (Action.LEAD, L),
    **{(Elected, p): (Action.STEP_DOWN, p) for p in (S, B, R, OE, X, E)},
    (CampaignFailed, V): (Action.BACK_OFF, B),
    (VoteLost, L): (Action.STEP_DOWN, V),
    (FencedOut, L): (Action.STEP_DOWN, V),
    (WorkFailed, L): (Action.BACK_OFF, B),
    (WorkEnded, L): (Action.BACK_OFF, B),
    **{(StopRequested, p): (Action.EXIT, X) for p in (S, V, L, B, R, OE)},
    (StepDownRequested, L): (Action.STEP_DOWN, V),
    (ConfigReloaded, L): (Action.RESTART_WORK, L),
    **{(DuplicateIdentity, p): (Action.REFUSE, R) for p in (S, V, B)},
    (DuplicateCleared, R): (Action.VOTE, V),
    # A leader steps down too: two auditors must not run.
    **{(OtherElectionLeader, p): (Action.REFUSE, OE) for p in (S, V, L, B)},
    (OtherElectionCleared, OE): (Action.VOTE, V),
    (BackoffElapsed, B): (Action.VOTE, V),
    **{(TaskEnded, p): (Action.FAIL, E) for p in (S, V, L, B, R, OE)},
}


def machine_in(phase: Phase, *, connected: bool = True) -> LeadershipMachine:
    m = LeadershipMachine(rng=random.Random(7))
    m.phase = phase
    m.connected = connected
    if phase is L:
        m.elected_at = 0.0
    return m


@pytest.mark.parametrize("phase", ALL_PHASES, ids=str)
@pytest.mark.parametrize(("event", "reason"), EVENTS, ids=lambda x: type(x).__name__)
def test_every_event_in_every_phase(event: Event, reason: Reason, phase: Phase) -> None:
    disconnected = isinstance(event, SuspendedTooLong)
    m = machine_in(phase, connected=not disconnected)
    d = m.decide(event, 100.0)
    action, after = CHANGES.get((type(event), phase), (CARRY, phase))
    assert (d.action, d.phase, m.phase) == (action, after, after)
    assert d.reason is reason
    assert d.at == 100.0
    assert d.message and "\n" not in d.message
    ends = (Action.STEP_DOWN, Action.BACK_OFF, Action.REFUSE, Action.EXIT, Action.FAIL)
    assert d.ends_term is (action in ends)
    assert (d.backoff > 0) is (action is Action.BACK_OFF)
    assert d.level == ("error" if action in (Action.BACK_OFF, Action.FAIL) else d.level)


def test_every_reason_has_an_event() -> None:
    assert {r for _, r in EVENTS} == set(Reason)


def test_the_session_timeout_passing_while_connected_again_changes_nothing() -> None:
    m = machine_in(L, connected=False)
    assert m.decide(Connected(), 1.0).action is Action.RESUME
    d = m.decide(SuspendedTooLong(4.0), 2.0)
    assert (d.action, m.phase) == (CARRY, L)


def test_messages_the_logs_and_tests_rely_on() -> None:
    m = machine_in(V)
    assert m.decide(Elected("/v/V_1"), 1.0).message == "elected auditor"
    m = machine_in(L, connected=False)
    assert (
        m.decide(SuspendedTooLong(4.0), 1.0).message
        == "disconnected from ZooKeeper for a whole session timeout; stepping down"
    )
    assert (
        machine_in(V).decide(SessionLost(), 1.0).message == "ZooKeeper session lost; voting again"
    )
    m = machine_in(L)
    assert m.decide(SessionLost(), 1.0).message == "ZooKeeper session lost; stepping down at once"


def test_messages_name_the_metadata_store_in_use() -> None:
    """On etcd the daemon says etcd: a session lost there is not a ZooKeeper session."""

    def etcd_in(phase: Phase, *, connected: bool = True) -> LeadershipMachine:
        m = LeadershipMachine(rng=random.Random(7), store="etcd")
        m.phase, m.connected = phase, connected
        if phase is L:
            m.elected_at = 0.0
        return m

    assert etcd_in(V).decide(SessionLost(), 1.0).message == "etcd session lost; voting again"
    assert etcd_in(L).decide(SessionLost(), 1.0).message == (
        "etcd session lost; stepping down at once"
    )
    assert etcd_in(L).decide(Suspended(), 1.0).message == (
        "etcd connection suspended; leader work paused"
    )
    assert etcd_in(V).decide(Connected(), 1.0).message == "etcd connected"
    assert etcd_in(L, connected=False).decide(SuspendedTooLong(4.0), 1.0).message == (
        "disconnected from etcd for a whole session timeout; stepping down"
    )
    refused = etcd_in(V).decide(DuplicateIdentity("/k"), 1.0).message
    assert refused.startswith("another etcd session holds a vote")
    assert "ZooKeeper" not in refused


def test_details_are_bounded() -> None:
    d = machine_in(L).decide(WorkFailed("x" * 10_000), 1.0)
    assert d.detail.startswith("x" * DETAIL_LIMIT)
    assert d.detail.endswith("... (10000 characters)")
    assert len(d.detail) < DETAIL_LIMIT + 30


# --- back-off ---------------------------------------------------------------------------


def test_backoff_ceiling_doubles_up_to_the_cap() -> None:
    b = leader_backoff(initial=1.0, maximum=120.0)
    assert [b.ceiling(n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 64, 120, 120]
    assert b.ceiling(10_000) == 120  # no overflow on a long streak
    rng = random.Random(3)
    for n in range(1, 12):
        top = b.ceiling(n)
        assert all(top / 2 <= b.draw(n, rng) <= top for _ in range(200))


def fail_term(m: LeadershipMachine, elected: float, failed: float) -> Decision:
    assert m.decide(Elected("/v/V_1"), elected).action is Action.LEAD
    d = m.decide(WorkFailed("boom"), failed)
    assert d.action is Action.BACK_OFF
    assert m.decide(BackoffElapsed(), failed + d.backoff).action is Action.VOTE
    return d


def test_failures_in_a_row_back_off_longer_and_the_streak_resets() -> None:
    m = LeadershipMachine(leader_backoff(initial=1.0, maximum=8.0), random.Random(11))
    m.decide(Started(), 0.0)
    waits = [fail_term(m, 10.0 * i, 10.0 * i + 0.01).backoff for i in range(6)]
    ceilings = [1, 2, 4, 8, 8, 8]
    assert m.failures == 6
    for wait, top in zip(waits, ceilings, strict=True):
        assert top / 2 <= wait <= top
    # A term that ends for another reason starts the count over.
    m.decide(Elected("/v/V_2"), 100.0)
    assert m.decide(VoteLost(), 100.0 + SHORT_TERM).action is Action.STEP_DOWN
    assert m.failures == 0
    assert fail_term(m, 120.0, 120.5).backoff <= 1.0
    # So does a failing term that had lasted at least the maximum back-off.
    assert fail_term(m, 200.0, 200.1).backoff > 1.0  # second in a row: 1..2 s
    assert m.failures == 2
    assert fail_term(m, 300.0, 308.0).backoff <= 1.0
    assert m.failures == 1


def test_a_vote_lost_right_after_winning_backs_off_and_counts() -> None:
    """Elected, then our vote no longer first within seconds (a foreign `V_1` that one
    rule ranked last and another first): a failure, backed off longer each time, never
    an immediate new vote; a term that lasted is a plain step-down."""
    m = LeadershipMachine(leader_backoff(initial=1.0, maximum=8.0), random.Random(2))
    m.decide(Started(), 0.0)
    waits = []
    for i in range(4):
        at = 100.0 * i
        assert m.decide(Elected(f"/v/V_{i}"), at).action is Action.LEAD
        d = m.decide(VoteLost(), at + 0.01)
        assert (d.action, d.phase, d.reason, d.level) == (
            Action.BACK_OFF,
            B,
            Reason.VOTE_LOST,
            "error",
        )
        assert "0.0 s after we were elected" in d.message
        waits.append(d.backoff)
        assert m.decide(BackoffElapsed(), at + 0.01 + d.backoff).action is Action.VOTE
    assert m.failures == 4
    assert [top / 2 <= w <= top for w, top in zip(waits, [1, 2, 4, 8], strict=True)] == [True] * 4
    m.decide(Elected("/v/V_9"), 1000.0)
    assert m.decide(VoteLost(), 1000.0 + SHORT_TERM).action is Action.STEP_DOWN
    assert m.failures == 0


def test_campaign_failures_count_in_the_same_streak() -> None:
    m = LeadershipMachine(leader_backoff(initial=2.0, maximum=60.0), random.Random(5))
    m.decide(Started(), 0.0)
    first = m.decide(CampaignFailed("ConnectionLoss"), 1.0)
    assert (first.action, first.phase, m.failures) == (Action.BACK_OFF, B, 1)
    assert 1.0 <= first.backoff <= 2.0
    m.decide(BackoffElapsed(), 3.0)
    second = fail_term(m, 4.0, 4.1)
    assert 2.0 <= second.backoff <= 4.0


def test_new_backoff_settings_apply_to_the_next_failure() -> None:
    m = LeadershipMachine(leader_backoff(initial=1.0, maximum=2.0), random.Random(1))
    m.decide(Started(), 0.0)
    m.backoff = leader_backoff(initial=50.0, maximum=100.0)
    assert 25.0 <= fail_term(m, 1.0, 2.0).backoff <= 50.0


# --- whole lives ------------------------------------------------------------------------


def replay(m: LeadershipMachine, *events: Event) -> list[tuple[Action, Reason, Phase]]:
    return [(d.action, d.reason, d.phase) for d in (m.decide(e, 1.0) for e in events)]


def test_a_leader_suspended_then_back_keeps_leading() -> None:
    m = LeadershipMachine()
    assert replay(m, Started(), Elected("/v/V_1"), Suspended(), Connected()) == [
        (Action.VOTE, Reason.STARTED, V),
        (Action.LEAD, Reason.ELECTED, L),
        (Action.PAUSE, Reason.SUSPENDED, L),
        (Action.RESUME, Reason.CONNECTED, L),
    ]


def test_a_cut_off_leader_steps_down_once_and_the_lost_session_only_carries_on() -> None:
    m = LeadershipMachine()
    steps = replay(m, Started(), Elected("/v/V_1"), Suspended(), SuspendedTooLong(4), SessionLost())
    assert steps[-2:] == [
        (Action.STEP_DOWN, Reason.SUSPENDED_TOO_LONG, V),
        (CARRY, Reason.SESSION_LOST, V),
    ]


def test_a_follower_losing_its_session_does_not_end_the_leadership_it_may_win() -> None:
    m = LeadershipMachine()
    assert replay(m, Started(), SessionLost(), Elected("/v/V_9")) == [
        (Action.VOTE, Reason.STARTED, V),
        (CARRY, Reason.SESSION_LOST, V),
        (Action.LEAD, Reason.ELECTED, L),
    ]


def test_refusal_for_a_duplicate_identity_until_it_clears() -> None:
    m = LeadershipMachine()
    assert replay(
        m,
        Started(),
        DuplicateIdentity("/v/xV_1"),
        DuplicateIdentity("/v/xV_1"),
        DuplicateCleared(),
        Elected("/v/V_2"),
    ) == [
        (Action.VOTE, Reason.STARTED, V),
        (Action.REFUSE, Reason.DUPLICATE_IDENTITY, R),
        (CARRY, Reason.DUPLICATE_IDENTITY, R),
        (Action.VOTE, Reason.DUPLICATE_CLEARED, V),
        (Action.LEAD, Reason.ELECTED, L),
    ]


def test_stop_while_leading_hands_over_and_late_events_carry_on() -> None:
    m = LeadershipMachine()
    assert replay(
        m,
        Started(),
        Elected("/v/V_1"),
        StopRequested("SIGTERM"),
        WorkFailed("cancelled"),
        TaskEnded("election", "returned"),
        StopRequested("SIGINT"),
    ) == [
        (Action.VOTE, Reason.STARTED, V),
        (Action.LEAD, Reason.ELECTED, L),
        (Action.EXIT, Reason.STOP_REQUESTED, X),
        (CARRY, Reason.LEADER_WORK_FAILED, X),
        (CARRY, Reason.TASK_ENDED, X),
        (CARRY, Reason.STOP_REQUESTED, X),
    ]


def test_the_election_task_ending_fails_whatever_the_phase() -> None:
    m = LeadershipMachine()
    replay(m, Started(), Elected("/v/V_1"))
    d = m.decide(TaskEnded("election", "RuntimeError: x"), 5.0)
    assert (d.action, d.phase, d.level, d.detail) == (Action.FAIL, E, "error", "RuntimeError: x")
    assert "exiting non-zero" in d.message
    # Nothing brings an ended daemon back.
    for event, _ in EVENTS:
        assert m.decide(event, 6.0).phase is E
