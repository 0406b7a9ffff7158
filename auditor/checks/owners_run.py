"""An owner's name matters only for the few ledgers a run flags, and the leader's metadata
index keeps no custom metadata (it would cost every healthy ledger bytes), so owners are
looked up after the check, for the flagged ledgers only.

Finding the Pulsar owners of a report's flagged ledgers, after the check.

Each lookup is a fresh read of the ledger's znode, `checks.ledger_concurrency` at a time
(the checks' pool); a ledger deleted meanwhile simply has no owner. Equal owners are
stored once, so memory follows the distinct owners and the flagged ledgers, never the
whole cluster. The lookup is an annotation, not part of the verdict: if ZooKeeper fails
during it, the report goes out with the owners found so far.
"""

from __future__ import annotations

from auditor.checks.context import CheckContext
from auditor.checks.findings import CheckReport
from auditor.checks.owners import Owner, owner_of
from auditor.checks.pool import bounded
from auditor.errors import ServiceUnavailableError
from auditor.metadata.walk import LedgerWalker


async def attach_owners(ctx: CheckContext, report: CheckReport) -> None:
    """Fills `report.owners` for every flagged ledger whose metadata names an owner."""
    wanted = sorted({v.ledger_id for v in report.violations} - report.owners.keys())
    if not wanted:
        return
    walker = LedgerWalker(ctx.store, ctx.root, ctx.manager)
    interned: dict[Owner, Owner] = {}

    async def one(ledger_id: int) -> None:
        rec = await walker.read(ledger_id)
        if rec is None or rec.metadata is None:
            return
        owner = owner_of(rec.metadata.custom_metadata)
        if owner is not None:
            report.owners[ledger_id] = interned.setdefault(owner, owner)

    try:
        await bounded(wanted, one, ctx.config.checks.ledger_concurrency)
    except ServiceUnavailableError as exc:
        ctx.log.warning(
            "owners of flagged ledgers not all known: metadata store failed",
            check=str(report.check),
            found=len(report.owners),
            flagged=len(wanted),
            error=str(exc),
        )
