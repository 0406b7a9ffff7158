"""`bk-auditor explain` and gRPC `Explain` on a real ZooKeeper and emulated bookies.

Every scenario compares whole sections of the document with what the
round-robin schedule says must be there: bookie `i` of an E=3/W=2 ensemble
holds the entries `e` with `(i - e) mod 3 < 2`, so of entries 0..6 index 0
holds 0,2,3,5,6, index 1 holds 0,1,3,4,6 and index 2 holds 1,2,4,5.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc

from auditor.analysis.explain_run import LedgerNotFoundError, explain_ledger
from auditor.api.server import ApiServer, start_api_server
from auditor.bookie.protocol import Operation
from auditor.checks.context import CheckContext
from auditor.daemon.service import Daemon
from auditor.metadata.model import LedgerState
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.proto import auditor_service_pb2 as pb
from auditor.proto import auditor_service_pb2_grpc as pb_grpc
from auditor.store import MetadataStore
from auditor.testing.cli import bk
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.inprocess import fast_config
from auditor.zk import ZkClient
from tests.integration.test_api import open_api, rpc_error

CTIME = 1_700_000_000_000
NOW = 1_800_000_000.0
RACKAWARE = "RackawareEnsemblePlacementPolicy"
HELD = {0: [[0, 0], [2, 3], [5, 6]], 1: [[0, 1], [3, 4], [6, 6]], 2: [[1, 2], [4, 5]]}
EXPECTED = {0: 5, 1: 5, 2: 4}


def write_racks(tmp_path: Path, ids: list[str], racks: list[str]) -> Path:
    path = tmp_path / "racks.json"
    path.write_text(json.dumps(dict(zip(ids, racks, strict=True))))
    return path


async def write_ledger(tc: TestCluster, ledger_id: int, **kw: Any) -> None:
    await tc.writer.write_ledger(
        ledger_id, tc.ids[:3], write_quorum=2, num_entries=7, ctime=CTIME, **kw
    )


def ok(reason: str) -> dict[str, Any]:
    return {"outcome": "ok", "reason": reason, "violations": []}


OK_GRACE = ok("not marked under-replicated")
OK_BOOKIES = ok("every bookie of every ensemble is registered")
OK_LEDGERS = ok("every sampled read of every fragment succeeded")
OK_PLACEMENT = ok(f"every segment adheres strictly to {RACKAWARE}")
OK_REPLICAS = ok("every entry has its 2 copies where they are known")


def bookie_row(
    i: int, bookie: str, rack: str, source: str | None, missing: list[list[int]] | None = None
) -> dict[str, Any]:
    missing = missing or []
    gone = {e for a, b in missing for e in range(a, b + 1)}
    held: list[list[int]] = []
    for a, b in HELD[i]:
        for e in range(a, b + 1):
            if e in gone:
                continue
            if held and held[-1][1] == e - 1:
                held[-1][1] = e
            else:
                held.append([e, e])
    return {
        "index": i,
        "bookie": bookie,
        "rack": rack,
        "rack_source": source,
        "registration": "writable",
        "expected_entries": EXPECTED[i],
        "answer": "listed",
        "held_ranges": held,
        "held_ranges_truncated": False,
        "missing_entries": len(gone),
        "missing_ranges": missing,
    }


def write_sets(ids: list[str], racks: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "start": s,
            "bookies": [ids[s], ids[(s + 1) % 3]],
            "racks": [racks[s], racks[(s + 1) % 3]],
            "distinct_racks": len({racks[s], racks[(s + 1) % 3]}),
        }
        for s in range(3)
    ]


def healthy_doc(ids: list[str], racks: list[str], source: str) -> dict[str, Any]:
    return {
        "ledger_id": 1,
        "metadata": {
            "path": "/ledgers/00/0000/L0001",
            "format_version": 3,
            "znode_version": 0,
            "state": "CLOSED",
            "ensemble_size": 3,
            "write_quorum": 2,
            "ack_quorum": 2,
            "last_entry_id": 6,
            "length": 112,
            "digest_type": "CRC32C",
            "ctime": CTIME,
            "custom_metadata": {},
        },
        "owner": None,
        "placement_policy": RACKAWARE,
        "segments": [
            {
                "first_entry": 0,
                "last_entry": 6,
                "ensemble": ids,
                "write_sets": write_sets(ids, racks),
                "bookies": [bookie_row(i, ids[i], racks[i], source) for i in range(3)],
                "copies": {
                    "min_copies": 2,
                    "status": "ok",
                    "ranges": [{"entries": [0, 6], "copies": 2, "status": "ok"}],
                    "ranges_total": 1,
                    "entries_by_copies": {"2": 7},
                },
            }
        ],
        "underreplication_mark": None,
        "categories": [],
        "checks": {
            "replicas": OK_REPLICAS,
            "placement": OK_PLACEMENT,
            "grace": OK_GRACE,
            "bookies": OK_BOOKIES,
            "ledgers": OK_LEDGERS,
        },
    }


async def test_healthy_ledger_cli_json_and_text(zk: ZkClient, tmp_path: Path) -> None:
    async with test_cluster(zk, 3) as tc:
        racks = ["/r0", "/r1", "/r2"]
        path = write_racks(tmp_path, tc.ids, racks)
        await write_ledger(tc, 1)
        flags = ["--zk", zk.hosts, "--set", f"checks.racks_file={path}"]
        code, out, err = await bk("explain", "1", "--json", *flags)
        assert code == 0, err
        lines = out.strip().splitlines()
        assert len(lines) == 1
        assert json.loads(lines[0]) == healthy_doc(tc.ids, racks, f"file:{path}")

        code, out, err = await bk("explain", "1", *flags)
        assert code == 0, err
        text = out.splitlines()
        assert text[0] == (
            "ledger 1  CLOSED  E=3 W=2 A=2  last entry 6  length 112  format v3, znode version 0"
        )
        assert "  under-replication mark: none" in text
        assert "    copies (W=2, A=2): 0-6: 2 (ok)" in text
        assert f"    replicas   ok        {OK_REPLICAS['reason']}" in text
        assert f"    ledgers    ok        {OK_LEDGERS['reason']}" in text


async def test_missing_copies_ranges_and_categories(store: MetadataStore, tmp_path: Path) -> None:
    async with test_cluster(store, 3) as tc:
        ids = tc.ids
        await write_ledger(tc, 2)
        # Entry 1 is on indexes 1 and 2: gone from both (no copy); entry 4 loses one copy.
        tc.bookies[1].drop_entries(2, [1, 4])
        tc.bookies[2].drop_entries(2, [1])
        async with tc.context() as ctx:
            doc = await explain_ledger(ctx, 2)
        seg = doc["segments"][0]
        assert seg["bookies"] == [
            bookie_row(0, ids[0], "/default-rack", None),
            bookie_row(1, ids[1], "/default-rack", None, [[1, 1], [4, 4]]),
            bookie_row(2, ids[2], "/default-rack", None, [[1, 1]]),
        ]
        assert seg["copies"] == {
            "min_copies": 0,
            "status": "no_replica",
            "ranges": [
                {"entries": [0, 0], "copies": 2, "status": "ok"},
                {"entries": [1, 1], "copies": 0, "status": "no_replica"},
                {"entries": [2, 3], "copies": 2, "status": "ok"},
                {"entries": [4, 4], "copies": 1, "status": "below_ack_quorum"},
                {"entries": [5, 6], "copies": 2, "status": "ok"},
            ],
            "ranges_total": 5,
            "entries_by_copies": {"0": 1, "1": 1, "2": 5},
        }
        # Every write quorum of a single default rack fails the rack-aware policy too.
        assert doc["categories"] == ["no_replica", "placement_not_adhering", "unreadable_fragments"]
        assert doc["checks"]["replicas"] == {
            "outcome": "violation",
            "reason": "some entries have 0 of 2 copies (ack quorum 2)",
            "violations": [
                {
                    "ledger_id": 2,
                    "category": "no_replica",
                    "bookie": None,
                    "detail": {
                        "copies_found": 0,
                        "write_quorum": 2,
                        "ack_quorum": 2,
                        "ensemble_size": 3,
                        "worst_entries": [[1, 1]],
                        "missing": [
                            {
                                "segment": [0, 6],
                                "bookie": ids[1],
                                "entries": [[1, 1], [4, 4]],
                                "count": 2,
                            },
                            {"segment": [0, 6], "bookie": ids[2], "entries": [[1, 1]], "count": 1},
                        ],
                        "unanswered": {},
                        "verified": {b: "listed" for b in sorted(ids)},
                        "metadata_version": 0,
                    },
                }
            ],
        }
        # The ledger check reads each bookie's first and last stored entry: index 2's
        # first one (entry 1) is gone.
        ledgers = doc["checks"]["ledgers"]
        assert ledgers["outcome"] == "violation"
        assert ledgers["reason"] == f"fragments unreadable from: {ids[2]}"
        [v] = ledgers["violations"]
        assert (v["category"], v["bookie"]) == ("unreadable_fragments", ids[2])
        assert v["detail"]["bad_bookies"] == [ids[2]]
        [frag] = v["detail"]["fragments"]
        assert [(b["bookie"], b["failed_entries"]) for b in frag["bad_bookies"]] == [
            (ids[2], [[1, 1]])
        ]
        assert doc["checks"]["grace"] == OK_GRACE
        assert doc["checks"]["bookies"] == OK_BOOKIES


async def test_placement_violation_names_the_window(store: MetadataStore, tmp_path: Path) -> None:
    async with test_cluster(store, 3) as tc:
        ids = tc.ids
        racks = ["/r0", "/r0", "/r1"]
        path = write_racks(tmp_path, ids, racks)
        await write_ledger(tc, 3)
        async with tc.context(overrides=[f"checks.racks_file={path}"]) as ctx:
            doc = await explain_ledger(ctx, 3)
        seg = doc["segments"][0]
        assert seg["write_sets"] == write_sets(ids, racks)
        assert [ws["distinct_racks"] for ws in seg["write_sets"]] == [1, 2, 2]
        assert doc["categories"] == ["placement_not_adhering"]
        assert doc["checks"]["placement"] == {
            "outcome": "violation",
            "reason": "1 segment(s) FAIL: write quorum spans 1 rack(s), needs 2",
            "violations": [
                {
                    "ledger_id": 3,
                    "category": "placement_not_adhering",
                    "bookie": None,
                    "detail": {
                        "policy": RACKAWARE,
                        "write_quorum": 2,
                        "ack_quorum": 2,
                        "segments": [
                            {
                                "first_entry": 0,
                                "ensemble": ids,
                                "adherence": "FAIL",
                                "reason": "write quorum spans 1 rack(s), needs 2",
                                "window": {
                                    "start": 0,
                                    "bookies": ids[:2],
                                    "locations": ["/r0", "/r0"],
                                },
                            }
                        ],
                        "metadata_version": 0,
                    },
                }
            ],
        }
        assert doc["checks"]["replicas"] == OK_REPLICAS


def _fixed_clock(ctx: CheckContext) -> None:
    ctx.clock = lambda: NOW


async def test_marked_ledgers_show_the_mark_and_grace(store: MetadataStore, tmp_path: Path) -> None:
    async with test_cluster(store, 3) as tc:
        ids = tc.ids
        path = write_racks(tmp_path, ids, ["/r0", "/r1", "/r2"])
        await write_ledger(tc, 4)
        await write_ledger(tc, 5)
        urm = UnderreplicationManager(store, "/ledgers")
        now_ms = int(NOW * 1000)
        await urm.mark_underreplicated(4, [ids[1]], now_ms=now_ms - 7_200_000)
        await urm.mark_underreplicated(5, [ids[2]], now_ms=now_ms - 60_000)
        overrides = [
            f"checks.racks_file={path}",
            "underreplicatedLedgerRecoveryGracePeriod=3600",
        ]
        async with tc.context(overrides=overrides) as ctx:
            _fixed_clock(ctx)
            late = await explain_ledger(ctx, 4)
            fresh = await explain_ledger(ctx, 5)
        past = {
            "ledger_id": 4,
            "category": "underreplicated_past_grace_period",
            "bookie": None,
            "detail": {
                "marked_at_ms": now_ms - 7_200_000,
                "age_s": 7200,
                "grace_period_s": 3600,
                "replicas": [ids[1]],
            },
        }
        assert late["underreplication_mark"] == {
            "missing_replicas": [ids[1]],
            "ctime": now_ms - 7_200_000,
        }
        assert late["categories"] == ["underreplicated_past_grace_period"]
        assert late["checks"]["replicas"] == {
            "outcome": "violation",
            "reason": "marked under-replicated for longer than the grace period",
            "violations": [past],
        }
        assert late["checks"]["grace"] == {
            "outcome": "violation",
            "reason": "marked 7200s ago, past the grace period of 3600s",
            "violations": [past],
        }
        assert fresh["underreplication_mark"] == {
            "missing_replicas": [ids[2]],
            "ctime": now_ms - 60_000,
        }
        assert fresh["categories"] == []
        assert fresh["checks"]["replicas"] == {
            "outcome": "skipped",
            "reason": "underreplicated: marked under-replicated: re-replication owns it",
            "violations": [],
        }
        assert fresh["checks"]["grace"] == ok("marked 60s ago, within the grace period of 3600s")
        # The copies are still shown: the mark does not hide what the bookies hold.
        assert fresh["segments"][0]["copies"]["entries_by_copies"] == {"2": 7}


async def test_lost_bookie_is_down_and_unanswered(store: MetadataStore, tmp_path: Path) -> None:
    async with test_cluster(store, 3) as tc:
        ids = tc.ids
        path = write_racks(tmp_path, ids, ["/r0", "/r1", "/r2"])
        await write_ledger(tc, 6)
        await tc.bookies[2].stop()
        async with tc.context(overrides=[f"checks.racks_file={path}"]) as ctx:
            doc = await explain_ledger(ctx, 6)
        row = doc["segments"][0]["bookies"][2]
        assert (row["registration"], row["answer"]) == ("down", "unanswered")
        assert doc["categories"] == ["ledgers_on_lost_bookies", "unreadable_fragments"]
        assert doc["checks"]["bookies"] == {
            "outcome": "violation",
            "reason": f"ensemble bookies neither writable nor read-only: {ids[2]}",
            "violations": [
                {
                    "ledger_id": 6,
                    "category": "ledgers_on_lost_bookies",
                    "bookie": ids[2],
                    "detail": {
                        "segments": [0],
                        "ledger_state": "closed",
                        "missing_replicas": [ids[2]],
                        "metadata_version": 0,
                    },
                }
            ],
        }
        # An unregistered bookie that does not answer is the bookie check's finding.
        assert doc["checks"]["replicas"] == ok(
            f"{OK_REPLICAS['reason']}; {ids[2]} did not answer and is not registered "
            "(the bookie check's)"
        )


async def test_replication_disabled_skips_the_ledger_check(
    store: MetadataStore, tmp_path: Path
) -> None:
    """With replication disabled the ledger check reads nothing and marks nothing: explain
    says so and does not read entries either; the other checks' verdicts stand."""
    async with test_cluster(store, 3) as tc:
        ids = tc.ids
        path = write_racks(tmp_path, ids, ["/r0", "/r1", "/r2"])
        await write_ledger(tc, 6)
        await tc.bookies[2].stop()
        urm = UnderreplicationManager(store, "/ledgers")
        await urm.disable_replication()
        async with tc.context(overrides=[f"checks.racks_file={path}"]) as ctx:
            doc = await explain_ledger(ctx, 6)
            assert [b.received[Operation.READ_ENTRY] for b in tc.bookies[:2]] == [0, 0]
            await urm.enable_replication()
            again = await explain_ledger(ctx, 6)
        assert doc["checks"]["ledgers"] == {
            "outcome": "skipped",
            "reason": "replication_disabled: the ledger check reads nothing until it is enabled",
            "violations": [],
        }
        assert doc["categories"] == ["ledgers_on_lost_bookies"]
        assert doc["checks"]["bookies"]["outcome"] == "violation"
        # Enabled again, the same ledger's fragments on the stopped bookie are unreadable.
        assert again["checks"]["ledgers"]["outcome"] == "violation"
        assert again["categories"] == ["ledgers_on_lost_bookies", "unreadable_fragments"]
        # The rest is what it was (a refused connection's reason names the client's back-off).
        for k in ("metadata", "underreplication_mark", "placement_policy"):
            assert again[k] == doc[k], k
        for now, before in zip(again["segments"], doc["segments"], strict=True):
            assert now["copies"] == before["copies"]
            answers = [(r["bookie"], r["registration"], r["answer"]) for r in now["bookies"]]
            assert answers == [
                (r["bookie"], r["registration"], r["answer"]) for r in before["bookies"]
            ]


async def test_missing_ledger_is_exit_2_one_line(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        async with tc.context() as ctx:
            try:
                await explain_ledger(ctx, 99)
            except LedgerNotFoundError as exc:
                assert str(exc) == "ledger 99 does not exist under /ledgers"
            else:
                raise AssertionError("no error for a missing ledger")
        for args in (["99"], ["99", "--json"], ["x"]):
            code, out, err = await bk("explain", *args, "--zk", zk.hosts)
            assert code == 2 and out == ""
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        code, _, err = await bk("explain", "99", "--zk", zk.hosts)
        assert err == "bk-auditor: error: ledger 99 does not exist under /ledgers\n"


async def test_grpc_explain_equals_the_cli_json(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        await write_ledger(tc, 1)
        tc.bookies[1].drop_entries(1, [3])
        code, cli_out, err = await bk("explain", "1", "--json", "--zk", zk.hosts)
        assert code == 1, err
        api = await open_api(zk)
        try:
            resp = await api.stub.Explain(pb.ExplainRequest(ledger_id=1), timeout=30)
            assert resp.ledger_id == 1
            assert resp.explain_json + "\n" == cli_out
            assert list(resp.categories) == ["below_ack_quorum", "placement_not_adhering"]
            error = await rpc_error(api.stub.Explain(pb.ExplainRequest(ledger_id=42), timeout=30))
            assert error.code() == grpc.StatusCode.NOT_FOUND
            assert error.details() == (
                "explaining ledger 42: ledger 42 does not exist under /ledgers"
            )
            code, out, err = await bk("explain", "1", "--json", "--api", api.target)
            assert (code, out) == (1, cli_out), err
            code, out, err = await bk("explain", "42", "--api", api.target)
            assert (code, out) == (2, "")
            assert err == (
                "bk-auditor: error: explaining ledger 42: ledger 42 does not exist under /ledgers\n"
            )
        finally:
            await api.channel.close()
            await api.server.stop(0)


async def test_the_daemon_serves_explain(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        await write_ledger(tc, 1)
        tc.bookies[0].drop_entries(1, [5])
        started: asyncio.Future[ApiServer] = asyncio.get_running_loop().create_future()

        async def api_factory(control: Daemon) -> ApiServer:
            server = await start_api_server(control, host="127.0.0.1", port=0, token=None)
            started.set_result(server)
            return server

        daemon = Daemon(fast_config(zk.hosts, "auditor-1:3181"))
        run = asyncio.ensure_future(daemon.run(api_factory=api_factory, signals=False))
        try:
            server = await asyncio.wait_for(started, 30)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = pb_grpc.AuditorServiceStub(channel)
                resp = await stub.Explain(pb.ExplainRequest(ledger_id=1), timeout=30)
            async with tc.context() as ctx:
                direct = await explain_ledger(ctx, 1)
            assert json.loads(resp.explain_json) == direct
            assert direct["checks"]["replicas"]["violations"][0]["category"] == "below_ack_quorum"
        finally:
            daemon.stop()
            await asyncio.wait_for(run, 30)


async def test_open_and_undecodable_ledgers(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        ids = tc.ids
        await tc.writer.write_ledger(
            7, ids, write_quorum=2, num_entries=4, state=LedgerState.OPEN, ctime=CTIME
        )
        path = await tc.cluster.write_raw(8, b"BookieMetadataFormatVersion\t3\n\x07garbage")
        async with tc.context() as ctx:
            opened = await explain_ledger(ctx, 7)
            broken = await explain_ledger(ctx, 8)
        [seg] = opened["segments"]
        assert (seg["first_entry"], seg["last_entry"], seg["copies"]) == (0, -1, None)
        assert [b["answer"] for b in seg["bookies"]] == ["not_asked"] * 3
        assert opened["checks"]["replicas"] == {
            "outcome": "skipped",
            "reason": "open: only closed ledgers are judged",
            "violations": [],
        }
        assert opened["checks"]["placement"]["outcome"] == "skipped"
        # The ledger check reads an open ledger up to its LAC: the bookies hold entries 0..3.
        assert opened["checks"]["ledgers"] == OK_LEDGERS
        assert opened["categories"] == []

        reason = broken["metadata"]["error"]
        invalid = {
            "outcome": "violation",
            "reason": reason,
            "violations": [
                {
                    "ledger_id": 8,
                    "category": "metadata_invalid",
                    "bookie": None,
                    "detail": {"reason": reason, "path": path, "metadata_version": 0},
                }
            ],
        }
        assert broken == {
            "ledger_id": 8,
            "metadata": {"path": path, "znode_version": 0, "error": reason},
            "owner": None,
            "placement_policy": None,
            "segments": [],
            "underreplication_mark": None,
            "categories": ["metadata_invalid"],
            "checks": {
                "replicas": invalid,
                "placement": invalid,
                "grace": OK_GRACE,
                "bookies": invalid,
                "ledgers": invalid,
            },
        }
        code, out, _ = await bk("explain", "8", "--zk", zk.hosts)
        assert code == 1
        assert out.splitlines()[0] == f"ledger 8: metadata does not decode: {reason}"
