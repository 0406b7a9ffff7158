"""A benchmark cluster in its own process: ZooKeeper, emulated bookies, N ledgers.

Keeping the bookies out of the measured process means the auditor's memory
and CPU figures are its own. Prints one JSON line ({"zk": ..., "ledgers": N})
when ready, then serves until its stdin closes.

    python -m bench.cluster_host N [BOOKIES]
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from dataclasses import replace

from auditor.metadata.model import LedgerMetadata
from auditor.testing.bookie import BookieEmulator
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.zkserver import ZooKeeperServer
from auditor.zk import ZkClient

ENTRIES = 10
E, W, A = 3, 2, 2


async def serve(n: int, bookies: int) -> None:
    server = ZooKeeperServer()
    await asyncio.to_thread(server.start)
    try:
        async with ZkClient(server.hosts, timeout=60) as zk:
            cw = ClusterWriter(zk)
            await cw.init_cluster()
            emus = [BookieEmulator(zk) for _ in range(bookies)]
            for emu in emus:
                await emu.start()
            ids = [e.bookie_id for e in emus]
            template = make_metadata(
                0, ids[:E], write_quorum=W, ack_quorum=A, last_entry_id=ENTRIES - 1, length=160
            )

            def ledgers() -> Iterator[LedgerMetadata]:
                for lid in range(1, n + 1):
                    ensemble = tuple(ids[(lid + k) % bookies] for k in range(E))
                    for i, bookie in enumerate(ensemble):
                        held = [e for e in range(ENTRIES) if (i - e) % E < W]
                        emus[ids.index(bookie)].put_ledger(lid, held)
                    segs = (replace(template.segments[0], bookies=ensemble),)
                    yield replace(template, ledger_id=lid, segments=segs)

            await cw.write_ledgers(ledgers())
            print(json.dumps({"zk": server.hosts, "ledgers": n, "bookies": ids}), flush=True)
            await asyncio.to_thread(sys.stdin.read)
            for emu in emus:
                await emu.stop()
    finally:
        await asyncio.to_thread(server.destroy)


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 6))
