"""A check over millions of ledgers runs for minutes or hours, and the operator (and the
daemon's `status`) wants to know how far it is, without the run counting its ledgers first.

Progress lines for long runs: ledgers done, rate, and an ETA.

The walk is in id order, so the ETA comes from how far the current id is
through the id range (the largest id is three cheap listings away), without
counting ledgers first.

A run can also report its progress to whoever runs it (the daemon's `status` and
metrics): `reporting_progress(hook)` around the run, and every `Progress` made
inside it calls `hook(done, total_estimate)` on its first ledger and then at most
every `HOOK_INTERVAL` seconds, so a tick stays a counter and a clock read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

#: Told (ledgers done, an estimate of the ledgers the walk will see, None while unknown).
ProgressHook = Callable[[int, int | None], None]

#: Seconds between two calls of a run's progress hook.
HOOK_INTERVAL = 0.5

_hook: ContextVar[ProgressHook | None] = ContextVar("progress_hook", default=None)


@contextmanager
def reporting_progress(hook: ProgressHook | None) -> Iterator[None]:
    """Every `Progress` created inside (in this task) reports to `hook`."""
    token = _hook.set(hook)
    try:
        yield
    finally:
        _hook.reset(token)


class Progress:
    def __init__(
        self,
        log: Any,
        check: str,
        *,
        interval: float = 30.0,
        max_ledger_id: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_progress: ProgressHook | None = None,
    ) -> None:
        self.log = log
        self.check = check
        self.interval = interval
        self.max_ledger_id = max_ledger_id
        self.clock = clock
        self.started = clock()
        self.next_report = self.started + interval
        self.done = 0
        self.first_id: int | None = None
        self.on_progress = on_progress if on_progress is not None else _hook.get()
        self.next_hook = self.started

    def total_estimate(self, ledger_id: int) -> int | None:
        """The ledgers the walk will have seen, extrapolated from how densely the ids so
        far are used over the id range (None before a second id, or without a largest id)."""
        if self.max_ledger_id is None or self.first_id is None or ledger_id <= self.first_id:
            return None
        span = max(self.max_ledger_id, ledger_id) - self.first_id + 1
        return max(self.done, round(self.done * span / (ledger_id - self.first_id + 1)))

    def tick(self, ledger_id: int) -> None:
        self.done += 1
        if self.first_id is None:
            self.first_id = ledger_id
        now = self.clock()
        if self.on_progress is not None and now >= self.next_hook:
            self.next_hook = now + HOOK_INTERVAL
            self.on_progress(self.done, self.total_estimate(ledger_id))
        if now < self.next_report:
            return
        self.next_report = now + self.interval
        elapsed = max(now - self.started, 1e-9)
        fields: dict[str, Any] = {
            "check": self.check,
            "ledgers_done": self.done,
            "rate_per_s": round(self.done / elapsed, 1),
        }
        if self.max_ledger_id is not None and ledger_id > self.first_id:
            covered = ledger_id - self.first_id
            remaining = max(self.max_ledger_id - ledger_id, 0)
            fields["eta_s"] = round(elapsed * remaining / covered, 1)
        self.log.info("check progress", **fields)
