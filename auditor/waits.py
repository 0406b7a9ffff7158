"""The daemon, its cluster-freshness watcher and the replication worker all wait for "any of
these watches fired, or a safety interval passed", and such a wait easily leaks its waiter
tasks when it ends or is cancelled.

Waiting for the first of several asyncio events, with a bound; one function keeps the
waiter tasks from leaking.
"""

from __future__ import annotations

import asyncio


async def until_any(*events: asyncio.Event, within: float | None = None) -> None:
    """Returns when any of `events` is set, or after `within` seconds (None: no bound)."""
    if not events:  # nothing to wait for but the bound
        await (asyncio.sleep(within) if within is not None else asyncio.Event().wait())
        return
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
