"""A cluster with one seeded fault per category, on eight emulated bookies.

The demo shows it and the scan tests compare engines on it. Healthy ledgers
1..2000 sit on rings of three bookies from three racks (every write quorum
spans two racks) and hold all their copies; the racks are published in
Pulsar's `/bookies` znode.

The seeded faults (ledger ids) and what the leader must find:
- 3001 on a bookie that died (cookie, no registration): `ledgers_on_lost_bookies`
  and `unreadable_fragments`;
- 3002 an entry with no copy left: `no_replica`;
- 3003 W=A=2 and one copy lost: `below_ack_quorum`;
- 3004 W=3, A=2 and one copy lost: `below_write_quorum`;
- 3005 two bookies of one rack in a write quorum: `placement_not_adhering`;
- 3006 marked under-replicated two hours ago: `underreplicated_past_grace_period`;
- 3007 on a bookie that is registered but answers nothing:
  `bookie_unavailable_registered`, then `unreadable_fragments`;
- 3008 metadata that does not decode: `metadata_invalid` in every check.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from auditor.metadata.model import LedgerMetadata
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.bookie import BookieEmulator
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.zk import ZkClient

ROOT = "/ledgers"
HEALTHY = 2000
ENTRIES = 10
RACKS = ["/rack-0", "/rack-0", "/rack-1", "/rack-1", "/rack-2", "/rack-2", "/rack-2", "/rack-1"]
#: What the leader's first round must report (check -> category -> ledgers).
EXPECTED = {
    "bookies": {"ledgers_on_lost_bookies": 1, "metadata_invalid": 1},
    "ledgers": {"unreadable_fragments": 2, "metadata_invalid": 1},
    "placement": {
        "placement_not_adhering": 1,
        "placement_softly_adhering": 0,
        "metadata_invalid": 1,
    },
    "replicas": {
        "no_replica": 1,
        "below_ack_quorum": 1,
        "below_write_quorum": 1,
        "bookie_unavailable_registered": 1,
        "underreplicated_past_grace_period": 1,
        "metadata_invalid": 1,
    },
    "grace": {"underreplicated_past_grace_period": 1, "metadata_invalid": 0},
}


def _held(index: int, e: int, w: int) -> list[int]:
    return [x for x in range(ENTRIES) if (index - x) % e < w]


async def build_seeded_cluster(
    zk: ZkClient, bookies: list[BookieEmulator], healthy: int = HEALTHY
) -> None:
    """Writes the cluster onto eight started emulators; the caller then crashes bookie 6
    and pauses bookie 7 (that is the "lost" and the "registered but silent" bookie)."""
    ids = [b.bookie_id for b in bookies]
    cw = ClusterWriter(zk, ROOT)
    await cw.init_cluster()
    # Rings of three bookies from three racks: every write quorum spans two racks.
    rings = [(0, 2, 4), (1, 3, 5), (2, 4, 0), (3, 5, 1), (4, 0, 2), (5, 1, 3)]

    def place(lid: int, ensemble: tuple[int, ...], w: int, a: int) -> LedgerMetadata:
        for i, b in enumerate(ensemble):
            bookies[b].put_ledger(lid, _held(i, len(ensemble), w))
        return make_metadata(
            lid,
            [ids[b] for b in ensemble],
            write_quorum=w,
            ack_quorum=a,
            last_entry_id=ENTRIES - 1,
            length=ENTRIES * 16,
        )

    template = place(1, rings[0], 2, 2)

    def healthy_ledgers() -> Any:
        yield template
        for lid in range(2, healthy + 1):
            ring = rings[lid % len(rings)]
            for i, b in enumerate(ring):
                bookies[b].put_ledger(lid, _held(i, 3, 2))
            yield replace(
                template,
                ledger_id=lid,
                segments=(replace(template.segments[0], bookies=tuple(ids[b] for b in ring)),),
            )

    await cw.write_ledgers(healthy_ledgers())
    faults = [
        place(3001, (0, 2, 6), 2, 2),  # bookie 6 is going to die
        place(3002, (0, 2, 4), 2, 2),
        place(3003, (1, 3, 5), 2, 2),
        place(3004, (2, 4, 0), 3, 2),
        place(3005, (0, 1, 2), 2, 2),  # bookies 0 and 1 share rack-0
        place(3006, (3, 5, 1), 2, 2),
        place(3007, (7, 0, 4), 2, 2),  # bookie 7 will stop answering
    ]
    for md in faults:
        await cw.write_ledger(md)
    # Entry 5 of 3002 is on indexes 2 and 0 (bookies 4 and 0): gone from both.
    bookies[4].drop_entries(3002, [5])
    bookies[0].drop_entries(3002, [5])
    bookies[3].drop_entries(3003, [4])  # index 1 holds entry 4 (W=2)
    bookies[4].drop_entries(3004, [4])  # index 1 of (2, 4, 0), W=3: one of three copies
    await cw.write_raw(3008, b"BookieMetadataFormatVersion\t3\n\x07garbage")
    urm = UnderreplicationManager(zk, ROOT)
    two_hours_ago = int((time.time() - 7200) * 1000)
    await urm.mark_underreplicated(3006, [ids[5]], now_ms=two_hours_ago)
    group = {b.bookie_id: {"rack": RACKS[i], "hostname": b.host} for i, b in enumerate(bookies)}
    await zk.create("/bookies", json.dumps({"default": group}).encode())
