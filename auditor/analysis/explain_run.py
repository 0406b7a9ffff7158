"""An explanation must see what a check run would see now, so its inputs are fresh reads
taken through the drivers' own per-ledger functions; that I/O is kept apart from the pure
assembly in `explain.py`.

Gathering what `explain` needs for one ledger, through the checks' own I/O paths.

Metadata and the mark are fresh reads (never the leader's index: an
explanation is about now); a corrupt mark is explained as one (its path and
what is wrong), as the checks treat it. Everything else goes through the drivers' public
per-ledger functions, the ones their runs call: bookies are asked by
`replicas_run.bookie_answers`, the policy is `placement_run.placement_policy`
over racks from the configured sources, and the ledger check's sampled reads
are `ledger_check_run.ledger_violation`. Nothing is written. The assembly is
`explain.explain`.
"""

from __future__ import annotations

import random
from typing import Any

from auditor.analysis.explain import ExplainInputs, LedgerCheckResult, explain, explain_invalid
from auditor.checks.context import CheckContext, open_context
from auditor.checks.ledger_check_run import ledger_violation
from auditor.checks.placement_run import placement_policy
from auditor.checks.replicas_run import bookie_answers
from auditor.config import AuditorConfig
from auditor.errors import NotFoundError
from auditor.metadata.layout import LedgerManager

# The one rule for ledger ids; `explain`'s argument is checked by it (re-exported for the CLI).
from auditor.metadata.paths import check_ledger_id as check_ledger_id
from auditor.metadata.registry import all_known_bookies
from auditor.metadata.walk import LedgerWalker
from auditor.store import MetadataStore
from auditor.topology.racks import open_rack_resolver_or_blind


class LedgerNotFoundError(NotFoundError):
    """The ledger asked about has no metadata under the ledgers root."""


async def explain_ledger(
    ctx: CheckContext, ledger_id: int, *, rng: random.Random | None = None
) -> dict[str, Any]:
    """The explanation document of one ledger; LedgerNotFoundError when it does not exist."""
    check_ledger_id(ledger_id)
    rec = await LedgerWalker(ctx.store, ctx.root, ctx.manager).read(ledger_id)
    if rec is None:
        raise LedgerNotFoundError(f"ledger {ledger_id} does not exist under {ctx.root}")
    # A corrupt mark is named, not a failure: it still marks the ledger.
    mark = await ctx.urm.get_mark(ledger_id)
    grace = ctx.config.bookkeeper.underreplicatedLedgerRecoveryGracePeriod
    now_ms = int(ctx.clock() * 1000)
    md = rec.metadata
    if md is None:
        reason = rec.error.reason if rec.error is not None else "metadata missing"
        return explain_invalid(ledger_id, rec.path, rec.znode_version, reason, mark, grace, now_ms)
    registered = await ctx.registered()
    resolver, racks_unreadable = await open_rack_resolver_or_blind(
        ctx.store, ctx.root, ctx.config, log=ctx.log
    )
    known = registered.available | await all_known_bookies(ctx.store, ctx.root)
    mine = md.bookies()
    located = await resolver.locations(sorted(known | mine))
    policy = placement_policy(ctx.config.bookkeeper, known, located)
    sources = {b: src for b in sorted(mine) if (src := resolver.source_of(b)) is not None}
    answers = await bookie_answers(ctx, md)
    if await ctx.urm.is_replication_enabled():
        ledgers = LedgerCheckResult(await ledger_violation(ctx, md, rec.znode_version, rng=rng))
    else:
        ledgers = LedgerCheckResult(None, replication_enabled=False)
    return explain(
        ExplainInputs(
            md=md,
            path=rec.path,
            znode_version=rec.znode_version,
            answers=answers,
            locations={b: loc for b, loc in located.items() if b in mine},
            rack_sources=sources,
            policy=policy,
            registered=registered,
            mark=mark,
            grace_period_s=grace,
            now_ms=now_ms,
            ledgers=ledgers,
            racks_unreadable=racks_unreadable,
        )
    )


async def explain_on_cluster(
    store: MetadataStore, root: str, manager: LedgerManager, config: AuditorConfig, ledger_id: int
) -> dict[str, Any]:
    """`explain_ledger` with a bookie client of its own (the daemon's API, any node)."""
    async with open_context(store, root, manager, config, mark=False) as ctx:
        return await explain_ledger(ctx, ledger_id)
