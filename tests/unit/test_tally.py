"""Bounded violation logs: exact counts and samples whatever is listed, merges by addition."""

from __future__ import annotations

import pickle
import random
from collections import Counter

import pytest

from auditor.checks.findings import Category, Check, CheckReport, DropCause, Violation
from auditor.checks.tally import ViolationLog

NO = Category.NO_REPLICA
BAQ = Category.BELOW_ACK_QUORUM
UNAV = Category.BOOKIE_UNAVAILABLE_REGISTERED


def v(ledger: int, category: Category = NO, bookie: str | None = None) -> Violation:
    return Violation(ledger, category, bookie, {"n": ledger})


def test_samples_are_the_smallest_hundred_ids_whatever_the_order() -> None:
    ids = list(range(5000, 5300))
    shuffled = ids[:]
    random.Random(7).shuffle(shuffled)
    log = ViolationLog(limit=5)
    for i in shuffled:
        log.append(v(i))
    assert log.samples(str(NO)) == ids[:100]
    assert log.ledgers(str(NO)) == 300
    assert log.total == 300
    assert [x.ledger_id for x in log] == ids[:5]
    assert log.truncated and len(log) == 5


def test_one_ledger_counts_once_per_category_with_several_bookies() -> None:
    log = ViolationLog(limit=2)
    log.extend([v(3, UNAV, "b1"), v(3, UNAV, "b2"), v(3, BAQ), v(1, UNAV, "b9"), v(2, NO)])
    assert (log.ledgers(str(UNAV)), log.ledgers(str(BAQ)), log.ledgers(str(NO))) == (2, 1, 1)
    assert log.total == 5
    assert [(x.ledger_id, x.bookie) for x in log] == [(1, "b9"), (2, None)]
    assert log.samples(str(UNAV)) == [1, 3]


def test_merge_of_partitions_keeps_the_first_listed_and_adds_counts() -> None:
    a = ViolationLog([v(i) for i in range(100, 160)], limit=10)
    b = ViolationLog([v(i) for i in range(0, 40)] + [v(i, BAQ) for i in range(40, 50)], limit=10)
    a.merge(b)
    assert [x.ledger_id for x in a] == list(range(0, 10))
    assert a.total == 110
    assert (a.ledgers(str(NO)), a.ledgers(str(BAQ))) == (100, 10)
    assert a.samples(str(NO)) == list(range(0, 40)) + list(range(100, 160))
    assert a.samples(str(BAQ)) == list(range(40, 50))


def test_report_json_with_truncation_dropped_and_share() -> None:
    report = CheckReport(Check.REPLICAS, started_at=0.0, violations=ViolationLog(limit=2))
    for i in (9, 4, 7):
        report.violations.append(v(i))
    report.violations.append(v(4, BAQ))
    report.dropped[str(DropCause.RETRY_SUCCEEDED)] += 3
    report.dropped[str(DropCause.MARKED_MEANWHILE)] += 1
    doc = report.to_json()
    assert [(x["ledger_id"], x["category"]) for x in doc["violations"]] == [
        (4, "below_ack_quorum"),
        (4, "no_replica"),
    ]
    assert doc["counts"]["no_replica"] == 3 and doc["counts"]["below_ack_quorum"] == 1
    assert (doc["violations_total"], doc["violations_truncated"]) == (4, True)
    assert doc["samples"]["no_replica"] == [4, 7, 9]
    assert doc["would_be_violations_dropped"] == {"marked_meanwhile": 1, "retry_succeeded": 3}
    # 4 dropped / (4 dropped + 3 + 1 reported)
    assert doc["false_alarm_share"] == 0.5
    assert report.has_violations


def test_merged_reports_add_their_drops() -> None:
    a = CheckReport(Check.LEDGERS, started_at=1.0, dropped=Counter({"metadata_changed": 1}))
    b = CheckReport(Check.LEDGERS, started_at=2.0, dropped=Counter({"ledger_deleted": 2}))
    a.merge(b)
    assert a.to_json()["would_be_violations_dropped"] == {
        "ledger_deleted": 2,
        "metadata_changed": 1,
    }
    assert a.false_alarm_share == 1.0
    assert CheckReport(Check.GRACE, started_at=0.0).false_alarm_share == 0.0


def test_a_log_survives_pickling_as_scan_partitions_send_it() -> None:
    log = ViolationLog([v(i) for i in range(30, 0, -1)], limit=4)
    again = pickle.loads(pickle.dumps(log))
    assert again == log
    assert [x.ledger_id for x in again] == [1, 2, 3, 4]
    assert (again.total, again.ledgers(str(NO)), again.samples(str(NO))) == (
        30,
        30,
        list(range(1, 31)),
    )


def test_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="listing limit"):
        ViolationLog(limit=-1)
