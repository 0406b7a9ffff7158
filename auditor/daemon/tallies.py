"""The counts and last values behind the daemon's metrics, as plain numbers.

Why: the metrics endpoint reads the daemon's state when it is scraped (a custom
collector, `auditor.daemon.metrics`), so the daemon records what happened here,
unconditionally and with no Prometheus types: with or without an HTTP endpoint, in
tests and for `status`, the numbers are the same. Counters only grow; gauges hold
the last value; a step-down zeroes what only the leader's series may show.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from auditor.analysis.risk import DOMAINS, SEVERITIES, RiskReport
from auditor.checks.findings import ALL_CHECKS, CATEGORIES, DROP_CAUSES, Check, CheckReport
from auditor.checks.pulsar_audit import Counts, PulsarAudit, Rollup

if TYPE_CHECKING:
    from auditor.selftest.harness import SelfTestResult

#: Run outcomes, as the `outcome` label of the runs counter.
OUTCOMES = ("ok", "violations", "failed", "skipped")
#: The bookie client's calls, as `op` label values.
BOOKIE_OPS = ("read_entry", "read_lac", "get_list_of_entries", "get_bookie_info")
#: How the replicas check verified its (ledger, bookie) pairs (`Coverage`'s fields).
COVERAGE_HOW = ("listed", "probed", "unverified")
#: Seconds: check runs take from seconds (bookies) to hours (replicas on large clusters).
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400)


#: The `state` label of the `pulsar_ledgers` series: what is wrong with the ledgers
#: (`referenced`: every ledger Pulsar's metadata names, whatever its state).
PULSAR_STATES = (
    "referenced",
    "missing",
    "dangling_cursor",
    "orphan",
    "underreplicated",
    "unplaced",
)
#: The `state` label of `pulsar_bytes` (a dangling cursor's ledger has no size).
PULSAR_BYTE_STATES = ("referenced", "missing", "orphan", "underreplicated", "unplaced")
#: The namespace label the namespaces past `[pulsar] top` are summed under (Pulsar's
#: namespaces are `tenant/ns`, so none is named so).
OTHER_NAMESPACE = "other"


def _pulsar_counts(c: Counts) -> tuple[dict[str, int], dict[str, int]]:
    ledgers = {
        "referenced": c.ledgers,
        "missing": c.missing,
        "dangling_cursor": c.dangling_cursors,
        "orphan": c.orphans,
        "underreplicated": c.under_replicated,
        "unplaced": c.unplaced,
    }
    size = {
        "referenced": c.bytes,
        "missing": c.missing_bytes,
        "orphan": c.orphan_bytes,
        "underreplicated": c.under_replicated_bytes,
        "unplaced": c.unplaced_bytes,
    }
    return ledgers, size


def pulsar_rows(
    rollup: Rollup, top: int
) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """(namespace, state) -> ledgers and -> bytes: the `top` worst namespaces (the
    rollup's order: data lost, then at risk, then leaked, then size), and every other
    one summed under `OTHER_NAMESPACE` (always present, so the label set is bounded and
    stable: at most `top` + 1 namespaces)."""
    ordered = sorted(rollup.namespaces.items(), key=lambda kv: (kv[1].weight(), kv[0]))
    other = Counts()
    for _, c in ordered[top:]:
        other.merge(c)
    ledgers: dict[tuple[str, str], int] = {}
    size: dict[tuple[str, str], int] = {}
    for ns, c in [*ordered[:top], (OTHER_NAMESPACE, other)]:
        by_state, bytes_by_state = _pulsar_counts(c)
        for state in PULSAR_STATES:
            ledgers[ns, state] = by_state[state]
        for state in PULSAR_BYTE_STATES:
            size[ns, state] = bytes_by_state[state]
    return ledgers, size


@dataclass
class Histogram:
    """Observations by upper bound (not cumulative; the last slot is +Inf)."""

    bounds: tuple[float, ...] = tuple(float(b) for b in DURATION_BUCKETS)
    counts: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), +Inf last."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass
class Tallies:
    """What the metrics export beyond `DaemonState`'s own fields."""

    clock: Callable[[], float] = time.time
    created: float = 0.0
    violations: Counter[tuple[str, str]] = field(default_factory=Counter)
    in_violation: dict[tuple[str, str], int] = field(default_factory=dict)
    durations: dict[str, Histogram] = field(default_factory=dict)
    runs: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Failed runs of each check since its last completed one (0 after a completion,
    #: and on a node that steps down), for the alert that waits for several in a row.
    consecutive_failures: dict[str, int] = field(default_factory=dict)
    #: The last success per check (absent: unknown), as the timestamp gauge shows it.
    last_success: dict[str, float] = field(default_factory=dict)
    #: The latest known success per check, for the staleness gauge.
    success_at: dict[str, float] = field(default_factory=dict)
    #: Since when this node waits for a first success (its start, then each election).
    waiting_since: float = 0.0
    intervals: dict[str, float] = field(default_factory=dict)
    dropped: Counter[tuple[str, str]] = field(default_factory=Counter)
    marked: Counter[str] = field(default_factory=Counter)
    bookie_requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    election_attempts: int = 0
    #: The size of the metadata index this node holds now (the leader's, or a
    #: follower's standby index), read at scrape time; None while it holds none.
    index_size: Callable[[], int] | None = None
    index_bytes_per_ledger: float = 0.0
    index_loads: int = 0
    index_resyncs: int = 0
    #: Times the index stopped on an error it does not retry (checks then walk
    #: ZooKeeper until a new one is loaded).
    index_failures: int = 0
    selftest_success: dict[str, int] = field(default_factory=dict)
    selftest_last_run: float = 0.0
    selftest_interval: float = 0.0
    at_risk: dict[tuple[str, str, str], float] = field(default_factory=dict)
    #: The last Pulsar audit's (namespace, state) -> ledgers and bytes (`pulsar_rows`).
    pulsar_ledgers: dict[tuple[str, str], int] = field(default_factory=dict)
    pulsar_bytes: dict[tuple[str, str], int] = field(default_factory=dict)
    pulsar_last_run: float = 0.0
    risk_last_run: float = 0.0
    underreplicated: int = 0
    #: Payload bytes the leader's continuous deep scrub verified on this node.
    scrub_bytes_verified: int = 0
    #: Invalid znodes in each check's last report (corrupt marks, bad ledger znodes).
    invalid_znodes: dict[str, int] = field(default_factory=dict)
    #: Corrupt under-replication marks the last grace run saw.
    marks_invalid: int = 0
    #: (ledger, bookie) pairs of the last replicas report, by how they were verified
    #: (`checks.findings.Coverage`): listed, probed, unverified. Zero on followers.
    replicas_coverage: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(COVERAGE_HOW, 0)
    )
    leading: bool = False
    #: ZooKeeper connection events, as the daemon's connection listener sees them:
    #: reconnects (connected again after a suspension or a lost session; the first
    #: connection is not one), suspensions (the connection dropped, the session may
    #: live on) and session losses (expired or closed: the vote is gone).
    zk_reconnects: int = 0
    zk_suspensions: int = 0
    zk_sessions_lost: int = 0
    zk_down: bool = False

    def __post_init__(self) -> None:
        now = self.clock()
        self.created = self.created or now
        self.waiting_since = self.waiting_since or now
        for check in ALL_CHECKS:
            self.know(check)
        for op in BOOKIE_OPS:
            self.bookie_requests[op, "ok"] += 0

    def know(self, check: Check) -> None:
        """The check's labelled series exist from now on, at zero until it runs (every
        check of `ALL_CHECKS` from the start; the Pulsar audit once it is scheduled)."""
        if str(check) in self.durations:
            return
        for category in CATEGORIES[check]:
            self.violations[str(check), str(category)] += 0
            self.in_violation[str(check), str(category)] = 0
        self.durations[str(check)] = Histogram()
        self.consecutive_failures[str(check)] = 0
        for outcome in OUTCOMES:
            self.runs[str(check), outcome] += 0
        self.marked[str(check)] += 0
        self.invalid_znodes[str(check)] = 0
        for cause in DROP_CAUSES[check]:
            self.dropped[str(check), str(cause)] += 0

    # --- check runs --------------------------------------------------------------------

    def record_report(self, report: CheckReport, duration_s: float) -> None:
        """A completed run: counters grow by this run's ledgers, gauges become this run's."""
        check = str(report.check)
        for category, n in report.counts().items():
            if n:
                self.violations[check, category] += n
            self.in_violation[check, category] = n
        self.durations.setdefault(check, Histogram()).observe(max(duration_s, 0.0))
        self.runs[check, "violations" if report.has_findings else "ok"] += 1
        self.consecutive_failures[check] = 0
        self.invalid_znodes[check] = report.invalid_znodes.total
        if report.check is Check.GRACE:
            # The grace check reads every mark and names only corrupt ones.
            self.marks_invalid = report.invalid_znodes.total
        if report.check is Check.REPLICAS and report.coverage is not None:
            self.replicas_coverage = report.coverage.to_json()
        finished = report.finished_at or self.clock()
        self.last_success[check] = report.finished_at or time.time()
        self._succeeded(check, finished)
        for cause, n in report.dropped.items():
            if n:
                self.dropped[check, cause] += n
        marked = len(set(report.marked_underreplicated))
        if marked:
            self.marked[check] += marked

    def record_failure(self, check: Check, duration_s: float) -> None:
        self.durations.setdefault(str(check), Histogram()).observe(max(duration_s, 0.0))
        self.runs[str(check), "failed"] += 1
        self.consecutive_failures[str(check)] = self.consecutive_failures.get(str(check), 0) + 1

    def record_skip(self, check: Check) -> None:
        self.runs[str(check), "skipped"] += 1

    def set_last_success(self, check: Check, timestamp: float) -> None:
        """For a new leader: the check's stored ctime, so staleness survives a fail-over."""
        self.last_success[str(check)] = timestamp
        self._succeeded(str(check), timestamp)

    def _succeeded(self, check: str, timestamp: float) -> None:
        self.success_at[check] = max(self.success_at.get(check, timestamp), timestamp)

    def age_of(self, check: str) -> float:
        """Seconds since the last known success, else since this node began to wait."""
        since = self.success_at.get(check, self.waiting_since)
        return max(self.clock() - since, 0.0)

    def set_check_interval(self, check: Check, seconds: float) -> None:
        self.intervals[str(check)] = seconds

    # --- leadership ----------------------------------------------------------------------

    def leader_changed(self, leading: bool) -> None:
        """Elected: a new wait for first successes begins. Stepped down: the last-run
        gauges go to zero, so that summing across nodes never counts a former leader."""
        was, self.leading = self.leading, leading
        if leading and not was:
            self.waiting_since = self.clock()
        if was and not leading:
            for key in self.in_violation:
                self.in_violation[key] = 0
            for check in self.invalid_znodes:
                self.invalid_znodes[check] = 0
            self.marks_invalid = 0
            self.at_risk.clear()
            self.pulsar_ledgers.clear()
            self.pulsar_bytes.clear()
            self.replicas_coverage = dict.fromkeys(COVERAGE_HOW, 0)
            for check in self.consecutive_failures:
                self.consecutive_failures[check] = 0

    def election_attempt(self) -> None:
        self.election_attempts += 1

    # --- ZooKeeper session ---------------------------------------------------------------

    def zk_connected(self) -> None:
        """Connected: a reconnect if the connection had dropped (not the first one)."""
        if self.zk_down:
            self.zk_reconnects += 1
        self.zk_down = False

    def zk_suspended(self) -> None:
        """The connection dropped; the session may still be alive on the servers."""
        self.zk_suspensions += 1
        self.zk_down = True

    def zk_session_lost(self) -> None:
        """The session expired or was closed: ephemeral nodes (the vote) are gone."""
        self.zk_sessions_lost += 1
        self.zk_down = True

    # --- bookies, index, marks ------------------------------------------------------------

    def bookie_request(self, op: str, status: str) -> None:
        self.bookie_requests[op, status] += 1

    @property
    def index_ledgers(self) -> int:
        """Ledgers in the index this node holds (0 when it holds none)."""
        return self.index_size() if self.index_size is not None else 0

    def index_loaded(self, bytes_per_ledger: float) -> None:
        self.index_loads += 1
        self.index_bytes_per_ledger = round(bytes_per_ledger, 1)

    def index_resynced(self) -> None:
        self.index_resyncs += 1

    def index_failed(self) -> None:
        self.index_failures += 1

    # --- self-test and risk ----------------------------------------------------------------

    def record_selftest(self, results: Sequence[SelfTestResult], at: float) -> None:
        """One self-test (or canary) run: 1/0 per check it covered."""
        for r in results:
            self.selftest_success[r.check] = 1 if r.ok else 0
        self.selftest_last_run = at

    def record_risk(self, report: RiskReport, top: int) -> None:
        """The top `top` domains of each kind, both severities; the last report's only."""
        self.at_risk.clear()
        for domain in DOMAINS:
            for name, tally in report.top(domain, top):
                for sev in SEVERITIES:
                    self.at_risk[str(domain), name, sev.label] = tally.counts[sev]
        self.risk_last_run = report.finished_at or self.clock()

    def record_pulsar(self, audit: PulsarAudit, top: int) -> None:
        """The last Pulsar audit's rows per namespace, bounded to `top` and "other"."""
        self.pulsar_ledgers, self.pulsar_bytes = pulsar_rows(audit.counted_rollup(), top)
        self.pulsar_last_run = self.clock()
