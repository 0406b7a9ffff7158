"""The test writer: ledgers written through the real protocol onto emulated bookies."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from auditor.bookie.client import BookieClient
from auditor.bookie.protocol import verify_entry_body
from auditor.bookie.results import Ok
from auditor.metadata.layout import LedgerManager
from auditor.metadata.model import DigestType, LedgerState
from auditor.metadata.registry import resolve_bookie
from auditor.metadata.schedule import stores_entry, write_set
from auditor.metadata.walk import LedgerWalker
from auditor.testing.bookie import BookieEmulator
from auditor.testing.cluster import ClusterWriter
from auditor.testing.writer import LedgerWriter
from auditor.zk import ZkClient

ROOT = "/ledgers"


def test_write_set_is_round_robin() -> None:
    assert write_set(1, 5, 3) == [1, 2, 3]  # upstream testDistributionSchedule
    assert write_set(4, 5, 3) == [4, 0, 1]
    assert write_set(2**31 + 1, 3, 2) == [(2**31 + 1) % 3, (2**31 + 2) % 3]
    # Upstream getEntriesStripedToTheBookie cases for W=2, E=3, bookie 2.
    assert not stores_entry(2, 0, 3, 2)
    assert not stores_entry(2, 3, 3, 2)
    assert stores_entry(2, 4, 3, 2)
    with pytest.raises(ValueError):
        write_set(0, 2, 3)


@contextlib.asynccontextmanager
async def cluster(zk: ZkClient, n: int) -> AsyncIterator[tuple[list[BookieEmulator], LedgerWriter]]:
    cw = ClusterWriter(zk, ROOT)
    await cw.init_cluster()
    bookies = [BookieEmulator(zk, ledgers_root=ROOT) for _ in range(n)]
    for b in bookies:
        await b.start()

    async def resolve(bookie_id: str) -> tuple[str, int] | None:
        return await resolve_bookie(zk, ROOT, bookie_id)

    client = BookieClient(resolve, request_timeout=5.0)
    try:
        yield bookies, LedgerWriter(cw, client, password=b"secret")
    finally:
        await client.close()
        for b in bookies:
            await b.stop()


async def test_closed_ledger_with_an_ensemble_change(zk: ZkClient) -> None:
    async with cluster(zk, 4) as (bk, writer):
        ids = [b.bookie_id for b in bk]
        seg0 = [ids[0], ids[1], ids[2]]
        seg1 = [ids[0], ids[3], ids[2]]  # bookie 1 replaced by bookie 3 at entry 10
        written = await writer.write_ledger(
            7, [(0, seg0), (10, seg1)], write_quorum=2, ack_quorum=2, num_entries=25
        )
        md = written.metadata
        assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 24, 25 * 16)
        # Each bookie holds exactly the entries its index in each segment dictates.
        for b in bk:
            expected = {
                e
                for first, last, seg in ((0, 9, seg0), (10, 24, seg1))
                for e in range(first, last + 1)
                if b.bookie_id in seg and stores_entry(seg.index(b.bookie_id), e, 3, 2)
            }
            avail = b.availability(7)
            held = set(avail.entries()) if avail is not None else set()
            assert held == expected, b.bookie_id
        assert bk[1].availability(7) is not None and max(bk[1].availability(7).entries()) == 9  # type: ignore[union-attr]
        # What the bookie says over the wire matches, and bodies carry valid digests.
        listed = await writer.client.get_list_of_entries(ids[3], 7)
        assert isinstance(listed, Ok)
        assert set(listed.value.entries()) == set(bk[3].availability(7).entries())  # type: ignore[union-attr]
        read = await writer.client.read_entry(ids[0], 7, 0)
        assert isinstance(read, Ok)
        entry = verify_entry_body(read.value.body, DigestType.CRC32C, b"secret")
        assert (entry.ledger_id, entry.entry_id, entry.payload) == (7, 0, writer.payload(7, 0))
        # And the metadata reads back as written.
        recs = [r async for r in LedgerWalker(zk, ROOT, LedgerManager.HIERARCHICAL).ledgers()]
        assert len(recs) == 1 and recs[0].metadata is not None
        _, stat = await zk.get(written.path)
        # No stored ctime: the znode's creation time stands in, as in BookKeeper.
        assert recs[0].metadata == replace(md, ctime=int(stat.ctime))


@pytest.mark.parametrize(
    ("state", "version"),
    [(LedgerState.OPEN, 1), (LedgerState.IN_RECOVERY, 2), (LedgerState.CLOSED, 3)],
)
async def test_states_and_formats(zk: ZkClient, state: LedgerState, version: int) -> None:
    async with cluster(zk, 3) as (bk, writer):
        ids = [b.bookie_id for b in bk]
        written = await writer.write_ledger(
            3, ids, write_quorum=3, num_entries=5, state=state, format_version=version
        )
        md = written.metadata
        assert md.state is state and md.format_version == version
        assert md.last_entry_id == (4 if state is LedgerState.CLOSED else -1)
        for b in bk:  # W == E: every bookie has every entry, whatever the metadata says
            assert set(b.availability(3).entries()) == {0, 1, 2, 3, 4}  # type: ignore[union-attr]
        data, _ = await zk.get(written.path)
        assert data.startswith(f"BookieMetadataFormatVersion\t{version}\n".encode())


async def test_refused_add_is_an_error(zk: ZkClient) -> None:
    from auditor.testing.writer import WriteFailedError

    async with cluster(zk, 2) as (bk, writer):
        await bk[1].set_readonly(True)
        with pytest.raises(WriteFailedError, match="did not store entry"):
            await writer.write_ledger(9, [b.bookie_id for b in bk], write_quorum=2, num_entries=3)
        # Nothing half-written into the metadata.
        assert await zk.exists(writer.cluster.path(9)) is None
