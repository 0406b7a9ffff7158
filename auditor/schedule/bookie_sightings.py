"""A new leader must not audit a bookie that went down with the old leader until
`lostBookieRecoveryDelay` has passed since it went missing, and only a process that was
already watching can say when that was.

When this process first saw each bookie missing: the clock of the restart rule.

A restart is not a failure. With the daemon beside each bookie, restarting a
host restarts the leader and its bookie together; the next leader is elected
while that bookie is still down. Upstream's auditor audits every missing bookie
at once when it becomes leader, so each such restart marks the bookie's ledgers
(and a replication worker would copy them all). Here every daemon, followers
included, watches `available/` and notes when each bookie disappears; a new
leader then waits `lostBookieRecoveryDelay` from that moment (at the latest
from its own election) before auditing it (`LostBookieDelay.leader_started`).

Pure: sets of available bookies with explicit timestamps in, "missing since"
out. Timestamps are whatever clock the caller uses (the daemon: monotonic).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class BookieSightings:
    """Which bookies this process saw available, and since when each is missing."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._missing_since: dict[str, float] = {}
        self._observed = False

    @property
    def observed(self) -> bool:
        """Whether any set of available bookies was observed yet."""
        return self._observed

    def observe(self, available: Iterable[str], now: float) -> None:
        """The writable and read-only bookies (their union) as read at `now`.

        A bookie seen before and absent now is missing from `now` on, unless it
        was already missing (the earlier moment stands); one present again is
        no longer missing.
        """
        avail = frozenset(available)
        for bookie in self._seen - avail:
            self._missing_since.setdefault(bookie, now)
        for bookie in avail:
            self._missing_since.pop(bookie, None)
        self._seen |= avail
        self._observed = True

    def missing_since(self) -> Mapping[str, float]:
        """Every bookie seen available once and missing at the last observation."""
        return dict(self._missing_since)
