"""HTTP/1.1 on the daemon's asyncio loop, shared by the read-only views (`auditor.api.http`)
and /metrics (`auditor.daemon.metrics_http`): aiohttp's server, plus the few guards an
exposed daemon needs that aiohttp leaves to a reverse proxy in front of it.

aiohttp's low-level server (`aiohttp.web.Server` and its `RequestHandler` protocol)
parses every request and writes every response. Its parser bounds the request line,
each header line and the number of headers; its `keepalive_timeout` closes a
connection that has not sent a whole request head in time, counted from the
connection's start and again from each answer (a client that sends nothing, trickles
a head or idles between requests). What this module adds, each part small:

* Answers say `HTTP/1.1` whatever version the request named (aiohttp echoes the
  request's, and the two hand-written servers this replaced always said 1.1); a
  request that is not HTTP/1.1 closes its connection after its answer, as they did.
* A request aiohttp cannot parse is answered with the caller's error body (JSON for
  the views), not aiohttp's text with the parser's details, and without a traceback
  in the log for every port scanner.
* `max_head_bytes`: a bound on what a connection may send while it waits for a
  request head. aiohttp bounds lines, not the head: 64 headers of 8 KiB would hold
  512 KiB per connection, where the views' old parser held 16 KiB. Past it the
  connection is answered 400 and closed once the client has had `LINGER` to stop.
* `max_connections`: aiohttp counts connections but caps none. At the cap a new
  connection takes the place of the oldest *idle* one (waiting for a request head),
  so connections that send nothing cannot lock requests out; only when every
  connection is *busy* (its request being answered) is the newcomer refused, with a
  response written before any request (aiohttp has no hook that answers then).
* `close` is synchronous and immediate: listening stops and every open connection is
  cut, one being answered too (aiohttp's own shutdown is a coroutine with a grace).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus

from aiohttp import hdrs, web
from aiohttp.abc import AbstractAccessLogger, AbstractStreamWriter
from aiohttp.http import HttpVersion, HttpVersion11, RawRequestMessage
from aiohttp.http_exceptions import BadStatusLine, HttpProcessingError, LineTooLong
from aiohttp.streams import StreamReader

from auditor.logs import get_logger

#: The `Server` header of every answer (not aiohttp's, which names Python's version).
SERVER = "bk-auditor"
#: Seconds a connection is still read, and what arrives dropped, after an answer that
#: closes it while the client sends on (a request body never read), so that the kernel
#: does not answer unread bytes with a reset that could destroy the answer in flight.
LINGER = 1.0
#: The version the request named, kept in its mapping (its `version` says 1.1).
_SENT_VERSION = web.RequestKey("sent_version", HttpVersion)

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
#: The content type and body of an error answer, from its status and a reason.
ErrorBody = Callable[[int, str], tuple[str, bytes]]

_log = get_logger("auditor.httpserve")


def canned(status: int, content_type: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    """A whole answer that closes its connection, for a connection answered before it
    sent a request (aiohttp writes responses only to requests)."""
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        f"Server: {SERVER}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse_error(exc: BaseException | None) -> str:
    """What a client is told of a request aiohttp's parser refused."""
    if isinstance(exc, BadStatusLine):  # also a method aiohttp does not know
        return "malformed request line"
    if isinstance(exc, LineTooLong):
        return "a request line or header is too long"
    if isinstance(exc, HttpProcessingError) and exc.message:
        return exc.message.splitlines()[0].rstrip(":. ")
    return "bad request"


def sent_version(request: web.BaseRequest) -> HttpVersion:
    """The HTTP version the request line named (the request's `version` says 1.1)."""
    sent: HttpVersion = request.get(_SENT_VERSION, request.version)
    return sent


class _NoAccessLog(AbstractAccessLogger):
    """No access log: the daemon logs what it refuses, not every read."""

    @property
    def enabled(self) -> bool:
        return False

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        pass


class _Connection(web.RequestHandler):
    """aiohttp's protocol for one connection, reporting to its `HttpServer`."""

    def __init__(self, owner: HttpServer, manager: web.Server) -> None:
        super().__init__(
            manager,
            loop=asyncio.get_running_loop(),
            keepalive_timeout=owner.idle_timeout,
            max_line_size=owner.max_line_size,
            max_field_size=owner.max_field_size,
            max_headers=owner.max_headers,
            lingering_time=LINGER,
            access_log_class=_NoAccessLog,
        )
        self.owner = owner
        #: Bytes received while waiting for a request head; None while a request is
        #: answered or once the connection is closing.
        self.head_bytes: int | None = 0
        #: Refused and about to close: what arrives is dropped unread.
        self.dropping = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.owner._opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.owner._lost(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.dropping:
            return
        limit = self.owner.max_head_bytes
        if limit is not None and self.head_bytes is not None:
            self.head_bytes += len(data)
            if self.head_bytes > limit:
                self.refuse(400, "the request head is too large", linger=True)
                return
        super().data_received(data)

    def refuse(self, status: int, reason: str, *, linger: bool = False) -> None:
        """Answers without a request (an error body) and closes; with `linger`, once
        the client has had `LINGER` seconds to stop sending (what it sends is dropped)."""
        self.owner._busy(self)  # closing: no connection to make room of
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(self.owner.canned(status, reason))
        if linger and transport.can_write_eof():
            self.dropping = True
            transport.write_eof()
            asyncio.get_running_loop().call_later(LINGER, self.force_close)
        else:
            self.force_close()

    def cut(self) -> None:
        """Closes at once, without an answer."""
        self.head_bytes = None
        if self.transport is not None:
            self.transport.abort()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request its parser refused (400) or whose handler raised
        (500), with the owner's error body; the connection closes after it."""
        self.head_bytes = None
        if request.writer.output_size > 0:  # as aiohttp's own: the answer is under way
            raise ConnectionError("an answer is under way: no error answer can follow it")
        if status >= 500:
            _log.error("http_request_failed", path=request.path, error=repr(exc))
            reason = f"{type(exc).__name__}: {exc}" if exc is not None else "internal error"
        else:
            reason = parse_error(exc)
        response = self.owner.error_response(status, reason)
        response.force_close()
        return response


class HttpServer:
    """One listening socket served by aiohttp on the running loop; `close` any number
    of times. `handler` answers every request aiohttp parsed."""

    def __init__(
        self,
        handler: Handler,
        *,
        error: ErrorBody,
        idle_timeout: float,
        headers: Mapping[str, str] | None = None,
        max_line_size: int = 8190,
        max_field_size: int = 8190,
        max_headers: int = 128,
        max_head_bytes: int | None = None,
        max_connections: int | None = None,
    ) -> None:
        self._handler = handler
        self._error = error
        #: Seconds for a whole request head, from the connection's start or the last answer.
        self.idle_timeout = idle_timeout
        #: Headers of every answer (errors too).
        self.headers = dict(headers or {})
        self.max_line_size = max_line_size
        self.max_field_size = max_field_size
        self.max_headers = max_headers
        self.max_head_bytes = max_head_bytes
        self.max_connections = max_connections
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open: set[_Connection] = set()
        #: The open connections waiting for a request head, oldest first.
        self._idle: dict[_Connection, None] = {}
        self.port = 0

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listens and serves; the port bound (`port=0` picks a free one). With TLS a
        handshake not done within the idle timeout is cut as an idle connection is."""
        if self._server is not None:
            raise RuntimeError("the HTTP server is already serving")
        self._loop = asyncio.get_running_loop()
        manager = web.Server(self._answer, request_factory=self._request, loop=self._loop)
        self._server = await self._loop.create_server(
            lambda: _Connection(self, manager),
            host,
            port,
            ssl=tls,
            ssl_handshake_timeout=self.idle_timeout if tls is not None else None,
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def close(self) -> None:
        """Stops listening and cuts every open connection; safe to call twice."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self._open):
            conn.cut()
        self._open.clear()
        self._idle.clear()

    # --- answers ----------------------------------------------------------------------

    def canned(self, status: int, reason: str) -> bytes:
        ctype, body = self._error(status, reason)
        return canned(status, ctype, body, self.headers)

    def error_response(self, status: int, reason: str) -> web.Response:
        ctype, body = self._error(status, reason)
        response = web.Response(status=status, body=body)
        response.headers.update(self.headers)
        response.headers[hdrs.CONTENT_TYPE] = ctype
        response.headers[hdrs.SERVER] = SERVER
        return response

    def _request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: web.RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        """aiohttp's request, answered as HTTP/1.1 (and closed after it unless it was
        HTTP/1.1); `sent_version` tells the version the client named."""
        sent: HttpVersion = message.version
        message = message._replace(
            version=HttpVersion11, should_close=message.should_close or sent != HttpVersion11
        )
        assert self._loop is not None
        request = web.BaseRequest(message, payload, protocol, writer, task, self._loop)
        request[_SENT_VERSION] = sent
        return request

    async def _answer(self, request: web.BaseRequest) -> web.StreamResponse:
        """The handler's answer, written before the connection counts as idle again."""
        conn = request.protocol
        if isinstance(conn, _Connection):
            self._busy(conn)
        response = await self._handler(request)
        if not response.prepared:
            for name, value in self.headers.items():
                response.headers.setdefault(name, value)
            response.headers[hdrs.SERVER] = SERVER
            if request.keep_alive and response.keep_alive is not False:
                response.headers[hdrs.CONNECTION] = "keep-alive"
        await response.prepare(request)
        await response.write_eof()
        if isinstance(conn, _Connection) and response.keep_alive and conn in self._open:
            conn.head_bytes = 0
            self._idle[conn] = None
        return response

    # --- connections ------------------------------------------------------------------

    def _opened(self, conn: _Connection) -> None:
        if not self._make_room():
            conn.refuse(
                503, f"too many requests at once (at most {self.max_connections} connections)"
            )
            return
        self._open.add(conn)
        self._idle[conn] = None

    def _busy(self, conn: _Connection) -> None:
        """`conn` is answering (or refusing): not idle, and what it receives is no head."""
        conn.head_bytes = None
        self._idle.pop(conn, None)

    def _lost(self, conn: _Connection) -> None:
        self._open.discard(conn)
        self._idle.pop(conn, None)

    def _make_room(self) -> bool:
        """Room for one more connection: True when there is (the oldest idle one cut if
        need be), False when every connection is busy answering a request."""
        if self.max_connections is None or len(self._open) < self.max_connections:
            return True
        if not self._idle:
            return False
        oldest = next(iter(self._idle))
        self._lost(oldest)
        oldest.cut()
        return True
