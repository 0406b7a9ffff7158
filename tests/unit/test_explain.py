"""The pure assembly of `explain`: copies on ranges, and verdicts from plain inputs."""

from __future__ import annotations

import time

from auditor.analysis.explain import ExplainInputs, LedgerCheckResult, copies_json, explain
from auditor.bookie.availability import Availability
from auditor.checks.placement import PlacementPolicy
from auditor.checks.replicas import BookieAnswer, Listed, Probed, Unanswered
from auditor.metadata.model import LedgerMetadata, LedgerState, Segment
from auditor.metadata.registry import BookieSet

BOOKIES = ("b0:3181", "b1:3181", "b2:3181")
N = 10_000_000


def ledger(e: int, w: int, a: int, last: int) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=5,
        format_version=3,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        state=LedgerState.CLOSED,
        segments=(Segment(0, BOOKIES[:e]),),
        last_entry_id=last,
    )


def inputs(md: LedgerMetadata, answers: dict[str, BookieAnswer]) -> ExplainInputs:
    return ExplainInputs(
        md=md,
        path="/ledgers/00/0000/L0005",
        znode_version=2,
        answers=answers,
        locations={"b0:3181": "/r0", "b1:3181": "/r1", "b2:3181": "/r2"},
        rack_sources={},
        policy=PlacementPolicy(),
        registered=BookieSet(frozenset(BOOKIES), frozenset()),
        mark=None,
        grace_period_s=0,
        now_ms=0,
        ledgers=LedgerCheckResult(None),
    )


def test_ten_million_entries_are_counted_on_ranges() -> None:
    md = ledger(3, 3, 2, N - 1)
    full = Availability.from_runs([(0, N)])
    holed = Availability.from_runs([(0, 5_000_000), (5_000_100, N - 5_000_100)])
    answers: dict[str, BookieAnswer] = {
        "b0:3181": Listed(full),
        "b1:3181": Listed(holed),
        "b2:3181": Listed(full),
    }
    started = time.monotonic()
    seg = next(md.segment_ranges())
    assert copies_json(md, seg, answers) == {
        "min_copies": 2,
        "status": "below_write_quorum",
        "ranges": [
            {"entries": [0, 4_999_999], "copies": 3, "status": "ok"},
            {"entries": [5_000_000, 5_000_099], "copies": 2, "status": "below_write_quorum"},
            {"entries": [5_000_100, N - 1], "copies": 3, "status": "ok"},
        ],
        "ranges_total": 3,
        "entries_by_copies": {"2": 100, "3": N - 100},
    }
    assert time.monotonic() - started < 1.0  # ranges, not entries


def test_probed_and_unanswered_bookies() -> None:
    md = ledger(3, 2, 2, 6)
    answers: dict[str, BookieAnswer] = {
        "b0:3181": Listed(Availability.from_entries([0, 2, 3, 5, 6])),
        # Index 1 holds 0,1,3,4,6: its first and last were read, the last is gone.
        "b1:3181": Probed({0: True, 6: False}),
        "b2:3181": Unanswered("timeout after 5s"),
    }
    doc = explain(inputs(md, answers))
    rows = doc["segments"][0]["bookies"]
    assert rows[1] == {
        "index": 1,
        "bookie": "b1:3181",
        "rack": "/r1",
        "rack_source": None,
        "registration": "writable",
        "expected_entries": 5,
        "answer": "probed",
        "probed_present": [0],
        "probed_absent": [6],
    }
    assert rows[2]["answer"] == "unanswered" and rows[2]["reason"] == "timeout after 5s"
    # Entry 6 is on indexes 0 and 1; the unanswered bookie's copies are assumed present.
    assert doc["segments"][0]["copies"]["ranges"] == [
        {"entries": [0, 5], "copies": 2, "status": "ok"},
        {"entries": [6, 6], "copies": 1, "status": "below_ack_quorum"},
    ]
    replicas = doc["checks"]["replicas"]
    assert [(v["category"], v["bookie"]) for v in replicas["violations"]] == [
        ("below_ack_quorum", None),
        ("bookie_unavailable_registered", "b2:3181"),
    ]
    assert replicas["violations"][1]["detail"] == {
        "reason": "timeout after 5s",
        "attempts": 1,
        "segments": [[0, 6]],
        "metadata_version": 2,
    }
    assert doc["categories"] == ["below_ack_quorum", "bookie_unavailable_registered"]
