"""`bk-auditor autorecovery-status`: which ledgers are being re-replicated, and by whom.

BookKeeper's shell `queryautorecoverystatus` (java-auditor-behaviour.md §4.2): every
lock under `underreplication/locks`, with its ledger and its holder (LockDataFormat's
`bookieId`: the host name a Java worker writes, `worker.lock_holder` or the host name
ours write, the host of a `recover` run). It reads the metadata store only, so it shows the
whole cluster's workers, Java's and ours, with no daemon to ask; `status` shows one
daemon's worker in detail (the step, the fragments, what it waits for).

Beyond upstream: since when each lock is held (its ctime), the session holding it,
whether the ledger is marked and which replicas the mark names (a lock without a mark
is a `recover` run or a bookie's garbage collector), and whether auto-recovery is
disabled. A lock whose name or data is not BookKeeper's is listed with what is wrong
with it, never an error. Exit 0 whatever it finds.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from auditor.cli.cluster import target_of_args
from auditor.cli.options import bind, cluster_args
from auditor.metadata.cluster import ClusterTarget, connect
from auditor.metadata.records import RecordFormatError, decode_lock_data
from auditor.metadata.underreplication import (
    CorruptMark,
    UnderreplicatedLedger,
    UnderreplicationManager,
)
from auditor.store import NoNodeError
from auditor.timefmt import iso_datetime

#: Java's pattern for a lock's ledger id (`urL(\d+)$`); we ask for its exact name too.
_LOCK_NAME = re.compile(r"urL(\d{10,19})")


async def read_locks(target: ClusterTarget) -> dict[str, Any]:
    """The document `--json` prints: every lock, and whether auto-recovery is enabled."""
    async with connect(target) as (store, _):
        urm = UnderreplicationManager(store, target.root)
        locks_path = f"{urm.base}/locks"
        try:
            names = sorted(await store.get_children(locks_path))
        except NoNodeError:
            names = []
        locks: list[dict[str, Any]] = []
        for name in names:
            path = f"{locks_path}/{name}"
            try:
                data, stat = await store.get(path)
            except NoNodeError:
                continue  # released while we looked
            entry: dict[str, Any] = {
                "ledger_id": None,
                "lock": path,
                "holder": None,
                "since": iso_datetime(datetime.fromtimestamp(stat.ctime / 1000, tz=UTC)),
                "session": f"0x{int(stat.ephemeralOwner):x}" if stat.ephemeralOwner else None,
                "marked": False,
                "missing_replicas": [],
                "problem": None,
            }
            problems: list[str] = []
            try:
                entry["holder"] = decode_lock_data(data)
            except RecordFormatError as exc:
                problems.append(f"lock data does not decode: {exc.reason}")
            m = _LOCK_NAME.fullmatch(name)
            lid = int(m.group(1)) if m else None
            if lid is None or lid >= 2**63 or name != f"urL{lid:010d}":
                problems.append("not a BookKeeper lock name (urL and the 10-digit ledger id)")
            else:
                entry["ledger_id"] = lid
                mark = await urm.get_mark(lid)
                if isinstance(mark, UnderreplicatedLedger):
                    entry["marked"] = True
                    entry["missing_replicas"] = list(mark.replicas)
                elif isinstance(mark, CorruptMark):
                    entry["marked"] = True
                    problems.append(f"its mark is corrupt: {mark.reason}")
            if not stat.ephemeralOwner:
                problems.append("persistent: no session holds it, nothing will release it")
            entry["problem"] = "; ".join(problems) or None
            locks.append(entry)
        enabled = await urm.is_replication_enabled()
    return {"replication_enabled": enabled, "count": len(locks), "locks": locks}


def render(doc: dict[str, Any], out: TextIO) -> None:
    if not doc["replication_enabled"]:
        out.write("auto-recovery is DISABLED: workers take no new ledger\n")
    if not doc["locks"]:
        out.write("no ledger is being re-replicated\n")
        return
    for lock in doc["locks"]:
        what = f"ledger {lock['ledger_id']}" if lock["ledger_id"] is not None else lock["lock"]
        holder = lock["holder"] if lock["holder"] is not None else "(names no holder)"
        if lock["marked"]:
            missing = ", ".join(lock["missing_replicas"]) or "none listed"
            marked = f"marked (missing: {missing})"
        else:
            marked = "not marked"
        line = f"{what}: held by {holder} since {lock['since']}; {marked}"
        if lock["problem"]:
            line += f"; {lock['problem']}"
        out.write(line + "\n")
    n = doc["count"]
    out.write(f"{n} ledger{'s' * (n != 1)} being re-replicated\n")


async def cmd_autorecovery_status(
    target: ClusterTarget, as_json: bool, out: TextIO = sys.stdout
) -> int:
    doc = await read_locks(target)
    if as_json:
        out.write(json.dumps(doc) + "\n")
    else:
        render(doc, out)
    return 0


def add_parsers(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "autorecovery-status",
        help="ledgers being re-replicated cluster-wide, with each lock's holder "
        "(BookKeeper's queryautorecoverystatus)",
    )
    cluster_args(p)
    bind(p, autorecovery_status_command)


async def autorecovery_status_command(args: argparse.Namespace) -> int:
    return await cmd_autorecovery_status(target_of_args(args), args.json)
