"""The one form every report writes instants in, and reads them back from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from auditor.timefmt import from_iso, iso, iso_datetime


@pytest.mark.parametrize(
    ("ts", "text"),
    [
        (0.0, "1970-01-01T00:00:00Z"),
        (1714564800.0, "2024-05-01T12:00:00Z"),
        (1714564800.5, "2024-05-01T12:00:00.500000Z"),
        (1714564800.123456, "2024-05-01T12:00:00.123456Z"),
    ],
)
def test_iso_round_trips(ts: float, text: str) -> None:
    assert iso(ts) == text
    assert from_iso(text) == ts


def test_a_datetime_is_written_in_utc() -> None:
    noon_utc = datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert iso_datetime(noon_utc) == "2024-05-01T12:00:00Z"
    plus_two = noon_utc.astimezone(timezone(timedelta(hours=2)))
    assert iso_datetime(plus_two) == "2024-05-01T12:00:00Z"


def test_from_iso_refuses_what_is_no_time() -> None:
    with pytest.raises(ValueError):
        from_iso("yesterday")
