"""The placement check against a real ZooKeeper and a real etcd: upstream's scenarios S7-S15,
and our differences.

Upstream's harness registers fake bookies `98.98.98.i:2181` and maps them to
racks with a static resolver; here the same ids are registered in ZooKeeper
and mapped by a JSON racks file (placement needs only metadata, so no bookie
has to answer). S15 uses emulated bookies and ledgers written through the
real protocol.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from auditor.checks.findings import Category, CheckReport
from auditor.checks.placement_run import run_placement_check
from auditor.errors import ConfigError
from auditor.metadata.model import LedgerState
from auditor.metadata.registry import register_bookie
from auditor.metadata.underreplication import UnderreplicationManager, ur_ledger_path
from auditor.store import MetadataStore
from auditor.testing import harness
from auditor.testing.cluster import make_metadata
from auditor.topology.racks import RackSourceError

RACKAWARE = "ensemblePlacementPolicy=org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy"
ZONEAWARE = "ensemblePlacementPolicy=org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy"
REGIONAWARE = (
    "ensemblePlacementPolicy=org.apache.bookkeeper.client.RegionAwareEnsemblePlacementPolicy"
)


def fake(i: int) -> str:
    return f"98.98.98.{i}:2181"


async def register(tc: harness.TestCluster, n: int) -> list[str]:
    ids = [fake(i) for i in range(n)]
    for i, b in enumerate(ids):
        await register_bookie(tc.store, tc.root, b, f"98.98.98.{i}", 2181)
    return ids


def racks_file(tmp_path: Path, mapping: Mapping[str, str]) -> str:
    path = tmp_path / "racks.json"
    path.write_text(json.dumps(mapping))
    return f"checks.racks_file={path}"


async def ledger(
    tc: harness.TestCluster,
    ledger_id: int,
    segments: Sequence[str] | Sequence[tuple[int, Sequence[str]]],
    w: int,
    a: int,
    *,
    last: int = 100,
    state: LedgerState = LedgerState.CLOSED,
) -> None:
    await tc.cluster.write_ledger(
        make_metadata(
            ledger_id, segments, write_quorum=w, ack_quorum=a, state=state, last_entry_id=last
        )
    )


async def run(tc: harness.TestCluster, *overrides: str, mark: bool = False) -> CheckReport:
    async with tc.context(overrides=list(overrides), mark=mark) as ctx:
        return await run_placement_check(ctx)


def ids(report: CheckReport, category: Category) -> list[int]:
    return sorted({v.ledger_id for v in report.violations if v.category is category})


def not_soft(report: CheckReport) -> tuple[int, int]:
    c = report.counts()
    return c["placement_not_adhering"], c["placement_softly_adhering"]


async def test_s7_bookies_in_different_racks_adhere(store: MetadataStore, tmp_path: Path) -> None:
    """S7: five racks, minNumRacksPerWriteQuorum=4; open ledgers are skipped and counted."""
    async with harness.test_cluster(store, 0) as tc:
        b = await register(tc, 5)
        racks = racks_file(tmp_path, {b[i]: f"/rack{i}" for i in range(5)})
        await ledger(tc, 1, [b[3], b[0], b[4], b[2], b[1]], 4, 2)
        await ledger(tc, 2, [(0, b[:4]), (20, b[1:5]), (60, b[:4])], 4, 2)
        await ledger(tc, 3, b, 4, 2, state=LedgerState.OPEN)
        await ledger(tc, 4, [(0, b[:4]), (20, b[1:5]), (60, b[:4])], 4, 2, state=LedgerState.OPEN)
        report = await run(tc, RACKAWARE, racks, "minNumRacksPerWriteQuorum=4")
    assert not_soft(report) == (0, 0)
    assert report.violations == []
    assert report.ledgers_checked == 2
    assert dict(report.ledgers_skipped) == {"open": 2}


S8_RACKS = ["/rack1", "/rack2", "/rack3", "/rack1", "/rack2"]


async def test_s8_not_adhering_ledger_reported_once_with_its_window(
    store: MetadataStore, tmp_path: Path
) -> None:
    """S8: the wrapping write set {B3, B4, B0} spans 2 racks < 3; the open ledger is ignored."""
    async with harness.test_cluster(store, 0) as tc:
        b = await register(tc, 5)
        racks = racks_file(tmp_path, dict(zip(b, S8_RACKS, strict=True)))
        await ledger(tc, 1, b, 3, 2)
        await ledger(tc, 2, b, 3, 2, state=LedgerState.OPEN)
        report = await run(tc, racks, "minNumRacksPerWriteQuorum=3")
    assert not_soft(report) == (1, 0)
    assert report.ledgers_checked == 1
    assert dict(report.ledgers_skipped) == {"open": 1}
    (v,) = report.violations
    assert (v.ledger_id, v.category, v.bookie) == (1, Category.PLACEMENT_NOT_ADHERING, None)
    assert v.detail["metadata_version"] == 0
    assert v.detail["segments"] == [
        {
            "first_entry": 0,
            "ensemble": b,
            "adherence": "FAIL",
            "reason": "write quorum spans 2 rack(s), needs 3",
            "window": {
                "start": 3,
                "bookies": [b[3], b[4], b[0]],
                "locations": ["/rack1", "/rack2", "/rack1"],
            },
        }
    ]
    assert report.to_json()["counts"] == {
        "placement_not_adhering": 1,
        "placement_softly_adhering": 0,
        "metadata_invalid": 0,
    }


async def s8_single(tc: harness.TestCluster, tmp_path: Path) -> str:
    b = await register(tc, 5)
    await ledger(tc, 1, b, 3, 2)
    # A closed ledger that adheres: it must not be marked.
    await ledger(tc, 2, [b[0], b[1], b[2]], 3, 2)
    return racks_file(tmp_path, dict(zip(b, S8_RACKS, strict=True)))


async def ur_ids(store: MetadataStore, root: str) -> list[int]:
    return sorted(
        [m.ledger_id async for m in UnderreplicationManager(store, root).list_underreplicated()]
    )


async def test_s9_without_repair_nothing_is_marked(store: MetadataStore, tmp_path: Path) -> None:
    """S9: the repair flag keeps its default (false): reported, not marked, even with --mark."""
    async with harness.test_cluster(store, 0) as tc:
        racks = await s8_single(tc, tmp_path)
        report = await run(tc, racks, "minNumRacksPerWriteQuorum=3", mark=True)
        assert not_soft(report) == (1, 0)
        assert report.marked_underreplicated == []
        assert await ur_ids(store, tc.root) == []


async def test_s10_repair_marks_exactly_the_not_adhering_ledger(
    store: MetadataStore, tmp_path: Path
) -> None:
    """S10: with repairedPlacementPolicyNotAdheringBookieEnabled the FAIL ledger is marked
    under-replicated with an empty replica list (the znode holds only a ctime)."""
    async with harness.test_cluster(store, 0) as tc:
        racks = await s8_single(tc, tmp_path)
        opts = (
            racks,
            "minNumRacksPerWriteQuorum=3",
            "repairedPlacementPolicyNotAdheringBookieEnabled=true",
        )
        # Without --mark, nothing is written.
        dry = await run(tc, *opts)
        assert not_soft(dry) == (1, 0)
        assert dry.marked_underreplicated == []
        assert await ur_ids(store, tc.root) == []

        report = await run(tc, *opts, mark=True)
        assert not_soft(report) == (1, 0)
        assert report.marked_underreplicated == [1]
        assert await ur_ids(store, tc.root) == [1]
        data, _ = await store.get(ur_ledger_path(f"{tc.root}/underreplication", 1))
        assert re.fullmatch(rb"ctime: \d+\n", data), data
        mark = await UnderreplicationManager(store, tc.root).get(1)
        assert mark is not None and mark.replicas == ()


async def test_s13_several_failing_segments_count_once(
    store: MetadataStore, tmp_path: Path
) -> None:
    """S13: L2 has two segments spanning 3 racks < 4; it is one violation listing both."""
    async with harness.test_cluster(store, 0) as tc:
        b = await register(tc, 7)
        rack_of = ["/rack1", "/rack2", "/rack3", "/rack4", "/rack1", "/rack2", "/rack3"]
        racks = racks_file(tmp_path, dict(zip(b, rack_of, strict=True)))
        await ledger(tc, 1, [(0, b[0:5]), (20, b[1:6])], 5, 2)
        seg2 = [b[0], b[1], b[2], b[4], b[5]]
        seg3 = [b[0], b[1], b[2], b[4], b[6]]
        await ledger(tc, 2, [(0, b[0:5]), (20, seg2), (40, seg3)], 5, 2)
        report = await run(tc, racks, "minNumRacksPerWriteQuorum=4")
    assert not_soft(report) == (1, 0)
    assert report.ledgers_checked == 2
    (v,) = report.violations
    assert v.ledger_id == 2
    assert [(s["first_entry"], s["ensemble"]) for s in v.detail["segments"]] == [
        (20, seg2),
        (40, seg3),
    ]


async def test_s14_zoneaware(store: MetadataStore, tmp_path: Path) -> None:
    """S14: strict, ignored-open, FAIL (6 mod 5 != 0), and soft (two zones) ledgers."""
    async with harness.test_cluster(store, 0) as tc:
        b = await register(tc, 6)
        racks = racks_file(tmp_path, {b[i]: f"/zone{i % 3}/ud{i % 2}" for i in range(6)})
        await ledger(tc, 1, b, 6, 2)
        await ledger(tc, 2, b, 5, 2, state=LedgerState.OPEN)
        await ledger(tc, 3, b, 5, 2)
        await ledger(tc, 4, [b[0], b[1], b[3], b[4]], 4, 2)
        report = await run(
            tc,
            ZONEAWARE,
            racks,
            "desiredNumZonesPerWriteQuorum=3",
            "minNumZonesPerWriteQuorum=2",
        )
    assert not_soft(report) == (1, 1)
    assert ids(report, Category.PLACEMENT_NOT_ADHERING) == [3]
    assert ids(report, Category.PLACEMENT_SOFTLY_ADHERING) == [4]
    soft = next(v for v in report.violations if v.ledger_id == 4)
    assert soft.detail["segments"][0]["adherence"] == "MEETS_SOFT"
    assert report.ledgers_checked == 3
    assert dict(report.ledgers_skipped) == {"open": 1}


async def test_s15_all_bookies_in_default_rack_fail(store: MetadataStore) -> None:
    """S15: three bookies without rack configuration, W=3: every closed ledger fails,
    since one rack is fewer than min(3, 2)."""
    async with harness.test_cluster(store, 3) as tc:
        for lid in range(1, 11):
            await tc.writer.write_ledger(lid, tc.ids, write_quorum=3, ack_quorum=2, num_entries=2)
        report = await run(tc)
    assert not_soft(report) == (10, 0)
    assert ids(report, Category.PLACEMENT_NOT_ADHERING) == list(range(1, 11))
    assert report.ledgers_checked == 10
    window = report.violations[0].detail["segments"][0]["window"]
    assert window["locations"] == ["/default-rack"] * 3


async def test_regionaware_quorum_in_one_region_is_a_violation(
    store: MetadataStore, tmp_path: Path
) -> None:
    """DIFFERENCE from upstream (region-aware always passes there): with two regions in the
    cluster, a ledger whose write quorums stay in one region does not adhere."""
    async with harness.test_cluster(store, 0) as tc:
        b = await register(tc, 4)
        racks = racks_file(
            tmp_path,
            {b[0]: "/east/r1", b[1]: "/east/r2", b[2]: "/west/r1", b[3]: "/west/r2"},
        )
        await ledger(tc, 1, [b[0], b[1]], 2, 2)  # east only
        await ledger(tc, 2, [b[0], b[2]], 2, 2)  # east + west
        await ledger(tc, 3, [b[0], b[2], b[1], b[3]], 2, 2)  # alternating: every window spans both
        await ledger(tc, 4, [b[0], b[1], b[2], b[3]], 2, 2)  # window {b0, b1} is east only
        report = await run(tc, REGIONAWARE, racks)
    assert not_soft(report) == (2, 0)
    assert ids(report, Category.PLACEMENT_NOT_ADHERING) == [1, 4]
    seg = next(v for v in report.violations if v.ledger_id == 1).detail["segments"][0]
    assert seg["window"]["locations"] == ["/east/r1", "/east/r2"]
    assert seg["reason"] == "write quorum spans 1 known region(s), needs 2 (the cluster has 2)"


async def test_regionaware_single_region_passes(store: MetadataStore, tmp_path: Path) -> None:
    """With one known region in the cluster there is nothing to span: no violation."""
    async with harness.test_cluster(store, 0) as tc:
        b = await register(tc, 3)
        racks = racks_file(tmp_path, {b[0]: "/east/r1", b[1]: "/east/r1", b[2]: "/east/r2"})
        await ledger(tc, 1, [b[0], b[1]], 2, 2)
        await ledger(tc, 2, b, 3, 2)
        report = await run(tc, REGIONAWARE, racks)
    assert report.violations == []
    assert report.ledgers_checked == 2


async def test_regionaware_counts_regions_of_down_bookies(
    store: MetadataStore, tmp_path: Path
) -> None:
    """A region whose only bookie is down (its cookie remains) is still a region of the
    cluster, so an ensemble confined to the other region is reported."""
    async with harness.test_cluster(store, 0) as tc:
        b = await register(tc, 2)
        gone = "98.98.98.9:2181"
        await tc.cluster.add_cookie(gone)  # registered once, down now
        racks = racks_file(tmp_path, {b[0]: "/east/r1", b[1]: "/east/r2", gone: "/west/r1"})
        await ledger(tc, 1, b, 2, 2)
        report = await run(tc, REGIONAWARE, racks)
    assert ids(report, Category.PLACEMENT_NOT_ADHERING) == [1]


async def test_down_bookie_keeps_its_rack(store: MetadataStore, tmp_path: Path) -> None:
    """DIFFERENCE from upstream (racks of down bookies): upstream only knows racks of
    registered writable bookies, so the unregistered B2 would add no rack and the ensemble
    would span 2 racks < 3 (FAIL). Here the racks file still places B2 in its own rack,
    so the ledger adheres."""
    async with harness.test_cluster(store, 0) as tc:
        b = await register(tc, 2)
        down = "98.98.98.7:2181"  # in the ensemble, never registered now
        racks = racks_file(tmp_path, {b[0]: "/rack1", b[1]: "/rack2", down: "/rack3"})
        await ledger(tc, 1, [b[0], b[1], down], 3, 2)
        report = await run(tc, racks, "minNumRacksPerWriteQuorum=3")
    assert report.violations == []
    assert report.ledgers_checked == 1


async def test_metadata_invalid_and_in_recovery(store: MetadataStore, tmp_path: Path) -> None:
    """Undecodable metadata is reported with its reason and path; in-recovery ledgers skip."""
    async with harness.test_cluster(store, 0) as tc:
        b = await register(tc, 3)
        racks = racks_file(tmp_path, {b[0]: "/r1", b[1]: "/r2", b[2]: "/r3"})
        await ledger(tc, 1, b, 3, 2)
        path = await tc.cluster.write_raw(2, b"this is not ledger metadata")
        await ledger(tc, 3, b, 3, 2, state=LedgerState.IN_RECOVERY)
        await ledger(tc, 4, b, 3, 2, state=LedgerState.OPEN)
        report = await run(tc, racks)
    assert ids(report, Category.METADATA_INVALID) == [2]
    (v,) = report.violations
    assert v.detail["path"] == path
    assert v.detail["reason"]
    assert report.ledgers_checked == 2
    assert dict(report.ledgers_skipped) == {"in_recovery": 1, "open": 1}
    assert report.to_json()["counts"]["metadata_invalid"] == 1


async def test_default_policy_always_adheres(store: MetadataStore) -> None:
    async with harness.test_cluster(store, 0) as tc:
        b = await register(tc, 3)
        await ledger(tc, 1, b, 3, 2)
        report = await run(
            tc,
            "ensemblePlacementPolicy=org.apache.bookkeeper.client.DefaultEnsemblePlacementPolicy",
        )
    assert report.violations == []
    assert report.ledgers_checked == 1


async def test_pulsar_znode_is_used_without_rack_configuration(store: MetadataStore) -> None:
    """No racks file or script: Pulsar's /bookies znode (at the chroot) gives the racks."""
    async with harness.test_cluster(store, 0) as tc:
        b = await register(tc, 3)
        await store.create(
            "/bookies",
            json.dumps(
                {"default": {b[0]: {"rack": "/r1"}, b[1]: {"rack": "/r2"}, b[2]: {"rack": "/r1"}}}
            ).encode(),
        )
        await ledger(tc, 1, [b[0], b[1]], 2, 2)
        await ledger(tc, 2, [b[0], b[2]], 2, 2)
        report = await run(tc)
    assert ids(report, Category.PLACEMENT_NOT_ADHERING) == [2]


async def test_bad_rack_sources_stop_the_check(store: MetadataStore, tmp_path: Path) -> None:
    """A broken rack source is a typed error (exit 2), not wrong verdicts."""
    async with harness.test_cluster(store, 0) as tc:
        b = await register(tc, 3)
        await ledger(tc, 1, b, 3, 2)
        await store.create("/bookies", b"{not json")
        with pytest.raises(RackSourceError, match="/bookies is not valid JSON") as err:
            await run(tc)
        assert err.value.exit_code == 2
        with pytest.raises(ConfigError, match="racks_file"):
            await run(tc, f"checks.racks_file={tmp_path / 'missing.json'}")
        with pytest.raises(ConfigError, match="not supported"):
            await run(tc, "ensemblePlacementPolicy=com.example.MyPolicy")
