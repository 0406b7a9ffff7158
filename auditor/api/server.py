"""The daemon's gRPC endpoint: admin API, standard health service, reflection.

The API reads `DaemonState` and asks `DaemonControl` for changes; it never
drives the leader's loop itself, so a slow or hostile client cannot stall
the checks. Reads need no credentials (every node answers them, followers
included). Mutations need a bearer token equal to the configured one, or a
client certificate verified against the configured CA; with neither
configured they are refused outright rather than left open.

Health: "" and `auditor-liveness` report whether the daemon's loop is alive
(the heartbeat in the state is fresh, and the daemon has not said otherwise: it
does when its election task ended, just before it exits non-zero);
`auditor-readiness` whether it is connected to ZooKeeper and in the election
(voting, leading, or backing off after a failure; not while refusing to vote for
a duplicate identity). Readiness never depends on leadership: with two replicas
only one would ever be ready, and rollouts and disruption budgets would stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from grpc_reflection.v1alpha import reflection  # type: ignore[import-untyped]

from auditor.api import AUTH_METADATA_KEY, AUTH_SCHEME, LIVENESS, READINESS, convert
from auditor.checks.findings import Check, CheckReport
from auditor.daemon.state import DaemonControl, NotLeaderError
from auditor.errors import AuditorError, ConfigError, NotFoundError, ServiceUnavailableError
from auditor.logs import get_logger
from auditor.proto import auditor_service_pb2 as pb
from auditor.proto import auditor_service_pb2_grpc as pb_grpc
from auditor.secretfiles import check_api_token
from auditor.store import NoNodeError

T = TypeVar("T")

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["AuditorService"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

_log = get_logger("auditor.api")

_HOW_TO_AUTHORISE = (
    "configure a token on the daemon ([api] token or token_file, env BK_AUDITOR_API_TOKEN; "
    "clients send 'authorization: Bearer <token>') or mTLS ([api] tls_client_ca)"
)


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, msg: str) -> NoReturn:
    await context.abort(code, msg)
    raise AssertionError("context.abort returned")  # pragma: no cover


async def _next(it: AsyncIterator[T]) -> T | None:
    try:
        return await anext(it)
    except StopAsyncIteration:
        return None


class _Servicer(pb_grpc.AuditorServiceServicer):
    def __init__(
        self, control: DaemonControl, token: str | None, mtls: bool, protect_reads: bool = False
    ) -> None:
        self._control = control
        self._token = token.encode() if token else None
        self._mtls = mtls
        #: Reads need the same credentials as mutations (reports name ledgers and
        #: bookies; some sites treat that as confidential). Health stays open.
        self._protect_reads = protect_reads

    async def _read(self, context: grpc.aio.ServicerContext, what: str) -> None:
        if self._protect_reads:
            await self._authorise(context, what)

    # --- plumbing -----------------------------------------------------------------

    async def _authorise(self, context: grpc.aio.ServicerContext, what: str) -> None:
        if self._mtls and context.peer_identities():
            return
        if self._token is None:
            if not self._mtls:
                reason = f"{what} is refused: mutating calls are disabled; {_HOW_TO_AUTHORISE}"
            else:
                reason = f"{what} is refused: no verified client certificate"
            await self._refuse(context, what, reason)
        offered = [
            value
            for key, value in (context.invocation_metadata() or ())
            if key.lower() == AUTH_METADATA_KEY
        ]
        if not offered:
            await self._refuse(
                context,
                what,
                f"{what} needs authentication: send 'authorization: Bearer <token>' "
                "(bk-auditor: --token or BK_AUDITOR_API_TOKEN)",
            )
        for value in offered:
            text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
            scheme, _, credential = text.strip().partition(" ")
            if scheme.lower() == AUTH_SCHEME and hmac.compare_digest(
                credential.strip().encode(), self._token
            ):
                return
        await self._refuse(context, what, f"{what} is refused: the bearer token is not valid")

    async def _refuse(self, context: grpc.aio.ServicerContext, what: str, reason: str) -> NoReturn:
        _log.warning("api_call_refused", call=what, peer=context.peer(), reason=reason)
        await _abort(context, grpc.StatusCode.UNAUTHENTICATED, reason)

    async def _guard(self, context: grpc.aio.ServicerContext, what: str, aw: Awaitable[T]) -> T:
        """Turns the daemon's errors into status codes a client can branch on."""
        try:
            return await aw
        except NotLeaderError as exc:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except ConfigError as exc:  # unknown names included
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ServiceUnavailableError as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"{what}: {exc}")
        except NoNodeError as exc:
            where = f" ({exc.args[0]})" if exc.args and isinstance(exc.args[0], str) else ""
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"{what}: no such znode{where}")
        except NotFoundError as exc:
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"{what}: {exc}")
        except AuditorError as exc:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"{what}: {exc}")
        except Exception as exc:
            _log.exception("api_call_failed", call=what)
            await _abort(context, grpc.StatusCode.INTERNAL, f"{what}: {type(exc).__name__}: {exc}")

    async def _name(self, context: grpc.aio.ServicerContext, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except convert.UnknownNameError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    def _reports(self) -> dict[Check, CheckReport]:
        return {
            c: s.last_report
            for c, s in self._control.state.checks.items()
            if s.last_report is not None
        }

    # --- reads --------------------------------------------------------------------

    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStatusResponse:
        await self._read(context, "GetStatus")
        return convert.status_response(self._control.state)

    async def GetReport(
        self, request: pb.GetReportRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetReportResponse:
        await self._read(context, "GetReport")
        scheduled = list(self._control.state.checks)
        check: Check = await self._name(
            context, lambda n: convert.parse_report_check(n, scheduled), request.check
        )
        cs = self._control.state.checks.get(check)
        if cs is None or cs.last_report is None:
            state = self._control.state
            outcome = cs.outcome if cs is not None else "never"
            # Only the leader runs checks: point a follower's caller at it.
            where = "" if state.is_leader else f"; the auditor is {state.leader or 'unknown'}"
            await _abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"no report of check {check} on {state.identity} yet (outcome: {outcome}){where}",
            )
        return convert.report_response(cs.last_report)

    async def ListViolations(
        self, request: pb.ListViolationsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Violation]:
        await self._read(context, "ListViolations")
        check = (
            await self._name(context, convert.parse_check, request.check) if request.check else None
        )
        category = (
            await self._name(context, convert.parse_category, request.category)
            if request.category
            else None
        )
        for msg in convert.violations(self._reports(), check, category, request.owner or None):
            yield msg

    async def ListUnderReplicated(
        self, request: pb.ListUnderReplicatedRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.UnderReplicatedLedger]:
        await self._read(context, "ListUnderReplicated")
        marks = self._control.list_underreplicated()
        while True:
            ur = await self._guard(context, "listing under-replicated ledgers", _next(marks))
            if ur is None:
                return
            if convert.underreplicated_selected(
                ur, request.missing_replica, request.excluding_missing_replica
            ):
                yield convert.underreplicated(ur)

    async def GetLostBookieRecoveryDelay(
        self, request: pb.GetLostBookieRecoveryDelayRequest, context: grpc.aio.ServicerContext
    ) -> pb.LostBookieRecoveryDelay:
        await self._read(context, "GetLostBookieRecoveryDelay")
        seconds = await self._guard(
            context,
            "reading lostBookieRecoveryDelay",
            self._control.get_lost_bookie_recovery_delay(),
        )
        return pb.LostBookieRecoveryDelay(seconds=seconds)

    async def Explain(
        self, request: pb.ExplainRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExplainResponse:
        await self._read(context, "Explain")
        doc = await self._guard(
            context,
            f"explaining ledger {request.ledger_id}",
            self._control.explain(request.ledger_id),
        )
        return convert.explain_response(doc)

    # --- mutations ----------------------------------------------------------------

    async def TriggerCheck(
        self, request: pb.TriggerCheckRequest, context: grpc.aio.ServicerContext
    ) -> pb.TriggerCheckResponse:
        await self._authorise(context, "TriggerCheck")
        check: Check | None = await self._name(
            context, lambda n: convert.parse_check(n, allow_all=True), request.check
        )
        state = self._control.state
        if check is None:
            targets = [c for c in Check if c in state.checks and state.checks[c].enabled]
        else:
            targets = [check]
        for c in targets:
            await self._guard(context, f"triggering check {c}", self._control.trigger_check(c))
        _log.info("api_check_triggered", checks=[str(c) for c in targets], peer=context.peer())
        return pb.TriggerCheckResponse(triggered=[str(c) for c in targets], identity=state.identity)

    async def SetLostBookieRecoveryDelay(
        self, request: pb.SetLostBookieRecoveryDelayRequest, context: grpc.aio.ServicerContext
    ) -> pb.LostBookieRecoveryDelay:
        await self._authorise(context, "SetLostBookieRecoveryDelay")
        if request.seconds < 0:
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"lostBookieRecoveryDelay must be >= 0 seconds, got {request.seconds}",
            )
        await self._guard(
            context,
            "writing lostBookieRecoveryDelay",
            self._control.set_lost_bookie_recovery_delay(request.seconds),
        )
        _log.info(
            "api_lost_bookie_recovery_delay_set", seconds=request.seconds, peer=context.peer()
        )
        return pb.LostBookieRecoveryDelay(seconds=request.seconds)

    async def SetAutoRecovery(
        self, request: pb.SetAutoRecoveryRequest, context: grpc.aio.ServicerContext
    ) -> pb.AutoRecoveryStatus:
        await self._authorise(context, "SetAutoRecovery")
        await self._guard(
            context, "switching auto-recovery", self._control.set_autorecovery(request.enabled)
        )
        _log.info("api_autorecovery_set", enabled=request.enabled, peer=context.peer())
        return pb.AutoRecoveryStatus(enabled=request.enabled)


class ApiServer:
    """A started server. The daemon owns it: `set_serving` and `stop` are its levers."""

    def __init__(
        self,
        server: grpc.aio.Server,
        health: Any,
        control: DaemonControl,
        port: int,
        *,
        heartbeat_timeout: float,
        health_interval: float,
    ) -> None:
        self._server = server
        self._health = health
        self._control = control
        self.port = port
        self._heartbeat_timeout = heartbeat_timeout
        self._health_interval = health_interval
        self._live = True
        self._ready = True
        self._published: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._monitor: asyncio.Task[None] | None = None
        self._stopped = False

    def set_serving(self, live: bool, ready: bool) -> None:
        """The daemon's own verdict; combined with the heartbeat and the ZooKeeper connection."""
        self._live = live
        self._ready = ready
        self._wake.set()

    def health_statuses(self) -> dict[str, int]:
        state = self._control.state
        fresh = time.monotonic() - state.heartbeat <= self._heartbeat_timeout
        live = self._live and fresh
        ready = live and self._ready and state.zk_connected
        return {
            "": SERVING if live else NOT_SERVING,
            LIVENESS: SERVING if live else NOT_SERVING,
            READINESS: SERVING if ready else NOT_SERVING,
        }

    async def refresh_health(self) -> None:
        """Publishes the current statuses now (the monitor also does it every interval)."""
        if self._stopped:
            return
        for service, status in self.health_statuses().items():
            if self._published.get(service) != status:
                await self._health.set(service, status)
                self._published[service] = status
                _log.info(
                    "health_changed",
                    service=service or "<server>",
                    status=health_pb2.HealthCheckResponse.ServingStatus.Name(status),
                )

    def start_monitor(self) -> None:
        self._monitor = asyncio.create_task(self._watch_health(), name="api-health")

    async def _watch_health(self) -> None:
        while True:
            try:
                await self.refresh_health()
            except Exception:  # the monitor must outlive any one failure
                _log.exception("health_refresh_failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._health_interval):
                    await self._wake.wait()

    async def stop(self, grace: float) -> None:
        """Health says NOT_SERVING first, in-flight calls get `grace` seconds, new calls fail."""
        if self._stopped:
            return
        self._stopped = True
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)
        _log.info("api_stopped", port=self.port)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the API's {what} {path}: {exc.strerror or exc}") from exc


def tls_wanted(tls_cert: str | None, tls_key: str | None, tls_client_ca: str | None) -> bool:
    """Whether the API's settings ask for TLS (gRPC and the HTTP views alike); a
    ConfigError for a half-given pair, or a client CA without TLS."""
    if not tls_cert and not tls_key:
        if tls_client_ca:
            raise ConfigError("mTLS (a client CA) needs TLS: give the server certificate and key")
        return False
    if not tls_cert or not tls_key:
        raise ConfigError("TLS needs both the server certificate and its private key")
    return True


def _credentials(
    tls_cert: str | None, tls_key: str | None, tls_client_ca: str | None
) -> grpc.ServerCredentials | None:
    if not tls_wanted(tls_cert, tls_key, tls_client_ca):
        return None
    assert tls_cert and tls_key
    pair = (_read(tls_key, "TLS key"), _read(tls_cert, "TLS certificate"))
    ca = _read(tls_client_ca, "client CA") if tls_client_ca else None
    # gRPC either ignores client certificates or requires and verifies them on
    # every connection; with a CA configured it is the latter, so any peer that
    # got through the handshake holds a certificate the CA signed.
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=bool(ca))


async def start_api_server(
    control: DaemonControl,
    *,
    host: str,
    port: int,
    token: str | None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_client_ca: str | None = None,
    protect_reads: bool = False,
    heartbeat_timeout: float = 30.0,
    health_interval: float = 1.0,
    max_report_bytes: int = 256 * 1024 * 1024,
) -> ApiServer:
    """Binds, starts and returns the server; `port=0` picks a free port (see `.port`).

    `heartbeat_timeout`: liveness turns NOT_SERVING when `state.heartbeat` is
    older than this. `max_report_bytes` bounds one message (a report with
    many violations is large; ListViolations streams them instead).
    """
    if not 0 <= port < 65536:
        raise ConfigError(f"the API port must be 0..65535, got {port}")
    check_api_token(token or "")
    creds = _credentials(tls_cert, tls_key, tls_client_ca)
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", max_report_bytes),
            ("grpc.max_receive_message_length", 4 * 1024 * 1024),
            # gRPC shares ports by default: a second daemon on the same port
            # would start "fine" and split the traffic. Fail the bind instead.
            ("grpc.so_reuseport", 0),
        ]
    )
    pb_grpc.add_AuditorServiceServicer_to_server(
        _Servicer(control, token or None, mtls=bool(tls_client_ca), protect_reads=protect_reads),
        server,
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    try:
        bound = (
            server.add_secure_port(address, creds)
            if creds is not None
            else server.add_insecure_port(address)
        )
    except RuntimeError:
        bound = 0
    if bound == 0:
        await server.stop(None)
        raise ConfigError(f"cannot listen for gRPC on {address}: address in use or not available")
    await server.start()
    api = ApiServer(
        server,
        health_servicer,
        control,
        bound,
        heartbeat_timeout=heartbeat_timeout,
        health_interval=health_interval,
    )
    await api.refresh_health()
    api.start_monitor()
    if token and creds is None:
        _log.warning("api_token_in_clear", msg="the API token travels unencrypted: configure TLS")
    _log.info(
        "api_started",
        address=f"{host}:{bound}",
        tls=creds is not None,
        mtls=bool(tls_client_ca),
        mutations="token" if token else ("mtls" if tls_client_ca else "disabled"),
    )
    return api
