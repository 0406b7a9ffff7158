"""Check tests need bookies that hold exactly what a real client would have left on them,
with metadata that agrees, before any fault is injected.

Writes ledgers as a BookKeeper client does: entries to bookies over the wire, then metadata.

Every entry goes by ADD_ENTRY to each bookie of its write set (round robin
within the segment that covers it), with a real entry body (header, CRC32C
digest, payload), so that the bookies end up holding exactly what a real
client would have left on them. Then the ledger's metadata is written in the
requested format and state. Check tests and the demo build their clusters with
it; faults (lost entries, missing bookies) are injected afterwards on the
emulators.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace

from auditor.bookie.client import BookieClient
from auditor.bookie.protocol import encode_entry_body
from auditor.bookie.results import Ok
from auditor.errors import AuditorError
from auditor.metadata.model import (
    INVALID_ENTRY_ID,
    DigestType,
    LedgerMetadata,
    LedgerState,
    Segment,
)
from auditor.metadata.schedule import write_set
from auditor.metadata.serde import encode_ledger_metadata
from auditor.testing.cluster import ClusterWriter, Ensembles, make_metadata, normalize_segments


class WriteFailedError(AuditorError):
    """A bookie refused or did not acknowledge an entry."""


@dataclass(frozen=True, slots=True)
class WrittenLedger:
    metadata: LedgerMetadata
    path: str
    entries: int


class LedgerWriter:
    """Writes whole ledgers through a bookie client into a cluster."""

    def __init__(
        self,
        cluster: ClusterWriter,
        client: BookieClient,
        *,
        digest_type: DigestType = DigestType.CRC32C,
        password: bytes = b"",
        payload_size: int = 16,
        concurrency: int = 256,
    ) -> None:
        self.cluster = cluster
        self.client = client
        self.digest_type = digest_type
        self.password = password
        self.payload_size = payload_size
        self._slots = asyncio.Semaphore(concurrency)

    def payload(self, ledger_id: int, entry_id: int) -> bytes:
        seed = f"L{ledger_id}E{entry_id}:".encode()
        return (seed * (self.payload_size // len(seed) + 1))[: self.payload_size]

    async def _add(self, bookie: str, ledger_id: int, entry_id: int, body: bytes) -> None:
        async with self._slots:
            outcome = await self.client.add_entry(
                bookie, ledger_id, entry_id, body, password=self.password
            )
        if not isinstance(outcome, Ok):
            raise WriteFailedError(
                f"bookie {bookie} did not store entry {entry_id} of ledger {ledger_id}: {outcome}"
            )

    async def write_entries(
        self,
        ledger_id: int,
        segments: Sequence[tuple[int, Sequence[str]]],
        write_quorum: int,
        num_entries: int,
    ) -> None:
        """Sends entries 0..num_entries-1 to their write sets, all pipelined."""
        adds = []
        for k, (first, bookies) in enumerate(segments):
            end = segments[k + 1][0] if k + 1 < len(segments) else num_entries
            for e in range(first, min(end, num_entries)):
                body = encode_entry_body(
                    ledger_id,
                    e,
                    e - 1,
                    (e + 1) * self.payload_size,
                    self.payload(ledger_id, e),
                    self.digest_type,
                    self.password,
                )
                for i in write_set(e, len(bookies), write_quorum):
                    adds.append(self._add(bookies[i], ledger_id, e, body))
        await asyncio.gather(*adds)

    async def rereplicate(self, written: WrittenLedger, ensemble: Sequence[str]) -> LedgerMetadata:
        """A finished re-replication: the entries written to `ensemble`, then the metadata
        switched to it as one segment (everything else as written)."""
        md = written.metadata
        await self.write_entries(md.ledger_id, [(0, ensemble)], md.write_quorum, written.entries)
        new = replace(md, segments=(Segment(0, tuple(ensemble)),))
        await self.cluster.store.set(written.path, encode_ledger_metadata(new))
        return new

    async def write_ledger(
        self,
        ledger_id: int,
        segments: Ensembles,
        *,
        write_quorum: int,
        ack_quorum: int | None = None,
        num_entries: int,
        state: LedgerState = LedgerState.CLOSED,
        format_version: int = 3,
        ctime: int | None = None,
        custom_metadata: Sequence[tuple[str, bytes]] = (),
    ) -> WrittenLedger:
        """Writes the entries, then the metadata (closed at the last entry, if CLOSED).

        An OPEN or IN_RECOVERY ledger's metadata carries no last entry, as in
        BookKeeper, even though its bookies hold entries.
        """
        segs = [(s.first_entry_id, s.bookies) for s in normalize_segments(segments)]
        await self.write_entries(ledger_id, segs, write_quorum, num_entries)
        closed = state is LedgerState.CLOSED
        md = make_metadata(
            ledger_id,
            segs,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            state=state,
            last_entry_id=num_entries - 1 if closed else INVALID_ENTRY_ID,
            length=num_entries * self.payload_size if closed else 0,
            format_version=format_version,
            digest_type=self.digest_type,
            password=self.password,
            ctime=ctime,
            custom_metadata=custom_metadata,
        )
        path = await self.cluster.write_ledger(md)
        return WrittenLedger(md, path, num_entries)
