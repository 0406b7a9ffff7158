"""The checks ask a few bookies a great many small questions at once; one socket per bookie
must carry them all, pair each answer with its request although a bookie answers out of
order, and give up on each at its own deadline, without a task or timer per request.

One TCP connection to one bookie, multiplexing many requests.

A bookie runs reads on per-ledger thread pools, so answers come back in any
order; the only link between a response and its request is the
(txnId, operation) pair in the response header. This connection keeps a table
of pending futures under that key, each with its deadline. When a deadline
passes, the entry leaves the table, so a response that turns up later finds
nothing and is dropped (and counted), exactly like the Java client. One sweep
timer per connection expires them (at the earliest deadline, then no more often
than every `SWEEP_GRANULARITY`), not a timer per request: a replicas run sends
tens of thousands of requests a second, and asyncio's timer heap compares its
handles in Python.

It is an `asyncio.Protocol` rather than a stream reader loop: frames are
parsed in `data_received`, so there is no reader task that could leak or
outlive the pool. A peer that sends garbage (an oversized or undecodable
frame) has lost sync for good; the connection is aborted and everything
pending on it fails with `PROTOCOL_ERROR`.

Writes are not awaited for drain: the pool's per-bookie in-flight cap bounds
how much can be queued, and the request timeout bounds how long a caller waits.
Frames are not written one by one either: a check sends hundreds of small
requests per loop iteration, and a `transport.write` per frame (a send system
call each) was the largest single cost of a replicas run. Requests made in one
iteration are gathered and written together at the end of it (`_flush`,
scheduled once with `call_soon`), so a burst costs one system call; a request
waits at most one loop iteration longer to leave.

With TLS the connection upgrades itself before it is handed out, as the Java
client does: START_TLS goes out as an ordinary v3 request, the bookie answers
it in clear, and the same socket is then wrapped (`loop.start_tls`, this
object staying the protocol). Any failure on the way is `TLS_FAILED`, and so
is a TLS error that ends the session later: with TLS 1.3 a bookie that wants a
client certificate only says so after the client has finished its handshake
(with an alert; a server that skips the alert just closes, so a TLS connection
closed before its first answer counts as a TLS failure too).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from auditor.bookie.protocol import (
    MAX_FRAME_SIZE,
    BookieProtocolError,
    FrameParser,
    Status,
    decode_response,
    effective_status,
    encode_message,
    start_tls_request,
)
from auditor.bookie.results import Unanswered
from auditor.bookie.tls import BookieTls, cipher_name
from auditor.proto import bookkeeper_protocol_pb2 as pb

__all__ = ["BookieConnection", "CallFailed"]

_Key = tuple[int, int]

#: Seconds between two sweeps for overdue requests at least: a request times out at
#: its deadline, or this much later when another one timed out just before.
SWEEP_GRANULARITY = 0.01


class CallFailed(Exception):
    """A request got no usable response; `reason` says why."""

    def __init__(self, reason: Unanswered, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason
        self.detail = detail


#: Who waits for a request: a future, or a callback given the response or the failure.
_Waiter = asyncio.Future[pb.Response] | Callable[[pb.Response | CallFailed], None]


class BookieConnection(asyncio.Protocol):
    """A v3 client connection. Create with `await BookieConnection.open(...)`."""

    def __init__(self, bookie_id: str, *, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        self.bookie_id = bookie_id
        self._max_frame_size = max_frame_size
        self._parser = FrameParser(max_frame_size=max_frame_size)
        self._transport: asyncio.Transport | None = None
        #: Requests sent and not answered: their futures, deadlines (loop time) and timeouts.
        self._pending: dict[_Key, tuple[_Waiter, float, float]] = {}
        #: The timer that expires overdue requests, and when it fires.
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_at = 0.0
        self._failure: CallFailed | None = None
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: Responses that matched no pending request (late after a timeout, or unknown).
        self.unmatched_responses = 0
        #: Upgraded to TLS and nothing received over it yet.
        self._tls_unproven = False
        #: Frames of this loop iteration's requests, written together by `_flush`.
        self._outgoing: list[bytes] = []

    @classmethod
    async def open(
        cls,
        bookie_id: str,
        host: str,
        port: int,
        *,
        connect_timeout: float,
        max_frame_size: int = MAX_FRAME_SIZE,
        tls: BookieTls | None = None,
        txn_id: int = 0,
    ) -> BookieConnection:
        """Connects (and with `tls` upgrades, START_TLS carrying `txn_id`).

        Raises OSError / TimeoutError for the TCP connect, `CallFailed` with
        `TLS_FAILED` for the upgrade.
        """
        loop = asyncio.get_running_loop()
        conn = cls(bookie_id, max_frame_size=max_frame_size)
        async with asyncio.timeout(connect_timeout):
            await loop.create_connection(lambda: conn, host, port)
        if tls is not None:
            try:
                await conn._start_tls(tls, host, port, txn_id)
            except BaseException as exc:
                conn._abandon(exc)
                raise
        return conn

    async def _start_tls(self, tls: BookieTls, host: str, port: int, txn_id: int) -> None:
        where = f"{self.bookie_id} at {host}:{port}"
        try:
            resp = await self.call(start_tls_request(txn_id), tls.timeout)
        except CallFailed as exc:
            raise CallFailed(
                Unanswered.TLS_FAILED, f"START_TLS to {where} got no answer: {exc}"
            ) from None
        status = effective_status(resp)
        if status is not Status.EOK:
            hint = " (TLS is not enabled on that bookie)" if status is Status.EBADREQ else ""
            raise CallFailed(
                Unanswered.TLS_FAILED, f"{where} refused START_TLS with {status.name}{hint}"
            )
        if self._parser.buffered:
            raise CallFailed(
                Unanswered.TLS_FAILED, f"{where} sent bytes after its START_TLS answer"
            )
        raw = self._transport
        assert raw is not None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(tls.timeout):
                upgraded = await loop.start_tls(
                    raw, self, tls.context, server_hostname=host, ssl_handshake_timeout=tls.timeout
                )
        except TimeoutError:
            raise CallFailed(
                Unanswered.TLS_FAILED,
                f"TLS handshake with {where} took longer than {tls.timeout:g}s",
            ) from None
        except (OSError, ssl.SSLError) as exc:  # SSLCertVerificationError, resets, alerts
            raise CallFailed(
                Unanswered.TLS_FAILED, f"TLS handshake with {where} failed: {_describe(exc)}"
            ) from None
        if upgraded is None or self._failure is not None:
            raise CallFailed(Unanswered.TLS_FAILED, f"{where} closed the connection during TLS")
        self._transport = upgraded
        self._tls_unproven = True

    def _abandon(self, exc: BaseException) -> None:
        """Drops a connection whose upgrade failed; nobody will wait for it to close."""
        detail = exc.detail if isinstance(exc, CallFailed) else f"{self.bookie_id}: {exc!r}"
        self._fail(CallFailed(Unanswered.TLS_FAILED, detail))
        if not self._lost.done():
            self._lost.set_result(None)

    # --- state ---------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._failure is None and self._transport is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def tls_cipher(self) -> str | None:
        """The negotiated cipher suite's name; None on a connection in clear."""
        return None if self._transport is None else cipher_name(self._transport)

    @property
    def peer(self) -> tuple[str, int] | None:
        if self._transport is None:
            return None
        name = self._transport.get_extra_info("peername")
        return None if name is None else (str(name[0]), int(name[1]))

    # --- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            payloads = self._parser.feed(data)
            for payload in payloads:
                self._dispatch(decode_response(payload))
        except BookieProtocolError as exc:
            self._fail(CallFailed(Unanswered.PROTOCOL_ERROR, f"{self.bookie_id}: {exc}"))

    def eof_received(self) -> bool | None:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        detail = f"{self.bookie_id} closed the connection"
        reason = Unanswered.DISCONNECTED
        if isinstance(exc, ssl.SSLError):
            # e.g. TLS 1.3's "certificate required" alert, read after our handshake ended
            reason, detail = Unanswered.TLS_FAILED, f"{self.bookie_id}: TLS: {_describe(exc)}"
        elif self._tls_unproven:  # an EOF, or a reset if our request crossed the close
            reason = Unanswered.TLS_FAILED
            detail = (
                f"{self.bookie_id} closed the TLS connection before answering anything "
                "(as a bookie does that wants a client certificate: tlsClientAuthentication)"
            )
        elif exc is not None:
            detail = f"{self.bookie_id}: {exc}"
        self._fail(CallFailed(reason, detail))
        if not self._lost.done():
            self._lost.set_result(None)

    def _dispatch(self, response: pb.Response) -> None:
        self._tls_unproven = False
        key = (response.header.txnId, response.header.operation)
        entry = self._pending.pop(key, None)
        if entry is None or (isinstance(entry[0], asyncio.Future) and entry[0].done()):
            self.unmatched_responses += 1
            return
        _settle(entry[0], response)

    # --- requests ----------------------------------------------------------------

    async def call(self, request: pb.Request, request_timeout: float) -> pb.Response:
        """Sends `request` and waits for its response; raises `CallFailed`."""
        key = (request.header.txnId, request.header.operation)
        fut = self.send_frame(
            key, encode_message(request, max_frame_size=self._max_frame_size), request_timeout
        )
        try:
            return await fut
        finally:
            self.forget(key, fut)

    def send_frame(
        self, key: _Key, frame: bytes, request_timeout: float
    ) -> asyncio.Future[pb.Response]:
        """Sends one encoded request whose header says `key` (txnId, operation); the
        future gets its response or a `CallFailed`.

        Whoever gives up on the future before it is done calls `forget`.
        """
        fut: asyncio.Future[pb.Response] = asyncio.get_running_loop().create_future()
        self.send_frame_then(key, frame, request_timeout, fut)
        return fut

    def send_frame_then(
        self, key: _Key, frame: bytes | tuple[bytes, ...], request_timeout: float, then: _Waiter
    ) -> None:
        """`send_frame` for a caller that wants its outcome handed to `then`: a future, or
        a callback called (on the loop, at once) with the response or the `CallFailed`.

        No coroutine either way. The callback form spares the replicas check's hot
        path a future and a loop hop per request; it must not raise. A frame may come in
        parts (an add's fields around its body), which are sent in order without being
        joined first: a large entry body is copied once, into the iteration's buffer.
        """
        if self._failure is not None:
            raise self._failure
        assert self._transport is not None
        if key in self._pending:
            raise ValueError(f"txnId {key[0]} is already pending on this connection")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request_timeout
        self._pending[key] = (then, deadline, request_timeout)
        if self._sweeper is None or deadline < self._sweep_at:
            self._sweep_later(loop, deadline)
        if not self._outgoing:
            loop.call_soon(self._flush)
        if isinstance(frame, bytes):
            self._outgoing.append(frame)
        else:
            self._outgoing.extend(frame)

    def forget(self, key: _Key, fut: asyncio.Future[pb.Response]) -> None:
        """Drops a request nobody waits for any more (its answer will be unmatched)."""
        entry = self._pending.get(key)
        if entry is not None and entry[0] is fut:
            del self._pending[key]

    def _flush(self) -> None:
        """Writes the frames queued in this loop iteration as one buffer."""
        frames, self._outgoing = self._outgoing, []
        transport = self._transport
        if not frames or self._failure is not None or transport is None:
            return  # a failed connection has already failed their requests
        transport.write(frames[0] if len(frames) == 1 else b"".join(frames))

    def _sweep_later(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._sweep_at = when
        self._sweeper = loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Fails the requests whose deadline has passed; plans the next sweep."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = [(key, entry) for key, entry in self._pending.items() if entry[1] <= now]
        for key, (waiter, _, timeout) in due:
            del self._pending[key]
            _settle(
                waiter,
                CallFailed(
                    Unanswered.TIMEOUT, f"{self.bookie_id} did not answer within {timeout:g}s"
                ),
            )
        if self._pending:
            earliest = min(entry[1] for entry in self._pending.values())
            self._sweep_later(loop, max(earliest, now + SWEEP_GRANULARITY))

    # --- shutdown ----------------------------------------------------------------

    def _fail(self, failure: CallFailed) -> None:
        """Fails every pending request and aborts the transport (idempotent)."""
        if self._failure is None:
            self._failure = failure
        self._outgoing = []
        pending, self._pending = self._pending, {}
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for waiter, _, _ in pending.values():
            _settle(waiter, self._failure)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()

    def close(self, reason: Unanswered = Unanswered.CLOSED, detail: str = "") -> None:
        """Fails pending requests at once with `reason`, then drops the connection."""
        self._fail(CallFailed(reason, detail or f"connection to {self.bookie_id} closed"))

    async def wait_closed(self) -> None:
        if self._transport is not None:
            await asyncio.shield(self._lost)


def _settle(waiter: _Waiter, outcome: pb.Response | CallFailed) -> None:
    """Hands a request's outcome to whoever waits for it."""
    if isinstance(waiter, asyncio.Future):
        if waiter.done():
            return
        if isinstance(outcome, CallFailed):
            waiter.set_exception(outcome)
        else:
            waiter.set_result(outcome)
        return
    try:
        waiter(outcome)
    except Exception as exc:  # a callback's bug must not stop the connection's parsing
        asyncio.get_running_loop().call_exception_handler(
            {"message": "bookie response callback failed", "exception": exc}
        )


def _describe(exc: BaseException) -> str:
    """One line for a TLS failure: OpenSSL's reason and the verifier's, without the errno."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    return str(exc) or type(exc).__name__
