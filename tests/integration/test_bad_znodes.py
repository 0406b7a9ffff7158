"""Every znode the product reads, holding bad bytes, on a real ZooKeeper: one test per row of
the table in docs/reliability.md ("Bad znodes") whose handling is the metadata layer's.

Each test writes the garbage (arbitrary bytes, a truncated value, a value of about 1 MB, an
id beyond 2^63-1) and asserts the exact outcome: the bad znode named where it belongs,
everything else still listed or checked, and the exit status.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from auditor.checks.replicas_run import ReplicasRun, run_replicas_check
from auditor.metadata.layout import Layout, LedgerManager
from auditor.metadata.ledger_tree import WRONG_LAYOUT_FLAT, WRONG_LAYOUT_HIERARCHICAL
from auditor.metadata.paths import LONG_MAX
from auditor.metadata.registry import READONLY, register_bookie, service_info_bytes
from auditor.metadata.serde import encode_ledger_metadata
from auditor.metadata.underreplication import (
    UnderreplicationFormatError,
    UnderreplicationManager,
    ur_ledger_path,
    ur_lock_path,
)
from auditor.testing.cli import bk, one_json
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.harness import test_cluster
from auditor.zk import ZkClient

ROOT = "/ledgers"
BASE = f"{ROOT}/underreplication"
E = ["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"]
#: What `check` needs to finish quickly against emulated bookies.
FAST = ["--set", "checks.retry_delay=0.1", "--set", "readEntryTimeout=1"]
#: A value of about 1 MB (ZooKeeper's default limit is 1 MiB less a byte).
HUGE = 1_000_000
#: FAST, with a placement policy the emulated bookies (one rack) satisfy: a healthy
#: cluster's `check all` is then clean (exit 0), so exit 1 says what the test wrote.
CLEAN = [*FAST, "--set", "ensemblePlacementPolicy=DefaultEnsemblePlacementPolicy"]
#: The checks that walk the ledgers (`check all`'s others: grace reads only the marks).
WALKING = ("bookies", "ledgers", "placement", "replicas")


def garbage(_valid: bytes) -> bytes:
    return b"\x00\xff{ not what was expected \x80"


def truncated(valid: bytes) -> bytes:
    return valid[: len(valid) // 2]


def huge(valid: bytes) -> bytes:
    return valid[:40] + b"\xfe" * (HUGE - 40)


KINDS: dict[str, Callable[[bytes], bytes]] = {
    "garbage": garbage,
    "truncated": truncated,
    "huge": huge,
}


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("bk-auditor: error: ")]


# --- ledger znodes -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(
    ("manager", "ids"),
    [
        (LedgerManager.FLAT, [1, 2, 3]),
        (LedgerManager.LEGACY_HIERARCHICAL, [1, 2, 2_000_000_000]),
        (LedgerManager.LONG_HIERARCHICAL, [1, 2, LONG_MAX]),
        (LedgerManager.HIERARCHICAL, [1, 3_000_000_000, LONG_MAX]),
    ],
)
async def test_a_ledger_znode_with_bad_bytes_in_each_layout(
    zk: ZkClient, manager: LedgerManager, ids: list[int], kind: str
) -> None:
    w = ClusterWriter(zk, ROOT, manager)
    await w.init_cluster()
    good, bad, other = ids
    for i in (good, other):
        await w.write_ledger(make_metadata(i, E))
    path = await w.write_raw(bad, KINDS[kind](encode_ledger_metadata(make_metadata(bad, E))))
    code, out, err = await bk("ledgers", "--zk", zk.hosts, "--json")
    assert code == 1
    assert [json.loads(line)["ledger_id"] for line in out.splitlines()] == [good, other]
    [error] = _errors(err)
    assert error.startswith(f"bk-auditor: error: ledger {bad} at {path}: ")
    assert len(error) < 400  # the reason quotes a bounded part of the bytes
    assert err.splitlines()[-1] == "3 ledgers, 1 corrupt, 0 deleted during the walk"


async def test_a_corrupt_ledger_znode_is_metadata_invalid_in_every_check(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        for i in (1, 3):
            await tc.writer.write_ledger(i, tc.ids, write_quorum=2, num_entries=4)
        path = await tc.cluster.write_raw(2, garbage(b""))
        code, out, err = await bk("check", "all", "--zk", zk.hosts, "--json", *FAST)
        assert code == 1, err
        reports = one_json(out)["reports"]
        assert list(reports) == ["bookies", "ledgers", "placement", "replicas", "grace"]
        for name in ("bookies", "ledgers", "placement", "replicas"):
            invalid = [
                v for v in reports[name]["violations"] if v["category"] == "metadata_invalid"
            ]
            assert [(v["ledger_id"], v["detail"]["path"]) for v in invalid] == [(2, path)], name
            assert reports[name]["counts"]["metadata_invalid"] == 1, name
        # The other ledgers were checked: clean, but for placement (the emulated bookies
        # share one rack).
        for name in ("bookies", "ledgers", "replicas"):
            assert len(reports[name]["violations"]) == 1, name
        assert {v["ledger_id"] for v in reports["placement"]["violations"]} == {1, 2, 3}


#: Znodes shaped like ledgers' that no ledger can be (the id range is 0..2^63-1).
BEYOND = {
    "/ledgers/922/3372/0368/5477/L5808": f"a ledger id is 0..{LONG_MAX}, got {2**63}",
    "/ledgers/922/3372/0368/5477/L58080": "a ledger's name here is L and 4 digits, not 5",
    "/ledgers/999/9999/9999/9999/L9999": f"a ledger id is 0..{LONG_MAX}, got {10**19 - 1}",
}


async def test_ledger_znodes_beyond_the_id_range_are_named_and_everything_else_listed(
    zk: ZkClient,
) -> None:
    w = ClusterWriter(zk)
    await w.init_cluster()
    for i in (1, 2**40, LONG_MAX):
        await w.write_ledger(make_metadata(i, E))
    for path in BEYOND:
        await zk.create(path, encode_ledger_metadata(make_metadata(5, E)), makepath=True)
    code, out, err = await bk("ledgers", "--zk", zk.hosts, "--json")
    assert code == 1
    assert [json.loads(line)["ledger_id"] for line in out.splitlines()] == [1, 2**40, LONG_MAX]
    assert err.splitlines() == [
        *(f"bk-auditor: error: invalid ledger znode {p}: {why}" for p, why in BEYOND.items()),
        "3 ledgers, 0 corrupt, 0 deleted during the walk, 3 invalid ledger znodes, "
        f"3 unexpected znodes (first: {next(iter(BEYOND))})",
    ]


async def test_a_ledger_znode_beyond_the_id_range_does_not_stop_the_checks(
    zk: ZkClient,
) -> None:
    beyond, why = next(iter(BEYOND.items()))
    async with test_cluster(zk, 3) as tc:
        for i in (1, 2):
            await tc.writer.write_ledger(i, tc.ids, write_quorum=2, num_entries=4)
        # The same cluster without the bad znode: nothing to report.
        code, out, err = await bk("check", "all", "--zk", zk.hosts, "--json", *CLEAN)
        assert code == 0, err
        await zk.create(beyond, encode_ledger_metadata(make_metadata(5, E)), makepath=True)
        code, out, err = await bk("check", "all", "--zk", zk.hosts, "--json", *CLEAN)
        # Before: exit 70 and no report. Now every report, over the two real ledgers, each
        # walking check naming the bad znode: exit 1, as for a violation.
        assert code == 1, err
        assert "Traceback" not in err
        reports = one_json(out)["reports"]
        assert list(reports) == ["bookies", "ledgers", "placement", "replicas", "grace"]
        for name in WALKING:
            assert reports[name]["ledgers_checked"] == 2, name
            assert reports[name]["violations_total"] == 0, name
            assert reports[name]["invalid_znodes"] == {
                "total": 1,
                "listed": [{"path": beyond, "reason": why}],
            }, name
        assert reports["grace"]["invalid_znodes"] == {"total": 0, "listed": []}
        # The text report names it too, one line per check that walked.
        code, out, err = await bk("check", "all", "--zk", zk.hosts, *CLEAN)
        assert code == 1, err
        assert out.count(f"  invalid znode {beyond}: {why}\n") == len(WALKING)
        # Each check asked for alone says the same.
        for name in WALKING:
            code, out, err = await bk("check", name, "--zk", zk.hosts, "--json", *CLEAN)
            assert code == 1, (name, err)
            assert one_json(out)["invalid_znodes"]["listed"] == [{"path": beyond, "reason": why}]
        for command in (["risk"], ["what-if", "--decommission", tc.ids[0]]):
            code, out, err = await bk(*command, "--zk", zk.hosts, "--json")
            assert code in (0, 1), (command, err)
            assert "internal error" not in err and "Traceback" not in err
            assert [json.loads(line) for line in out.splitlines()], command


async def test_a_scan_and_a_snapshot_name_bad_znodes_in_their_summary(
    zk: ZkClient, tmp_path: Path
) -> None:
    beyond, why = next(iter(BEYOND.items()))
    async with test_cluster(zk, 3) as tc:
        for i in (1, 2, 3):
            await tc.writer.write_ledger(i, tc.ids, write_quorum=2, num_entries=4)
        await zk.create(beyond, encode_ledger_metadata(make_metadata(5, E)), makepath=True)
        bad = await _marks_with_corrupt_ones(zk, int(time.time() * 1000) - 60_000)
        sets = [*CLEAN, "--set", "underreplicatedLedgerRecoveryGracePeriod=3600"]
        out = tmp_path / "scan"
        common = ["--engine", "asyncio", "--partitions", "3"]
        code, _, err = await bk("scan", *common, "--zk", zk.hosts, "--out", str(out), *sets)
        assert code == 1, err  # nothing but the bad znodes to report
        reports = json.loads((out / "summary.json").read_text())["reports"]
        assert list(reports) == ["placement", "replicas", "grace", "metadata"]
        for name in ("placement", "replicas", "metadata"):
            # The partition running to 2^63 named it; the others did not (once in all).
            assert reports[name]["invalid_znodes"] == {
                "total": 1,
                "listed": [{"path": beyond, "reason": why}],
            }, name
            assert reports[name]["violations_total"] == 0, name
        assert [z["path"] for z in reports["grace"]["invalid_znodes"]["listed"]] == sorted(bad)
        assert reports["replicas"]["ledgers_skipped"] == {"underreplicated": 3}

        snap, judged = tmp_path / "snap", tmp_path / "judged"
        code, _, err = await bk("snapshot", *common, "--zk", zk.hosts, "--out", str(snap), *sets)
        assert code == 0, err
        cluster = json.loads((snap / "cluster.json").read_text())
        assert (cluster["ledgers"], cluster["invalid_znodes"]) == (
            3,
            {"total": 1, "listed": [{"path": beyond, "reason": why}]},
        )
        code, _, err = await bk(
            "scan", *common, "--from-snapshot", str(snap), "--out", str(judged), *sets
        )
        assert code == 1, err
        reports = json.loads((judged / "summary.json").read_text())["reports"]
        for name in ("placement", "metadata"):
            assert reports[name]["ledgers_checked"] == 3, name
            assert reports[name]["violations_total"] == 0, name
            assert reports[name]["invalid_znodes"]["listed"] == [{"path": beyond, "reason": why}]
        # A snapshot taken before snapshots named them judges as before: nothing named.
        del cluster["invalid_znodes"]
        (snap / "cluster.json").write_text(json.dumps(cluster))
        code, _, err = await bk(
            "scan",
            *common,
            "--from-snapshot",
            str(snap),
            "--out",
            str(judged),
            "--overwrite",
            *sets,
        )
        assert code == 0, err


# --- under-replication marks and locks -------------------------------------------------------


async def _marks_with_corrupt_ones(zk: ZkClient, ctime: int = 1_700_000_000_000) -> dict[str, str]:
    """Two valid marks (ledgers 1 and 3, made at `ctime`) and a corrupt one of each kind;
    their reasons."""
    urm = UnderreplicationManager(zk, ROOT)
    await urm.check_layout()
    for i in (1, 3):
        await urm.mark_underreplicated(i, [E[0]], now_ms=ctime)
    valid = (await zk.get(ur_ledger_path(BASE, 1)))[0]
    bad = {
        ur_ledger_path(BASE, 2): (garbage(valid), "does not decode: 1:1: expected a field name"),
        ur_ledger_path(BASE, 4): (truncated(valid), "does not decode: "),
        ur_ledger_path(BASE, 5): (b"\xfe" * HUGE, "does not decode: 1:1: expected a field name"),
        f"{BASE}/ledgers/7fff/ffff/ffff/ffff/urL9223372036854775808": (
            b"",
            f"mark name spells ledger id {2**63}, outside 0..{LONG_MAX}",
        ),
    }
    for path, (data, _) in bad.items():
        await zk.create(path, data, makepath=True)
    return {path: why for path, (_, why) in bad.items()}


async def test_one_corrupt_mark_hides_no_other_in_list_underreplicated(zk: ZkClient) -> None:
    await ClusterWriter(zk).init_cluster()
    bad = await _marks_with_corrupt_ones(zk)
    code, out, err = await bk("list-underreplicated", "--zk", zk.hosts)
    assert code == 1
    assert [line.split() for line in out.splitlines()] == [
        ["1", "ctime=1700000000000", f"missing={E[0]}"],
        ["3", "ctime=1700000000000", f"missing={E[0]}"],
    ]
    errors = _errors(err)
    assert len(errors) == len(bad)
    for line, (path, why) in zip(errors, bad.items(), strict=True):
        assert line.startswith(f"bk-auditor: error: corrupt under-replication mark {path}: {why}")
        assert len(line) < 400
    assert (
        err.splitlines()[-1] == "2 under-replicated ledgers, 4 corrupt marks; auto-recovery enabled"
    )

    code, out, err = await bk("list-underreplicated", "--zk", zk.hosts, "--json")
    assert code == 1
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r for r in rows if "corrupt" not in r] == [
        {"ledger_id": 1, "replicas": [E[0]], "ctime": 1_700_000_000_000},
        {"ledger_id": 3, "replicas": [E[0]], "ctime": 1_700_000_000_000},
    ]
    corrupt = [r for r in rows if "corrupt" in r]
    assert [(r["path"], r["ledger_id"]) for r in corrupt] == [
        (p, None if p.endswith("urL9223372036854775808") else int(p[-10:])) for p in bad
    ]
    assert all(r["corrupt"].startswith(bad[r["path"]]) for r in corrupt)
    assert _errors(err) == []


async def test_corrupt_marks_do_not_stop_the_checks(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        for i in (1, 2, 3, 6):
            await tc.writer.write_ledger(i, tc.ids, write_quorum=2, num_entries=4)
        grace = ["--set", "underreplicatedLedgerRecoveryGracePeriod=3600"]
        code, out, err = await bk("check", "all", "--zk", zk.hosts, "--json", *CLEAN, *grace)
        assert code == 0, err  # the same cluster without marks: nothing to report
        # The valid marks are a minute old: within the grace period.
        bad = await _marks_with_corrupt_ones(zk, int(time.time() * 1000) - 60_000)
        code, out, err = await bk("check", "all", "--zk", zk.hosts, "--json", *CLEAN, *grace)
        # Before: exit 2 and no report (the replicas and grace checks failed on the mark).
        # Now the grace check names each corrupt mark, and that is exit 1.
        assert code == 1, err
        doc = one_json(out)
        assert "failed" not in doc
        reports = doc["reports"]
        assert list(reports) == ["bookies", "ledgers", "placement", "replicas", "grace"]
        named = reports["grace"]["invalid_znodes"]
        assert named["total"] == len(bad)
        assert [z["path"] for z in named["listed"]] == sorted(bad)
        for z in named["listed"]:
            assert z["reason"].startswith(bad[z["path"]]) and len(z["reason"]) < 400
        # The valid marks (1 and 3, within the grace period) are judged as ever.
        assert reports["grace"]["ledgers_checked"] == 2
        assert reports["grace"]["violations_total"] == 0
        # Ledger 2's mark is corrupt but its name spells the ledger: still a mark, so the
        # replicas check skips ledger 2 as it skips 1 and 3; ledger 6 is checked.
        assert reports["replicas"]["ledgers_skipped"] == {"underreplicated": 3}
        assert reports["replicas"]["ledgers_checked"] == 1
        assert reports["replicas"]["violations_total"] == 0
        # The replicas check read the marks too, and names the corrupt ones as grace does;
        # the other walking checks read no mark.
        for name in WALKING:
            expected = named if name == "replicas" else {"total": 0, "listed": []}
            assert reports[name]["invalid_znodes"] == expected, name
        # One warning per corrupt mark and check that read it, naming it (console log
        # lines on stderr).
        warned = [line for line in err.splitlines() if "corrupt under-replication mark" in line]
        assert all("[warning  ]" in line for line in warned)
        for check in ("replicas", "grace"):
            by = [line for line in warned if f" check={check} " in line]
            assert [re.findall(r" path=(\S+)", line) for line in by] == [[p] for p in bad]
        assert len(warned) == 2 * len(bad)
        # `check grace` alone: the same, one text line per corrupt mark.
        code, out, err = await bk("check", "grace", "--zk", zk.hosts, *CLEAN, *grace)
        assert code == 1, err
        lines = [line for line in out.splitlines() if line.startswith("  invalid znode ")]
        assert [line.split()[2].rstrip(":") for line in lines] == sorted(bad)


async def test_the_fresh_look_before_a_report_takes_a_corrupt_mark_as_a_mark(
    zk: ZkClient,
) -> None:
    async with test_cluster(zk, 3) as tc:
        # No bookie holds ledger 7's entries: a no_replica violation on the first look.
        await tc.cluster.write_ledger(make_metadata(7, tc.ids, write_quorum=2, last_entry_id=9))
        async with tc.context(overrides=["checks.retry_delay=0.1"]) as ctx:
            run = ReplicasRun(ctx)
            await run.begin()  # no marks yet: the first look will not skip it
            # Marked meanwhile, by a mark another writer corrupted.
            path = ur_ledger_path(BASE, 7)
            await zk.create(path, garbage(b""), makepath=True)
            await run.first_pass()
            report = run.finish()
        assert report.violations.total == 0
        assert dict(report.ledgers_skipped) == {"underreplicated": 1}
        assert dict(report.dropped) == {"marked_meanwhile": 1}
        # And the next run's listing takes it as a mark from the start (no drop to count).
        async with tc.context() as ctx:
            report = await run_replicas_check(ctx)
        assert (report.violations.total, dict(report.ledgers_skipped)) == (
            0,
            {"underreplicated": 1},
        )
        assert not report.dropped


async def test_explain_names_a_corrupt_mark(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        for i in (1, 2):
            await tc.writer.write_ledger(i, tc.ids, write_quorum=2, num_entries=4)
        bad = await _marks_with_corrupt_ones(zk)
        path = ur_ledger_path(BASE, 2)
        why = "does not decode: 1:1: expected a field name, found byte 0x00"
        assert why.startswith(bad[path])
        code, out, err = await bk("explain", "2", "--zk", zk.hosts, "--json", *CLEAN)
        # Before: a traceback-free failure of the whole explanation. Now it is named.
        assert code == 1, err
        doc = one_json(out)
        assert doc["underreplication_mark"] == {"corrupt": why, "path": path}
        assert doc["categories"] == []
        checks = doc["checks"]
        assert checks["replicas"]["outcome"] == "skipped"
        assert checks["replicas"]["reason"] == (
            f"underreplicated: marked under-replicated by a corrupt mark ({path}: {why}): "
            "re-replication owns it"
        )
        assert checks["grace"] == {
            "outcome": "invalid_znode",
            "reason": f"the mark is corrupt ({path}: {why}): named as an invalid znode",
            "violations": [],
        }
        assert {c["outcome"] for n, c in checks.items() if n not in ("replicas", "grace")} == {"ok"}
        # A valid mark next to it is explained as ever; so is the text form.
        code, out, err = await bk("explain", "1", "--zk", zk.hosts, "--json", *CLEAN)
        assert code == 0, err
        assert one_json(out)["underreplication_mark"] == {
            "missing_replicas": [E[0]],
            "ctime": 1_700_000_000_000,
        }
        code, out, err = await bk("explain", "2", "--zk", zk.hosts, *CLEAN)
        assert code == 1, err
        lines = out.splitlines()
        assert f"  under-replication mark: CORRUPT {path}: {why}" in lines
        assert any(line.split()[:2] == ["grace", "invalid_znode"] for line in lines), out


async def test_explain_refuses_an_id_outside_the_range_in_one_line(zk: ZkClient) -> None:
    await ClusterWriter(zk).init_cluster()
    code, out, err = await bk("explain", str(2**63), "--zk", zk.hosts)
    assert (code, out) == (2, "")
    assert err == f"bk-auditor: error: a ledger id is 0..{LONG_MAX}, got {2**63}\n"


async def test_garbage_replication_locks_are_read_by_nothing_but_their_reader(
    zk: ZkClient,
) -> None:
    await ClusterWriter(zk).init_cluster()
    urm = UnderreplicationManager(zk, ROOT)
    await urm.mark_underreplicated(1, [E[0]], now_ms=1)
    await zk.create(ur_lock_path(BASE, 1), garbage(b""), makepath=True)
    await zk.create(f"{BASE}/locks/urL99999999999999999999", b"\xfe" * HUGE)
    code, out, err = await bk("list-underreplicated", "--zk", zk.hosts)
    assert (code, out.split()) == (0, ["1", "ctime=1", f"missing={E[0]}"]), err
    assert await urm.is_being_replicated(1)
    with pytest.raises(UnderreplicationFormatError) as caught:
        await urm.replication_worker(1)
    assert str(caught.value).startswith(
        f"replication lock of ledger 1 at {ur_lock_path(BASE, 1)} is corrupt: "
    )


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x00\xff{ not a layout", "is corrupt"),
        (b'type: "BAS', "is corrupt"),
        (b'type: "' + b"B" * HUGE + b'"\nversion: 1\n', "only BASIC version 1 is supported"),
        (b'type: "BASIC"\nversion: 2\n', "only BASIC version 1 is supported"),
    ],
)
async def test_a_bad_rereplication_layout_is_a_typed_error_naming_it(
    zk: ZkClient, data: bytes, reason: str
) -> None:
    await zk.create(f"{BASE}/LAYOUT", data, makepath=True)
    with pytest.raises(UnderreplicationFormatError) as caught:
        await UnderreplicationManager(zk, ROOT).check_layout()
    message = str(caught.value)
    assert message.startswith(f"{BASE}/LAYOUT ") and reason in message
    assert len(message) < 400
    # Nothing was written over it.
    assert (await zk.get(f"{BASE}/LAYOUT"))[0] == data


async def test_the_disable_flag_is_its_presence_whatever_it_holds(zk: ZkClient) -> None:
    await ClusterWriter(zk).init_cluster()
    await zk.create(f"{BASE}/disable", b"\xfe" * HUGE)
    code, out, err = await bk("list-underreplicated", "--zk", zk.hosts)
    assert (code, out, err) == (0, "", "0 under-replicated ledgers; auto-recovery DISABLED\n")


# --- the cluster's own znodes ----------------------------------------------------------------


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_bad_layout_is_one_line_naming_it(zk: ZkClient, kind: str) -> None:
    layout = b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    await zk.create(f"{ROOT}/LAYOUT", KINDS[kind](layout), makepath=True)
    code, out, err = await bk("ledgers", "--zk", zk.hosts)
    assert (code, out) == (1, "")
    [line] = err.splitlines()
    assert line.startswith("bk-auditor: error: /ledgers/LAYOUT: ")
    assert len(line) < 400


async def test_bad_bookie_registrations_fall_back_to_the_bookie_id(zk: ZkClient) -> None:
    w = ClusterWriter(zk)
    await w.init_cluster()
    valid = service_info_bytes("127.0.0.1", 4000)
    await zk.create(f"{ROOT}/available/{E[0]}", garbage(valid), ephemeral=True)
    await zk.create(f"{ROOT}/available/{READONLY}/{E[1]}", truncated(valid), ephemeral=True)
    await zk.create(f"{ROOT}/available/{E[2]}", huge(valid), ephemeral=True)
    await register_bookie(zk, ROOT, "bookie-4.example:3181", "127.0.0.1", 4004)
    code, out, err = await bk("bookies", "--zk", zk.hosts, "--json")
    assert code == 0, err
    rows = {r["bookie_id"]: (r["state"], r["address"]) for r in map(json.loads, out.splitlines())}
    # Unreadable registration data is treated as a bookie older than 4.12 (no data): its
    # address is its id. The others are unaffected.
    assert rows == {
        E[0]: ("writable", E[0]),
        E[1]: ("readonly", E[1]),
        E[2]: ("writable", E[2]),
        "bookie-4.example:3181": ("writable", "127.0.0.1:4004"),
    }


async def test_cookie_contents_are_never_decoded(zk: ZkClient) -> None:
    w = ClusterWriter(zk)
    await w.init_cluster()
    await zk.create(f"{ROOT}/cookies/{E[0]}", garbage(b""))
    await zk.create(f"{ROOT}/cookies/{E[1]}", b"\xfe" * HUGE)
    code, out, err = await bk("bookies", "--zk", zk.hosts, "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["bookie_id"], r["state"], r["cookie"]) for r in rows] == [
        (E[0], "down", True),
        (E[1], "down", True),
    ]


async def test_instance_id_and_id_generators_are_not_read(zk: ZkClient) -> None:
    w = ClusterWriter(zk)
    await w.init_cluster()
    await w.write_ledger(make_metadata(1, E))
    await zk.set(f"{ROOT}/INSTANCEID", b"\xfe" * HUGE)
    await zk.set(f"{ROOT}/idgen", garbage(b""))
    await zk.create(f"{ROOT}/idgen-long", garbage(b""))
    code, out, err = await bk("ledgers", "--zk", zk.hosts)
    assert code == 0, err
    assert len(out.splitlines()) == 1
    assert err == "1 ledgers, 0 corrupt, 0 deleted during the walk\n"


async def test_a_stray_znode_among_the_ledgers_is_named(zk: ZkClient) -> None:
    w = ClusterWriter(zk)
    await w.init_cluster()
    await w.write_ledger(make_metadata(1, E))
    await zk.create(f"{ROOT}/00/0000/notaledger", b"\xfe" * HUGE)
    code, out, err = await bk("ledgers", "--zk", zk.hosts)
    assert code == 0, err
    assert len(out.splitlines()) == 1
    assert err == (
        "1 ledgers, 0 corrupt, 0 deleted during the walk, "
        "1 unexpected znodes (first: /ledgers/00/0000/notaledger)\n"
    )


async def test_a_garbage_auditor_vote_is_one_line_naming_it(zk: ZkClient) -> None:
    await ClusterWriter(zk).init_cluster()
    vote = f"{BASE}/auditorelection/V_0000000000"
    await zk.create(vote, garbage(b""), makepath=True)
    code, out, err = await bk("whoisauditor", "--zk", zk.hosts)
    assert (code, out) == (1, "")
    [line] = err.splitlines()
    assert line.startswith(f"bk-auditor: error: auditor vote: {vote}: ")


async def test_a_layout_that_cannot_read_the_ledgers_present_is_never_clean(
    zk: ZkClient,
) -> None:
    """A hierarchical cluster whose LAYOUT names the flat manager: before, every check
    read 0 ledgers and `check all` said all clear (exit 0). The hierarchical directories
    are named as invalid znodes and every walking check fails; and the other way round, a
    flat ledger znode at a hierarchical root is named too."""
    async with test_cluster(zk, 3) as tc:
        for i in (1, 2):
            await tc.writer.write_ledger(i, tc.ids, write_quorum=2, num_entries=4)
        await zk.set(f"{tc.root}/LAYOUT", Layout.current(LedgerManager.FLAT).encode())
        code, out, err = await bk("check", "all", "--zk", zk.hosts, "--json", *CLEAN)
        assert code == 1, err
        reports = one_json(out)["reports"]
        for name in WALKING:
            assert reports[name]["ledgers_checked"] == 0, name
            assert reports[name]["invalid_znodes"] == {
                "total": 1,
                "listed": [{"path": f"{tc.root}/00", "reason": WRONG_LAYOUT_FLAT}],
            }, name
        code, out, err = await bk("ledgers", "--zk", zk.hosts)
        assert code == 1
        assert f"invalid ledger znode {tc.root}/00: {WRONG_LAYOUT_FLAT}" in err
        # Hierarchical again, with a flat ledger's znode at the root.
        await zk.set(f"{tc.root}/LAYOUT", Layout.current(LedgerManager.HIERARCHICAL).encode())
        stray = f"{tc.root}/L0000000007"
        await zk.create(stray, encode_ledger_metadata(make_metadata(7, E)))
        code, out, err = await bk("check", "all", "--zk", zk.hosts, "--json", *CLEAN)
        assert code == 1, err
        reports = one_json(out)["reports"]
        for name in WALKING:
            assert reports[name]["ledgers_checked"] == 2, name
            assert reports[name]["invalid_znodes"]["listed"] == [
                {"path": stray, "reason": WRONG_LAYOUT_HIERARCHICAL}
            ], name
