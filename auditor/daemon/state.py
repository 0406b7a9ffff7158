"""What the daemon knows about itself, and the operations the admin API may ask for.

The API and the metrics read `DaemonState`; they never drive the leader's loop
directly. Mutating requests go through `DaemonControl`, whose implementation
(the daemon) decides whether this node may act (only a leader runs checks; any
node may flip cluster-wide flags in ZooKeeper, as BookKeeper's shell does).
"""

from __future__ import annotations

import enum
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from auditor.checks.findings import ALL_CHECKS, Check, CheckReport
from auditor.metadata.underreplication import UnderreplicatedLedger


class Outcome(enum.StrEnum):
    NEVER = "never"
    RUNNING = "running"
    OK = "ok"
    VIOLATIONS = "violations"
    FAILED = "failed"
    SKIPPED = "skipped"


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

    def last_success_age(self, now: float) -> float:
        """Seconds since the last known completion, else since `waiting_since`."""
        known = [t for t in (self.last_success, self.recorded_success) if t is not None]
        return max(now - (max(known) if known else self.waiting_since), 0.0)


@dataclass(frozen=True, slots=True)
class SelfTestState:
    """The last detector self-test (or canary) result of one check, for `status`."""

    check: str
    ok: bool
    fixtures: int
    #: The one-line summary ("replicas: FAILED fixture ..."); empty when ok.
    failure: str
    ran_at: float


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

    def list_underreplicated(self) -> AsyncIterator[UnderreplicatedLedger]: ...

    async def explain(self, ledger_id: int) -> dict[str, Any]:
        """The `explain --json` document of a ledger (NotFoundError when there is none)."""
