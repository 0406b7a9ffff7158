"""`bk-auditor risk` and `bk-auditor what-if`: predictions from metadata, nothing written.

Exit codes follow `check`: 0 nothing to worry about (no single loss would hurt
a ledger; the change would make nothing worse), 1 there is (ledgers at risk;
the change would cause violations or under-replication), 2 the command could
not run (bad input, unreachable cluster, unreadable snapshot or rack map). With
`--json` stdout carries exactly one JSON object (schemas in the README).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

from auditor.analysis.risk import DOMAINS, SEVERITIES, RiskReport
from auditor.analysis.risk_run import judge_risk, run_risk
from auditor.analysis.whatif_run import (
    ClusterView,
    WhatIfReport,
    WhatIfRequest,
    live_view,
    predict,
)
from auditor.checks.context import CheckContext, open_context
from auditor.cli.cluster import target_of_args
from auditor.cli.options import bind, cluster_args, config_args
from auditor.config import AuditorConfig, load_config
from auditor.errors import ConfigError
from auditor.metadata.cluster import ClusterTarget, connect
from auditor.scan.snapshot_view import snapshot_view

DEFAULT_TOP = 10


def add_parsers(sub: Any) -> None:
    def command(name: str, summary: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, help=summary)
        cluster_args(parser)
        config_args(parser)
        return parser

    risk = command(
        "risk", "which single bookie, rack or region loss would hurt which ledgers; exit 0 / 1 / 2"
    )
    risk.add_argument(
        "--top",
        type=int,
        default=DEFAULT_TOP,
        metavar="N",
        help=f"domains listed per kind (default {DEFAULT_TOP})",
    )
    risk.add_argument("--from-snapshot", metavar="DIR", help="judge a snapshot instead")
    what = command(
        "what-if", "predict a re-racking or decommission without writing anything; exit 0 / 1 / 2"
    )
    what.add_argument(
        "--racks", metavar="FILE", help="a new rack map (format of checks.racks_file)"
    )
    what.add_argument(
        "--decommission", metavar="BOOKIE[,BOOKIE]", help="bookies to take away, comma-separated"
    )
    what.add_argument(
        "--min-racks", type=int, metavar="N", help="another minNumRacksPerWriteQuorum"
    )
    what.add_argument("--from-snapshot", metavar="DIR", help="predict on a snapshot instead")
    bind(risk, risk_command, findings=True)
    bind(what, what_if_command, findings=True)


async def risk_command(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)

    def target() -> ClusterTarget:
        return target_of_args(args, config)

    return await cmd_risk(
        target, config, top=args.top, snapshot=args.from_snapshot, as_json=args.json
    )


async def what_if_command(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)

    def target() -> ClusterTarget:
        return target_of_args(args, config)

    request = parse_request(args)
    return await cmd_what_if(
        target, config, request, snapshot=args.from_snapshot, as_json=args.json
    )


def parse_request(args: argparse.Namespace) -> WhatIfRequest:
    decommission: tuple[str, ...] = ()
    if args.decommission is not None:
        decommission = tuple(dict.fromkeys(b.strip() for b in args.decommission.split(",")))
        if not decommission or "" in decommission:
            raise ConfigError(f"--decommission takes BOOKIE[,BOOKIE...], got {args.decommission!r}")
    request = WhatIfRequest(
        racks_file=Path(args.racks) if args.racks is not None else None,
        min_racks=args.min_racks,
        decommission=decommission,
    )
    if not request.placement and not request.decommission:
        raise ConfigError(
            "what-if needs --racks FILE, --decommission BOOKIE[,...] or --min-racks N"
        )
    return request


@asynccontextmanager
async def _context(
    target: Callable[[], ClusterTarget], config: AuditorConfig
) -> AsyncIterator[CheckContext]:
    """The live cluster, read-only: predictions never mark anything."""
    tgt = target()
    async with (
        connect(tgt) as (store, manager),
        open_context(store, tgt.root, manager, config, mark=False) as ctx,
    ):
        yield ctx


@asynccontextmanager
async def _view(
    target: Callable[[], ClusterTarget], config: AuditorConfig, snapshot: str | None
) -> AsyncIterator[ClusterView]:
    if snapshot is not None:
        async with snapshot_view(Path(snapshot)) as view:
            yield view
        return
    async with _context(target, config) as ctx:
        yield await live_view(ctx)


async def cmd_risk(
    target: Callable[[], ClusterTarget],
    config: AuditorConfig,
    *,
    top: int,
    snapshot: str | None,
    as_json: bool,
    out: TextIO = sys.stdout,
) -> int:
    if top < 1:
        raise ConfigError(f"--top must be >= 1, got {top}")
    if snapshot is not None:
        async with snapshot_view(Path(snapshot)) as view:
            report = RiskReport(started_at=time.time())
            await judge_risk(view.records(), report, view.locate, view.available)
            report.finished_at = time.time()
    else:
        async with _context(target, config) as ctx:
            report = await run_risk(ctx)
    if as_json:
        out.write(json.dumps(report.to_json(top)) + "\n")
    else:
        render_risk(report, top, out)
    if report.racks_unreadable is not None:
        print(
            "bk-auditor: error: rack sources unreadable, rack losses not judged: "
            f"{report.racks_unreadable}",
            file=sys.stderr,
        )
        return 2  # as `check all` when a check could not run
    return 1 if report.has_risk else 0


async def cmd_what_if(
    target: Callable[[], ClusterTarget],
    config: AuditorConfig,
    request: WhatIfRequest,
    *,
    snapshot: str | None,
    as_json: bool,
    out: TextIO = sys.stdout,
) -> int:
    async with _view(target, config, snapshot) as view:
        report = await predict(view, config, request)
    if as_json:
        out.write(json.dumps(report.to_json()) + "\n")
    else:
        render_what_if(report, out)
    return 1 if report.has_effect else 0


# --- text ---------------------------------------------------------------------------


def _ids(ids: list[int], total: int | None = None) -> str:
    shown = ", ".join(str(i) for i in ids[:20])
    more = (total if total is not None else len(ids)) - min(len(ids), 20)
    return (shown or "-") + (f" (+{more} more)" if more > 0 else "")


def render_risk(report: RiskReport, top: int, out: TextIO) -> None:
    doc = report.to_json(top)
    out.write(f"risk: {doc['ledgers_checked']} closed ledgers checked")
    if doc["ledgers_skipped"]:
        skipped = ", ".join(f"{k} {n}" for k, n in doc["ledgers_skipped"].items())
        out.write(f"; skipped: {skipped}")
    out.write("\n")
    if doc["lost_bookies"]:
        out.write(f"  already lost bookies: {', '.join(doc['lost_bookies'])}\n")
    if doc["racks_unreadable"]:
        out.write(f"  RACKS UNREADABLE, rack losses not judged: {doc['racks_unreadable']}\n")
    if doc["unlocated_bookies"]:
        out.write(f"  bookies without a known rack: {', '.join(doc['unlocated_bookies'])}\n")
    for s in SEVERITIES:
        already = doc["already"][s.label]
        risk = doc["at_risk"][s.label]
        out.write(
            f"  {s.label:<18} today {already['count']}, after the worst single loss "
            f"{risk['count']}\n"
        )
    for d in DOMAINS:
        rows = doc["top"][str(d)]
        if not rows:
            continue
        out.write(f"  {d} losses that hurt the most ledgers:\n")
        for row in rows:
            parts = [
                f"{s.label} {n}: {_ids(row[s.label]['ledgers'], n)}"
                for s in SEVERITIES
                if (n := row[s.label]["count"])
            ]
            out.write(f"    {row['name']:<28} {row['ledgers']:>8} ledgers  {'; '.join(parts)}\n")


def render_what_if(report: WhatIfReport, out: TextIO) -> None:
    doc = report.to_json()
    out.write(f"what-if on {doc['source']}: {doc['ledgers_checked']} ledgers\n")
    placement = doc["placement"]
    if placement is not None:
        out.write(f"  placement ({placement['policy']}):\n")
        for bookie, move in placement["moved_bookies"].items():
            out.write(f"    {bookie} moves {move['from'] or '-'} -> {move['to'] or '-'}\n")
        for cat, today in placement["today"].items():
            predicted = placement["predicted"][cat]
            out.write(f"    {cat:<26} today {today}, predicted {predicted}\n")
            if placement["newly"][cat]:
                out.write(f"      newly: {_ids(placement['newly'][cat])}\n")
            if placement["no_longer"][cat]:
                out.write(f"      no longer: {_ids(placement['no_longer'][cat])}\n")
    dec = doc["decommission"]
    if dec is not None:
        out.write(f"  decommission of {', '.join(dec['bookies'])}:\n")
        for key in ("would_be_marked", "newly_underreplicated", "below_ack_quorum", "no_copy"):
            out.write(f"    {key:<22} {len(dec[key]):>6}: {_ids(dec[key])}\n")
