"""The metadata index kept current by a persistent watch, on a real ZooKeeper."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace

from auditor.index.store import IndexWalker, MetadataIndex
from auditor.index.sync import IndexSync, invalid_ledger_znode, ledger_id_of
from auditor.logs import get_logger
from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_tree import IdRange, UnexpectedZnode
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.paths import LONG_MAX
from auditor.metadata.serde import encode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.metadata.walk import LedgerWalker
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.zkserver import ZooKeeperServer, expire_session
from auditor.zk import ZkClient

E = ["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"]
ROOT = "/ledgers"


def _md(lid: int, last: int = 9) -> LedgerMetadata:
    return make_metadata(lid, E, write_quorum=2, last_entry_id=last, length=10 * (last + 1))


async def _truth(zk: ZkClient) -> dict[int, tuple[int, LedgerMetadata | None]]:
    """What a full ZooKeeper walk sees, without custom metadata (the index keeps none)."""
    out: dict[int, tuple[int, LedgerMetadata | None]] = {}
    async for rec in LedgerWalker(zk, ROOT, LedgerManager.HIERARCHICAL).ledgers():
        md = replace(rec.metadata, custom_metadata=()) if rec.metadata is not None else None
        out[rec.ledger_id] = (rec.znode_version, md)
    return out


async def _indexed(index: MetadataIndex) -> dict[int, tuple[int, LedgerMetadata | None]]:
    return {r.ledger_id: (r.znode_version, r.metadata) for r in index.records()}


async def _until(sync: IndexSync, done: Callable[[], bool]) -> None:
    async with sync.changed:
        await asyncio.wait_for(sync.changed.wait_for(done), 20)


@asynccontextmanager
async def _running(zk: ZkClient) -> AsyncIterator[tuple[IndexSync, MetadataIndex]]:
    index = MetadataIndex(ROOT, LedgerManager.HIERARCHICAL)
    sync = IndexSync(zk, index, concurrency=16, log=get_logger(), retry_delay=0.2)
    task = asyncio.ensure_future(sync.run())
    try:
        await asyncio.wait_for(sync.ready.wait(), 20)
        yield sync, index
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_only_ledger_znodes_are_ledgers() -> None:
    h = LedgerManager.HIERARCHICAL
    assert ledger_id_of(h, ROOT, "/ledgers/00/0000/L0042") == 42
    assert ledger_id_of(h, ROOT, "/ledgers/000/0000/0030/0000/L0000") == 3_000_000_000
    assert ledger_id_of(LedgerManager.FLAT, ROOT, "/ledgers/L0000000042") == 42
    for path in (
        "/ledgers/00/0000",
        "/ledgers/available/10.0.0.1:3181",
        "/ledgers/underreplication/ledgers/0000/0000/0000/0000/urL0000000042",
        "/ledgers/underreplication/locks/urL0000000042",
        "/ledgers/LAYOUT",
        "/other/00/0000/L0042",
        "/ledgers/922/3372/0368/5477/L5808",
        "/ledgers/00/0000/L00042",
    ):
        assert ledger_id_of(h, ROOT, path) is None, path
    assert ledger_id_of(h, ROOT, "/ledgers/922/3372/0368/5477/L5807") == LONG_MAX
    # Shaped like a ledger's, and no ledger: named as the walk names it.
    assert invalid_ledger_znode(h, ROOT, "/ledgers/922/3372/0368/5477/L5808") == UnexpectedZnode(
        "/ledgers/922/3372/0368/5477/L5808", f"a ledger id is 0..{LONG_MAX}, got {2**63}", True
    )
    assert invalid_ledger_znode(LedgerManager.FLAT, ROOT, "/ledgers/L42") == UnexpectedZnode(
        "/ledgers/L42", "a ledger's name here is L and 10 digits, not 2", True
    )
    for path in ("/ledgers/00/0000/L0042", "/ledgers/available/L1", "/ledgers/LAYOUT"):
        assert invalid_ledger_znode(h, ROOT, path) is None, path


def test_ledger_keys_of_bookkeepers_etcd_driver() -> None:
    etcd = LedgerManager.ETCD
    key = "/ledgers/ledgers/00000000-0000-0000-0000-00000000002a"
    assert ledger_id_of(etcd, ROOT, key) == 42
    assert ledger_id_of(etcd, ROOT, "/ledgers/ledgers/00000000-0000-0000-7fff-ffffffffffff") == (
        LONG_MAX
    )
    for path in (
        "/ledgers/layout",
        "/ledgers/bookies/writable/b:1",
        "/ledgers/ledgers",
        key + "/x",
    ):
        assert ledger_id_of(etcd, ROOT, path) is None, path
        assert invalid_ledger_znode(etcd, ROOT, path) is None, path
    upper = "/ledgers/ledgers/00000000-0000-0000-0000-00000000002A"
    assert invalid_ledger_znode(etcd, ROOT, upper) == UnexpectedZnode(
        upper, "a ledger key's name is UUID(0, id) in lower-case hex", True
    )
    negative = "/ledgers/ledgers/00000000-0000-0000-8000-000000000000"
    found = invalid_ledger_znode(etcd, ROOT, negative)
    assert found is not None and found.invalid_ledger and found.path == negative


async def test_the_index_follows_creates_changes_and_deletes(zk: ZkClient) -> None:
    cw = ClusterWriter(zk, ROOT)
    await cw.init_cluster()
    for lid in (1, 2, 3, 20_000):
        await cw.write_ledger(_md(lid))
    await cw.write_raw(4, b"BookieMetadataFormatVersion\t3\n\x07garbage")
    async with _running(zk) as (sync, index):
        assert await _indexed(index) == await _truth(zk)
        assert sync.loads == 1
        # Changes after the load: each lands by the read its event causes.
        await cw.write_ledger(_md(5))
        await cw.write_ledger(_md(3_000_000_000))
        await zk.set(cw.path(2), encode_ledger_metadata(_md(2, last=19)))
        await zk.delete("/ledgers/00/0000/L0001")
        # Noise under the same root: marks, locks, bookie registrations.
        await UnderreplicationManager(zk, ROOT).mark_underreplicated(3, [E[0]])
        await zk.create("/ledgers/available/10.0.0.9:3181", b"", ephemeral=True)
        await _until(sync, lambda: 5 in index and 3_000_000_000 in index and 1 not in index)
        await _until(sync, lambda: (r := index.get(2)) is not None and r.znode_version == 1)
        assert await _indexed(index) == await _truth(zk)
        assert sync.events == 4  # the four ledger znodes; noise is not an event
        walked = [r.ledger_id async for r in IndexWalker(index, zk).ledgers()]
        assert walked == [2, 3, 4, 5, 20_000, 3_000_000_000]


async def test_invalid_ledger_znodes_are_named_and_the_index_goes_on(zk: ZkClient) -> None:
    cw = ClusterWriter(zk, ROOT)
    await cw.init_cluster()
    for lid in (1, LONG_MAX):
        await cw.write_ledger(_md(lid))
    beyond = "/ledgers/922/3372/0368/5477/L5808"
    await zk.create(beyond, encode_ledger_metadata(_md(5)))
    async with _running(zk) as (sync, index):
        assert sorted(r.ledger_id for r in index.records()) == [1, LONG_MAX]
        assert list(index.unexpected) == [beyond]
        walker = IndexWalker(index, zk)
        assert [r.ledger_id async for r in walker.ledgers()] == [1, LONG_MAX]
        assert [str(u) for u in walker.stats.unexpected] == [
            f"{beyond}: a ledger id is 0..{LONG_MAX}, got {2**63}"
        ]
        assert (walker.stats.unexpected_count, walker.stats.invalid_ledgers) == (1, 1)
        # Of a partitioned walk, the range that runs to the end names them.
        first = IndexWalker(index, zk, IdRange(0, 10))
        last = IndexWalker(index, zk, IdRange(10, LONG_MAX + 1))
        assert [r.ledger_id async for r in first.ledgers()] == [1]
        assert [r.ledger_id async for r in last.ledgers()] == [LONG_MAX]
        assert (first.stats.invalid_ledgers, last.stats.invalid_ledgers) == (0, 1)
        # After the load: an event names a new one, a delete forgets it; ledgers still land.
        later = "/ledgers/999/9999/9999/9999/L9999"
        await zk.create(later, b"garbage", makepath=True)
        await cw.write_ledger(_md(2))
        await _until(sync, lambda: 2 in index)
        assert list(index.unexpected) == [beyond, later]
        await zk.delete(beyond)
        await cw.write_ledger(_md(3))
        await _until(sync, lambda: 3 in index)
        assert list(index.unexpected) == [later]
        assert (index.unexpected_count, index.invalid_ledgers) == (1, 1)
        assert sync.failed is None and sync.ready.is_set()
        assert sorted(r.ledger_id for r in index.records()) == [1, 2, 3, LONG_MAX]


async def test_a_lost_session_reloads_everything_and_says_so(zk_server: ZooKeeperServer) -> None:
    async with ZkClient(zk_server.hosts, timeout=10, session_timeout=6) as zk:
        cw = ClusterWriter(zk, "/gap" + ROOT)
        await cw.init_cluster()
    async with ZkClient(f"{zk_server.hosts}/gap", timeout=10, session_timeout=6) as zk:
        cw = ClusterWriter(zk, ROOT)
        for lid in (1, 2):
            await cw.write_ledger(_md(lid))
        resyncs: list[str] = []
        index = MetadataIndex(ROOT, LedgerManager.HIERARCHICAL)
        sync = IndexSync(zk, index, log=get_logger(), on_resync=resyncs.append, retry_delay=0.2)
        task = asyncio.ensure_future(sync.run())
        try:
            await asyncio.wait_for(sync.ready.wait(), 20)
            client_id = zk.client_id
            assert client_id is not None
            # Changes while the watch is gone are seen by the reload, not by events.
            async with ZkClient(f"{zk_server.hosts}/gap", timeout=10) as other:
                writer = ClusterWriter(other, ROOT)
                await asyncio.to_thread(expire_session, zk_server.hosts, client_id)
                await writer.write_ledger(_md(3))
                await other.delete("/ledgers/00/0000/L0001")
            await _until(sync, lambda: sync.loads == 2)
            await asyncio.wait_for(sync.ready.wait(), 20)
            assert len(resyncs) == 1 and sync.resyncs == 1
            assert sorted(r.ledger_id for r in index.records()) == [2, 3]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
