"""The leader's metadata index: read once, then kept by the watch; checks read it.

The daemon runs in this process on the loop that serves the emulated bookies
(as the demo runs it). After the first round, a new ledger, a deleted ledger
and a lost bookie must all be seen by the next checks without the index
reading every ledger again: one load, whatever happens after.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import pytest

from auditor.checks.findings import Category, Check
from auditor.daemon.metrics import Metrics
from auditor.testing.bookie import BookieEmulator
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.inprocess import fast_config, running
from auditor.testing.seeded import EXPECTED, ROOT, build_seeded_cluster
from auditor.zk import ZkClient

pytestmark = pytest.mark.slow

HEALTHY = 200
LEDGERS = HEALTHY + 8


async def _until(what: str, done: Callable[[], bool], within: float = 60) -> None:
    """Polls daemon state (no event marks a finished report) until `done`."""
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"not reached in {within}s: {what}"
        await asyncio.sleep(0.1)


def _sample(metrics: Metrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


async def test_checks_after_the_first_read_the_index_which_follows_the_cluster(
    zk: ZkClient, info_logs: list[MutableMapping[str, Any]]
) -> None:
    bookies = [BookieEmulator(zk, ledgers_root=ROOT) for _ in range(8)]
    for b in bookies:
        await b.start()
    await build_seeded_cluster(zk, bookies, healthy=HEALTHY)
    await bookies[6].crash()
    bookies[7].pause()
    cfg = fast_config(zk.hosts, "index-auditor:1", ["auditorPeriodicCheckInterval=0"])
    metrics = Metrics()
    async with running(cfg, metrics) as daemon:
        checks = daemon.state.checks
        first = (Check.BOOKIES, Check.PLACEMENT, Check.REPLICAS, Check.GRACE)
        await _until("first round", lambda: all(checks[c].last_finished for c in first))
        for check in first:
            report = checks[check].last_report
            assert report is not None and report.counts() == EXPECTED[str(check)], check
        # Every check of the first round waited for the load and read the index.
        started = [e for e in info_logs if e["event"] == "check started"]
        assert [(e["check"], e["metadata"]) for e in started] == [(str(c), "index") for c in first]
        assert _sample(metrics, "bookkeeper_auditor_index_loads_total") == 1
        assert _sample(metrics, "bookkeeper_auditor_index_ledgers") == LEDGERS
        assert 0 < _sample(metrics, "bookkeeper_auditor_index_bytes_per_ledger") < 400

        # A new ledger with two bookies of one rack in a write quorum, and the seeded
        # not-adhering ledger deleted: the next placement check sees both changes.
        ids = [b.bookie_id for b in bookies]
        await ClusterWriter(zk, ROOT).write_ledger(
            make_metadata(4000, [ids[0], ids[1], ids[2]], write_quorum=2, last_entry_id=9)
        )
        await zk.delete(f"{ROOT}/00/0000/L3005")
        placed = checks[Check.PLACEMENT].last_finished
        await daemon.trigger_check(Check.PLACEMENT)
        await _until("placement again", lambda: checks[Check.PLACEMENT].last_finished != placed)
        report = checks[Check.PLACEMENT].last_report
        assert report is not None
        assert [
            v.ledger_id for v in report.violations if v.category is Category.PLACEMENT_NOT_ADHERING
        ] == [4000]
        assert report.ledgers_checked == LEDGERS  # one more, one less

        # A bookie lost: the bookie check finds its ledgers in the index.
        audited = checks[Check.BOOKIES].last_finished
        await bookies[5].crash()
        await _until("bookie check", lambda: checks[Check.BOOKIES].last_finished != audited)
        report = checks[Check.BOOKIES].last_report
        assert report is not None and ids[5] in report.lost_bookies
        on_5 = {v.ledger_id for v in report.violations if v.bookie == ids[5]}
        assert 3003 in on_5 and 3006 in on_5
        # No second full read, whatever happened since the first.
        assert _sample(metrics, "bookkeeper_auditor_index_loads_total") == 1
        assert _sample(metrics, "bookkeeper_auditor_index_resyncs_total") == 0
        assert all(e["metadata"] == "index" for e in info_logs if e["event"] == "check started")
    bookies[7].resume()
    for b in bookies:
        if b.running:
            await b.stop()
