"""What the daemon knows about itself, and the operations the admin API may ask for.

The API and the metrics read `DaemonState`; they never drive the leader's loop
directly. Mutating requests go through `DaemonControl`, whose implementation
(the daemon) decides whether this node may act (only a leader runs checks; any
node may flip cluster-wide flags in ZooKeeper, as BookKeeper's shell does).

Everything the daemon learns is recorded here, through the methods below, and
nowhere else: `status` and the metrics (read at scrape time) show the same facts,
including the last leadership decisions and why they were taken.
"""

from __future__ import annotations

import enum
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from auditor.checks.findings import ALL_CHECKS, Check, CheckReport
from auditor.daemon.leadership import Decision, Phase, Reason
from auditor.daemon.tallies import Tallies
from auditor.metadata.acls import OpenAcl
from auditor.metadata.underreplication import CorruptMark, UnderreplicatedLedger
from auditor.worker.state import WorkerState

if TYPE_CHECKING:
    from auditor.checks.pulsar_audit import PulsarAudit
    from auditor.selftest.harness import SelfTestResult

#: Leadership decisions kept for `status` and tests (older ones are only counted).
DECISIONS_KEPT = 32


class Happening(enum.StrEnum):
    """What a daemon tells its listeners, each time, after the state that shows it changed."""

    DECIDED = "decided"  # a leadership decision (in `decisions`)
    LEADER_READ = "leader_read"  # who leads, and the disable flag, read again
    CHECK_ENDED = "check_ended"  # a check run ended, whatever its outcome
    ACLS_CHECKED = "acls_checked"  # the relied-on znodes' ACLs read (`open_acls`)
    ZNODE_READ = "znode_read"  # the leader read a check ctime or the delay znode
    SELFTEST_REPORTED = "selftest_reported"  # self-test results arrived
    RISK_REPORTED = "risk_reported"  # a risk report arrived


class Outcome(enum.StrEnum):
    NEVER = "never"
    RUNNING = "running"
    OK = "ok"
    VIOLATIONS = "violations"
    FAILED = "failed"
    SKIPPED = "skipped"


class RunState(enum.StrEnum):
    """What the leader's scheduler says about a check between runs."""

    SCHEDULED = "scheduled"  # the next run is due at a time
    RUNNING = "running"
    OFF = "off"  # interval 0: runs only when triggered


@dataclass(frozen=True, slots=True)
class RunCompleted:
    report: CheckReport
    duration: float


@dataclass(frozen=True, slots=True)
class RunFailed:
    error: str
    duration: float


@dataclass(frozen=True, slots=True)
class RunSkipped:
    why: str


#: How one check run ended, as the scheduler reports it.
RunOutcome = RunCompleted | RunFailed | RunSkipped


@dataclass(frozen=True, slots=True)
class CheckProgress:
    """How far a running check's walk is."""

    done: int
    #: The ledgers the walk will see; None while unknown.
    total: int | None
    #: Where `total` comes from: "ledgers" (the size of the metadata index the check
    #: walks) or "max_ledger_id" (an estimate: how densely the ids walked so far are
    #: used, over the range up to the largest ledger id).
    total_kind: str
    updated: float


@dataclass
class CheckState:
    check: Check
    enabled: bool = True
    interval_s: float = 0.0
    outcome: Outcome = Outcome.NEVER
    last_started: float | None = None  # wall clock, seconds
    last_finished: float | None = None
    last_success: float | None = None
    next_run: float | None = None
    last_error: str | None = None
    last_report: CheckReport | None = None
    #: When the check last completed on any leader, as recorded in ZooKeeper (a new
    #: leader reads it), so that staleness survives a fail-over.
    recorded_success: float | None = None
    #: Since when this node has waited for a first completion: its start, then
    #: each election (where no completion is known, the age counts from here).
    waiting_since: float = field(default_factory=time.time)
    #: While the check runs in this process, how far its walk is (None before its first
    #: ledger, between runs, and for a check that walks nothing or runs as a scan).
    progress: CheckProgress | None = None

    def last_success_age(self, now: float) -> float:
        """Seconds since the last known completion, else since `waiting_since`."""
        known = [t for t in (self.last_success, self.recorded_success) if t is not None]
        return max(now - (max(known) if known else self.waiting_since), 0.0)


@dataclass(frozen=True, slots=True)
class ScrubStatus:
    """Where the leader's continuous deep scrub stands (`daemon/scrub_cycle.py`), as of
    `updated`: its record (`checks/scrub_progress.py`) and what follows from it."""

    cycle: int
    #: Unix time the cycle started; `interval` seconds is its target length.
    started: float
    interval: float
    #: Every ledger with a smaller id was verified in this cycle.
    cursor: int
    #: Payload bytes verified and ledgers judged in this cycle; the last complete
    #: cycle's bytes (0: none complete).
    bytes: int
    ledgers: int
    previous_bytes: int
    #: The share of the cluster verified in this cycle (0..1).
    share: float
    #: When the cycle should end at its rate so far (None: not known yet); when it
    #: ended, once it has.
    expected_end: float | None
    finished: float | None
    #: While the cycle is done: when the next starts.
    rest_until: float | None
    #: Bytes per second per bookie in force (0: no budget).
    rate: float
    updated: float

    def to_json(self) -> dict[str, Any]:
        return {
            "cycle": self.cycle,
            "started": self.started,
            "interval": self.interval,
            "cursor": self.cursor,
            "bytes": self.bytes,
            "ledgers": self.ledgers,
            "previous_bytes": self.previous_bytes,
            "share": self.share,
            "expected_end": self.expected_end,
            "finished": self.finished,
            "rest_until": self.rest_until,
            "rate": self.rate,
            "updated": self.updated,
        }


@dataclass(frozen=True, slots=True)
class SelfTestState:
    """The last detector self-test (or canary) result of one check, for `status`."""

    check: str
    ok: bool
    fixtures: int
    #: The one-line summary ("replicas: FAILED fixture ..."); empty when ok.
    failure: str
    ran_at: float


@dataclass(frozen=True, slots=True)
class InvalidZnode:
    """A znode the daemon read and could not use, and what it uses instead."""

    znode: str
    #: The bytes found, bounded and printable (`repr` of at most 64 characters).
    value: str
    #: What the daemon uses instead ("the configured 30 s", "absent: the check runs").
    using: str
    since: float


@dataclass(frozen=True, slots=True)
class UnreadableVote:
    """The live vote first in line (or Pulsar's leader key) whose bytes do not decode.

    The election's order does not read a vote's data (BookKeeper's comparator ranks
    names), so that vote's session holds the election: Java's AutoRecovery waits behind
    it, and so does this daemon. Nobody audits the cluster while that session lives."""

    path: str
    #: The owning ZooKeeper session (`ephemeralOwner`).
    session: int
    #: Why its bytes do not decode.
    error: str
    since: float


@dataclass(frozen=True, slots=True)
class OtherElection:
    """A live holder of the election this daemon does not take part in."""

    #: "bookkeeper" or "pulsar": the other metadata driver's election.
    election: str
    #: The vote or key held.
    path: str
    #: The bookie id it names; "" when its bytes do not decode.
    holder: str
    since: float


@dataclass
class DaemonState:
    identity: str
    started_at: float = field(default_factory=time.time)
    is_leader: bool = False
    leader: str | None = None
    zk_connected: bool = False
    replication_enabled: bool = True
    #: Monotonic time the event loop last turned (liveness).
    heartbeat: float = field(default_factory=time.monotonic)
    retry_queue: int = 0
    lost_bookies: tuple[str, ...] = ()
    checks: dict[Check, CheckState] = field(
        default_factory=lambda: {c: CheckState(c) for c in ALL_CHECKS}
    )
    #: Check (or canary) name -> its last self-test result on this node.
    selftest: dict[str, SelfTestState] = field(default_factory=dict)
    #: Where this daemon stands in the election (the decision machine's phase).
    phase: Phase = Phase.STARTING
    #: The last leadership decisions, oldest first.
    decisions: deque[Decision] = field(default_factory=lambda: deque(maxlen=DECISIONS_KEPT))
    #: Every leadership decision taken, by reason.
    decision_counts: Counter[Reason] = field(default_factory=Counter)
    #: While another session holds a vote with this identity: that vote's path, and since when.
    duplicate_vote: str | None = None
    duplicate_since: float | None = None
    #: The election this daemon takes part in: "bookkeeper" or "pulsar" (its driver's).
    election: str = "bookkeeper"
    #: The metadata store's name in what the daemon says ("ZooKeeper", "etcd").
    store: str = "ZooKeeper"
    #: While the other driver's election has a live holder (this daemon stays out).
    other_election: OtherElection | None = None
    #: While the election is held by a live vote that does not decode (nobody audits).
    unreadable_vote: UnreadableVote | None = None
    #: Relied-on znodes anyone may change (`auditor.metadata.acls`), as last read at a
    #: connect with credentials; empty without credentials or on etcd.
    open_acls: tuple[OpenAcl, ...] = ()
    #: While backing off after a failure: when this daemon votes again (wall clock).
    backoff_until: float | None = None
    #: Znodes read and found unusable, by name, while they stay so.
    invalid_znodes: dict[str, InvalidZnode] = field(default_factory=dict)
    #: When each check last completed anywhere in the cluster (any auditor, Java or
    #: ours), from its ctime znode; read by every daemon (`daemon/cluster_checks.py`).
    cluster_checks: dict[Check, float] = field(default_factory=dict)
    #: What the metrics read beyond the fields above.
    tallies: Tallies = field(default_factory=Tallies)
    #: The replication worker's counts and the ledgers in its hands.
    worker: WorkerState = field(default_factory=WorkerState)
    #: The leader's last Pulsar audit (`[pulsar] interval`): its findings and rollups
    #: (its `CheckReport` is `checks[Check.PULSAR]`'s, present while the audit is on).
    pulsar: PulsarAudit | None = None
    #: The leader's continuous deep scrub (`[scrub] continuous`); None while off, on a
    #: follower, and before the leader first read its record.
    scrub: ScrubStatus | None = None

    # --- leadership ---------------------------------------------------------------------

    def record_decision(self, d: Decision) -> None:
        self.decisions.append(d)
        self.decision_counts[d.reason] += 1
        self.phase = d.phase
        if d.phase is not Phase.BACKING_OFF:
            self.backoff_until = None
        elif d.backoff > 0:
            self.backoff_until = d.at + d.backoff
        if d.phase is Phase.REFUSED and d.detail and self.duplicate_vote is None:
            self.duplicate_vote, self.duplicate_since = d.detail, d.at
        elif d.phase is not Phase.REFUSED:
            self.duplicate_vote = self.duplicate_since = None

    def lead(self, now: float) -> None:
        self.is_leader = True
        self.leader = self.identity
        for cs in self.checks.values():
            cs.waiting_since = now  # staleness before a first run counts from here
        self.tallies.leader_changed(True)

    def stepped_down(self) -> None:
        self.is_leader = False
        self.scrub = None
        for cs in self.checks.values():
            cs.progress = None
        self.tallies.leader_changed(False)

    # --- check runs -----------------------------------------------------------------------

    def check_run_state(self, check: Check, what: RunState, next_run: float | None) -> None:
        cs = self.checks[check]
        if what is RunState.RUNNING:
            cs.outcome = Outcome.RUNNING
            cs.last_started = time.time()
            cs.progress = None
        elif what is RunState.OFF:
            cs.enabled = False
        elif what is RunState.SCHEDULED:
            cs.next_run = next_run

    def check_ended(self, check: Check, outcome: RunOutcome, now: float) -> None:
        cs = self.checks[check]
        cs.last_finished = now
        cs.progress = None
        match outcome:
            case RunCompleted(report=report, duration=duration):
                cs.last_report = report
                cs.last_success = now
                cs.last_error = None
                # Invalid znodes are findings as violations are (`check` exits 1 on both).
                cs.outcome = Outcome.VIOLATIONS if report.has_findings else Outcome.OK
                if check is Check.BOOKIES:
                    self.lost_bookies = tuple(report.lost_bookies)
                self.tallies.record_report(report, duration)
            case RunSkipped():
                cs.outcome = Outcome.SKIPPED
                self.tallies.record_skip(check)
            case RunFailed(error=error, duration=duration):
                cs.outcome = Outcome.FAILED
                cs.last_error = error
                self.tallies.record_failure(check, duration)

    def check_progress(
        self, check: Check, done: int, total: int | None, total_kind: str, now: float
    ) -> None:
        """A running check's walk: `done` ledgers, of `total` (see `CheckProgress`)."""
        cs = self.checks[check]
        if cs.outcome is Outcome.RUNNING:
            cs.progress = CheckProgress(done, total, total_kind, now)

    def check_recorded(self, check: Check, timestamp: float) -> None:
        """The check's last completion as stored in ZooKeeper (read by a new leader)."""
        self.checks[check].recorded_success = timestamp
        self.tallies.set_last_success(check, timestamp)

    def cluster_check_completed(self, check: Check, timestamp: float | None) -> None:
        """The check's ctime znode, as every daemon sees it (None: absent or unusable)."""
        if timestamp is None:
            self.cluster_checks.pop(check, None)
        else:
            self.cluster_checks[check] = timestamp

    def check_interval(self, check: Check, seconds: float) -> None:
        self.checks[check].interval_s = seconds
        self.checks[check].enabled = seconds > 0
        self.tallies.set_check_interval(check, seconds)

    def pulsar_scheduled(self, interval_s: float) -> None:
        """`[pulsar] interval`: the audit gets a check row while it is on (> 0), none when off."""
        if interval_s > 0:
            self.checks.setdefault(Check.PULSAR, CheckState(Check.PULSAR))
            self.check_interval(Check.PULSAR, interval_s)
            self.tallies.know(Check.PULSAR)
        else:
            self.checks.pop(Check.PULSAR, None)
            self.tallies.intervals.pop(str(Check.PULSAR), None)

    def scrub_scheduled(self, on: bool) -> None:
        """`[scrub] continuous`: the scrub gets a check row while it is on, none when off."""
        if on:
            self.checks.setdefault(Check.SCRUB, CheckState(Check.SCRUB))
            self.tallies.know(Check.SCRUB)
        else:
            self.checks.pop(Check.SCRUB, None)
            self.scrub = None

    def scrub_progressed(self, status: ScrubStatus, bytes_verified: int) -> None:
        """The scrub's record as written (or read), and the bytes the chunk verified."""
        self.scrub = status
        self.tallies.scrub_bytes_verified += bytes_verified

    def pulsar_done(self, audit: PulsarAudit, top: int) -> None:
        """A confirmed Pulsar audit (its report arrives through `check_ended`)."""
        self.pulsar = audit
        self.tallies.record_pulsar(audit, top)

    def selftest_done(self, results: Sequence[SelfTestResult], now: float) -> None:
        for r in results:
            self.selftest[r.check] = SelfTestState(
                r.check, r.ok, r.fixtures, "" if r.ok else r.summary(), now
            )
        self.tallies.record_selftest(results, now)

    # --- znodes that could not be used ----------------------------------------------------

    def znode_invalid(self, znode: str, value: str, using: str, now: float) -> bool:
        """Records `znode` as unusable; True when this is news (first seen, or a new value)."""
        known = self.invalid_znodes.get(znode)
        if known is not None and known.value == value and known.using == using:
            return False
        since = known.since if known is not None and known.value == value else now
        self.invalid_znodes[znode] = InvalidZnode(znode, value, using, since)
        return known is None or known.value != value

    def znode_valid(self, znode: str) -> bool:
        """Forgets `znode`'s trouble; True when it had been recorded as unusable."""
        return self.invalid_znodes.pop(znode, None) is not None


class NotLeaderError(Exception):
    """Only the leader runs checks; the message names the leader."""


class DaemonControl(Protocol):
    state: DaemonState

    async def trigger_check(self, check: Check) -> None:
        """Runs a check now on the leader (raises NotLeaderError on a follower)."""

    async def current_leader(self) -> str | None:
        """The auditor as BookKeeper sees it: the first vote's bookie id."""

    async def set_lost_bookie_recovery_delay(self, seconds: int) -> None: ...

    async def get_lost_bookie_recovery_delay(self) -> int: ...

    async def set_autorecovery(self, enabled: bool) -> None: ...

    def list_underreplicated(self) -> AsyncIterator[UnderreplicatedLedger | CorruptMark]:
        """Every mark, each corrupt one an item of its own (`list_marks`)."""

    async def explain(self, ledger_id: int) -> dict[str, Any]:
        """The `explain --json` document of a ledger (NotFoundError when there is none)."""
