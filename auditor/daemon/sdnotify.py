"""systemd's notify protocol (`Type=notify`, `WatchdogSec=`) without a dependency.

The protocol is one datagram of newline-separated `KEY=VALUE` lines to the
AF_UNIX socket named by `$NOTIFY_SOCKET` (a leading `@` means the abstract
namespace). Outside systemd the variable is unset and every call is a no-op,
so the daemon calls these unconditionally. A failed send is reported, never
raised: losing a status line must not take the auditor down (a missed
watchdog ping is systemd's to act on).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

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

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


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
