"""/metrics over HTTP, answered on the asyncio loop rather than prometheus_client's thread.

Why: a wedged loop then fails the scrape (`up == 0`) instead of serving frozen
numbers, and stopping is immediate. Both still hold with aiohttp, which serves on
the loop too: the endpoint is the same small server as the read-only views
(`auditor.httpserve`), without their connection cap or head bound, as it had none.
It knows nothing of the series: it encodes whatever the registry's collectors
yield when asked.
"""

from __future__ import annotations

import gzip
from http import HTTPStatus

from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from auditor.httpserve import HttpServer

#: Seconds a scraper's connection may wait for (or take to send) a request head.
_IDLE_TIMEOUT = 60.0
#: Bodies smaller than this are sent as they are, even to a scraper that takes gzip.
_GZIP_FROM = 512


class MetricsServer:
    """Serves one registry; `start` once, `stop` any number of times."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._http: HttpServer | None = None
        self.http_port: int | None = None

    async def start(self, host: str, port: int) -> None:
        """Serves /metrics on the running loop; port 0 picks a free one (see `http_port`)."""
        if self._http is not None:
            raise RuntimeError("the metrics endpoint is already serving")
        http = HttpServer(self._answer, error=_error, idle_timeout=_IDLE_TIMEOUT)
        self._http = http
        try:
            self.http_port = await http.start(host, port)
        except BaseException:
            self._http = None
            raise

    def stop(self) -> None:
        """Stops listening and drops open connections; safe to call twice."""
        http, self._http = self._http, None
        if http is not None:
            http.close()

    async def _answer(self, request: web.BaseRequest) -> web.Response:
        path = request.raw_path.split("?", 1)[0]
        if request.method not in ("GET", "HEAD"):
            status, ctype, body = 405, "text/plain", b"GET only\n"
        elif path == "/metrics":
            encoder, ctype = choose_encoder(request.headers.get(hdrs.ACCEPT, ""))
            status, body = 200, encoder(self.registry)
        elif path == "/":
            status, ctype, body = 200, "text/plain", b"bk-auditor: metrics at /metrics\n"
        else:
            status, ctype, body = 404, "text/plain", b"not found\n"
        gzipped = "gzip" in request.headers.get(hdrs.ACCEPT_ENCODING, "") and len(body) > _GZIP_FROM
        response = web.Response(status=status, body=gzip.compress(body) if gzipped else body)
        response.headers[hdrs.CONTENT_TYPE] = ctype
        if gzipped:
            response.headers[hdrs.CONTENT_ENCODING] = "gzip"
        return response


def _error(status: int, _reason: str) -> tuple[str, bytes]:
    """A request the parser refused: `bad request` (the reason is the views' to give)."""
    return "text/plain", f"{HTTPStatus(status).phrase.lower()}\n".encode()
