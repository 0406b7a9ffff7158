"""The rules of `lostBookieRecoveryDelay` interact in ways that are easy to get subtly wrong
in callback code, so they live here without clock, timers or I/O, where tests can replay
upstream's scenarios as event sequences.

When the daemon audits lost bookies: `lostBookieRecoveryDelay` as a pure state machine.

BookKeeper's auditor waits `lostBookieRecoveryDelay` seconds after a bookie
disappears before marking its ledgers, so that a bookie restarting for an
upgrade does not trigger a wave of re-replication. For the rules (spec §1.4,
§1.6, §1.9, §2.1) the daemon feeds events with explicit timestamps and carries
out the returned decisions in order (`RunAuditNow`, `ScheduleAudit`,
`CancelPendingAudit`).

The daemon must not feed events while replication is disabled; upstream's
auditor blocks its thread until replication is re-enabled and then processes
the queued events in order, which is what the daemon should do with them.

Deliberate differences from upstream:

* A restart is not a failure. Upstream's new leader audits every missing
  bookie at once, ignoring the delay; with the daemon beside each bookie, a
  host restart (the leader and its bookie together) would then mark the
  bookie's ledgers every time. Here `leader_started` is told since when each
  missing bookie has been missing (`BookieSightings`, kept by every daemon,
  followers too) and waits the delay from that moment, at the latest from the
  election. While that audit is pending its bookie is *held*
  (`held_bookies`): the checks leave its fragments alone. Two or more missing
  bookies within their delay audit at once, as a second failure during a
  delay does (upstream's rule). With a delay of 0 nothing changes.
* Leader start: upstream runs the full audit at once, then processes the
  registry's initial snapshot as a bookie change; bookies known only from
  `cookies/` are then "lost" a second time and (one of them, with a non-zero
  delay) get a delayed audit that re-marks the same ledgers and holds back
  every periodic check meanwhile. Here the start audit covers them: they are
  not queued again.
* A bookie change read with delay 0 while a delayed audit is pending runs the
  audit now (as upstream) and also cancels the pending one, which upstream
  leaves to fire later for nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


class AuditReason(enum.StrEnum):
    LEADER_STARTED = "leader_started"
    NO_DELAY = "no_delay"
    MULTIPLE_FAILURES = "multiple_failures"
    DELAY_EXPIRED = "delay_expired"
    DELAY_SET_TO_ZERO = "delay_set_to_zero"
    TRIGGERED = "triggered"  # the current delay written back (`triggeraudit`)


@dataclass(frozen=True, slots=True)
class RunAuditNow:
    """Run the full bookie audit now. `bookies`: the lost bookies that prompted it."""

    reason: AuditReason
    bookies: frozenset[str]


@dataclass(frozen=True, slots=True)
class ScheduleAudit:
    """Arm the delayed-audit timer for `at`; report `token` back to `on_timer`."""

    at: float
    token: int


@dataclass(frozen=True, slots=True)
class CancelPendingAudit:
    """Disarm the delayed-audit timer."""


Decision = RunAuditNow | ScheduleAudit | CancelPendingAudit

#: Counter names as BookKeeper exports them.
NUM_BOOKIE_AUDITS_DELAYED = "NUM_BOOKIE_AUDITS_DELAYED"
NUM_DELAYED_BOOKIE_AUDITS_CANCELLED = "NUM_DELAYED_BOOKIE_AUDITS_CANCELLED"
NUM_SKIPPING_CHECK_TASK_TIMES = "NUM_SKIPPING_CHECK_TASK_TIMES"


class LostBookieDelay:
    """The leader's lost-bookie bookkeeping.

    Invariant after every event: `bookies_to_audit` is non-empty exactly when a
    delayed audit is pending, and then holds the one bookie it waits for.
    """

    def __init__(self) -> None:
        self.known_bookies: set[str] = set()
        self.bookies_to_audit: set[str] = set()
        #: When the pending delayed audit is due, or None.
        self.pending_at: float | None = None
        #: The last delay seen by a delay change (upstream's `...BeforeChange`).
        self.delay_before_change: int = 0
        self.counters: dict[str, int] = {
            NUM_BOOKIE_AUDITS_DELAYED: 0,
            NUM_DELAYED_BOOKIE_AUDITS_CANCELLED: 0,
            NUM_SKIPPING_CHECK_TASK_TIMES: 0,
        }
        self._started = False
        self._token = 0

    @property
    def audit_pending(self) -> bool:
        return self.pending_at is not None

    @property
    def held_bookies(self) -> frozenset[str]:
        """The bookie a pending delayed audit waits for (none when nothing is pending).

        Checks leave a held bookie's fragments alone: it may be restarting, and
        the delay exists so that a restart marks nothing.
        """
        if self.pending_at is None:
            return frozenset()
        return frozenset(self.bookies_to_audit)

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("leader_started() must come first")

    def _cancel(self, out: list[Decision]) -> None:
        if self.pending_at is not None:
            self.pending_at = None
            self.counters[NUM_DELAYED_BOOKIE_AUDITS_CANCELLED] += 1
            out.append(CancelPendingAudit())

    def _schedule(self, at: float, out: list[Decision]) -> None:
        self.pending_at = at
        self._token += 1
        self.counters[NUM_BOOKIE_AUDITS_DELAYED] += 1
        out.append(ScheduleAudit(at, self._token))

    def _run_now(self, reason: AuditReason, out: list[Decision]) -> None:
        out.append(RunAuditNow(reason, frozenset(self.bookies_to_audit)))
        self.bookies_to_audit.clear()

    def leader_started(
        self,
        cookies: Iterable[str],
        available: Iterable[str],
        delay: int,
        now: float,
        missing_since: Mapping[str, float] | None = None,
    ) -> list[Decision]:
        """This node just became leader: audit the missing bookies whose delay is over.

        `cookies` are all bookies that ever registered; those not available now
        are lost. `missing_since` says since when this process saw each of them
        missing (as a follower, or earlier as leader); one it never saw is
        missing from `now`, the election. With `delay` 0 (the current ZooKeeper
        value) every lost bookie is audited at once, as upstream does. Otherwise
        a bookie still within its delay is held and its audit scheduled for when
        the delay runs out; two or more within their delay are audited at once
        (a second failure during a delay). The start audit runs when there is
        anything to audit: lost bookies past their delay, or no bookie held.
        """
        avail = set(available)
        known = set(cookies) | avail
        lost = known - avail
        since = missing_since or {}
        self.known_bookies = avail
        self.pending_at = None
        self.delay_before_change = delay
        self._started = True
        out: list[Decision] = []
        waiting = {b: since.get(b, now) + delay for b in lost if since.get(b, now) + delay > now}
        if delay == 0 or not waiting:
            self.bookies_to_audit = set(lost)
            self._run_now(AuditReason.LEADER_STARTED, out)
            return out
        if len(waiting) > 1:
            self.bookies_to_audit = set(lost)
            self._run_now(AuditReason.MULTIPLE_FAILURES, out)
            return out
        (held, due), *_ = waiting.items()
        overdue = lost - {held}
        if overdue:
            self.bookies_to_audit = set(overdue)
            self._run_now(AuditReason.LEADER_STARTED, out)
        self.bookies_to_audit = {held}
        self._schedule(due, out)
        return out

    def on_bookies_changed(
        self, available: Iterable[str], delay: int, now: float
    ) -> list[Decision]:
        """The writable or read-only set changed; `available` is their union, `delay`
        the ZooKeeper value read for this event."""
        self._require_started()
        avail = set(available)
        out: list[Decision] = []
        self.known_bookies |= avail
        if self.bookies_to_audit and self.bookies_to_audit <= self.known_bookies:
            # The bookie we were waiting for is back before its delay ran out.
            self._cancel(out)
            self.bookies_to_audit.clear()
        lost = self.known_bookies - avail
        self.bookies_to_audit |= lost
        if not self.bookies_to_audit:
            return out
        self.known_bookies -= lost
        if delay == 0:
            self._cancel(out)
            self._run_now(AuditReason.NO_DELAY, out)
        elif len(self.bookies_to_audit) > 1:
            self._cancel(out)
            self._run_now(AuditReason.MULTIPLE_FAILURES, out)
        elif self.pending_at is None:
            self._schedule(now + delay, out)
        return out

    def on_delay_changed(self, delay: int, now: float) -> list[Decision]:
        """The `lostBookieRecoveryDelay` znode was written (possibly with the same value)."""
        self._require_started()
        out: list[Decision] = []
        had_pending = self.pending_at is not None
        self._cancel(out)
        if delay == 0 or delay == self.delay_before_change:
            reason = AuditReason.DELAY_SET_TO_ZERO if delay == 0 else AuditReason.TRIGGERED
            self._run_now(reason, out)
        elif had_pending:
            # Rescheduled from now, not from when the bookie was lost.
            self._schedule(now + delay, out)
        self.delay_before_change = delay
        return out

    def on_timer(self, now: float, token: int) -> list[Decision]:
        """The timer armed by `ScheduleAudit(token=token)` fired.

        A timer that was cancelled or superseded but fired anyway (a race in
        the driver) carries a stale token and is ignored.
        """
        self._require_started()
        if self.pending_at is None or token != self._token:
            return []
        self.pending_at = None
        out: list[Decision] = []
        self._run_now(AuditReason.DELAY_EXPIRED, out)
        return out

    def should_skip_periodic_check(self) -> bool:
        """Whether a periodic check due now must be skipped (a delayed audit is pending);
        counts the skip."""
        if self.pending_at is None:
            return False
        self.counters[NUM_SKIPPING_CHECK_TASK_TIMES] += 1
        return True
