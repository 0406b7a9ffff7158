"""Since when each bookie is missing, as every daemon (followers too) observes it."""

from __future__ import annotations

from auditor.schedule.bookie_sightings import BookieSightings


def test_a_bookie_seen_then_gone_is_missing_from_the_first_observation_without_it() -> None:
    s = BookieSightings()
    assert not s.observed
    s.observe({"a", "b", "c"}, 1.0)
    assert s.observed and s.missing_since() == {}
    s.observe({"a", "b"}, 2.0)
    s.observe({"a"}, 3.0)
    assert s.missing_since() == {"c": 2.0, "b": 3.0}
    s.observe({"a"}, 4.0)  # still missing: the earlier moment stands
    assert s.missing_since() == {"c": 2.0, "b": 3.0}


def test_a_returning_bookie_is_no_longer_missing_and_can_go_again() -> None:
    s = BookieSightings()
    s.observe({"a", "b"}, 1.0)
    s.observe({"a"}, 2.0)
    s.observe({"a", "b"}, 3.0)
    assert s.missing_since() == {}
    s.observe({"a"}, 9.0)
    assert s.missing_since() == {"b": 9.0}


def test_a_bookie_never_seen_is_not_known_to_be_missing() -> None:
    s = BookieSightings()
    s.observe({"a"}, 1.0)
    assert s.missing_since() == {}
    assert "z" not in s.missing_since()
