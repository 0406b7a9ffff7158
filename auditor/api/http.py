"""Read-only HTTP views of the daemon: JSON documents, BookKeeper's reads and an HTML page.

Routes (GET and HEAD only; anything else is 405):

* `/` the page (`auditor.api.page`): leader, checks, violations, risk, the worker;
* `/status` the `status --json` document;
* `/reports/<check>` the `check <check> --json` document of the last run;
  `/reports/pulsar` (while `[pulsar] interval` is on) the `pulsar-audit --json`
  document of the leader's last Pulsar audit: its report and `pulsar`, the rollups;
* `/explain/<ledger id>` the `explain --json` document;
* `/api/v1/autorecovery/who_is_auditor` and
  `/api/v1/autorecovery/list_under_replicated_ledger`: the bookie HTTP server's
  answers, bodies and status codes as its `WhoIsAuditorService` and
  `ListUnderReplicatedLedgerService` give them (`missingreplica`,
  `excludingmissingreplica`, `printmissingreplica`).

Like the gRPC API it reads `DaemonState` and the read calls of `DaemonControl`;
it never drives the daemon. With `api.protect_reads` every route needs the API's
bearer token (`Authorization: Bearer <token>`) or, when `api.tls_client_ca` is
set, a client certificate (then the server asks for one on every connection and
the handshake refuses a peer without one the CA signed). With TLS configured for
the API the views are served over HTTPS with the same certificate.

The request parser is strict and small: one request line and at most
`MAX_HEADERS` headers within `MAX_HEAD_BYTES`, read within the header timeout
(`api.http_header_timeout`, which is also how long a kept-alive connection may sit
idle); no request body; errors answer with a JSON body `{"error": ...}`.

Connections: at most `api.http_max_connections` open at once. A connection waiting
for a request head is *idle*; one whose request is being answered is *busy*. When
the limit is reached, a new connection takes the place of the oldest idle one
(closed at once), so clients that open connections and send nothing (or trickle a
head) can never lock real requests out; only when every connection is busy is the
newcomer answered 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from auditor.analysis.explain import document_text
from auditor.api import AUTH_SCHEME, convert
from auditor.api.page import render_page
from auditor.api.server import tls_wanted
from auditor.checks.findings import Check
from auditor.daemon.state import DaemonControl, NotLeaderError
from auditor.errors import AuditorError, ConfigError, NotFoundError, ServiceUnavailableError
from auditor.logs import get_logger
from auditor.metadata.underreplication import CorruptMark
from auditor.secretfiles import check_api_token
from auditor.store import NoNodeError

#: Bounds of one request's head (request line and headers).
MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 64
#: Default seconds a client has to send a whole request head; also how long a
#: kept-alive connection may sit idle (`api.http_header_timeout`).
HEAD_TIMEOUT = 5.0
#: Default connections open at once (`api.http_max_connections`).
MAX_CONNECTIONS = 256

BK_WHO_IS_AUDITOR = "/api/v1/autorecovery/who_is_auditor"
BK_LIST_UNDER_REPLICATED = "/api/v1/autorecovery/list_under_replicated_ledger"

_JSON = "application/json"
_TEXT = "text/plain; charset=utf-8"
_HTML = "text/html; charset=utf-8"

_log = get_logger("auditor.api.http")


class _BadRequest(Exception):
    """The client's request cannot be parsed; answered with 400 and the connection closed."""


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    version: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    ctype: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _json(status: int, doc: Any, *, compact: bool = False) -> Response:
    text = json.dumps(doc, separators=(",", ":")) if compact else json.dumps(doc, sort_keys=False)
    return Response(status, _JSON, (text + ("" if compact else "\n")).encode())


def _error(status: int, message: str, **headers: str) -> Response:
    body = (json.dumps({"error": message}) + "\n").encode()
    return Response(status, _JSON, body, tuple(headers.items()))


def _text(status: int, text: str) -> Response:
    return Response(status, _TEXT, text.encode())


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """One request head; None when the peer closed before sending one."""
    used = 0

    async def line() -> bytes:
        nonlocal used
        try:
            raw = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial and used == 0:
                return b""
            raise _BadRequest("the request ended early") from None
        except asyncio.LimitOverrunError:
            raise _BadRequest("a request line or header is too long") from None
        used += len(raw)
        if used > MAX_HEAD_BYTES:
            raise _BadRequest("the request head is too large")
        return raw

    first = await line()
    if not first:
        return None
    parts = first.decode("latin-1").rstrip("\r\n").split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[0].isupper():
        raise _BadRequest("malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise _BadRequest(f"unsupported protocol version {version[:16]!r}")
    if not target.startswith("/"):
        raise _BadRequest("the request target must be a path")
    headers: dict[str, str] = {}
    while True:
        raw = await line()
        if raw in (b"\r\n", b"\n"):
            break
        if not raw:
            raise _BadRequest("the request ended early")
        if len(headers) >= MAX_HEADERS:
            raise _BadRequest("too many headers")
        name, sep, value = raw.decode("latin-1").partition(":")
        if not sep or not name or name != name.strip():
            raise _BadRequest("malformed header")
        headers[name.lower()] = value.strip()
    if "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in (
        "",
        "0",
    ):
        raise _BadRequest("a request body is not accepted")
    split = urlsplit(target)
    return Request(
        method=method,
        path=unquote(split.path),
        query=parse_qs(split.query, keep_blank_values=True),
        version=version,
        headers=headers,
    )


Handler = Callable[[Request, str], Awaitable[Response]]


class HttpViews:
    """The read-only HTTP server of one daemon; `stop` any number of times."""

    def __init__(
        self,
        control: DaemonControl,
        *,
        token: str | None,
        mtls: bool,
        protect_reads: bool,
        max_connections: int = MAX_CONNECTIONS,
        header_timeout: float = HEAD_TIMEOUT,
    ) -> None:
        self._control = control
        self._token = token.encode() if token else None
        self._mtls = mtls
        self._protect_reads = protect_reads
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        #: The idle connections (waiting for a request head), oldest first.
        self._idle: dict[asyncio.StreamWriter, None] = {}
        self.port = 0
        self.tls = False

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        self._server = await asyncio.start_server(
            self._serve,
            host,
            port,
            ssl=tls,
            limit=MAX_HEAD_BYTES,
            # A TLS client that never finishes its handshake is cut as an idle one is.
            ssl_handshake_timeout=self.header_timeout if tls is not None else None,
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.tls = tls is not None

    async def stop(self, grace: float = 0.0) -> None:
        """Stops listening and closes open connections (requests are short: no grace)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._connections):
            writer.transport.abort()
        self._connections.clear()

    # --- connections ------------------------------------------------------------------

    def _make_room(self) -> bool:
        """Room for one more connection: True when there is (an idle one closed if need
        be), False when every connection is busy answering a request."""
        if len(self._connections) < self.max_connections:
            return True
        if not self._idle:
            return False
        oldest = next(iter(self._idle))
        self._idle.pop(oldest)
        self._connections.discard(oldest)
        oldest.transport.abort()
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._make_room():
            busy = _error(
                503, f"too many requests at once (at most {self.max_connections} connections)"
            )
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await self._send(writer, busy, keep=False, head=False)
            writer.close()
            return
        self._connections.add(writer)
        try:
            while True:
                self._idle[writer] = None
                try:
                    async with asyncio.timeout(self.header_timeout):
                        request = await read_request(reader)
                except _BadRequest as exc:
                    self._idle.pop(writer, None)
                    await self._send(writer, _error(400, str(exc)), keep=False, head=False)
                    await _discard(reader)
                    return
                if request is None:
                    return
                self._idle.pop(writer, None)
                keep = request.version == "HTTP/1.1" and (
                    request.headers.get("connection", "").lower() != "close"
                )
                peer = writer.get_extra_info("peername")
                response = await self.answer(request, str(peer))
                await self._send(writer, response, keep=keep, head=request.method == "HEAD")
                if not keep:
                    return
        except (TimeoutError, ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass  # a client that went away, idled or failed the handshake: nothing to answer
        finally:
            self._idle.pop(writer, None)
            self._connections.discard(writer)
            writer.close()

    async def _send(
        self, writer: asyncio.StreamWriter, r: Response, *, keep: bool, head: bool
    ) -> None:
        lines = [
            f"HTTP/1.1 {r.status} {_REASONS.get(r.status, 'Error')}",
            f"Content-Type: {r.ctype}",
            f"Content-Length: {len(r.body)}",
            "Cache-Control: no-store",
            "X-Content-Type-Options: nosniff",
            f"Connection: {'keep-alive' if keep else 'close'}",
            *(f"{k}: {v}" for k, v in r.headers),
        ]
        if r.ctype == _HTML:
            lines.append("Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'")
        head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        writer.write(head_bytes + (b"" if head else r.body))
        await writer.drain()

    # --- requests ---------------------------------------------------------------------

    async def answer(self, request: Request, peer: str = "") -> Response:
        """The response to one parsed request (routing, authorisation, errors)."""
        if request.method not in ("GET", "HEAD"):
            return _error(405, f"{request.method} is not allowed: GET only", Allow="GET, HEAD")
        refused = self._refusal(request)
        if refused is not None:
            _log.warning("http_request_refused", path=request.path, peer=peer, reason=refused)
            return _error(401, refused, **{"WWW-Authenticate": 'Bearer realm="bk-auditor"'})
        path = request.path
        try:
            if path == "/":
                return Response(200, _HTML, render_page(self._control.state).encode())
            if path == "/status":
                return _json(200, convert.status_json(convert.status_response(self._control.state)))
            if path.startswith("/reports/"):
                return self._report(path.removeprefix("/reports/"))
            if path.startswith("/explain/"):
                return await self._explain(path.removeprefix("/explain/"))
            if path == BK_WHO_IS_AUDITOR:
                return await self._who_is_auditor()
            if path == BK_LIST_UNDER_REPLICATED:
                return await self._list_under_replicated(request.query)
        except NotLeaderError as exc:
            return _error(409, str(exc))
        except ConfigError as exc:
            return _error(400, str(exc))
        except ServiceUnavailableError as exc:
            return _error(503, str(exc))
        except NoNodeError as exc:
            where = f" ({exc.args[0]})" if exc.args and isinstance(exc.args[0], str) else ""
            return _error(404, f"no such znode{where}")
        except NotFoundError as exc:
            return _error(404, str(exc))
        except AuditorError as exc:
            return _error(409, str(exc))
        except Exception as exc:
            _log.exception("http_request_failed", path=path)
            return _error(500, f"{type(exc).__name__}: {exc}")
        return _error(404, f"no such page: {path[:200]}")

    def _refusal(self, request: Request) -> str | None:
        """Why a read is refused; None when it may proceed."""
        if not self._protect_reads:
            return None
        if self._mtls:
            return None  # the TLS handshake required and verified a client certificate
        if self._token is None:
            return "reads are protected and no token is configured ([api] token or token_file)"
        offered = request.headers.get("authorization")
        if not offered:
            return "authentication needed: send 'Authorization: Bearer <token>'"
        scheme, _, credential = offered.strip().partition(" ")
        if scheme.lower() == AUTH_SCHEME and hmac.compare_digest(
            credential.strip().encode(), self._token
        ):
            return None
        return "the bearer token is not valid"

    def _report(self, name: str) -> Response:
        state = self._control.state
        try:
            check = convert.parse_report_check(name, state.checks)
        except convert.UnknownNameError as exc:
            return _error(404, str(exc))
        cs = state.checks.get(check)
        if cs is None or cs.last_report is None:
            outcome = cs.outcome if cs is not None else "never"
            where = "" if state.is_leader else f"; the auditor is {state.leader or 'unknown'}"
            return _error(
                404,
                f"no report of check {check} on {state.identity} yet (outcome: {outcome}){where}",
            )
        if check is Check.PULSAR:
            doc = cs.last_report.to_json()
            if state.pulsar is not None:
                doc["pulsar"] = state.pulsar.to_json()
            return _json(200, doc)
        return Response(200, _JSON, (convert.report_json_text(cs.last_report) + "\n").encode())

    async def _explain(self, text: str) -> Response:
        if not text.isdigit() or len(text) > 20 or int(text) >= 2**63:
            return _error(400, f"not a ledger id: {text[:40]!r}")
        doc = await self._control.explain(int(text))
        return Response(200, _JSON, (document_text(doc) + "\n").encode())

    async def _who_is_auditor(self) -> Response:
        """BookKeeper's `WhoIsAuditorService`: a text body, 404 when nobody leads."""
        leader = await self._control.current_leader()
        if leader is None:
            return _text(404, "No auditor elected")
        return _text(200, f"Auditor: {leader}")

    async def _list_under_replicated(self, query: dict[str, list[str]]) -> Response:
        """BookKeeper's `ListUnderReplicatedLedgerService`: a JSON list of ledger ids, or
        with `printmissingreplica` an object of ledger id to its missing replicas; 404
        and a text body when no mark passes. A corrupt mark that names its ledger is
        listed (with no replicas) under every filter; one that does not is left out."""
        including = (query.get("missingreplica") or [""])[0].strip()
        excluding = (query.get("excludingmissingreplica") or [""])[0].strip()
        printing = "printmissingreplica" in query
        found: dict[int, list[str]] = {}
        async for ur in self._control.list_underreplicated():
            if not convert.underreplicated_selected(ur, including, excluding):
                continue
            if isinstance(ur, CorruptMark):
                if ur.ledger_id is not None:
                    found.setdefault(ur.ledger_id, [])
                continue
            found[ur.ledger_id] = list(ur.replicas)
        if not found:
            return _text(404, "No under replicated ledgers found")
        if printing:
            return _json(200, {str(lid): reps for lid, reps in found.items()}, compact=True)
        return _json(200, list(found), compact=True)


async def _discard(reader: asyncio.StreamReader) -> None:
    """Reads what the client still sends (bounded) before closing, so that the kernel does
    not answer it with a reset that could destroy the response in flight."""
    left = MAX_HEAD_BYTES * 4
    try:
        async with asyncio.timeout(1.0):
            while left > 0 and (chunk := await reader.read(min(left, 65536))):
                left -= len(chunk)
    except (TimeoutError, ConnectionError, ssl.SSLError):
        pass


def _server_tls(
    tls_cert: str | None, tls_key: str | None, tls_client_ca: str | None
) -> ssl.SSLContext | None:
    if not tls_wanted(tls_cert, tls_key, tls_client_ca):
        return None
    assert tls_cert and tls_key
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(tls_cert, tls_key)
        if tls_client_ca:
            ctx.load_verify_locations(cafile=tls_client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the API's TLS material for HTTP: {exc}") from exc
    return ctx


async def start_http_views(
    control: DaemonControl,
    *,
    host: str,
    port: int,
    token: str | None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_client_ca: str | None = None,
    protect_reads: bool = False,
    max_connections: int = MAX_CONNECTIONS,
    header_timeout: float = HEAD_TIMEOUT,
) -> HttpViews:
    """Binds and serves; `port=0` picks a free port (see `.port`)."""
    if not 0 <= port < 65536:
        raise ConfigError(f"the HTTP port must be 0..65535, got {port}")
    check_api_token(token or "")
    tls = _server_tls(tls_cert, tls_key, tls_client_ca)
    views = HttpViews(
        control,
        token=token or None,
        mtls=bool(tls_client_ca),
        protect_reads=protect_reads,
        max_connections=max_connections,
        header_timeout=header_timeout,
    )
    try:
        await views.start(host, port, tls)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen for HTTP on {host}:{port}: {exc.strerror or exc}"
        ) from exc
    _log.info(
        "http_views_started",
        address=f"{host}:{views.port}",
        tls=tls is not None,
        reads="protected" if protect_reads else "open",
    )
    return views
