"""One TCP connection to one bookie, multiplexing many requests.

A bookie runs reads on per-ledger thread pools, so answers come back in any
order; the only link between a response and its request is the
(txnId, operation) pair in the response header. This connection keeps a table
of pending futures under that key. Each request carries its own timer: when it
fires, the entry leaves the table, so a response that turns up later finds
nothing and is dropped (and counted), exactly like the Java client.

It is an `asyncio.Protocol` rather than a stream reader loop: frames are
parsed in `data_received`, so there is no reader task that could leak or
outlive the pool. A peer that sends garbage (an oversized or undecodable
frame) has lost sync for good; the connection is aborted and everything
pending on it fails with `PROTOCOL_ERROR`.

Writes are not awaited for drain: the pool's per-bookie in-flight cap bounds
how much can be queued, and the request timeout bounds how long a caller waits.
"""

from __future__ import annotations

import asyncio

from auditor.bookie.protocol import (
    MAX_FRAME_SIZE,
    BookieProtocolError,
    FrameParser,
    decode_response,
    encode_message,
)
from auditor.bookie.results import Unanswered
from auditor.proto import bookkeeper_protocol_pb2 as pb

__all__ = ["BookieConnection", "CallFailed"]

_Key = tuple[int, int]


class CallFailed(Exception):
    """A request got no usable response; `reason` says why."""

    def __init__(self, reason: Unanswered, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason
        self.detail = detail


class BookieConnection(asyncio.Protocol):
    """A v3 client connection. Create with `await BookieConnection.open(...)`."""

    def __init__(self, bookie_id: str, *, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        self.bookie_id = bookie_id
        self._max_frame_size = max_frame_size
        self._parser = FrameParser(max_frame_size=max_frame_size)
        self._transport: asyncio.Transport | None = None
        self._pending: dict[_Key, asyncio.Future[pb.Response]] = {}
        self._failure: CallFailed | None = None
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: Responses that matched no pending request (late after a timeout, or unknown).
        self.unmatched_responses = 0

    @classmethod
    async def open(
        cls,
        bookie_id: str,
        host: str,
        port: int,
        *,
        connect_timeout: float,
        max_frame_size: int = MAX_FRAME_SIZE,
    ) -> BookieConnection:
        """Connects, or raises OSError / TimeoutError."""
        loop = asyncio.get_running_loop()
        conn = cls(bookie_id, max_frame_size=max_frame_size)
        async with asyncio.timeout(connect_timeout):
            await loop.create_connection(lambda: conn, host, port)
        return conn

    # --- state ---------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._failure is None and self._transport is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

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
        if exc is not None:
            detail = f"{self.bookie_id}: {exc}"
        self._fail(CallFailed(Unanswered.DISCONNECTED, detail))
        if not self._lost.done():
            self._lost.set_result(None)

    def _dispatch(self, response: pb.Response) -> None:
        key = (response.header.txnId, response.header.operation)
        fut = self._pending.pop(key, None)
        if fut is None or fut.done():
            self.unmatched_responses += 1
            return
        fut.set_result(response)

    # --- requests ----------------------------------------------------------------

    async def call(self, request: pb.Request, request_timeout: float) -> pb.Response:
        """Sends `request` and waits for its response; raises `CallFailed`."""
        if self._failure is not None:
            raise self._failure
        transport = self._transport
        assert transport is not None
        frame = encode_message(request, max_frame_size=self._max_frame_size)
        key = (request.header.txnId, request.header.operation)
        if key in self._pending:
            raise ValueError(f"txnId {key[0]} is already pending on this connection")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[pb.Response] = loop.create_future()
        self._pending[key] = fut
        timer = loop.call_later(request_timeout, self._expire, key, fut, request_timeout)
        try:
            transport.write(frame)
            return await fut
        finally:
            timer.cancel()
            if self._pending.get(key) is fut:
                del self._pending[key]

    def _expire(self, key: _Key, fut: asyncio.Future[pb.Response], timeout: float) -> None:
        if self._pending.get(key) is fut:
            del self._pending[key]
        if not fut.done():
            fut.set_exception(
                CallFailed(
                    Unanswered.TIMEOUT, f"{self.bookie_id} did not answer within {timeout:g}s"
                )
            )

    # --- shutdown ----------------------------------------------------------------

    def _fail(self, failure: CallFailed) -> None:
        """Fails every pending request and aborts the transport (idempotent)."""
        if self._failure is None:
            self._failure = failure
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(self._failure)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()

    def close(self, reason: Unanswered = Unanswered.CLOSED, detail: str = "") -> None:
        """Fails pending requests at once with `reason`, then drops the connection."""
        self._fail(CallFailed(reason, detail or f"connection to {self.bookie_id} closed"))

    async def wait_closed(self) -> None:
        if self._transport is not None:
            await asyncio.shield(self._lost)
