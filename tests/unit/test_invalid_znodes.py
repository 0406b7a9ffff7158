"""A report's invalid znodes: bounded like violations, merged across partitions, in the JSON
document, the text report, the exit status, and both ways through the API's messages."""

from __future__ import annotations

import io
import json
import pickle

from auditor.api.convert import (
    check_status,
    mark_of,
    report_from_json,
    report_response,
    status_json,
    status_response,
    underreplicated,
    underreplicated_selected,
)
from auditor.checks.findings import (
    Category,
    Check,
    CheckReport,
    InvalidZnode,
    InvalidZnodeLog,
    Violation,
)
from auditor.checks.recorder import RunRecorder
from auditor.checks.tally import ViolationLog
from auditor.cli.check import render_text
from auditor.daemon.state import CheckState, DaemonState, RunCompleted
from auditor.logs import get_logger
from auditor.metadata.ledger_tree import UnexpectedZnode, WalkStats
from auditor.metadata.underreplication import CorruptMark, UnderreplicatedLedger


def z(i: int) -> InvalidZnode:
    return InvalidZnode(f"/ledgers/p{i:03d}", f"reason {i}")


def test_every_one_is_counted_and_the_first_by_path_listed() -> None:
    log = InvalidZnodeLog(limit=3)
    for i in (9, 4, 7, 1, 8, 2, 6):
        log.append(z(i))
    assert log.total == 7 and len(log) == 3 and log.truncated
    assert log.listed() == [z(1), z(2), z(4)]
    log.count_unlisted(5)
    assert log.to_json() == {
        "total": 12,
        "listed": [{"path": f"/ledgers/p{i:03d}", "reason": f"reason {i}"} for i in (1, 2, 4)],
    }
    assert bool(InvalidZnodeLog()) is False and bool(log) is True


def test_partitions_merge_exactly_under_the_limit() -> None:
    whole = InvalidZnodeLog([z(i) for i in range(10)], limit=4)
    a, b = InvalidZnodeLog(limit=4), InvalidZnodeLog(limit=4)
    for i in range(10):
        (a if i % 2 else b).append(z(i))
    a.merge(b)
    assert a == whole
    assert a.listed() == [z(0), z(1), z(2), z(3)] and a.total == 10


def test_a_report_takes_its_violations_limit_and_survives_pickling_and_json() -> None:
    report = CheckReport(Check.GRACE, 1.0, 2.0, violations=ViolationLog(limit=2))
    assert report.invalid_znodes.limit == 2  # checks.max_violations_listed, for both
    for i in (3, 1, 2):
        report.invalid_znodes.append(z(i))
    doc = report.to_json()
    assert doc["invalid_znodes"] == {
        "total": 3,
        "listed": [{"path": "/ledgers/p001", "reason": "reason 1"}, z(2).to_json()],
    }
    assert pickle.loads(pickle.dumps(report)).invalid_znodes == report.invalid_znodes
    again = report_from_json(json.loads(json.dumps(doc)))
    assert again.to_json() == doc
    # A document from before invalid znodes: none.
    del doc["invalid_znodes"]
    assert report_from_json(doc).invalid_znodes.total == 0
    # A clean report has the key too, empty: every report has the same schema.
    assert CheckReport(Check.REPLICAS, 1.0).to_json()["invalid_znodes"] == {
        "total": 0,
        "listed": [],
    }


def test_invalid_znodes_are_findings_as_violations_are() -> None:
    report = CheckReport(Check.BOOKIES, 1.0, 2.0)
    assert not report.has_findings
    report.invalid_znodes.append(z(1))
    assert report.has_findings and not report.has_violations
    merged = CheckReport(Check.BOOKIES, 0.5, 1.0)
    merged.merge(report)
    assert merged.invalid_znodes.listed() == [z(1)] and merged.has_findings
    out = io.StringIO()
    render_text(report, out)
    assert "  invalid znode /ledgers/p001: reason 1\n" in out.getvalue()


def test_text_says_when_not_all_are_listed() -> None:
    report = CheckReport(Check.LEDGERS, 1.0, 2.0, violations=ViolationLog(limit=1))
    report.invalid_znodes.append(z(2))
    report.invalid_znodes.append(z(1))
    out = io.StringIO()
    render_text(report, out)
    lines = out.getvalue().splitlines()
    assert "  invalid znode /ledgers/p001: reason 1" in lines
    assert "  invalid znode /ledgers/p002: reason 2" not in lines
    assert "  ... the first 1 of 2 invalid znodes (checks.max_violations_listed)" in lines


def test_the_recorder_names_a_walks_invalid_ledger_znodes_once_at_finish() -> None:
    stats = WalkStats()
    stats.note_unexpected(UnexpectedZnode("/ledgers/00/0000/stray", "not a ledger znode"))
    stats.note_unexpected(UnexpectedZnode("/ledgers/922/3372/0368/5477/L5808", "beyond", True))
    stats.invalid_ledgers += 2  # two more the walk counted beyond the ones it kept
    recorder = RunRecorder(CheckReport(Check.PLACEMENT, 1.0), get_logger())
    recorder.walked(stats)
    report = recorder.report
    # Only invalid ledger znodes (a stray name is merely unexpected), all counted.
    assert report.invalid_znodes.listed() == [
        InvalidZnode("/ledgers/922/3372/0368/5477/L5808", "beyond")
    ]
    assert report.invalid_znodes.total == 3
    recorder.invalid_znode("/ledgers/underreplication/ledgers/x", "does not decode")
    assert report.invalid_znodes.total == 4


def test_status_and_report_messages_carry_them() -> None:
    report = CheckReport(
        Check.GRACE,
        1.0,
        2.0,
        violations=ViolationLog(
            [Violation(5, Category.UNDERREPLICATED_PAST_GRACE_PERIOD, None, {})]
        ),
        invalid_znodes=InvalidZnodeLog([z(i) for i in range(12)]),
    )
    state = DaemonState(identity="a:1")
    state.check_ended(Check.GRACE, RunCompleted(report, 1.0), 2.0)
    cs = check_status(state.checks[Check.GRACE], now=3.0)
    assert cs.invalid_znodes_total == 12
    assert [m.path for m in cs.invalid_znodes] == [z(i).path for i in range(10)]  # bounded
    doc = status_json(status_response(state, now=3.0))
    assert doc["checks"]["grace"]["invalid_znodes"]["total"] == 12
    assert doc["checks"]["grace"]["invalid_znodes"]["listed"][0] == z(0).to_json()
    assert doc["checks"]["replicas"]["invalid_znodes"] is None  # no report yet
    assert check_status(CheckState(Check.BOOKIES), now=3.0).invalid_znodes_total == 0
    resp = report_response(report)
    assert resp.invalid_znodes_total == 12
    assert [(m.path, m.reason) for m in resp.invalid_znodes] == [
        (x.path, x.reason) for x in report.invalid_znodes
    ]


def test_a_corrupt_mark_travels_as_an_item_of_its_own_and_passes_every_filter() -> None:
    named = CorruptMark("/ledgers/underreplication/ledgers/a/urL0000000002", 2, "does not decode")
    nameless = CorruptMark("/ledgers/underreplication/ledgers/a/junk", None, "not a mark")
    valid = UnderreplicatedLedger(3, ("b1:3181",), 1_700_000_000_000)
    for item in (named, nameless, valid):
        assert mark_of(underreplicated(item)) == item
    no_ctime = UnderreplicatedLedger(4, (), -1)
    assert mark_of(underreplicated(no_ctime)) == no_ctime
    for item in (named, nameless):
        assert underreplicated_selected(item, "b9:3181", "")
        assert underreplicated_selected(item, "", "b9:3181")
    assert not underreplicated_selected(valid, "b9:3181", "")
    assert not underreplicated(valid).HasField("corrupt")
    assert not underreplicated(nameless).corrupt.HasField("ledger_id")
