"""The lost-bookie delay state machine, replaying upstream's scenarios (S30-S45) as timed events.

Bookies are "A".."F"; "A" stands for the auditor's own bookie in the upstream
tests and never dies. Times are seconds on an arbitrary clock. A `Cluster`
helper keeps the available set and the ZooKeeper delay, and carries out timer
decisions the way the daemon will (one armed timer, replaced or disarmed).
"""

from __future__ import annotations

import pytest

from auditor.schedule.lost_bookie_delay import (
    NUM_BOOKIE_AUDITS_DELAYED,
    NUM_DELAYED_BOOKIE_AUDITS_CANCELLED,
    NUM_SKIPPING_CHECK_TASK_TIMES,
    AuditReason,
    CancelPendingAudit,
    Decision,
    LostBookieDelay,
    RunAuditNow,
    ScheduleAudit,
)


class Cluster:
    """Events in, decisions out; audits collected with their time."""

    def __init__(
        self,
        bookies: str = "ABC",
        delay: int = 0,
        cookies: str = "",
        now: float = 0.0,
        missing_since: dict[str, float] | None = None,
    ) -> None:
        self.available = set(bookies)
        self.delay = delay
        self.sm = LostBookieDelay()
        self.timer: ScheduleAudit | None = None
        self.audits: list[tuple[float, RunAuditNow]] = []
        self.log: list[Decision] = []
        self.apply(
            now,
            self.sm.leader_started(
                set(cookies) | self.available, self.available, delay, now, missing_since
            ),
        )

    def apply(self, now: float, decisions: list[Decision]) -> list[Decision]:
        for d in decisions:
            self.log.append(d)
            if isinstance(d, RunAuditNow):
                self.audits.append((now, d))
            elif isinstance(d, ScheduleAudit):
                self.timer = d
            elif isinstance(d, CancelPendingAudit):
                self.timer = None
        return decisions

    def advance(self, now: float) -> None:
        """Fires the armed timer if it is due by `now`."""
        if self.timer is not None and self.timer.at <= now:
            t, self.timer = self.timer, None
            self.apply(t.at, self.sm.on_timer(t.at, t.token))

    def kill(self, bookie: str, now: float) -> list[Decision]:
        self.advance(now)
        self.available.discard(bookie)
        return self.apply(now, self.sm.on_bookies_changed(self.available, self.delay, now))

    def start(self, bookie: str, now: float) -> list[Decision]:
        self.advance(now)
        self.available.add(bookie)
        return self.apply(now, self.sm.on_bookies_changed(self.available, self.delay, now))

    def set_delay(self, delay: int, now: float) -> list[Decision]:
        self.advance(now)
        self.delay = delay
        return self.apply(now, self.sm.on_delay_changed(delay, now))

    def audit_times(self, after: float = 0.0) -> list[float]:
        return [t for t, _ in self.audits if t > after]


def test_leader_start_audits_bookies_missing_for_longer_than_the_delay_at_once() -> None:
    # "D" registered once (cookie) and has been missing for 40 s, longer than the delay.
    c = Cluster("ABC", delay=30, cookies="D", now=100.0, missing_since={"D": 60.0})
    assert c.audits == [(100.0, RunAuditNow(AuditReason.LEADER_STARTED, frozenset("D")))]
    assert not c.sm.audit_pending
    assert c.sm.held_bookies == frozenset()
    assert c.sm.delay_before_change == 30
    # The registry's initial snapshot right after start changes nothing: "D" is covered.
    assert c.sm.on_bookies_changed(c.available, 30, 100.1) == []
    assert not c.sm.audit_pending


def test_restart_rule_a_bookie_never_seen_waits_the_delay_from_the_election() -> None:
    # The daemon beside "D" restarted with it: the new leader never saw "D" up.
    c = Cluster("ABC", delay=30, cookies="D", now=100.0)
    assert c.audits == []
    assert c.timer == ScheduleAudit(130.0, 1)
    assert c.sm.held_bookies == frozenset("D")
    c.start("D", 110.0)  # back within the delay: nothing marked, nothing pending
    c.advance(200.0)
    assert c.audits == []
    assert c.sm.held_bookies == frozenset()
    assert c.sm.counters[NUM_DELAYED_BOOKIE_AUDITS_CANCELLED] == 1


def test_restart_rule_the_delay_counts_from_when_a_follower_saw_the_bookie_go() -> None:
    c = Cluster("ABC", delay=30, cookies="D", now=100.0, missing_since={"D": 90.0})
    assert c.audits == [] and c.timer == ScheduleAudit(120.0, 1)
    c.advance(119.0)
    assert c.audits == []
    c.advance(121.0)  # still down past its delay: audited once, then no longer held
    assert c.audits == [(120.0, RunAuditNow(AuditReason.DELAY_EXPIRED, frozenset("D")))]
    assert c.sm.held_bookies == frozenset()


def test_restart_rule_two_bookies_within_their_delay_are_audited_at_once() -> None:
    c = Cluster("ABC", delay=30, cookies="DE", now=100.0, missing_since={"D": 95.0})
    assert c.audits == [(100.0, RunAuditNow(AuditReason.MULTIPLE_FAILURES, frozenset("DE")))]
    assert not c.sm.audit_pending and c.sm.held_bookies == frozenset()


def test_restart_rule_overdue_bookies_audited_now_the_recent_one_held() -> None:
    c = Cluster("ABC", delay=30, cookies="DE", now=100.0, missing_since={"D": 10.0, "E": 90.0})
    assert c.audits == [(100.0, RunAuditNow(AuditReason.LEADER_STARTED, frozenset("D")))]
    assert c.timer == ScheduleAudit(120.0, 1)
    assert c.sm.held_bookies == frozenset("E")


def test_restart_rule_a_second_loss_during_the_delay_audits_both_at_once() -> None:
    c = Cluster("ABC", delay=30, cookies="D", now=100.0)
    assert c.sm.held_bookies == frozenset("D")
    c.kill("C", 105.0)
    assert c.audits == [(105.0, RunAuditNow(AuditReason.MULTIPLE_FAILURES, frozenset("CD")))]
    assert c.timer is None and c.sm.held_bookies == frozenset()


def test_restart_rule_delay_zero_keeps_auditing_at_once() -> None:
    c = Cluster("ABC", delay=0, cookies="D", now=100.0)
    assert c.audits == [(100.0, RunAuditNow(AuditReason.LEADER_STARTED, frozenset("D")))]
    assert c.sm.held_bookies == frozenset()


def test_events_require_leadership_first() -> None:
    sm = LostBookieDelay()
    with pytest.raises(RuntimeError):
        sm.on_bookies_changed({"A"}, 0, 0.0)


def test_no_change_and_new_bookie_do_nothing() -> None:
    c = Cluster("ABC", delay=5)
    assert c.start("D", 1.0) == []
    assert c.sm.known_bookies == set("ABCD")


def test_s30_delay_zero_audits_at_once() -> None:
    c = Cluster("ABC", delay=0)
    assert c.kill("C", 1.0) == [RunAuditNow(AuditReason.NO_DELAY, frozenset("C"))]
    assert not c.sm.audit_pending and c.sm.bookies_to_audit == set()


def test_s31_kill_and_restart_with_delay_zero() -> None:
    c = Cluster("ABC", delay=0)
    c.kill("C", 1.0)
    assert c.start("C", 1.1) == []  # back: nothing to cancel, the audit already ran
    assert c.audit_times(after=0.0) == [1.0]


def test_s32_second_failure_after_rereplication_audits_again() -> None:
    c = Cluster("ABC", delay=0)
    c.kill("C", 1.0)
    c.kill("B", 2.0)
    assert [a.bookies for _, a in c.audits[1:]] == [frozenset("C"), frozenset("B")]


def test_s35_s36_readonly_is_available_then_lost() -> None:
    c = Cluster("ABC", delay=0)
    # C goes read-only: the writable set loses it, the read-only set gains it,
    # the union (what the machine is fed) is unchanged.
    assert c.apply(1.0, c.sm.on_bookies_changed(set("ABC"), 0, 1.0)) == []
    assert c.kill("C", 2.0) == [RunAuditNow(AuditReason.NO_DELAY, frozenset("C"))]


def test_s37_delayed_audit_runs_after_the_delay() -> None:
    c = Cluster("ABC")
    c.set_delay(5, 1.0)  # a new value, nothing pending: nothing happens
    assert c.audit_times(after=0.0) == []
    assert c.kill("C", 2.0) == [ScheduleAudit(7.0, 1)]
    c.advance(6.0)  # 4 s later: not yet
    assert c.audit_times(after=0.0) == []
    c.advance(8.0)  # within the next 2 s
    assert c.audits[-1] == (7.0, RunAuditNow(AuditReason.DELAY_EXPIRED, frozenset("C")))
    assert not c.sm.audit_pending and c.sm.bookies_to_audit == set()
    assert c.sm.counters[NUM_BOOKIE_AUDITS_DELAYED] == 1
    assert c.sm.counters[NUM_DELAYED_BOOKIE_AUDITS_CANCELLED] == 0


def test_s38_periodic_checks_skip_while_audit_pending() -> None:
    c = Cluster("ABC", delay=5)
    c.kill("C", 2.0)
    skipped = []
    for t in (2.0, 4.0, 6.0, 8.0, 10.0):  # periodic bookie check every 2 s
        c.advance(t)
        skipped.append(c.sm.should_skip_periodic_check())
    assert skipped == [True, True, True, False, False]
    assert c.sm.counters[NUM_SKIPPING_CHECK_TASK_TIMES] == 3
    # The periodic check did not override the delay: the audit came from the timer at 7.
    assert c.audits[-1] == (7.0, RunAuditNow(AuditReason.DELAY_EXPIRED, frozenset("C")))


def test_s39_delay_set_to_zero_audits_immediately() -> None:
    c = Cluster("ABC", delay=50)
    c.kill("C", 1.0)
    c.advance(5.0)
    assert c.audit_times(after=0.0) == []
    assert c.set_delay(0, 5.0) == [
        CancelPendingAudit(),
        RunAuditNow(AuditReason.DELAY_SET_TO_ZERO, frozenset("C")),
    ]
    assert not c.sm.audit_pending and c.timer is None
    assert c.sm.counters[NUM_DELAYED_BOOKIE_AUDITS_CANCELLED] == 1
    assert c.sm.delay_before_change == 0


def test_s40_delay_increase_reschedules_from_now() -> None:
    c = Cluster("ABC", delay=3)
    assert c.kill("C", 10.0) == [ScheduleAudit(13.0, 1)]
    c.advance(12.0)
    assert c.set_delay(4, 12.0) == [CancelPendingAudit(), ScheduleAudit(16.0, 2)]
    c.advance(14.0)  # the original due time has passed: no audit
    assert c.audit_times(after=0.0) == []
    c.advance(17.0)
    assert c.audit_times(after=0.0) == [16.0]
    assert c.sm.counters[NUM_BOOKIE_AUDITS_DELAYED] == 2
    assert c.sm.counters[NUM_DELAYED_BOOKIE_AUDITS_CANCELLED] == 1
    assert c.sm.delay_before_change == 4


def test_stale_timer_is_ignored() -> None:
    c = Cluster("ABC", delay=3)
    c.kill("C", 10.0)
    c.set_delay(4, 12.0)
    # The first timer (token 1) fires anyway, late cancellation in the driver.
    assert c.sm.on_timer(13.0, 1) == []
    assert c.sm.audit_pending


def test_s41_trigger_without_pending_audit() -> None:
    c = Cluster("ABC", delay=0)
    assert c.sm.delay_before_change == 0 and not c.sm.audit_pending
    assert c.set_delay(0, 1.0) == [RunAuditNow(AuditReason.DELAY_SET_TO_ZERO, frozenset())]
    assert not c.sm.audit_pending and c.sm.delay_before_change == 0
    # The same with a non-zero delay: writing the current value back triggers.
    c2 = Cluster("ABC", delay=7)
    assert c2.set_delay(7, 1.0) == [RunAuditNow(AuditReason.TRIGGERED, frozenset())]
    assert c2.sm.counters[NUM_DELAYED_BOOKIE_AUDITS_CANCELLED] == 0


def test_s42_trigger_with_pending_audit() -> None:
    c = Cluster("ABC", delay=5)
    c.kill("C", 1.0)
    c.advance(3.0)
    assert c.sm.audit_pending and c.sm.delay_before_change == 5
    assert c.set_delay(5, 3.0) == [
        CancelPendingAudit(),
        RunAuditNow(AuditReason.TRIGGERED, frozenset("C")),
    ]
    assert not c.sm.audit_pending and c.sm.delay_before_change == 5
    c.advance(10.0)
    assert c.audit_times(after=0.0) == [3.0]  # the cancelled timer never fires


def test_s43_zero_with_pending_audit() -> None:
    c = Cluster("ABC", delay=5)
    c.kill("C", 1.0)
    assert c.set_delay(0, 2.0)[-1] == RunAuditNow(AuditReason.DELAY_SET_TO_ZERO, frozenset("C"))
    assert not c.sm.audit_pending and c.sm.delay_before_change == 0


def test_s44_second_failure_audits_at_once_with_both() -> None:
    c = Cluster("ABCD", delay=10)
    c.kill("B", 0.0)
    c.advance(3.0)
    assert c.audit_times(after=0.0) == []
    assert c.kill("C", 3.0) == [
        CancelPendingAudit(),
        RunAuditNow(AuditReason.MULTIPLE_FAILURES, frozenset("BC")),
    ]
    assert not c.sm.audit_pending
    assert c.sm.counters[NUM_DELAYED_BOOKIE_AUDITS_CANCELLED] == 1
    c.advance(20.0)
    assert c.audit_times(after=0.0) == [3.0]


def test_two_bookies_lost_in_one_event_audit_at_once() -> None:
    c = Cluster("ABCD", delay=10)
    c.available -= {"B", "C"}
    decisions = c.apply(1.0, c.sm.on_bookies_changed(c.available, 10, 1.0))
    assert decisions == [RunAuditNow(AuditReason.MULTIPLE_FAILURES, frozenset("BC"))]


def test_s45_rolling_upgrade_cancels_then_delays_the_next() -> None:
    c = Cluster("ABCD", delay=5)
    c.kill("B", 0.0)
    c.advance(2.0)
    assert c.start("B", 2.0) == [CancelPendingAudit()]
    assert c.kill("C", 2.1) == [ScheduleAudit(7.1, 2)]
    c.advance(4.1)
    assert c.audit_times(after=0.0) == []
    c.advance(8.1)
    assert c.audits[-1] == (7.1, RunAuditNow(AuditReason.DELAY_EXPIRED, frozenset("C")))
    assert c.sm.counters == {
        NUM_BOOKIE_AUDITS_DELAYED: 2,
        NUM_DELAYED_BOOKIE_AUDITS_CANCELLED: 1,
        NUM_SKIPPING_CHECK_TASK_TIMES: 0,
    }


def test_s45_return_and_loss_in_one_event() -> None:
    c = Cluster("ABCD", delay=5)
    c.kill("B", 0.0)
    c.available = set("ABD")  # B back, C gone, seen as one change
    decisions = c.apply(2.0, c.sm.on_bookies_changed(c.available, 5, 2.0))
    assert decisions == [CancelPendingAudit(), ScheduleAudit(7.0, 2)]
    assert c.sm.bookies_to_audit == {"C"}


def test_returning_bookie_is_known_again_and_can_be_lost_again() -> None:
    c = Cluster("ABC", delay=5)
    c.kill("C", 0.0)
    c.start("C", 1.0)
    assert c.sm.known_bookies == set("ABC")
    assert c.kill("C", 2.0) == [ScheduleAudit(7.0, 2)]


def test_other_bookie_joining_keeps_the_pending_audit() -> None:
    c = Cluster("ABC", delay=5)
    c.kill("C", 0.0)
    assert c.start("D", 1.0) == []
    assert c.sm.pending_at == 5.0 and c.sm.bookies_to_audit == {"C"}


def test_delay_read_as_zero_at_a_bookie_change_runs_now_and_cancels_pending() -> None:
    # The delay was set to 0 and a bookie change is processed before the
    # delay-change event: upstream runs the audit and leaves the pending one
    # to fire later; here it is cancelled as well.
    c = Cluster("ABCD", delay=5)
    c.kill("C", 0.0)
    c.delay = 0
    assert c.start("E", 1.0) == [
        CancelPendingAudit(),
        RunAuditNow(AuditReason.NO_DELAY, frozenset("C")),
    ]
    assert not c.sm.audit_pending


def test_delay_change_without_pending_audit_only_records_the_value() -> None:
    c = Cluster("ABC", delay=5)
    assert c.set_delay(9, 1.0) == []
    assert c.sm.delay_before_change == 9
    assert c.sm.counters[NUM_BOOKIE_AUDITS_DELAYED] == 0
