"""What-if and risk take any `ClusterView` and sit below the scan layer, so the view read
from a snapshot lives here, with the snapshot code; only the CLI chooses a snapshot's.

A snapshot as what-if and risk see a live cluster: a `ClusterView` read from Parquet.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

from auditor.analysis.whatif_run import ClusterView
from auditor.metadata.registry import address_from_id
from auditor.metadata.walk import LedgerRecord
from auditor.scan.engine import EngineOptions, require
from auditor.scan.snapshot import LEDGERS, SnapshotCluster, record_from_row

#: Snapshot rows decoded per batch (memory stays flat however many ledgers).
BATCH = 65536


async def _snapshot_records(directory: Path) -> AsyncIterator[LedgerRecord]:
    import pyarrow.dataset as ds

    dataset = ds.dataset(str(directory / LEDGERS), format="parquet")
    for batch in dataset.to_batches(batch_size=BATCH):
        rows = batch.to_pylist()
        for rec in sorted((record_from_row(r) for r in rows), key=lambda r: r.ledger_id):
            yield rec


@asynccontextmanager
async def snapshot_view(directory: Path) -> AsyncIterator[ClusterView]:
    """A snapshot written by `bk-auditor snapshot`: its registry, cookies and locations."""
    require(EngineOptions("asyncio"), parquet=True)
    cluster = SnapshotCluster.load(directory)
    locations = dict(cluster.locations)

    async def locate(bookies: Iterable[str]) -> dict[str, str]:
        return {b: locations[b] for b in bookies if b in locations}

    async def address_of(bookie: str) -> tuple[str, int] | None:
        return address_from_id(bookie)

    yield ClusterView(
        source=f"snapshot:{directory}",
        available=frozenset(cluster.writable) | frozenset(cluster.readonly),
        known=frozenset(cluster.known),
        locate=locate,
        address_of=address_of,
        records=lambda: _snapshot_records(directory),
    )
