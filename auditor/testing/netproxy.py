"""Stopping a ZooKeeper server is not a partition: when it comes back it resets every
session's clock, so sessions survive any downtime, and session expiry cannot be tested that
way.

A loopback TCP proxy that can be cut: a network partition for one client, in a test.

A partition keeps the server running while one client cannot reach it, and the server
expires that client's session on time. Put this proxy between the client and the server;
`cut()` drops every connection and refuses new ones (the client sees a dead network),
`mend()` lets connections through again. `hold()` is a server that takes connections and
never answers: each new one is accepted, its bytes read and dropped, until the client
gives up on it.
"""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._open = True
        self._holding = False
        #: Connections taken while holding, and how many of them the client has closed.
        self.held = 0
        self.held_closed = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self) -> None:
        self._open = False
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    def mend(self) -> None:
        """New connections go through again (held ones stay held)."""
        self._open = True
        self._holding = False

    def hold(self) -> None:
        """Drops every connection; new ones are taken and never answered (until `mend`)."""
        self.cut()
        self._holding = True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._holding:
            await self._hold(reader, writer)
            return
        if not self._open:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.held += 1
        self._writers.add(writer)
        try:
            with contextlib.suppress(OSError):
                while await reader.read(65536):
                    pass  # read and dropped: nothing is ever answered
        finally:
            self.held_closed += 1
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while self._open:
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
