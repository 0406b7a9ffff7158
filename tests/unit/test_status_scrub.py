"""The continuous scrub in `status`: the gRPC message, the `--json` object and the text line
agree, under way and done (`api/convert.py`: `scrub_status`, `scrub_json`, `scrub_text`)."""

from __future__ import annotations

from auditor.api.convert import scrub_json, scrub_status, scrub_text, status_json, status_response
from auditor.daemon.state import DaemonState, ScrubStatus

#: 2026-01-01T00:00:00Z and a week.
T0 = 1767225600.0
WEEK = 7 * 86400.0


def under_way() -> ScrubStatus:
    return ScrubStatus(
        cycle=3,
        started=T0,
        interval=WEEK,
        cursor=12345,
        bytes=1234567,
        ledgers=300,
        previous_bytes=2963000,
        share=0.25,
        expected_end=T0 + 4 * 86400,
        finished=None,
        rest_until=None,
        rate=8388608.0,
        updated=T0 + 86400,
    )


def test_a_cycle_under_way() -> None:
    doc = scrub_json(scrub_status(under_way()))
    assert doc == {
        "cycle": 3,
        "started": "2026-01-01T00:00:00Z",
        "interval_s": WEEK,
        "cursor": 12345,
        "bytes_verified": 1234567,
        "ledgers": 300,
        "previous_cycle_bytes": 2963000,
        "share": 0.25,
        "expected_end": "2026-01-05T00:00:00Z",
        "finished": None,
        "next_cycle": None,
        "rate": 8388608.0,
        "updated": "2026-01-02T00:00:00Z",
    }
    assert scrub_text(doc) == (
        "cycle 3, 25.0% verified since 2026-01-01T00:00:00Z (cursor at ledger 12,345; "
        "300 ledgers, 1,234,567 bytes); expected end 2026-01-05T00:00:00Z, target "
        "2026-01-08T00:00:00Z; pace 8,388,608 bytes/s a bookie"
    )
    unknown = {**doc, "expected_end": None, "rate": 0.0}
    assert scrub_text(unknown).endswith(
        "expected end not known yet, target 2026-01-08T00:00:00Z; pace no budget"
    )


def test_a_cycle_done_and_none_on_a_follower() -> None:
    s = under_way()
    done = ScrubStatus(**{**s.to_json(), "finished": T0 + 86400, "rest_until": T0 + WEEK})
    state = DaemonState("a:1")
    assert status_json(status_response(state))["scrub"] is None
    state.scrub = done
    doc = status_json(status_response(state))["scrub"]
    assert scrub_text(doc) == (
        "cycle 3 done at 2026-01-02T00:00:00Z (300 ledgers, 1,234,567 bytes); "
        "next cycle at 2026-01-08T00:00:00Z"
    )
