"""Prometheus series of the daemon, in a registry of its own, served from the event loop.

Every labelled counter is created at zero for every label value we know
(checks, categories, outcomes), so `increase()` sees the first violation and
absence-based alerts are not fooled by series that appear late.

The leader's series are the ones that count: alerts and the dashboard join
on `bookkeeper_auditor_is_leader == 1` for the per-run gauges, and a node that
steps down zeroes its `ledgers_in_violation` gauges so that summing across
nodes never counts a former leader's last run.

/metrics is answered by a small HTTP server on the asyncio loop rather than
prometheus_client's thread: a wedged loop then fails the scrape (`up == 0`)
instead of serving frozen numbers, and stopping is immediate.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import Callable, Sequence
from functools import partial
from importlib import metadata
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder, generate_latest

from auditor.analysis.risk import DOMAINS, SEVERITIES, RiskReport
from auditor.bookie.results import CannotList, ErrorStatus, NoAnswer, Ok
from auditor.checks.findings import ALL_CHECKS, CATEGORIES, DROP_CAUSES, Check, CheckReport

if TYPE_CHECKING:
    from auditor.selftest.harness import SelfTestResult

PREFIX = "bookkeeper_auditor"
OUTCOMES = ("ok", "violations", "failed", "skipped")
#: The bookie client's calls, as `op` label values.
BOOKIE_OPS = ("read_entry", "read_lac", "get_list_of_entries", "get_bookie_info")
#: Seconds: check runs take from seconds (bookies) to hours (replicas on large clusters).
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400)

_MAX_REQUEST_LINE = 8192
_IDLE_TIMEOUT = 60.0


def bookie_status(outcome: object) -> str:
    """The `status` label of one bookie call's outcome: ok, a status code name, or why silent."""
    if isinstance(outcome, Ok):
        return "ok"
    if isinstance(outcome, ErrorStatus):
        return outcome.status.name.lower()
    if isinstance(outcome, NoAnswer):
        return outcome.reason.value.replace(" ", "_")
    if isinstance(outcome, CannotList):
        return "cannot_list"
    return "unknown"


def _version() -> str:
    try:
        return metadata.version("bookkeeper-auditor")
    except metadata.PackageNotFoundError:
        return "unknown"


class Metrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._clock = clock
        self._violations = Counter(
            f"{PREFIX}_violations",
            "Ledgers in violation found by check runs, by category (once per ledger and run).",
            ["check", "category"],
            registry=r,
        )
        self._in_violation = Gauge(
            f"{PREFIX}_ledgers_in_violation",
            "Ledgers in violation found by the last completed run of the check (0 on followers).",
            ["check", "category"],
            registry=r,
        )
        self._duration = Histogram(
            f"{PREFIX}_check_duration_seconds",
            "Wall time of check runs that started (completed or failed).",
            ["check"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self._runs = Counter(
            f"{PREFIX}_check_runs",
            "Check runs by outcome: ok, violations, failed, skipped.",
            ["check", "outcome"],
            registry=r,
        )
        self._last_success = Gauge(
            f"{PREFIX}_check_last_success_timestamp_seconds",
            "Unix time the check last completed (with or without violations).",
            ["check"],
            registry=r,
        )
        self._dropped = Counter(
            f"{PREFIX}_would_be_violations_dropped",
            "Would-be violations not reported (ledgers), by check and cause: metadata "
            "changed, ledger deleted, retry succeeded, marked meanwhile, bookie returned.",
            ["check", "cause"],
            registry=r,
        )
        self._age = Gauge(
            f"{PREFIX}_check_last_success_age_seconds",
            "Seconds since the check last completed (this node or, after a fail-over, the "
            "leader before it); before any completion, since this node started or was elected.",
            ["check"],
            registry=r,
        )
        #: Last completion per check, and since when this node waits for a first one.
        self._success_at: dict[str, float] = {}
        self._waiting_since = clock()
        self._interval = Gauge(
            f"{PREFIX}_check_interval_seconds",
            "Configured period of the check (0: not periodic), for the staleness alert.",
            ["check"],
            registry=r,
        )
        self._is_leader = Gauge(
            f"{PREFIX}_is_leader", "1 while this daemon is the auditor, else 0.", registry=r
        )
        self._elected = Gauge(
            f"{PREFIX}_leader_elected",
            "1 while this node sees an elected auditor (this daemon, another, or a Java one).",
            registry=r,
        )
        self._elections = Counter(
            f"{PREFIX}_election_attempts",
            "Times this daemon entered the auditor election.",
            registry=r,
        )
        self._marked = Counter(
            f"{PREFIX}_ledgers_marked_underreplicated",
            "Ledgers this daemon marked under-replicated, by the check that marked them.",
            ["reason"],
            registry=r,
        )
        self._bookie_requests = Counter(
            f"{PREFIX}_bookie_requests",
            "Requests to bookies by operation and outcome.",
            ["op", "status"],
            registry=r,
        )
        self._retry_queue = Gauge(
            f"{PREFIX}_retry_queue_ledgers",
            "Potentially faulty ledgers waiting to be checked again.",
            registry=r,
        )
        self._lost_bookies = Gauge(
            f"{PREFIX}_lost_bookies",
            "Bookies named in ledger metadata that are neither writable nor read-only.",
            registry=r,
        )
        self._underreplicated = Gauge(
            f"{PREFIX}_underreplicated_ledgers",
            "Ledgers currently marked under-replicated in ZooKeeper.",
            registry=r,
        )
        self._replication_enabled = Gauge(
            f"{PREFIX}_replication_enabled",
            "0 while BookKeeper's autorecovery 'disable' flag is set, else 1.",
            registry=r,
        )
        self._index_ledgers = Gauge(
            f"{PREFIX}_index_ledgers",
            "Ledgers in the leader's metadata index (0 when there is none).",
            registry=r,
        )
        self._index_bytes = Gauge(
            f"{PREFIX}_index_bytes_per_ledger",
            "Memory of the metadata index per ledger, as of its last full load.",
            registry=r,
        )
        self._index_loads = Counter(
            f"{PREFIX}_index_loads",
            "Full reads of every ledger into the metadata index (the first, and after gaps).",
            registry=r,
        )
        self._index_resyncs = Counter(
            f"{PREFIX}_index_resyncs",
            "Times the index's watch was lost (connection or session) and it re-read everything.",
            registry=r,
        )
        self._build = Gauge(
            f"{PREFIX}_build_info", "The running version, as a label.", ["version"], registry=r
        )
        self._selftest_success = Gauge(
            f"{PREFIX}_selftest_success",
            "1 when the last detector self-test of the check (or canary) found every "
            "known defect exactly, else 0; set by the leader.",
            ["check"],
            registry=r,
        )
        self._selftest_last_run = Gauge(
            f"{PREFIX}_selftest_last_run_timestamp_seconds",
            "Unix time of the leader's last detector self-test.",
            registry=r,
        )
        self._selftest_interval = Gauge(
            f"{PREFIX}_selftest_interval_seconds",
            "Configured period of the leader's self-test (0: off), for the staleness alert.",
            registry=r,
        )

        self._at_risk = Gauge(
            f"{PREFIX}_ledgers_at_risk",
            "Closed ledgers the loss of this bookie, rack or region would leave with some "
            "entry below its ack quorum or with no copy, for the top domains of the last "
            "risk report (leader only).",
            ["domain", "name", "severity"],
            registry=r,
        )
        self._risk_last_run = Gauge(
            f"{PREFIX}_risk_last_run_timestamp_seconds",
            "Unix time the leader's last risk report finished.",
            registry=r,
        )

        for check in ALL_CHECKS:
            for category in CATEGORIES[check]:
                self._violations.labels(str(check), str(category))
                self._in_violation.labels(str(check), str(category)).set(0)
        for check in ALL_CHECKS:
            self._duration.labels(str(check))
            for outcome in OUTCOMES:
                self._runs.labels(str(check), outcome)
            self._marked.labels(str(check))
            for cause in DROP_CAUSES[check]:
                self._dropped.labels(str(check), str(cause))
            self._age.labels(str(check)).set_function(partial(self._age_of, str(check)))
        for op in BOOKIE_OPS:
            self._bookie_requests.labels(op, "ok")
        self._replication_enabled.set(1)
        self._build.labels(_version()).set(1)

        self._leader = False
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self.http_port: int | None = None

    # --- what the daemon reports ------------------------------------------------

    def record_report(self, report: CheckReport, duration_s: float) -> None:
        """A completed run: counters grow by this run's ledgers, gauges become this run's."""
        check = str(report.check)
        for category, n in report.counts().items():
            if n:
                self._violations.labels(check, category).inc(n)
            self._in_violation.labels(check, category).set(n)
        self._duration.labels(check).observe(max(duration_s, 0.0))
        self._runs.labels(check, "violations" if report.has_violations else "ok").inc()
        self._last_success.labels(check).set(report.finished_at or time.time())
        self._succeeded(check, report.finished_at or self._clock())
        for cause, n in report.dropped.items():
            if n:
                self._dropped.labels(check, cause).inc(n)
        marked = len(set(report.marked_underreplicated))
        if marked:
            self._marked.labels(check).inc(marked)
        if report.check is Check.BOOKIES:
            self._lost_bookies.set(len(set(report.lost_bookies)))

    def record_failure(self, check: Check, duration_s: float) -> None:
        self._duration.labels(str(check)).observe(max(duration_s, 0.0))
        self._runs.labels(str(check), "failed").inc()

    def record_skip(self, check: Check) -> None:
        self._runs.labels(str(check), "skipped").inc()

    def set_last_success(self, check: Check, timestamp: float) -> None:
        """For a new leader: the check's stored ctime, so staleness survives a failover."""
        self._last_success.labels(str(check)).set(timestamp)
        self._succeeded(str(check), timestamp)

    def _succeeded(self, check: str, timestamp: float) -> None:
        self._success_at[check] = max(self._success_at.get(check, timestamp), timestamp)

    def _age_of(self, check: str) -> float:
        """Computed at scrape time, so a check that stopped completing shows it at once."""
        since = self._success_at.get(check, self._waiting_since)
        return max(self._clock() - since, 0.0)

    def set_check_interval(self, check: Check, seconds: float) -> None:
        self._interval.labels(str(check)).set(seconds)

    def set_selftest_interval(self, seconds: float) -> None:
        self._selftest_interval.set(seconds)

    def set_leader(self, is_leader: bool) -> None:
        was, self._leader = self._leader, is_leader
        if is_leader and not was:
            self._waiting_since = self._clock()
        self._is_leader.set(1 if is_leader else 0)
        if was and not is_leader:
            for check in ALL_CHECKS:
                for category in CATEGORIES[check]:
                    self._in_violation.labels(str(check), str(category)).set(0)
            self._at_risk.clear()  # a former leader's risk must not add up with the new one's

    def set_leader_elected(self, elected: bool) -> None:
        self._elected.set(1 if elected else 0)

    def election_attempt(self) -> None:
        self._elections.inc()

    def bookie_request(self, op: str, status: str) -> None:
        self._bookie_requests.labels(op, status).inc()

    def index_loaded(self, ledgers: int, bytes_per_ledger: float) -> None:
        self._index_loads.inc()
        self._index_ledgers.set(ledgers)
        self._index_bytes.set(round(bytes_per_ledger, 1))

    def index_resynced(self) -> None:
        self._index_resyncs.inc()

    def set_index_ledgers(self, n: int) -> None:
        self._index_ledgers.set(n)

    def set_retry_queue(self, n: int) -> None:
        self._retry_queue.set(n)

    def set_lost_bookies(self, n: int) -> None:
        self._lost_bookies.set(n)

    def set_underreplicated(self, n: int) -> None:
        self._underreplicated.set(n)

    def set_replication_enabled(self, enabled: bool) -> None:
        self._replication_enabled.set(1 if enabled else 0)

    def record_selftest(self, results: Sequence[SelfTestResult], at: float) -> None:
        """One self-test (or canary) run: 1/0 per check it covered."""
        for r in results:
            self._selftest_success.labels(r.check).set(1 if r.ok else 0)
        self._selftest_last_run.set(at)

    def record_risk(self, report: RiskReport, top: int) -> None:
        """The top `top` domains of each kind, both severities; the last report's only."""
        self._at_risk.clear()
        for domain in DOMAINS:
            for name, tally in report.top(domain, top):
                for sev in SEVERITIES:
                    self._at_risk.labels(str(domain), name, sev.label).set(tally.counts[sev])
        self._risk_last_run.set(report.finished_at or self._clock())

    def exposition(self) -> bytes:
        """The text format (0.0.4), as a scrape without an Accept header gets it."""
        return generate_latest(self.registry)

    # --- /metrics ---------------------------------------------------------------

    async def start_http(self, host: str, port: int) -> None:
        """Serves /metrics on the running loop; port 0 picks a free one (see `http_port`)."""
        if self._server is not None:
            raise RuntimeError("the metrics endpoint is already serving")
        self._server = await asyncio.start_server(self._serve, host, port, limit=_MAX_REQUEST_LINE)
        self.http_port = int(self._server.sockets[0].getsockname()[1])

    def stop_http(self) -> None:
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
