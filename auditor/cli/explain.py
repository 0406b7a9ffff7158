"""`bk-auditor explain LEDGER_ID`: why one ledger is (or is not) flagged.

Exit codes follow `check`: 0 no check finds anything, 1 some check does, 2
the explanation could not be made (no such ledger, bad flags, an unreachable
metadata store). `--json` prints exactly one object (schema in the README); with
`--target HOST:PORT` a daemon makes it, and prints the same document.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

from auditor.cli.api_commands import api_client, api_client_args
from auditor.cli.options import bind, cluster_args, config_args
from auditor.errors import ConfigError

if TYPE_CHECKING:
    from auditor.checks.context import CheckContext


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "explain",
        help="why a ledger is or is not flagged: copies, racks, each check's verdict",
    )
    p.add_argument("ledger_id", type=int, metavar="LEDGER_ID")
    cluster_args(p)
    config_args(p)
    api_client_args(
        p, "ask a daemon's gRPC API instead of the metadata store and the bookies directly"
    )
    p.add_argument(
        "--scrub",
        action="store_true",
        help="also read every copy of every entry now and give each bookie's verdict (the deep "
        "scrub's judge; paced by scrub.bytes_per_second; not with --target)",
    )
    # The flag's name before --target was everywhere: kept, hidden, and quiet (scripts that
    # compare stderr keep working).
    p.add_argument("--api", dest="api_deprecated", metavar="HOST:PORT", help=argparse.SUPPRESS)
    bind(p, cmd_explain, findings=True)


# --- text ------------------------------------------------------------------------------


def _ranges(ranges: list[list[int]], limit: int = 6) -> str:
    text = ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in ranges[:limit])
    return text + (",..." if len(ranges) > limit else "")


def _bookie_line(b: dict[str, Any]) -> str:
    answer = b.get("answer", "-")
    if answer == "listed":
        held = f"missing {b['missing_entries']}/{b['expected_entries']}"
        if b["missing_ranges"]:
            held += f" [{_ranges(b['missing_ranges'])}]"
    elif answer == "probed":
        held = f"probed present {b['probed_present']} absent {b['probed_absent']}"
    else:
        held = f"{b['expected_entries']} expected; {b.get('reason', '')}"
    return (
        f"    {b['index']:>2} {b['bookie']:<24} {b['rack']:<22} {b['registration']:<9} "
        f"{answer:<10} {held}"
    )


def render_text(doc: dict[str, Any], out: TextIO) -> None:
    md = doc["metadata"]
    lid = doc["ledger_id"]
    if "error" in md:
        out.write(f"ledger {lid}: metadata does not decode: {md['error']}\n  path {md['path']}\n")
    else:
        out.write(
            f"ledger {lid}  {md['state']}  E={md['ensemble_size']} W={md['write_quorum']} "
            f"A={md['ack_quorum']}  last entry {md['last_entry_id']}  length {md['length']}  "
            f"format v{md['format_version']}, znode version {md['znode_version']}\n"
        )
        out.write(f"  path {md['path']}; placement policy {doc['placement_policy']}\n")
    owner = doc["owner"]
    if owner is not None:
        extra = ", ".join(f"{k} {v}" for k, v in owner.items() if k != "key")
        out.write(f"  owner {owner['key']} ({extra})\n")
    mark = doc["underreplication_mark"]
    if mark is None:
        out.write("  under-replication mark: none\n")
    elif "corrupt" in mark:
        out.write(f"  under-replication mark: CORRUPT {mark['path']}: {mark['corrupt']}\n")
    else:
        out.write(
            f"  under-replication mark: missing {', '.join(mark['missing_replicas']) or '-'}; "
            f"ctime {mark['ctime']}\n"
        )
    for seg in doc["segments"]:
        out.write(f"  segment entries {seg['first_entry']}-{seg['last_entry']}\n")
        sets = "; ".join(
            f"{'+'.join(ws['bookies'])} ({','.join(ws['racks'])})" for ws in seg["write_sets"]
        )
        out.write(f"    write sets: {sets}\n")
        for b in seg["bookies"]:
            out.write(_bookie_line(b) + "\n")
        copies = seg["copies"]
        if copies is not None:
            parts = [
                f"{r['entries'][0]}-{r['entries'][1]}: {r['copies']} ({r['status']})"
                for r in copies["ranges"][:8]
            ]
            more = copies["ranges_total"] - len(parts)
            out.write(
                f"    copies (W={md['write_quorum']}, A={md['ack_quorum']}): {'; '.join(parts)}"
                + (f"; {more} more ranges" if more > 0 else "")
                + "\n"
            )
    out.write("  checks:\n")
    for name, verdict in doc["checks"].items():
        cats = ",".join(sorted({v["category"] for v in verdict["violations"]}))
        out.write(f"    {name:<10} {verdict['outcome']:<9} {cats + ': ' if cats else ''}")
        out.write(f"{verdict['reason']}\n")
    if doc.get("scrub") is not None:
        from auditor.analysis.scrub_explain import ScrubAccount

        for line in ScrubAccount.text(doc["scrub"]):
            out.write(line + "\n")


# --- the command -------------------------------------------------------------------------


def _exit_code(doc: dict[str, Any]) -> int:
    """As `check all` exits: 2 when a check could not judge the ledger (`failed`: the
    placement check without its rack sources), else 1 when some check flags it (a
    violation, or its mark is corrupt: the grace check names it as an invalid znode)."""
    from auditor.analysis.explain import FAILED, INVALID_ZNODE

    if any(v["outcome"] == FAILED for v in doc["checks"].values()):
        return 2
    named = any(v["outcome"] == INVALID_ZNODE for v in doc["checks"].values())
    return 1 if doc["categories"] or named else 0


async def cmd_explain(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    from auditor.analysis.explain import FAILED, document_text
    from auditor.analysis.explain_run import check_ledger_id

    ledger_id = check_ledger_id(args.ledger_id)
    target: str | None = args.target
    if args.api_deprecated:
        if target:
            raise ConfigError("give --target alone (--api is its deprecated name)")
        target = args.api_deprecated
    if target and args.scrub:
        raise ConfigError("--scrub reads the bookies from here: give --zk, not --target")
    if target:
        async with api_client(args, target) as api:
            resp = await api.explain(ledger_id)
        text = resp.explain_json
        doc: dict[str, Any] = json.loads(text)
    else:
        doc = await _explain_direct(args, ledger_id)
        text = document_text(doc)
    if args.json:
        out.write(text + "\n")
    else:
        render_text(doc, out)
    for name, verdict in doc["checks"].items():
        if verdict["outcome"] == FAILED:
            print(f"bk-auditor: error: check {name}: {verdict['reason']}", file=sys.stderr)
    return _exit_code(doc)


async def _explain_direct(args: argparse.Namespace, ledger_id: int) -> dict[str, Any]:
    from auditor.analysis.explain_run import explain_ledger
    from auditor.checks.context import open_context
    from auditor.cli.cluster import target_of_args
    from auditor.config import load_config
    from auditor.metadata.cluster import connect

    config = load_config(args.config, args.overrides)
    target = target_of_args(args, config)
    async with (
        connect(target) as (store, manager),
        open_context(store, target.root, manager, config) as ctx,
    ):
        doc = await explain_ledger(ctx, ledger_id)
        if args.scrub:
            await _scrub_now(ctx, doc, ledger_id)
        return doc


async def _scrub_now(ctx: CheckContext, doc: dict[str, Any], ledger_id: int) -> None:
    """`--scrub`: each copy's verdict, read now by the scrub's own reads and judge, added as
    `scrub` (null for a ledger the scrub does not read: open, or its metadata unreadable);
    its categories join the document's (`explain` exits 1 on them)."""
    from auditor.analysis.scrub_explain import ScrubAccount
    from auditor.checks.replicas import skip_reason
    from auditor.checks.scrub_run import ScrubRun
    from auditor.metadata.walk import LedgerWalker

    rec = await LedgerWalker(ctx.store, ctx.root, ctx.manager).read(ledger_id)
    md = None if rec is None else rec.metadata
    if md is None or skip_reason(md) is not None:
        doc["scrub"] = None
        return
    account = ScrubAccount()
    await ScrubRun(ctx).scrub(md, account.add)
    doc["scrub"] = account.to_json()
    doc["categories"] = sorted({*doc["categories"], *account.categories()})
