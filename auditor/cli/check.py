"""`bk-auditor check ...`: run checks once, print a report, exit 0 / 1 / 2.

Exit codes are part of the contract (scripts and cron jobs branch on them):
0 no violation, 1 violations or invalid znodes found (a corrupt mark, a ledger
znode whose path spells no valid id: `invalid_znodes`), 2 the check could not run. With `--json`
stdout carries exactly one JSON object (schema in the README); logs go to
stderr either way.

`check all` contains a check that cannot run, as the daemon does: a broken
rack source stops placement, not the bookie, ledger, replicas and grace
checks, which need no racks. The others still run and report; the one that
could not is named with its error (`failed`), and the exit code is 2, since
not everything was checked. Only the metadata store itself gone stops the whole run:
every further check would wait out the same timeout to say the same thing.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from auditor.checks.context import open_context
from auditor.checks.findings import Category, Check, CheckReport, Violation
from auditor.checks.runner import ALL_CHECKS, driver
from auditor.cli.cluster import target_of_args
from auditor.cli.options import bind, cluster_args, config_args, progress_args
from auditor.cli.progress import ProgressBar, progress_bar
from auditor.config import AuditorConfig, load_config
from auditor.errors import AuditorError, ConfigError, ServiceUnavailableError
from auditor.metadata.cluster import ClusterTarget, connect
from auditor.metadata.ledger_tree import IdRange
from auditor.metadata.paths import LONG_MAX


def _summary(v: Violation) -> str:
    """One line of the evidence for the table; `--json` has all of it."""
    d = v.detail
    if v.category in (Category.MISSING, Category.ORPHAN, Category.DANGLING_CURSOR):
        where = d.get("topic") or d.get("namespace") or "no owner"
        if v.category is Category.ORPHAN:
            return f"{where}: unreferenced, {d.get('size')} bytes, {d.get('age_s')}s old"[:80]
        return f"{where}: {d.get('reason', '')}"[:80]
    if "copies_found" in d:
        worst = ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in d["worst_entries"][:3])
        return f"{d['copies_found']}/{d['write_quorum']} copies of entries {worst}"
    if v.category in (
        Category.CORRUPT_COPY,
        Category.DIVERGENT_COPIES,
        Category.UNREADABLE_COPY,
    ):
        spans = ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in d["entries"][:3])
        first = next(iter(d["reasons"].values()), "")
        return f"{d['count']} copies, entries {spans}: {first}"[:80]
    if "age_s" in d:
        return f"marked {d['age_s']}s ago (grace {d['grace_period_s']}s)"
    if d.get("fragments"):
        f = d["fragments"][0]
        bad = ", ".join(f"{b['bookie']} {b['reason']}" for b in f["bad_bookies"])
        return f"entries {f['first_entry']}-{f['last_entry']}: {bad}"
    if v.category in (Category.PLACEMENT_NOT_ADHERING, Category.PLACEMENT_SOFTLY_ADHERING):
        seg = d["segments"][0]
        locations = ",".join(seg["window"]["locations"])
        return f"segment at {seg['first_entry']}: {seg['reason']} [{locations}]"
    if "segments" in d and "ledger_state" in d:
        return f"{d['ledger_state']} ledger, segments from entry {d['segments']}"
    if "reason" in d:
        return str(d["reason"])[:80]
    return ", ".join(f"{k}={val}" for k, val in list(d.items())[:3])[:80]


def render_text(report: CheckReport, out: TextIO) -> None:
    data = report.to_json()
    out.write(f"check {data['check']}: {data['ledgers_checked']} ledgers checked")
    if data["ledgers_skipped"]:
        skipped = ", ".join(f"{k} {n}" for k, n in data["ledgers_skipped"].items())
        out.write(f"; skipped: {skipped}")
    out.write("\n")
    for cat, n in data["counts"].items():
        out.write(f"  {cat:<36} {n}\n")
    if "coverage" in data:
        c = data["coverage"]
        out.write(
            f"  coverage: {c['listed']} listed, {c['probed']} probed, "
            f"{c['unverified']} unverified\n"
        )
    if "scrub" in data:
        s = data["scrub"]
        out.write(
            f"  read: {s['entries']} entries, {s['copies_verified']} copies verified "
            f"({s['bytes_verified']} bytes), {s['copies_absent']} absent, "
            f"{s['copies_unverified']} unverified\n"
        )
    if data.get("lost_bookies"):
        out.write(f"  lost bookies: {', '.join(data['lost_bookies'])}\n")
    if report.violations:
        out.write(f"  {'ledger':>12}  {'category':<34} {'bookie':<22} detail\n")
        for v in sorted(report.violations, key=lambda v: (v.ledger_id, str(v.category))):
            out.write(
                f"  {v.ledger_id:>12}  {v.category!s:<34} {v.bookie or '-':<22} {_summary(v)}\n"
            )
        if data["violations_truncated"]:
            shown = len(data["violations"])
            out.write(
                f"  ... the first {shown} of {data['violations_total']} violations "
                "(checks.max_violations_listed)\n"
            )
    invalid = data["invalid_znodes"]
    for z in invalid["listed"]:
        out.write(f"  invalid znode {z['path']}: {z['reason']}\n")
    if invalid["total"] > len(invalid["listed"]):
        out.write(
            f"  ... the first {len(invalid['listed'])} of {invalid['total']} invalid znodes "
            "(checks.max_violations_listed)\n"
        )
    if data["would_be_violations_dropped"]:
        causes = ", ".join(f"{k}={n}" for k, n in data["would_be_violations_dropped"].items())
        out.write(
            f"  would-be violations dropped: {causes} "
            f"(false-alarm share {data['false_alarm_share']:.2f})\n"
        )
    if data.get("by_owner"):
        out.write("  by owner (ledgers per category):\n")
        for owner, counts in data["by_owner"].items():
            found = ", ".join(f"{cat}={n}" for cat, n in counts.items())
            out.write(f"    {owner}  {found}\n")
    if data["marked_underreplicated"]:
        out.write(f"  marked under-replicated: {data['marked_underreplicated']}\n")


async def cmd_check(
    target: ClusterTarget,
    which: str,
    config: AuditorConfig,
    *,
    as_json: bool,
    mark: bool,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    bar: ProgressBar | None = None,
    id_range: IdRange | None = None,
) -> int:
    """`bar`: drawn for each check on a terminal (`cli/progress.py`). `id_range`: only
    the ledgers in it are checked (`check scrub --from/--to`)."""
    checks = list(ALL_CHECKS) if which == "all" else [Check(which)]
    reports: list[CheckReport] = []
    failed: dict[str, str] = {}
    async with (
        connect(target) as (store, manager),
        open_context(store, target.root, manager, config, mark=mark, id_range=id_range) as ctx,
    ):
        for check in checks:
            if bar is not None:
                bar.begin(str(check))
            try:
                report = await driver(check)(ctx)
            except ServiceUnavailableError:
                if bar is not None:
                    bar.abandon()
                raise
            except AuditorError as exc:
                if bar is not None:
                    bar.abandon()
                if which != "all":
                    raise  # one check asked for: its error is the answer (exit 2)
                failed[str(check)] = str(exc)
                err.write(f"bk-auditor: error: check {check} could not run: {exc}\n")
                continue
            except BaseException:
                if bar is not None:
                    bar.abandon()
                raise
            if bar is not None:
                bar.finish(report.ledgers_checked + sum(report.ledgers_skipped.values()))
            reports.append(report)
    if as_json:
        if which == "all":
            doc: dict[str, Any] = {
                "check": "all",
                "reports": {str(r.check): r.to_json() for r in reports},
            }
            if failed:
                doc["failed"] = failed
        else:
            doc = reports[0].to_json()
        out.write(json.dumps(doc, sort_keys=False) + "\n")
    else:
        for r in reports:
            render_text(r, out)
        for name, error in failed.items():
            out.write(f"check {name}: could not run: {error}\n")
    if failed:
        return 2
    return 1 if any(r.has_findings for r in reports) else 0


def add_parsers(sub: Any) -> None:
    chk = sub.add_parser("check", help="run checks once; exit 0 clean, 1 violations, 2 error")
    chk.add_argument(
        "which",
        choices=[
            "bookies",
            "ledgers",
            "placement",
            "replicas",
            "grace",
            "metadata",
            "scrub",
            "all",
        ],
    )
    chk.add_argument(
        "--from",
        dest="from_ledger",
        type=int,
        default=None,
        metavar="ID",
        help="scrub: the first ledger id to read (default 0)",
    )
    chk.add_argument(
        "--to",
        dest="to_ledger",
        type=int,
        default=None,
        metavar="ID",
        help="scrub: the last ledger id to read, included (default: the last one)",
    )
    cluster_args(chk)
    config_args(chk)
    chk.add_argument("--mark", action="store_true", help="write under-replication marks")
    progress_args(chk)
    bind(chk, check_command, findings=True)


def scrub_range(which: str, first: int | None, last: int | None) -> IdRange | None:
    """The ledger ids `check scrub --from/--to` names (None: all); the other checks take no
    range, since a partial walk would change what they report (corrupt marks, say)."""
    if first is None and last is None:
        return None
    if which != "scrub":
        raise ConfigError("--from and --to are for `check scrub` only")
    lo = 0 if first is None else first
    hi = LONG_MAX + 1 if last is None else last + 1
    if lo < 0 or hi <= lo:
        raise ConfigError(f"--from {first} --to {last} names no ledger id")
    return IdRange(lo, hi)


async def check_command(args: argparse.Namespace) -> int:
    id_range = scrub_range(args.which, args.from_ledger, args.to_ledger)
    bar, config = progress_bar(args, load_config(args.config, args.overrides))
    return await cmd_check(
        target_of_args(args, config),
        args.which,
        config,
        as_json=args.json,
        mark=args.mark,
        bar=bar,
        id_range=id_range,
    )
