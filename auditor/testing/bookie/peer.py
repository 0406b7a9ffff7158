"""Framing and the START_TLS upgrade belong to each connection, whatever the emulator then
does with its requests, and must be held to a bookie's behaviour on their own.

One client connection to an emulated bookie: framing, and turning into TLS on START_TLS.

A peer parses v3 frames and hands each request to its host (the emulator),
except START_TLS, which the host answers at once and which may turn the
connection into a TLS server. Like a bookie, a frame that is not a valid v3
`Request` ends the connection. What a peer needs of its host is the
`PeerHost` protocol, so this module does not import the emulator.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Protocol

from auditor.bookie.protocol import (
    BookieProtocolError,
    FrameParser,
    Operation,
    decode_request,
    encode_message,
)
from auditor.bookie.tls import cipher_name
from auditor.proto import bookkeeper_protocol_pb2 as pb

__all__ = ["Peer", "PeerHost"]


class PeerHost(Protocol):
    """What a connection needs from the bookie it belongs to."""

    #: Seconds a TLS handshake may take.
    tls_handshake_timeout: float
    #: TLS handshakes completed; and why each failed one failed.
    tls_handshakes: int
    tls_failures: list[str]

    def peer_opened(self, peer: Peer) -> None: ...

    def peer_closed(self, peer: Peer) -> None: ...

    def start_tls_requested(self, peer: Peer, request: pb.Request) -> bool:
        """Answers START_TLS; returns whether the connection now upgrades."""
        ...

    def request_received(self, peer: Peer, request: pb.Request) -> None: ...


class Peer(asyncio.Protocol):
    """One client connection to the emulator."""

    def __init__(self, host: PeerHost) -> None:
        self._host = host
        self._parser = FrameParser()
        self.transport: asyncio.Transport | None = None
        #: Between the START_TLS answer and the end of the handshake: nothing may be sent.
        self.upgrading = False
        #: What arrived over TLS before the upgrade's coroutine saw the handshake end.
        self._early: list[bytes] = []
        #: The cipher suite negotiated, once this connection speaks TLS.
        self.tls_cipher: str | None = None
        #: The client certificate presented (as `SSLSocket.getpeercert()`), if any.
        self.client_cert: dict[str, Any] | None = None

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing() and not self.upgrading

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._host.peer_opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._host.peer_closed(self)

    def data_received(self, data: bytes) -> None:
        if self.upgrading:
            # asyncio's TLS layer hands on what came with the client's last handshake
            # message (its first requests) as soon as the handshake ends, before
            # `start_tls` returns to `_upgrade`: the requests of a client that writes at
            # once (ours does; with a client certificate they often share a segment) wait
            # here for the TLS transport, instead of being dropped unanswered.
            self._early.append(bytes(data))
            return
        try:
            payloads = self._parser.feed(data)
        except BookieProtocolError:
            self.abort()
            return
        for i, payload in enumerate(payloads):
            if not self.open:
                return
            try:
                request = decode_request(payload)
            except BookieProtocolError:
                # A real bookie falls back to v2 on such a frame, fails to decode it, and closes.
                self.abort()
                return
            if int(request.header.operation) == Operation.START_TLS:
                if not self._host.start_tls_requested(self, request):
                    continue
                if i + 1 < len(payloads) or self._parser.buffered:
                    self.abort()  # bytes after START_TLS, before its answer: not a TLS client
                return
            self._host.request_received(self, request)

    def upgrade(self, context: ssl.SSLContext) -> asyncio.Task[None]:
        """Turns this connection into a TLS server (reading stops until the handshake)."""
        assert self.transport is not None
        raw = self.transport
        raw.pause_reading()
        self.upgrading = True
        return asyncio.get_running_loop().create_task(self._upgrade(raw, context))

    async def _upgrade(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        host = self._host
        loop = asyncio.get_running_loop()
        try:
            upgraded = await loop.start_tls(
                raw,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=host.tls_handshake_timeout,
                ssl_shutdown_timeout=1.0,
            )
        except Exception as exc:  # whatever the handshake died of: the client sees it too
            host.tls_failures.append(repr(exc))
            raw.abort()
            return
        finally:
            self.upgrading = False
            early, self._early = self._early, []
        if upgraded is None:
            host.tls_failures.append("connection lost during the handshake")
            return
        self.transport = upgraded
        self.tls_cipher = cipher_name(upgraded)
        self.client_cert = upgraded.get_extra_info("peercert") or None
        host.tls_handshakes += 1
        for data in early:
            self.data_received(data)

    def send(self, response: pb.Response) -> bool:
        if not self.open:
            return False
        assert self.transport is not None
        try:
            frame = encode_message(response)
        except BookieProtocolError:
            self.abort()  # too long for a frame: the client would drop the connection anyway
            return False
        self.transport.write(frame)
        return True

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
