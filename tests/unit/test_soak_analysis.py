"""The soak's judge (`soak.analysis.judge`) on made-up timelines: what is a false alarm, a
missed report, a flap, a check blinded by a bad znode; and SOAK_SEEDS, the worker's
write sets. No services: lines and faults are built here."""

from __future__ import annotations

import json
from typing import Any

import pytest

from auditor.metadata.model import LedgerMetadata
from auditor.testing.cluster import make_metadata
from soak.analysis import judge
from soak.faults import DATA_CATEGORIES, Fault
from soak.logs import Line, Span, leadership, parse_lines
from soak.seeds import SeedsError, combine, parse_seeds
from soak.worker import expected_entries

B1, B2, B3, B4 = "10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181", "10.0.0.4:3181"
EVER = {1: {B1, B2, B3}, 2: {B2, B3, B4}}
END = 1000.0


def line(t: float, event: str, daemon: str = "soak-0", **fields: Any) -> Line:
    rec = {"event": event, **fields}
    return Line(t, daemon, event, rec, json.dumps(rec))


def violation(t: float, lid: int, category: str, bookie: str | None = None, **kw: Any) -> Line:
    return line(t, "violation", ledger_id=lid, category=category, bookie=bookie, **kw)


def mark(t: float, lid: int, missing: list[str]) -> Line:
    return line(t, "marked under-replicated", ledger_id=lid, missing_replicas=missing)


def host_restart(bookie: str = B1, start: float = 100.0, back: float = 120.0) -> Fault:
    return Fault(
        "host_restart",
        f"soak-0+{bookie}",
        start,
        end=back,
        repaired=back + 1,
        bookie=bookie,
        daemon="soak-0",
        ledgers=[1],
        down=[[start, back]],
    )


def crash(bookie: str, start: float, back: float) -> Fault:
    return Fault(
        "bookie_crash",
        bookie,
        start,
        end=back,
        repaired=back + 1,
        bookie=bookie,
        ledgers=[lid for lid, bs in EVER.items() if bookie in bs],
        expect=["ledgers_on_lost_bookies"],
        explains=sorted(DATA_CATEGORIES),
        require_marks=True,
        down=[[start, back]],
    )


def run(lines: list[Line], faults: list[Fault], spans: list[Span] | None = None) -> dict[str, Any]:
    logs: dict[str, list[Line]] = {}
    for ln in lines:
        logs.setdefault(ln.daemon, []).append(ln)
    return judge(logs, spans or [], faults, EVER, END)


# --- the restart rule ---------------------------------------------------------------------


def test_a_mark_and_a_report_during_a_host_restart_are_false_alarms_naming_it() -> None:
    f = host_restart()
    out = run(
        [violation(110.0, 1, "ledgers_on_lost_bookies", B1), mark(110.2, 1, [B1])],
        [f],
    )
    assert [(a["ledger_id"], a["category"]) for a in out["false_alarms"]] == [
        (1, "ledgers_on_lost_bookies"),
        (1, "(marked)"),
    ]
    assert all(a["during"] == [f"host_restart soak-0+{B1} at 100.0"] for a in out["false_alarms"])
    assert out["faults_by_kind"]["host_restart"]["false_alarms_during"] == 2


def test_a_second_bookie_lost_meanwhile_explains_the_audit_at_once() -> None:
    f = host_restart()
    other = crash(B4, 115.0, 190.0)  # gone while B1 still is: audited at once, as upstream
    out = run(
        [violation(116.0, 1, "ledgers_on_lost_bookies", B1), mark(116.1, 1, [B1])],
        [f, other],
    )
    assert out["false_alarms"] == []


def test_a_loss_after_the_host_is_back_explains_nothing_about_it() -> None:
    f = host_restart()
    other = crash(B4, 125.0, 190.0)  # B1 back at 120: one loss at a time
    out = run([violation(126.0, 1, "ledgers_on_lost_bookies", B1)], [f, other])
    assert [a["during"] for a in out["false_alarms"]] == [[f"host_restart soak-0+{B1} at 100.0"]]


def test_a_violation_after_the_grace_is_not_explained_by_a_repaired_crash() -> None:
    c = crash(B2, 100.0, 180.0)
    out = run(
        [violation(150.0, 2, "ledgers_on_lost_bookies", B2), violation(202.0, 2, "no_replica")],
        [c],
    )
    assert [(a["ledger_id"], a["category"], a["during"]) for a in out["false_alarms"]] == [
        (2, "no_replica", [])
    ]


# --- reportable faults ----------------------------------------------------------------------


def test_a_crash_is_reported_only_with_every_ledger_marked() -> None:
    c = crash(B4, 100.0, 180.0)
    c.marked = 1  # of its one ledger
    out = run([violation(150.0, 2, "ledgers_on_lost_bookies", B4)], [c])
    assert (out["reportable_faults"], out["reportable_faults_reported"], out["missed"]) == (
        1,
        1,
        [],
    )
    c.marked = 0
    out = run([violation(150.0, 2, "ledgers_on_lost_bookies", B4)], [c])
    assert [(m["kind"], m["marked"], m["reported_ledgers"]) for m in out["missed"]] == [
        ("bookie_crash", 0, 1)
    ]


def bad(kind: str, path: str, ledger_id: int | None = None, evidence: bool = True) -> Fault:
    return Fault(
        kind,
        path,
        100.0,
        end=160.0,
        repaired=161.0,
        path=path,
        ledger_id=ledger_id,
        require_evidence=evidence,
    )


MARK = "/ledgers/underreplication/ledgers/0002/18b7/1a00/0000/urL9000000001"
BIG = "/ledgers/922/3372/0368/5477/L5808"


def test_a_corrupt_mark_named_by_path_is_reported_and_no_false_alarm() -> None:
    f = bad("bad_mark", MARK, 9_000_000_001)
    out = run(
        [
            line(130.0, "corrupt under-replication mark", path=MARK),
            violation(131.0, 9_000_000_001, "corrupt_mark", path=MARK),
        ],
        [f],
    )
    assert (out["reportable_faults_reported"], out["missed"], out["false_alarms"]) == (1, [], [])


def test_a_corrupt_mark_reported_under_a_data_category_is_a_false_alarm() -> None:
    f = bad("bad_mark", MARK, 9_000_000_001)
    out = run([violation(131.0, 9_000_000_001, "no_replica", path=MARK)], [f])
    assert [a["during"] for a in out["false_alarms"]] == [[f"bad_mark {MARK} at 100.0"]]


def test_an_unnamed_corrupt_mark_is_missed_if_a_check_reading_marks_ran() -> None:
    f = bad("bad_mark", MARK, 9_000_000_001)
    out = run([line(140.0, "check run", check="replicas")], [f])
    assert [(m["kind"], m["reader_runs"]) for m in out["missed"]] == [("bad_mark", 1)]
    out = run([line(140.0, "check run", check="bookies")], [f])
    assert (out["missed"], [u["kind"] for u in out["unverified"]]) == ([], ["bad_mark"])


def test_a_failure_naming_the_bad_znode_is_no_evidence_but_blindness() -> None:
    f = bad("bad_ledger_znode", BIG)
    failed = line(140.0, "check failed", check="ledgers", error=f"InvalidLedgerIdError: {BIG}")
    out = run([failed, line(150.0, "check run", check="bookies")], [f])
    assert [m["kind"] for m in out["missed"]] == ["bad_ledger_znode"]
    assert [(b["event"], b["check"], b["bad_znodes"]) for b in out["blinded"]] == [
        ("check failed", "ledgers", [f"bad_ledger_znode {BIG}"])
    ]


def test_a_ledger_beyond_2_63_as_metadata_invalid_or_unexpected_is_reported() -> None:
    f = bad("bad_ledger_znode", BIG)
    as_invalid = violation(140.0, 2**63, "metadata_invalid", path=BIG)
    as_unexpected = line(
        141.0, "znodes under the ledgers root that are not ledgers", examples=[BIG]
    )
    for shown in (as_invalid, as_unexpected):
        out = run([shown], [f])
        assert (out["reportable_faults_reported"], out["false_alarms"]) == (1, [])
    out = run([violation(140.0, 2**63, "no_replica", path=BIG)], [f])
    assert [a["category"] for a in out["false_alarms"]] == ["no_replica"]


def test_a_failure_under_a_bad_znode_explained_by_a_zookeeper_restart_is_not_blindness() -> None:
    f = bad("bad_ctime", "/ledgers/underreplication/replicascheckctime", evidence=False)
    zk = Fault("zk_restart", "127.0.0.1:2181", 138.0, end=140.0, repaired=140.0)
    failed = line(141.0, "check failed", check="replicas", error="ZkUnavailableError")
    assert run([failed], [f, zk])["blinded"] == []
    out = run([failed], [f])
    assert len(out["blinded"]) == 1
    assert run([line(300.0, "check failed", check="replicas")], [f])["failures_elsewhere"] == 1


# --- leadership ------------------------------------------------------------------------------


def test_a_leadership_that_does_not_hold_is_a_flap_unless_a_cluster_fault_explains_it() -> None:
    f = bad("bad_delay", "/ledgers/underreplication/lostBookieRecoveryDelay", evidence=False)
    spans = [
        Span("soak-1", 120.0, 120.003, "stepped down"),
        Span("soak-2", 121.0, 900.0, "run end"),
    ]
    out = run([], [f], spans)
    assert [(x["daemon"], x["bad_znodes"]) for x in out["leader_flaps"]] == [
        ("soak-1", ["bad_delay /ledgers/underreplication/lostBookieRecoveryDelay"])
    ]
    cut = Fault("zk_partition", "soak-1", 110.0, end=119.0, repaired=119.0, daemon="soak-1")
    assert run([], [f, cut], spans)["leader_flaps"] == []
    killed = [Span("soak-1", 120.0, 120.003, "killed")]
    assert run([], [f], killed)["leader_flaps"] == []


def test_two_daemons_acting_in_one_overlap_is_reported() -> None:
    spans = [Span("soak-0", 0.0, 50.0, "stepped down"), Span("soak-1", 45.0, 900.0, "run end")]
    one_side = [line(46.0, "check started", "soak-1")]
    out = run(one_side, [], spans)
    assert (len(out["leader_overlaps_raw"]), out["leader_overlaps_acting"]) == (1, [])
    both = [*one_side, line(47.0, "violation", "soak-0", ledger_id=1, category="no_replica")]
    assert len(run(both, [], spans)["leader_overlaps_acting"]) == 1


def test_leadership_spans_end_at_step_down_kill_or_run_end() -> None:
    data = b"\n".join(
        json.dumps({"timestamp": f"2026-01-01T00:00:{s:02d}Z", "event": e}).encode()
        for s, e in [(1, "elected auditor"), (5, "no longer the auditor"), (9, "elected auditor")]
    )
    lines = parse_lines("soak-0", data + b"\nTraceback (most recent call last):")
    assert [ln.event for ln in lines] == [
        "elected auditor",
        "no longer the auditor",
        "elected auditor",
    ]
    t0 = lines[0].t
    spans = leadership("soak-0", lines, stopped=t0 + 20, killed=True, run_end=t0 + 100)
    assert [(s.end - t0, s.ended) for s in spans] == [(4.0, "stepped down"), (20.0, "killed")]


# --- SOAK_SEEDS ------------------------------------------------------------------------------


def test_seeds_are_a_list_of_numbers_and_ranges() -> None:
    assert parse_seeds("") == []
    assert parse_seeds("3, 1,2-4,1") == [3, 1, 2, 4]
    for bad_value in ("a", "1,,x", "5-2", "-1", "1-5000"):
        with pytest.raises(SeedsError):
            parse_seeds(bad_value)


def test_the_combined_verdict_passes_only_if_every_seed_passes(tmp_path: Any) -> None:
    def summary(seed: int, verdict: str, false_alarms: int) -> dict[str, Any]:
        return {
            "seed": seed,
            "verdict": verdict,
            "minutes": 10.5,
            "failures": [] if verdict == "PASS" else ["false alarms: 1"],
            "faults_injected": 100,
            "reportable_faults": 20,
            "reportable_faults_reported": 20,
            "false_alarms": [{}] * false_alarms,
            "faults_by_kind": {"host_restart": {"injected": 3, "survived": 3}},
        }

    ok = combine([summary(1, "PASS", 0), summary(2, "PASS", 0)], tmp_path)
    assert (ok["verdict"], ok["totals"]["faults_injected"]) == ("PASS", 200)
    assert ok["faults_by_kind"]["host_restart"] == {"injected": 6, "survived": 6}
    failed = combine([summary(1, "PASS", 0), summary(2, "FAIL", 1)], tmp_path)
    assert (failed["verdict"], failed["totals"]["false_alarms"]) == ("FAIL", 1)
    assert failed["lines"][1].startswith(
        "seed 2: FAIL (10.5 min, 100 faults, 20/20 reported, 1 false"
    )
    assert combine([], tmp_path)["verdict"] == "FAIL"


# --- the replication worker's idea of a whole ledger ----------------------------------------


def test_each_bookie_must_hold_the_entries_of_its_write_sets() -> None:
    md: LedgerMetadata = make_metadata(
        7, [(0, [B1, B2, B3]), (4, [B1, B2, B4])], write_quorum=2, ack_quorum=2, last_entry_id=5
    )
    # E=3, W=2: entry e goes to the bookies at (e, e+1) mod 3 of its segment's ensemble.
    assert expected_entries(md) == {B1: {0, 2, 3, 5}, B2: {0, 1, 3, 4}, B3: {1, 2}, B4: {4, 5}}


def test_elections_behind_a_held_election_are_a_loop_past_two() -> None:
    """Issue 30's hot loop as the soak sees it: a foreign vote held 100-130 s; a campaign
    under way may end in one election, many are a loop. Elections after it are not."""
    held = Fault("foreign_vote", "/ledgers/underreplication/auditorelection/V_1", 100.0)
    held.end = held.repaired = 130.0
    once = [line(101.0, "elected auditor"), line(131.0, "elected auditor", "soak-2")]
    assert run(once, [held], [])["election_loops"] == []
    loop = [line(100.0 + i / 10, "elected auditor") for i in range(30)]
    assert run(loop, [held], [])["election_loops"] == [
        {"kind": "foreign_vote", "start": 100.0, "elections": 30}
    ]


def test_an_unanswered_status_under_idle_connections_is_a_lockout_unless_a_kill_explains_it() -> (
    None
):
    siege = Fault("idle_http", "soak-1", 100.0, end=140.0, repaired=140.0, asked=40)
    siege.unanswered = [120.0]
    assert run([], [siege], [])["http_lockouts"] == [
        {"daemon": "soak-1", "asked": 40, "unanswered": [120.0]}
    ]
    killed = Fault("leader_kill", "soak-1", 118.0, end=122.0, repaired=122.0, daemon="soak-1")
    assert run([], [siege, killed], [])["http_lockouts"] == []
    answered = Fault("idle_http", "soak-1", 100.0, end=140.0, repaired=140.0, asked=40)
    assert run([], [answered], [])["http_lockouts"] == []


def test_a_leadership_going_on_under_a_held_election_is_a_second_auditor() -> None:
    """What seed 79 showed before the fix: the leader led on under a foreign `V_1` ahead of
    it. A step-down within 5 s of the vote is none; a leadership after it ends is none."""
    held = Fault("garbage_vote", "/ledgers/underreplication/auditorelection/V_1", 100.0)
    held.end = held.repaired = 130.0
    on = [Span("soak-1", 50.0, 400.0, "run end")]
    assert run([], [held], on)["led_beside_held_votes"] == [
        {"kind": "garbage_vote", "start": 100.0, "daemon": "soak-1"}
    ]
    stepped = [Span("soak-1", 50.0, 101.2, "stepped down"), Span("soak-2", 131.0, 400.0, "run end")]
    assert run([], [held], stepped)["led_beside_held_votes"] == []


# --- real workers (`soak.repairs`, `soak.run.parse_worker`) ------------------------------


def test_a_take_ahead_of_a_riskier_waiting_ledger_is_a_break_of_the_risk_order() -> None:
    from soak.repairs import figures

    lines = [
        line(10.0, "ledger taken for re-replication", ledger=7, copies_left=1,
             free_beside=4, fewest_copies_left_waiting=1),
        line(11.0, "ledger taken for re-replication", "soak-1", ledger=8, copies_left=2,
             free_beside=1, fewest_copies_left_waiting=1),
        line(12.0, "ledger taken for re-replication", ledger=9, copies_left=2,
             free_beside=2, fewest_copies_left_waiting=2),
        line(12.5, "ledger taken for re-replication", ledger=11, copies_left=2,
             free_beside=0, fewest_copies_left_waiting=None),
        line(13.0, "ledger taken for re-replication", ledger=10),  # a take with no ranking
    ]  # fmt: skip
    got = figures(lines)
    assert got["ledgers_taken"] == 5
    assert got["takes_with_others_waiting"] == 3
    assert got["risk_order_breaks"] == [
        {
            "daemon": "soak-1",
            "t": 11.0,
            "ledger": 8,
            "copies_left": 2,
            "fewest_copies_left_waiting": 1,
        }
    ]


def test_workers_figures_name_unrecoverable_ledgers_and_count_failures_by_reason() -> None:
    from soak.repairs import figures

    lines = [
        line(1.0, "ledger not re-replicated", ledger=3, reason="unknown_bookies"),
        line(2.0, "ledger not re-replicated", "soak-2", ledger=4, reason="unrecoverable"),
        line(3.0, "ledger re-replicated", ledger=3),
        line(4.0, "violation", ledger_id=3, category="no_replica"),
    ]
    got = figures(lines)
    assert got["attempts_failed"] == {"unknown_bookies": 1, "unrecoverable": 1}
    assert got["unrecoverable"] == [4]
    assert got["ledgers_re_replicated"] == 1
    assert got["by_daemon"] == {
        "soak-0": {"ledger not re-replicated": 1, "ledger re-replicated": 1},
        "soak-2": {"ledger not re-replicated": 1},
    }


def test_a_bookie_a_worker_committed_explains_lines_about_that_ledger() -> None:
    """A worker moved ledger 1 to B4 (and on again): a later crash of B4 explains a
    violation of ledger 1 naming B4, although the driver never read that ensemble."""
    from soak.repairs import bookies_given

    lines = [
        line(50.0, "fragments committed", ledger=1, replaced={B1: B4}),
        line(60.0, "fragments committed", ledger=1, replaced={B4: B1}),
    ]
    ever = {lid: set(bs) for lid, bs in EVER.items()}
    for lid, given in bookies_given(lines).items():
        ever.setdefault(lid, set()).update(given)
    assert ever[1] == {B1, B2, B3, B4}
    alarm = violation(130.0, 1, "ledgers_on_lost_bookies", bookie=B4)
    without = judge({"soak-0": [alarm]}, [], [crash(B4, 100.0, 170.0)], EVER, END)
    with_moves = judge({"soak-0": [alarm]}, [], [crash(B4, 100.0, 170.0)], ever, END)
    assert len(without["false_alarms"]) == 1
    assert with_moves["false_alarms"] == []


def test_soak_worker_setting() -> None:
    from soak.run import parse_worker

    assert parse_worker("") == "real"
    assert parse_worker(" simulated ") == "simulated"
    with pytest.raises(ValueError, match="SOAK_WORKER: 'java'"):
        parse_worker("java")


def test_fds_judged_against_what_a_leading_copying_daemon_holds_and_not_under_a_siege() -> None:
    from pathlib import Path

    from soak.analysis import _flatness
    from soak.cluster import Incarnation

    def inc(early: int, late: int, siege_at: float | None = None) -> Incarnation:
        i = Incarnation(1, Path("/dev/null"), 0.0)
        for t in range(0, 400, 10):
            fds = early if t < 200 else late
            if siege_at is not None and t >= siege_at:
                fds = 280
            i.samples.append((float(t), 60_000, fds))
        return i

    assert _flatness(inc(19, 31))["verdict"] == "flat"  # seed 5151: no leak
    assert _flatness(inc(19, 45))["verdict"] == "grew"
    sieged = inc(24, 24, siege_at=290.0)
    assert _flatness(sieged)["verdict"] == "grew"
    assert _flatness(sieged, [(290.0, 400.0)])["verdict"] == "flat"
