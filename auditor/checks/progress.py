"""Progress lines for long runs: ledgers done, rate, and an ETA.

The walk is in id order, so the ETA comes from how far the current id is
through the id range (the largest id is three cheap listings away), without
counting ledgers first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class Progress:
    def __init__(
        self,
        log: Any,
        check: str,
        *,
        interval: float = 30.0,
        max_ledger_id: int | None = None,
        clock: Callable[[], float] = time.monotonic,
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

    def tick(self, ledger_id: int) -> None:
        self.done += 1
        if self.first_id is None:
            self.first_id = ledger_id
        now = self.clock()
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
