"""systemd's notify protocol (`Type=notify`, `WatchdogSec=`) without a dependency.

The protocol is one datagram of newline-separated `KEY=VALUE` lines to the
AF_UNIX socket named by `$NOTIFY_SOCKET` (a leading `@` means the abstract
namespace). Outside systemd the variable is unset and every call is a no-op,
so the daemon calls these unconditionally. A failed send is reported, never
raised: losing a status line must not take the auditor down (a missed
watchdog ping is systemd's to act on).

`status_line` says in one line where the daemon stands (`systemctl status`
shows it as "Status:"); `Notifier.show` sends it only when it changed, so the
daemon may call it on every decision and on its heartbeat at no cost beyond
formatting a short string.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

from auditor.daemon.leadership import Phase
from auditor.daemon.state import DaemonState, Outcome
from auditor.logs import get_logger

log = get_logger("auditor.sdnotify")


def _address(raw: str) -> str | None:
    if not raw:
        return None
    if raw.startswith("@"):
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    return None  # vsock and other forms: not for us


class Notifier:
    """Sends state changes to systemd; inert when not started by systemd."""

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        self.address = _address(env.get("NOTIFY_SOCKET", ""))
        self._sock: socket.socket | None = None
        #: The last STATUS line systemd got from `show` (None: none yet, or it failed).
        self.shown: str | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, **fields: str | int) -> bool:
        """Sends `KEY=VALUE` lines (keys upper-cased); True when systemd got them."""
        if self.address is None or not fields:
            return False
        lines = []
        for key, value in fields.items():
            text = str(value).replace("\n", " ")
            lines.append(f"{key.upper()}={text}")
        payload = ("\n".join(lines) + "\n").encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(payload, self.address)
        except OSError as exc:
            log.warning("sd_notify failed", socket=self.address.lstrip("\0"), error=str(exc))
            self.close()
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify(READY=1, **({"STATUS": status} if status else {}))

    def stopping(self, status: str | None = None) -> bool:
        return self.notify(STOPPING=1, **({"STATUS": status} if status else {}))

    def reloading(self) -> bool:
        return self.notify(RELOADING=1)

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG=1)

    def status(self, text: str) -> bool:
        return self.notify(STATUS=text)

    def show(self, state: DaemonState) -> bool:
        """Sends `status_line(state)` when it differs from the last one shown; True
        when a line was sent."""
        if self.address is None:
            return False
        line = status_line(state)
        if line == self.shown:
            return False
        sent = self.status(line)
        self.shown = line if sent else None
        return sent

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _clock(at: float) -> str:
    """Wall-clock time of day in UTC, as `systemctl status` shows no date for today."""
    return time.strftime("%H:%M:%SZ", time.gmtime(at))


def _last_check(state: DaemonState) -> str:
    """The check that ended last on this node, its outcome and when."""
    ended = [cs for cs in state.checks.values() if cs.last_finished is not None]
    running = sorted(str(cs.check) for cs in state.checks.values() if cs.outcome is Outcome.RUNNING)
    if not ended:
        text = "no check ended yet"
    else:
        cs = max(ended, key=lambda c: c.last_finished or 0.0)
        assert cs.last_finished is not None
        outcome = {
            Outcome.OK: "clean",
            Outcome.VIOLATIONS: "found violations",
            Outcome.FAILED: "failed",
            Outcome.SKIPPED: "skipped",
        }.get(cs.outcome, str(cs.outcome))
        text = f"last check {cs.check} {outcome} at {_clock(cs.last_finished)}"
    if running:
        text += f"; running {', '.join(running)}"
    return text


def status_line(state: DaemonState) -> str:
    """Where the daemon stands, in one line for systemd's STATUS.

    It changes with the leadership phase, the metadata store's connection, the leader a
    follower sees and the checks a leader ends; times are absolute (UTC), so a line
    sent once stays true until the next one.
    """
    last = state.decisions[-1] if state.decisions else None
    phase = state.phase
    if phase is Phase.STOPPING:
        return "stopping: handing over leadership"
    if phase is Phase.ENDED:
        return f"exiting: {last.message if last else 'a supervised task ended'}"
    if not state.zk_connected:
        held = " (leading; new checks wait)" if phase is Phase.LEADING else ""
        return f"waiting for {state.store}{held}"
    if phase is Phase.LEADING:
        line = f"leading; {_last_check(state)}"
        if not state.replication_enabled:
            line += "; autorecovery disabled"
        return line
    if phase is Phase.VOTING:
        if state.leader and state.leader != state.identity:
            return f"following {state.leader}"
        return "voting; no auditor elected yet"
    if phase is Phase.BACKING_OFF:
        until = f" until {_clock(state.backoff_until)}" if state.backoff_until else ""
        why = ""
        if last is not None:
            # The message's "voting again in N s" is relative: the time above says it.
            why = f": {last.message.split('; voting again in ')[0]}"
            why += f" ({last.detail})" if last.detail else ""
        return f"backing off{until}{why}"
    if phase is Phase.REFUSED:
        vote = f" ({state.duplicate_vote})" if state.duplicate_vote else ""
        return f"not voting: another session holds a vote as {state.identity}{vote}"
    if phase is Phase.OTHER_ELECTION:
        other = state.other_election
        if other is not None:
            who = other.holder or other.path
            return f"not voting: {who} leads the {other.election} election"
        return "not voting: the other metadata driver's election has a leader"
    return f"starting: connected to {state.store}, not yet voting"


def watchdog_interval(env: Mapping[str, str] = os.environ) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of `WatchdogSec`), or None when none is asked.

    `WATCHDOG_PID`, when set, names the process that must ping; any other
    process (a child) must not.
    """
    pid = env.get("WATCHDOG_PID")
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 2 / 1_000_000


def notify(env: Mapping[str, str] = os.environ, **fields: str | int) -> bool:
    """One message on a socket of its own (for a process that pings rarely)."""
    notifier = Notifier(env)
    try:
        return notifier.notify(**fields)
    finally:
        notifier.close()
