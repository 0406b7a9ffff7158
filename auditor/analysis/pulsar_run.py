"""The Pulsar audit weighs each ledger by its risk, and the risk model sits above the checks
in the layers, so the audit's driver in `checks/` cannot call it; the whole audit is put
together here instead.

The whole Pulsar audit of one cluster: the checks it leans on, the risk, then the join.

`checks/pulsar_audit_run.py` holds the audit's driver, which takes each ledger's risk as
a callable. This module supplies it (`ledger_domains`: per closed ledger, the bookies,
racks and regions whose single loss would make it worse, from `analysis.risk`) and runs
the audit as `pulsar-audit` and the daemon do: the placement check (metadata only: the
unplaced ledgers), the replicas check unless told not to (bookies are asked: the entries
without a copy), the under-replication marks, then `run_pulsar_audit`. Nothing is
written to ZooKeeper.
"""

from __future__ import annotations

from typing import Any

from auditor.analysis.risk import domain_keys, ledger_risk, place_of
from auditor.checks.context import CheckContext
from auditor.checks.findings import Check, CheckReport
from auditor.checks.placement import skip_reason
from auditor.checks.pulsar_audit import DomainName, PulsarAudit
from auditor.checks.pulsar_audit_run import RiskOf, run_pulsar_audit, verdicts_of
from auditor.checks.runner import driver
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.registry import all_known_bookies
from auditor.topology.racks import open_rack_resolver


async def ledger_domains(ctx: CheckContext) -> RiskOf:
    """Per closed ledger, the domains whose single loss would make it worse."""
    resolver = await open_rack_resolver(ctx.store, ctx.root, ctx.config, log=ctx.log)
    available = (await ctx.registered()).available
    known = available | await all_known_bookies(ctx.store, ctx.root)
    located = await resolver.locations(sorted(known))
    keys = {b: domain_keys(b, place_of(located.get(b))) for b in known}

    def keys_of(bookie: str) -> Any:
        found = keys.get(bookie)
        if found is None:  # a bookie no registry knows: its own domain, no rack
            found = keys[bookie] = domain_keys(bookie, place_of(None))
        return found

    def risk_of(md: LedgerMetadata) -> tuple[DomainName, ...]:
        if skip_reason(md) is not None:
            return ()
        lr = ledger_risk(md, keys_of, available)
        return tuple((str(kind), name) for (kind, name), _ in lr.domains)

    return risk_of


async def audit_pulsar(
    ctx: CheckContext, *, replicas: bool = True
) -> tuple[CheckReport, PulsarAudit]:
    """The audit over the whole cluster of `ctx`, with the verdicts it joins."""
    # Placement reads metadata only (unplaced ledgers); replicas asks the bookies.
    reports = [await driver(Check.PLACEMENT)(ctx)]
    if replicas:
        reports.append(await driver(Check.REPLICAS)(ctx))
    marks = await ctx.urm.marked_ids()
    risk_of = await ledger_domains(ctx)
    return await run_pulsar_audit(ctx, verdicts=verdicts_of(reports, marks), risk_of=risk_of)
