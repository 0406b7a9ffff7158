"""Waiting out a metadata-store outage, then trying again: the one rule for every read
of the daemon that an outage must interrupt but not end.

Why: the election's reads (the rivals, the other driver's election, our vote) and the
bookie watch each used to catch `StoreUnavailableError`, pause and wait for the
connection in a copy of their own. The rule: a call that finds the store unavailable
pauses a moment (the session state change that explains the error is on its way and
clears the `connected` event), then waits until the session is connected again, or
until `stop` is set, and the call is made again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from auditor.store import StoreUnavailableError
from auditor.waits import until_any

T = TypeVar("T")

#: The pause after an unavailable store, before looking at the connection (s): the
#: state change that explains the error arrives meanwhile.
SETTLE = 0.1


async def wait_out_outage(connected: asyncio.Event, stop: asyncio.Event | None = None) -> None:
    """After a call found the store unavailable: a short pause, then until the session
    is connected again (or `stop` is set)."""
    await asyncio.sleep(SETTLE)
    await until_any(connected, *(() if stop is None else (stop,)))


async def when_available(
    call: Callable[[], Awaitable[T]],
    connected: asyncio.Event,
    stop: asyncio.Event | None = None,
) -> T | None:
    """`call()`'s result, called again after each outage (`wait_out_outage`) for as long
    as it raises `StoreUnavailableError`; None when `stop` was set meanwhile. Other
    errors propagate."""
    while True:
        try:
            return await call()
        except StoreUnavailableError:
            await wait_out_outage(connected, stop)
            if stop is not None and stop.is_set():
                return None
