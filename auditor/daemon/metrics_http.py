"""/metrics over HTTP, answered on the asyncio loop rather than prometheus_client's thread.

Why: a wedged loop then fails the scrape (`up == 0`) instead of serving frozen
numbers, and stopping is immediate. The server knows nothing of the series: it
encodes whatever the registry's collectors yield when asked.
"""

from __future__ import annotations

import asyncio
import gzip

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

_MAX_REQUEST_LINE = 8192
_IDLE_TIMEOUT = 60.0


class MetricsServer:
    """Serves one registry; `start` once, `stop` any number of times."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self.http_port: int | None = None

    async def start(self, host: str, port: int) -> None:
        """Serves /metrics on the running loop; port 0 picks a free one (see `http_port`)."""
        if self._server is not None:
            raise RuntimeError("the metrics endpoint is already serving")
        self._server = await asyncio.start_server(self._serve, host, port, limit=_MAX_REQUEST_LINE)
        self.http_port = int(self._server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        """Stops listening and drops open connections; safe to call twice."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._connections):
            writer.transport.abort()
        self._connections.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while await self._one_request(reader, writer):
                pass
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass  # a scraper that went away or spoke nonsense: nothing to answer
        finally:
            self._connections.discard(writer)
            writer.close()

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answers one HTTP/1.x request; True when the connection stays open for another."""
        line = await asyncio.wait_for(reader.readline(), _IDLE_TIMEOUT)
        if not line:
            return False
        headers: dict[str, str] = {}
        while True:
            h = await asyncio.wait_for(reader.readline(), _IDLE_TIMEOUT)
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        parts = line.decode("latin-1").split()
        if len(parts) != 3:
            _respond(writer, "400 Bad Request", "text/plain", b"bad request\n", keep=False)
            await writer.drain()
            return False
        method, target, version = parts
        length = int(headers.get("content-length") or 0)
        if length > 0:
            await reader.readexactly(length)
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
        elif path == "/metrics":
            encoder, ctype = choose_encoder(headers.get("accept", ""))
            status, body = "200 OK", encoder(self.registry)
        elif path == "/":
            status, ctype, body = "200 OK", "text/plain", b"bk-auditor: metrics at /metrics\n"
        else:
            status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
        gzipped = "gzip" in headers.get("accept-encoding", "") and len(body) > 512
        if gzipped:
            body = gzip.compress(body)
        _respond(writer, status, ctype, body, keep=keep, gzipped=gzipped, head=method == "HEAD")
        await writer.drain()
        return keep


def _respond(
    writer: asyncio.StreamWriter,
    status: str,
    ctype: str,
    body: bytes,
    *,
    keep: bool,
    gzipped: bool = False,
    head: bool = False,
) -> None:
    lines = [
        f"HTTP/1.1 {status}",
        f"Content-Type: {ctype}",
        f"Content-Length: {len(body)}",
        f"Connection: {'keep-alive' if keep else 'close'}",
    ]
    if gzipped:
        lines.append("Content-Encoding: gzip")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body))
