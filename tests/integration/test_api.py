"""The gRPC API, served in-process and called with a real grpc.aio client.

The daemon side is `MinimalControl`: a plain `DaemonControl` over a
`DaemonState` and a real `UnderreplicationManager` on the test's ZooKeeper,
so every ZooKeeper effect of a call is checked in ZooKeeper itself.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from grpc_reflection.v1alpha import (  # type: ignore[import-untyped]
    reflection_pb2,
    reflection_pb2_grpc,
)

from auditor.analysis.explain_run import explain_on_cluster
from auditor.api import LIVENESS, READINESS
from auditor.api.client import ApiClient, ApiUnauthenticatedError
from auditor.api.convert import report_from_json
from auditor.api.server import ApiServer, start_api_server
from auditor.checks.findings import Category, Check, CheckReport, Coverage, Violation
from auditor.checks.tally import ViolationLog
from auditor.config import load_config
from auditor.daemon.state import CheckState, DaemonState, NotLeaderError, Outcome
from auditor.errors import ConfigError
from auditor.metadata.layout import LedgerManager
from auditor.metadata.underreplication import UnderreplicatedLedger, UnderreplicationManager
from auditor.proto import auditor_service_pb2 as pb
from auditor.proto import auditor_service_pb2_grpc as pb_grpc
from auditor.secretfiles import MAX_TOKEN_CHARS
from auditor.testing.cluster import ClusterWriter
from auditor.testing.pki import issue, new_ca
from auditor.zk import ZkClient

TOKEN = "s3cret-token"
ME = "10.0.0.1:3181"
OTHER = "10.0.0.2:3181"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

# --- the daemon side ------------------------------------------------------------------


class MinimalControl:
    """What the daemon hands the server, minus the daemon: state plus ZooKeeper writes."""

    def __init__(self, state: DaemonState, urm: UnderreplicationManager) -> None:
        self.state = state
        self.urm = urm
        self.triggered: list[Check] = []

    async def trigger_check(self, check: Check) -> None:
        if not self.state.is_leader:
            raise NotLeaderError(
                f"{self.state.identity} is not the auditor; the auditor is {self.state.leader}"
            )
        self.triggered.append(check)

    async def current_leader(self) -> str | None:
        return self.state.leader

    async def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        await self.urm.set_lost_bookie_recovery_delay(seconds)

    async def get_lost_bookie_recovery_delay(self) -> int:
        return await self.urm.get_lost_bookie_recovery_delay()

    async def set_autorecovery(self, enabled: bool) -> None:
        if enabled:
            await self.urm.enable_replication()
        else:
            await self.urm.disable_replication()

    def list_underreplicated(self) -> AsyncIterator[UnderreplicatedLedger]:
        return self.urm.list_underreplicated()

    async def explain(self, ledger_id: int) -> dict[str, Any]:
        """As the daemon: a fresh context on the cluster (defaults, hierarchical layout)."""
        return await explain_on_cluster(
            self.urm.store,
            self.urm.root,
            LedgerManager.HIERARCHICAL,
            load_config(None, []),
            ledger_id,
        )


T0 = 1_700_000_000.25


def nanos(ts: float) -> int:
    """Exact for the quarter-second times used here (ts * 1e9 would not be)."""
    return int(ts * 4) * 250_000_000


def replicas_report() -> CheckReport:
    return CheckReport(
        Check.REPLICAS,
        started_at=T0,
        finished_at=T0 + 100.5,
        ledgers_checked=10,
        ledgers_skipped=Counter({"open": 2, "empty": 0}),
        violations=ViolationLog(
            [
                Violation(
                    12,
                    Category.BELOW_WRITE_QUORUM,
                    None,
                    {
                        "copies_found": 2,
                        "write_quorum": 3,
                        "ack_quorum": 2,
                        "worst_entries": [[5, 9]],
                    },
                ),
                Violation(
                    7,
                    Category.NO_REPLICA,
                    None,
                    {
                        "copies_found": 0,
                        "write_quorum": 3,
                        "ack_quorum": 2,
                        "worst_entries": [[0, 4]],
                    },
                ),
                Violation(3, Category.BOOKIE_UNAVAILABLE_REGISTERED, OTHER, {"reason": "timeout"}),
                Violation(
                    3,
                    Category.BELOW_ACK_QUORUM,
                    None,
                    {
                        "copies_found": 1,
                        "write_quorum": 3,
                        "ack_quorum": 2,
                        "worst_entries": [[0, 0]],
                    },
                ),
            ]
        ),
        marked_underreplicated=[7, 3, 7],
        coverage=Coverage(listed=20, probed=5, unverified=1),
    )


def placement_report() -> CheckReport:
    window = {"first_entry": 0, "reason": "2 racks < 3", "window": {"locations": ["/r1", "/r1"]}}
    return CheckReport(
        Check.PLACEMENT,
        started_at=T0 + 200,
        finished_at=T0 + 201,
        ledgers_checked=4,
        violations=ViolationLog(
            [
                Violation(9, Category.PLACEMENT_SOFTLY_ADHERING, None, {"segments": [window]}),
                Violation(3, Category.PLACEMENT_NOT_ADHERING, None, {"segments": [window]}),
            ]
        ),
    )


def sample_state(*, leader: bool = True) -> DaemonState:
    state = DaemonState(
        identity=ME,
        started_at=T0 - 1000,
        is_leader=leader,
        leader=ME if leader else OTHER,
        zk_connected=True,
        replication_enabled=True,
        retry_queue=4,
        lost_bookies=("10.0.0.9:3181", "10.0.0.8:3181"),
    )
    state.checks[Check.REPLICAS] = CheckState(
        Check.REPLICAS,
        interval_s=3600.0,
        outcome=Outcome.VIOLATIONS,
        last_started=T0,
        last_finished=T0 + 100.5,
        last_success=T0 + 100.5,
        next_run=T0 + 3700,
        last_report=replicas_report(),
    )
    state.checks[Check.PLACEMENT] = CheckState(
        Check.PLACEMENT,
        interval_s=86400.0,
        outcome=Outcome.VIOLATIONS,
        last_started=T0 + 200,
        last_finished=T0 + 201,
        last_report=placement_report(),
    )
    state.checks[Check.LEDGERS] = CheckState(
        Check.LEDGERS,
        interval_s=604800.0,
        outcome=Outcome.FAILED,
        last_started=T0 + 300,
        last_finished=T0 + 301,
        last_error="ZooKeeper unavailable",
    )
    state.checks[Check.BOOKIES] = CheckState(
        Check.BOOKIES, interval_s=86400.0, outcome=Outcome.RUNNING, last_started=T0 + 400
    )
    state.checks[Check.GRACE] = CheckState(Check.GRACE, enabled=False)
    return state


async def cluster_urm(zk: ZkClient) -> UnderreplicationManager:
    await ClusterWriter(zk).init_cluster()
    urm = UnderreplicationManager(zk, "/ledgers")
    await urm.check_layout()
    return urm


@dataclass
class Api:
    server: ApiServer
    control: MinimalControl
    channel: grpc.aio.Channel
    stub: Any
    health: Any

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"


async def open_api(
    zk: ZkClient, *, state: DaemonState | None = None, token: str | None = TOKEN, **tls: Any
) -> Api:
    control = MinimalControl(state or sample_state(), await cluster_urm(zk))
    server = await start_api_server(control, host="127.0.0.1", port=0, token=token, **tls)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    return Api(
        server,
        control,
        channel,
        pb_grpc.AuditorServiceStub(channel),
        health_pb2_grpc.HealthStub(channel),
    )


@pytest.fixture
async def api(zk: ZkClient) -> AsyncIterator[Api]:
    a = await open_api(zk)
    try:
        yield a
    finally:
        await a.channel.close()
        await a.server.stop(0)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def rpc_error(aw: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await aw
    return info.value


# --- reads ------------------------------------------------------------------------------


async def test_status_fields(api: Api) -> None:
    st = await api.stub.GetStatus(pb.GetStatusRequest(), timeout=5)
    assert (st.identity, st.is_leader, st.leader) == (ME, True, ME)
    assert (st.zk_connected, st.replication_enabled, st.retry_queue_ledgers) == (True, True, 4)
    assert list(st.lost_bookies) == ["10.0.0.8:3181", "10.0.0.9:3181"]
    assert st.started_at.ToNanoseconds() == nanos(T0 - 1000)
    checks = {c.check: c for c in st.checks}
    assert list(checks) == ["bookies", "ledgers", "placement", "replicas", "grace"]

    rep = checks["replicas"]
    assert (rep.enabled, rep.interval_seconds, rep.outcome) == (True, 3600.0, pb.OUTCOME_VIOLATIONS)
    assert rep.last_started.ToNanoseconds() == nanos(T0)
    assert rep.last_finished.ToNanoseconds() == nanos(T0 + 100.5)
    assert rep.last_success.ToNanoseconds() == nanos(T0 + 100.5)
    assert rep.next_run.ToNanoseconds() == nanos(T0 + 3700)
    assert dict(rep.counts) == {
        "no_replica": 1,
        "below_ack_quorum": 1,
        "below_write_quorum": 1,
        "bookie_unavailable_registered": 1,
        "underreplicated_past_grace_period": 0,
        "metadata_invalid": 0,
    }
    assert (rep.has_report, rep.ledgers_checked, rep.last_error) == (True, 10, "")

    led = checks["ledgers"]
    assert (led.outcome, led.last_error, led.has_report) == (
        pb.OUTCOME_FAILED,
        "ZooKeeper unavailable",
        False,
    )
    assert dict(led.counts) == {} and not led.HasField("next_run")
    assert checks["bookies"].outcome == pb.OUTCOME_RUNNING
    assert not checks["bookies"].HasField("last_finished")
    grace = checks["grace"]
    assert (grace.enabled, grace.outcome, grace.HasField("last_started")) == (
        False,
        pb.OUTCOME_NEVER,
        False,
    )


async def test_follower_answers_status_and_names_leader(zk: ZkClient) -> None:
    a = await open_api(zk, state=sample_state(leader=False))
    try:
        st = await a.stub.GetStatus(pb.GetStatusRequest(), timeout=5)
        assert (st.identity, st.is_leader, st.leader) == (ME, False, OTHER)
        err = await rpc_error(
            a.stub.TriggerCheck(
                pb.TriggerCheckRequest(check="replicas"), metadata=bearer(TOKEN), timeout=5
            )
        )
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert OTHER in err.details()
        assert a.control.triggered == []
        a.control.state.checks[Check.REPLICAS].last_report = None
        missing = await rpc_error(a.stub.GetReport(pb.GetReportRequest(check="replicas")))
        assert missing.code() == grpc.StatusCode.NOT_FOUND
        assert missing.details().endswith(f"the auditor is {OTHER}")
    finally:
        await a.channel.close()
        await a.server.stop(0)


async def test_get_report_is_the_check_json(api: Api) -> None:
    report = api.control.state.checks[Check.REPLICAS].last_report
    assert report is not None
    resp = await api.stub.GetReport(pb.GetReportRequest(check="replicas"), timeout=5)
    assert resp.report_json == json.dumps(report.to_json())
    assert json.loads(resp.report_json) == report.to_json()
    assert dict(resp.counts) == report.counts()
    assert dict(resp.ledgers_skipped) == {"open": 2}
    assert (resp.check, resp.ledgers_checked, resp.violations, resp.marked_underreplicated) == (
        "replicas",
        10,
        4,
        2,
    )
    assert resp.started_at.ToNanoseconds() == nanos(T0)
    assert resp.finished_at.ToNanoseconds() == nanos(T0 + 100.5)
    # the CLI renders a daemon's report from its document: nothing is lost on the way
    assert report_from_json(json.loads(resp.report_json)).to_json() == report.to_json()

    missing = await rpc_error(api.stub.GetReport(pb.GetReportRequest(check="ledgers"), timeout=5))
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    assert "no report of check ledgers" in missing.details()
    assert "failed" in missing.details()
    bad = await rpc_error(api.stub.GetReport(pb.GetReportRequest(check="racks"), timeout=5))
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown check 'racks'" in bad.details()


async def _violations(api: Api, check: str = "", category: str = "") -> list[tuple[Any, ...]]:
    call = api.stub.ListViolations(
        pb.ListViolationsRequest(check=check, category=category), timeout=5
    )
    return [
        (v.check, v.ledger_id, v.category, v.bookie, json.loads(v.detail_json)) async for v in call
    ]


async def test_list_violations_filters(api: Api) -> None:
    everything = await _violations(api)
    assert [(c, lid, cat, b) for c, lid, cat, b, _ in everything] == [
        ("placement", 3, "placement_not_adhering", ""),
        ("placement", 9, "placement_softly_adhering", ""),
        ("replicas", 3, "below_ack_quorum", ""),
        ("replicas", 3, "bookie_unavailable_registered", OTHER),
        ("replicas", 7, "no_replica", ""),
        ("replicas", 12, "below_write_quorum", ""),
    ]
    assert everything[3][4] == {"reason": "timeout"}
    assert everything[4][4]["worst_entries"] == [[0, 4]]

    assert [v[1] for v in await _violations(api, check="replicas")] == [3, 3, 7, 12]
    assert [v[1] for v in await _violations(api, category="no_replica")] == [7]
    assert [v[:3] for v in await _violations(api, "placement", "placement_not_adhering")] == [
        ("placement", 3, "placement_not_adhering")
    ]
    assert await _violations(api, "replicas", "placement_not_adhering") == []
    assert await _violations(api, check="ledgers") == []  # no report yet
    for check, category, needle in [
        ("racks", "", "unknown check"),
        ("", "lost", "unknown category"),
    ]:
        err = await rpc_error(_violations(api, check, category))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in err.details()


async def test_list_underreplicated(api: Api) -> None:
    urm = api.control.urm
    await urm.mark_underreplicated(70000, [OTHER, "10.0.0.3:3181"], now_ms=1_700_000_000_123)
    await urm.mark_underreplicated(5, [OTHER], now_ms=1_700_000_000_000)
    await UnderreplicationManager(urm.store, "/ledgers", store_ctime=False).mark_underreplicated(
        2**40 + 1, ["10.0.0.3:3181"]
    )

    async def listing(**filters: str) -> list[tuple[int, list[str], int | None]]:
        call = api.stub.ListUnderReplicated(pb.ListUnderReplicatedRequest(**filters), timeout=5)
        return [
            (m.ledger_id, list(m.replicas), m.ctime_ms if m.HasField("ctime_ms") else None)
            async for m in call
        ]

    assert await listing() == [
        (5, [OTHER], 1_700_000_000_000),
        (70000, [OTHER, "10.0.0.3:3181"], 1_700_000_000_123),
        (2**40 + 1, ["10.0.0.3:3181"], None),
    ]
    assert [m[0] for m in await listing(missing_replica=OTHER)] == [5, 70000]
    assert [m[0] for m in await listing(excluding_missing_replica=OTHER)] == [2**40 + 1]
    assert [
        m[0]
        for m in await listing(missing_replica="10.0.0.3:3181", excluding_missing_replica=OTHER)
    ] == [2**40 + 1]


# --- mutations and authentication ---------------------------------------------------


async def test_mutations_need_the_token(api: Api) -> None:
    zk = api.control.urm.store
    delay_path = "/ledgers/underreplication/lostBookieRecoveryDelay"
    calls: list[Callable[[Any], Any]] = [
        lambda md: api.stub.TriggerCheck(
            pb.TriggerCheckRequest(check="replicas"), metadata=md, timeout=5
        ),
        lambda md: api.stub.SetLostBookieRecoveryDelay(
            pb.SetLostBookieRecoveryDelayRequest(seconds=42), metadata=md, timeout=5
        ),
        lambda md: api.stub.SetAutoRecovery(
            pb.SetAutoRecoveryRequest(enabled=False), metadata=md, timeout=5
        ),
    ]
    for call in calls:
        for md, needle in [
            ((), "needs authentication"),
            (bearer("wrong"), "not valid"),
            ((("authorization", TOKEN),), "not valid"),  # no scheme
        ]:
            err = await rpc_error(call(md))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED, md
            assert needle in err.details()
    # nothing happened
    assert api.control.triggered == []
    assert await zk.exists(delay_path) is None
    assert await zk.exists("/ledgers/underreplication/disable") is None

    resp = await calls[0](bearer(TOKEN))
    assert (list(resp.triggered), resp.identity) == (["replicas"], ME)
    assert api.control.triggered == [Check.REPLICAS]

    assert (await calls[1](bearer(TOKEN))).seconds == 42
    assert (await zk.get(delay_path))[0] == b"42"
    got = await api.stub.GetLostBookieRecoveryDelay(
        pb.GetLostBookieRecoveryDelayRequest(), timeout=5
    )
    assert got.seconds == 42

    assert (await calls[2](bearer(TOKEN))).enabled is False
    assert (await zk.get("/ledgers/underreplication/disable"))[0] == b""
    again = await api.stub.SetAutoRecovery(
        pb.SetAutoRecoveryRequest(enabled=True), metadata=bearer(TOKEN), timeout=5
    )
    assert again.enabled is True
    assert await zk.exists("/ledgers/underreplication/disable") is None

    neg = await rpc_error(
        api.stub.SetLostBookieRecoveryDelay(
            pb.SetLostBookieRecoveryDelayRequest(seconds=-1), metadata=bearer(TOKEN), timeout=5
        )
    )
    assert neg.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await zk.get(delay_path))[0] == b"42"


async def test_trigger_all_and_unknown(api: Api) -> None:
    resp = await api.stub.TriggerCheck(
        pb.TriggerCheckRequest(check="all"), metadata=bearer(TOKEN), timeout=5
    )
    # grace is disabled in the sample state
    assert list(resp.triggered) == ["bookies", "ledgers", "placement", "replicas"]
    assert api.control.triggered == [Check.BOOKIES, Check.LEDGERS, Check.PLACEMENT, Check.REPLICAS]
    for name in ("", "racks"):
        err = await rpc_error(
            api.stub.TriggerCheck(
                pb.TriggerCheckRequest(check=name), metadata=bearer(TOKEN), timeout=5
            )
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    # An unknown name is not echoed back whole: a bounded excerpt, and its length.
    huge = "r" * 1_000_000
    for call in (
        api.stub.TriggerCheck(pb.TriggerCheckRequest(check=huge), metadata=bearer(TOKEN)),
        api.stub.GetReport(pb.GetReportRequest(check=huge)),
    ):
        err = await rpc_error(call)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details().startswith("unknown check 'rrrrr")
        assert "(1000000 characters); expected one of bookies," in err.details()
        assert len(err.details()) < 200
    listed = api.stub.ListViolations(pb.ListViolationsRequest(category="c" * 100_000))
    err = await rpc_error(listed.read())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "(100000 characters)" in err.details() and len(err.details()) < 600


async def test_no_token_configured_refuses_every_mutation(zk: ZkClient) -> None:
    a = await open_api(zk, token=None)
    try:
        err = await rpc_error(
            a.stub.SetAutoRecovery(
                pb.SetAutoRecoveryRequest(enabled=False), metadata=bearer(TOKEN), timeout=5
            )
        )
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "mutating calls are disabled" in err.details()
        assert "[api] token or token_file" in err.details()
        assert await zk.exists("/ledgers/underreplication/disable") is None
        # reads still work
        st = await a.stub.GetStatus(pb.GetStatusRequest(), timeout=5)
        assert st.identity == ME
    finally:
        await a.channel.close()
        await a.server.stop(0)


async def test_missing_delay_znode_is_not_found(api: Api) -> None:
    err = await rpc_error(
        api.stub.GetLostBookieRecoveryDelay(pb.GetLostBookieRecoveryDelayRequest(), timeout=5)
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "reading lostBookieRecoveryDelay" in err.details()


# --- health and reflection --------------------------------------------------------------


async def _health(api: Api) -> dict[str, int]:
    out = {}
    for service in ("", LIVENESS, READINESS):
        resp = await api.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        out[service] = resp.status
    return out


async def test_health_follows_zookeeper_not_leadership(api: Api) -> None:
    state = api.control.state
    assert await _health(api) == {"": SERVING, LIVENESS: SERVING, READINESS: SERVING}

    state.is_leader = False  # a follower is just as ready
    await api.server.refresh_health()
    assert await _health(api) == {"": SERVING, LIVENESS: SERVING, READINESS: SERVING}

    watch = api.health.Watch(health_pb2.HealthCheckRequest(service=READINESS), timeout=10)
    assert (await watch.read()).status == SERVING
    state.zk_connected = False
    # the monitor publishes it by itself: the watch sees the change without our help
    assert (await watch.read()).status == NOT_SERVING
    watch.cancel()
    assert await _health(api) == {"": SERVING, LIVENESS: SERVING, READINESS: NOT_SERVING}

    state.zk_connected = True
    await api.server.refresh_health()
    assert (await _health(api))[READINESS] == SERVING

    state.heartbeat = time.monotonic() - 31  # the daemon's loop stopped turning
    await api.server.refresh_health()
    assert await _health(api) == {"": NOT_SERVING, LIVENESS: NOT_SERVING, READINESS: NOT_SERVING}
    state.heartbeat = time.monotonic()
    await api.server.refresh_health()
    assert await _health(api) == {"": SERVING, LIVENESS: SERVING, READINESS: SERVING}

    api.server.set_serving(live=True, ready=False)
    await api.server.refresh_health()
    assert await _health(api) == {"": SERVING, LIVENESS: SERVING, READINESS: NOT_SERVING}
    api.server.set_serving(live=False, ready=True)
    await api.server.refresh_health()
    assert await _health(api) == {"": NOT_SERVING, LIVENESS: NOT_SERVING, READINESS: NOT_SERVING}

    unknown = await rpc_error(
        api.health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
    )
    assert unknown.code() == grpc.StatusCode.NOT_FOUND


async def test_reflection_lists_the_services(api: Api) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(api.channel)

    async def ask(req: Any) -> Any:
        call = stub.ServerReflectionInfo(timeout=5)
        await call.write(req)
        await call.done_writing()
        resp = await call.read()
        call.cancel()
        return resp

    listed = await ask(reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {s.name for s in listed.list_services_response.service}
    assert names == {
        "bookkeeper.auditor.v1.AuditorService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    described = await ask(
        reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="bookkeeper.auditor.v1.AuditorService"
        )
    )
    assert described.file_descriptor_response.file_descriptor_proto


async def test_graceful_stop(zk: ZkClient) -> None:
    a = await open_api(zk)
    watch = a.health.Watch(health_pb2.HealthCheckRequest(service=READINESS), timeout=10)
    assert (await watch.read()).status == SERVING
    stopping = asyncio.ensure_future(a.server.stop(grace=5))
    # health turns NOT_SERVING first, so probes and load balancers move away
    assert (await watch.read()).status == NOT_SERVING
    watch.cancel()
    await stopping
    err = await rpc_error(a.stub.GetStatus(pb.GetStatusRequest(), timeout=5))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    await a.server.stop(grace=1)  # idempotent
    await a.channel.close()


# --- configuration errors ---------------------------------------------------------------


async def test_bad_server_configuration(zk: ZkClient, tmp_path: Path) -> None:
    control = MinimalControl(sample_state(), UnderreplicationManager(zk, "/ledgers"))
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tls_cert": str(tmp_path / "c.pem")}, "both the server certificate and its private key"),
        ({"tls_client_ca": str(tmp_path / "ca.pem")}, "mTLS (a client CA) needs TLS"),
        (
            {"tls_cert": str(tmp_path / "c.pem"), "tls_key": str(tmp_path / "k.pem")},
            "cannot read the API's TLS key",
        ),
    ]
    for kwargs, needle in cases:
        with pytest.raises(ConfigError, match=re.escape(needle)):
            await start_api_server(control, host="127.0.0.1", port=0, token=None, **kwargs)
    # A token no client can send in gRPC metadata is refused, without quoting it.
    with pytest.raises(ConfigError) as refused:
        await start_api_server(control, host="127.0.0.1", port=0, token="gehéim")
    assert "non-ASCII" in str(refused.value) and "gehéim" not in str(refused.value)
    first = await start_api_server(control, host="127.0.0.1", port=0, token=None)
    try:
        with pytest.raises(
            ConfigError, match=re.escape(f"cannot listen for gRPC on 127.0.0.1:{first.port}")
        ):
            await start_api_server(control, host="127.0.0.1", port=first.port, token=None)
    finally:
        await first.stop(0)


# --- TLS --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path
    rogue_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate for 127.0.0.1/localhost, a client and a rogue client.

    Made by `auditor.testing.pki` (the openssl CLI: the venv has no `cryptography`).
    """
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not available: TLS paths untested")
    d = tmp_path_factory.mktemp("pki")
    ca, rogue_ca = new_ca(d, "ca"), new_ca(d, "rogue-ca")
    server = issue(d, "server", ca, "localhost", ("DNS:localhost", "IP:127.0.0.1"))
    client = issue(d, "client", ca, "operator")
    rogue = issue(d, "rogue", rogue_ca, "intruder")
    return Pki(ca.cert, server.cert, server.key, client.cert, client.key, rogue.cert, rogue.key)


def _tls_channel(
    port: int, pki: Pki, cert: Path | None = None, key: Path | None = None
) -> grpc.aio.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=pki.ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", creds)


async def test_tls_with_token(zk: ZkClient, pki: Pki) -> None:
    a = await open_api(zk, tls_cert=str(pki.server_cert), tls_key=str(pki.server_key))
    try:
        plain = await rpc_error(a.stub.GetStatus(pb.GetStatusRequest(), timeout=5))
        assert plain.code() == grpc.StatusCode.UNAVAILABLE
        async with _tls_channel(a.server.port, pki) as ch:
            stub = pb_grpc.AuditorServiceStub(ch)
            assert (await stub.GetStatus(pb.GetStatusRequest(), timeout=5)).identity == ME
            err = await rpc_error(
                stub.SetAutoRecovery(pb.SetAutoRecoveryRequest(enabled=False), timeout=5)
            )
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            ok = await stub.SetAutoRecovery(
                pb.SetAutoRecoveryRequest(enabled=False), metadata=bearer(TOKEN), timeout=5
            )
            assert ok.enabled is False
        assert await zk.exists("/ledgers/underreplication/disable") is not None
    finally:
        await a.channel.close()
        await a.server.stop(0)


async def test_mtls_client_certificate_authorises(zk: ZkClient, pki: Pki) -> None:
    a = await open_api(
        zk,
        token=None,
        tls_cert=str(pki.server_cert),
        tls_key=str(pki.server_key),
        tls_client_ca=str(pki.ca),
    )
    try:
        async with _tls_channel(a.server.port, pki, pki.client_cert, pki.client_key) as ch:
            stub = pb_grpc.AuditorServiceStub(ch)
            resp = await stub.TriggerCheck(pb.TriggerCheckRequest(check="bookies"), timeout=5)
            assert list(resp.triggered) == ["bookies"]
            assert a.control.triggered == [Check.BOOKIES]
        for cert, key in [(None, None), (pki.rogue_cert, pki.rogue_key)]:
            async with _tls_channel(a.server.port, pki, cert, key) as ch:
                stub = pb_grpc.AuditorServiceStub(ch)
                err = await rpc_error(
                    stub.TriggerCheck(pb.TriggerCheckRequest(check="bookies"), timeout=5)
                )
                # no certificate, or one the CA did not sign: no connection at all
                assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert a.control.triggered == [Check.BOOKIES]
    finally:
        await a.channel.close()
        await a.server.stop(0)


async def test_protected_reads_need_the_token_and_health_stays_open(zk: ZkClient) -> None:
    control = MinimalControl(sample_state(), await cluster_urm(zk))
    server = await start_api_server(
        control, host="127.0.0.1", port=0, token=TOKEN, protect_reads=True
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        stub = pb_grpc.AuditorServiceStub(channel)
        reads: list[Callable[[Any], Any]] = [
            lambda md: stub.GetStatus(pb.GetStatusRequest(), metadata=md, timeout=5),
            lambda md: stub.GetLostBookieRecoveryDelay(
                pb.GetLostBookieRecoveryDelayRequest(), metadata=md, timeout=5
            ),
        ]
        for read in reads:
            err = await rpc_error(read(()))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "needs authentication" in err.details()
        status = await reads[0](bearer(TOKEN))
        assert status.identity == ME
        # A streaming read refuses before the first message.
        stream = stub.ListViolations(pb.ListViolationsRequest(), timeout=5)
        err = await rpc_error(stream.read())
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        # Probes never need credentials.
        health = health_pb2_grpc.HealthStub(channel)
        got = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert got.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await channel.close()
        await server.stop(0)


async def test_every_client_call_sends_the_token_to_a_daemon_protecting_reads(
    zk: ZkClient,
) -> None:
    """`bk-auditor status`, `report`, `violations`, `list-underreplicated` and the delay
    read through `ApiClient` against `protect_reads`: each is answered (the client sends
    the token on reads too), where before status, report and the delay were refused."""
    control = MinimalControl(sample_state(), await cluster_urm(zk))
    server = await start_api_server(
        control, host="127.0.0.1", port=0, token=TOKEN, protect_reads=True
    )
    try:
        async with ApiClient(f"127.0.0.1:{server.port}", timeout=5, token=TOKEN) as api:
            # Each raises ApiUnauthenticatedError when the token is not sent.
            assert (await api.status()).identity == ME
            assert (await api.report("replicas")).check == "replicas"
            assert await api.set_lost_bookie_recovery_delay(30) == 30
            assert await api.get_lost_bookie_recovery_delay() == 30
            [v.ledger_id async for v in api.violations()]
            [u.ledger_id async for u in api.underreplicated()]
        async with ApiClient(f"127.0.0.1:{server.port}", timeout=5) as bare:
            with pytest.raises(ApiUnauthenticatedError):
                await bare.status()
    finally:
        await server.stop(0)


async def test_the_longest_token_the_config_accepts_is_one_a_client_can_send(
    zk: ZkClient,
) -> None:
    """A token of `MAX_TOKEN_CHARS` (the most a setting holds) is sent and checked on a
    read and on a mutating call: the bound at load is one every client can meet."""
    longest = "T" * MAX_TOKEN_CHARS
    control = MinimalControl(sample_state(), await cluster_urm(zk))
    server = await start_api_server(
        control, host="127.0.0.1", port=0, token=longest, protect_reads=True
    )
    try:
        async with ApiClient(f"127.0.0.1:{server.port}", timeout=5, token=longest) as api:
            assert (await api.status()).identity == ME
            assert await api.set_lost_bookie_recovery_delay(45) == 45
        async with ApiClient(f"127.0.0.1:{server.port}", timeout=5, token=longest[:-1]) as off:
            with pytest.raises(ApiUnauthenticatedError):
                await off.status()
    finally:
        await server.stop(0)


def test_protected_reads_without_a_credential_is_a_config_error() -> None:
    from auditor.daemon.config import load_daemon_config

    with pytest.raises(ConfigError, match=r"api\.protect_reads needs a credential"):
        load_daemon_config(
            None, ["daemon.zk=127.0.0.1:1", "daemon.identity=x:1", "api.protect_reads=true"], env={}
        )
