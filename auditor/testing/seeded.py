"""The demo and the scan tests need one cluster where every finding of every check has a
known ledger, so that what the leader (or each engine) finds can be held against what was
planted.

A cluster with one seeded fault per category, on eight emulated bookies.

Healthy ledgers 1..2000 sit on rings of three bookies from three racks (every write
quorum spans two racks) and hold all their copies; the racks are published in Pulsar's
`/bookies` znode.

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

`build_pulsar_topics` adds (the demo does, the scan tests do not) a few Pulsar
topics over ledgers 4001..4043 on bookies of three racks, healthy for every
BookKeeper check: topics with cursors and schemas, one topic whose ledger 4021
lost its metadata (`missing`), ledger 4030 of a deleted topic, created three
days ago (`orphan`), and each namespace's `__change_events` system topic
(4040..4043), as a real broker leaves them. `PULSAR_EXPECTED` is what the Pulsar audit finds.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from auditor.bookie.client import BookieClient
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.registry import resolve_bookie
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.store import MetadataStore
from auditor.testing.bookie import BookieEmulator
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.pulsar import Cursor, PulsarWriter, managed_ledger_metadata
from auditor.testing.writer import LedgerWriter

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
    store: MetadataStore, bookies: list[BookieEmulator], healthy: int = HEALTHY
) -> None:
    """Writes the cluster onto eight started emulators; the caller then crashes bookie 6
    and pauses bookie 7 (that is the "lost" and the "registered but silent" bookie)."""
    ids = [b.bookie_id for b in bookies]
    cw = ClusterWriter(store, ROOT)
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
    urm = UnderreplicationManager(store, ROOT)
    two_hours_ago = int((time.time() - 7200) * 1000)
    await urm.mark_underreplicated(3006, [ids[5]], now_ms=two_hours_ago)
    group = {b.bookie_id: {"rack": RACKS[i], "hostname": b.host} for i, b in enumerate(bookies)}
    await store.create("/bookies", json.dumps({"default": group}).encode())


#: The Pulsar topics `build_pulsar_topics` writes (their namespaces: public/default, acme/iot).
PULSAR_TOPICS = (
    "persistent://public/default/orders",
    "persistent://public/default/events",
    "persistent://acme/iot/readings",
)
#: The ledger of `acme/iot/readings` whose metadata is deleted (Pulsar still lists it).
PULSAR_LOST = 4021
#: The ledger of the deleted topic `acme/iot/old-readings`, older than the orphan grace.
PULSAR_ORPHAN = 4030
#: What the Pulsar audit must find on the demo's cluster (category -> ledger ids).
PULSAR_EXPECTED: dict[str, set[int]] = {
    "missing": {PULSAR_LOST},
    "orphan": {PULSAR_ORPHAN},
    "dangling_cursor": set(),
}
#: Bookies the Pulsar ledgers sit on: one per rack, so every check finds them healthy.
_PULSAR_RING = (0, 2, 4)


async def build_pulsar_topics(store: MetadataStore, bookies: list[BookieEmulator]) -> None:
    """Writes Pulsar's tree (at ZooKeeper's root, as a Pulsar cluster sharing its
    ZooKeeper with BookKeeper has it) and its ledgers onto the started emulators of
    `build_seeded_cluster` (see the module's docstring)."""
    cw = ClusterWriter(store, ROOT)

    async def resolve(bookie_id: str) -> tuple[str, int] | None:
        return await resolve_bookie(store, ROOT, bookie_id)

    client = BookieClient(resolve, request_timeout=5.0)
    try:
        lw = LedgerWriter(cw, client)
        w = PulsarWriter(lw, [bookies[i].bookie_id for i in _PULSAR_RING], root="")
        orders, events, readings = PULSAR_TOPICS
        await w.topic(
            orders,
            ledgers=[4001, 4002, 4003],
            cursors={"billing": Cursor(ledger=4004, mark_delete=(4002, 1)), "audit": Cursor()},
        )
        await w.schema(orders, ledgers=[4005])
        await w.topic(events, ledgers=[4010, 4011], cursors={"ingest": Cursor(ledger=4012)})
        await w.schema(events, ledgers=[4013, 4014])
        await w.topic(
            readings,
            ledgers=[4020, PULSAR_LOST, 4022],
            cursors={"dashboard": Cursor(ledger=4023)},
        )
        await store.delete(cw.path(PULSAR_LOST))
        # Each namespace's topic-policies system topic, as a 4.x broker creates it.
        await w.system_topic("public/default", 4040, 4041)
        await w.system_topic("acme/iot", 4042, 4043)
        # A topic deleted three days ago whose broker removed its znodes, not its ledger.
        old = "acme/iot/persistent/old-readings"
        three_days_ago = int((time.time() - 3 * 86400) * 1000)
        await lw.write_ledger(
            PULSAR_ORPHAN,
            w.bookies,
            write_quorum=2,
            num_entries=w.entries,
            ctime=three_days_ago,
            custom_metadata=managed_ledger_metadata(old),
        )
    finally:
        await client.close()
