"""A broken rack source on the command line: it stops what needs racks, and only that.

`check all` runs five checks and only placement reads racks; a malformed Pulsar
`/bookies` znode (or a racks file it will not read) must leave the other four
to run and report, as the daemon does, with the placement error named and exit
2. Real ZooKeeper, real emulated bookies, the CLI in a child process.
"""

from __future__ import annotations

import json
from pathlib import Path

from auditor.testing.cli import bk, one_json
from auditor.testing.harness import TestCluster, test_cluster
from auditor.zk import ZkClient

FAST = ["--set", "checks.retry_delay=0.1", "--set", "readEntryTimeout=1"]
BROKEN = b"{not json"


def _json_error(text: bytes) -> str:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return str(exc)
    raise AssertionError("valid JSON")


#: What the placement check says of the broken znode, on its own or within `check all`.
ZNODE_ERROR = f"rack znode /bookies is not valid JSON: {_json_error(BROKEN)}"


async def _cluster_with_a_lost_bookie(tc: TestCluster) -> None:
    b = tc.ids
    await tc.writer.write_ledger(1, b[0:3], write_quorum=2, num_entries=10)
    await tc.writer.write_ledger(2, b[1:4], write_quorum=2, num_entries=10)
    await tc.bookies[3].crash()  # ledger 2 loses a bookie


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("bk-auditor: error:")]


async def test_malformed_rack_znode_stops_placement_only(zk: ZkClient) -> None:
    async with test_cluster(zk, 4) as tc:
        await _cluster_with_a_lost_bookie(tc)
        await zk.create("/bookies", BROKEN)

        code, out, err = await bk("check", "all", "--zk", zk.hosts, "--json", *FAST)
        assert code == 2, err
        doc = one_json(out)
        assert doc["check"] == "all"
        assert doc["failed"] == {"placement": ZNODE_ERROR}
        reports = doc["reports"]
        # Every check that needs no racks ran, in the usual order, with its usual findings.
        assert list(reports) == ["bookies", "ledgers", "replicas", "grace"]
        assert reports["bookies"]["lost_bookies"] == [tc.ids[3]]
        assert reports["bookies"]["counts"]["ledgers_on_lost_bookies"] == 1
        assert reports["ledgers"]["counts"]["unreadable_fragments"] == 1
        assert [v["ledger_id"] for v in reports["ledgers"]["violations"]] == [2]
        assert reports["replicas"]["ledgers_checked"] == 2
        assert reports["replicas"]["violations"] == []
        assert reports["grace"]["ledgers_checked"] == 0
        assert _error_lines(err) == [
            f"bk-auditor: error: check placement could not run: {ZNODE_ERROR}"
        ]
        assert "Traceback" not in err

        # The same in text: the four reports, then the one that could not run.
        code, out, err = await bk("check", "all", "--zk", zk.hosts, *FAST)
        assert code == 2, err
        heads = [line.split(":")[0] for line in out.splitlines() if line.startswith("check ")]
        assert heads == [
            "check bookies",
            "check ledgers",
            "check replicas",
            "check grace",
            "check placement",
        ]
        assert out.splitlines()[-1] == f"check placement: could not run: {ZNODE_ERROR}"

        # Placement asked for alone: its error is the answer, as before.
        code, out, err = await bk("check", "placement", "--zk", zk.hosts, "--json", *FAST)
        assert (code, out) == (2, "")
        assert _error_lines(err) == [f"bk-auditor: error: {ZNODE_ERROR}"]

        # The znode repaired: all five run again and the exit code is that of the findings.
        await zk.set("/bookies", json.dumps({}).encode())
        code, out, err = await bk("check", "all", "--zk", zk.hosts, "--json", *FAST)
        assert code == 1, err
        doc = one_json(out)
        assert "failed" not in doc
        assert list(doc["reports"]) == ["bookies", "ledgers", "placement", "replicas", "grace"]


async def test_yaml_racks_file_stops_placement_only(zk: ZkClient, tmp_path: Path) -> None:
    async with test_cluster(zk, 4) as tc:
        await _cluster_with_a_lost_bookie(tc)
        racks = tmp_path / "racks.yaml"
        racks.write_text(f"{tc.ids[0]}: /r1\n")
        refusal = (
            f"racks file {racks} is YAML, which is not read: write the same mapping as a "
            'JSON object {"<bookie>": "</rack>"} in a .json file'
        )
        code, out, err = await bk(
            "check", "all", "--zk", zk.hosts, "--json", "--set", f"checks.racks_file={racks}", *FAST
        )
        assert code == 2, err
        doc = one_json(out)
        assert doc["failed"] == {"placement": refusal}
        assert list(doc["reports"]) == ["bookies", "ledgers", "replicas", "grace"]
        assert _error_lines(err) == [f"bk-auditor: error: check placement could not run: {refusal}"]

        # what-if reads the same format: the same line, under its flag.
        code, out, err = await bk("what-if", "--zk", zk.hosts, "--racks", str(racks), "--json")
        assert (code, out) == (2, "")
        assert _error_lines(err) == [f"bk-auditor: error: --racks {racks}: {refusal}"]


async def test_a_rack_that_names_no_rack_is_named_not_defaulted_silently(zk: ZkClient) -> None:
    """Pulsar's `/bookies` with a rack of `"/"` for one bookie and `""` for another: both
    fall to the default rack (as before), and the placement report names each entry as
    invalid input, with a warning, so the violation that default may hide is not silent:
    exit 1 where the same cluster without those entries is clean."""
    async with test_cluster(zk, 3) as tc:
        b = tc.ids
        await tc.writer.write_ledger(1, b[0:3], write_quorum=2, num_entries=10)
        good = {"default": {b[0]: {"rack": "/r1"}, b[1]: {"rack": "/r2"}, b[2]: {"rack": "/r3"}}}
        await zk.create("/bookies", json.dumps(good).encode())
        clean = ["--set", "ensemblePlacementPolicy=RackawareEnsemblePlacementPolicy"]
        code, out, err = await bk("check", "placement", "--zk", zk.hosts, "--json", *clean)
        assert code == 0, err
        assert one_json(out)["invalid_znodes"] == {"total": 0, "listed": []}
        bad = {"default": {b[0]: {"rack": "/r1"}, b[1]: {"rack": "/"}, b[2]: {"rack": ""}}}
        await zk.set("/bookies", json.dumps(bad).encode())
        code, out, err = await bk("check", "placement", "--zk", zk.hosts, "--json", *clean)
        assert code == 1, err
        why = "names no rack; the bookie takes the placement policy's default rack"
        assert one_json(out)["invalid_znodes"] == {
            "total": 2,
            "listed": [
                {"path": "/bookies", "reason": f"default/{b[1]}: rack '/' {why}"},
                {"path": "/bookies", "reason": f"default/{b[2]}: rack '' {why}"},
            ],
        }
        assert "rack entry names no rack" in err


async def test_a_racks_file_rack_that_names_no_rack_is_named(zk: ZkClient, tmp_path: Path) -> None:
    """The racks file's rule is Pulsar's: a rack of `"/"` or `""` is named as invalid input
    (null stays the way to say "unknown"), where before it fell silently to the default."""
    async with test_cluster(zk, 3) as tc:
        b = tc.ids
        await tc.writer.write_ledger(1, b[0:3], write_quorum=2, num_entries=10)
        racks = tmp_path / "racks.json"
        racks.write_text(json.dumps({b[0]: "/r1", b[1]: "/", b[2]: None}))
        code, out, err = await bk(
            "check", "placement", "--zk", zk.hosts, "--json",
            "--set", f"checks.racks_file={racks}",
            "--set", "ensemblePlacementPolicy=RackawareEnsemblePlacementPolicy",
        )  # fmt: skip
        assert code == 1, err
        why = (
            "names no rack; the bookie takes the placement policy's default rack "
            "(write null for a bookie whose rack is unknown)"
        )
        assert one_json(out)["invalid_znodes"] == {
            "total": 1,
            "listed": [{"path": f"racks file {racks}", "reason": f"{b[1]!r}: rack '/' {why}"}],
        }


async def test_explain_risk_and_bookies_degrade_as_check_all_does(zk: ZkClient) -> None:
    """On a malformed `/bookies`, `explain`, `risk` and `bookies` no longer refuse to run:
    each answers what needs no racks (explain's replicas and ledgers verdicts, risk's
    bookie losses, every bookie's state), says in one error line that racks could not be
    read, and exits 2, as `check all` runs the other checks when placement cannot."""
    async with test_cluster(zk, 4) as tc:
        await _cluster_with_a_lost_bookie(tc)
        await zk.create("/bookies", BROKEN)
        b = tc.ids

        code, out, err = await bk("explain", "2", "--zk", zk.hosts, "--json", *FAST)
        assert code == 2, err
        doc = one_json(out)
        assert doc["checks"]["placement"] == {
            "outcome": "failed",
            "reason": f"not judged: the rack sources cannot be read ({ZNODE_ERROR})",
            "violations": [],
        }
        assert doc["checks"]["ledgers"]["outcome"] == "violation"
        assert doc["categories"] == ["ledgers_on_lost_bookies", "unreadable_fragments"]
        assert _error_lines(err) == [
            f"bk-auditor: error: check placement: not judged: the rack sources cannot be "
            f"read ({ZNODE_ERROR})"
        ]

        code, out, err = await bk("risk", "--zk", zk.hosts, "--json", *FAST)
        assert code == 2, err
        doc = one_json(out)
        assert doc["racks_unreadable"] == ZNODE_ERROR
        assert doc["ledgers_checked"] == 2
        assert doc["lost_bookies"] == [b[3]]
        assert doc["unlocated_bookies"] == sorted(b)
        assert _error_lines(err) == [
            f"bk-auditor: error: rack sources unreadable, rack losses not judged: {ZNODE_ERROR}"
        ]

        code, out, err = await bk("bookies", "--zk", zk.hosts, "--json")
        assert code == 2, err
        rows = [json.loads(line) for line in out.splitlines()]
        assert [(r["bookie_id"], r["rack"], r["rack_source"]) for r in rows] == [
            (bookie, "/default-rack", None) for bookie in sorted(b)
        ]
        assert _error_lines(err) == [
            "bk-auditor: error: rack sources unreadable, every bookie shown at the default "
            f"rack: {ZNODE_ERROR}"
        ]
