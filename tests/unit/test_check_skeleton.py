"""The check drivers' shared skeleton: the run recorder and the bounded task pool.

(The re-read loop, `reread.Reread`, needs ZooKeeper; the replicas and ledger
checks' integration tests and the bookie-fault tests exercise it.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from auditor.checks.findings import (
    Category,
    Check,
    CheckReport,
    Coverage,
    DropCause,
    LedgerOutcome,
    Outcome,
    SkipReason,
    Violation,
)
from auditor.checks.pool import bounded
from auditor.checks.recorder import RunRecorder
from auditor.logs import get_logger
from auditor.metadata.ledger_tree import WalkStats
from auditor.metadata.serde import LedgerMetadataFormatError
from auditor.metadata.walk import LedgerRecord

# --- the recorder ------------------------------------------------------------------------


def recorder(check: Check = Check.REPLICAS) -> tuple[RunRecorder, list[LedgerOutcome]]:
    rows: list[LedgerOutcome] = []
    report = CheckReport(check, started_at=1.0)
    return RunRecorder(report, get_logger(), rows.append, clock=lambda: 9.0), rows


def late(ledger_id: int) -> Violation:
    return Violation(ledger_id, Category.UNDERREPLICATED_PAST_GRACE_PERIOD, None, {"age_s": 7})


def test_each_outcome_goes_to_the_report_and_to_the_rows_once() -> None:
    rec, rows = recorder()
    with capture_logs() as logs:
        rec.ok(1, 3, coverage=Coverage(listed=2, probed=1))
        rec.skipped(2, SkipReason.OPEN, 4)
        rec.violation(3, 5, [late(3)], coverage=Coverage(unverified=1))
        rec.skipped(4, SkipReason.DELETED)
    assert rows == [
        LedgerOutcome(Check.REPLICAS, 1, Outcome.OK, None, 3, 2, 1, 0),
        LedgerOutcome(Check.REPLICAS, 2, Outcome.SKIPPED, "open", 4),
        LedgerOutcome(Check.REPLICAS, 3, Outcome.VIOLATION, None, 5, 0, 0, 1),
        LedgerOutcome(Check.REPLICAS, 4, Outcome.SKIPPED, "deleted", -1),
    ]
    report = rec.report
    assert report.ledgers_checked == 2
    assert report.ledgers_skipped == {"open": 1, "deleted": 1}
    assert report.violations == [late(3)]
    assert report.coverage == Coverage(listed=2, probed=1, unverified=1)
    assert logs == [
        {
            "event": "violation",
            "log_level": "warning",
            "check": "replicas",
            "ledger_id": 3,
            "category": "underreplicated_past_grace_period",
            "bookie": None,
            "age_s": 7,
        }
    ]


def test_a_driver_can_describe_its_violation_lines() -> None:
    rec, _ = recorder(Check.PLACEMENT)
    v = Violation(8, Category.PLACEMENT_NOT_ADHERING, None, {"segments": []})
    with capture_logs() as logs:
        rec.violation(8, 0, [v], lines=[("placement violation", {"ledger_id": 8, "x": 1})])
    assert logs == [
        {
            "event": "placement violation",
            "log_level": "warning",
            "check": "placement",
            "ledger_id": 8,
            "x": 1,
        }
    ]
    with pytest.raises(ValueError):
        rec.violation(9, 0, [])


@pytest.mark.parametrize(
    ("check", "event"),
    [
        (Check.REPLICAS, "violation"),
        (Check.LEDGERS, "violation"),
        (Check.PLACEMENT, "metadata invalid"),
        (Check.METADATA, "metadata invalid"),
    ],
)
def test_metadata_invalid_has_the_same_evidence_everywhere(check: Check, event: str) -> None:
    rec, rows = recorder(check)
    path = "/ledgers/00/0000/L0006"
    broken = LedgerRecord(6, path, None, 2, LedgerMetadataFormatError(6, "truncated"))
    with capture_logs() as logs:
        rec.metadata_invalid(broken)
    detail = {"reason": "truncated", "path": path, "metadata_version": 2}
    assert rec.report.violations == [Violation(6, Category.METADATA_INVALID, None, detail)]
    assert rows == [LedgerOutcome(check, 6, Outcome.VIOLATION, None, 2)]
    assert rec.report.ledgers_checked == 1
    assert logs == [
        {
            "event": event,
            "log_level": "warning",
            "check": str(check),
            "ledger_id": 6,
            "category": "metadata_invalid",
            "bookie": None,
            **detail,
        }
    ]


def test_a_driver_reason_overrides_the_decoder() -> None:
    rec, _ = recorder(Check.LEDGERS)
    md_less = LedgerRecord(6, "/p", None, 2)
    rec.metadata_invalid(md_less, "ensemble size 0")
    rec.metadata_invalid(md_less)
    assert [v.detail["reason"] for v in rec.report.violations] == [
        "ensemble size 0",
        "metadata missing",
    ]


def test_settle_counts_a_drop_only_for_a_doubted_ledger_with_nothing_reported(
    info_logs: list[MutableMapping[str, Any]],
) -> None:
    # `info_logs`: the drop lines are at info level, which an earlier test's logging
    # set-up may filter out of a plain capture.
    logs = info_logs
    rec, _ = recorder()
    rec.settle(rec.ok(1), None)  # never in doubt
    rec.settle(rec.ok(2), DropCause.RETRY_SUCCEEDED)
    rec.settle(rec.violation(3, 0, [late(3)]), DropCause.RETRY_SUCCEEDED)  # reported
    # The skip names the cause better than the doubt before it.
    rec.settle(rec.skipped(4, SkipReason.UNDERREPLICATED), DropCause.RETRY_SUCCEEDED)
    rec.settle(rec.skipped(5, SkipReason.DELETED), DropCause.METADATA_CHANGED)
    rec.settle(rec.skipped(6, SkipReason.METADATA_CHANGING), DropCause.RETRY_SUCCEEDED)
    rec.settle(rec.skipped(7, SkipReason.OPEN), DropCause.METADATA_CHANGED)
    assert rec.report.dropped == {
        "retry_succeeded": 1,
        "marked_meanwhile": 1,
        "ledger_deleted": 1,
        "metadata_changed": 2,
    }
    dropped = [
        (e["ledger_id"], e["cause"]) for e in logs if e["event"] == "would-be violation dropped"
    ]
    assert dropped == [
        (2, "retry_succeeded"),
        (4, "marked_meanwhile"),
        (5, "ledger_deleted"),
        (6, "metadata_changed"),
        (7, "metadata_changed"),
    ]


class _Walked:
    def __init__(self, deleted: int) -> None:
        self.stats = WalkStats(deleted_during_walk=deleted)


def test_finish_counts_ledgers_deleted_during_the_walk_and_sorts_the_marks() -> None:
    rec, _ = recorder()
    rec.skipped(1, SkipReason.DELETED)
    rec.report.marked_underreplicated.extend([9, 3, 5])
    report = rec.finish(_Walked(2))  # type: ignore[arg-type]
    assert report is rec.report
    assert (report.ledgers_skipped, report.marked_underreplicated, report.finished_at) == (
        {"deleted": 3},
        [3, 5, 9],
        9.0,
    )


def test_without_a_sink_nothing_is_lost_from_the_report() -> None:
    rec = RunRecorder(CheckReport(Check.GRACE, started_at=0.0), get_logger())
    assert rec.ok(1) == LedgerOutcome(Check.GRACE, 1, Outcome.OK)
    assert rec.report.ledgers_checked == 1


# --- the pool ----------------------------------------------------------------------------


async def test_the_pool_never_runs_more_than_its_limit() -> None:
    running = 0
    peak = 0
    done: list[int] = []

    async def work(n: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        for _ in range(3):
            await asyncio.sleep(0)
        running -= 1
        done.append(n)

    await bounded(range(20), work, 4)
    assert (sorted(done), peak) == (list(range(20)), 4)


async def test_the_pool_takes_an_item_only_when_a_slot_is_free() -> None:
    gates = [asyncio.Event() for _ in range(5)]
    finished = [asyncio.Event() for _ in range(5)]
    done: list[int] = []
    seen: list[int] = []  # how many were done when each item was read

    async def items() -> AsyncIterator[int]:
        for n in range(5):
            seen.append(len(done))
            yield n

    async def work(n: int) -> None:
        await gates[n].wait()
        done.append(n)
        finished[n].set()

    pool = asyncio.create_task(bounded(items(), work, 2))
    for n in range(5):
        gates[n].set()
        await finished[n].wait()
    await pool
    # Two in progress and one read ahead, waiting for a slot: never more.
    assert seen[:3] == [0, 0, 0]
    assert all(seen[n] >= n - 2 for n in range(5)), seen


async def test_a_failure_stops_the_intake_lets_the_work_in_progress_finish_and_is_raised() -> None:
    finished: list[int] = []
    started: list[int] = []
    others_may_finish = asyncio.Event()

    async def work(n: int) -> None:
        started.append(n)
        if n == 1:
            raise RuntimeError("boom")
        await others_may_finish.wait()
        finished.append(n)

    async def items() -> AsyncIterator[int]:
        for n in range(10):
            if n == 3:
                others_may_finish.set()
            yield n

    with pytest.raises(RuntimeError, match="boom"):
        await bounded(items(), work, 3)
    # 3 waited for the slot 1 freed by failing; when 4 was read, the failure was known.
    assert started == [0, 1, 2, 3]
    assert sorted(finished) == [0, 2, 3]


async def test_cancelling_the_pool_cancels_and_awaits_the_work_in_progress() -> None:
    cancelled: list[int] = []
    started = asyncio.Event()

    async def work(n: int) -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(n)
            raise

    pool = asyncio.create_task(bounded(range(5), work, 2))
    await started.wait()
    pool.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pool
    assert sorted(cancelled) == [0, 1]


async def test_a_slow_slot_is_reported_and_waited_for() -> None:
    slow: list[Any] = []
    reported = asyncio.Event()

    async def work(n: int) -> None:
        if n == 0:
            await reported.wait()

    def on_slow(n: int) -> None:
        slow.append(n)
        reported.set()

    await bounded(range(2), work, 1, slow=on_slow, slow_after=0.01)
    assert slow == [1]
