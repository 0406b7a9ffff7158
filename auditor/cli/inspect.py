"""Read-only listings: ledgers, under-replicated ledgers, bookies.

A bad znode never empties a listing: a corrupt ledger, an invalid ledger
znode (a path spelling an id beyond 2^63-1) or a corrupt under-replication
mark is named on its own line with its path and reason, everything else is
listed, and the exit status is 1 (0 when nothing was bad).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from auditor.checks.placement import PlacementPolicy, policy_kind
from auditor.cli.cluster import target_of_args
from auditor.cli.options import bind, cluster_args, config_args
from auditor.config import AuditorConfig, load_config
from auditor.errors import ConfigError, shown_name
from auditor.metadata.cluster import ClusterTarget, connect
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.registry import all_known_bookies, read_bookies, resolve_bookie
from auditor.metadata.underreplication import (
    CorruptMark,
    UnderreplicatedLedger,
    UnderreplicationManager,
)
from auditor.metadata.walk import LedgerWalker
from auditor.timefmt import iso_datetime
from auditor.topology.locations import normalize_location
from auditor.topology.racks import open_rack_resolver_or_blind


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
    async with connect(target) as (store, manager):
        walker = LedgerWalker(store, target.root, manager)
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
        for znode in stats.unexpected:
            if znode.invalid_ledger:
                status = 1
                print(f"bk-auditor: error: invalid ledger znode {znode}", file=err)
        unnamed = stats.invalid_ledgers - sum(u.invalid_ledger for u in stats.unexpected)
        if unnamed:
            status = 1
            print(f"bk-auditor: error: {unnamed} more invalid ledger znodes", file=err)
        summary = (
            f"{stats.ledgers} ledgers, {stats.corrupt} corrupt, "
            f"{stats.deleted_during_walk} deleted during the walk"
        )
        if stats.invalid_ledgers:
            summary += f", {stats.invalid_ledgers} invalid ledger znodes"
        if stats.unexpected_count:
            first = stats.unexpected[0].path
            summary += f", {stats.unexpected_count} unexpected znodes (first: {first})"
        print(summary, file=err)
    return status


def mark_json(item: UnderreplicatedLedger | CorruptMark, iso_time: bool = False) -> dict[str, Any]:
    """One line of `list-underreplicated --json`: a mark, or a corrupt one (`corrupt`: why).

    `iso_time`: `ctime_iso` too, the ctime in ISO 8601 (None when the mark has none)."""
    if isinstance(item, CorruptMark):
        return {"ledger_id": item.ledger_id, "path": item.path, "corrupt": item.reason}
    doc: dict[str, Any] = {
        "ledger_id": item.ledger_id,
        "replicas": list(item.replicas),
        "ctime": item.ctime,
    }
    if iso_time:
        doc["ctime_iso"] = ctime_iso(item.ctime)
    return doc


def ctime_iso(ctime_ms: int) -> str | None:
    """A mark's ctime (ms since the epoch) in ISO 8601; None for Java's unassigned -1."""
    if ctime_ms < 0:
        return None
    return iso_datetime(datetime.fromtimestamp(ctime_ms / 1000, UTC))


@dataclass(frozen=True)
class MarkFilter:
    """BookKeeper's `listunderreplicated -missingreplica / -excludingmissingreplica`: a mark
    is listed when its missing replicas name `missing` (if given) and do not name `excluded`
    (if given)."""

    missing: str | None = None
    excluded: str | None = None

    def wants(self, mark: UnderreplicatedLedger) -> bool:
        if self.missing is not None and self.missing not in mark.replicas:
            return False
        return self.excluded is None or self.excluded not in mark.replicas


def _mark_line(item: UnderreplicatedLedger, iso_time: bool) -> str:
    when: object = item.ctime
    if iso_time:
        when = ctime_iso(item.ctime) or "-"
    return f"{item.ledger_id:>12}  ctime={when}  missing={','.join(item.replicas)}\n"


async def cmd_list_underreplicated(
    target: ClusterTarget,
    as_json: bool,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    *,
    only: MarkFilter = MarkFilter(),
    count_only: bool = False,
    iso_time: bool = False,
) -> int:
    """Every mark `only` wants; each corrupt one on a line of its own (stderr, or a JSON line
    with `corrupt`: a corrupt mark names no replicas, so no filter can judge it), and then
    exit status 1. `count_only`: the number of marks listed, and nothing else on stdout.

    `count_only` without a filter reads no mark's data, only the listings (as BookKeeper's
    `listunderreplicated -c` without a filter): a hundred thousand marks are counted in
    the time their directories take to list. The count is then of the znodes named and
    placed as BookKeeper's marks, and `corrupt` of the other znodes among them (a name
    that is no mark's, a mark out of place, a stray); a mark whose data does not decode
    is counted as a mark, since only reading it tells (the listing without `count_only`,
    or a filter, reads it and names it corrupt)."""
    listing_only = count_only and only == MarkFilter()
    async with connect(target) as (store, _):
        urm = UnderreplicationManager(store, target.root)
        count = corrupt = 0
        items: AsyncGenerator[int | UnderreplicatedLedger | CorruptMark, None] = (
            urm.list_mark_names() if listing_only else urm.list_marks()
        )
        async with aclosing(items):
            async for item in items:
                if isinstance(item, CorruptMark):
                    corrupt += 1
                    if as_json and not count_only:
                        out.write(json.dumps(mark_json(item)) + "\n")
                    else:
                        print(f"bk-auditor: error: corrupt under-replication mark {item}", file=err)
                    continue
                if isinstance(item, int):
                    count += 1  # a mark's name, listed only (its data is not read)
                    continue
                if not only.wants(item):
                    continue
                count += 1
                if count_only:
                    continue
                if as_json:
                    out.write(json.dumps(mark_json(item, iso_time)) + "\n")
                else:
                    out.write(_mark_line(item, iso_time))
        enabled = await urm.is_replication_enabled()
    if count_only:
        out.write(
            (json.dumps({"count": count, "corrupt": corrupt}) if as_json else str(count)) + "\n"
        )
    bad = f", {corrupt} corrupt marks" if corrupt else ""
    print(
        f"{count} under-replicated ledgers{bad}; "
        f"auto-recovery {'enabled' if enabled else 'DISABLED'}",
        file=err,
    )
    return 1 if corrupt else 0


#: The states `bookies` shows: registered writable, registered read-only, or down (a cookie
#: says the bookie belongs to the cluster, but it is not registered).
BOOKIE_STATES = ("writable", "readonly", "down")


@dataclass(frozen=True)
class BookieFilter:
    """`bookies --state S` and `--rack R` (each repeatable; empty: any). A rack is compared
    as BookKeeper normalises it (`rack-a` is `/rack-a`)."""

    states: frozenset[str] = frozenset()
    racks: frozenset[str] = frozenset()

    @classmethod
    def of(cls, states: Sequence[str], racks: Sequence[str]) -> BookieFilter:
        wanted = set()
        for rack in racks:
            loc = normalize_location(rack)
            if loc is None:
                raise ConfigError(f"--rack {shown_name(rack)} names no location")
            wanted.add(loc)
        return cls(frozenset(states), frozenset(wanted))

    def wants(self, row: Mapping[str, Any]) -> bool:
        if self.states and row["state"] not in self.states:
            return False
        return not self.racks or row["rack"] in self.racks


def bookie_line(row: Mapping[str, Any]) -> str:
    return f"{row['bookie_id']:<30} {row['state']:<9} {row['rack']:<20} {row['address'] or '-'}\n"


async def cmd_bookies(
    target: ClusterTarget,
    as_json: bool,
    config: AuditorConfig | None = None,
    only: BookieFilter = BookieFilter(),
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Every bookie the cluster knows (registered, or with a cookie), with its state and its
    rack: from the rack sources the placement check reads (`checks.racks_file`, the
    topology script, Pulsar's `/bookies` znode), else the placement policy's default
    location (`rack_source` null). Rack sources that cannot be read (an invalid
    `/bookies`) still list every bookie, at the default rack, with an error line and
    exit status 2, as `check all` runs the other checks when placement cannot run."""
    config = config if config is not None else AuditorConfig()
    default_rack = PlacementPolicy(
        kind=policy_kind(config.bookkeeper.ensemblePlacementPolicy)
    ).default_location
    async with connect(target) as (store, _):
        current = await read_bookies(store, target.root)
        known = await all_known_bookies(store, target.root)
        bookies = sorted(known | current.available)
        resolver, racks_unreadable = await open_rack_resolver_or_blind(store, target.root, config)
        if racks_unreadable is not None:
            print(
                "bk-auditor: error: rack sources unreadable, every bookie shown at the "
                f"default rack: {racks_unreadable}",
                file=err,
            )
        racks = await resolver.locations(bookies)
        for bookie in bookies:
            state = (
                "writable"
                if bookie in current.writable
                else "readonly"
                if bookie in current.readonly
                else "down"
            )
            addr = await resolve_bookie(store, target.root, bookie)
            row = {
                "bookie_id": bookie,
                "state": state,
                "rack": racks.get(bookie, default_rack),
                "rack_source": resolver.source_of(bookie),
                "address": f"{addr[0]}:{addr[1]}" if addr else None,
                "cookie": bookie in known,
            }
            if not only.wants(row):
                continue
            out.write(json.dumps(row) + "\n" if as_json else bookie_line(row))
    return 2 if racks_unreadable is not None else 0  # 2: as `check all` when a check cannot run


def add_parsers(sub: Any) -> None:
    ledgers = sub.add_parser("ledgers", help="list ledgers with state, quorum sizes and ensembles")
    cluster_args(ledgers)
    bind(ledgers, ledgers_command)
    bookies = sub.add_parser("bookies", help="list bookies: state (writable, readonly, down), rack")
    cluster_args(bookies)
    config_args(bookies)
    bookies.add_argument(
        "--state",
        dest="states",
        action="append",
        default=[],
        choices=["writable", "readonly", "down"],
        help="only bookies in this state (repeatable)",
    )
    bookies.add_argument(
        "--rack",
        dest="racks",
        action="append",
        default=[],
        metavar="LOCATION",
        help="only bookies at this location, e.g. /rack-a (repeatable)",
    )
    bind(bookies, bookies_command)
    lur = sub.add_parser("list-underreplicated", help="list ledgers marked under-replicated")
    cluster_args(lur)
    lur.add_argument(
        "--missing-replica",
        metavar="BOOKIE",
        help="only marks whose missing replicas name this bookie",
    )
    lur.add_argument(
        "--exclude-missing-replica",
        metavar="BOOKIE",
        help="leave out marks whose missing replicas name this bookie",
    )
    lur.add_argument(
        "--count-only",
        action="store_true",
        help="print only the number of marks listed (without a filter: from the listings, "
        "no mark's data read, so a mark whose data is corrupt counts as a mark)",
    )
    lur.add_argument(
        "--iso-time",
        action="store_true",
        help="ctime in ISO 8601 (text), and ctime_iso besides ctime (--json)",
    )
    bind(lur, list_underreplicated_command)


async def ledgers_command(args: argparse.Namespace) -> int:
    return await cmd_ledgers(target_of_args(args), args.json)


async def bookies_command(args: argparse.Namespace) -> int:
    only = BookieFilter.of(args.states, args.racks)
    config = load_config(args.config, args.overrides)
    return await cmd_bookies(target_of_args(args, config), args.json, config, only)


async def list_underreplicated_command(args: argparse.Namespace) -> int:
    return await cmd_list_underreplicated(
        target_of_args(args),
        args.json,
        only=MarkFilter(args.missing_replica, args.exclude_missing_replica),
        count_only=args.count_only,
        iso_time=args.iso_time,
    )
