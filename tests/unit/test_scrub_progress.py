"""The scrub's progress rules (`checks/scrub_progress.py`): a cycle from its first read to
its rest and the next, the cursor past each chunk, the pace that ends a cycle in time,
the share and the expected end, and a record that does not decode named, never used; and
the budget taking a new pace between chunks (`scrub_pace.ByteBudget.set_rate`)."""

from __future__ import annotations

import pytest

from auditor.checks.scrub_pace import ByteBudget
from auditor.checks.scrub_progress import (
    MIN_RATE,
    ProgressFormatError,
    Read,
    Rest,
    ScrubProgress,
    advance,
    decode,
    encode,
    expected_end,
    finish,
    next_step,
    pace,
    verified_share,
)

DAY = 86400.0
WEEK = 7 * DAY


def test_a_cycle_from_no_record_to_its_rest_and_the_next() -> None:
    step = next_step(None, 1000.0, WEEK)
    assert step == Read(ScrubProgress(cycle=1, started=1000.0), new=True)
    p = advance(step.progress, 41, bytes_verified=500, ledgers=7)
    assert p == ScrubProgress(cycle=1, started=1000.0, cursor=42, bytes=500, ledgers=7)
    # Under way: read on from the cursor, whatever the time.
    assert next_step(p, 1000.0 + 2 * WEEK, WEEK) == Read(p)
    done = finish(p, 5000.0, 99, bytes_verified=100, ledgers=3)
    assert done == ScrubProgress(1, 1000.0, 100, 600, 10, 0, 5000.0)
    # Done: rest until a week after the cycle started, then cycle 2 from ledger 0 with
    # cycle 1's bytes as its estimate.
    assert next_step(done, 5001.0, WEEK) == Rest(1000.0 + WEEK)
    assert next_step(done, 1000.0 + WEEK - 0.001, WEEK) == Rest(1000.0 + WEEK)
    assert next_step(done, 1000.0 + WEEK, WEEK) == Read(
        ScrubProgress(cycle=2, started=1000.0 + WEEK, previous_bytes=600), new=True
    )


def test_the_cursor_never_goes_back_and_a_walk_that_found_nothing_leaves_it() -> None:
    p = ScrubProgress(cycle=3, started=0.0, cursor=50)
    assert advance(p, 10, 0, 0).cursor == 50
    assert finish(p, 9.0, None, 0, 0) == ScrubProgress(3, 0.0, 50, finished=9.0)
    assert advance(p, 2**63 - 1, 0, 0).cursor == 2**63


def test_the_pace_spreads_what_is_left_over_the_time_left_within_the_ceiling() -> None:
    ceiling = 8 * 1024 * 1024.0
    # The first cycle knows no size: the ceiling (0 stays "no budget").
    first = ScrubProgress(cycle=1, started=0.0)
    assert pace(first, 10.0, WEEK, ceiling, 5) == ceiling
    assert pace(first, 10.0, WEEK, 0.0, 5) == 0.0
    # 6 TiB verified last cycle, 1 TiB this one, half the week gone, 4 bookies:
    # 5 TiB over 3.5 days over 4 bookies.
    tib = 2**40
    p = ScrubProgress(cycle=2, started=0.0, bytes=tib, previous_bytes=6 * tib)
    assert pace(p, WEEK / 2, WEEK, ceiling, 4) == 5 * tib / (WEEK / 2) / 4
    assert pace(p, WEEK / 2, WEEK, 0.0, 4) == 5 * tib / (WEEK / 2) / 4
    # Above the ceiling: the ceiling (the cycle will overrun).
    assert pace(p, WEEK - 60, WEEK, ceiling, 4) == ceiling
    # Little left: the floor, not a trickle.
    small = ScrubProgress(cycle=2, started=0.0, bytes=0, previous_bytes=1000)
    assert pace(small, 0.0, WEEK, ceiling, 4) == MIN_RATE
    assert pace(small, 0.0, WEEK, 1000.0, 4) == 1000.0
    # Behind the estimate (the cluster grew) or past the interval: the ceiling.
    grown = ScrubProgress(cycle=2, started=0.0, bytes=7 * tib, previous_bytes=6 * tib)
    assert pace(grown, 10.0, WEEK, ceiling, 4) == ceiling
    assert pace(p, WEEK + 1, WEEK, ceiling, 4) == ceiling
    assert pace(p, 10.0, WEEK, ceiling, 0) == ceiling


def test_the_share_and_the_expected_end() -> None:
    # The first cycle: by ids, the cursor over the largest id + 1.
    first = ScrubProgress(cycle=1, started=100.0, cursor=250)
    assert verified_share(first, 999) == 0.25
    assert verified_share(first, None) == 0.0
    assert verified_share(ScrubProgress(1, 0.0, cursor=5000), 999) == 1.0
    assert expected_end(first, 200.0, 0.25) == 100.0 + 100.0 / 0.25
    assert expected_end(first, 200.0, 0.0) is None
    # Later cycles: by bytes against the last cycle's.
    later = ScrubProgress(cycle=2, started=0.0, cursor=1, bytes=300, previous_bytes=1200)
    assert verified_share(later, 10**9) == 0.25
    done = ScrubProgress(cycle=2, started=0.0, bytes=5, previous_bytes=1200, finished=77.0)
    assert verified_share(done, 10) == 1.0
    assert expected_end(done, 500.0, 1.0) == 77.0


def test_the_record_round_trips_small_and_a_bad_one_is_named() -> None:
    p = ScrubProgress(7, 1795945114.5, 2**63, 2**62, 10**6, 2**61, 1795945999.25)
    data = encode(p)
    assert decode(data) == p
    assert len(data) < 200  # whatever the cluster's size
    assert decode(encode(ScrubProgress(1, 5.0))) == ScrubProgress(1, 5.0)
    cases = {
        b"\xff\x00": "not JSON",
        b"[]": "not a JSON object",
        b'{"format": 2}': "format 2, not 1",
        data.replace(b'"cycle":7', b'"cycle":0'): "cycle must be an integer in 1..",
        data.replace(b'"cycle":7', b'"cycle":true'): "cycle must be an integer",
        data.replace(b'"cursor":9223372036854775808', b'"cursor":-1'): "cursor must be",
        data.replace(b'"started":1795945114.5', b'"started":"x"'): "started must be a unix time",
        b"{" + b" " * 5000 + b"}": "more than a record's 4096",
    }
    for bad, message in cases.items():
        with pytest.raises(ProgressFormatError) as err:
            decode(bad)
        assert message in str(err.value), (bad[:40], str(err.value))


def test_a_new_rate_keeps_what_the_old_one_earned_up_to_the_new_burst() -> None:
    """`ByteBudget.set_rate`, as the daemon's pace changes between chunks, on a clock of
    the test's own."""
    now = [0.0]
    budget = ByteBudget(1000.0, clock=lambda: now[0])
    budget.spend(3000)  # 2000 bytes of debt: two seconds at 1000/s
    assert budget.delay() == 2.0
    now[0] = 1.0  # 1000 earned: 1000 of debt left
    budget.set_rate(500.0)  # the debt stays, now repaid at 500/s
    assert budget.delay() == 2.0
    now[0] = 10.0  # earned far more than the burst: capped at one second's worth (500)
    budget.set_rate(250.0)  # and a smaller burst caps it again (250)
    budget.spend(250)
    assert budget.delay() == 0.0
    budget.spend(250)
    assert budget.delay() == 1.0
    # From no budget (0) to one: nothing earned while unlimited, a full bucket... of 0.
    free = ByteBudget(0.0, clock=lambda: now[0])
    free.spend(10**9)
    assert free.delay() == 0.0
    free.set_rate(100.0)
    free.spend(100)
    assert free.delay() == 1.0
    with pytest.raises(ValueError):
        free.set_rate(-1.0)
