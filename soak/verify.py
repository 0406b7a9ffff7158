"""What a run with the daemons' real workers must leave behind, read from the cluster itself.

The log-based assertions (`soak.analysis`) judge what the daemons said; these judge
what the workers did, on the data: at the end of a run (every fault over, every bookie
back) every live ledger reads back completely, every entry from every bookie of its
write set with its digest checked, from the ensembles its metadata names now; no
ledger names a bookie that is not registered and running; and no mark is left (a
mark on a ledger that reads back whole is one a worker should have removed, a mark
on one that does not is a repair that never happened). Reads go over the wire
(`BookieClient`), as a BookKeeper reader's would, not into the emulators' storage.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from auditor.bookie.client import BookieClient
from auditor.bookie.protocol import BookieProtocolError, verify_entry_body
from auditor.bookie.results import Ok
from auditor.metadata.model import DigestType, LedgerMetadata
from auditor.metadata.schedule import write_set
from auditor.metadata.underreplication import UnderreplicationManager
from soak.cluster import ROOT, SoakCluster

#: Per read; longer than any healthy soak bookie's answer.
TIMEOUT = 5.0
#: Reads in flight at once across the cluster.
IN_FLIGHT = 32


@dataclass
class EndState:
    """The cluster as the run left it."""

    ledgers: int = 0
    entries_read: int = 0
    #: (ledger, entry, bookie, why) for every copy that did not read back verified.
    unreadable: list[tuple[int, int, str, str]] = field(default_factory=list)
    #: (ledger, bookie) for every bookie named by metadata that is not registered and up.
    gone: list[tuple[int, str]] = field(default_factory=list)
    #: Marks left: on ledgers that read back whole, and on the others.
    marks_on_whole: list[int] = field(default_factory=list)
    marks_on_damaged: list[int] = field(default_factory=list)
    drained_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "ledgers": self.ledgers,
            "entries_read": self.entries_read,
            "unreadable": [list(x) for x in self.unreadable[:50]],
            "unreadable_count": len(self.unreadable),
            "gone": [list(x) for x in self.gone[:50]],
            "marks_on_whole": self.marks_on_whole,
            "marks_on_damaged": self.marks_on_damaged,
            "drained_s": self.drained_s,
        }


async def marked_ids(c: SoakCluster) -> set[int]:
    return await UnderreplicationManager(c.client, ROOT).marked_ids()


async def drain(c: SoakCluster, within: float) -> float | None:
    """Waits until no mark is left (the workers finished); seconds taken, None if some
    were still there after `within`."""
    start = time.monotonic()
    while True:
        if not await marked_ids(c):
            return round(time.monotonic() - start, 1)
        if time.monotonic() - start >= within:
            return None
        await asyncio.sleep(1.0)


def _copies(md: LedgerMetadata) -> list[tuple[int, str]]:
    """(entry, bookie) for every copy the metadata says exists."""
    out: list[tuple[int, str]] = []
    for seg in md.segment_ranges():
        for entry in range(seg.first, seg.last + 1):
            for i in write_set(entry, md.ensemble_size, md.write_quorum):
                out.append((entry, seg.bookies[i]))
    return out


async def end_state(c: SoakCluster) -> EndState:
    """Reads the whole cluster back (call it once every fault is over)."""
    await c.refresh()
    out = EndState(ledgers=len(c.ledgers))
    registered = set(await c.client.get_children(f"{ROOT}/available")) - {"readonly"}
    up = {b.bookie_id for b in c.bookies if b.running} & registered
    addresses = {b.bookie_id: b.address for b in c.bookies}

    async def resolve(bookie_id: str) -> tuple[str, int] | None:
        return addresses.get(bookie_id)

    client = BookieClient(resolve, request_timeout=TIMEOUT, connect_timeout=TIMEOUT)
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def read(md: LedgerMetadata, entry: int, bookie: str) -> None:
        async with gate:
            got = await client.read_entry(bookie, md.ledger_id, entry)
        out.entries_read += 1
        if not isinstance(got, Ok):
            out.unreadable.append((md.ledger_id, entry, bookie, type(got).__name__))
            return
        digest = md.digest_type if md.digest_type is not None else DigestType.CRC32
        try:
            body = verify_entry_body(got.value.body, digest, md.password or b"")
        except BookieProtocolError as exc:
            out.unreadable.append((md.ledger_id, entry, bookie, str(exc)))
            return
        if (body.ledger_id, body.entry_id) != (md.ledger_id, entry):
            out.unreadable.append((md.ledger_id, entry, bookie, "another entry's bytes"))

    try:
        reads = []
        for lid, md in sorted(c.ledgers.items()):
            named = {b for seg in md.segments for b in seg.bookies}
            out.gone += [(lid, b) for b in sorted(named - up)]
            reads += [read(md, entry, bookie) for entry, bookie in _copies(md)]
        await asyncio.gather(*reads)
    finally:
        await client.close()
    damaged = {lid for lid, _, _, _ in out.unreadable} | {lid for lid, _ in out.gone}
    for lid in sorted(await marked_ids(c)):
        (out.marks_on_damaged if lid in damaged else out.marks_on_whole).append(lid)
    out.unreadable.sort()
    return out
