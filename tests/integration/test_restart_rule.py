"""A restart is not a failure, on a real ZooKeeper with emulated bookies.

With the daemon beside each bookie, restarting a host restarts the leader and its
bookie together, so the next leader is elected while that bookie is down. That
leader waits `lostBookieRecoveryDelay` (from when it first saw the bookie missing,
at the latest from its election) before auditing it, and meanwhile every check
leaves the bookie's fragments alone: a bookie back within the delay causes no mark
and no report; one down past it is marked once, when the delay runs out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import pytest

from auditor.checks.findings import Check, CheckReport
from auditor.daemon.service import Daemon
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.inprocess import fast_config, running, until
from auditor.testing.observe import events_of
from auditor.zk import ZkClient
from tests.integration.test_leadership_daemon import events

pytestmark = pytest.mark.slow

ROOT = "/ledgers"
LEDGERS = 6
Logs = list[MutableMapping[str, Any]]


async def _cluster_with_a_down_bookie(tc: TestCluster) -> str:
    """Six closed ledgers, each with bookie 3 in its ensemble; bookie 3 then crashes
    (its cookie stays: BookKeeper knows it registered once)."""
    down = tc.ids[3]
    for lid in range(1, LEDGERS + 1):
        others = [b for b in tc.ids if b != down]
        ensemble = [down, others[lid % 3], others[(lid + 1) % 3]]
        await tc.writer.write_ledger(lid, [(0, ensemble)], write_quorum=3, num_entries=5)
    await tc.cluster.add_cookie(down)
    await tc.by_id(down).crash()
    return down


async def _marks(zk: ZkClient) -> dict[int, list[str]]:
    urm = UnderreplicationManager(zk, ROOT)
    return {ur.ledger_id: list(ur.replicas) async for ur in urm.list_underreplicated()}


async def _run_now(daemon: Daemon, check: Check) -> CheckReport:
    """Triggers `check` and returns the report of that run."""
    before = daemon.state.checks[check].last_finished
    await daemon.trigger_check(check)
    await until(
        events_of(daemon).check_ended,
        lambda: daemon.state.checks[check].last_finished != before,
        f"a triggered {check} run",
    )
    report = daemon.state.checks[check].last_report
    assert report is not None
    return report


async def _eventually(done: Callable[[], bool], what: str, within: float = 60) -> None:
    """Until `done()` holds: for state the daemon changes on bookie events and timers,
    which it signals with no event of its own (polled every 50 ms, bounded)."""
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"not within {within}s: {what}"
        await asyncio.sleep(0.05)


async def _held(daemon: Daemon, want: frozenset[str], within: float = 60) -> None:
    """Until the leader's lost-bookie delay holds exactly `want`."""

    def holds() -> bool:
        work = daemon.work
        return work is not None and work.delay.held_bookies == want

    await _eventually(holds, f"held bookies {sorted(want)}", within)


@asynccontextmanager
async def _leader(zk_hosts: str, identity: str, delay: int) -> AsyncIterator[Daemon]:
    config = fast_config(zk_hosts, identity, [f"lostBookieRecoveryDelay={delay}"])
    async with running(config) as daemon:
        await until(events_of(daemon).check_ended, lambda: daemon.state.is_leader, "leadership", 60)
        yield daemon


def _violations(report: CheckReport) -> list[tuple[int, str, str | None]]:
    return [(v.ledger_id, str(v.category), v.bookie) for v in report.violations]


async def test_a_bookie_back_within_the_delay_causes_no_mark_and_no_report(
    zk: ZkClient, zk_hosts: str, info_logs: Logs
) -> None:
    async with test_cluster(zk, 4) as tc:
        down = await _cluster_with_a_down_bookie(tc)
        async with _leader(zk_hosts, "restart:1", delay=60) as daemon:
            await _held(daemon, frozenset({down}))
            # Every check the leader can run, run now (triggered: a pending delayed audit
            # skips only periodic runs): the down bookie's fragments are left alone.
            for check in (Check.BOOKIES, Check.LEDGERS, Check.REPLICAS):
                report = await _run_now(daemon, check)
                assert _violations(report) == [], check
                assert report.marked_underreplicated == [], check
            ledgers = await _run_now(daemon, Check.LEDGERS)
            assert ledgers.ledgers_checked == LEDGERS
            assert await _marks(zk) == {}
            # The bookie comes back within the delay: the pending audit is cancelled.
            await tc.by_id(down).start()
            await _held(daemon, frozenset())
            after = await _run_now(daemon, Check.BOOKIES)
            assert _violations(after) == []
        assert await _marks(zk) == {}
        assert [e for e in events(info_logs, "marked under-replicated")] == []
        assert [e["reason"] for e in events(info_logs, "lost-bookie audit now")] == []


async def test_a_bookie_down_past_the_delay_is_marked_exactly_once(
    zk: ZkClient, zk_hosts: str, info_logs: Logs
) -> None:
    async with test_cluster(zk, 4) as tc:
        down = await _cluster_with_a_down_bookie(tc)
        async with _leader(zk_hosts, "restart:2", delay=2) as daemon:

            def audited() -> bool:
                report = daemon.state.checks[Check.BOOKIES].last_report
                return report is not None and bool(report.marked_underreplicated)

            await until(events_of(daemon).check_ended, audited, "the delayed audit's marks")
        # Held at the election for the whole delay (never seen up: from the election) ...
        delayed = events(info_logs, "lost-bookie audit delayed")
        assert [e["held"] for e in delayed] == [[down]]
        assert 1.0 <= delayed[0]["in_s"] <= 2.0
        # ... then audited once, when it ran out.
        marks = await _marks(zk)
        assert marks == {lid: [down] for lid in range(1, LEDGERS + 1)}
        marked = [e["ledger_id"] for e in events(info_logs, "marked under-replicated")]
        assert sorted(marked) == list(range(1, LEDGERS + 1))  # once each
        audits = events(info_logs, "lost-bookie audit now")
        assert [(e["reason"], e["bookies"]) for e in audits] == [("delay_expired", [down])]


async def test_the_delay_counts_from_when_a_follower_saw_the_bookie_go(
    zk: ZkClient, zk_hosts: str
) -> None:
    """A follower notes when a bookie disappears; elected later, it waits only what is
    left of the delay (the moment it saw the bookie go, plus the delay), not a new one."""
    async with test_cluster(zk, 4) as tc:
        down = tc.ids[3]
        for lid in range(1, LEDGERS + 1):
            await tc.writer.write_ledger(lid, [(0, tc.ids[1:])], write_quorum=3, num_entries=5)
        leader_cfg = fast_config(zk_hosts, "restart:lead", ["lostBookieRecoveryDelay=300"])
        follower_cfg = fast_config(zk_hosts, "restart:follow", ["lostBookieRecoveryDelay=300"])
        async with running(leader_cfg) as leader:
            await until(
                events_of(leader).check_ended, lambda: leader.state.is_leader, "leadership", 60
            )
            async with running(follower_cfg) as follower:
                await _eventually(lambda: follower.sightings.observed, "the follower's first look")
                await tc.by_id(down).crash()
                await _eventually(
                    lambda: down in follower.sightings.missing_since(), "the follower saw it go"
                )
                went = follower.sightings.missing_since()[down]
                leader.stop()
                await _held(follower, frozenset({down}))
                assert follower.work is not None
                assert follower.work.delay.pending_at == went + 300
