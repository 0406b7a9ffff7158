"""Ledger passwords never leave the auditor: not in metrics, logs, reports, listings or scans.

The ledger check needs each ledger's password (it verifies entry digests), so
the auditor holds them; an operator's scrape, log pipeline or report must
not. The ledgers here are written with a distinctive password; every output
the auditor produces is searched for it, raw, hex and base64.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import structlog

from auditor.checks.findings import ALL_CHECKS
from auditor.daemon.config import load_daemon_config
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.logs import configure_logging
from auditor.testing.cli import bk
from auditor.testing.harness import test_cluster
from auditor.zk import ZkClient

pytestmark = pytest.mark.slow

PASSWORD = b"pw-Zq8vX1-ledger-secret"
FORMS = [
    PASSWORD,
    PASSWORD.hex().encode(),
    base64.b64encode(PASSWORD),
    base64.b64encode(PASSWORD)[:-2],
]


def _binaries(value: object) -> list[bytes]:
    """Every bytes value inside a decoded Parquet row (custom metadata, say)."""
    if isinstance(value, bytes):
        return [value]
    if isinstance(value, dict):
        return [b for v in value.values() for b in _binaries(v)]
    if isinstance(value, list):
        return [b for v in value for b in _binaries(v)]
    return []


def _assert_clean(what: str, data: bytes) -> None:
    assert data, f"{what} is empty: nothing was searched"
    for form in FORMS:
        assert form not in data, f"{what} contains the ledger password ({form!r})"


async def _bk(*args: str) -> bytes:
    """Everything a command prints, both streams."""
    _, out, err = await bk(*args)
    return (out + err).encode()


async def test_passwords_appear_in_no_output(zk: ZkClient, tmp_path: Path) -> None:
    saved = structlog.get_config()
    logs = io.StringIO()
    configure_logging("json", level=logging.DEBUG, stream=logs)
    try:
        async with test_cluster(zk, 4, password=PASSWORD) as tc:
            for lid in (1, 2, 3):
                await tc.writer.write_ledger(lid, tc.ids[:3], write_quorum=2, num_entries=8)
            # A lost copy, so violations (and their evidence) are reported and logged.
            tc.bookies[1].drop_entries(2, [3])
            cfg = load_daemon_config(
                None,
                [
                    f"daemon.zk={zk.hosts}",
                    "daemon.identity=secret-test:1",
                    "worker.enabled=false",
                    "daemon.jitter=0",
                    "metrics.host=127.0.0.1",
                    "metrics.port=0",
                    "auditorPeriodicBookieCheckInterval=3600",
                    "auditorPeriodicCheckInterval=3600",
                    "auditorLedgerVerificationPercentage=100",
                    "auditorPeriodicPlacementPolicyCheckInterval=3600",
                    "auditorReplicasCheckInterval=3600",
                    "readEntryTimeout=1",
                    "checks.retry_delay=0.1",
                ],
                env={},
            )
            metrics = Metrics()
            daemon = Daemon(cfg, metrics=metrics)
            run = asyncio.ensure_future(daemon.run(signals=False))
            try:
                deadline = time.monotonic() + 60
                checks = daemon.state.checks
                while not all(checks[c].last_finished for c in ALL_CHECKS):
                    assert time.monotonic() < deadline, "first round not done"
                    await asyncio.sleep(0.1)
                # The ledger check read and verified entries: the password was used.
                ledgers = checks[ALL_CHECKS[1]].last_report
                assert ledgers is not None and ledgers.ledgers_checked == 3
                replicas = daemon.state.checks[ALL_CHECKS[3]].last_report
                assert replicas is not None and [v.ledger_id for v in replicas.violations] == [2]
                assert metrics.http_port is not None
                url = f"http://127.0.0.1:{metrics.http_port}/metrics"
                scrape = await asyncio.to_thread(
                    lambda: urllib.request.urlopen(url, timeout=5).read()
                )
                _assert_clean("the metrics exposition", scrape)
                for check in ALL_CHECKS:
                    report = checks[check].last_report
                    assert report is not None
                    _assert_clean(f"the {check} report", json.dumps(report.to_json()).encode())
            finally:
                daemon.stop()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(run, 30)
            _assert_clean("the daemon's logs", logs.getvalue().encode())
            hosts = zk.hosts
            _assert_clean("ledgers --json", await _bk("ledgers", "--zk", hosts, "--json"))
            _assert_clean("check all", await _bk("check", "all", "--zk", hosts, "--json"))
            out = tmp_path / "scan"
            await _bk("scan", "--zk", hosts, "--out", str(out), "--set", "readEntryTimeout=1")
            await _bk("snapshot", "--zk", hosts, "--out", str(tmp_path / "snap"))
            files = [p for d in (out, tmp_path / "snap") for p in d.rglob("*") if p.is_file()]
            assert any(p.suffix == ".parquet" for p in files)
            for p in files:
                data = p.read_bytes()
                if p.suffix == ".parquet":
                    # Compressed pages would hide the bytes: search the decoded values.
                    rows = pq.read_table(p).to_pylist()
                    data = repr(rows).encode() + b"".join(v for row in rows for v in _binaries(row))
                _assert_clean(str(p.relative_to(tmp_path)), data)
    finally:
        structlog.configure(**saved)
