"""Talking to a daemon's API from the CLI: one channel, a deadline on every call.

gRPC failures become `AuditorError`s with a line an operator can act on: an
unreachable or silent daemon is a `ServiceUnavailableError` (exit 3), a bad
name an input error (exit 2), a refusal (follower, missing token, no report
yet) exit 1 with the daemon's own explanation.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from auditor.api import AUTH_METADATA_KEY
from auditor.errors import AuditorError, ConfigError, NotFoundError, ServiceUnavailableError
from auditor.proto import auditor_service_pb2 as pb
from auditor.proto import auditor_service_pb2_grpc as pb_grpc

T = TypeVar("T")

#: A report with many violations is one large message.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

_TARGET = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


class ApiError(AuditorError):
    """The daemon answered, and refused."""


class ApiUnauthenticatedError(ApiError):
    """A mutating call without valid credentials."""


class ApiUnavailableError(ServiceUnavailableError):
    """No answer from the daemon within the deadline, or no connection at all."""


def parse_target(text: str) -> str:
    """`HOST:PORT` (IPv6 in brackets); anything else is an input error, not a dial failure."""
    m = _TARGET.match(text.strip())
    if not m or not 0 < int(m.group(1)) < 65536:
        raise ConfigError(f"--target must be HOST:PORT, got {text!r}")
    return text.strip()


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


class ApiClient:
    """`async with ApiClient(target, timeout=10) as api: await api.status()`.

    TLS is used when any of `tls`, `tls_ca`, `tls_cert` is given (`tls` alone:
    the system's trust roots); `tls_cert`/`tls_key` present a client
    certificate for mTLS.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float,
        token: str | None = None,
        tls: bool = False,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        if timeout <= 0:
            raise ConfigError(f"--timeout must be positive, got {timeout:g}")
        if bool(tls_cert) != bool(tls_key):
            raise ConfigError("a client certificate needs both --tls-cert and --tls-key")
        self.target = parse_target(target)
        self.timeout = timeout
        self._token = token or None
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        if tls or tls_ca or tls_cert:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca, "the CA file") if tls_ca else None,
                private_key=_read(tls_key, "the client key") if tls_key else None,
                certificate_chain=_read(tls_cert, "the client certificate") if tls_cert else None,
            )
            self._channel = grpc.aio.secure_channel(self.target, creds, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(self.target, options=options)
        self._stub = pb_grpc.AuditorServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def __aenter__(self) -> ApiClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    # --- plumbing -----------------------------------------------------------------

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """The token on every call, reads too: a daemon with `protect_reads` refuses reads
        without it, and one without ignores it."""
        if self._token is None:
            return ()
        return ((AUTH_METADATA_KEY, f"Bearer {self._token}"),)

    def _error(self, exc: grpc.aio.AioRpcError) -> AuditorError:
        code, details = exc.code(), (exc.details() or "").strip()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return ApiUnavailableError(
                f"the auditor at {self.target} did not answer within {self.timeout:g}s"
            )
        if code == grpc.StatusCode.UNAVAILABLE:
            return ApiUnavailableError(f"cannot reach the auditor at {self.target}: {details}")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return ApiUnauthenticatedError(details)
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return ConfigError(details)
        if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
            return ApiError(details)
        return ApiError(f"the auditor at {self.target} answered {code.name}: {details}")

    async def _call(self, aw: Awaitable[T]) -> T:
        try:
            return await aw
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from None

    async def _stream(self, call: Any) -> AsyncIterator[Any]:
        try:
            async for msg in call:
                yield msg
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from None

    # --- calls --------------------------------------------------------------------

    async def status(self) -> pb.GetStatusResponse:
        resp: pb.GetStatusResponse = await self._call(
            self._stub.GetStatus(
                pb.GetStatusRequest(), timeout=self.timeout, metadata=self._metadata()
            )
        )
        return resp

    async def report(self, check: str) -> pb.GetReportResponse:
        resp: pb.GetReportResponse = await self._call(
            self._stub.GetReport(
                pb.GetReportRequest(check=check), timeout=self.timeout, metadata=self._metadata()
            )
        )
        return resp

    async def explain(self, ledger_id: int) -> pb.ExplainResponse:
        """A ledger's explanation; NotFoundError (exit 2) when it does not exist."""
        try:
            resp: pb.ExplainResponse = await self._stub.Explain(
                pb.ExplainRequest(ledger_id=ledger_id),
                timeout=self.timeout,
                metadata=self._metadata(),
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise NotFoundError((exc.details() or "").strip()) from None
            raise self._error(exc) from None
        return resp

    async def trigger(self, check: str) -> pb.TriggerCheckResponse:
        resp: pb.TriggerCheckResponse = await self._call(
            self._stub.TriggerCheck(
                pb.TriggerCheckRequest(check=check),
                timeout=self.timeout,
                metadata=self._metadata(),
            )
        )
        return resp

    async def get_lost_bookie_recovery_delay(self) -> int:
        resp: pb.LostBookieRecoveryDelay = await self._call(
            self._stub.GetLostBookieRecoveryDelay(
                pb.GetLostBookieRecoveryDelayRequest(),
                timeout=self.timeout,
                metadata=self._metadata(),
            )
        )
        return resp.seconds

    async def set_lost_bookie_recovery_delay(self, seconds: int) -> int:
        resp: pb.LostBookieRecoveryDelay = await self._call(
            self._stub.SetLostBookieRecoveryDelay(
                pb.SetLostBookieRecoveryDelayRequest(seconds=seconds),
                timeout=self.timeout,
                metadata=self._metadata(),
            )
        )
        return resp.seconds

    async def set_autorecovery(self, enabled: bool) -> bool:
        resp: pb.AutoRecoveryStatus = await self._call(
            self._stub.SetAutoRecovery(
                pb.SetAutoRecoveryRequest(enabled=enabled),
                timeout=self.timeout,
                metadata=self._metadata(),
            )
        )
        return resp.enabled

    def violations(self, check: str = "", category: str = "") -> AsyncIterator[pb.Violation]:
        return self._stream(
            self._stub.ListViolations(
                pb.ListViolationsRequest(check=check, category=category),
                timeout=self.timeout,
                metadata=self._metadata(),
            )
        )

    def underreplicated(
        self, missing_replica: str = "", excluding_missing_replica: str = ""
    ) -> AsyncIterator[pb.UnderReplicatedLedger]:
        return self._stream(
            self._stub.ListUnderReplicated(
                pb.ListUnderReplicatedRequest(
                    missing_replica=missing_replica,
                    excluding_missing_replica=excluding_missing_replica,
                ),
                timeout=self.timeout,
                metadata=self._metadata(),
            )
        )

    async def health(self, service: str = "") -> int:
        """The serving status; SERVICE_UNKNOWN for a name the daemon does not report."""
        try:
            resp = await self._health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self.timeout
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return int(health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            raise self._error(exc) from None
        return int(resp.status)


def health_status_name(status: int) -> str:
    name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    return name
