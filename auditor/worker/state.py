"""`status` and the metrics must always agree about the worker, so the worker records what
it does in one place, and nowhere else, and both read it from there (as the daemon's
`DaemonState` is read).

What the replication worker has done and is doing, for `status`, the metrics and the logs.

The metrics read it at scrape time and `status` shows the ledgers in hand. Counters
only grow; the ledgers in hand and the unrecoverable ones are current.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

from auditor.worker.risk import QueueRisk


class Failure(enum.StrEnum):
    """Why a ledger's repair did not finish: the `reason` label of the failures metric."""

    NO_TARGET = "no_target"  # no writable bookie may take the position
    TARGET_FAILED = "target_failed"  # the new bookie refused or stopped answering
    UNRECOVERABLE = "unrecoverable"  # an entry has no readable copy anywhere
    SOURCE_FAILED = "source_failed"  # a source failed a read or did not answer: retried soon
    UNKNOWN_BOOKIES = "unknown_bookies"  # a registered member did not answer: judged later
    METADATA_CONFLICT = "metadata_conflict"  # the metadata kept changing under the update
    VERIFY_FAILED = "verify_failed"  # after the commit, the ledger still lacks copies
    LOCK_LOST = "lock_lost"  # the session (and so the lock) went: nothing committed
    OPEN_LEDGER = "open_ledger"  # the under-replicated tail of an open ledger: deferred
    ERROR = "error"  # anything else (ZooKeeper unavailable, a bookie error, ...)


@dataclass(frozen=True, slots=True)
class InHand:
    """A ledger this worker holds the lock of, and what it is doing with it."""

    ledger_id: int
    since: float
    #: "planning", "re-verifying" (reading back the copies of the bookies a mark names),
    #: "copying", "committing", "verifying", "deferred" (lock held until
    #: `until`), "recovering" (an open ledger being fenced and closed).
    step: str
    #: One line per fragment: "segment 0 [0-99] position 1 bookie-3:3181 -> bookie-7:3181".
    fragments: tuple[str, ...] = ()
    until: float | None = None


@dataclass(frozen=True, slots=True)
class Unrecoverable:
    """A ledger with entries that no bookie can serve: reported, its mark kept."""

    ledger_id: int
    #: Inclusive entry ranges with no readable copy.
    ranges: tuple[tuple[int, int], ...]
    since: float
    #: When the worker tries it again (wall clock).
    retry_at: float


@dataclass
class WorkerState:
    enabled: bool = False
    running: bool = False
    #: Why the worker waits, when it does ("replication disabled", "no marked ledger", ...).
    waiting: str = ""
    ledgers_replicated: int = 0
    #: Ledgers whose mark was removed with nothing to copy (their bookies came back).
    ledgers_found_healthy: int = 0
    fragments_replicated: int = 0
    #: The same fragments by why their bookie was replaced (`Repair.why`: lost,
    #: missing_entries, requested, not_adhering, corrupt_copy, unreadable_copy).
    fragments_by_reason: Counter[str] = field(default_factory=Counter)
    #: Entries read back from the bookies a mark names, before calling a ledger whole
    #: (`worker/reverify.py`).
    entries_reverified: int = 0
    #: Open ledgers this worker fenced, recovered and closed; recoveries that failed.
    ledgers_recovered: int = 0
    recoveries_failed: int = 0
    entries_read: int = 0
    entries_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    failures: Counter[Failure] = field(default_factory=Counter)
    #: Seconds locks were held, summed, and how many were released.
    lock_seconds: float = 0.0
    locks_released: int = 0
    in_hand: dict[int, InHand] = field(default_factory=dict)
    unrecoverable: dict[int, Unrecoverable] = field(default_factory=dict)
    #: The marked ledgers by risk, as this worker last ranked them (at each take, and
    #: when marks or locks change meanwhile); None before its first ranking.
    queue: QueueRisk | None = None

    @property
    def copies_in_flight(self) -> int:
        return sum(1 for h in self.in_hand.values() if h.step == "copying")

    def released(self, held_for: float) -> None:
        self.lock_seconds += held_for
        self.locks_released += 1
