"""Many tests wait for a node to hold a value, a leader to change or a directory to empty;
polling on a sleep is slow or flaky, and a watch alone can miss a change made before it was
set.

Waiting in tests for what a metadata store shows, woken by its watches.

Each look sets a watch; the wait ends at that watch, or after a second at most (a look
again covers a change made between the read and the watch being set), until the look is
what the test wants or the time is up (an assertion naming what was last seen).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: The longest a wait trusts one watch before it looks again.
RELOOK = 1.0


async def until_watched(
    look: Callable[[], Awaitable[tuple[T, asyncio.Event]]],
    done: Callable[[T], bool],
    within: float,
    what: str,
) -> T:
    """What `look` saw once `done` holds for it; `look` returns a value and the event its
    watch sets. AssertionError after `within` seconds, with `what` and the last value."""
    deadline = time.monotonic() + within
    while True:
        seen, changed = await look()
        if done(seen):
            return seen
        left = deadline - time.monotonic()
        assert left > 0, f"{what} not within {within}s (now {seen!r})"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), min(left, RELOOK))
