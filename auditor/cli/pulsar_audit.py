"""`bk-auditor pulsar-audit`: Pulsar's references against BookKeeper's ledgers; nothing written.

Exit codes follow `check`: 0 nothing found, 1 findings (`missing`, `orphan`,
`dangling_cursor`, or a Pulsar znode that could not be read), 2 the audit
could not run. With `--json` stdout carries one JSON object: the report
(`check --json`'s shape) and `pulsar`, the rollups (`PulsarAudit.to_json`).

By default the replicas check runs first (bookies are asked) so that a ledger
whose every copy of some entry is gone is `missing`; `--no-replicas` skips it,
and then `missing` covers ledgers without metadata only (the output says so).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, TextIO

from auditor.analysis.pulsar_run import audit_pulsar
from auditor.checks.context import open_context
from auditor.checks.findings import Category, CheckReport
from auditor.checks.pulsar_audit import PulsarAudit
from auditor.cli.cluster import target_of_args
from auditor.cli.options import bind, cluster_args, config_args
from auditor.config import AuditorConfig, load_config
from auditor.errors import ConfigError
from auditor.metadata.cluster import ClusterTarget, connect

DEFAULT_TOP = 20


def add_parsers(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "pulsar-audit",
        help="Pulsar's ledgers against BookKeeper's: missing, orphans, cursors; exit 0 / 1 / 2",
    )
    cluster_args(p)
    config_args(p)
    p.add_argument(
        "--no-replicas",
        action="store_true",
        help="do not ask the bookies (missing then covers ledgers without metadata only)",
    )
    p.add_argument(
        "--pulsar-zk",
        metavar="HOSTS",
        help="ZooKeeper of Pulsar's metadata store (checks.pulsar_metadata_zk; default: the same)",
    )
    p.add_argument(
        "--pulsar-root", metavar="PATH", help="root of Pulsar's tree in it (checks.pulsar_root)"
    )
    p.add_argument(
        "--top",
        type=int,
        default=DEFAULT_TOP,
        metavar="N",
        help=f"rows per rollup table (default {DEFAULT_TOP})",
    )
    bind(p, pulsar_audit_command, findings=True)


async def pulsar_audit_command(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    changed = {
        k: v
        for k, v in (("pulsar_metadata_zk", args.pulsar_zk), ("pulsar_root", args.pulsar_root))
        if v is not None
    }
    if changed:
        config = dataclasses.replace(config, checks=dataclasses.replace(config.checks, **changed))
    return await cmd_pulsar_audit(
        target_of_args(args, config),
        config,
        replicas=not args.no_replicas,
        top=args.top,
        as_json=args.json,
    )


async def audit_cluster(
    target: ClusterTarget, config: AuditorConfig, *, replicas: bool
) -> tuple[CheckReport, PulsarAudit]:
    async with (
        connect(target) as (store, manager),
        open_context(store, target.root, manager, config) as ctx,
    ):
        return await audit_pulsar(ctx, replicas=replicas)


def document(
    report: CheckReport, audit: PulsarAudit, *, replicas: bool, top: int
) -> dict[str, Any]:
    return {**report.to_json(), "replicas_checked": replicas, "pulsar": audit.to_json(top)}


def _ranges(ranges: list[list[int]]) -> str:
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in ranges)


def render_text(doc: dict[str, Any], out: TextIO) -> None:
    pulsar = doc["pulsar"]
    out.write(f"pulsar-audit: {doc['ledgers_checked']} ledgers checked\n")
    if not doc["replicas_checked"]:
        out.write(
            "  bookies not asked (--no-replicas): missing covers ledgers without metadata only\n"
        )
    for cat, n in doc["counts"].items():
        out.write(f"  {cat:<20} {n}\n")
    for cat in (Category.MISSING, Category.DANGLING_CURSOR, Category.ORPHAN):
        found = [v for v in doc["violations"] if v["category"] == str(cat)]
        if not found:
            continue
        out.write(f"\n{cat}:\n")
        for v in found:
            d = v["detail"]
            line = f"  ledger {v['ledger_id']:>10}  {d.get('topic')}"
            if cat is Category.MISSING:
                line += f"  ({d['reason']}"
                line += f": entries {_ranges(d['entries'])})" if d.get("entries") else ")"
            elif cat is Category.DANGLING_CURSOR:
                line += f"  cursor {d.get('cursor')}"
            else:
                size = d["size"] if d["size_known"] else "unknown"
                line += f"  size {size}  {d['command']}"
            out.write(line + "\n")
    if doc["invalid_znodes"]["total"]:
        out.write("\nunreadable Pulsar znodes:\n")
        for z in doc["invalid_znodes"]["listed"]:
            out.write(f"  {z['path']}: {z['reason']}\n")
    out.write(
        f"\n{'namespace':<32} {'ledgers':>8} {'bytes':>12} {'under-rep':>9} {'unplaced':>8}"
        f" {'missing':>7} {'orphans':>7} {'orphan bytes':>12}\n"
    )
    for row in pulsar["namespaces"]:
        out.write(
            f"{row['namespace']:<32} {row['ledgers']:>8} {row['bytes']:>12}"
            f" {row['under_replicated']:>9} {row['unplaced']:>8} {row['missing']:>7}"
            f" {row['orphans']:>7} {row['orphan_bytes']:>12}\n"
        )
    if pulsar["at_risk"]:
        out.write("\nnamespaces at risk from one loss:\n")
        for r in pulsar["at_risk"]:
            names = ", ".join(r["by_namespace"])
            out.write(f"  {r['domain']} {r['name']}: {r['ledgers']} ledgers of {names}\n")


async def cmd_pulsar_audit(
    target: ClusterTarget,
    config: AuditorConfig,
    *,
    replicas: bool,
    top: int,
    as_json: bool,
    out: TextIO = sys.stdout,
) -> int:
    if top < 1:
        raise ConfigError(f"--top must be >= 1, got {top}")
    root = config.checks.pulsar_root
    if root and (not root.startswith("/") or root.endswith("/")):
        raise ConfigError(
            f"--pulsar-root must be an absolute path without a trailing /, got {root!r}"
        )
    report, audit = await audit_cluster(target, config, replicas=replicas)
    doc = document(report, audit, replicas=replicas, top=top)
    if as_json:
        out.write(json.dumps(doc) + "\n")
    else:
        render_text(doc, out)
    return 1 if report.has_findings else 0
