"""The bulk scan: Spark and in-process engines against `check`, on one seeded cluster.

The cluster is the demo's: 2,000 healthy ledgers and one seeded fault per
category on eight emulated bookies (one crashed, one silent), a real
ZooKeeper. Every engine must find exactly what `check` finds.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from auditor.cli.check import cmd_check
from auditor.cli.main import main
from auditor.config import load_config
from auditor.metadata.cluster import ClusterTarget
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.bookie import BookieEmulator
from auditor.testing.seeded import EXPECTED, ROOT, build_seeded_cluster
from auditor.zk import ZkClient

pytestmark = pytest.mark.slow

SETTINGS = [
    "readEntryTimeout=1",
    "checks.retry_delay=0.2",
    "checks.retry_attempts=1",
    "underreplicatedLedgerRecoveryGracePeriod=3600",
]
SCANNED = ("placement", "replicas", "grace")
#: Evidence that depends on when it was looked at, not on what was found.
VOLATILE = {"age_s"}


@pytest.fixture
async def seeded(
    zk: ZkClient, request: pytest.FixtureRequest
) -> AsyncIterator[list[BookieEmulator]]:
    """The seeded cluster; `@pytest.mark.healthy(n)` makes it smaller than the demo's."""
    marker = request.node.get_closest_marker("healthy")
    bookies = [BookieEmulator(zk, ledgers_root=ROOT) for _ in range(8)]
    for b in bookies:
        await b.start()
    await build_seeded_cluster(zk, bookies, *(marker.args if marker else ()))
    await bookies[6].crash()
    bookies[7].pause()
    try:
        yield bookies
    finally:
        for b in bookies:
            await b.stop()


def _sets(*extra: str) -> list[str]:
    return [a for s in (*SETTINGS, *extra) for a in ("--set", s)]


async def _cli(*args: str) -> int:
    """The real CLI, off the loop: the emulated bookies must keep answering meanwhile."""
    return await asyncio.to_thread(main, list(args))


def _violations(report: dict[str, Any]) -> list[tuple[int, str, str | None, str]]:
    return sorted(
        (
            v["ledger_id"],
            v["category"],
            v["bookie"],
            json.dumps({k: x for k, x in v["detail"].items() if k not in VOLATILE}, sort_keys=True),
        )
        for v in report["violations"]
    )


def _marks(out: Path, bookies: list[BookieEmulator]) -> list[tuple[int, list[int], bool]]:
    """marks.json with bookies as emulator indexes (ports differ from run to run)."""
    ids = {b.bookie_id: i for i, b in enumerate(bookies)}
    doc = json.loads((out / "marks.json").read_text())
    assert all(m["check"] == "replicas" for m in doc)
    return [
        (m["ledger_id"], sorted(ids[b] for b in m["missing_replicas"]), m["marked"]) for m in doc
    ]


def _table(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ds.dataset(str(path), format="parquet").to_table().to_pylist()
    return rows


def _check_output(out: Path, summary: dict[str, Any]) -> None:
    """The Parquet datasets agree with the summary: one violation row per violation,
    one coverage row per ledger judged or skipped."""
    violations = _table(out / "violations")
    expected = sorted(
        (v["ledger_id"], check, v["category"], v["bookie"])
        for check, r in summary["reports"].items()
        for v in r["violations"]
    )
    assert sorted((r["ledger_id"], r["check"], r["category"], r["bookie"]) for r in violations) == (
        expected
    )
    for r in violations:
        assert json.loads(r["evidence"]) is not None
    coverage = _table(out / "coverage")
    for check, report in summary["reports"].items():
        rows = [r for r in coverage if r["check"] == check]
        assert len({r["ledger_id"] for r in rows}) == len(rows), check
        judged = report["ledgers_checked"] + sum(report["ledgers_skipped"].values())
        assert len(rows) == judged, check
        assert sum(r["outcome"] == "violation" for r in rows) == len(
            {v["ledger_id"] for v in report["violations"]}
        )
        if check == "replicas":
            cov = report["coverage"]
            assert sum(r["bookies_listed"] for r in rows) == cov["listed"]
            assert sum(r["bookies_probed"] for r in rows) == cov["probed"]
            assert sum(r["bookies_unverified"] for r in rows) == cov["unverified"]


async def test_spark_asyncio_and_check_agree(
    zk: ZkClient, zk_hosts: str, seeded: list[BookieEmulator], tmp_path: Path
) -> None:
    out = io.StringIO()
    code = await cmd_check(
        ClusterTarget(zk_hosts, ROOT, None, 10.0),
        "all",
        load_config(None, SETTINGS),
        as_json=True,
        mark=False,
        out=out,
    )
    assert code == 1
    checked = json.loads(out.getvalue())["reports"]
    ur_before = await UnderreplicationManager(zk, ROOT).count_underreplicated()

    summaries: dict[str, dict[str, Any]] = {}
    for engine, extra in (
        ("asyncio", ["--partitions", "3"]),
        ("spark", ["--master", "local[2]", "--partitions", "4"]),
    ):
        target = tmp_path / engine
        code = await _cli(
            "scan", "--engine", engine, *extra, "--zk", zk_hosts, *_sets(), "--out", str(target)
        )
        assert code == 1, engine
        summaries[engine] = json.loads((target / "summary.json").read_text())
        _check_output(target, summaries[engine])
        # What --mark would write, not written.
        assert _marks(target, seeded) == [
            (3002, [0, 4], False),
            (3003, [3], False),
            (3004, [4], False),
        ]

    for engine, summary in summaries.items():
        assert list(summary["reports"]) == ["placement", "replicas", "grace", "metadata"]
        for check in SCANNED:
            got, want = summary["reports"][check], checked[check]
            assert got["counts"] == want["counts"] == EXPECTED[check], (engine, check)
            assert _violations(got) == _violations(want), (engine, check)
            assert got["ledgers_checked"] == want["ledgers_checked"], (engine, check)
            assert got["ledgers_skipped"] == want["ledgers_skipped"], (engine, check)
            assert got.get("coverage") == want.get("coverage"), (engine, check)
        assert summary["reports"]["metadata"]["counts"] == {"metadata_invalid": 1}
        assert summary["reports"]["metadata"]["ledgers_checked"] == 2008
    # Without --mark nothing was written, whichever engine ran.
    assert await UnderreplicationManager(zk, ROOT).count_underreplicated() == ur_before


@pytest.mark.healthy(200)
async def test_marks_are_written_once_by_the_driver_after_the_retries(
    zk: ZkClient, zk_hosts: str, seeded: list[BookieEmulator], tmp_path: Path
) -> None:
    urm = UnderreplicationManager(zk, ROOT)
    before = {ur.ledger_id async for ur in urm.list_underreplicated()}
    assert before == {3006}
    out = tmp_path / "marked"
    code = await _cli(
        "scan",
        "--engine",
        "spark",
        "--master",
        "local[2]",
        "--partitions",
        "2",
        "--zk",
        zk_hosts,
        *_sets(),
        "--checks",
        "replicas",
        "--mark",
        "--out",
        str(out),
    )
    assert code == 1
    ids = {b.bookie_id: i for i, b in enumerate(seeded)}
    # The bookies that lack entries, as the replicas check names them.
    assert _marks(out, seeded) == [(3002, [0, 4], True), (3003, [3], True), (3004, [4], True)]
    after = {
        ur.ledger_id: sorted(ids[b] for b in ur.replicas) async for ur in urm.list_underreplicated()
    }
    assert after == {3002: [0, 4], 3003: [3], 3004: [4], 3006: [5]}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reports"]["replicas"]["marked_underreplicated"] == [3002, 3003, 3004]


@pytest.mark.healthy(300)
async def test_snapshot_round_trip_equals_the_live_placement_check(
    zk: ZkClient, zk_hosts: str, seeded: list[BookieEmulator], tmp_path: Path
) -> None:
    out = io.StringIO()
    await cmd_check(
        ClusterTarget(zk_hosts, ROOT, None, 10.0),
        "placement",
        load_config(None, SETTINGS),
        as_json=True,
        mark=False,
        out=out,
    )
    live = json.loads(out.getvalue())
    for engine, extra in (("asyncio", []), ("spark", ["--master", "local[2]"])):
        snap, judged = tmp_path / f"snap-{engine}", tmp_path / f"judged-{engine}"
        code = await _cli(
            "snapshot",
            "--engine",
            engine,
            *extra,
            "--partitions",
            "3",
            "--zk",
            zk_hosts,
            "--out",
            str(snap),
        )
        assert code == 0
        cluster = json.loads((snap / "cluster.json").read_text())
        assert cluster["ledgers"] == 308
        assert len(cluster["locations"]) == 8
        assert len(_table(snap / "ledgers")) == 308
        # No cluster access from here on: not even a connect string is given.
        code = await _cli(
            "scan", "--engine", engine, *extra, "--from-snapshot", str(snap), "--out", str(judged)
        )
        assert code == 1
        summary = json.loads((judged / "summary.json").read_text())
        got = summary["reports"]["placement"]
        assert got["counts"] == live["counts"]
        assert _violations(got) == _violations(live)
        assert got["ledgers_checked"] == live["ledgers_checked"]
        assert got["ledgers_skipped"] == live["ledgers_skipped"]
        assert summary["reports"]["metadata"]["counts"] == {"metadata_invalid": 1}
        _check_output(judged, summary)
