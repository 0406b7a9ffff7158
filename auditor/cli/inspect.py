"""Read-only listings: ledgers, under-replicated ledgers, bookies."""

from __future__ import annotations

import base64
import json
import sys
from typing import Any, TextIO

from auditor.metadata.cluster import ClusterTarget, connect
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.registry import all_known_bookies, read_bookies, resolve_bookie
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.metadata.walk import LedgerWalker


def ledger_json(md: LedgerMetadata, path: str) -> dict[str, Any]:
    return {
        "ledger_id": md.ledger_id,
        "path": path,
        **md.summary_json(),
        "ensembles": {str(s.first_entry_id): list(s.bookies) for s in md.segments},
        "custom_metadata": {k: base64.b64encode(v).decode() for k, v in md.custom_metadata},
    }


def ledger_line(md: LedgerMetadata) -> str:
    ens = " ".join(f"{s.first_entry_id}:[{','.join(s.bookies)}]" for s in md.segments)
    return (
        f"{md.ledger_id:>12}  {md.state.name:<11}  E={md.ensemble_size} W={md.write_quorum} "
        f"A={md.ack_quorum}  last={md.last_entry_id:<8} length={md.length:<10} {ens}"
    )


async def cmd_ledgers(
    target: ClusterTarget, as_json: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr
) -> int:
    """Streams every ledger; corrupt ones are reported on stderr and the walk goes on."""
    status = 0
    async with connect(target) as (zk, manager):
        walker = LedgerWalker(zk, target.root, manager)
        async for rec in walker.ledgers():
            if rec.metadata is None:
                status = 1
                print(
                    f"bk-auditor: error: ledger {rec.ledger_id} at {rec.path}: {rec.error}",
                    file=err,
                )
                continue
            if as_json:
                out.write(json.dumps(ledger_json(rec.metadata, rec.path)) + "\n")
            else:
                out.write(ledger_line(rec.metadata) + "\n")
        stats = walker.stats
        summary = (
            f"{stats.ledgers} ledgers, {stats.corrupt} corrupt, "
            f"{stats.deleted_during_walk} deleted during the walk"
        )
        if stats.foreign_znodes:
            first = stats.foreign_znodes[0]
            summary += f", {len(stats.foreign_znodes)} unexpected znodes (first: {first})"
        print(summary, file=err)
    return status


async def cmd_list_underreplicated(
    target: ClusterTarget, as_json: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr
) -> int:
    async with connect(target) as (zk, _):
        urm = UnderreplicationManager(zk, target.root)
        count = 0
        async for ur in urm.list_underreplicated():
            count += 1
            if as_json:
                out.write(
                    json.dumps(
                        {
                            "ledger_id": ur.ledger_id,
                            "replicas": list(ur.replicas),
                            "ctime": ur.ctime,
                        }
                    )
                    + "\n"
                )
            else:
                out.write(
                    f"{ur.ledger_id:>12}  ctime={ur.ctime}  missing={','.join(ur.replicas)}\n"
                )
        enabled = await urm.is_replication_enabled()
        print(
            f"{count} under-replicated ledgers; "
            f"auto-recovery {'enabled' if enabled else 'DISABLED'}",
            file=err,
        )
    return 0


async def cmd_bookies(target: ClusterTarget, as_json: bool, out: TextIO = sys.stdout) -> int:
    async with connect(target) as (zk, _):
        current = await read_bookies(zk, target.root)
        known = await all_known_bookies(zk, target.root)
        rows = []
        for bookie in sorted(known | current.available):
            state = (
                "writable"
                if bookie in current.writable
                else "readonly"
                if bookie in current.readonly
                else "down"
            )
            addr = await resolve_bookie(zk, target.root, bookie)
            rows.append(
                {
                    "bookie_id": bookie,
                    "state": state,
                    "address": f"{addr[0]}:{addr[1]}" if addr else None,
                    "cookie": bookie in known,
                }
            )
        for row in rows:
            if as_json:
                out.write(json.dumps(row) + "\n")
            else:
                out.write(f"{row['bookie_id']:<30} {row['state']:<9} {row['address'] or '-'}\n")
    return 0
