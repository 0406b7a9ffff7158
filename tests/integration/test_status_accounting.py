"""`status` over gRPC and the CLI: each check's last-success age and its false-alarm figures."""

from __future__ import annotations

import json
import time

from auditor.api.convert import status_json, status_response
from auditor.checks.findings import Check
from auditor.daemon.state import DaemonState
from auditor.proto import auditor_service_pb2 as pb
from auditor.zk import ZkClient
from tests.integration.test_admin_cli import bk
from tests.integration.test_api import T0, open_api, sample_state


def accounting_state() -> DaemonState:
    state = sample_state()
    replicas = state.checks[Check.REPLICAS]
    assert replicas.last_report is not None
    replicas.last_report.dropped.update({"retry_succeeded": 3, "marked_meanwhile": 1})
    # placement last completed on the former leader (its ctime), never here
    state.checks[Check.PLACEMENT].recorded_success = T0 + 50
    for check in (Check.LEDGERS, Check.BOOKIES, Check.GRACE):
        state.checks[check].waiting_since = T0 + 10
    return state


def test_age_is_from_the_last_known_success_else_from_the_wait() -> None:
    doc = status_json(status_response(accounting_state(), now=T0 + 1000.5))
    ages = {name: c["last_success_age_s"] for name, c in doc["checks"].items()}
    assert ages == {
        "bookies": 990.5,
        "ledgers": 990.5,
        "placement": 950.5,
        "replicas": 900.0,
        "grace": 990.5,
    }
    replicas = doc["checks"]["replicas"]
    assert replicas["would_be_violations_dropped"] == {"marked_meanwhile": 1, "retry_succeeded": 3}
    # 4 dropped / (4 + 4 ledger-categories reported)
    assert replicas["false_alarm_share"] == 0.5
    assert doc["checks"]["placement"]["would_be_violations_dropped"] == {}
    assert doc["checks"]["ledgers"]["would_be_violations_dropped"] is None  # no report yet


async def test_status_shows_the_age_over_grpc_and_the_cli(zk: ZkClient) -> None:
    a = await open_api(zk, state=accounting_state())
    try:
        before = time.time()
        msg = await a.stub.GetStatus(pb.GetStatusRequest(), timeout=5)
        after = time.time()
        ages = {c.check: c.last_success_age_seconds for c in msg.checks}
        assert before - (T0 + 100.5) - 0.001 <= ages["replicas"] <= after - (T0 + 100.5) + 0.001
        assert before - (T0 + 10) - 0.001 <= ages["bookies"] <= after - (T0 + 10) + 0.001
        replicas = next(c for c in msg.checks if c.check == "replicas")
        assert dict(replicas.would_be_violations_dropped) == {
            "retry_succeeded": 3,
            "marked_meanwhile": 1,
        }

        report = await a.stub.GetReport(pb.GetReportRequest(check="replicas"), timeout=5)
        assert (report.violations, report.violations_truncated) == (4, False)
        assert dict(report.would_be_violations_dropped) == {
            "retry_succeeded": 3,
            "marked_meanwhile": 1,
        }
        assert json.loads(report.report_json)["false_alarm_share"] == 0.5

        start = time.time()
        run = await bk("status", "--target", a.target, "--json")
        assert run.returncode == 0, run.stderr
        age = json.loads(run.stdout)["checks"]["grace"]["last_success_age_s"]
        assert start - (T0 + 10) - 0.001 <= age <= time.time() - (T0 + 10) + 0.001

        run = await bk("status", "--target", a.target)
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        assert "success age" in lines[2]
        row = next(line for line in lines if line.strip().startswith("replicas"))
        assert f"{round(time.time() - (T0 + 100.5))}s" in row or (
            f"{round(time.time() - (T0 + 100.5)) - 1}s" in row
        )
        i = lines.index(row)
        assert lines[i + 1].strip() == (
            "would-be violations dropped: marked_meanwhile=1, retry_succeeded=3 "
            "(false-alarm share 0.50)"
        )
    finally:
        await a.channel.close()
        await a.server.stop(0)
