"""The read-only HTTP views, served by a real in-process daemon on a seeded cluster.

The daemon runs with `views_factory` (as `bk-auditor run` does) on a small copy of
the demo's cluster: one seeded fault per category, a dead and a silent bookie, and
one more ledger on the dead bookie that Pulsar owns. Every JSON route is compared
with the document the CLI prints for the same thing (`status --json`,
`check --json`, `explain --json`); BookKeeper's two reads with what its bookie
HTTP server answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from auditor.analysis.explain import document_text
from auditor.api import convert
from auditor.api.http import (
    BK_LIST_UNDER_REPLICATED,
    BK_WHO_IS_AUDITOR,
    HttpViews,
    start_http_views,
)
from auditor.api.page import render_page
from auditor.checks.findings import Check
from auditor.checks.owners import owner_of
from auditor.daemon.service import Daemon
from auditor.daemon.state import DaemonState
from auditor.errors import ConfigError
from auditor.metadata.underreplication import UnderreplicatedLedger, UnderreplicationManager
from auditor.testing.bookie import BookieEmulator
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.harness import test_cluster
from auditor.testing.inprocess import fast_config
from auditor.testing.observe import events_of
from auditor.testing.pki import issue, new_ca
from auditor.testing.seeded import ROOT, build_seeded_cluster
from auditor.testing.zkserver import free_port
from auditor.zk import ZkClient
from tests.integration.test_daemon import daemons, leader_becomes

TOKEN = "http-views-token"
#: Healthy ledgers of the seeded cluster (the demo has 2,000).
HEALTHY = 20
#: A ledger on the bookie that dies, with the custom metadata a Pulsar broker writes.
PULSAR_LEDGER = 3101
PULSAR_CUSTOM = (
    ("application", b"pulsar"),
    ("component", b"managed-ledger"),
    ("pulsar/managed-ledger", b"public/default/persistent/orders"),
)
#: The checks that run in the first round (all of them, at FAST's hourly intervals).
FIRST_ROUND = (Check.BOOKIES, Check.LEDGERS, Check.PLACEMENT, Check.REPLICAS, Check.GRACE)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        assert self.headers["content-type"] == "application/json", self.headers
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


async def request(
    port: int,
    path: str,
    *,
    method: str = "GET",
    headers: Sequence[tuple[str, str]] = (),
    raw: bytes | None = None,
    tls: ssl.SSLContext | None = None,
) -> Reply:
    """One request on a fresh connection (`Connection: close`), read to the end."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    try:
        if raw is None:
            lines = [f"{method} {path} HTTP/1.1", "Host: auditor", "Connection: close"]
            lines += [f"{k}: {v}" for k, v in headers]
            raw = ("\r\n".join(lines) + "\r\n\r\n").encode()
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 60)
    finally:
        writer.close()
    if not data:
        raise ConnectionError("the server closed the connection without an answer")
    head, _, body = data.partition(b"\r\n\r\n")
    first, *rest = head.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in rest)}
    if method != "HEAD":  # HEAD: the length GET would have, and no body
        assert int(fields["content-length"]) == len(body)
    return Reply(int(first.split()[1]), fields, body)


async def _until(what: str, done: Callable[[], bool], within: float = 90) -> None:
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"not within {within}s: {what}"
        await asyncio.sleep(0.1)


async def seed(zk: ZkClient, healthy: int = HEALTHY) -> list[BookieEmulator]:
    """The demo's cluster, smaller, plus a Pulsar-owned ledger on the bookie that dies;
    bookie 6 crashed and bookie 7 silent (the caller stops them: `stop_all`)."""
    bookies = [BookieEmulator(zk, ledgers_root=ROOT) for _ in range(8)]
    for b in bookies:
        await b.start()
    await build_seeded_cluster(zk, bookies, healthy=healthy)
    for i in (0, 2, 6):
        bookies[i].put_ledger(PULSAR_LEDGER, list(range(10)))
    ids = [b.bookie_id for b in bookies]
    await ClusterWriter(zk, ROOT).write_ledger(
        make_metadata(
            PULSAR_LEDGER,
            [ids[0], ids[2], ids[6]],
            write_quorum=2,
            last_entry_id=9,
            length=160,
            custom_metadata=PULSAR_CUSTOM,
        )
    )
    await bookies[6].crash()
    bookies[7].pause()
    return bookies


async def stop_all(bookies: list[BookieEmulator]) -> None:
    bookies[7].resume()
    for b in bookies:
        if b.running:
            await b.stop()


@contextlib.asynccontextmanager
async def serving(
    zk: ZkClient, identity: str, extra: Sequence[str] = (), *, first_round: bool = True
) -> AsyncIterator[tuple[Daemon, HttpViews]]:
    """A daemon that serves the views (`api.http_port=0`: a free port), as `run` wires them;
    with `first_round`, once every check has reported."""
    cfg = fast_config(zk.hosts, identity, ["api.http_port=0", *extra])
    daemon = Daemon(cfg)
    events_of(daemon)  # listening from the start: tests wait on its events

    async def views_factory(d: Daemon) -> HttpViews:
        api = cfg.api
        return await start_http_views(
            d,
            host="127.0.0.1",
            port=api.http_port,
            token=api.token or None,
            tls_cert=api.tls_cert or None,
            tls_key=api.tls_key or None,
            tls_client_ca=api.tls_client_ca or None,
            protect_reads=api.protect_reads,
            max_connections=api.http_max_connections,
            header_timeout=api.http_header_timeout,
        )

    run = asyncio.ensure_future(daemon.run(views_factory=views_factory, signals=False))
    try:
        await _until("the views", lambda: daemon.views is not None or run.done(), 30)
        assert not run.done(), run.exception()
        views = daemon.views
        assert isinstance(views, HttpViews)
        if first_round:
            checks = daemon.state.checks
            await _until("the first round", lambda: all(checks[c].last_report for c in FIRST_ROUND))
        yield daemon, views
    finally:
        daemon.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(run), 30)
        if not run.done():
            run.cancel()
            with contextlib.suppress(BaseException):
                await run
    # Stopped with the daemon: nothing listens any more.
    with pytest.raises(OSError):
        await request(views.port, "/status")


def _without_ages(doc: dict[str, Any]) -> dict[str, Any]:
    for c in doc["checks"].values():
        c.pop("last_success_age_s")
    return doc


#: The grace check's age in an explain document.
AGO = re.compile(r"marked (\d+)s ago")


async def test_json_views_are_the_cli_documents(zk: ZkClient) -> None:
    bookies = await seed(zk)
    try:
        async with serving(zk, "views-auditor:1") as (daemon, views):
            port, state = views.port, daemon.state
            # The state as it was just before and just after the request (the self-test
            # may report meanwhile): the answer is one of the two.
            before = _without_ages(convert.status_json(convert.status_response(state)))
            status = await request(port, "/status")
            after = _without_ages(convert.status_json(convert.status_response(state)))
            assert status.status == 200
            assert _without_ages(status.json()) in (before, after)
            assert status.json()["leader"] == "views-auditor:1"

            for check in FIRST_ROUND:
                report = state.checks[check].last_report
                assert report is not None
                got = await request(port, f"/reports/{check}")
                assert got.status == 200
                assert got.body == (convert.report_json_text(report) + "\n").encode()
                assert got.json() == report.to_json()
            bookies_report = state.checks[Check.BOOKIES].last_report
            assert bookies_report is not None
            owner = owner_of(PULSAR_CUSTOM)
            assert owner is not None and bookies_report.owners[PULSAR_LEDGER] == owner

            # Explain: the `explain --json` document, as the daemon's gRPC Explain gives it.
            # Its grace check says how many whole seconds ago the ledger was marked, counted
            # when the document is made: the page's lies between one made before the request
            # and one made after it (one made after alone differed once a second ticked over).
            made_before = document_text(await daemon.explain(3003))
            got = await request(port, "/explain/3003")
            made_after = document_text(await daemon.explain(3003))
            assert got.status == 200
            shown = got.body.decode()
            assert AGO.sub("marked Ns ago", shown) == AGO.sub("marked Ns ago", made_after) + "\n"
            ages = [[int(a) for a in AGO.findall(doc)] for doc in (made_before, shown, made_after)]
            assert ages[1] and all(b <= g <= a for b, g, a in zip(*ages, strict=True)), ages
            assert got.json()["ledger_id"] == 3003

            # Errors: JSON bodies with a reason.
            missing = await request(port, "/explain/999999")
            assert missing.status == 404 and "999999" in missing.json()["error"]
            assert (await request(port, "/explain/12abc")).status == 400
            unknown = await request(port, "/reports/nonsense")
            assert unknown.status == 404 and "unknown check" in unknown.json()["error"]
            assert (await request(port, "/nowhere")).status == 404
            post = await request(port, "/status", method="POST")
            assert post.status == 405 and post.headers["allow"] == "GET, HEAD"
            assert "GET only" in post.json()["error"]
            bad = await request(port, "", raw=b"GARBAGE\r\n\r\n")
            assert bad.status == 400 and bad.json()["error"] == "malformed request line"
            body = await request(port, "", raw=b"GET / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
            assert body.status == 400
            huge = await request(port, "", raw=b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n")
            assert huge.status == 400
            head = await request(port, "/status", method="HEAD")
            assert head.status == 200 and head.body == b""
            assert int(head.headers["content-length"]) > 0

            # Keep-alive: two requests on one connection.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                for _ in range(2):
                    writer.write(b"GET /status HTTP/1.1\r\nHost: auditor\r\n\r\n")
                    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
                    assert b"Connection: keep-alive" in answer
                    length = int(answer.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                    assert json.loads(await reader.readexactly(length))["identity"]
            finally:
                writer.close()

            # HTML: the page, rendered on the server.
            page = await request(port, "/")
            assert page.status == 200 and page.headers["content-type"].startswith("text/html")
            assert "views-auditor:1" in page.text and "<script" not in page.text
    finally:
        await stop_all(bookies)


async def test_bookkeeper_reads_answer_as_the_bookie_http_server(zk: ZkClient) -> None:
    bookies = await seed(zk)
    ids = [b.bookie_id for b in bookies]
    try:
        async with serving(zk, "bk-views:1") as (_daemon, views):
            port = views.port
            who = await request(port, BK_WHO_IS_AUDITOR)
            assert (who.status, who.text) == (200, "Auditor: bk-views:1")

            urm = UnderreplicationManager(zk, ROOT)
            marks = [m async for m in urm.list_marks()]
            assert all(isinstance(m, UnderreplicatedLedger) for m in marks)
            listed = [m for m in marks if isinstance(m, UnderreplicatedLedger)]
            assert 3006 in [m.ledger_id for m in listed]

            got = await request(port, BK_LIST_UNDER_REPLICATED)
            assert got.status == 200
            assert got.body == json.dumps([m.ledger_id for m in listed]).replace(" ", "").encode()
            printed = await request(port, f"{BK_LIST_UNDER_REPLICATED}?printmissingreplica")
            assert printed.json() == {str(m.ledger_id): list(m.replicas) for m in listed}
            assert b" " not in printed.body  # Jackson's compact form

            lost = ids[5]
            with_5 = [m.ledger_id for m in listed if lost in m.replicas]
            got = await request(port, f"{BK_LIST_UNDER_REPLICATED}?missingreplica={lost}")
            assert got.json() == with_5
            without = [m.ledger_id for m in listed if lost not in m.replicas]
            got = await request(port, f"{BK_LIST_UNDER_REPLICATED}?excludingmissingreplica={lost}")
            if without:
                assert got.json() == without
            else:
                assert (got.status, got.text) == (404, "No under replicated ledgers found")
            both = f"?missingreplica={lost}&excludingmissingreplica={lost}"
            none = await request(port, BK_LIST_UNDER_REPLICATED + both)
            assert (none.status, none.text) == (404, "No under replicated ledgers found")
            blank = await request(port, f"{BK_LIST_UNDER_REPLICATED}?missingreplica=")
            assert blank.json() == [m.ledger_id for m in listed]  # blank: no filter
    finally:
        await stop_all(bookies)


async def test_protected_reads_need_the_token(zk: ZkClient) -> None:
    await ClusterWriter(zk, ROOT).init_cluster()
    extra = ["api.protect_reads=true", f"api.token={TOKEN}"]
    async with serving(zk, "guarded:1", extra, first_round=False) as (_daemon, views):
        port = views.port
        routes = ["/", "/status", "/reports/replicas", "/explain/1", BK_WHO_IS_AUDITOR]
        for path in routes:
            refused = await request(port, path)
            assert refused.status == 401, path
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert "Authorization: Bearer" in refused.json()["error"]
            wrong = await request(port, path, headers=[("Authorization", "Bearer nope")])
            assert wrong.status == 401 and "not valid" in wrong.json()["error"]
        good = [("Authorization", f"Bearer {TOKEN}")]
        assert (await request(port, "/status", headers=good)).status == 200
        assert (await request(port, "/", headers=good)).status == 200
        who = await request(port, BK_WHO_IS_AUDITOR, headers=good)
        assert who.status in (200, 404)


async def test_idle_connections_never_lock_requests_out(zk: ZkClient) -> None:
    """300 connections held open with nothing sent, or a request head trickled a byte at a
    time, against `api.http_max_connections=64` (the old hard-coded limit, which 64 such
    connections held shut): `/status` answers every time, each new request taking the
    place of the oldest idle connection; an idle connection is cut after the header
    timeout without an answer."""
    await ClusterWriter(zk, ROOT).init_cluster()
    extra = ["api.http_max_connections=64", "api.http_header_timeout=2"]
    async with serving(zk, "crowded:1", extra, first_round=False) as (_daemon, views):
        port = views.port
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for i in range(300):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                if i % 2:
                    writer.write(b"GET /status HT")  # a head that never ends
                    await writer.drain()
                held.append((reader, writer))
            for _ in range(5):
                reply = await request(port, "/status")
                assert reply.status == 200
                assert reply.json()["identity"] == "crowded:1"
            assert views.max_connections == 64
            # The oldest were closed to make room; the newest are cut by the header
            # timeout: every held connection ends, none with an answer.
            for reader, _ in held:
                assert await asyncio.wait_for(reader.read(), 10) == b""
        finally:
            for _, writer in held:
                writer.close()


async def test_client_certificates_open_protected_reads_over_https(
    zk: ZkClient, tmp_path: Path
) -> None:
    await ClusterWriter(zk, ROOT).init_cluster()
    ca = new_ca(tmp_path, "ca")
    server = issue(tmp_path, "server", ca, "localhost", ["IP:127.0.0.1"])
    client = issue(tmp_path, "client", ca, "operator")
    extra = [
        "api.protect_reads=true",
        f"api.tls_cert={server.cert}",
        f"api.tls_key={server.key}",
        f"api.tls_client_ca={ca.cert}",
    ]
    async with serving(zk, "mtls:1", extra, first_round=False) as (_daemon, views):
        ctx = ssl.create_default_context(cafile=str(ca.cert))
        ctx.load_cert_chain(str(client.cert), str(client.key))
        got = await request(views.port, "/status", tls=ctx)
        assert got.status == 200 and got.json()["identity"] == "mtls:1"
        # Without a certificate the handshake itself fails.
        bare = ssl.create_default_context(cafile=str(ca.cert))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await request(views.port, "/status", tls=bare)


async def test_views_are_off_unless_a_port_is_configured(zk: ZkClient) -> None:
    await ClusterWriter(zk, ROOT).init_cluster()
    cfg = fast_config(zk.hosts, "no-views:1")
    assert cfg.api.http_port == -1
    daemon = Daemon(cfg)
    started: list[Daemon] = []

    async def views_factory(d: Daemon) -> HttpViews:
        started.append(d)
        raise AssertionError("the views started with api.http_port = -1")

    run = asyncio.ensure_future(daemon.run(views_factory=views_factory, signals=False))
    try:
        await _until("leadership", lambda: daemon.state.is_leader or run.done(), 30)
        assert not run.done() and daemon.views is None and not started
    finally:
        daemon.stop()
        assert await asyncio.wait_for(run, 30) == 0


def test_http_port_is_validated() -> None:
    with pytest.raises(ConfigError, match="http_port"):
        fast_config("127.0.0.1:2181", "x:1", ["api.http_port=-2"])
    with pytest.raises(ConfigError, match="http_port"):
        fast_config("127.0.0.1:2181", "x:1", ["api.http_port=70000"])
    assert fast_config("127.0.0.1:2181", "x:1", ["api.http_port=9878"]).api.http_port == 9878


def test_the_page_escapes_what_it_shows() -> None:
    state = DaemonState(identity='<script>alert("x")</script>:1')
    state.leader = "<img src=x onerror=alert(1)>"
    state.lost_bookies = ("<b>bookie</b>:3181",)
    page = render_page(state)
    assert "<script" not in page and "<img" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;:1" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    # A follower says where the checks run.
    assert "Only the auditor runs checks; it is &lt;img src=x onerror=alert(1)&gt;." in page


async def test_bk_auditor_run_serves_the_views_on_api_http_port(zk: ZkClient) -> None:
    """As deployed: `bk-auditor run` processes; the follower points at the auditor."""
    http = [free_port(), free_port()]
    async with test_cluster(zk, 3), contextlib.AsyncExitStack() as stack:
        procs = [
            await stack.enter_async_context(
                daemons(zk.hosts, [name], "--set", f"api.http_port={port}")
            )
            for name, port in zip(["first", "second"], http, strict=True)
        ]
        leader = await leader_becomes(zk, {d.identity for p in procs for d in p}, 60)
        for port in http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    who = await request(port, BK_WHO_IS_AUDITOR)
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"nothing serves on {port}"
                    await asyncio.sleep(0.2)
            assert (who.status, who.text) == (200, f"Auditor: {leader}")
            # A node learns who leads from its watch on the election: soon, not at once.
            while (status := (await request(port, "/status")).json())["leader"] != leader:
                assert time.monotonic() < deadline, f"{status['identity']}: {status['leader']}"
                await asyncio.sleep(0.2)
            if status["identity"] != leader:
                report = await request(port, "/reports/replicas")
                assert report.status == 404
                assert f"the auditor is {leader}" in report.json()["error"]
