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

aiohttp parses the requests and writes the answers (`auditor.httpserve`: its
low-level server on the daemon's loop). Requests are bounded: a request line and each
header at most `MAX_LINE_BYTES`, at most `MAX_HEADERS` headers and `MAX_HEAD_BYTES` in
all, sent within the header timeout (`api.http_header_timeout`, which is also how long
a kept-alive connection may sit idle and a TLS handshake may take); HTTP/1.0 or 1.1
only (a 1.1 request names its `Host`, as RFC 9112 asks: aiohttp refuses one without),
with a path as target and no request body; errors answer with a JSON body
`{"error": ...}`.

Connections: at most `api.http_max_connections` open at once. A connection waiting
for a request head is *idle*; one whose request is being answered is *busy*. When
the limit is reached, a new connection takes the place of the oldest idle one
(closed at once), so clients that open connections and send nothing (or trickle a
head) can never lock real requests out; only when every connection is busy is the
newcomer answered 503. aiohttp has no such cap, nor a bound on a head as a whole: the
two are `auditor.httpserve`'s, a few lines on aiohttp's connection protocol.
"""

from __future__ import annotations

import hmac
import json
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion10, HttpVersion11

from auditor.analysis.explain import document_text
from auditor.api import AUTH_SCHEME, convert
from auditor.api.page import render_page
from auditor.api.server import tls_wanted
from auditor.checks.findings import Check
from auditor.daemon.state import DaemonControl, NotLeaderError
from auditor.errors import AuditorError, ConfigError, NotFoundError, ServiceUnavailableError
from auditor.httpserve import HttpServer, sent_version
from auditor.logs import get_logger
from auditor.metadata.underreplication import CorruptMark
from auditor.secretfiles import check_api_token
from auditor.store import NoNodeError

#: Bounds of one request's head: its request line and each header line, the number of
#: headers, and all of it.
MAX_LINE_BYTES = 8190
MAX_HEADERS = 64
MAX_HEAD_BYTES = 16 * 1024
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
#: Headers of every answer, errors too.
_ALWAYS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
_PAGE_POLICY = "default-src 'none'; style-src 'unsafe-inline'"

_log = get_logger("auditor.api.http")


@dataclass(slots=True)
class Request:
    """What the views read of a request: its path unquoted and its query parsed."""

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


def _json(status: int, doc: Any, *, compact: bool = False) -> Response:
    text = json.dumps(doc, separators=(",", ":")) if compact else json.dumps(doc, sort_keys=False)
    return Response(status, _JSON, (text + ("" if compact else "\n")).encode())


def _error_body(message: str) -> bytes:
    return (json.dumps({"error": message}) + "\n").encode()


def _error(status: int, message: str, **headers: str) -> Response:
    return Response(status, _JSON, _error_body(message), tuple(headers.items()))


def _text(status: int, text: str) -> Response:
    return Response(status, _TEXT, text.encode())


def _malformed(request: web.BaseRequest) -> str | None:
    """Why aiohttp's parsed request is still refused (400); None when it is not."""
    version = sent_version(request)
    if version not in (HttpVersion10, HttpVersion11):
        return f"unsupported protocol version HTTP/{version.major}.{version.minor}"
    if not request.raw_path.startswith("/"):
        return "the request target must be a path"
    if hdrs.TRANSFER_ENCODING in request.headers or request.content_length:
        return "a request body is not accepted"
    return None


def _view(request: web.BaseRequest) -> Request:
    version = sent_version(request)
    split = urlsplit(request.raw_path)
    return Request(
        method=request.method,
        path=unquote(split.path),
        query=parse_qs(split.query, keep_blank_values=True),
        version=f"HTTP/{version.major}.{version.minor}",
        headers={name.lower(): value for name, value in request.headers.items()},
    )


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
        self._http: HttpServer | None = None
        self.port = 0
        self.tls = False

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        http = HttpServer(
            self._serve,
            error=lambda _status, message: (_JSON, _error_body(message)),
            idle_timeout=self.header_timeout,
            headers=_ALWAYS,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_LINE_BYTES,
            max_headers=MAX_HEADERS,
            max_head_bytes=MAX_HEAD_BYTES,
            max_connections=self.max_connections,
        )
        self.port = await http.start(host, port, tls)
        self._http = http
        self.tls = tls is not None

    async def stop(self, grace: float = 0.0) -> None:
        """Stops listening and closes open connections (requests are short: no grace)."""
        http, self._http = self._http, None
        if http is not None:
            http.close()

    async def _serve(self, request: web.BaseRequest) -> web.Response:
        """aiohttp's request, refused or answered."""
        malformed = _malformed(request)
        if malformed is not None:
            response = _error(400, malformed)
        else:
            peer = request.transport.get_extra_info("peername") if request.transport else None
            response = await self.answer(_view(request), str(peer))
        out = web.Response(status=response.status, body=response.body)
        out.headers[hdrs.CONTENT_TYPE] = response.ctype
        out.headers.extend(response.headers)
        if response.ctype == _HTML:
            out.headers["Content-Security-Policy"] = _PAGE_POLICY
        if malformed is not None:
            out.force_close()
        return out

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
