"""Leadership as a pure decision machine: typed events in, a decision with a reason out.

Why: leadership used to start and end in six places of the daemon, each with its own
flag, and nothing recorded why it ended; one path (a corrupt ctime read at election)
even ended the election task itself without a word. Here every event that can start,
pause or end leadership meets one function, `LeadershipMachine.decide`, which returns
what to do and a sentence saying why (the model is Patroni's `ha.py`, whose cycle
returns such a sentence). No I/O, no clock, no asyncio: the daemon feeds events with
explicit times, carries out the action, and keeps the decisions for `status`, the logs
and the metrics; the unit tests replay event sequences.

Failures back off before voting again (`auditor.backoff`: exponential, capped, with
jitter): a leader whose work fails at once, on every election, must not flap several
times a second.
A supervised task that ends (the election itself, the connection follower) ends the
process with a non-zero exit, NOT_SERVING first, so the service manager restarts it:
a daemon that is out of the election while it should be in it never looks healthy.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from auditor.backoff import Backoff

#: How much of an error's text a decision keeps (status and logs stay bounded).
DETAIL_LIMIT = 300


class Phase(enum.StrEnum):
    """Where the daemon stands in the election."""

    STARTING = "starting"  # connected, not yet voting
    VOTING = "voting"  # a vote is in (or going in), waiting in line
    LEADING = "leading"
    BACKING_OFF = "backing_off"  # stepped down after a failure; votes again later
    REFUSED = "refused"  # another session holds a vote with this daemon's identity
    OTHER_ELECTION = "other_election"  # the other driver's election has a live holder
    STOPPING = "stopping"  # SIGTERM or stop(): handing over, then exit 0
    ENDED = "ended"  # a supervised task ended: exiting non-zero


class Action(enum.StrEnum):
    """What the daemon does about an event."""

    VOTE = "vote"  # enter the election (again)
    LEAD = "lead"  # start the leader's work
    PAUSE = "pause"  # connection suspended: new checks wait; stepping down after a session
    RESUME = "resume"  # connection back: lead on if the vote is still first
    RESTART_WORK = "restart_work"  # new configuration: the leader's work starts over
    STEP_DOWN = "step_down"  # stop leading, withdraw the vote, vote again at once
    BACK_OFF = "back_off"  # stop leading (or campaigning), vote again after `backoff`
    REFUSE = "refuse"  # do not vote (or lead): the identity is taken, or another election leads
    CARRY_ON = "carry_on"  # nothing changes
    EXIT = "exit"  # stop: withdraw the vote (hand over), exit 0
    FAIL = "fail"  # a supervised task ended: NOT_SERVING, exit non-zero


class Reason(enum.StrEnum):
    """Why: the `reason` label of the decisions metric, one per kind of event."""

    STARTED = "started"
    ELECTED = "elected"
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    SESSION_LOST = "session_lost"
    SUSPENDED_TOO_LONG = "suspended_too_long"
    VOTE_LOST = "vote_lost"
    FENCED_OUT = "fenced_out"
    LEADER_WORK_FAILED = "leader_work_failed"
    LEADER_WORK_ENDED = "leader_work_ended"
    CAMPAIGN_FAILED = "campaign_failed"
    STOP_REQUESTED = "stop_requested"
    STEP_DOWN_REQUESTED = "step_down_requested"
    CONFIG_RELOADED = "config_reloaded"
    DUPLICATE_IDENTITY = "duplicate_identity"
    DUPLICATE_CLEARED = "duplicate_cleared"
    OTHER_ELECTION_LEADER = "other_election_leader"
    OTHER_ELECTION_CLEARED = "other_election_cleared"
    BACKOFF_ELAPSED = "backoff_elapsed"
    TASK_ENDED = "task_ended"


# --- events ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    """Connected and ready: the daemon enters the election."""


@dataclass(frozen=True, slots=True)
class Connected:
    """The metadata store's session is connected (again)."""


@dataclass(frozen=True, slots=True)
class Suspended:
    """The connection is gone; the session may still be alive on the server."""


@dataclass(frozen=True, slots=True)
class SessionLost:
    """The session expired: its ephemeral vote is gone."""


@dataclass(frozen=True, slots=True)
class SuspendedTooLong:
    """Disconnected for a whole session timeout: another daemon may lead by now."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Elected:
    """Our vote is first."""

    vote: str


@dataclass(frozen=True, slots=True)
class CampaignFailed:
    """Voting raised (the metadata store refused or went away mid-vote)."""

    error: str


@dataclass(frozen=True, slots=True)
class VoteLost:
    """After a reconnect our vote is gone or no longer first."""


@dataclass(frozen=True, slots=True)
class FencedOut:
    """A leader write fenced on our vote was refused: someone else leads."""

    error: str


@dataclass(frozen=True, slots=True)
class WorkFailed:
    """The leader's work raised."""

    error: str


@dataclass(frozen=True, slots=True)
class WorkEnded:
    """The leader's work returned although only cancellation should end it."""


@dataclass(frozen=True, slots=True)
class StopRequested:
    """SIGTERM, SIGINT or `Daemon.stop()`."""

    why: str


@dataclass(frozen=True, slots=True)
class StepDownRequested:
    """Someone asked this leader to step down (it votes again at once)."""

    by: str


@dataclass(frozen=True, slots=True)
class ConfigReloaded:
    """SIGHUP read a new configuration."""


@dataclass(frozen=True, slots=True)
class DuplicateIdentity:
    """Another session of the metadata store holds a vote carrying this daemon's identity."""

    vote: str


@dataclass(frozen=True, slots=True)
class DuplicateCleared:
    """No other session's vote carries this daemon's identity any more."""


@dataclass(frozen=True, slots=True)
class OtherElectionLeader:
    """The election of the other metadata driver has a live holder: two auditors would run.

    `election` names it ("bookkeeper" or "pulsar"), `holder` says who and where.
    """

    election: str
    holder: str


@dataclass(frozen=True, slots=True)
class OtherElectionCleared:
    """The other driver's election has no live holder any more."""


@dataclass(frozen=True, slots=True)
class BackoffElapsed:
    """The back-off after a failure is over."""


@dataclass(frozen=True, slots=True)
class TaskEnded:
    """A supervised task (the election, the connection follower) ended."""

    task: str
    error: str


Event = (
    Started
    | Connected
    | Suspended
    | SessionLost
    | SuspendedTooLong
    | Elected
    | CampaignFailed
    | VoteLost
    | FencedOut
    | WorkFailed
    | WorkEnded
    | StopRequested
    | StepDownRequested
    | ConfigReloaded
    | DuplicateIdentity
    | DuplicateCleared
    | OtherElectionLeader
    | OtherElectionCleared
    | BackoffElapsed
    | TaskEnded
)


# --- decisions ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do, why, and the sentence that says so (logged as the event's message)."""

    action: Action
    reason: Reason
    message: str
    #: Wall-clock seconds of the event that prompted it.
    at: float
    #: The phase after this decision.
    phase: Phase
    #: The error or the vote behind it, bounded; empty when there is none.
    detail: str = ""
    #: Seconds to wait before voting again (BACK_OFF only).
    backoff: float = 0.0
    #: "info", "warning" or "error": how loudly the daemon logs it.
    level: str = "info"

    @property
    def ends_term(self) -> bool:
        """Whether a leader that gets this decision stops leading."""
        return self.action in (
            Action.STEP_DOWN,
            Action.BACK_OFF,
            Action.REFUSE,
            Action.EXIT,
            Action.FAIL,
        )


#: A leadership that ends, its vote lost, sooner than this after it began (seconds) is a
#: failure and backed off, never a plain step-down followed by an immediate new vote.
SHORT_TERM = 10.0


#: The leader's back-off draws between half and all of its ceiling: the jitter spreads
#: daemons that failed together, the lower half bound keeps the wait growing.
LEADER_JITTER = 0.5


def leader_backoff(initial: float = 1.0, maximum: float = 120.0) -> Backoff:
    """The back-off before voting again after the n-th failure in a row: between half and
    all of `min(maximum, initial * 2 ** (n - 1))` seconds (`auditor.backoff`)."""
    return Backoff(initial=initial, maximum=maximum, jitter=LEADER_JITTER)


def bounded(text: str, limit: int = DETAIL_LIMIT) -> str:
    """`text` cut to `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


class LeadershipMachine:
    """The daemon's leadership, one event at a time.

    `failures` counts consecutive failed attempts (campaigns and leader terms that
    failed); a term that ends for another reason, or that lasted at least the
    back-off's maximum before failing, starts the count over.
    """

    def __init__(
        self,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        *,
        store: str = "ZooKeeper",
    ) -> None:
        self.backoff = backoff if backoff is not None else leader_backoff()
        #: The metadata store's name in messages ("ZooKeeper", "etcd").
        self.store = store
        self.rng = rng if rng is not None else random.Random()
        self.phase = Phase.STARTING
        self.connected = True
        self.failures = 0
        self.elected_at: float | None = None

    # --- helpers ----------------------------------------------------------------------

    def _d(
        self,
        action: Action,
        reason: Reason,
        message: str,
        now: float,
        *,
        detail: str = "",
        backoff: float = 0.0,
        level: str = "info",
        phase: Phase | None = None,
    ) -> Decision:
        if phase is not None:
            self.phase = phase
        return Decision(action, reason, message, now, self.phase, bounded(detail), backoff, level)

    def _term_ended(self, now: float, failed: bool) -> None:
        lasted = now - self.elected_at if self.elected_at is not None else 0.0
        self.elected_at = None
        if not failed or lasted >= self.backoff.maximum:
            self.failures = 0

    def _back_off(self, reason: Reason, what: str, now: float, detail: str) -> Decision:
        self.failures += 1
        wait = self.backoff.draw(self.failures, self.rng)
        return self._d(
            Action.BACK_OFF,
            reason,
            f"{what}; voting again in {wait:.1f} s (failure {self.failures} in a row)",
            now,
            detail=detail,
            backoff=wait,
            level="error",
            phase=Phase.BACKING_OFF,
        )

    def _step_down(self, reason: Reason, message: str, now: float, detail: str = "") -> Decision:
        self._term_ended(now, failed=False)
        return self._d(
            Action.STEP_DOWN,
            reason,
            message,
            now,
            detail=detail,
            level="error",
            phase=Phase.VOTING,
        )

    # --- the one entry point -------------------------------------------------------------

    def decide(self, event: Event, now: float) -> Decision:
        """What to do about `event`, happening at wall-clock `now`."""
        leading = self.phase is Phase.LEADING
        done = self.phase in (Phase.STOPPING, Phase.ENDED)
        match event:
            case Started():
                if self.phase is not Phase.STARTING:
                    return self._d(Action.CARRY_ON, Reason.STARTED, "already started", now)
                return self._d(
                    Action.VOTE,
                    Reason.STARTED,
                    "entering the auditor election",
                    now,
                    phase=Phase.VOTING,
                )
            case Connected():
                self.connected = True
                if leading:
                    return self._d(
                        Action.RESUME,
                        Reason.CONNECTED,
                        f"{self.store} connection back; leading on if our vote is still first",
                        now,
                    )
                return self._d(Action.CARRY_ON, Reason.CONNECTED, f"{self.store} connected", now)
            case Suspended():
                self.connected = False
                if leading:
                    return self._d(
                        Action.PAUSE,
                        Reason.SUSPENDED,
                        f"{self.store} connection suspended; leader work paused",
                        now,
                        level="warning",
                    )
                return self._d(
                    Action.CARRY_ON,
                    Reason.SUSPENDED,
                    f"{self.store} connection suspended",
                    now,
                    level="warning",
                )
            case SessionLost():
                self.connected = False
                if leading:
                    return self._step_down(
                        Reason.SESSION_LOST,
                        f"{self.store} session lost; stepping down at once",
                        now,
                    )
                # A follower's vote went with the session; kazoo's lock votes again in
                # the new one, and nothing may end the leadership that vote may win.
                message = (
                    f"{self.store} session lost; voting again"
                    if self.phase is Phase.VOTING
                    else f"{self.store} session lost"
                )
                return self._d(Action.CARRY_ON, Reason.SESSION_LOST, message, now, level="warning")
            case SuspendedTooLong(seconds=seconds):
                if leading and not self.connected:
                    return self._step_down(
                        Reason.SUSPENDED_TOO_LONG,
                        f"disconnected from {self.store} for a whole session timeout; "
                        "stepping down",
                        now,
                        detail=f"{seconds:g} s",
                    )
                return self._d(
                    Action.CARRY_ON,
                    Reason.SUSPENDED_TOO_LONG,
                    "session timeout passed, but nothing to step down from",
                    now,
                )
            case Elected(vote=vote):
                if self.phase is Phase.VOTING:
                    self.elected_at = now
                    return self._d(
                        Action.LEAD,
                        Reason.ELECTED,
                        "elected auditor",
                        now,
                        detail=vote,
                        phase=Phase.LEADING,
                    )
                if leading:
                    return self._d(
                        Action.CARRY_ON, Reason.ELECTED, "already leading", now, detail=vote
                    )
                return self._d(
                    Action.STEP_DOWN,
                    Reason.ELECTED,
                    f"elected while {self.phase}; withdrawing the vote",
                    now,
                    detail=vote,
                    level="warning",
                )
            case CampaignFailed(error=error):
                if self.phase is not Phase.VOTING:
                    return self._d(
                        Action.CARRY_ON,
                        Reason.CAMPAIGN_FAILED,
                        f"election attempt ended while {self.phase}",
                        now,
                        detail=error,
                    )
                return self._back_off(Reason.CAMPAIGN_FAILED, "election attempt failed", now, error)
            case VoteLost():
                if leading:
                    lasted = now - self.elected_at if self.elected_at is not None else 0.0
                    if lasted < SHORT_TERM:
                        # Won and lost at once: two rules disagree on who leads, or a
                        # rival keeps taking first place. Voting again at once would
                        # loop; it is a failure, backed off and counted.
                        self.elected_at = None
                        return self._back_off(
                            Reason.VOTE_LOST,
                            f"our vote lost first place {lasted:.1f} s after we were elected",
                            now,
                            "",
                        )
                    return self._step_down(
                        Reason.VOTE_LOST, "our vote is gone or no longer first; stepping down", now
                    )
                return self._d(
                    Action.CARRY_ON, Reason.VOTE_LOST, "vote gone while not leading", now
                )
            case FencedOut(error=error):
                if leading:
                    return self._step_down(
                        Reason.FENCED_OUT,
                        "a fenced write was refused; stepping down",
                        now,
                        detail=error,
                    )
                return self._d(
                    Action.CARRY_ON,
                    Reason.FENCED_OUT,
                    "a fenced write was refused while not leading",
                    now,
                    detail=error,
                )
            case WorkFailed(error=error):
                return self._work_over(Reason.LEADER_WORK_FAILED, "leader work failed", now, error)
            case WorkEnded():
                return self._work_over(
                    Reason.LEADER_WORK_ENDED, "leader work ended by itself", now, ""
                )
            case StopRequested(why=why):
                if done:
                    return self._d(Action.CARRY_ON, Reason.STOP_REQUESTED, "already stopping", now)
                message = (
                    "stopping; handing leadership over"
                    if leading
                    else "stopping; leaving the election"
                )
                if leading:
                    self._term_ended(now, failed=False)
                return self._d(
                    Action.EXIT,
                    Reason.STOP_REQUESTED,
                    message,
                    now,
                    detail=why,
                    phase=Phase.STOPPING,
                )
            case StepDownRequested(by=by):
                if leading:
                    self._term_ended(now, failed=False)
                    return self._d(
                        Action.STEP_DOWN,
                        Reason.STEP_DOWN_REQUESTED,
                        "step-down requested; stepping down",
                        now,
                        detail=by,
                        level="warning",
                        phase=Phase.VOTING,
                    )
                return self._d(
                    Action.CARRY_ON,
                    Reason.STEP_DOWN_REQUESTED,
                    "step-down requested, but this daemon does not lead",
                    now,
                    detail=by,
                )
            case ConfigReloaded():
                if leading:
                    return self._d(
                        Action.RESTART_WORK,
                        Reason.CONFIG_RELOADED,
                        "configuration reloaded; restarting leader work",
                        now,
                    )
                return self._d(
                    Action.CARRY_ON, Reason.CONFIG_RELOADED, "configuration reloaded", now
                )
            case DuplicateIdentity(vote=vote):
                if self.phase in (Phase.STARTING, Phase.VOTING, Phase.BACKING_OFF):
                    return self._d(
                        Action.REFUSE,
                        Reason.DUPLICATE_IDENTITY,
                        f"another {self.store} session holds a vote with this daemon's identity; "
                        "refusing to vote (give each daemon its own daemon.identity)",
                        now,
                        detail=vote,
                        level="error",
                        phase=Phase.REFUSED,
                    )
                return self._d(
                    Action.CARRY_ON,
                    Reason.DUPLICATE_IDENTITY,
                    f"another session's vote carries this daemon's identity (while {self.phase})",
                    now,
                    detail=vote,
                    level="warning",
                )
            case DuplicateCleared():
                if self.phase is Phase.REFUSED:
                    return self._d(
                        Action.VOTE,
                        Reason.DUPLICATE_CLEARED,
                        "no other session's vote carries this daemon's identity now; voting",
                        now,
                        phase=Phase.VOTING,
                    )
                return self._d(
                    Action.CARRY_ON, Reason.DUPLICATE_CLEARED, "no duplicate identity", now
                )
            case OtherElectionLeader(election=election, holder=holder):
                return self._other_election(election, holder, now)
            case OtherElectionCleared():
                if self.phase is Phase.OTHER_ELECTION:
                    return self._d(
                        Action.VOTE,
                        Reason.OTHER_ELECTION_CLEARED,
                        "the other metadata driver's election has no live holder now; voting",
                        now,
                        phase=Phase.VOTING,
                    )
                return self._d(
                    Action.CARRY_ON,
                    Reason.OTHER_ELECTION_CLEARED,
                    "no live holder in the other election",
                    now,
                )
            case BackoffElapsed():
                if self.phase is Phase.BACKING_OFF:
                    return self._d(
                        Action.VOTE,
                        Reason.BACKOFF_ELAPSED,
                        "back-off over; voting again",
                        now,
                        phase=Phase.VOTING,
                    )
                return self._d(
                    Action.CARRY_ON,
                    Reason.BACKOFF_ELAPSED,
                    f"back-off over while {self.phase}",
                    now,
                )
            case TaskEnded(task=task, error=error):
                if done:
                    return self._d(
                        Action.CARRY_ON,
                        Reason.TASK_ENDED,
                        f"the {task} task ended while {self.phase}",
                        now,
                        detail=error,
                    )
                self.elected_at = None
                return self._d(
                    Action.FAIL,
                    Reason.TASK_ENDED,
                    f"the {task} task ended; not serving, exiting non-zero so that the "
                    "service manager restarts the daemon",
                    now,
                    detail=error,
                    level="error",
                    phase=Phase.ENDED,
                )
        raise TypeError(f"not a leadership event: {event!r}")  # pragma: no cover

    def _other_election(self, election: str, holder: str, now: float) -> Decision:
        """Out of the election (a leader steps down) while the other one has a holder."""
        if self.phase in (Phase.STARTING, Phase.VOTING, Phase.BACKING_OFF, Phase.LEADING):
            if self.phase is Phase.LEADING:
                self._term_ended(now, failed=False)
            what = "stepping down and staying out" if self.phase is Phase.LEADING else "not voting"
            return self._d(
                Action.REFUSE,
                Reason.OTHER_ELECTION_LEADER,
                f"the {election} election has a live auditor too, so the cluster's nodes "
                f"disagree on the metadata driver and two auditors would run; {what} until "
                "it is gone (give every node the same metadataServiceUri driver)",
                now,
                detail=holder,
                level="error",
                phase=Phase.OTHER_ELECTION,
            )
        return self._d(
            Action.CARRY_ON,
            Reason.OTHER_ELECTION_LEADER,
            f"the {election} election has a live auditor (while {self.phase})",
            now,
            detail=holder,
            level="warning",
        )

    def _work_over(self, reason: Reason, what: str, now: float, error: str) -> Decision:
        if self.phase is not Phase.LEADING:
            return self._d(Action.CARRY_ON, reason, f"{what} while {self.phase}", now, detail=error)
        self._term_ended(now, failed=True)
        return self._back_off(reason, f"{what}; stepping down", now, error)
