"""The replicas check's re-check rule, per (ledger, bookie): streaks, due bookies, the bound.

`RecheckRule` with retry_attempts R: a silent bookie is due once it has not
answered on R + 1 looks in a row; a ledger is looked at again while one of its
silent bookies is not due, at most 2R re-checks (looks 1..2R after look 0).
"""

from __future__ import annotations

import pytest

from auditor.bookie.availability import Availability
from auditor.checks.findings import Category
from auditor.checks.replicas import BookieAnswer, Listed, Unanswered, analyse, verdict_violations
from auditor.checks.replicas_retry import NO_SILENCE, RecheckRule, RetryQueue, Silence
from auditor.testing.cluster import make_metadata

A, B, C = "a:3181", "b:3181", "c:3181"


def looks(*silent: set[str]) -> Silence:
    """The silence after one look per argument, each with those bookies silent."""
    s = NO_SILENCE
    for bookies in silent:
        s = s.after(bookies)
    return s


def test_a_streak_counts_looks_in_a_row_and_ends_when_the_bookie_answers() -> None:
    assert looks({A}) == Silence(1, ((A, 1),))
    assert looks({A}, {A, B}) == Silence(2, ((A, 2), (B, 1)))
    # A answered on look 2: silent again on look 3, it starts a new streak.
    assert looks({A}, {A, B}, {B}, {A, B}) == Silence(4, ((A, 1), (B, 3)))


def test_each_bookie_that_falls_silent_is_owed_its_own_rechecks() -> None:
    rule = RecheckRule(2)
    # Seed 5151: A silent from look 0, B from look 2 (A's last re-check).
    s = looks({A}, {A}, {A, B})
    assert rule.due(s) == {A: 3} and rule.waits(s)
    s = s.after({A, B})
    assert rule.due(s) == {A: 4} and rule.waits(s)
    s = s.after({A, B})
    assert rule.due(s) == {A: 5, B: 3} and not rule.waits(s)
    # B back on look 4: A alone is due, and nothing waits.
    s = looks({A}, {A}, {A, B}, {A, B}, {A})
    assert rule.due(s) == {A: 5} and not rule.waits(s)


@pytest.mark.parametrize("attempts", [0, 1, 2, 3])
def test_one_bookie_silent_throughout_is_due_after_its_attempts_as_before(attempts: int) -> None:
    rule = RecheckRule(attempts)
    s = NO_SILENCE
    for look in range(attempts):
        s = s.after({A})
        assert rule.waits(s) and rule.due(s) == {}, look
    s = s.after({A})
    assert not rule.waits(s) and rule.due(s) == {A: attempts + 1}


def test_bookies_taking_turns_stop_at_twice_the_attempts() -> None:
    rule = RecheckRule(2)
    assert rule.bound == 4
    s = looks({A}, {B}, {A}, {B})  # looks 0-3: each silence new, none due
    assert rule.waits(s) and rule.due(s) == {}
    s = s.after({A})  # look 4 = re-check 4: the bound; A is silent on it only
    assert not rule.waits(s) and rule.due(s) == {}


def test_a_second_silence_within_the_first_ones_rechecks_gets_all_of_its_own() -> None:
    """Every bookie falling silent by look R is due or back by look 2R: never cut short."""
    attempts = 3
    rule = RecheckRule(attempts)
    for start in range(attempts + 1):
        s = NO_SILENCE
        for look in range(start + attempts + 1):
            s = s.after({A} | ({B} if look >= start else set()))
            if look < start + attempts:
                assert rule.waits(s), (start, look)
        assert not rule.waits(s) and set(rule.due(s)) == {A, B}, start


def test_a_scan_stage_takes_silent_bookies_as_silent_since_the_first_look() -> None:
    """A scan hands on ledger ids only: per ledger, as its stages always counted."""
    rule = RecheckRule(2)
    s = Silence.since_first(1).after({A, B})  # re-check 1
    assert s == Silence(2, ((A, 2), (B, 2))) and rule.waits(s)
    s = Silence.since_first(2).after({B})  # re-check 2, the last
    assert s == Silence(3, ((B, 3),)) and not rule.waits(s) and rule.due(s) == {B: 3}


def test_the_queue_gives_back_each_ledger_with_its_silence_in_order() -> None:
    queue = RetryQueue()
    waiting = [
        (9, looks({A})),
        (3, NO_SILENCE),
        (2**63 - 1, looks({A}, {A, B}, {C})),
        (5, looks({B, C})),
    ]
    for ledger_id, silence in waiting:
        queue.add(ledger_id, silence)
    assert len(queue) == 4 and list(queue) == [9, 3, 2**63 - 1, 5]
    assert list(queue.waiting()) == waiting
    assert not RetryQueue() and list(RetryQueue().waiting()) == []


def test_silent_bookies_are_reported_only_when_due_with_their_own_count() -> None:
    md = make_metadata(7, [A, B, C], write_quorum=3, last_entry_id=4)
    answers: dict[str, BookieAnswer] = {
        A: Unanswered("EIO"),
        B: Unanswered("timeout"),
        C: Listed(Availability.from_entries(range(5))),
    }
    v = analyse(md, answers)
    found = verdict_violations(md, v, 0, {A, B, C}, {A: 5})
    assert [(x.category, x.bookie, x.detail["attempts"]) for x in found] == [
        (Category.BOOKIE_UNAVAILABLE_REGISTERED, A, 5)
    ]
    assert verdict_violations(md, v, 0, {A, B, C}, {}) == []
    # One count for all (explain, and a scan stage's last re-check): every silent one.
    assert [(x.bookie, x.detail["attempts"]) for x in verdict_violations(md, v, 0, {A, B}, 3)] == [
        (A, 3),
        (B, 3),
    ]
