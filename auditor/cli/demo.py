"""`bk-auditor demo`: the auditor on an embedded default cluster.

A throwaway ZooKeeper (Debian's package) on a free loopback port, five
emulated bookies speaking the real v3 protocol (one a DbLedgerStorage bookie
that cannot list entries), racks in Pulsar's `/bookies` znode, ledgers written
through that protocol in metadata formats v1-v3 and every state. Then
trouble: one bookie crashes, another loses an entry, and an old
under-replication mark has sat there for two hours. The auditor's listings
and every check (`check all --mark`) then report on it exactly as they would
on a production cluster. Everything is torn down at the end.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from auditor.bookie.client import BookieClient
from auditor.bookie.results import CannotList, ErrorStatus, Ok
from auditor.cli.check import cmd_check
from auditor.cli.cluster import ClusterTarget
from auditor.cli.inspect import cmd_bookies, cmd_ledgers, cmd_list_underreplicated
from auditor.config import load_config
from auditor.logs import configure_logging
from auditor.metadata.layout import LedgerManager
from auditor.metadata.model import LedgerState
from auditor.metadata.registry import resolve_bookie
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.bookie import BookieEmulator, Storage
from auditor.testing.cluster import ClusterWriter
from auditor.testing.writer import LedgerWriter, WrittenLedger
from auditor.testing.zkserver import ZooKeeperServer
from auditor.zk import ZkClient

ROOT = "/ledgers"


def _section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def _runs(runs: list[tuple[int, int]], shown: int = 6) -> str:
    if not runs:
        return "nothing"
    text = " ".join(f"{s}" if n == 1 else f"{s}-{s + n - 1}" for s, n in runs[:shown])
    total = sum(n for _, n in runs)
    more = f" ... ({len(runs) - shown} more runs)" if len(runs) > shown else ""
    return f"{total} entries: {text}{more}"


async def _build(
    zk: ZkClient, client: BookieClient, bookies: list[BookieEmulator]
) -> list[WrittenLedger]:
    cw = ClusterWriter(zk, ROOT, LedgerManager.HIERARCHICAL)
    writer = LedgerWriter(cw, client, password=b"demo")
    b = [x.bookie_id for x in bookies]
    return [
        await writer.write_ledger(1, b[0:3], write_quorum=2, ack_quorum=2, num_entries=100),
        await writer.write_ledger(
            2,
            [(0, [b[0], b[1], b[2]]), (50, [b[0], b[3], b[2]])],
            write_quorum=2,
            ack_quorum=2,
            num_entries=80,
        ),
        await writer.write_ledger(
            3, [b[2], b[3], b[4]], write_quorum=3, ack_quorum=2, num_entries=30, format_version=2
        ),
        await writer.write_ledger(
            4, b[1:4], write_quorum=2, num_entries=20, state=LedgerState.OPEN, format_version=1
        ),
        await writer.write_ledger(
            2147483647,
            b[3:5],
            write_quorum=2,
            num_entries=10,
            state=LedgerState.IN_RECOVERY,
            format_version=2,
        ),
    ]


async def _racks(zk: ZkClient, bookies: list[BookieEmulator]) -> None:
    """Pulsar's rack znode: bookies 0 and 1 share a rack, the rest have one each."""
    racks = ["/rack-a", "/rack-a", "/rack-b", "/rack-c", "/rack-d"]
    group = {
        b.bookie_id: {"rack": rack, "hostname": b.host}
        for b, rack in zip(bookies, racks, strict=True)
    }
    await zk.create("/bookies", json.dumps({"default": group}).encode())


async def _show_holdings(client: BookieClient, ledgers: list[WrittenLedger]) -> None:
    """What each ensemble bookie says it holds of each closed ledger (GET_LIST_OF_ENTRIES)."""
    for led in ledgers:
        md = led.metadata
        if md.state is not LedgerState.CLOSED:
            continue
        for bookie in sorted(md.bookies()):
            out = await client.get_list_of_entries(bookie, md.ledger_id)
            if isinstance(out, Ok):
                text = f"holds {_runs(list(out.value.iter_runs()))}"
            elif isinstance(out, CannotList):
                text = "cannot list entries (DbLedgerStorage): left to reads"
            elif isinstance(out, ErrorStatus):
                text = f"answered {out}"
            else:
                text = f"no answer ({out})"
            print(f"ledger {md.ledger_id:<3} {bookie:<18} {text}")


async def run_demo() -> int:
    # The demo's story is on stdout; the checks' evidence logs only above warnings.
    configure_logging(level=40)
    print("Starting a throwaway ZooKeeper and five emulated bookies ...", flush=True)
    server = ZooKeeperServer()
    await asyncio.to_thread(server.start)
    try:
        async with ZkClient(server.hosts) as zk:
            await ClusterWriter(zk, ROOT).init_cluster()
            bookies = [BookieEmulator(zk, ledgers_root=ROOT) for _ in range(4)]
            bookies.append(BookieEmulator(zk, ledgers_root=ROOT, storage=Storage.DBLEDGER))
            for bk in bookies:
                await bk.start()
            await _racks(zk, bookies)

            async def resolve(bookie_id: str) -> tuple[str, int] | None:
                return await resolve_bookie(zk, ROOT, bookie_id)

            client = BookieClient(resolve, request_timeout=2.0, list_timeout=1.0)
            try:
                ledgers = await _build(zk, client, bookies)
                lost = bookies[3]
                await lost.crash()
                print(
                    f"Wrote {len(ledgers)} ledgers through the bookie protocol; "
                    f"crashed bookie {lost.bookie_id}.\nZooKeeper: {server.hosts}{ROOT}",
                    flush=True,
                )
                bookies[0].drop_entries(1, [3])  # bookie 0 silently loses entry 3 of ledger 1
                # A mark BookKeeper's auditor left two hours ago that no worker acted on.
                urm = UnderreplicationManager(zk, ROOT)
                two_hours_ago = int((time.time() - 7200) * 1000)
                await urm.mark_underreplicated(2147483647, [lost.bookie_id], now_ms=two_hours_ago)

                target = ClusterTarget(server.hosts, ROOT, None, 10.0)
                _section("bk-auditor bookies")
                await cmd_bookies(target, False)
                _section("bk-auditor ledgers")
                await cmd_ledgers(target, False, err=sys.stdout)
                _section("what the ensemble bookies of closed ledgers hold")
                await _show_holdings(client, ledgers)
                _section("bk-auditor check all --mark")
                config = load_config(
                    None,
                    [
                        "underreplicatedLedgerRecoveryGracePeriod=3600",
                        "readEntryTimeout=1",
                        "checks.retry_delay=1",
                    ],
                )
                code = await cmd_check(target, "all", config, as_json=False, mark=True)
                print(f"(exit code {code}: {'violations found' if code else 'clean'})")
                _section("bk-auditor list-underreplicated (after the checks marked)")
                await cmd_list_underreplicated(target, False, err=sys.stdout)
            finally:
                await client.close()
                for bk in bookies:
                    await bk.stop()
    finally:
        await asyncio.to_thread(server.destroy)
    print("\nDone; the throwaway ZooKeeper and bookies are gone.")
    return 0
