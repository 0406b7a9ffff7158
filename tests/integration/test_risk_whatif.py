"""`bk-auditor risk` and `bk-auditor what-if` as an operator runs them, on a real ZooKeeper
with emulated bookies holding the ledgers' entries.

The cluster has three racks of two bookies. Some ledgers put both copies of a
write quorum in one rack: `risk` must name that rack with exactly those
ledgers, and `what-if --decommission` must predict exactly what the bookie
check marks once the bookie is really gone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from auditor.checks.bookie_check_run import run_bookie_check
from auditor.metadata.model import LedgerState
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.cli import bk, one_json
from auditor.testing.harness import TestCluster, test_cluster
from auditor.zk import ZkClient

RACKS = ["/rack-a", "/rack-a", "/rack-b", "/rack-b", "/rack-c", "/rack-c"]
RACKAWARE = "ensemblePlacementPolicy=org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy"


def racks_file(tmp_path: Path, tc: TestCluster, racks: list[str], name: str = "racks.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(dict(zip(tc.ids, racks, strict=True))))
    return path


async def three_racks(tc: TestCluster) -> None:
    """Ledgers 1-5 closed (entries written through the protocol), 6 open."""
    b = tc.ids
    w = tc.writer
    await w.write_ledger(1, [b[0], b[2], b[4]], write_quorum=2, num_entries=6)
    await w.write_ledger(2, [b[0], b[1], b[2]], write_quorum=2, num_entries=6)  # (b0, b1): a
    await w.write_ledger(3, [b[2], b[3], b[4]], write_quorum=2, num_entries=6)  # (b2, b3): b
    await w.write_ledger(4, [b[1], b[0], b[5]], write_quorum=2, num_entries=6)  # (b1, b0): a
    await w.write_ledger(5, [b[0], b[2], b[4]], write_quorum=3, ack_quorum=2, num_entries=6)
    await w.write_ledger(
        6, [b[0], b[1], b[2]], write_quorum=2, num_entries=3, state=LedgerState.OPEN
    )


def tally(below: list[int], none: list[int]) -> dict[str, Any]:
    return {
        "below_ack_quorum": {"count": len(below), "ledgers": below},
        "no_copy": {"count": len(none), "ledgers": none},
    }


async def test_risk_names_the_rack_holding_whole_write_quorums(
    zk: ZkClient, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        await three_racks(tc)
        racks = racks_file(tmp_path, tc, RACKS)
        cluster = ["--zk", zk.hosts, "--set", f"checks.racks_file={racks}"]
        code, out, err = await bk("risk", *cluster, "--json", "--top", "2")
        assert code == 1, err
        doc = one_json(out)
        b = tc.ids
        assert doc["ledgers_checked"] == 5
        assert doc["ledgers_skipped"] == {"open": 1}
        assert doc["lost_bookies"] == [] and doc["unlocated_bookies"] == []
        assert doc["already"] == tally([], [])
        assert doc["at_risk"] == tally([1], [2, 3, 4])
        assert doc["domains_at_risk"] == {"bookie": 6, "rack": 3, "region": 0}
        # Every rack hurts three ledgers; rack-a leaves two without any copy.
        assert doc["top"]["rack"] == [
            {"name": "/rack-a", "ledgers": 3, **tally([1], [2, 4])},
            {"name": "/rack-b", "ledgers": 3, **tally([1, 2], [3])},
        ]
        # b0 and b2 each hurt three ledgers (their order is by id, which has a random port).
        assert {row["name"]: row for row in doc["top"]["bookie"]} == {
            b[0]: {"name": b[0], "ledgers": 3, **tally([1, 2, 4], [])},
            b[2]: {"name": b[2], "ledgers": 3, **tally([1, 2, 3], [])},
        }
        assert doc["top"]["region"] == []

        code, text, err = await bk("risk", *cluster)
        assert code == 1, err
        assert "/rack-a" in text and "no_copy 2: 2, 4" in text

        # Spread so no rack holds a whole write quorum: only single bookies remain a risk,
        # and only at W=2 (ledger 5 survives any one loss).
        spread = racks_file(tmp_path, tc, ["/r1", "/r2", "/r3", "/r1", "/r2", "/r3"], "s.json")
        code, out, err = await bk(
            "risk", "--zk", zk.hosts, "--json", "--set", f"checks.racks_file={spread}"
        )
        assert code == 1, err
        doc = one_json(out)
        assert doc["at_risk"] == tally([1, 2, 3, 4], [])
        assert all(row["no_copy"]["count"] == 0 for row in doc["top"]["rack"])


async def marks(zk: ZkClient, root: str) -> dict[int, tuple[str, ...]]:
    urm = UnderreplicationManager(zk, root)
    return {m.ledger_id: m.replicas async for m in urm.list_underreplicated()}


async def test_what_if_decommission_predicts_exactly_what_the_bookie_check_marks(
    zk: ZkClient, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        await three_racks(tc)
        b = tc.ids
        # Ledger 7 lives on b0 alone for its entries (W=1): no copy once b0 is gone.
        await tc.writer.write_ledger(7, [b[0], b[3]], write_quorum=1, ack_quorum=1, num_entries=4)
        code, out, err = await bk("what-if", "--zk", zk.hosts, "--decommission", b[0], "--json")
        assert code == 1, err
        doc = one_json(out)
        assert doc["changes"] == {"racks_file": None, "min_racks": None, "decommission": [b[0]]}
        assert doc["placement"] is None
        assert doc["ledgers_checked"] == 7
        assert doc["decommission"] == {
            "bookies": [b[0]],
            "ledgers_per_bookie": {b[0]: 6},
            "would_be_marked": [1, 2, 4, 5, 6, 7],
            "newly_underreplicated": [1, 2, 4, 5, 6, 7],
            "below_ack_quorum": [1, 2, 4],
            "no_copy": [7],
        }
        assert await marks(zk, tc.root) == {}  # a prediction writes nothing

        await tc.bookies[0].stop()
        async with tc.context(mark=True) as ctx:
            report = await run_bookie_check(ctx)
        marked = await marks(zk, tc.root)
        assert sorted(marked) == doc["decommission"]["would_be_marked"]
        assert sorted(set(report.marked_underreplicated)) == sorted(marked)
        assert set(marked.values()) == {(b[0],)}


async def test_what_if_racks_and_min_racks_give_exact_ledgers(zk: ZkClient, tmp_path: Path) -> None:
    async with test_cluster(zk, 6) as tc:
        await three_racks(tc)
        b = tc.ids
        racks = racks_file(tmp_path, tc, RACKS)
        cluster = ["--zk", zk.hosts, "--set", f"checks.racks_file={racks}", "--set", RACKAWARE]
        # Today 2 and 4 fail (rack-a holds (b0, b1)) and 3 fails (rack-b holds (b2, b3)).
        # Moving b1 to rack-c and b3 to rack-a fixes 2 and 3; 4 still fails, now at (b5, b1).
        new_map = tmp_path / "new.json"
        new_map.write_text(json.dumps({b[1]: "/rack-c", b[3]: "/rack-a"}))
        code, out, err = await bk("what-if", *cluster, "--racks", str(new_map), "--json")
        assert code == 0, err  # nothing gets worse
        doc = one_json(out)
        p = doc["placement"]
        assert p["policy"] == "RackawareEnsemblePlacementPolicy"
        assert p["skipped"] == {"open": 1}
        assert p["moved_bookies"] == {
            b[1]: {"from": "/rack-a", "to": "/rack-c"},
            b[3]: {"from": "/rack-b", "to": "/rack-a"},
        }
        assert p["today"] == {"placement_not_adhering": 3, "placement_softly_adhering": 0}
        assert p["predicted"] == {"placement_not_adhering": 1, "placement_softly_adhering": 0}
        assert p["newly"] == {"placement_not_adhering": [], "placement_softly_adhering": []}
        assert p["no_longer"] == {"placement_not_adhering": [2, 3], "placement_softly_adhering": []}
        assert doc["decommission"] is None

        # minNumRacksPerWriteQuorum=3 with W=3: ledger 5 spans three racks and still adheres;
        # the W=2 ledgers need only min(2, 3) racks, so nothing changes: exit 0.
        code, out, err = await bk("what-if", *cluster, "--min-racks", "3", "--json")
        assert code == 0, err
        assert one_json(out)["placement"]["newly"]["placement_not_adhering"] == []
        # With b4 moved into rack-a, ledger 5's (b0, b2, b4) spans two racks (< 3) and
        # ledger 1's (b4, b0) one.
        moved = tmp_path / "moved.json"
        moved.write_text(json.dumps({b[4]: "/rack-a"}))
        code, out, err = await bk(
            "what-if", *cluster, "--min-racks", "3", "--racks", str(moved), "--json"
        )
        assert code == 1, err
        p = one_json(out)["placement"]
        assert p["newly"]["placement_not_adhering"] == [1, 5]
        assert p["no_longer"]["placement_not_adhering"] == []
        assert p["predicted"]["placement_not_adhering"] == 5


def without_volatile(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in ("started_at", "finished_at", "source")}


async def test_a_snapshot_answers_as_the_live_cluster(zk: ZkClient, tmp_path: Path) -> None:
    async with test_cluster(zk, 6) as tc:
        await three_racks(tc)
        b = tc.ids
        racks = racks_file(tmp_path, tc, RACKS)
        new_map = tmp_path / "new.json"
        new_map.write_text(json.dumps({b[4]: "/rack-a"}))
        conf = ["--set", f"checks.racks_file={racks}"]
        snap = tmp_path / "snap"
        code, _, err = await bk("snapshot", "--zk", zk.hosts, *conf, "--out", str(snap))
        assert code == 0, err
        change = ["--racks", str(new_map), "--min-racks", "3", "--decommission", b[2], "--json"]
        live_code, live, err = await bk("what-if", "--zk", zk.hosts, *conf, *change)
        assert live_code == 1, err
        # No cluster access: no connect string, and the rack file is not read either.
        snap_code, judged, err = await bk("what-if", "--from-snapshot", str(snap), *change)
        assert snap_code == 1, err
        live_doc, snap_doc = one_json(live), one_json(judged)
        assert snap_doc["source"] == f"snapshot:{snap}" and live_doc["source"] == "live"
        assert without_volatile(snap_doc) == without_volatile(live_doc)
        assert live_doc["decommission"]["would_be_marked"] == [1, 2, 3, 5, 6]
        assert live_doc["placement"]["newly"]["placement_not_adhering"] == [1, 5]

        code, live, err = await bk("risk", "--zk", zk.hosts, *conf, "--json")
        assert code == 1, err
        code, judged, err = await bk("risk", "--from-snapshot", str(snap), "--json")
        assert code == 1, err
        assert without_volatile(one_json(judged)) == without_volatile(one_json(live))


async def test_bad_input_is_one_line_and_exit_2(zk: ZkClient, tmp_path: Path) -> None:
    async with test_cluster(zk, 3) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=3)
        cluster = ["--zk", zk.hosts]
        bad_json = tmp_path / "bad.json"
        bad_json.write_text("{not json")
        cases = [
            (["what-if", *cluster, "--decommission", "10.9.9.9:3181"], "unknown bookie"),
            (["what-if", *cluster, "--racks", str(tmp_path / "missing.json")], "no such file"),
            (["what-if", *cluster, "--racks", str(bad_json)], "is not valid JSON"),
            (["what-if", *cluster], "what-if needs --racks"),
            (["what-if", *cluster, "--decommission", ","], "--decommission takes"),
            (["what-if", *cluster, "--min-racks", "-1"], "--min-racks must be >= 0"),
            (
                [
                    "what-if",
                    *cluster,
                    "--min-racks",
                    "2",
                    "--set",
                    "ensemblePlacementPolicy=DefaultEnsemblePlacementPolicy",
                ],
                "--min-racks applies to RackawareEnsemblePlacementPolicy",
            ),
            (["risk", *cluster, "--top", "0"], "--top must be >= 1"),
            (["risk", "--from-snapshot", str(tmp_path)], "is not a complete snapshot"),
            (["what-if", "--decommission", tc.ids[0]], "give --zk"),
        ]
        for args, message in cases:
            code, out, err = await bk(*args)
            assert code == 2, (args, err)
            assert out == "", args
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("bk-auditor: error: "), (args, err)
            assert message in lines[0], (args, err)
        assert await marks(zk, tc.root) == {}
