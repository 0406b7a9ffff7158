"""The one back-off rule (`auditor.backoff`): exact sequences, the cap, jitter bounds."""

from __future__ import annotations

import random

import pytest

from auditor.backoff import Backoff
from auditor.worker.loop import failed_delay


def test_without_jitter_the_wait_doubles_exactly_up_to_the_cap() -> None:
    b = Backoff(initial=0.1, maximum=10.0)
    waits = [b.draw(n) for n in range(1, 11)]
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0])
    assert b.draw(1) == b.ceiling(1)


def test_the_standby_index_sequence() -> None:
    b = Backoff(initial=10.0, maximum=600.0)
    assert [b.ceiling(n) for n in range(1, 9)] == [10, 20, 40, 80, 160, 320, 600, 600]


def test_no_failure_yet_counts_as_the_first() -> None:
    b = Backoff(initial=2.0, maximum=60.0)
    assert b.ceiling(0) == b.ceiling(-3) == b.ceiling(1) == 2.0


def test_a_long_streak_stays_at_the_cap_without_overflow() -> None:
    b = Backoff(initial=1.0, maximum=120.0)
    assert b.ceiling(10_000) == 120.0
    assert b.ceiling(2**40) == 120.0
    assert isinstance(b.ceiling(3), float)


def test_an_initial_above_the_cap_waits_the_cap() -> None:
    b = Backoff(initial=30.0, maximum=10.0)
    assert [b.ceiling(n) for n in (1, 2, 5)] == [10.0, 10.0, 10.0]


def test_another_factor() -> None:
    b = Backoff(initial=1.0, maximum=100.0, factor=3.0)
    assert [b.ceiling(n) for n in range(1, 7)] == [1, 3, 9, 27, 81, 100]


def test_half_jitter_draws_between_half_and_all_of_the_ceiling() -> None:
    b = Backoff(initial=1.0, maximum=8.0, jitter=0.5)
    rng = random.Random(7)
    for n in range(1, 8):
        top = b.ceiling(n)
        draws = [b.draw(n, rng) for _ in range(500)]
        assert all(top / 2 <= w <= top for w in draws)
        assert max(draws) - min(draws) > top / 4  # it does spread


def test_full_jitter_may_go_down_to_zero() -> None:
    b = Backoff(initial=4.0, maximum=4.0, jitter=1.0)
    rng = random.Random(3)
    draws = [b.draw(1, rng) for _ in range(500)]
    assert all(0.0 <= w <= 4.0 for w in draws)
    assert min(draws) < 0.5


def test_the_same_seed_draws_the_same_waits() -> None:
    b = Backoff(initial=1.0, maximum=120.0, jitter=0.5)
    first = [b.draw(n, random.Random(42)) for n in range(1, 10)]
    again = [b.draw(n, random.Random(42)) for n in range(1, 10)]
    assert first == again
    expected = [random.Random(42).uniform(b.ceiling(n) / 2, b.ceiling(n)) for n in range(1, 10)]
    assert first == expected


def test_jitter_needs_a_random_source() -> None:
    with pytest.raises(ValueError, match=r"random\.Random"):
        Backoff(initial=1.0, maximum=2.0, jitter=0.5).draw(1)


@pytest.mark.parametrize(
    ("initial", "maximum", "factor", "jitter"),
    [(-1.0, 1.0, 2.0, 0.0), (1.0, -1.0, 2.0, 0.0), (1.0, 2.0, 0.5, 0.0), (1.0, 2.0, 2.0, 1.5)],
)
def test_nonsense_settings_are_refused(
    initial: float, maximum: float, factor: float, jitter: float
) -> None:
    with pytest.raises(ValueError, match="back-off"):
        Backoff(initial, maximum, factor, jitter)


def test_the_workers_failed_ledger_delay_is_upstreams_schedule_through_the_one_rule() -> None:
    """Upstream's ReplicationWorker waits grace/32 (whole ms), doubling per earlier failure,
    then the whole grace: at its default grace of 300,000 ms, 9.375 s to 150 s, then 300 s;
    a grace whose 32nd is not whole caps at the grace, not at the doubled floor."""
    assert [failed_delay(300_000, n) for n in range(7)] == [
        9.375,
        18.75,
        37.5,
        75.0,
        150.0,
        300.0,
        300.0,
    ]
    assert [failed_delay(1_000, n) for n in range(6)] == [0.031, 0.062, 0.124, 0.248, 0.496, 1.0]
