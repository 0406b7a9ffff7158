"""The bookie check (lost bookies) against a real ZooKeeper or etcd and emulated bookies.

Scenarios follow the behaviour spec's catalogue (S29-S36, S41, S44, S53, S71,
S73), run as one-shot checks: the daemon's delay rules are covered by the
unit tests of `lost_bookie_delay`. Marks are read back as raw znode bytes.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from typing import Any

import pytest
from structlog.testing import capture_logs

from auditor.checks.bookie_check import BOOKIES_UNKNOWN
from auditor.checks.bookie_check_run import run_bookie_check
from auditor.checks.context import CheckContext
from auditor.checks.findings import CheckReport
from auditor.metadata.model import LedgerState
from auditor.metadata.registry import register_bookie, unregister_bookie
from auditor.metadata.serde import encode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager, ur_ledger_path
from auditor.metadata.walk import LedgerRecord, LedgerWalker
from auditor.store import MetadataStore
from auditor.testing.cluster import make_metadata
from auditor.testing.harness import TestCluster, test_cluster

ROOT = "/ledgers"
UR_BASE = f"{ROOT}/underreplication"
LOST = "ledgers_on_lost_bookies"
INVALID = "metadata_invalid"


async def run(
    tc: TestCluster, *, mark: bool = False, overrides: list[str] | None = None
) -> CheckReport:
    async with tc.context(overrides=overrides or [], mark=mark) as ctx:
        return await run_bookie_check(ctx)


async def marks(store: MetadataStore) -> dict[int, tuple[str, ...]]:
    urm = UnderreplicationManager(store, ROOT)
    return {m.ledger_id: m.replicas async for m in urm.list_underreplicated()}


async def ur_tree(store: MetadataStore) -> list[str]:
    return await store.get_children(f"{UR_BASE}/ledgers")


async def mark_bytes(store: MetadataStore, ledger_id: int) -> bytes:
    data, _ = await store.get(ur_ledger_path(UR_BASE, ledger_id))
    return data


def pairs(report: CheckReport) -> list[tuple[int, str, str | None]]:
    return sorted((v.ledger_id, str(v.category), v.bookie) for v in report.violations)


def mark_pattern(*replicas: str) -> re.Pattern[bytes]:
    lines = b"".join(b'replica: "' + re.escape(r.encode()) + b'"\n' for r in replicas)
    return re.compile(b"^" + lines + rb"ctime: (\d+)\n$")


async def test_s29_never_registered_member_is_lost(store: MetadataStore) -> None:
    ghost = "192.0.2.1:1000"
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        md = make_metadata(12345, [ghost, b[0], b[1]], state=LedgerState.OPEN)
        await tc.cluster.write_ledger(md)
        await tc.cluster.write_ledger(make_metadata(12346, [b[0], b[1], b[2]], write_quorum=2))

        report = await run(tc)  # without --mark nothing is written
        assert pairs(report) == [(12345, LOST, ghost)]
        assert report.lost_bookies == [ghost]
        assert report.ledgers_checked == 2
        assert report.marked_underreplicated == []
        assert await ur_tree(store) == []

        report = await run(tc, mark=True)
        assert report.marked_underreplicated == [12345]
        assert await marks(store) == {12345: (ghost,)}
        assert mark_pattern(ghost).match(await mark_bytes(store, 12345))


async def test_s30_closed_ledger_crashed_bookie_exact_mark_bytes(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        await tc.writer.write_ledger(1, [b[0], b[1], b[2]], write_quorum=2, num_entries=100)
        await tc.writer.write_ledger(2, [b[0], b[1]], write_quorum=2, num_entries=20)
        assert pairs(await run(tc, mark=True)) == []
        assert await ur_tree(store) == []

        await tc.bookies[2].crash()
        before = int(time.time() * 1000)
        report = await run(tc, mark=True)
        after = int(time.time() * 1000)
        assert pairs(report) == [(1, LOST, b[2])]
        assert report.violations[0].detail == {
            "segments": [0],
            "ledger_state": "closed",
            "missing_replicas": [b[2]],
            "metadata_version": 0,
        }
        assert report.marked_underreplicated == [1]
        data = await mark_bytes(store, 1)
        m = mark_pattern(b[2]).match(data)
        assert m is not None, data
        assert before <= int(m.group(1)) <= after
        assert await marks(store) == {1: (b[2],)}


async def test_s31_open_ledgers_count_and_the_mark_survives_a_restart(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        for lid in (10, 11):
            await tc.writer.write_ledger(
                lid, b, write_quorum=2, num_entries=50, state=LedgerState.OPEN
            )
        await tc.bookies[2].crash()
        report = await run(tc, mark=True)
        assert pairs(report) == [(10, LOST, b[2]), (11, LOST, b[2])]
        assert {v.detail["ledger_state"] for v in report.violations} == {"open"}
        assert await marks(store) == {10: (b[2],), 11: (b[2],)}
        marked = await mark_bytes(store, 10)

        await tc.bookies[2].restart()
        report = await run(tc, mark=True)
        assert pairs(report) == [] and report.lost_bookies == []
        assert await mark_bytes(store, 10) == marked  # the check never unmarks


async def test_s32_second_loss_after_rereplication_marks_again(store: MetadataStore) -> None:
    async with test_cluster(store, 4) as tc:
        b = tc.ids
        await tc.writer.write_ledger(
            5, [b[0], b[1], b[2]], write_quorum=2, num_entries=30, state=LedgerState.OPEN
        )
        await tc.bookies[2].crash()
        await run(tc, mark=True)
        assert await marks(store) == {5: (b[2],)}

        # A replication worker moves b2's data to b3 and removes the mark.
        path = tc.cluster.path(5)
        md = make_metadata(5, [b[0], b[1], b[3]], write_quorum=2, state=LedgerState.OPEN)
        await store.set(path, encode_ledger_metadata(md))
        await store.delete(ur_ledger_path(UR_BASE, 5))
        assert pairs(await run(tc)) == []

        await tc.bookies[1].crash()
        report = await run(tc, mark=True)
        assert pairs(report) == [(5, LOST, b[1])]
        assert report.violations[0].detail["metadata_version"] == 1
        assert await marks(store) == {5: (b[1],)}


async def test_s35_s36_readonly_bookie_is_available_until_it_dies(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        await tc.writer.write_ledger(1, b, write_quorum=2, num_entries=40)
        await tc.bookies[2].set_readonly()
        report = await run(tc, mark=True)
        assert pairs(report) == [] and report.lost_bookies == []
        assert await ur_tree(store) == []

        await tc.bookies[2].crash()  # dies while read-only
        report = await run(tc, mark=True)
        assert pairs(report) == [(1, LOST, b[2])]
        assert await marks(store) == {1: (b[2],)}


async def test_s41_open_ledgers_on_unregistered_bookies_all_marked(store: MetadataStore) -> None:
    fakes = ["99.99.99.99:9999", "11.11.11.11:1111", "88.88.88.88:8888"]
    rng = random.Random(41)
    ids = sorted(rng.sample(range(1, 10**8), 5))
    async with test_cluster(store, 3) as tc:
        for lid in ids:
            md = make_metadata(lid, fakes, write_quorum=2, ack_quorum=2, state=LedgerState.OPEN)
            await tc.cluster.write_ledger(md)
        report = await run(tc, mark=True)
        assert report.lost_bookies == sorted(fakes)
        assert report.counts() == {LOST: 5, INVALID: 0}
        assert len(report.violations) == 15
        assert sorted(report.marked_underreplicated) == ids
        assert await marks(store) == {lid: tuple(sorted(fakes)) for lid in ids}


async def test_s44_two_lost_bookies_are_both_on_one_mark(store: MetadataStore) -> None:
    async with test_cluster(store, 4) as tc:
        b = tc.ids
        await tc.writer.write_ledger(1, b[:3], write_quorum=2, num_entries=60)
        await tc.bookies[1].crash()
        await tc.bookies[2].crash()
        report = await run(tc, mark=True)
        lost = sorted([b[1], b[2]])
        assert pairs(report) == [(1, LOST, lost[0]), (1, LOST, lost[1])]
        assert report.counts()[LOST] == 1
        assert all(v.detail["missing_replicas"] == lost for v in report.violations)
        assert mark_pattern(*lost).match(await mark_bytes(store, 1))


async def test_s44_second_loss_merges_into_the_existing_mark(store: MetadataStore) -> None:
    async with test_cluster(store, 4) as tc:
        b = tc.ids
        await tc.writer.write_ledger(1, b[:3], write_quorum=2, num_entries=60)
        await tc.bookies[1].crash()
        await run(tc, mark=True)
        await tc.bookies[2].crash()
        await run(tc, mark=True)
        # The first lost bookie stays first: marks merge, they are not rewritten.
        assert mark_pattern(b[1], b[2]).match(await mark_bytes(store, 1))


async def test_s53_lost_bookie_ledger_counts(store: MetadataStore) -> None:
    a, c = "127.0.0.1:1000", "127.0.0.1:1001"
    async with test_cluster(store, 3) as tc:
        b0 = tc.ids[0]
        for lid in range(1, 11):
            await tc.cluster.write_ledger(make_metadata(lid, [a, c]))
        for lid in range(11, 21):
            await tc.cluster.write_ledger(make_metadata(lid, [c, b0]))

        await register_bookie(store, ROOT, c, "127.0.0.1", 1001)
        report = await run(tc)
        assert report.lost_bookies == [a]
        assert Counter(v.bookie for v in report.violations) == {a: 10}
        assert report.counts()[LOST] == 10

        await unregister_bookie(store, ROOT, c)
        await register_bookie(store, ROOT, a, "127.0.0.1", 1000)
        report = await run(tc)
        assert report.lost_bookies == [c]
        assert Counter(v.bookie for v in report.violations) == {c: 20}
        assert report.counts()[LOST] == 20
        assert await ur_tree(store) == []


async def test_s71_s73_historical_ensembles_are_included(store: MetadataStore) -> None:
    async with test_cluster(store, 4) as tc:
        b = tc.ids
        # Ledger 1: b2 only in the first segment (replaced by b3 at entry 10).
        await tc.writer.write_ledger(
            1, [(0, [b[0], b[1], b[2]]), (10, [b[0], b[1], b[3]])], write_quorum=2, num_entries=20
        )
        # Ledger 2: b2 in both segments.
        await tc.writer.write_ledger(
            2, [(0, [b[2], b[0], b[1]]), (5, [b[2], b[3], b[1]])], write_quorum=2, num_entries=12
        )
        # Ledger 3 never touches b2.
        await tc.writer.write_ledger(3, [b[0], b[1], b[3]], write_quorum=3, num_entries=5)
        report = await run(tc)
        assert pairs(report) == [] and report.ledgers_checked == 3

        await tc.bookies[2].crash()
        report = await run(tc, mark=True)
        assert pairs(report) == [(1, LOST, b[2]), (2, LOST, b[2])]
        segments = {v.ledger_id: v.detail["segments"] for v in report.violations}
        assert segments == {1: [0], 2: [0, 5]}
        assert await marks(store) == {1: (b[2],), 2: (b[2],)}


async def test_undecodable_metadata_is_reported_not_marked(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        await tc.cluster.write_ledger(make_metadata(1, ["192.0.2.9:3181", b[0], b[1]]))
        bad = await tc.cluster.write_raw(2, b"BookieMetadataFormatVersion\t3\n\xff\xff\xff")
        report = await run(tc, mark=True)
        assert pairs(report) == [(1, LOST, "192.0.2.9:3181"), (2, INVALID, None)]
        invalid = next(v for v in report.violations if v.ledger_id == 2)
        assert invalid.detail["path"] == bad
        assert invalid.detail["bookies"] == BOOKIES_UNKNOWN
        assert invalid.detail["reason"]
        assert report.counts() == {LOST: 1, INVALID: 1}
        assert report.ledgers_checked == 2
        assert await marks(store) == {1: ("192.0.2.9:3181",)}


async def test_replication_disabled_reports_but_does_not_mark(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        await tc.writer.write_ledger(1, b, write_quorum=2, num_entries=10)
        urm = UnderreplicationManager(store, ROOT)
        await urm.disable_replication()
        await tc.bookies[0].crash()
        await tc.bookies[1].crash()
        report = await run(tc, mark=True)
        assert pairs(report) == sorted([(1, LOST, b[0]), (1, LOST, b[1])])
        assert report.marked_underreplicated == []
        assert await ur_tree(store) == []

        await urm.enable_replication()
        report = await run(tc, mark=True)
        assert report.marked_underreplicated == [1]
        assert await marks(store) == {1: tuple(sorted([b[0], b[1]]))}


class _HookedWalker(LedgerWalker):
    """A real walk with a real ZooKeeper change injected just before one ledger is read."""

    def __init__(self, ctx: CheckContext, at_ledger: int, action: Any) -> None:
        super().__init__(ctx.store, ctx.root, ctx.manager)
        self.at_ledger = at_ledger
        self.action = action

    async def read(self, ledger_id: int, path: str | None = None) -> LedgerRecord | None:
        if ledger_id == self.at_ledger and path is not None:
            await self.action(path)
        return await super().read(ledger_id, path)


async def test_ledger_deleted_during_the_walk_is_skipped(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ghost = "192.0.2.7:3181"
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        for lid in (1, 2, 3):
            await tc.cluster.write_ledger(make_metadata(lid, [ghost, b[0], b[1]]))
        async with tc.context(mark=True) as ctx:
            monkeypatch.setattr(ctx, "walker", lambda: _HookedWalker(ctx, 2, store.delete))
            report = await run_bookie_check(ctx)
        assert pairs(report) == [(1, LOST, ghost), (3, LOST, ghost)]
        assert report.ledgers_checked == 2
        assert dict(report.ledgers_skipped) == {"deleted": 1}
        assert await marks(store) == {1: (ghost,), 3: (ghost,)}


async def test_bookie_back_before_the_walk_ends_is_not_lost(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    back, gone = "192.0.2.7:3181", "192.0.2.8:3181"
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        await tc.cluster.write_ledger(make_metadata(1, [back, gone, b[0]]))
        await tc.cluster.write_ledger(make_metadata(2, [back, b[0], b[1]]))

        async def comes_back(_path: str) -> None:
            await register_bookie(store, ROOT, back, "192.0.2.7", 3181)

        async with tc.context(mark=True) as ctx:
            monkeypatch.setattr(ctx, "walker", lambda: _HookedWalker(ctx, 2, comes_back))
            report = await run_bookie_check(ctx)
        assert pairs(report) == [(1, LOST, gone)]
        assert report.violations[0].detail["missing_replicas"] == [gone]
        assert report.lost_bookies == [gone]
        assert await marks(store) == {1: (gone,)}


async def test_json_report(store: MetadataStore) -> None:
    ghost = "192.0.2.1:1000"
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        await tc.cluster.write_ledger(make_metadata(7, [b[0], ghost, b[1]], write_quorum=2))
        await tc.cluster.write_ledger(make_metadata(8, [b[0], b[1], b[2]], write_quorum=2))
        report = await run(tc, mark=True)
        out = report.to_json()
        assert set(out) == {
            "check",
            "started_at",
            "finished_at",
            "ledgers_checked",
            "ledgers_skipped",
            "counts",
            "violations",
            "marked_underreplicated",
            "violations_total",
            "violations_truncated",
            "samples",
            "would_be_violations_dropped",
            "false_alarm_share",
            "invalid_znodes",
            "lost_bookies",
        }
        assert out["check"] == "bookies"
        assert out["started_at"].endswith("Z") and out["finished_at"] >= out["started_at"]
        assert out["ledgers_checked"] == 2
        assert out["ledgers_skipped"] == {}
        assert out["counts"] == {LOST: 1, INVALID: 0}
        assert out["violations"] == [
            {
                "ledger_id": 7,
                "category": LOST,
                "bookie": ghost,
                "detail": {
                    "segments": [0],
                    "ledger_state": "closed",
                    "missing_replicas": [ghost],
                    "metadata_version": 0,
                },
            }
        ]
        assert out["marked_underreplicated"] == [7]
        assert out["lost_bookies"] == [ghost]
        assert (
            out["violations_total"],
            out["violations_truncated"],
            out["samples"],
            out["would_be_violations_dropped"],
            out["false_alarm_share"],
        ) == (1, False, {LOST: [7], INVALID: []}, {}, 0.0)


async def test_every_violation_is_logged_with_evidence_and_progress(store: MetadataStore) -> None:
    ghost = "192.0.2.1:1000"
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        for lid in range(1, 6):
            await tc.cluster.write_ledger(make_metadata(lid, [b[0], ghost, b[1]]))
        with capture_logs() as logs:
            await run(tc, overrides=["checks.progress_interval=0.000001"])
        violations = [e for e in logs if e["event"] == "violation"]
        assert sorted(e["ledger_id"] for e in violations) == [1, 2, 3, 4, 5]
        for e in violations:
            assert e["category"] == LOST and e["bookie"] == ghost
            assert e["segments"] == [0] and e["metadata_version"] == 0
        assert [e["ledgers"] for e in logs if e["event"] == "lost bookie"] == [5]
        assert any(e["event"] == "check progress" for e in logs)
        assert any(e["event"] == "bookie check finished" for e in logs)


async def test_corrupt_existing_mark_is_left_alone_and_the_rest_is_marked(
    store: MetadataStore,
) -> None:
    ghost = "192.0.2.1:1000"
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        for lid in (1, 2):
            await tc.cluster.write_ledger(make_metadata(lid, [b[0], ghost, b[1]]))
        await store.create(ur_ledger_path(UR_BASE, 1), b"\xffnot a mark", makepath=True)
        report = await run(tc, mark=True)
        assert pairs(report) == [(1, LOST, ghost), (2, LOST, ghost)]
        assert report.marked_underreplicated == [2]
        assert await mark_bytes(store, 1) == b"\xffnot a mark"
        assert mark_pattern(ghost).match(await mark_bytes(store, 2))


async def test_many_marks_with_bounded_concurrency(store: MetadataStore) -> None:
    ghost = "192.0.2.1:1000"
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        ids = list(range(100, 250))
        await tc.cluster.write_ledgers(make_metadata(i, [b[i % 3], ghost]) for i in ids)
        report = await run(tc, mark=True, overrides=["checks.ledger_concurrency=7"])
        assert report.counts()[LOST] == len(ids) and report.ledgers_checked == len(ids)
        assert sorted(report.marked_underreplicated) == ids
        assert await marks(store) == {i: (ghost,) for i in ids}
