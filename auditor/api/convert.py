"""Between the daemon's state and the API's messages, both ways, with no I/O.

The server builds responses from a `DaemonState` snapshot here, and the CLI
turns responses back into the documents it prints, so the two ends share one
definition of every field. Check and category names travel as the report's
strings; an unknown name is the caller's mistake (`UnknownNameError`, which the
server answers with INVALID_ARGUMENT).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import UTC
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from auditor.analysis.explain import document_text
from auditor.checks.findings import (
    ALL_CHECKS,
    Category,
    Check,
    CheckReport,
    Coverage,
    InvalidZnodeLog,
    Violation,
)
from auditor.checks.owners import Owner
from auditor.checks.tally import ViolationLog
from auditor.daemon.state import CheckState, DaemonState, Outcome, ScrubStatus
from auditor.errors import ConfigError, FormatError, shown_name
from auditor.metadata.underreplication import CorruptMark, UnderreplicatedLedger
from auditor.proto import auditor_service_pb2 as pb
from auditor.timefmt import from_iso, iso, iso_datetime
from auditor.worker.risk import BUCKETS, QueueRisk
from auditor.worker.state import WorkerState

ALL = "all"
#: Invalid znodes `status` lists per check (the count is exact; the report lists more).
STATUS_ZNODES_SHOWN = 10


class UnknownNameError(ConfigError):
    """A check or category name the auditor does not know."""


class ReportFormatError(FormatError):
    """A report document that does not follow the `check --json` schema."""


def parse_check(name: str, *, allow_all: bool = False) -> Check | None:
    """`None` stands for "all" (only when allowed)."""
    if allow_all and name == ALL:
        return None
    if name in {str(c) for c in ALL_CHECKS}:
        return Check(name)
    valid = [str(c) for c in ALL_CHECKS] + ([ALL] if allow_all else [])
    raise UnknownNameError(f"unknown check {shown_name(name)}; expected one of {', '.join(valid)}")


def parse_report_check(name: str, scheduled: Iterable[Check]) -> Check:
    """A check whose report may be asked for: the default checks, and those off by default
    that this daemon schedules (the Pulsar audit with `[pulsar] interval`)."""
    extra = [c for c in scheduled if c not in ALL_CHECKS]
    if name in {str(c) for c in extra}:
        return Check(name)
    check = parse_check(name)
    assert check is not None
    return check


def parse_category(name: str) -> Category:
    try:
        return Category(name)
    except ValueError:
        raise UnknownNameError(
            f"unknown category {shown_name(name)}; "
            f"expected one of {', '.join(str(c) for c in Category)}"
        ) from None


# --- time -------------------------------------------------------------------------


def timestamp(ts: float | None) -> Timestamp | None:
    if ts is None:
        return None
    # Split before scaling: seconds * 1e9 exceeds a double's exact integers.
    whole = math.floor(ts)
    nanos = min(round((ts - whole) * 1e9), 999_999_999)
    return Timestamp(seconds=whole, nanos=nanos)


def stamp_iso(msg: Any, name: str) -> str | None:
    """A Timestamp field as the reports write times; None when unset (never happened)."""
    if not msg.HasField(name):
        return None
    stamp: Timestamp = getattr(msg, name)
    return iso_datetime(stamp.ToDatetime(tzinfo=UTC))


def _from_iso(value: Any, what: str) -> float:
    if not isinstance(value, str):
        raise ReportFormatError(f"report field {what} is not a timestamp: {value!r}")
    try:
        return from_iso(value)
    except ValueError as exc:
        raise ReportFormatError(f"report field {what} is not a timestamp: {value!r}") from exc


# --- status -----------------------------------------------------------------------


def check_status(cs: CheckState, now: float | None = None) -> pb.CheckStatus:
    msg = pb.CheckStatus(
        check=str(cs.check),
        enabled=cs.enabled,
        interval_seconds=cs.interval_s,
        outcome=pb.Outcome.Value(f"OUTCOME_{cs.outcome.name}"),
        last_error=cs.last_error or "",
        has_report=cs.last_report is not None,
        last_success_age_seconds=round(cs.last_success_age(time.time() if now is None else now), 3),
    )
    for name, ts in (
        ("last_started", cs.last_started),
        ("last_finished", cs.last_finished),
        ("last_success", cs.last_success),
        ("next_run", cs.next_run),
    ):
        stamp = timestamp(ts)
        if stamp is not None:
            getattr(msg, name).CopyFrom(stamp)
    if cs.progress is not None:
        p = cs.progress
        msg.progress.ledgers_done = p.done
        if p.total is not None:
            msg.progress.ledgers_total = p.total
        msg.progress.total_kind = p.total_kind
        _stamp(msg.progress.updated, p.updated)
    if cs.last_report is not None:
        msg.counts.update(cs.last_report.counts())
        msg.ledgers_checked = cs.last_report.ledgers_checked
        msg.would_be_violations_dropped.update(
            {k: n for k, n in cs.last_report.dropped.items() if n}
        )
        msg.false_alarm_share = cs.last_report.false_alarm_share
        invalid = cs.last_report.invalid_znodes
        msg.invalid_znodes_total = invalid.total
        for z in invalid.listed()[:STATUS_ZNODES_SHOWN]:
            msg.invalid_znodes.add(path=z.path, reason=z.reason)
    return msg


def status_response(state: DaemonState, now: float | None = None) -> pb.GetStatusResponse:
    msg = pb.GetStatusResponse(
        identity=state.identity,
        is_leader=state.is_leader,
        leader=state.leader or "",
        zk_connected=state.zk_connected,
        replication_enabled=state.replication_enabled,
        retry_queue_ledgers=state.retry_queue,
        lost_bookies=sorted(state.lost_bookies),
        checks=[check_status(state.checks[c], now) for c in Check if c in state.checks],
    )
    started = timestamp(state.started_at)
    if started is not None:
        msg.started_at.CopyFrom(started)
    for name in sorted(state.selftest):
        st = state.selftest[name]
        entry = msg.selftest.add(check=st.check, ok=st.ok, fixtures=st.fixtures, failure=st.failure)
        ran = timestamp(st.ran_at)
        if ran is not None:
            entry.ran_at.CopyFrom(ran)
    _leadership(state, msg)
    msg.worker.CopyFrom(worker_status(state.worker))
    if state.scrub is not None:
        msg.scrub.CopyFrom(scrub_status(state.scrub))
    return msg


def scrub_status(s: ScrubStatus) -> pb.ScrubStatus:
    """The continuous deep scrub's cycle (`DaemonState.scrub`)."""
    msg = pb.ScrubStatus(
        cycle=s.cycle,
        interval_seconds=s.interval,
        cursor=s.cursor,
        bytes_verified=s.bytes,
        ledgers=s.ledgers,
        previous_cycle_bytes=s.previous_bytes,
        share=s.share,
        rate=s.rate,
    )
    _stamp(msg.started, s.started)
    _stamp(msg.expected_end, s.expected_end)
    _stamp(msg.finished, s.finished)
    _stamp(msg.next_cycle, s.rest_until)
    _stamp(msg.updated, s.updated)
    return msg


def scrub_json(s: pb.ScrubStatus) -> dict[str, Any]:
    """The `scrub` object of `status --json`."""
    return {
        "cycle": s.cycle,
        "started": stamp_iso(s, "started"),
        "interval_s": s.interval_seconds,
        "cursor": s.cursor,
        "bytes_verified": s.bytes_verified,
        "ledgers": s.ledgers,
        "previous_cycle_bytes": s.previous_cycle_bytes,
        "share": s.share,
        "expected_end": stamp_iso(s, "expected_end"),
        "finished": stamp_iso(s, "finished"),
        "next_cycle": stamp_iso(s, "next_cycle"),
        "rate": s.rate,
        "updated": stamp_iso(s, "updated"),
    }


def scrub_text(doc: dict[str, Any]) -> str:
    """The scrub's cycle in one line (`status`, the page), from `scrub_json`'s document."""
    head = f"cycle {doc['cycle']}"
    done = f"{doc['ledgers']:,} ledgers, {doc['bytes_verified']:,} bytes"
    if doc["finished"] is not None:
        return f"{head} done at {doc['finished']} ({done}); next cycle at {doc['next_cycle']}"
    target = iso(from_iso(doc["started"]) + doc["interval_s"]) if doc["started"] else "-"
    pace = f"{doc['rate']:,.0f} bytes/s a bookie" if doc["rate"] > 0 else "no budget"
    return (
        f"{head}, {doc['share']:.1%} verified since {doc['started']} (cursor at ledger "
        f"{doc['cursor']:,}; {done}); expected end {doc['expected_end'] or 'not known yet'}, "
        f"target {target}; pace {pace}"
    )


def worker_status(ws: WorkerState) -> pb.WorkerStatus:
    """The replication worker now: its ledgers in hand by id, its unrecoverable ones, counts."""
    msg = pb.WorkerStatus(
        enabled=ws.enabled,
        running=ws.running,
        waiting=ws.waiting,
        ledgers_replicated=ws.ledgers_replicated,
        ledgers_found_healthy=ws.ledgers_found_healthy,
        fragments_replicated=ws.fragments_replicated,
        entries_read=ws.entries_read,
        entries_written=ws.entries_written,
        bytes_read=ws.bytes_read,
        bytes_written=ws.bytes_written,
        lock_seconds=round(ws.lock_seconds, 3),
        locks_released=ws.locks_released,
    )
    msg.failures.update({str(f): n for f, n in ws.failures.items() if n})
    for lid in sorted(ws.in_hand):
        held = ws.in_hand[lid]
        entry = msg.in_hand.add(ledger_id=lid, step=held.step, fragments=list(held.fragments))
        _stamp(entry.since, held.since)
        _stamp(entry.until, held.until)
    for lid in sorted(ws.unrecoverable):
        u = ws.unrecoverable[lid]
        gone = msg.unrecoverable.add(ledger_id=lid)
        for first, last in u.ranges:
            gone.ranges.add(first=first, last=last)
        _stamp(gone.since, u.since)
        _stamp(gone.retry_at, u.retry_at)
    if ws.queue is not None:
        _marked_queue(ws.queue, msg.queue)
    return msg


def _marked_queue(q: QueueRisk, msg: pb.MarkedQueue) -> None:
    _stamp(msg.ranked_at, q.ranked_at)
    msg.by_copies_left.update(q.by_copies)
    for bucket, ts in q.oldest.items():
        _stamp(msg.oldest[bucket], ts)
    for item in q.head:
        r = item.risk
        entry = msg.next.add(
            ledger_id=item.ledger_id,
            copies_left=-1 if r.copies_left is None else r.copies_left,
            racks_left=-1 if r.racks_left is None else r.racks_left,
            in_flight=item.in_flight,
        )
        _stamp(entry.marked_at, r.marked_at)


def _stamp(field: Timestamp, ts: float | None) -> None:
    stamp = timestamp(ts)
    if stamp is not None:
        field.CopyFrom(stamp)


def _leadership(state: DaemonState, msg: pb.GetStatusResponse) -> None:
    """The election phase, the last decisions, a duplicate identity, unusable znodes."""
    msg.election_phase = str(state.phase)
    for d in state.decisions:
        entry = msg.decisions.add(
            action=str(d.action),
            reason=str(d.reason),
            message=d.message,
            detail=d.detail,
            backoff_seconds=round(d.backoff, 3),
        )
        _stamp(entry.at, d.at)
    if state.duplicate_vote is not None:
        msg.duplicate_identity_vote = state.duplicate_vote
        _stamp(msg.duplicate_identity_since, state.duplicate_since)
    _stamp(msg.backoff_until, state.backoff_until)
    msg.election = state.election
    other = state.other_election
    if other is not None:
        msg.other_election = other.election
        msg.other_election_path = other.path
        msg.other_election_holder = other.holder
        _stamp(msg.other_election_since, other.since)
    unreadable = state.unreadable_vote
    if unreadable is not None:
        msg.unreadable_vote_path = unreadable.path
        msg.unreadable_vote_session = unreadable.session
        msg.unreadable_vote_error = unreadable.error
        _stamp(msg.unreadable_vote_since, unreadable.since)
    msg.open_acl_znodes.extend(str(item) for item in state.open_acls)
    for name in sorted(state.invalid_znodes):
        z = state.invalid_znodes[name]
        entry_z = msg.invalid_znodes.add(znode=z.znode, value=z.value, using=z.using)
        _stamp(entry_z.since, z.since)


_OUTCOMES: dict[int, Outcome] = {pb.Outcome.Value(f"OUTCOME_{o.name}"): o for o in Outcome}


def outcome_name(value: int) -> str:
    """The daemon's outcome string for a proto enum value ("unspecified" if unknown)."""
    return str(_OUTCOMES.get(value, "unspecified"))


def status_json(msg: pb.GetStatusResponse) -> dict[str, Any]:
    """The `status --json` document: snake_case, ISO times, null for "never"."""

    return {
        "identity": msg.identity,
        "is_leader": msg.is_leader,
        "leader": msg.leader or None,
        "zk_connected": msg.zk_connected,
        "replication_enabled": msg.replication_enabled,
        "started_at": stamp_iso(msg, "started_at"),
        "retry_queue_ledgers": msg.retry_queue_ledgers,
        "lost_bookies": list(msg.lost_bookies),
        "checks": {
            c.check: {
                "enabled": c.enabled,
                "interval_s": c.interval_seconds,
                "outcome": outcome_name(c.outcome),
                "last_started": stamp_iso(c, "last_started"),
                "last_finished": stamp_iso(c, "last_finished"),
                "last_success": stamp_iso(c, "last_success"),
                "next_run": stamp_iso(c, "next_run"),
                "last_error": c.last_error or None,
                "ledgers_checked": c.ledgers_checked if c.has_report else None,
                "counts": dict(sorted(c.counts.items())) if c.has_report else None,
                "last_success_age_s": c.last_success_age_seconds,
                "would_be_violations_dropped": (
                    dict(sorted(c.would_be_violations_dropped.items())) if c.has_report else None
                ),
                "false_alarm_share": c.false_alarm_share if c.has_report else None,
                "progress": progress_json(c),
                "invalid_znodes": (
                    {
                        "total": c.invalid_znodes_total,
                        "listed": [{"path": z.path, "reason": z.reason} for z in c.invalid_znodes],
                    }
                    if c.has_report
                    else None
                ),
            }
            for c in msg.checks
        },
        "selftest": {
            t.check: {
                "ok": t.ok,
                "fixtures": t.fixtures,
                "failure": t.failure or None,
                "ran_at": stamp_iso(t, "ran_at"),
            }
            for t in msg.selftest
        },
        "election_phase": msg.election_phase or None,
        "decisions": [
            {
                "at": stamp_iso(d, "at"),
                "action": d.action,
                "reason": d.reason,
                "message": d.message,
                "detail": d.detail or None,
                "backoff_s": d.backoff_seconds if d.action == "back_off" else None,
            }
            for d in msg.decisions
        ],
        "duplicate_identity": (
            {
                "vote": msg.duplicate_identity_vote,
                "since": stamp_iso(msg, "duplicate_identity_since"),
            }
            if msg.duplicate_identity_vote
            else None
        ),
        "backoff_until": stamp_iso(msg, "backoff_until"),
        "election": msg.election or None,
        "other_election": (
            {
                "election": msg.other_election,
                "path": msg.other_election_path,
                "holder": msg.other_election_holder or None,
                "since": stamp_iso(msg, "other_election_since"),
            }
            if msg.other_election
            else None
        ),
        "unreadable_vote": (
            {
                "path": msg.unreadable_vote_path,
                "session": f"0x{msg.unreadable_vote_session:x}",
                "error": msg.unreadable_vote_error,
                "since": stamp_iso(msg, "unreadable_vote_since"),
            }
            if msg.unreadable_vote_path
            else None
        ),
        "open_acl_znodes": list(msg.open_acl_znodes),
        "invalid_znodes": {
            z.znode: {"value": z.value, "using": z.using, "since": stamp_iso(z, "since")}
            for z in msg.invalid_znodes
        },
        "worker": worker_json(msg.worker) if msg.HasField("worker") else None,
        "scrub": scrub_json(msg.scrub) if msg.HasField("scrub") else None,
    }


def progress_json(c: pb.CheckStatus) -> dict[str, Any] | None:
    """A running check's `progress` in `status --json` (null when it has none)."""
    if not c.HasField("progress"):
        return None
    p = c.progress
    return {
        "ledgers_done": p.ledgers_done,
        "ledgers_total": p.ledgers_total if p.HasField("ledgers_total") else None,
        "total_kind": p.total_kind or None,
        "updated": stamp_iso(p, "updated"),
    }


def progress_text(outcome: str, progress: dict[str, Any] | None) -> str:
    """A check's outcome with its walk's progress while it runs, for the text `status`:
    "running, 12,345 of ~100,000 ledgers" ("~": estimated from the largest ledger id;
    none: the metadata index's size), "running, 12 ledgers so far" while the total is
    unknown, and the outcome alone otherwise."""
    if progress is None or outcome != str(Outcome.RUNNING):
        return outcome
    done, total = progress["ledgers_done"], progress["ledgers_total"]
    if total is None:
        return f"{outcome}, {done:,} ledger{'' if done == 1 else 's'} so far"
    about = "" if progress["total_kind"] == "ledgers" else "~"
    return f"{outcome}, {done:,} of {about}{total:,} ledgers"


def worker_json(w: pb.WorkerStatus) -> dict[str, Any]:
    """The `worker` object of `status --json`: counts, and the ledgers in hand and lost."""
    return {
        "enabled": w.enabled,
        "running": w.running,
        "waiting": w.waiting or None,
        "ledgers_replicated": w.ledgers_replicated,
        "ledgers_found_healthy": w.ledgers_found_healthy,
        "fragments_replicated": w.fragments_replicated,
        "entries_read": w.entries_read,
        "entries_written": w.entries_written,
        "bytes_read": w.bytes_read,
        "bytes_written": w.bytes_written,
        "failures": dict(sorted(w.failures.items())),
        "lock_seconds": w.lock_seconds,
        "locks_released": w.locks_released,
        "in_hand": [
            {
                "ledger_id": h.ledger_id,
                "step": h.step,
                "since": stamp_iso(h, "since"),
                "until": stamp_iso(h, "until"),
                "fragments": list(h.fragments),
            }
            for h in w.in_hand
        ],
        "unrecoverable": [
            {
                "ledger_id": u.ledger_id,
                "ranges": [[r.first, r.last] for r in u.ranges],
                "since": stamp_iso(u, "since"),
                "retry_at": stamp_iso(u, "retry_at"),
            }
            for u in w.unrecoverable
        ],
        "queue": _queue_json(w.queue) if w.HasField("queue") else None,
    }


def _queue_json(q: pb.MarkedQueue) -> dict[str, Any]:
    """The worker's marked ledgers by risk: counts and oldest per copies-left bucket (in
    the order 0, 1, 2, 3+, unknown), and the next ledgers it would take."""

    def ordered(keys: Iterable[str]) -> list[str]:
        known = [b for b in BUCKETS if b in keys]
        return known + sorted(k for k in keys if k not in BUCKETS)

    return {
        "ranked_at": stamp_iso(q, "ranked_at"),
        "by_copies_left": {b: q.by_copies_left[b] for b in ordered(q.by_copies_left)},
        "oldest": {b: iso_datetime(q.oldest[b].ToDatetime(tzinfo=UTC)) for b in ordered(q.oldest)},
        "next": [
            {
                "ledger_id": n.ledger_id,
                "copies_left": n.copies_left if n.copies_left >= 0 else None,
                "racks_left": n.racks_left if n.racks_left >= 0 else None,
                "marked_at": stamp_iso(n, "marked_at"),
                "in_flight": n.in_flight,
            }
            for n in q.next
        ],
    }


# --- reports ----------------------------------------------------------------------


def report_json_text(report: CheckReport) -> str:
    """Serialised exactly as `check CHECK --json` does, so the two outputs are interchangeable."""
    return json.dumps(report.to_json(), sort_keys=False)


def report_response(report: CheckReport) -> pb.GetReportResponse:
    msg = pb.GetReportResponse(
        check=str(report.check),
        report_json=report_json_text(report),
        ledgers_checked=report.ledgers_checked,
        violations=report.violations.total,
        marked_underreplicated=len(set(report.marked_underreplicated)),
        violations_truncated=report.violations.truncated,
    )
    msg.would_be_violations_dropped.update({k: n for k, n in report.dropped.items() if n})
    msg.counts.update(report.counts())
    msg.ledgers_skipped.update({k: n for k, n in report.ledgers_skipped.items() if n})
    msg.invalid_znodes_total = report.invalid_znodes.total
    for z in report.invalid_znodes:
        msg.invalid_znodes.add(path=z.path, reason=z.reason)
    for name, ts in (("started_at", report.started_at), ("finished_at", report.finished_at)):
        stamp = timestamp(ts)
        if stamp is not None:
            getattr(msg, name).CopyFrom(stamp)
    return msg


def _violation_log(doc: dict[str, Any]) -> ViolationLog:
    """The document's violations; counts, total and samples as written when present
    (the listed violations may be only the first ones)."""
    listed = [
        Violation(int(v["ledger_id"]), Category(v["category"]), v["bookie"], v["detail"])
        for v in doc["violations"]
    ]
    if "violations_total" not in doc:
        return ViolationLog(listed)
    return ViolationLog.restored(
        listed,
        total=int(doc["violations_total"]),
        counts={str(c): int(n) for c, n in doc["counts"].items()},
        samples={str(c): [int(i) for i in ids] for c, ids in doc["samples"].items()},
    )


def report_from_json(doc: dict[str, Any]) -> CheckReport:
    """Rebuilds a report from its JSON document (so the CLI can render a daemon's report)."""
    try:
        check = Check(doc["check"])
        report = CheckReport(
            check=check,
            started_at=_from_iso(doc["started_at"], "started_at"),
            finished_at=_from_iso(doc["finished_at"], "finished_at"),
            ledgers_checked=int(doc["ledgers_checked"]),
            ledgers_skipped=Counter({str(k): int(n) for k, n in doc["ledgers_skipped"].items()}),
            violations=_violation_log(doc),
            marked_underreplicated=[int(i) for i in doc["marked_underreplicated"]],
            lost_bookies=[str(b) for b in doc.get("lost_bookies", [])],
            invalid_znodes=InvalidZnodeLog.from_json(doc.get("invalid_znodes")),
        )
        report.dropped.update(
            {str(k): int(n) for k, n in doc.get("would_be_violations_dropped", {}).items()}
        )
        if "coverage" in doc:
            c = doc["coverage"]
            report.coverage = Coverage(int(c["listed"]), int(c["probed"]), int(c["unverified"]))
        for v in doc["violations"]:
            if v.get("owner") is not None:
                report.owners[int(v["ledger_id"])] = Owner.from_json(v["owner"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ReportFormatError(f"the report document is malformed: {exc!r}") from exc
    return report


# --- explain ----------------------------------------------------------------------


def explain_response(doc: dict[str, Any]) -> pb.ExplainResponse:
    return pb.ExplainResponse(
        ledger_id=int(doc["ledger_id"]),
        explain_json=document_text(doc),
        categories=[str(c) for c in doc["categories"]],
    )


# --- streams ----------------------------------------------------------------------


def violations(
    reports: dict[Check, CheckReport],
    check: Check | None,
    category: Category | None,
    owner: str | None = None,
) -> Iterator[pb.Violation]:
    """By check (declaration order), then ledger id and category, as reports order them."""
    for c in Check:
        report = reports.get(c)
        if report is None or (check is not None and c is not check):
            continue
        for v in sorted(report.violations, key=lambda v: (v.ledger_id, str(v.category))):
            if category is not None and v.category is not category:
                continue
            found = report.owners.get(v.ledger_id)
            if owner is not None and (found is None or found.key != owner):
                continue
            yield pb.Violation(
                check=str(c),
                ledger_id=v.ledger_id,
                category=str(v.category),
                bookie=v.bookie or "",
                detail_json=json.dumps(v.detail, sort_keys=False),
                owner=found.key if found is not None else "",
            )


def underreplicated_selected(
    ur: UnderreplicatedLedger | CorruptMark, missing_replica: str, excluding_missing_replica: str
) -> bool:
    """BookKeeper's listunderreplicated filters: exact membership in the replica list.

    A corrupt mark passes every filter: its replicas cannot be read, and it is never hidden.
    """
    if isinstance(ur, CorruptMark):
        return True
    if missing_replica and missing_replica not in ur.replicas:
        return False
    return not (excluding_missing_replica and excluding_missing_replica in ur.replicas)


def underreplicated(ur: UnderreplicatedLedger | CorruptMark) -> pb.UnderReplicatedLedger:
    if isinstance(ur, CorruptMark):
        corrupt = pb.CorruptMark(path=ur.path, reason=ur.reason)
        if ur.ledger_id is not None:
            corrupt.ledger_id = ur.ledger_id
        return pb.UnderReplicatedLedger(corrupt=corrupt)
    msg = pb.UnderReplicatedLedger(ledger_id=ur.ledger_id, replicas=list(ur.replicas))
    if ur.ctime >= 0:
        msg.ctime_ms = ur.ctime
    return msg


def mark_of(msg: pb.UnderReplicatedLedger) -> UnderreplicatedLedger | CorruptMark:
    """A listing's item back as `list_marks` yields it (znode versions do not travel)."""
    if msg.HasField("corrupt"):
        c = msg.corrupt
        return CorruptMark(c.path, c.ledger_id if c.HasField("ledger_id") else None, c.reason)
    ctime = msg.ctime_ms if msg.HasField("ctime_ms") else -1
    return UnderreplicatedLedger(msg.ledger_id, tuple(msg.replicas), ctime)
