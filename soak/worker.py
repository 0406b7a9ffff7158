"""The soak's stand-in for BookKeeper's replication worker.

The soak repairs what a fault broke the way BookKeeper would, so that later
checks start clean; but a repair that deletes the mark of a ledger still short
of a copy hides exactly what the auditor is there to see (and fails a later
fault's "every ledger marked" for the wrong reason). So this worker does what a
real one does and nothing more: it copies missing entries into a bookie from a
replica that serves them, and it removes a ledger's mark only once the ledger
is whole, meaning every bookie of every entry's write set answers, over the
wire, that it holds that entry. A ledger that is not whole keeps its mark; the
repair of the fault that still holds it back (or the periodic sweep) unmarks
it later. The mark of a ledger that no longer exists is removed, as a worker
does.

Each pass uses a fresh `BookieClient`, so that the connect backoff of a bookie
that was down a moment ago does not make a returned bookie look absent; within
a pass, a bookie that did not answer once is not asked again (a paused bookie
would otherwise cost a timeout per ledger while the driver's ZooKeeper lock is
held).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from auditor.bookie.client import BookieClient
from auditor.bookie.protocol import Status
from auditor.bookie.results import ErrorStatus, NoAnswer, Ok
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.schedule import write_set
from auditor.metadata.underreplication import ur_ledger_path
from auditor.testing.bookie import BookieEmulator
from soak.cluster import SoakCluster

#: Longer than the slowest answer a healthy soak bookie gives (`bookie_slow`: 0.4 s).
TIMEOUT = 2.0


def expected_entries(md: LedgerMetadata) -> dict[str, set[int]]:
    """Which entries each bookie of the ledger must hold: its write sets, segment by segment."""
    out: dict[str, set[int]] = {}
    for seg in md.segment_ranges():
        for entry in range(seg.first, seg.last + 1):
            for i in write_set(entry, md.ensemble_size, md.write_quorum):
                out.setdefault(seg.bookies[i], set()).add(entry)
    return out


@dataclass
class _Pass:
    client: BookieClient
    #: Bookies that gave no answer in this pass.
    silent: set[str] = field(default_factory=set)


class ReplicationWorker:
    def __init__(self, cluster: SoakCluster) -> None:
        self.c = cluster
        #: Over the run: entries copied into emptied bookies, marks removed, and the
        #: ledgers whose mark was kept at least once because they were not whole.
        self.copied = 0
        self.unmarked = 0
        self.kept: set[int] = set()

    def _client(self) -> BookieClient:
        addresses = {b.bookie_id: b.address for b in self.c.bookies}

        async def resolve(bookie_id: str) -> tuple[str, int] | None:
            return addresses.get(bookie_id)

        return BookieClient(
            resolve, request_timeout=TIMEOUT, connect_timeout=TIMEOUT, backoff_max=0.2
        )

    async def _whole(self, p: _Pass, md: LedgerMetadata) -> bool:
        """Every bookie of every write set answers that it holds its entries."""
        for bookie, entries in expected_entries(md).items():
            if bookie in p.silent:
                return False
            outcome = await p.client.get_list_of_entries(bookie, md.ledger_id)
            if isinstance(outcome, NoAnswer):
                p.silent.add(bookie)
            if isinstance(outcome, ErrorStatus) and outcome.status is Status.ENOLEDGER:
                return False
            if not isinstance(outcome, Ok):
                return False  # no answer proves nothing: a worker could not confirm it
            if not all(outcome.value.contains(e) for e in entries):
                return False
        return True

    async def _copy_into(self, p: _Pass, target: BookieEmulator) -> int:
        """Copies into `target`'s storage every entry it should hold and lacks, each read
        over the wire from another bookie of the entry's write set; returns how many."""
        copied = 0
        for lid in self.c.ledgers_on(target.bookie_id):
            md = self.c.ledgers[lid]
            wanted = expected_entries(md).get(target.bookie_id, set())
            for entry in sorted(e for e in wanted if not target.has_entry(lid, e)):
                for source in _holders(md, entry):
                    if source == target.bookie_id or source in p.silent:
                        continue
                    read = await p.client.read_entry(source, lid, entry)
                    if isinstance(read, NoAnswer):
                        p.silent.add(source)
                    if isinstance(read, Ok):
                        target.put_entry(lid, entry, read.value.body)
                        copied += 1
                        break
        self.copied += copied
        return copied

    async def repair(
        self, ledgers: Iterable[int], into: Sequence[BookieEmulator] = ()
    ) -> tuple[list[int], list[int]]:
        """Copies into the bookies `into` what they lack, then unmarks the marked ledgers
        among `ledgers` that are whole (or deleted). Returns (unmarked, kept marked)."""
        p = _Pass(self._client())
        try:
            for target in into:
                await self._copy_into(p, target)
            return await self._unmark_whole(p, ledgers)
        finally:
            await p.client.close()

    async def sweep(self, into: Sequence[BookieEmulator]) -> tuple[list[int], list[int]]:
        """The worker's loop: copies into `into` (bookies in no fault) what they lack, and
        looks at every marked ledger the driver knows, live or deleted."""
        return await self.repair([*self.c.ledgers, *self.c.deleted], into)

    async def _unmark_whole(self, p: _Pass, ledgers: Iterable[int]) -> tuple[list[int], list[int]]:
        base = self.c.ur_base
        unmarked: list[int] = []
        kept: list[int] = []
        for lid in sorted(set(ledgers)):
            path = ur_ledger_path(base, lid)
            if not await self.c.client.exists(path):
                continue
            md = self.c.ledgers.get(lid)
            if md is not None and not await self._whole(p, md):
                kept.append(lid)
                continue
            with contextlib.suppress(Exception):  # NoNode: removed meanwhile
                await self.c.client.delete(path)
            unmarked.append(lid)
        self.unmarked += len(unmarked)
        self.kept.update(kept)
        return unmarked, kept


def _holders(md: LedgerMetadata, entry: int) -> list[str]:
    for seg in md.segment_ranges():
        if seg.first <= entry <= seg.last:
            return [seg.bookies[i] for i in write_set(entry, md.ensemble_size, md.write_quorum)]
    return []
