"""Every daemon follows the check ctime znodes that any auditor, Java or ours, writes.

`follow_cluster_checks` runs here on a real ZooKeeper, with no leader of ours at all:
the ctimes are written as Java's auditor writes them (binary protobuf, the bytes
spelled out below rather than made by our encoder), and the state and the metrics
of a follower must show them, a later one replacing an earlier one, a corrupt one
counted as absent with a single warning, and the configured intervals exported from
the start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import pytest

from auditor.checks.findings import Check
from auditor.config import BookKeeperConfig
from auditor.daemon.cluster_checks import follow_cluster_checks
from auditor.daemon.metrics import Metrics
from auditor.daemon.state import DaemonState
from auditor.logs import get_logger
from auditor.testing.zkserver import ZooKeeperServer, expire_session
from auditor.zk import ZkClient

pytestmark = pytest.mark.timeout(60)

ROOT = "/ledgers"
UR = f"{ROOT}/underreplication"
CLUSTER_TS = "bookkeeper_auditor_cluster_check_last_completed_timestamp_seconds"
#: CheckAllLedgersFormat{checkAllLedgersCTime: 1700000000000}: field 1, varint.
JAVA_1700000000000 = bytes.fromhex("0880d095ffbc31")
#: ReplicasCheckFormat{replicasCheckCTime: 1700000600000} (ten minutes later).
JAVA_1700000600000 = bytes.fromhex("08c09fbaffbc31")
#: PlacementPolicyCheckFormat{placementPolicyCheckCTime: 1700003600000} (an hour later).
JAVA_1700003600000 = bytes.fromhex("0880adf180bd31")
#: A length-delimited field 1 cut short: no protobuf parser takes it.
CORRUPT = b"\x0a\xff\x01garbage"


class Follower:
    """A follower's state and metrics, and the pass counter of its coroutine."""

    def __init__(self, state: DaemonState, metrics: Metrics, passed: asyncio.Event) -> None:
        self.state = state
        self.metrics = metrics
        self.passed = passed

    async def seen(self, check: Check, expected: float | None, within: float = 10.0) -> None:
        """Waits until the state holds `expected` for `check` (None: absent)."""
        deadline = time.monotonic() + within
        while self.state.cluster_checks.get(check) != expected:
            assert time.monotonic() < deadline, (check, expected, self.state.cluster_checks)
            self.passed.clear()
            with_timeout = max(deadline - time.monotonic(), 0.01)
            try:
                await asyncio.wait_for(self.passed.wait(), with_timeout)
            except TimeoutError:
                continue

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


@asynccontextmanager
async def follower(zk: ZkClient, bk: BookKeeperConfig) -> AsyncIterator[Follower]:
    """The coroutine running as every daemon runs it, on a state that never leads."""
    state = DaemonState(identity="follower:3181")
    metrics = Metrics(state)
    passed = asyncio.Event()
    log = get_logger("auditor.daemon")
    task = asyncio.ensure_future(
        follow_cluster_checks(zk, ROOT, state, log, lambda: bk, passed=passed)
    )
    try:
        await asyncio.wait_for(passed.wait(), 10)
        yield Follower(state, metrics, passed)
        assert not task.done(), "the coroutine ended by itself"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_java_ctimes_appear_on_a_follower_and_later_ones_replace_them(zk: ZkClient) -> None:
    bk = BookKeeperConfig(auditorReplicasCheckInterval=3600)
    await zk.ensure_path(UR)
    async with follower(zk, bk) as f:
        # Nothing written yet: nothing known, no series; the intervals are there already.
        assert f.state.cluster_checks == {}
        for check in (Check.LEDGERS, Check.PLACEMENT, Check.REPLICAS):
            assert f.sample(CLUSTER_TS, check=str(check)) is None
        intervals = {
            str(c): f.sample("bookkeeper_auditor_check_interval_seconds", check=str(c))
            for c in (Check.BOOKIES, Check.LEDGERS, Check.PLACEMENT, Check.REPLICAS, Check.GRACE)
        }
        assert intervals == {
            "bookies": float(bk.auditorPeriodicBookieCheckInterval),
            "ledgers": float(bk.auditorPeriodicCheckInterval),
            "placement": float(bk.auditorPeriodicPlacementPolicyCheckInterval),
            "replicas": 3600.0,
            "grace": float(bk.auditorPeriodicPlacementPolicyCheckInterval),
        }
        assert f.state.is_leader is False
        assert f.sample("bookkeeper_auditor_is_leader") == 0.0

        # A Java auditor completes its ledger check.
        await zk.create(f"{UR}/checkallledgersctime", JAVA_1700000000000)
        await f.seen(Check.LEDGERS, 1_700_000_000.0)
        assert f.sample(CLUSTER_TS, check="ledgers") == 1_700_000_000.0
        # The follower's own, leader-side series stay unset: it ran nothing.
        assert (
            f.sample("bookkeeper_auditor_check_last_success_timestamp_seconds", check="ledgers")
            is None
        )

        # Then its replicas and placement checks, then the ledger check again, later.
        await zk.create(f"{UR}/replicascheckctime", JAVA_1700000600000)
        await zk.create(f"{UR}/placementpolicycheckctime", JAVA_1700003600000)
        await f.seen(Check.REPLICAS, 1_700_000_600.0)
        await f.seen(Check.PLACEMENT, 1_700_003_600.0)
        later = JAVA_1700000600000  # the same bytes serve: field 1 is the time in all three
        await zk.set(f"{UR}/checkallledgersctime", later)
        await f.seen(Check.LEDGERS, 1_700_000_600.0)
        # Rewritten again (the watch re-armed after each change).
        await zk.set(f"{UR}/checkallledgersctime", JAVA_1700003600000)
        await f.seen(Check.LEDGERS, 1_700_003_600.0)
        assert {c: f.sample(CLUSTER_TS, check=c) for c in ("ledgers", "placement", "replicas")} == {
            "ledgers": 1_700_003_600.0,
            "placement": 1_700_003_600.0,
            "replicas": 1_700_000_600.0,
        }
        # No series for the checks BookKeeper keeps no ctime of.
        assert f.sample(CLUSTER_TS, check="bookies") is None
        assert f.sample(CLUSTER_TS, check="grace") is None

        # A znode deleted (by hand) is absent again.
        await zk.delete(f"{UR}/replicascheckctime")
        await f.seen(Check.REPLICAS, None)
        assert f.sample(CLUSTER_TS, check="replicas") is None


async def test_a_corrupt_ctime_counts_as_absent_with_one_warning(
    zk: ZkClient, info_logs: list[MutableMapping[str, Any]]
) -> None:
    await zk.ensure_path(UR)
    await zk.create(f"{UR}/replicascheckctime", JAVA_1700000600000)
    async with follower(zk, BookKeeperConfig()) as f:
        assert f.state.cluster_checks == {Check.REPLICAS: 1_700_000_600.0}

        await zk.set(f"{UR}/replicascheckctime", CORRUPT)
        await f.seen(Check.REPLICAS, None)
        assert f.sample(CLUSTER_TS, check="replicas") is None
        # The same bytes written again: still absent, still the one warning.
        await zk.set(f"{UR}/replicascheckctime", CORRUPT)
        f.passed.clear()
        await asyncio.wait_for(f.passed.wait(), 10)
        assert f.state.cluster_checks == {}
        warnings = [e for e in info_logs if e["log_level"] == "warning"]
        assert warnings == [
            {
                "event": "check time znode is corrupt; treating it as absent, the check runs",
                "log_level": "warning",
                "znode": "replicascheckctime",
                "value": repr(CORRUPT),
                "path": f"{UR}/replicascheckctime",
                "error": warnings[0]["error"],
            }
        ]
        assert "replicascheckctime" in warnings[0]["error"]
        bad = f.state.invalid_znodes["replicascheckctime"]
        assert (bad.value, bad.using) == (
            repr(CORRUPT),
            "absent: the check runs as if it never ran",
        )
        assert f.sample("bookkeeper_auditor_znode_invalid", znode="replicascheckctime") == 1.0

        # A good time written over it (the next completed check) is used again.
        await zk.set(f"{UR}/replicascheckctime", JAVA_1700003600000)
        await f.seen(Check.REPLICAS, 1_700_003_600.0)
        assert "replicascheckctime" not in f.state.invalid_znodes
        assert f.sample("bookkeeper_auditor_znode_invalid", znode="replicascheckctime") == 0.0
        assert [e["event"] for e in info_logs if e.get("znode") == "replicascheckctime"] == [
            "check time znode is corrupt; treating it as absent, the check runs",
            "znode holds a usable value again",
        ]


async def test_the_intervals_follow_a_reloaded_configuration(zk: ZkClient) -> None:
    configs = [BookKeeperConfig(auditorReplicasCheckInterval=600)]
    state = DaemonState(identity="follower:3181")
    passed = asyncio.Event()
    task = asyncio.ensure_future(
        follow_cluster_checks(
            zk, ROOT, state, get_logger("test"), lambda: configs[-1], safety=0.2, passed=passed
        )
    )
    try:
        await asyncio.wait_for(passed.wait(), 10)
        assert state.tallies.intervals["replicas"] == 600.0
        configs.append(BookKeeperConfig(auditorReplicasCheckInterval=0))
        # No znode changes: the safety re-read applies the new configuration.
        passed.clear()
        await asyncio.wait_for(passed.wait(), 10)
        passed.clear()
        await asyncio.wait_for(passed.wait(), 10)
        assert state.tallies.intervals["replicas"] == 0.0
        assert state.checks[Check.REPLICAS].enabled is False
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_lost_session_costs_no_update(
    zk: ZkClient, zk_hosts: str, zk_server: ZooKeeperServer
) -> None:
    """After ZooKeeper expires the follower's session (its watches go with it), the next
    ctime written is still seen at once, not at the slow safety re-read."""
    await zk.ensure_path(UR)
    await zk.create(f"{UR}/checkallledgersctime", JAVA_1700000000000)
    async with ZkClient(zk_hosts, timeout=10.0, session_timeout=10.0) as own:
        state = DaemonState(identity="follower:3181")
        passed = asyncio.Event()
        task = asyncio.ensure_future(
            follow_cluster_checks(
                own, ROOT, state, get_logger("test"), BookKeeperConfig, passed=passed
            )
        )
        try:
            await asyncio.wait_for(passed.wait(), 10)
            assert state.cluster_checks == {Check.LEDGERS: 1_700_000_000.0}
            before = own.client_id
            assert before is not None
            await asyncio.to_thread(expire_session, zk_server.hosts, before)
            deadline = time.monotonic() + 30
            while own.client_id in (None, before) or not own.connected:
                assert time.monotonic() < deadline, "no new session"
                await asyncio.sleep(0.05)
            await zk.set(f"{UR}/checkallledgersctime", JAVA_1700003600000)
            f = Follower(state, Metrics(state), passed)
            await f.seen(Check.LEDGERS, 1_700_003_600.0, within=10.0)
            assert not task.done()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
