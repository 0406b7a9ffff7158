"""A daemon's happenings as asyncio events, for tests (and the demo) that wait on them.

Why: tests wait for "the next decision", "the next read of who leads", "the next check
run" and then look at the daemon's state; the daemon itself keeps no events for that,
it tells its `listeners` what happened (`Happening`). `events_of(daemon)` turns that
into one `asyncio.Event` per kind of happening, set each time; `until` in
`auditor.testing.inprocess` clears an event before each look, so nothing is missed.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field

from auditor.daemon.service import Daemon
from auditor.daemon.state import Happening


@dataclass
class DaemonEvents:
    """One event per `Happening`, set each time the daemon tells it."""

    decided: asyncio.Event = field(default_factory=asyncio.Event)
    leader_read: asyncio.Event = field(default_factory=asyncio.Event)
    check_ended: asyncio.Event = field(default_factory=asyncio.Event)
    acls_checked: asyncio.Event = field(default_factory=asyncio.Event)
    znode_read: asyncio.Event = field(default_factory=asyncio.Event)
    selftest_reported: asyncio.Event = field(default_factory=asyncio.Event)
    risk_reported: asyncio.Event = field(default_factory=asyncio.Event)

    def tell(self, what: Happening) -> None:
        event: asyncio.Event = getattr(self, what.value)
        event.set()


_EVENTS: weakref.WeakKeyDictionary[Daemon, DaemonEvents] = weakref.WeakKeyDictionary()


def events_of(daemon: Daemon) -> DaemonEvents:
    """`daemon`'s events, listening from the first call on (call it before `run` to miss
    nothing: `inprocess.running` does)."""
    events = _EVENTS.get(daemon)
    if events is None:
        events = _EVENTS[daemon] = DaemonEvents()
        daemon.listeners.append(events.tell)
    return events
