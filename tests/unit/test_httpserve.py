"""The guards `auditor.httpserve` adds to aiohttp, on a real socket with a stand-in handler:
the connection cap (idle connections make room, busy ones do not), the bound on a head
as a whole, error bodies for what aiohttp's parser refuses, HTTP/1.1 answers, and an
immediate stop. The views' and /metrics' own tests cover the routes."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from auditor.httpserve import HttpServer, sent_version

GET = b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


def _error(status: int, reason: str) -> tuple[str, bytes]:
    return "application/json", json.dumps({"error": reason, "status": status}).encode()


class Stand:
    """A handler whose answers wait for `gate`, counting who is inside."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.inside = 0
        self.changed = asyncio.Condition()
        self.versions: list[str] = []

    async def until_inside(self, n: int) -> None:
        async with asyncio.timeout(5), self.changed:
            await self.changed.wait_for(lambda: self.inside >= n)

    async def __call__(self, request: web.BaseRequest) -> web.Response:
        v = sent_version(request)
        self.versions.append(f"{v.major}.{v.minor}")
        async with self.changed:
            self.inside += 1
            self.changed.notify_all()
        try:
            await self.gate.wait()
        finally:
            self.inside -= 1
        return web.Response(body=b"ok", content_type="text/plain")


async def exchange(port: int, raw: bytes, within: float = 5) -> bytes:
    """`raw` on a fresh connection, and everything the server sends until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), within)
    finally:
        writer.close()


def _split(answer: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    first, *rest = head.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in rest)}
    return first, fields, body


async def test_answers_are_http_1_1_with_the_servers_headers() -> None:
    stand = Stand()
    server = HttpServer(stand, error=_error, idle_timeout=5, headers={"X-Always": "1"})
    port = await server.start("127.0.0.1", 0)
    try:
        first, fields, body = _split(await exchange(port, b"GET /x HTTP/1.0\r\n\r\n"))
        assert first == "HTTP/1.1 200 OK" and body == b"ok"
        assert fields["connection"] == "close"  # HTTP/1.0: closed after the answer
        assert fields["server"] == "bk-auditor" and fields["x-always"] == "1"
        assert stand.versions == ["1.0"]
        # aiohttp's parser refuses: the owner's error body, not aiohttp's text.
        first, fields, body = _split(await exchange(port, b"GARBAGE\r\n\r\n"))
        assert first == "HTTP/1.1 400 Bad Request"
        assert fields["content-type"] == "application/json" and fields["x-always"] == "1"
        assert json.loads(body) == {"error": "malformed request line", "status": 400}
        long_line = b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: t\r\n\r\n"
        _, _, body = _split(await exchange(port, long_line))
        assert json.loads(body)["error"] == "a request line or header is too long"
    finally:
        server.close()


async def test_a_head_is_bounded_as_a_whole() -> None:
    server = HttpServer(Stand(), error=_error, idle_timeout=5, max_head_bytes=4096)
    port = await server.start("127.0.0.1", 0)
    try:
        # Each line within aiohttp's bounds, all of them past the head's.
        lines = [b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(5)]
        headers = b"".join(lines)
        first, _, body = _split(await exchange(port, b"GET /x HTTP/1.1\r\nHost: t\r\n" + headers))
        assert first == "HTTP/1.1 400 Bad Request"
        assert json.loads(body)["error"] == "the request head is too large"
        # Under it, and again on a kept-alive connection: answered.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(3):
                writer.write(b"GET /x HTTP/1.1\r\nHost: t\r\n" + b"".join(lines[:3]) + b"\r\n")
                await writer.drain()
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert head.startswith(b"HTTP/1.1 200 OK\r\n")
                assert b"Connection: keep-alive" in head
                assert await reader.readexactly(2) == b"ok"
        finally:
            writer.close()
    finally:
        server.close()


async def test_idle_connections_make_room_and_busy_ones_do_not() -> None:
    stand = Stand()
    server = HttpServer(stand, error=_error, idle_timeout=30, max_connections=3)
    port = await server.start("127.0.0.1", 0)
    held: list[asyncio.StreamWriter] = []
    try:
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        held += [w for _, w in idle]
        # Full of idle connections: a request takes the oldest one's place.
        first, _, _ = _split(await exchange(port, GET))
        assert first == "HTTP/1.1 200 OK"
        assert await asyncio.wait_for(idle[0][0].read(), 5) == b""

        # Every connection busy: the newcomer is refused, before it sent anything.
        stand.gate.clear()
        busy = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        held += [w for _, w in busy]
        for _, writer in busy:
            writer.write(GET)
            await writer.drain()
        await stand.until_inside(3)
        first, fields, body = _split(await exchange(port, b""))
        assert first == "HTTP/1.1 503 Service Unavailable"
        assert fields["connection"] == "close"
        assert json.loads(body)["error"] == "too many requests at once (at most 3 connections)"
        stand.gate.set()
        for reader, _ in busy:
            assert (await asyncio.wait_for(reader.read(), 5)).endswith(b"\r\n\r\nok")
    finally:
        for writer in held:
            writer.close()
        server.close()


async def test_a_connection_that_sends_no_whole_head_is_cut_after_the_idle_timeout() -> None:
    server = HttpServer(Stand(), error=_error, idle_timeout=0.5)
    port = await server.start("127.0.0.1", 0)
    try:
        loop = asyncio.get_running_loop()
        for start in (b"", b"GET /x HT"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            began = loop.time()
            writer.write(start)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # cut, no answer
            assert 0.3 < loop.time() - began < 4
            writer.close()
    finally:
        server.close()


async def test_close_is_immediate_and_safe_twice() -> None:
    stand = Stand()
    stand.gate.clear()
    server = HttpServer(stand, error=_error, idle_timeout=30)
    port = await server.start("127.0.0.1", 0)
    with pytest.raises(RuntimeError):
        await server.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GET)
    await writer.drain()
    await stand.until_inside(1)
    server.close()  # a request being answered does not hold it up
    server.close()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    stand.gate.set()
