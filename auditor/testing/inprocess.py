"""Several integration tests (and the demo) run `Daemon` in-process so they can read its
state, trigger checks and capture its logs, and all need the same quick configuration and a
daemon that stops however the test ends.

A daemon in the test's own process, on the loop that serves the emulated bookies.

What they share: a configuration with fast retries and hour-long intervals (checks run
in the first round and when triggered), and a context manager that runs the
daemon and stops it however the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from auditor.daemon.config import DaemonConfig, load_daemon_config
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.testing.observe import events_of

#: Every periodic check once an hour (so: in the first round, then on trigger), short
#: timeouts and retry delays, no jitter.
FAST = (
    "daemon.jitter=0",
    "auditorPeriodicBookieCheckInterval=3600",
    "auditorPeriodicCheckInterval=3600",
    "auditorPeriodicPlacementPolicyCheckInterval=3600",
    "auditorReplicasCheckInterval=3600",
    "underreplicatedLedgerRecoveryGracePeriod=3600",
    "readEntryTimeout=1",
    "checks.retry_delay=0.2",
    "checks.retry_attempts=1",
    # Free loopback ports: a fixed default would collide with any other daemon on the
    # machine (another test run, a demo) and end this one at start.
    "api.host=127.0.0.1",
    "api.port=0",
    "metrics.host=127.0.0.1",
    "metrics.port=0",
    # The auditor's tests observe the marks a check writes; a worker would repair them
    # away (the worker's own tests turn it on).
    "worker.enabled=false",
)


def fast_config(hosts: str, identity: str, extra: Sequence[str] = ()) -> DaemonConfig:
    """FAST, then `extra` (later settings win)."""
    return load_daemon_config(
        None,
        [f"daemon.zk={hosts}", f"daemon.identity={identity}", *FAST, *extra],
        env={},
    )


@contextlib.asynccontextmanager
async def running(
    config: DaemonConfig, metrics: Metrics | None = None, *, api_factory: Any = None
) -> AsyncIterator[Daemon]:
    """`api_factory` as `Daemon.run` takes it: the daemon serves its API (health probes)."""
    daemon = Daemon(config, metrics=metrics)
    events_of(daemon)  # listening before it runs: tests wait on its events
    run = asyncio.ensure_future(daemon.run(api_factory=api_factory, signals=False))
    try:
        yield daemon
    finally:
        # A daemon that ended by itself failed (a port in use, a bad config): that is
        # the cause of whatever the test saw, so it is what the test reports.
        failed = run.exception() if run.done() and not run.cancelled() else None
        daemon.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(run), 30)
        if not run.done():  # never leave a daemon (and its ZooKeeper session) behind
            run.cancel()
            with contextlib.suppress(BaseException):
                await run
        if failed is not None:
            raise RuntimeError(f"the daemon ended by itself: {failed}") from failed


async def until(
    event: asyncio.Event, done: Callable[[], bool], what: str, within: float = 60
) -> None:
    """Waits on `event` (one of `events_of(daemon)`, set at each change) until `done()`
    holds.

    The event is cleared before each look, so a change between the look and the wait
    is never missed; an AssertionError names `what` when `within` seconds pass.
    """
    deadline = time.monotonic() + within
    while True:
        event.clear()
        if done():
            return
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"not within {within}s: {what}"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), remaining)
