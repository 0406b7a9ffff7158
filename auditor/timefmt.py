"""Check reports, risk and what-if reports, snapshots and the admin API's JSON all carry
instants, which should sort as text and read the same as the `timestamp` of the JSON log
lines, so all of them write one form.

Times as every report writes them: ISO 8601 in UTC with a `Z`.

For example `2024-05-01T12:00:00.500000Z`, or `2024-05-01T12:00:00Z` on a whole second;
`from_iso` reads them back.
"""

from __future__ import annotations

from datetime import UTC, datetime


def iso_datetime(when: datetime) -> str:
    """An aware datetime in the reports' form (converted to UTC)."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def iso(ts: float) -> str:
    """Seconds since the epoch in the reports' form."""
    return iso_datetime(datetime.fromtimestamp(ts, UTC))


def from_iso(text: str) -> float:
    """Seconds since the epoch of a time `iso` wrote (any ISO 8601 form); ValueError if none."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
