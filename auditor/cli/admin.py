"""BookKeeper's admin commands, done on the metadata store as its shell does them.

`whoisauditor`, `lost-bookie-recovery-delay`, `autorecovery` and `trigger` without
`--target` read and write the metadata store exactly as BookKeeper's shell does, so they
work whichever auditor leads (ours or Java's) and even with no daemon running.
`trigger --target` asks a daemon instead (`cli/api_commands.py`, with `status`, `report`
and `health`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from auditor.checks.findings import Check
from auditor.cli.api_commands import api_args, trigger_on_daemon
from auditor.cli.cluster import NO_ADDRESS, ZK_ENV, address_of, target_of_args
from auditor.cli.options import bind, cluster_args, emit
from auditor.errors import AuditorError, ConfigError
from auditor.metadata.cluster import ClusterTarget, connect
from auditor.metadata.elections import ElectionHolder, first_held_election, held_elections
from auditor.metadata.service_uri import MetadataDriver
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.store import BadVersionError, MetadataStore, NoNodeError

DELAY_ZNODE = "underreplication/lostBookieRecoveryDelay"

_LOOKUP_ATTEMPTS = 5


class AutoRecoveryDisabledError(AuditorError):
    """The `disable` flag is set: no auditor acts on a trigger."""


# --- whoisauditor: both elections, as the shell names them ----------------------------


def _election_doc(holder: ElectionHolder) -> dict[str, Any]:
    vote = holder.path.rsplit("/", 1)[-1] if holder.election is MetadataDriver.BOOKKEEPER else None
    return {
        "auditor": holder.auditor,
        "election": str(holder.election),
        "path": holder.path,
        "vote": vote,
        "held_by_session": holder.live,
    }


def _election_line(holder: ElectionHolder) -> str:
    where = (
        f"BookKeeper's election, vote {holder.path.rsplit('/', 1)[-1]}"
        if holder.election is MetadataDriver.BOOKKEEPER
        else f"Pulsar's election, key {holder.path}"
    )
    orphan = "; held by no session" if not holder.live else ""
    return f"{holder.auditor} ({where}{orphan})"


async def cmd_whoisauditor(
    target: ClusterTarget, as_json: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr
) -> int:
    """Reads both elections; exit 1 when both have an auditor (two auditors run)."""
    async with connect(target) as (store, _):
        found = await held_elections(store, target.root)
    if as_json:
        doc = dict(_election_doc(found[0]))
        doc["elections"] = [_election_doc(h) for h in found]
        out.write(json.dumps(doc) + "\n")
    else:
        for holder in found:
            out.write(_election_line(holder) + "\n")
    if len(found) > 1:
        err.write(
            "bk-auditor: two auditors: BookKeeper's election and Pulsar's both have one, "
            "so the cluster's nodes disagree on the metadata driver (give every node the "
            "same metadataServiceUri)\n"
        )
        return 1
    return 0


# --- lostBookieRecoveryDelay and the disable flag -----------------------------------


async def _read_delay(store: MetadataStore, root: str) -> tuple[int, int]:
    """(seconds, znode version)."""
    path = f"{root}/{DELAY_ZNODE}"
    try:
        data, stat = await store.get(path)
    except NoNodeError:
        raise AuditorError(
            f"{path} does not exist: no auditor has initialised it yet "
            "(set it with: lost-bookie-recovery-delay --set SECONDS)"
        ) from None
    text = data.decode("ascii", errors="replace").strip()
    try:
        return int(text), int(stat.version)
    except ValueError:
        raise AuditorError(f"{path} is not an integer: {text[:40]!r}") from None


async def cmd_lost_bookie_recovery_delay(
    target: ClusterTarget, set_to: int | None, as_json: bool, out: TextIO = sys.stdout
) -> int:
    async with connect(target) as (store, _):
        if set_to is None:
            seconds, _ = await _read_delay(store, target.root)
            emit(out, as_json, {"lost_bookie_recovery_delay": seconds}, str(seconds))
            return 0
        await UnderreplicationManager(store, target.root).set_lost_bookie_recovery_delay(set_to)
    emit(
        out,
        as_json,
        {"lost_bookie_recovery_delay": set_to},
        f"lostBookieRecoveryDelay set to {set_to}",
    )
    return 0


async def cmd_autorecovery(
    target: ClusterTarget, action: str, as_json: bool, out: TextIO = sys.stdout
) -> int:
    """Idempotent like BookKeeper's shell: asking for the current state only says so."""
    async with connect(target) as (store, _):
        urm = UnderreplicationManager(store, target.root)
        enabled = await urm.is_replication_enabled()
        wanted = {"enable": True, "disable": False}.get(action)
        if wanted is None or wanted == enabled:
            word = "enabled" if enabled else "disabled"
            text = word if wanted is None else f"auto-recovery was already {word}"
            emit(out, as_json, {"enabled": enabled, "changed": False}, text)
            return 0
        if wanted:
            await urm.enable_replication()
        else:
            await urm.disable_replication()
    word = "enabled" if wanted else "disabled"
    emit(out, as_json, {"enabled": wanted, "changed": True}, f"auto-recovery {word}")
    return 0


async def cmd_trigger_audit(target: ClusterTarget, as_json: bool, out: TextIO = sys.stdout) -> int:
    """BookKeeper's triggerAudit: rewrite the current delay, so the auditor audits bookies now.

    Same refusals as upstream (replication disabled, no auditor), since the
    write would otherwise silently do nothing. The rewrite is conditional on the
    version read, so a concurrent change of the delay is never overwritten.
    """
    async with connect(target) as (store, _):
        urm = UnderreplicationManager(store, target.root)
        if not await urm.is_replication_enabled():
            raise AutoRecoveryDisabledError(
                "auto-recovery is disabled, so no auditor acts on a trigger "
                "(enable it with: bk-auditor autorecovery enable)"
            )
        _, auditor = await first_held_election(store, target.root)
        path = f"{target.root}/{DELAY_ZNODE}"
        for _ in range(_LOOKUP_ATTEMPTS):
            seconds, version = await _read_delay(store, target.root)
            try:
                await store.set(path, str(seconds).encode(), version=version)
                break
            except (BadVersionError, NoNodeError):
                continue
        else:
            raise AuditorError(f"{path} kept changing; try again")
    emit(
        out,
        as_json,
        {"triggered": ["bookies"], "auditor": auditor, "lost_bookie_recovery_delay": seconds},
        f"audit triggered: {auditor} audits the bookies now "
        f"(lostBookieRecoveryDelay {seconds} rewritten)",
    )
    return 0


async def cmd_trigger(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """On a daemon with `--target`, else BookKeeper's trigger (the bookie audit only)."""
    if args.target:
        return await trigger_on_daemon(args, out)
    if args.which not in (None, str(Check.BOOKIES)):
        raise ConfigError(
            f"BookKeeper's trigger runs only the bookie audit; to run {args.which}, "
            "give --target HOST:PORT of a daemon"
        )
    try:
        address_of(args.zk, args.metadata_service_uri, args.bk_conf)
    except ConfigError as exc:
        if str(exc) != NO_ADDRESS:
            raise
        raise ConfigError(
            f"give --target HOST:PORT (a daemon) or --zk/--metadata-service-uri/{ZK_ENV}/"
            "--bk-conf (BookKeeper's own trigger)"
        ) from None
    return await cmd_trigger_audit(target_of_args(args), args.json, out)


# --- argument parsing -----------------------------------------------------------------


def _seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_parsers(sub: Any) -> None:
    who = sub.add_parser("whoisauditor", help="print the current auditor's id")
    cluster_args(who)
    bind(who, whoisauditor_command)
    delay = sub.add_parser(
        "lost-bookie-recovery-delay", help="print or set lostBookieRecoveryDelay (seconds)"
    )
    cluster_args(delay)
    delay.add_argument("--set", dest="set_to", type=_seconds, metavar="SECONDS")
    bind(delay, lost_bookie_recovery_delay_command)
    auto = sub.add_parser("autorecovery", help="enable, disable or show auto-recovery")
    auto.add_argument("action", choices=["enable", "disable", "status"])
    cluster_args(auto)
    bind(auto, autorecovery_command)
    trig = sub.add_parser(
        "trigger",
        help="run a check now: on a daemon (--target), else BookKeeper's trigger (--zk)",
    )
    trig.add_argument(
        "which",
        nargs="?",
        metavar="CHECK",
        choices=[*map(str, Check), "all"],
        help="bookies (the default), ledgers, placement, replicas, grace, or all (daemon only)",
    )
    cluster_args(trig)
    api_args(trig, with_common=False)
    bind(trig, cmd_trigger)


async def whoisauditor_command(args: argparse.Namespace) -> int:
    return await cmd_whoisauditor(target_of_args(args), args.json)


async def lost_bookie_recovery_delay_command(args: argparse.Namespace) -> int:
    return await cmd_lost_bookie_recovery_delay(target_of_args(args), args.set_to, args.json)


async def autorecovery_command(args: argparse.Namespace) -> int:
    return await cmd_autorecovery(target_of_args(args), args.action, args.json)
