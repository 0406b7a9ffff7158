"""Every driver that does I/O per ledger must bound its work in progress without reading the
walk far ahead, and end cleanly on an error or a cancellation; getting that right once is
easier than in every driver.

At most N pieces of work in progress at once: the one bounded task pool of the checks.

The drivers that do I/O per ledger (the replicas and ledger checks), the bookie
check's marks, the owners look-up and the ledger check's entry reads all run
`work(item)` for the items of a stream, a bounded number at a time. At most
one item is taken ahead of the work (the one waiting for a slot), so a walk is
never read far ahead and memory follows the bound, not the number of ledgers.

How it ends:
- normally, when every item's work has finished;
- when a piece of work raises: no new item is taken, the work in progress runs
  to its end (its ledgers are recorded), then the first error is raised;
- when cancelled from outside (the daemon stopping, a caller's timeout): the
  work in progress is cancelled and awaited before the cancellation goes on.

Waiting for a slot can be reported: `slow(item)` is called each time the wait
for one item's slot passes `slow_after` seconds (the ledger check's warning
about `auditorMaxNumberOfConcurrentOpenLedgerOperations`); the wait goes on,
since every call the work makes has its own timeout and a slot always frees.

Part of the one driver convention (see `auditor.checks`): no driver keeps a
pool of its own.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

__all__ = ["bounded"]

T = TypeVar("T")


async def bounded(
    items: AsyncIterable[T] | Iterable[T],
    work: Callable[[T], Coroutine[Any, Any, object]],
    limit: int,
    *,
    slow: Callable[[T], None] | None = None,
    slow_after: float = 0.0,
) -> None:
    """Runs `work(item)` for every item, at most `limit` at once (see the module)."""
    slots = asyncio.Semaphore(max(1, limit))
    tasks: set[asyncio.Task[object]] = set()
    failures: list[BaseException] = []

    def finished(task: asyncio.Task[object]) -> None:
        tasks.discard(task)
        slots.release()
        if not task.cancelled() and (exc := task.exception()) is not None:
            failures.append(exc)

    stream = _each(items)
    try:
        async for item in stream:
            if failures:
                break
            await _acquire(slots, item, slow, slow_after)
            task = asyncio.create_task(work(item))
            tasks.add(task)
            task.add_done_callback(finished)
        if tasks:
            await asyncio.wait(set(tasks))
    except BaseException:
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.wait(set(tasks))
        raise
    finally:
        await stream.aclose()
        if inspect.isasyncgen(items):
            await items.aclose()
    if failures:
        raise failures[0]


async def _each(items: AsyncIterable[T] | Iterable[T]) -> AsyncGenerator[T, None]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


async def _acquire(
    slots: asyncio.Semaphore, item: T, slow: Callable[[T], None] | None, slow_after: float
) -> None:
    if slow is None or slow_after <= 0:
        await slots.acquire()
        return
    while True:
        try:
            async with asyncio.timeout(slow_after):
                await slots.acquire()
            return
        except TimeoutError:
            slow(item)
