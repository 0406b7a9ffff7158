"""The leader's detector self-test and canary, on the real ZooKeeper and emulated bookies.

The daemon runs in this process (as `auditor.testing.inprocess` provides) so
the test can await its self-test reports and read its metrics registry. The
canary's znodes must appear under its own root only, the real ledgers root
must keep exactly its ledgers and no marks, and each real bookie must be
asked exactly one list request for the canary's ledger.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import MutableMapping
from typing import Any

from auditor.api.convert import status_json, status_response
from auditor.cli.api_commands import render_status
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.metadata.layout import LedgerManager
from auditor.metadata.paths import ledger_path
from auditor.metadata.serde import decode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.metadata.walk import LedgerWalker
from auditor.selftest.canary import (
    CANARY_IDS,
    CANARY_MANAGER,
    CANARY_PLACEMENT,
    CANARY_REPLICAS,
    CORRUPT,
    CORRUPT_ID,
    NO_REPLICA_ID,
    RACKS_NODE,
)
from auditor.selftest.harness import SELFTEST_CHECKS, FixtureFailure
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.inprocess import fast_config, running
from auditor.testing.observe import events_of
from auditor.zk import NoNodeError, ZkClient

ROOT = "/ledgers"
CANARY_BASE = "/bk-auditor-canary"
CANARY_ROOT = f"{CANARY_BASE}/ledgers"
CANARY = {CANARY_REPLICAS, CANARY_PLACEMENT}


async def _reported(daemon: Daemon, checks: set[str], within: float = 60) -> None:
    """Waits for self-test results of every one of `checks` (on the daemon's event)."""
    async with asyncio.timeout(within):
        while not checks <= daemon.selftest.keys():
            events_of(daemon).selftest_reported.clear()
            await events_of(daemon).selftest_reported.wait()


def _success(metrics: Metrics, check: str) -> float | None:
    return metrics.registry.get_sample_value(
        "bookkeeper_auditor_selftest_success", {"check": check}
    )


async def _tree(zk: ZkClient, path: str) -> set[str]:
    try:
        children = await zk.get_children(path)
    except NoNodeError:
        return set()
    out = {path}
    for child in children:
        out |= await _tree(zk, f"{path.rstrip('/')}/{child}")
    return out


def _with_parents(path: str, stop: str) -> set[str]:
    out = set()
    while len(path) >= len(stop):
        out.add(path)
        path = path.rsplit("/", 1)[0]
    return out


async def _ledger_ids(zk: ZkClient) -> list[int]:
    return [i async for i in LedgerWalker(zk, ROOT, LedgerManager.HIERARCHICAL).ledger_ids()]


async def _healthy_cluster(tc: TestCluster) -> None:
    await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=10)


async def test_self_test_passes_for_every_check_and_writes_nothing_without_canary(
    zk: ZkClient,
) -> None:
    async with test_cluster(zk, 3) as tc:
        await _healthy_cluster(tc)
        metrics = Metrics()
        cfg = fast_config(zk.hosts, "selftest-a:1", ["selftest.interval=1800"])
        async with running(cfg, metrics) as daemon:
            await _reported(daemon, set(SELFTEST_CHECKS))
            # For the staleness alert: the leader's own period.
            assert (
                metrics.registry.get_sample_value("bookkeeper_auditor_selftest_interval_seconds")
                == 1800
            )
            assert {c: _success(metrics, c) for c in SELFTEST_CHECKS} == dict.fromkeys(
                SELFTEST_CHECKS, 1.0
            )
            assert set(daemon.selftest) == set(SELFTEST_CHECKS)
            assert all(daemon.selftest[c].ok for c in SELFTEST_CHECKS)
            doc = status_json(status_response(daemon.state))
            assert {
                c: (t["ok"], t["failure"]) for c, t in doc["selftest"].items()
            } == dict.fromkeys(SELFTEST_CHECKS, (True, None))
            assert all(t["fixtures"] > 0 and t["ran_at"] for t in doc["selftest"].values())
            assert metrics.registry.get_sample_value(
                "bookkeeper_auditor_selftest_last_run_timestamp_seconds"
            )
            assert _success(metrics, CANARY_REPLICAS) is None
            assert await zk.exists(CANARY_BASE) is None
        assert await zk.exists(CANARY_BASE) is None
        assert all(b.list_requests[NO_REPLICA_ID] == 0 for b in tc.bookies)


async def test_self_test_off_exports_interval_zero(zk: ZkClient) -> None:
    """Off, nothing runs and the interval is 0, which keeps the staleness alert quiet."""
    async with test_cluster(zk, 3) as tc:
        await _healthy_cluster(tc)
        metrics = Metrics()
        cfg = fast_config(zk.hosts, "selftest-off:1", ["selftest.enabled=false"])
        async with running(cfg, metrics) as daemon:
            # The risk report runs at election too (its first one), after the gauges are set.
            await asyncio.wait_for(events_of(daemon).risk_reported.wait(), 60)
            assert (
                metrics.registry.get_sample_value("bookkeeper_auditor_selftest_interval_seconds")
                == 0
            )
            assert daemon.selftest == {}
            assert _success(metrics, "replicas") is None


async def test_canary_lives_under_its_root_and_passes_end_to_end(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        await _healthy_cluster(tc)
        metrics = Metrics()
        cfg = fast_config(zk.hosts, "selftest-b:1", ["selftest.canary=true"])
        async with running(cfg, metrics) as daemon:
            await _reported(daemon, set(SELFTEST_CHECKS) | CANARY)
            replicas, placement = (
                daemon.selftest[CANARY_REPLICAS],
                daemon.selftest[CANARY_PLACEMENT],
            )
            assert (replicas.ok, replicas.failures, replicas.error) == (True, (), None)
            assert dict(replicas.details) == {"ledgers_checked": 2, "bookies": sorted(tc.ids)}
            assert (placement.ok, placement.fixtures) == (True, 4)
            assert dict(placement.details) == {"ledgers_checked": 4, "bookies": sorted(tc.ids)}
            assert _success(metrics, CANARY_REPLICAS) == 1.0
            assert _success(metrics, CANARY_PLACEMENT) == 1.0

        # The canary's znodes, under its root and nowhere else.
        expected = {CANARY_BASE, CANARY_ROOT, f"{CANARY_ROOT}/{RACKS_NODE}"}
        for ledger_id in CANARY_IDS:
            expected |= _with_parents(
                ledger_path(CANARY_MANAGER, CANARY_ROOT, ledger_id), CANARY_ROOT
            )
        assert await _tree(zk, CANARY_BASE) == expected
        # The real root: its one ledger, no marks.
        assert await _ledger_ids(zk) == [1]
        assert [ur async for ur in UnderreplicationManager(zk, ROOT).list_underreplicated()] == []
        # One list request per real bookie for the canary ledger, which none holds.
        assert [b.list_requests[NO_REPLICA_ID] for b in tc.bookies] == [1, 1, 1]
        assert not any(b.has_ledger(NO_REPLICA_ID) for b in tc.bookies)


async def test_canary_fails_when_the_defect_goes_undetected(
    zk: ZkClient, info_logs: list[MutableMapping[str, Any]]
) -> None:
    """A bookie set that does hold the canary ledger: its no_replica must not be found,
    and the canary says so (metric 0, the failed fixture logged), placement still passes."""
    async with test_cluster(zk, 3) as tc:
        await _healthy_cluster(tc)
        for i, bookie_id in enumerate(sorted(tc.ids)):
            tc.by_id(bookie_id).put_ledger(NO_REPLICA_ID, [e for e in range(10) if (i - e) % 3 < 2])
        metrics = Metrics()
        cfg = fast_config(zk.hosts, "selftest-c:1", ["selftest.canary=true"])
        async with running(cfg, metrics) as daemon:
            await _reported(daemon, set(SELFTEST_CHECKS) | CANARY)
            failed = daemon.selftest[CANARY_REPLICAS]
            assert failed.failures == (
                FixtureFailure(f"ledger {NO_REPLICA_ID}", "['no_replica']", "[]"),
                FixtureFailure(
                    f"ledger {NO_REPLICA_ID} missing bookies", repr(sorted(tc.ids)), "[]"
                ),
            )
            assert _success(metrics, CANARY_REPLICAS) == 0.0
            assert _success(metrics, CANARY_PLACEMENT) == 1.0
            assert all(_success(metrics, c) == 1.0 for c in SELFTEST_CHECKS)
            # `status` names the failed detector and its first wrong answer.
            doc = status_json(status_response(daemon.state))
            assert {
                c: (t["ok"], t["fixtures"], t["failure"]) for c, t in doc["selftest"].items()
            } == {
                **{c: (True, r.fixtures, None) for c, r in daemon.selftest.items() if r.ok},
                CANARY_REPLICAS: (False, failed.fixtures, failed.summary()),
            }
            text = io.StringIO()
            render_status(doc, text)
            lines = text.getvalue().splitlines()
            at = next(i for i, line in enumerate(lines) if line.startswith("  self-test:"))
            detectors = len(SELFTEST_CHECKS) + len(CANARY)
            assert lines[at].startswith(f"  self-test: FAILED ({detectors} detectors, last ")
            # The failed detector's line, and nothing else of the self-test block (the
            # worker's block follows it).
            assert lines[at + 1 : at + 3] == [
                f"    {failed.summary()}",
                "  worker: off (worker.enabled)",
            ]
        errors = [e for e in info_logs if e["event"].startswith("canary failed")]
        assert [(e["check"], e["failed"]) for e in errors] == [(CANARY_REPLICAS, failed.summary())]
        assert await _ledger_ids(zk) == [1]
        assert [ur async for ur in UnderreplicationManager(zk, ROOT).list_underreplicated()] == []


async def test_garbage_under_the_canary_root_is_rewritten_never_decoded(zk: ZkClient) -> None:
    """Bad bytes left at the canary's ledger znodes and racks node (another version, an
    operator's mistake) are overwritten with the canary's own before its round: the canary
    passes, and every znode holds the canary's bytes again."""
    async with test_cluster(zk, 3) as tc:
        await _healthy_cluster(tc)
        garbage = b"\xff\x00not a ledger\x07" * 100
        for ledger_id in CANARY_IDS:
            await zk.create(
                ledger_path(CANARY_MANAGER, CANARY_ROOT, ledger_id), garbage, makepath=True
            )
        await zk.create(f"{CANARY_ROOT}/{RACKS_NODE}", garbage, makepath=True)
        cfg = fast_config(zk.hosts, "selftest-g:1", ["selftest.canary=true"])
        async with running(cfg, Metrics()) as daemon:
            await _reported(daemon, set(SELFTEST_CHECKS) | CANARY)
            assert daemon.selftest[CANARY_REPLICAS].ok
            assert daemon.selftest[CANARY_PLACEMENT].ok
        for ledger_id in CANARY_IDS:
            data, _ = await zk.get(ledger_path(CANARY_MANAGER, CANARY_ROOT, ledger_id))
            if ledger_id == CORRUPT_ID:
                assert data == CORRUPT  # undecodable on purpose, and the canary's own
            else:
                assert decode_ledger_metadata(data, ledger_id).ledger_id == ledger_id
        racks, _ = await zk.get(f"{CANARY_ROOT}/{RACKS_NODE}")
        assert isinstance(json.loads(racks), dict)
