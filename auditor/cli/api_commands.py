"""The commands that ask a running daemon over its gRPC API: `status`, `report`, `health`.

Also what every command that dials a daemon shares (`trigger --target`, `explain
--target`): the flags that name it (`--target`, the token, TLS), the token's rules, and
the client. grpc is imported only when a command dials, so the commands that read the
metadata store start without it. BookKeeper's own admin commands, which work on the
metadata store with no daemon at all, are in `cli/admin.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from auditor.api import TARGET_ENV, TOKEN_ENV
from auditor.checks.findings import Check
from auditor.cli.argtypes import MAX_TIMEOUT, seconds
from auditor.cli.options import bind, emit
from auditor.errors import ConfigError
from auditor.secretfiles import read_token_file

if TYPE_CHECKING:
    from auditor.api.client import ApiClient


# --- reaching a daemon ----------------------------------------------------------------


def api_client(args: argparse.Namespace, target: str) -> ApiClient:
    # grpc's core logs connection failures on stderr by itself; the CLI says it in one line.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from auditor.api.client import ApiClient
    from auditor.secretfiles import check_api_token

    token, what = api_token(args)
    if token is not None:
        check_api_token(token, what)
    return ApiClient(
        target,
        timeout=args.timeout,
        token=token,
        tls=args.tls,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )


def api_token(
    args: argparse.Namespace, env: Mapping[str, str] = os.environ
) -> tuple[str | None, str]:
    """(the API token or None, what to call it in messages).

    `--token-file FILE` (read as the daemon reads `api.token_file`) or `--token`
    (visible to every user of the machine in `ps`), else BK_AUDITOR_API_TOKEN (an empty
    value is unset, as the daemon reads it). A missing, unreadable or empty file, an empty
    `--token` and both flags at once are ConfigErrors (exit 2).
    """
    token_file: str | None = getattr(args, "token_file", None)
    if args.token is not None and token_file is not None:
        raise ConfigError("give --token or --token-file, not both")
    if token_file is not None:
        if not Path(token_file).exists():
            raise ConfigError(f"--token-file {token_file} does not exist")
        token = read_token_file(token_file, "--token-file")
        return token, f"the API token in --token-file {token_file}"
    if args.token is not None:
        if not args.token:
            raise ConfigError("--token is empty")
        return args.token, f"the API token (--token or {TOKEN_ENV})"
    return env.get(TOKEN_ENV) or None, f"the API token (--token or {TOKEN_ENV})"


def daemon_target(args: argparse.Namespace) -> str:
    """--target, else the environment, else the daemon beside us on its default port."""
    target: str | None = args.target or os.environ.get(TARGET_ENV)
    if target:
        return target
    from auditor.daemon.config import DEFAULT_API_PORT

    return f"127.0.0.1:{DEFAULT_API_PORT}"


def api_client_args(p: argparse.ArgumentParser, target_help: str) -> None:
    """How to reach a daemon's API: `--target`, the token, TLS (every command that dials one)."""
    p.add_argument("--target", metavar="HOST:PORT", help=target_help)
    token = p.add_mutually_exclusive_group()
    token.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"file holding the API token (one line), or set {TOKEN_ENV}",
    )
    token.add_argument(
        "--token",
        metavar="TOKEN",
        help="the API token itself: visible to every user of this host in ps; "
        "prefer --token-file or " + TOKEN_ENV,
    )
    p.add_argument("--tls", action="store_true", help="TLS with the system's trust roots")
    p.add_argument("--tls-ca", metavar="FILE", help="TLS, trusting this CA (PEM)")
    p.add_argument("--tls-cert", metavar="FILE", help="client certificate for mTLS (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="client key for mTLS (PEM)")


def api_args(p: argparse.ArgumentParser, *, with_common: bool) -> None:
    """`with_common`: the command dials only a daemon, so --target has a default."""
    api_client_args(
        p,
        f"a daemon's gRPC API (env {TARGET_ENV}; default: this host's daemon)"
        if with_common
        else "a daemon's gRPC API; without it, BookKeeper's trigger through the metadata store",
    )
    if with_common:
        p.add_argument(
            "--timeout", type=seconds(MAX_TIMEOUT), default=10.0, help="seconds for each call"
        )
        p.add_argument("--json", action="store_true", help="one JSON object")


# --- the commands -------------------------------------------------------------------


def render_status(doc: dict[str, Any], out: TextIO) -> None:
    role = "leader" if doc["is_leader"] else "follower"
    leader = doc["leader"] or (
        "none: the election is held by a vote that does not decode"
        if doc.get("unreadable_vote")
        else "none known"
    )
    out.write(
        f"{doc['identity']}: {role} (auditor: {leader}); metadata store "
        f"{'connected' if doc['zk_connected'] else 'DISCONNECTED'}; auto-recovery "
        f"{'enabled' if doc['replication_enabled'] else 'DISABLED'}\n"
    )
    lost = ", ".join(doc["lost_bookies"]) or "none"
    out.write(f"  retry queue: {doc['retry_queue_ledgers']} ledgers; lost bookies: {lost}\n")
    out.write(
        f"  {'check':<10} {'enabled':<7} {'interval':>9}  {'outcome':<10} "
        f"{'last finished':<27} {'success age':>12}  {'next run':<27} ledgers in violation\n"
    )
    for name, c in doc["checks"].items():
        counts = c["counts"]
        found = (
            "-"
            if counts is None
            else ", ".join(f"{k}={n}" for k, n in counts.items() if n) or "none"
        )
        out.write(
            f"  {name:<10} {'yes' if c['enabled'] else 'no':<7} {c['interval_s']:>8g}s  "
            f"{c['outcome']:<10} {c['last_finished'] or '-':<27} "
            f"{c['last_success_age_s']:>11.0f}s  {c['next_run'] or '-':<27} {found}\n"
        )
        dropped = c["would_be_violations_dropped"]
        if dropped:
            causes = ", ".join(f"{k}={n}" for k, n in dropped.items())
            out.write(
                f"  {'':<10} would-be violations dropped: {causes} "
                f"(false-alarm share {c['false_alarm_share']:.2f})\n"
            )
        invalid = c.get("invalid_znodes")
        if invalid and invalid["total"]:
            out.write(f"  {'':<10} invalid znodes: {invalid['total']}\n")
            for z in invalid["listed"]:
                out.write(f"  {'':<10}   {z['path']}: {z['reason']}\n")
        if c.get("progress") is not None:
            from auditor.api.convert import progress_text

            out.write(f"  {'':<10} {progress_text(c['outcome'], c['progress'])}\n")
        if c["last_error"]:
            out.write(f"  {'':<10} last error: {c['last_error']}\n")
    _render_leadership(doc, out)
    tests = doc["selftest"]
    if tests:
        failed = [t["failure"] for t in tests.values() if not t["ok"]]
        when = max(t["ran_at"] or "" for t in tests.values()) or "-"
        verdict = "FAILED" if failed else "ok"
        out.write(f"  self-test: {verdict} ({len(tests)} detectors, last {when})\n")
        for line in failed:
            out.write(f"    {line}\n")
    _render_worker(doc.get("worker"), out)
    scrub = doc.get("scrub")
    if scrub is not None:
        from auditor.api.convert import scrub_text

        out.write(f"  scrub: {scrub_text(scrub)}\n")


#: Leadership decisions the text status lists (`--json` has all the daemon keeps).
DECISIONS_SHOWN = 5


def _render_leadership(doc: dict[str, Any], out: TextIO) -> None:
    """The election phase, a duplicate identity, unusable znodes, the last decisions."""
    phase = doc.get("election_phase") or "unknown"
    until = doc.get("backoff_until")
    which = f" in the {doc['election']} election" if doc.get("election") else ""
    out.write(
        f"  election: {phase}{which}" + (f" (voting again at {until})" if until else "") + "\n"
    )
    other = doc.get("other_election")
    if other:
        out.write(
            f"  OTHER ELECTION: the {other['election']} election is held by "
            f"{other['holder'] or '(undecodable)'} at {other['path']} (since "
            f"{other['since'] or '-'}): the cluster's nodes disagree on the metadata driver; "
            "this daemon does not lead\n"
        )
    unreadable = doc.get("unreadable_vote")
    if unreadable:
        out.write(
            f"  UNREADABLE VOTE: the election is held by {unreadable['path']} (session "
            f"{unreadable['session']}, since {unreadable['since'] or '-'}), whose bytes do not "
            f"decode ({unreadable['error']}): no auditor runs, Java's nor ours, while that "
            "session lives\n"
        )
    for item in doc.get("open_acl_znodes") or ():
        out.write(
            f"  OPEN ACL: {item}: unauthenticated clients can silence or mislead the "
            "auditor here; setAcl it (docs/runbook.md)\n"
        )
    dup = doc.get("duplicate_identity")
    if dup:
        out.write(
            f"  DUPLICATE IDENTITY: vote {dup['vote']} of another ZooKeeper session carries "
            f"this daemon's identity (since {dup['since'] or '-'}); this daemon refuses to vote\n"
        )
    for name, z in (doc.get("invalid_znodes") or {}).items():
        out.write(
            f"  znode {name} holds {z['value']}, which is unusable (since {z['since'] or '-'}); "
            f"using {z['using']}\n"
        )
    decisions = (doc.get("decisions") or [])[-DECISIONS_SHOWN:]
    if decisions:
        out.write("  last leadership decisions:\n")
        for d in decisions:
            detail = f" [{d['detail']}]" if d["detail"] else ""
            out.write(f"    {d['at'] or '-'}  {d['reason']:<19} {d['message']}{detail}\n")


def _render_worker(w: dict[str, Any] | None, out: TextIO) -> None:
    """The replication worker: what it does now (ledgers in hand, unrecoverable), its counts."""
    if w is None:
        return  # a daemon older than the worker
    if not w["enabled"]:
        out.write("  worker: off (worker.enabled)\n")
        return
    doing = "running" if w["running"] else "NOT RUNNING"
    if w["waiting"]:
        doing += f"; waiting: {w['waiting']}"
    out.write(f"  worker: {doing}\n")
    out.write(
        f"    replicated {w['ledgers_replicated']} ledgers ({w['fragments_replicated']} "
        f"fragments), {w['ledgers_found_healthy']} found whole; read {w['entries_read']} "
        f"entries ({w['bytes_read']} bytes), wrote {w['entries_written']} entries "
        f"({w['bytes_written']} bytes); {w['locks_released']} locks released, held "
        f"{w['lock_seconds']:g}s in all\n"
    )
    if w["failures"]:
        failures = ", ".join(f"{k}={n}" for k, n in w["failures"].items())
        out.write(f"    failed attempts: {failures}\n")
    _render_queue(w.get("queue"), out)
    for h in w["in_hand"]:
        until = f" until {h['until']}" if h["until"] else ""
        out.write(f"    ledger {h['ledger_id']}: {h['step']}{until} (locked since {h['since']})\n")
        for line in h["fragments"]:
            out.write(f"      {line}\n")
    for u in w["unrecoverable"]:
        ranges = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in u["ranges"])
        # No ranges: an open ledger no recovery can close (its end is not known).
        what = f"entries {ranges}" if ranges else "the open tail (its end cannot be learnt)"
        out.write(
            f"    UNRECOVERABLE ledger {u['ledger_id']}: no readable copy of {what} "
            f"(since {u['since']}; tried again at {u['retry_at']}); kept marked\n"
        )


#: The next ledgers in take order that the text of `status` names.
QUEUE_SHOWN = 5


def _render_queue(q: dict[str, Any] | None, out: TextIO) -> None:
    """The worker's marked ledgers by copies left (with when the oldest of each bucket was
    marked), then the next ones it would take; nothing before its first ranking."""
    if q is None:
        return
    counts = []
    for bucket, n in q["by_copies_left"].items():
        oldest = q["oldest"].get(bucket)
        counts.append(f"{bucket}: {n}" + (f" (oldest marked {oldest})" if oldest else ""))
    out.write(f"    marked ledgers by copies left: {', '.join(counts)}\n")
    shown = []
    for n in q["next"][:QUEUE_SHOWN]:
        copies = "?" if n["copies_left"] is None else n["copies_left"]
        what = f"{copies} {'copy' if copies == 1 else 'copies'}"
        if n["racks_left"] is not None:
            what += f", {n['racks_left']} {'rack' if n['racks_left'] == 1 else 'racks'}"
        if n["in_flight"]:
            what += "; in flight"
        shown.append(f"{n['ledger_id']} ({what})")
    if shown:
        out.write(f"    next in take order: {', '.join(shown)}\n")


async def cmd_status(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    from auditor.api.convert import status_json

    async with api_client(args, daemon_target(args)) as api:
        doc = status_json(await api.status())
    if args.json:
        out.write(json.dumps(doc) + "\n")
    else:
        render_status(doc, out)
    return 0


async def cmd_report(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    async with api_client(args, daemon_target(args)) as api:
        resp = await api.report(args.which)
    if args.json:
        out.write(resp.report_json + "\n")
        return 0
    from auditor.api.convert import report_from_json
    from auditor.cli.check import render_text

    render_text(report_from_json(json.loads(resp.report_json)), out)
    return 0


async def trigger_on_daemon(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """`trigger --target`: the daemon runs the check now (the bookie audit by default)."""
    async with api_client(args, args.target) as api:
        resp = await api.trigger(args.which or str(Check.BOOKIES))
    emit(
        out,
        args.json,
        {"triggered": list(resp.triggered), "auditor": resp.identity},
        f"triggered {', '.join(resp.triggered) or 'nothing'} on {resp.identity}",
    )
    return 0


async def cmd_health(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """For HEALTHCHECK and exec probes: exit 0 only when SERVING. `--json`: one object,
    `{"service": ..., "status": ...}` ("" is the server as a whole)."""
    from auditor.api.client import health_status_name

    async with api_client(args, daemon_target(args)) as api:
        status = await api.health(args.service)
    name = health_status_name(status)
    emit(out, args.json, {"service": args.service, "status": name}, name)
    return 0 if name == "SERVING" else 1


def add_parsers(sub: Any) -> None:
    status = sub.add_parser(
        "status", help="a daemon's status: leadership, checks, last counts, its worker"
    )
    api_args(status, with_common=True)
    bind(status, cmd_status)
    report = sub.add_parser("report", help="a daemon's last report of a check")
    report.add_argument("which", metavar="CHECK", choices=list(map(str, Check)))
    api_args(report, with_common=True)
    bind(report, cmd_report)
    health = sub.add_parser("health", help="a daemon's health; exit 0 when SERVING")
    api_args(health, with_common=True)
    health.add_argument(
        "--service", default="", help="auditor-liveness, auditor-readiness, or '' (default)"
    )
    bind(health, cmd_health)
