"""Bounded violation log lines (issue #18, "Bounded logs"): per run and per category, at most
`checks.violation_log_limit` violations are logged one by one; the rest are counted in one
summary warning at the end of the run, while the report keeps every violation."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, MutableMapping
from typing import Any

import pytest

from auditor.checks.findings import Category, Check, CheckReport, LedgerOutcome, Violation
from auditor.checks.placement_run import PlacementRun, placement_policy
from auditor.checks.recorder import DEFAULT_LOG_LIMIT, RunRecorder
from auditor.config import ChecksConfig, load_config
from auditor.errors import ConfigError
from auditor.logs import get_logger
from auditor.metadata.serde import LedgerMetadataFormatError
from auditor.metadata.walk import LedgerRecord
from auditor.testing.cluster import make_metadata

Logs = list[MutableMapping[str, Any]]
SUMMARY = "violation log lines suppressed"
LOST = Category.BOOKIE_UNAVAILABLE_REGISTERED
SHORT = Category.UNDERREPLICATED_PAST_GRACE_PERIOD


def events(logs: Logs, event: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == event]


def recorder(
    check: Check = Check.REPLICAS, limit: int = DEFAULT_LOG_LIMIT
) -> tuple[RunRecorder, list[LedgerOutcome]]:
    rows: list[LedgerOutcome] = []
    report = CheckReport(check, started_at=1.0)
    rec = RunRecorder(report, get_logger(), rows.append, clock=lambda: 2.0, log_limit=limit)
    return rec, rows


def violation(ledger_id: int, category: Category) -> Violation:
    return Violation(ledger_id, category, "bk-1:3181", {"n": ledger_id})


def record_many(rec: RunRecorder, lost: int, short: int) -> None:
    """`lost` + `short` ledgers, one violation each, the two categories interleaved."""
    cats = [LOST] * lost + [SHORT] * short
    cats[::2], cats[1::2] = cats[: (len(cats) + 1) // 2], cats[(len(cats) + 1) // 2 :]
    for ledger_id, cat in enumerate(cats):
        rec.violation(ledger_id, 0, [violation(ledger_id, cat)])


# --- the recorder ----------------------------------------------------------------------------


def test_5000_violations_in_two_categories_log_the_limit_of_each_and_one_summary(
    info_logs: Logs,
) -> None:
    rec, rows = recorder(limit=100)
    record_many(rec, 3000, 2000)
    report = rec.finish()
    lines = events(info_logs, "violation")
    assert len(lines) == 200
    by_cat = {str(c): [e for e in lines if e["category"] == str(c)] for c in (LOST, SHORT)}
    assert {c: len(v) for c, v in by_cat.items()} == {str(LOST): 100, str(SHORT): 100}
    # The first ones of each category are the ones logged, whole.
    first_lost = [v.ledger_id for v in report.violations if v.category is LOST][:100]
    assert [e["ledger_id"] for e in by_cat[str(LOST)]] == first_lost
    assert by_cat[str(LOST)][0] == {
        "event": "violation",
        "log_level": "warning",
        "check": "replicas",
        "ledger_id": first_lost[0],
        "category": str(LOST),
        "bookie": "bk-1:3181",
        "n": first_lost[0],
    }
    assert events(info_logs, SUMMARY) == [
        {
            "event": SUMMARY,
            "log_level": "warning",
            "check": "replicas",
            "logged": {str(LOST): 100, str(SHORT): 100},
            "suppressed": {str(LOST): 2900, str(SHORT): 1900},
            "limit": 100,
        }
    ]
    assert info_logs[-1]["event"] == SUMMARY  # at the end of the run
    # The report and the rows keep every violation.
    assert report.violations.total == 5000
    assert report.counts()[str(LOST)] == 3000
    assert report.counts()[str(SHORT)] == 2000
    assert report.ledgers_checked == 5000
    assert len(rows) == 5000
    assert report.to_json()["violations_total"] == 5000


def test_under_the_limit_every_violation_is_logged_and_nothing_summarised(
    info_logs: Logs,
) -> None:
    rec, _ = recorder(limit=100)
    record_many(rec, 100, 99)
    rec.finish()
    assert len(events(info_logs, "violation")) == 199
    assert events(info_logs, SUMMARY) == []


def test_the_default_bound_is_100() -> None:
    assert DEFAULT_LOG_LIMIT == ChecksConfig().violation_log_limit == 100
    assert RunRecorder(CheckReport(Check.GRACE, started_at=0.0), get_logger()).log_limit == 100


def test_zero_logs_none_one_by_one_and_counts_them_all(info_logs: Logs) -> None:
    rec, _ = recorder(limit=0)
    record_many(rec, 30, 20)
    report = rec.finish()
    assert events(info_logs, "violation") == []
    (summary,) = events(info_logs, SUMMARY)
    assert summary["logged"] == {str(LOST): 0, str(SHORT): 0}
    assert summary["suppressed"] == {str(LOST): 30, str(SHORT): 20}
    assert report.violations.total == 50


def test_minus_one_logs_every_one(info_logs: Logs) -> None:
    rec, _ = recorder(limit=-1)
    record_many(rec, 3000, 2000)
    rec.finish()
    assert len(events(info_logs, "violation")) == 5000
    assert events(info_logs, SUMMARY) == []


def test_a_summary_names_only_the_categories_seen_and_adds_up_per_category(
    info_logs: Logs,
) -> None:
    rec, _ = recorder(limit=5)
    record_many(rec, 12, 3)
    rec.finish()
    (summary,) = events(info_logs, SUMMARY)
    assert summary["logged"] == {str(LOST): 5, str(SHORT): 3}
    assert summary["suppressed"] == {str(LOST): 7, str(SHORT): 0}


def test_several_violations_of_one_ledger_count_one_each(info_logs: Logs) -> None:
    rec, _ = recorder(limit=3)
    for ledger_id in range(2):
        rec.violation(ledger_id, 0, [violation(ledger_id, LOST), violation(ledger_id, LOST)])
    rec.finish()
    assert [e["ledger_id"] for e in events(info_logs, "violation")] == [0, 0, 1]
    (summary,) = events(info_logs, SUMMARY)
    assert (summary["logged"], summary["suppressed"]) == ({str(LOST): 3}, {str(LOST): 1})
    assert rec.report.violations.total == 4


def test_a_drivers_own_lines_are_logged_whole_or_not_at_all(info_logs: Logs) -> None:
    """The limit counts violations: a logged one keeps all its lines (placement: one per
    failing segment)."""
    rec, _ = recorder(Check.PLACEMENT, limit=2)
    cat = Category.PLACEMENT_NOT_ADHERING
    for ledger_id in range(5):
        v = Violation(ledger_id, cat, None, {"segments": []})
        seg = {"ledger_id": ledger_id, "category": str(cat)}
        lines = [("placement violation", seg | {"segment_first_entry": f}) for f in (0, 20)]
        rec.violation(ledger_id, 0, [v], lines=lines)
    rec.finish()
    logged = [(e["ledger_id"], e["segment_first_entry"]) for e in info_logs if "ledger_id" in e]
    assert logged == [(0, 0), (0, 20), (1, 0), (1, 20)]
    (summary,) = events(info_logs, SUMMARY)
    assert (summary["logged"], summary["suppressed"]) == ({str(cat): 2}, {str(cat): 3})


# --- the placement check on thousands of ledgers ----------------------------------------------

BOOKIES = [f"10.0.0.{i}:3181" for i in range(3)]
RACKS = {BOOKIES[0]: "/rack1", BOOKIES[1]: "/rack1", BOOKIES[2]: "/rack2"}


async def _iterate(records: Iterable[LedgerRecord]) -> AsyncIterator[LedgerRecord]:
    for rec in records:
        yield rec


async def _locate(bookies: Iterable[str]) -> dict[str, str]:
    return {b: RACKS[b] for b in bookies}


def records(not_adhering: int, invalid: int) -> list[LedgerRecord]:
    """Closed ledgers whose write quorum spans 2 racks (not adhering with 3 required),
    then ledgers whose metadata did not decode."""
    out = [
        LedgerRecord(
            i,
            f"/ledgers/L{i:010d}",
            make_metadata(i, BOOKIES, write_quorum=3, ack_quorum=2, last_entry_id=9),
            1,
        )
        for i in range(not_adhering)
    ]
    for i in range(not_adhering, not_adhering + invalid):
        error = LedgerMetadataFormatError(i, "truncated")
        out.append(LedgerRecord(i, f"/ledgers/L{i:010d}", None, 1, error))
    return out


async def placement_run(overrides: list[str], not_adhering: int, invalid: int) -> CheckReport:
    cfg = load_config(None, ["minNumRacksPerWriteQuorum=3", *overrides])
    report = CheckReport(Check.PLACEMENT, started_at=1.0)
    limit = cfg.checks.violation_log_limit
    rec = RunRecorder(report, get_logger(), clock=lambda: 2.0, log_limit=limit)
    policy = placement_policy(cfg.bookkeeper, frozenset(BOOKIES), RACKS)
    await PlacementRun(rec, policy, _locate).judge_all(_iterate(records(not_adhering, invalid)))
    return rec.finish()


async def test_placement_on_thousands_of_not_adhering_ledgers_logs_the_limit(
    info_logs: Logs,
) -> None:
    report = await placement_run(["checks.violation_log_limit=50"], 3000, 1500)
    lines = events(info_logs, "placement violation")
    assert len(lines) == 50
    assert [e["ledger_id"] for e in lines] == list(range(50))
    assert len(events(info_logs, "metadata invalid")) == 50
    assert events(info_logs, SUMMARY) == [
        {
            "event": SUMMARY,
            "log_level": "warning",
            "check": "placement",
            "logged": {"metadata_invalid": 50, "placement_not_adhering": 50},
            "suppressed": {"metadata_invalid": 1450, "placement_not_adhering": 2950},
            "limit": 50,
        }
    ]
    # The report is the same as without the bound: every violation, every count.
    assert report.ledgers_checked == 4500
    assert report.violations.total == 4500
    assert report.to_json()["counts"] == {
        "placement_not_adhering": 3000,
        "placement_softly_adhering": 0,
        "metadata_invalid": 1500,
    }
    assert sorted(v.ledger_id for v in report.violations) == list(range(4500))


async def test_placement_reports_are_unchanged_by_the_bound(info_logs: Logs) -> None:
    bounded = (await placement_run([], 300, 20)).to_json()
    unbounded = (await placement_run(["checks.violation_log_limit=-1"], 300, 20)).to_json()
    assert bounded == unbounded
    assert len(events(info_logs, "placement violation")) == 100 + 300
    assert len(events(info_logs, SUMMARY)) == 1


async def test_placement_under_the_limit_logs_every_violation(info_logs: Logs) -> None:
    await placement_run([], 100, 7)
    assert len(events(info_logs, "placement violation")) == 100
    assert len(events(info_logs, "metadata invalid")) == 7
    assert events(info_logs, SUMMARY) == []


# --- the setting ------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [("0", 0), ("-1", -1), ("100000", 100000)])
def test_the_setting_takes_a_count_or_minus_one(value: str, expected: int) -> None:
    cfg = load_config(None, [f"checks.violation_log_limit={value}"])
    assert cfg.checks.violation_log_limit == expected


@pytest.mark.parametrize("value", ["-2", "1.5", "true", "many"])
def test_the_setting_refuses_anything_else(value: str) -> None:
    with pytest.raises(ConfigError, match="violation_log_limit"):
        load_config(None, [f"checks.violation_log_limit={value}"])
