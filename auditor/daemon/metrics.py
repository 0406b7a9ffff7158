"""Prometheus series of the daemon, read from its state when scraped.

Why a collector: the daemon records facts in `DaemonState` (and its `Tallies`)
unconditionally; the series are computed from them at scrape time, so nothing is
pushed behind "is there a metrics object" guards, and `status` and /metrics can
never disagree. Names, types and labels are the ones alerts, promtool tests and
the dashboard rely on.

Every labelled counter exists at zero for every label value we know (checks,
categories, outcomes, decision reasons), so `increase()` sees the first event and
absence-based alerts are not fooled by series that appear late.

The leader's series are the ones that count: alerts and the dashboard join on
`bookkeeper_auditor_is_leader == 1` for the per-run gauges, and a node that steps
down zeroes its `ledgers_in_violation` and invalid-znode gauges so that summing
across nodes never counts a former leader's last run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from importlib import metadata

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from auditor.bookie.results import CannotList, ErrorStatus, NoAnswer, Ok
from auditor.daemon.leadership import Reason
from auditor.daemon.metrics_http import MetricsServer
from auditor.daemon.state import DaemonState
from auditor.daemon.tallies import BOOKIE_OPS, COVERAGE_HOW, DURATION_BUCKETS, OUTCOMES
from auditor.worker.risk import BUCKETS
from auditor.worker.state import Failure

__all__ = ["BOOKIE_OPS", "DURATION_BUCKETS", "OUTCOMES", "ZNODES", "Metrics", "bookie_status"]

PREFIX = "bookkeeper_auditor"
#: Znodes whose bad values the daemon contains (and says so in `znode_invalid`).
ZNODES = (
    "lostBookieRecoveryDelay",
    "checkallledgersctime",
    "placementpolicycheckctime",
    "replicascheckctime",
)


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


def _le(bound: float) -> str:
    """A bucket bound as prometheus_client writes it ("60.0", "+Inf")."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _labelled(
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
    name: str,
    doc: str,
    labels: list[str],
    rows: Iterable[tuple[tuple[str, ...], float]],
) -> Metric:
    family = kind(f"{PREFIX}_{name}", doc, labels=labels)
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


def _worker_series(state: DaemonState) -> Iterator[Metric]:
    """The replication worker's series (BookKeeper's `replication_worker_*` scope)."""
    w = state.worker
    yield _gauge(
        "worker_running", "1 while this daemon's replication worker runs, else 0.", int(w.running)
    )
    for name, doc, value in [
        (
            "worker_ledgers_replicated",
            "Ledgers this worker re-replicated and unmarked.",
            w.ledgers_replicated,
        ),
        (
            "worker_ledgers_found_healthy",
            "Marked ledgers this worker found with every copy (nothing to copy) and unmarked.",
            w.ledgers_found_healthy,
        ),
        (
            "worker_fragments_replicated",
            "Fragments (segment positions) copied and committed to metadata.",
            w.fragments_replicated,
        ),
        (
            "worker_ledgers_recovered",
            "Open ledgers this worker fenced, recovered and closed before copying.",
            w.ledgers_recovered,
        ),
        ("worker_recoveries_failed", "Open-ledger recoveries that failed.", w.recoveries_failed),
        ("worker_entries_read", "Entries read (and verified) for copies.", w.entries_read),
        ("worker_entries_written", "Entries acknowledged by target bookies.", w.entries_written),
        ("worker_bytes_read", "Entry bytes read for copies.", w.bytes_read),
        ("worker_bytes_written", "Entry bytes acknowledged by target bookies.", w.bytes_written),
        (
            "worker_lock_held_seconds",
            "Seconds replication locks were held, summed.",
            w.lock_seconds,
        ),
        ("worker_locks_released", "Replication locks released.", w.locks_released),
        (
            "worker_entries_reverified",
            "Entries read back from bookies a mark names before calling a ledger whole.",
            w.entries_reverified,
        ),
    ]:
        yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)
    yield _labelled(
        CounterMetricFamily,
        "worker_fragments_replicated_by_reason",
        "Fragments committed, by why their bookie was replaced (lost, missing_entries, "
        "requested, not_adhering, corrupt_copy, unreadable_copy).",
        ["reason"],
        (((why,), n) for why, n in sorted(w.fragments_by_reason.items())),
    )
    yield _labelled(
        CounterMetricFamily,
        "worker_failures",
        "Ledgers whose repair did not finish, by reason (no_target, target_failed, "
        "unrecoverable, source_failed, unknown_bookies, metadata_conflict, verify_failed, "
        "lock_lost, open_ledger, error).",
        ["reason"],
        (((str(f),), w.failures[f]) for f in Failure),
    )
    yield _gauge(
        "worker_unrecoverable_ledgers",
        "Ledgers with entries no bookie can serve, as this worker last found them (marks kept).",
        len(w.unrecoverable),
    )
    yield _gauge(
        "worker_ledgers_in_hand",
        "Ledgers whose replication lock this worker holds (copying, or deferred).",
        len(w.in_hand),
    )
    yield _gauge(
        "worker_copies_in_flight", "Ledgers this worker is copying now.", w.copies_in_flight
    )
    q = w.queue
    if q is None:
        return  # not ranked yet (or no worker): absent, not a queue of zero
    yield _labelled(
        GaugeMetricFamily,
        "worker_marked_ledgers",
        "Marked ledgers by the copies their worst entry has left (0, 1, 2, 3+; unknown: "
        "the ledger's metadata is gone or does not decode), as this worker last ranked "
        "them for its take order. Every worker ranks every mark: take the max across "
        "daemons, not the sum.",
        ["copies_left"],
        (((b,), q.by_copies.get(b, 0)) for b in BUCKETS),
    )
    now = state.tallies.clock()
    yield _labelled(
        GaugeMetricFamily,
        "worker_oldest_marked_ledger_age_seconds",
        "Seconds since the oldest mark of each copies_left bucket was made or last grew "
        "(its ctime field, else the znode's), 0 for an empty bucket: how long the ledgers "
        "closest to loss have waited for a worker.",
        ["copies_left"],
        (((b,), max(now - q.oldest[b], 0.0) if b in q.oldest else 0.0) for b in BUCKETS),
    )


def _scrub_series(state: DaemonState) -> Iterator[Metric]:
    """The continuous deep scrub's series; its findings are `violations{check="scrub"}`.
    The cycle's gauges exist on the leader while the scrub runs (`[scrub] continuous`)."""
    yield CounterMetricFamily(
        f"{PREFIX}_scrub_bytes_verified",
        "Payload bytes the continuous deep scrub verified on this node (every copy counted).",
        value=state.tallies.scrub_bytes_verified,
    )
    s = state.scrub
    if s is None:
        return
    yield _gauge("scrub_cycle", "The deep scrub's cycle number (from 1).", s.cycle)
    yield _gauge(
        "scrub_cycle_verified_ratio",
        "Share of the cluster the deep scrub verified in its current cycle (0..1): bytes "
        "against the last cycle's, by ledger ids in the first cycle.",
        s.share,
    )
    yield _gauge(
        "scrub_cycle_started_timestamp_seconds",
        "Unix time the deep scrub's current cycle started.",
        s.started,
    )
    yield _gauge(
        "scrub_interval_seconds",
        "scrub.interval: the cycle's target length (a cycle ending after started + this overran).",
        s.interval,
    )
    if s.expected_end is not None:
        yield _gauge(
            "scrub_cycle_expected_end_timestamp_seconds",
            "Unix time the deep scrub's cycle should end at its rate so far (when it ended, "
            "once done); absent until known.",
            s.expected_end,
        )


class _StateCollector(Collector):
    """Every series, computed from one `DaemonState` when collected."""

    def __init__(self, owner: Metrics) -> None:
        self._owner = owner
        self._version = _version()

    def collect(self) -> Iterator[Metric]:
        state = self._owner.state
        t = state.tallies
        yield _labelled(
            CounterMetricFamily,
            "violations",
            "Ledgers in violation found by check runs, by category (once per ledger and run).",
            ["check", "category"],
            sorted(t.violations.items()),
        )
        yield _labelled(
            GaugeMetricFamily,
            "ledgers_in_violation",
            "Ledgers in violation found by the last completed run of the check (0 on followers).",
            ["check", "category"],
            sorted(t.in_violation.items()),
        )
        durations = HistogramMetricFamily(
            f"{PREFIX}_check_duration_seconds",
            "Wall time of check runs that started (completed or failed).",
            labels=["check"],
        )
        for check, h in sorted(t.durations.items()):
            buckets = [(_le(b), float(n)) for b, n in h.cumulative()]
            durations.add_metric([check], buckets, h.total)
        yield durations
        yield _labelled(
            CounterMetricFamily,
            "check_runs",
            "Check runs by outcome: ok, violations, failed, skipped.",
            ["check", "outcome"],
            sorted(t.runs.items()),
        )
        yield _labelled(
            GaugeMetricFamily,
            "check_consecutive_failures",
            "Failed runs of the check since its last completed one (0 on followers and "
            "after a completion), for the alert that waits for several in a row.",
            ["check"],
            (((c,), n) for c, n in sorted(t.consecutive_failures.items())),
        )
        yield _labelled(
            GaugeMetricFamily,
            "check_last_success_timestamp_seconds",
            "Unix time the check last completed (with or without violations).",
            ["check"],
            (((c,), ts) for c, ts in sorted(t.last_success.items())),
        )
        yield _labelled(
            CounterMetricFamily,
            "would_be_violations_dropped",
            "Would-be violations not reported (ledgers), by check and cause: metadata "
            "changed, ledger deleted, retry succeeded, marked meanwhile, bookie returned.",
            ["check", "cause"],
            sorted(t.dropped.items()),
        )
        yield _labelled(
            GaugeMetricFamily,
            "check_last_success_age_seconds",
            "Seconds since the check last completed (this node or, after a fail-over, the "
            "leader before it); before any completion, since this node started or was elected.",
            ["check"],
            (((c,), t.age_of(c)) for c in t.durations),
        )
        yield _labelled(
            GaugeMetricFamily,
            "cluster_check_last_completed_timestamp_seconds",
            "Unix time the check last completed anywhere in the cluster (any auditor, Java "
            "or ours), from its ctime znode; seen by every daemon, absent while unknown.",
            ["check"],
            (((str(c),), ts) for c, ts in sorted(state.cluster_checks.items())),
        )
        yield _labelled(
            GaugeMetricFamily,
            "check_interval_seconds",
            "Configured period of the check (0: not periodic), for the staleness alert.",
            ["check"],
            (((c,), s) for c, s in sorted(t.intervals.items())),
        )
        yield from _scrub_series(state)
        yield _gauge(
            "is_leader", "1 while this daemon is the auditor, else 0.", 1 if state.is_leader else 0
        )
        yield _gauge(
            "leader_elected",
            "1 while this node sees an elected auditor (this daemon, another, or a Java one).",
            1 if state.leader is not None else 0,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_election_attempts",
            "Times this daemon entered the auditor election.",
            value=t.election_attempts,
        )
        # --- the ZooKeeper session -----------------------------------------------------
        yield _gauge(
            "zookeeper_connected",
            "1 while this daemon's ZooKeeper connection is up, else 0 (suspended, or the "
            "session lost and not yet replaced).",
            1 if state.zk_connected else 0,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_zookeeper_reconnects",
            "Times the ZooKeeper connection came back after a suspension or a lost session "
            "(the first connection does not count).",
            value=t.zk_reconnects,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_zookeeper_suspensions",
            "Times the ZooKeeper connection dropped (SUSPENDED: the session may live on).",
            value=t.zk_suspensions,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_zookeeper_sessions_lost",
            "Times the ZooKeeper session was lost (LOST: expired or closed; this daemon's "
            "vote and ephemeral nodes are gone).",
            value=t.zk_sessions_lost,
        )
        yield _labelled(
            CounterMetricFamily,
            "ledgers_marked_underreplicated",
            "Ledgers this daemon marked under-replicated, by the check that marked them.",
            ["reason"],
            (((c,), n) for c, n in sorted(t.marked.items())),
        )
        yield _labelled(
            CounterMetricFamily,
            "bookie_requests",
            "Requests to bookies by operation and outcome.",
            ["op", "status"],
            sorted(t.bookie_requests.items()),
        )
        running = sorted(
            (str(c), cs.progress) for c, cs in state.checks.items() if cs.progress is not None
        )
        yield _labelled(
            GaugeMetricFamily,
            "check_progress_ledgers",
            "Ledgers the running check has walked so far (in process); absent while the "
            "check does not run.",
            ["check"],
            (((c,), p.done) for c, p in running),
        )
        yield _labelled(
            GaugeMetricFamily,
            "check_progress_total",
            "Ledgers the running check's walk will see: the metadata index's size "
            '(total_kind="ledgers") or an estimate from the largest ledger id '
            '(total_kind="max_ledger_id"); absent while the check does not run or the '
            "total is unknown.",
            ["check", "total_kind"],
            (((c, p.total_kind), p.total) for c, p in running if p.total is not None),
        )
        yield _labelled(
            GaugeMetricFamily,
            "replicas_coverage_pairs",
            "(ledger, bookie) pairs of the last completed replicas run, by how they were "
            "verified: listed (the bookie's entry list), probed (entries read), unverified "
            "(neither); 0 before a run and on followers.",
            ["how"],
            (((how,), t.replicas_coverage.get(how, 0)) for how in COVERAGE_HOW),
        )
        yield _gauge(
            "retry_queue_ledgers",
            "Potentially faulty ledgers waiting to be checked again.",
            state.retry_queue,
        )
        yield _gauge(
            "lost_bookies",
            "Bookies named in ledger metadata that are neither writable nor read-only.",
            len(set(state.lost_bookies)),
        )
        yield _gauge(
            "underreplicated_ledgers",
            "Ledgers currently marked under-replicated in ZooKeeper.",
            t.underreplicated,
        )
        yield _gauge(
            "underreplication_marks_invalid",
            "Corrupt under-replication marks the last grace run named (data that does not "
            "decode, a name that is no valid ledger id, a mark out of its place).",
            t.marks_invalid,
        )
        yield _labelled(
            GaugeMetricFamily,
            "invalid_znodes",
            "Invalid znodes named by the last completed run of the check: corrupt marks "
            "(grace), ledger znodes whose path spells no valid id (the walking checks).",
            ["check"],
            (((c,), n) for c, n in sorted(t.invalid_znodes.items())),
        )
        yield _gauge(
            "replication_enabled",
            "0 while BookKeeper's autorecovery 'disable' flag is set, else 1.",
            1 if state.replication_enabled else 0,
        )
        yield _gauge(
            "index_ledgers",
            "Ledgers in this node's metadata index: the leader's, or a follower's standby "
            "index (0 when it holds none).",
            t.index_ledgers,
        )
        yield _gauge(
            "index_bytes_per_ledger",
            "Memory of the metadata index per ledger, as of its last full load.",
            t.index_bytes_per_ledger,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_index_loads",
            "Full reads of every ledger into the metadata index (the first, and after gaps).",
            value=t.index_loads,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_index_resyncs",
            "Times the index's watch was lost (connection or session) and it re-read everything.",
            value=t.index_resyncs,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_index_failures",
            "Times the metadata index stopped on an error it does not retry; checks walk "
            "ZooKeeper until it is loaded again.",
            value=t.index_failures,
        )
        yield _labelled(
            GaugeMetricFamily,
            "build_info",
            "The running version, as a label.",
            ["version"],
            [((self._version,), 1)],
        )
        yield _labelled(
            GaugeMetricFamily,
            "selftest_success",
            "1 when the last detector self-test of the check (or canary) found every "
            "known defect exactly, else 0; set by the leader.",
            ["check"],
            (((c,), ok) for c, ok in t.selftest_success.items()),
        )
        yield _gauge(
            "selftest_last_run_timestamp_seconds",
            "Unix time of the leader's last detector self-test.",
            t.selftest_last_run,
        )
        yield _gauge(
            "selftest_interval_seconds",
            "Configured period of the leader's self-test (0: off), for the staleness alert.",
            t.selftest_interval,
        )
        yield _labelled(
            GaugeMetricFamily,
            "ledgers_at_risk",
            "Closed ledgers the loss of this bookie, rack or region would leave with some "
            "entry below its ack quorum or with no copy, for the top domains of the last "
            "risk report (leader only).",
            ["domain", "name", "severity"],
            t.at_risk.items(),
        )
        yield _gauge(
            "risk_last_run_timestamp_seconds",
            "Unix time the leader's last risk report finished.",
            t.risk_last_run,
        )
        # --- the Pulsar audit ([pulsar] interval) -----------------------------------------
        yield _labelled(
            GaugeMetricFamily,
            "pulsar_ledgers",
            "Ledgers of the last Pulsar audit per namespace, by state (referenced, missing, "
            "dangling_cursor, orphan, underreplicated, unplaced): the [pulsar] top "
            'namespaces, the rest summed under pulsar_namespace="other" (leader only). '
            "Not `namespace`: Kubernetes' target label has that name.",
            ["pulsar_namespace", "state"],
            sorted(t.pulsar_ledgers.items()),
        )
        yield _labelled(
            GaugeMetricFamily,
            "pulsar_bytes",
            "Bytes of those ledgers (known sizes: closed ledgers, else what Pulsar recorded), "
            "by Pulsar namespace and state (referenced, missing, orphan, underreplicated, "
            "unplaced).",
            ["pulsar_namespace", "state"],
            sorted(t.pulsar_bytes.items()),
        )
        yield _gauge(
            "pulsar_last_run_timestamp_seconds",
            "Unix time the leader's last Pulsar audit finished (0: none yet).",
            t.pulsar_last_run,
        )
        # --- leadership and contained znodes ------------------------------------------
        yield _labelled(
            CounterMetricFamily,
            "leadership_decisions",
            "Leadership decisions of this daemon, by reason (elected, session_lost, "
            "leader_work_failed, ...; see the runbook).",
            ["reason"],
            (((str(r),), state.decision_counts[r]) for r in Reason),
        )
        backoff = (
            max(state.backoff_until - t.clock(), 0.0) if state.backoff_until is not None else 0.0
        )
        yield _gauge(
            "election_backoff_seconds",
            "Seconds until this daemon votes again after a failure (0 when not backing off).",
            backoff,
        )
        yield _gauge(
            "election_vote_unreadable",
            "1 while the election is held by a live vote (or Pulsar leader key) whose bytes "
            "do not decode: no auditor runs, Java's nor ours, while its session lives.",
            1 if state.unreadable_vote is not None else 0,
        )
        yield _gauge(
            "zk_open_acl_znodes",
            "How many znodes the auditor relies on (the ledgers root, LAYOUT, available, "
            "the under-replication tree) let unauthenticated clients change them, as read at "
            "the last connect with credentials; 0 without credentials.",
            len(state.open_acls),
        )
        yield _gauge(
            "duplicate_identity",
            "1 while another ZooKeeper session holds a vote with this daemon's identity "
            "(this daemon then refuses to vote), else 0.",
            1 if state.duplicate_vote is not None else 0,
        )
        yield _labelled(
            GaugeMetricFamily,
            "election_info",
            "1, labelled with the election this daemon takes part in: bookkeeper (votes "
            "under underreplication/auditorelection) or pulsar (the key "
            "underreplication/leader of Pulsar's metadata driver).",
            ["election"],
            [((state.election,), 1)],
        )
        other = state.other_election
        yield _labelled(
            GaugeMetricFamily,
            "other_election_leader",
            "1 while the other metadata driver's election (the label) has a live holder: the "
            "cluster's nodes disagree on the driver, and this daemon stays out of leadership.",
            ["election"],
            [
                ((e,), 1 if other is not None and other.election == e else 0)
                for e in ("bookkeeper", "pulsar")
                if e != state.election
            ],
        )
        yield from _worker_series(state)
        names = dict.fromkeys((*ZNODES, *sorted(state.invalid_znodes)))
        yield _labelled(
            GaugeMetricFamily,
            "znode_invalid",
            "1 while the named znode holds a value the daemon cannot use (it logs one "
            "warning per value and falls back: see the runbook), else 0.",
            ["znode"],
            (((z,), 1 if z in state.invalid_znodes else 0) for z in names),
        )


class Metrics:
    """The daemon's registry: series from a `DaemonState`, and the /metrics endpoint.

    Built without a state it shows a fresh one; the daemon binds its own (`bind`).
    """

    def __init__(
        self, state: DaemonState | None = None, registry: CollectorRegistry | None = None
    ) -> None:
        self.state = state if state is not None else DaemonState(identity="")
        self.registry = registry if registry is not None else CollectorRegistry()
        self.registry.register(_StateCollector(self))
        # process_resident_memory_bytes, process_open_fds, process_cpu_seconds_total, ...
        # (Linux only: the collector reads /proc and yields nothing elsewhere). A registry
        # that has them already (prometheus_client's global one) keeps its own.
        with contextlib.suppress(ValueError):
            self.registry.register(ProcessCollector(registry=None))
        self._http = MetricsServer(self.registry)

    def bind(self, state: DaemonState) -> None:
        """Shows `state` from now on (the daemon's own)."""
        self.state = state

    @property
    def http_port(self) -> int | None:
        return self._http.http_port

    def exposition(self) -> bytes:
        """The text format (0.0.4), as a scrape without an Accept header gets it."""
        return generate_latest(self.registry)

    async def start_http(self, host: str, port: int) -> None:
        """Serves /metrics on the running loop; port 0 picks a free one (see `http_port`)."""
        await self._http.start(host, port)

    def stop_http(self) -> None:
        """Stops listening and drops open connections; safe to call twice."""
        self._http.stop()
