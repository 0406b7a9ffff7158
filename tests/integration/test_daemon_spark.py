"""A leader with `daemon.engine = "spark"`: its placement and replicas checks run as Spark jobs.

The daemon runs in this process, as `bk-auditor demo` runs its daemons, on
the loop that serves the emulated bookies: the Spark session starts and its
actions run in worker threads, so the bookies keep answering the Spark
tasks (local[2], separate Python workers) meanwhile. The cluster is the
seeded one, with fewer healthy ledgers; what the metrics publish must be the
seeded faults, exactly as an in-process leader publishes them. Then the
leader loses its vote in the middle of a Spark run: the run must end with
its Spark session, and publish nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import MutableMapping
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark import SparkContext

from auditor.checks.findings import CATEGORIES, Check
from auditor.daemon.config import load_daemon_config
from auditor.daemon.election import election_path
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.bookie import BookieEmulator
from auditor.testing.seeded import EXPECTED, ROOT, build_seeded_cluster
from auditor.zk import ZkClient

pytestmark = pytest.mark.slow

HEALTHY = 200
ON_SPARK = (Check.PLACEMENT, Check.REPLICAS)
IN_PROCESS = (Check.BOOKIES, Check.GRACE)


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def _logged(logs: list[MutableMapping[str, Any]], event: str, n: int, within: float) -> None:
    """Polls the captured log until `event` has been logged `n` times."""
    deadline = time.monotonic() + within
    while sum(1 for e in logs if e["event"] == event) < n:
        assert time.monotonic() < deadline, f"{event!r} not logged {n} times in {within}s"
        await asyncio.sleep(0.05)


async def _first_round(d: Daemon, checks: tuple[Check, ...], within: float) -> None:
    """Polls the daemon's state (no event marks a report) until every check has reported."""
    deadline = time.monotonic() + within
    while not all(d.state.checks[c].last_finished is not None for c in checks):
        assert time.monotonic() < deadline, {str(c): str(d.state.checks[c].outcome) for c in checks}
        await asyncio.sleep(0.2)


async def test_spark_leader_publishes_the_seeded_faults_and_stops_its_job_when_deposed(
    zk: ZkClient, info_logs: list[MutableMapping[str, Any]]
) -> None:
    bookies = [BookieEmulator(zk, ledgers_root=ROOT) for _ in range(8)]
    for b in bookies:
        await b.start()
    await build_seeded_cluster(zk, bookies, healthy=HEALTHY)
    await bookies[6].crash()  # lost: 3001's bookie
    bookies[7].pause()  # registered but silent: 3007's bookie
    cfg = load_daemon_config(
        None,
        [
            f"daemon.zk={zk.hosts}",
            "daemon.identity=spark-auditor:1",
            "worker.enabled=false",
            "daemon.jitter=0",
            "daemon.engine=spark",
            "scan.master=local[2]",
            "scan.partitions=3",
            "scan.spark_conf=spark.sql.shuffle.partitions=2;spark.driver.memory=512m",
            "metrics.host=127.0.0.1",
            "metrics.port=0",
            "auditorPeriodicBookieCheckInterval=3600",
            "auditorPeriodicCheckInterval=0",  # the ledger check: not this test's subject
            "auditorPeriodicPlacementPolicyCheckInterval=3600",
            "auditorReplicasCheckInterval=3600",
            "underreplicatedLedgerRecoveryGracePeriod=3600",
            "readEntryTimeout=1",
            "checks.retry_delay=0.2",
            "checks.retry_attempts=1",
        ],
        env={},
    )
    metrics = Metrics()
    daemon = Daemon(cfg, metrics=metrics)
    run = asyncio.ensure_future(daemon.run(signals=False))
    try:
        # A bound on a hang, not a speed: a local Spark's first jobs took more than 120 s
        # on a 2-core machine running other pytest workers and more (load 12-15).
        await _first_round(daemon, (*ON_SPARK, *IN_PROCESS), within=240)
        for check in (*ON_SPARK, *IN_PROCESS):
            cs = daemon.state.checks[check]
            assert cs.last_error is None, (check, cs.last_error)
            assert cs.last_report is not None
            assert cs.last_report.counts() == EXPECTED[str(check)], check
        # The Spark job's marks went through the leader's context: 3002 (no copy of an
        # entry), 3003 and 3004 (copies lost), beside the bookie check's 3001 and the
        # seeded 3006; 3007's silent bookie is not evidence of a lost copy.
        replicas = daemon.state.checks[Check.REPLICAS].last_report
        assert replicas is not None
        assert sorted(replicas.marked_underreplicated) == [3002, 3003, 3004]
        urm = UnderreplicationManager(zk, ROOT)
        marked = sorted([ur.ledger_id async for ur in urm.list_underreplicated()])
        assert marked == [3001, 3002, 3003, 3004, 3006]

        assert metrics.http_port is not None
        samples = await asyncio.to_thread(_scrape, metrics.http_port)
        for check in ON_SPARK:
            for category in CATEGORIES[check]:
                labels = (("category", str(category)), ("check", str(check)))
                want = EXPECTED[str(check)][str(category)]
                assert samples["bookkeeper_auditor_ledgers_in_violation", labels] == want
                assert samples["bookkeeper_auditor_violations_total", labels] == want
            runs = (("check", str(check)), ("outcome", "violations"))
            assert samples["bookkeeper_auditor_check_runs_total", runs] == 1
        marks = (("reason", "replicas"),)
        assert samples["bookkeeper_auditor_ledgers_marked_underreplicated_total", marks] == 3

        # Which engine ran what: placement and replicas as Spark jobs, the rest in process.
        started = {e["check"]: e["engine"] for e in info_logs if e["event"] == "check started"}
        assert started == {
            **{str(c): "spark" for c in ON_SPARK},
            **{str(c): "asyncio" for c in IN_PROCESS},
        }
        scans = [e for e in info_logs if e["event"] == "scan finished"]
        assert [(e["engine"], list(e["counts"])) for e in scans] == [
            ("spark", ["placement"]),
            ("spark", ["replicas"]),
        ]

        # Leadership lost mid-run: the replicas job waits at least a read timeout on
        # 3007's silent bookie, so the vote goes while its Spark stage runs.
        await daemon.trigger_check(Check.REPLICAS)
        await _logged(info_logs, "scan planned", 3, within=60)
        votes = election_path(ROOT)
        for vote in await zk.get_children(votes):
            await zk.delete(f"{votes}/{vote}")
        await _logged(info_logs, "no longer the auditor", 1, within=30)
        assert SparkContext._active_spark_context is None  # the session ended with the run
        events = [(e["event"], e.get("check")) for e in info_logs]
        assert events.count(("check started", "replicas")) == 2
        assert events.count(("check run", "replicas")) == 1
        assert events.count(("scan finished", None)) == 2
        assert ("check failed", "replicas") not in events  # cancelled, not failed
        for outcome, n in (("violations", 1), ("failed", 0)):
            run_labels = {"check": "replicas", "outcome": outcome}
            runs_now = metrics.registry.get_sample_value(
                "bookkeeper_auditor_check_runs_total", run_labels
            )
            assert runs_now == n, outcome
    finally:
        daemon.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run, 30)
        bookies[7].resume()
        for b in bookies:
            if b.running:
                await b.stop()
