"""A violation found on one read of a ledger's metadata may be stale by the time it would be
reported (the ledger marked, re-replicated or deleted meanwhile), and the replicas and
ledger checks must look again the same way before they report.

BP-34's rule before any report: look at the ledger again, and judge it again if it changed.

A would-be violation found on one version of a ledger's metadata is not
reported on that first impression. First, for a check that honours marks, the
under-replication mark is looked up afresh (a ledger marked meanwhile belongs
to re-replication: dropped, `marked_meanwhile`); then the metadata is read
again from ZooKeeper:
- gone: skipped `deleted`, dropped `ledger_deleted`;
- a new znode version (an ensemble replaced, the ledger re-replicated or
  closed): judged again on it, `MAX_REANALYSES` looks in all; still changing
  after them, skipped `metadata_changing` and dropped `metadata_changed` (the
  next run will see it settled);
- the same version: reported.
A ledger set aside on the way (changed metadata here, a silent bookie before a
retry pass in the replicas check: the `doubt`) that ends with nothing reported
is counted once in `report.dropped`, under the cause that finally set it aside
(`RunRecorder.settle`).

The replicas and ledger checks both judge through `Reread.judge`. What a look
at one version is, and how a finding is reported, stay theirs: `look` records
the ledger's outcome itself (ok, skipped, ...) or returns a `Suspect`, and
`report` records a suspect that survived the re-read. Part of the one driver
convention (see `auditor.checks`): no driver keeps a re-read loop of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from auditor.checks.findings import DropCause, LedgerOutcome, SkipReason
from auditor.checks.recorder import RunRecorder
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.walk import LedgerRecord, Walker

__all__ = ["MAX_REANALYSES", "Look", "Reread", "Suspect"]

#: How often a ledger whose metadata keeps changing under us is judged in one run.
MAX_REANALYSES: Final = 3

F = TypeVar("F")


@dataclass(frozen=True, slots=True)
class Suspect(Generic[F]):
    """A would-be violation found on one version of the metadata, not reported yet."""

    finding: F


#: A look at one version of a decoded ledger: the outcome it recorded, a suspect to
#: re-read before reporting, or None when the ledger waits for a later pass (nothing
#: recorded: the replicas check's retry queue).
Look = Callable[[LedgerMetadata, LedgerRecord], Awaitable[LedgerOutcome | Suspect[F] | None]]
#: Records a suspect whose metadata was still the same when read again.
Report = Callable[[F], Awaitable[LedgerOutcome]]
#: A fresh look at the ledger's mark (ledger id, metadata version): its outcome, or None.
MarkLook = Callable[[int, int], Awaitable[LedgerOutcome | None]]


class Reread(Generic[F]):
    """One driver's re-read loop: its recorder, where it re-reads, how it reports."""

    def __init__(
        self,
        recorder: RunRecorder,
        walker: Walker,
        report: Report[F],
        *,
        marked: MarkLook | None = None,
    ) -> None:
        self.recorder = recorder
        self.walker = walker
        self.report = report
        self.marked = marked

    async def judge(
        self, rec: LedgerRecord, look: Look[F], *, doubt: DropCause | None = None
    ) -> LedgerOutcome | None:
        """How the ledger came out (recorded once); None when it waits for a later pass."""
        recorder = self.recorder
        for _ in range(MAX_REANALYSES):
            if rec.metadata is None:
                return recorder.metadata_invalid(rec)
            seen = await look(rec.metadata, rec)
            if seen is None:
                return None
            if not isinstance(seen, Suspect):
                return recorder.settle(seen, doubt)
            if self.marked is not None:
                marked = await self.marked(rec.ledger_id, rec.znode_version)
                if marked is not None:
                    return recorder.settle(marked, DropCause.MARKED_MEANWHILE)
            fresh = await self.walker.read(rec.ledger_id, rec.path)
            if fresh is None:
                recorder.log.info("ledger deleted while being checked", ledger_id=rec.ledger_id)
                deleted = recorder.skipped(rec.ledger_id, SkipReason.DELETED)
                return recorder.settle(deleted, DropCause.LEDGER_DELETED)
            if fresh.znode_version == rec.znode_version:
                return await self.report(seen.finding)
            recorder.log.info(
                "metadata changed during the check; analysing again",
                ledger_id=rec.ledger_id,
                old_version=rec.znode_version,
                new_version=fresh.znode_version,
            )
            doubt = DropCause.METADATA_CHANGED
            rec = fresh
        recorder.log.warning(
            "metadata kept changing; not judged this run",
            ledger_id=rec.ledger_id,
            attempts=MAX_REANALYSES,
        )
        changing = recorder.skipped(rec.ledger_id, SkipReason.METADATA_CHANGING, rec.znode_version)
        return recorder.settle(changing, doubt)
