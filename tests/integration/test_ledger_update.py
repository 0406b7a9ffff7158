"""Versioned ledger metadata updates on a real ZooKeeper and a real etcd: exact bytes,
concurrent writers, deleted ledgers, lost locks; and the recovery transforms."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from auditor.etcd import EtcdStore
from auditor.metadata.ledger_update import (
    ConcurrentUpdateError,
    EnsembleConflictError,
    LedgerDeletedError,
    LedgerUpdateError,
    UpdateResult,
    begin_recovery,
    close_ledger,
    replace_bookies,
    update_ledger,
)
from auditor.metadata.model import LedgerMetadata, LedgerState, Segment
from auditor.metadata.replication import ReplicationQueue, TakenLedger
from auditor.metadata.serde import (
    LedgerMetadataFormatError,
    decode_ledger_metadata,
    encode_ledger_metadata,
)
from auditor.metadata.textformat import EscapeStyle
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.store import FencedOutError, MetadataStore
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.zkserver import expire_session
from auditor.zk import ZkClient

T = TypeVar("T")
ROOT = "/ledgers"
LID = 4242
A, B, C, D, E, X = (f"10.0.0.{n}:3181" for n in (1, 2, 3, 4, 5, 9))
CTIME = 1700000000000


class Interloper:
    """Another process writing the same ledger: its own thread, event loop and session, so
    that a transform (synchronous, between our read and our write) can make it write."""

    def __init__(self, connect: Callable[[], MetadataStore]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.zk = self.run(self._connect(connect))

    @staticmethod
    async def _connect(connect: Callable[[], MetadataStore]) -> MetadataStore:
        client = connect()
        await client.start()
        return client

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(15)

    def rewrite(self, path: str, change: Any) -> None:
        """Read-modify-write of the ledger's metadata, as its writer does it."""

        async def go() -> None:
            data, stat = await self.zk.get(path)
            md = decode_ledger_metadata(data, LID, int(stat.ctime))
            await self.zk.set(path, encode_ledger_metadata(change(md)), int(stat.version))

        self.run(go())

    def close(self) -> None:
        self.run(self.zk.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def interloper(request: pytest.FixtureRequest, store: MetadataStore) -> Iterator[Interloper]:
    # `store` first: it creates the chroot (ZooKeeper); the interloper's session is on the
    # same store, rooted where `store` is (the chroot, or the etcd key prefix).
    if isinstance(store, EtcdStore):
        endpoint = request.getfixturevalue("etcd_server").endpoint
        prefix = store.prefix
        other = Interloper(lambda: EtcdStore([endpoint], prefix=prefix, timeout=10.0))
    else:
        hosts = request.getfixturevalue("zk_hosts")
        other = Interloper(lambda: ZkClient(hosts, timeout=10.0))
    try:
        yield other
    finally:
        other.close()


@pytest.fixture
async def cluster(store: MetadataStore) -> ClusterWriter:
    cw = ClusterWriter(store, ROOT)
    await cw.init_cluster()
    return cw


@pytest.fixture
async def queue(store: MetadataStore) -> AsyncIterator[ReplicationQueue]:
    q = ReplicationQueue(store, ROOT, "worker")
    try:
        yield q
    finally:
        await q.close()


async def _lock(store: MetadataStore, queue: ReplicationQueue) -> TakenLedger:
    await UnderreplicationManager(store, ROOT).mark_underreplicated(LID, [B], now_ms=CTIME)
    taken = await queue.take()
    assert taken is not None and taken.ledger_id == LID
    return taken


async def _stored(store: MetadataStore, path: str) -> tuple[bytes, LedgerMetadata, int]:
    data, stat = await store.get(path)
    return data, decode_ledger_metadata(data, LID, int(stat.ctime)), int(stat.version)


def _two_segments(format_version: int, state: LedgerState = LedgerState.CLOSED) -> LedgerMetadata:
    return make_metadata(
        LID,
        [(0, [A, B, C]), (10, [A, B, D])],
        write_quorum=2,
        ack_quorum=2,
        state=state,
        last_entry_id=19,
        length=20480,
        format_version=format_version,
        password=b"pw\x07\x0b\x00\xff",
        ctime=CTIME,
        custom_metadata=[("application", b"shop"), ("raw", b"\x00\x01")],
    )


def _with_segment(md: LedgerMetadata, k: int, bookies: tuple[str, ...]) -> LedgerMetadata:
    segments = list(md.segments)
    segments[k] = Segment(segments[k].first_entry_id, bookies)
    return dataclasses.replace(md, segments=tuple(segments))


# --- replace_bookies, written -------------------------------------------------------


@pytest.mark.parametrize("format_version", [1, 2, 3])
async def test_replace_bookies_writes_exactly_that_ensemble_in_the_ledgers_own_format(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue, format_version: int
) -> None:
    path = await cluster.write_ledger(_two_segments(format_version))
    before, original, _ = await _stored(store, path)
    taken = await _lock(store, queue)
    result = await update_ledger(
        queue.fenced(taken), store, path, LID, replace_bookies(10, {B: E, X: D})
    )
    # Only segment 10, only B's position; X is in no ensemble and D stays.
    expected = _with_segment(original, 1, (A, E, D))
    assert result == UpdateResult(True, expected, 1)
    data, stored, version = await _stored(store, path)
    assert (stored, version) == (expected, 1)
    assert data == encode_ledger_metadata(expected)
    assert data.startswith(f"BookieMetadataFormatVersion\t{format_version}\n".encode())
    # Everything but the ensemble is byte-for-byte what was there.
    assert data.replace(E.encode(), B.encode()) == before
    assert stored.segments[0] == original.segments[0]


async def test_a_v2_ledger_keeps_the_escaping_of_the_java_that_wrote_it(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue
) -> None:
    md = _two_segments(2)
    older_java = encode_ledger_metadata(md, text_style=EscapeStyle.PROTOBUF_JAVA)
    assert older_java != encode_ledger_metadata(md, text_style=EscapeStyle.LIGHTPROTO)
    path = await cluster.write_raw(LID, older_java)
    _, original, _ = await _stored(store, path)
    taken = await _lock(store, queue)
    await update_ledger(queue.fenced(taken), store, path, LID, replace_bookies(0, {B: E}))
    data, _, _ = await _stored(store, path)
    expected = _with_segment(original, 0, (A, E, C))
    assert data == encode_ledger_metadata(expected, text_style=EscapeStyle.PROTOBUF_JAVA)


async def test_nothing_to_replace_writes_nothing(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue
) -> None:
    path = await cluster.write_ledger(_two_segments(3))
    before, original, _ = await _stored(store, path)
    taken = await _lock(store, queue)
    fenced = queue.fenced(taken)
    # Already replaced (no old bookie left), and a segment key that is not there.
    for transform in (replace_bookies(10, {X: E}), replace_bookies(5, {B: E})):
        assert await update_ledger(fenced, store, path, LID, transform) == UpdateResult(
            False, original, 0
        )
    assert await _stored(store, path) == (before, original, 0)


async def test_a_replacement_already_in_the_ensemble_is_a_conflict(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue
) -> None:
    path = await cluster.write_ledger(_two_segments(3))
    before, original, _ = await _stored(store, path)
    taken = await _lock(store, queue)
    with pytest.raises(EnsembleConflictError, match=r"10\.0\.0\.3:3181 twice"):
        await update_ledger(queue.fenced(taken), store, path, LID, replace_bookies(0, {B: C}))
    assert await _stored(store, path) == (before, original, 0)


# --- concurrent writers, deleted ledgers, lost locks ------------------------------------


async def test_a_writers_ensemble_change_between_read_and_write_is_kept(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue, interloper: Interloper
) -> None:
    md = make_metadata(LID, [A, B, C], write_quorum=2, state=LedgerState.OPEN, ctime=CTIME)
    path = await cluster.write_ledger(md)
    _, original, _ = await _stored(store, path)
    taken = await _lock(store, queue)
    seen: list[LedgerMetadata] = []
    ours = replace_bookies(0, {B: E})

    def writer_adds_a_segment(m: LedgerMetadata) -> LedgerMetadata:
        return dataclasses.replace(m, segments=(*m.segments, Segment(5, (A, X, C))))

    def racing(m: LedgerMetadata) -> LedgerMetadata | None:
        seen.append(m)
        if len(seen) == 1:  # after our read, before our write
            interloper.rewrite(path, writer_adds_a_segment)
        return ours(m)

    result = await update_ledger(queue.fenced(taken), store, path, LID, racing)
    assert seen == [original, writer_adds_a_segment(original)]
    expected = dataclasses.replace(
        original, segments=(Segment(0, (A, E, C)), Segment(5, (A, X, C)))
    )
    assert result == UpdateResult(True, expected, 2)
    data, stored, version = await _stored(store, path)
    assert (stored, version) == (expected, 2)
    assert data == encode_ledger_metadata(expected)


async def test_others_writing_every_time_exhaust_the_attempts(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue, interloper: Interloper
) -> None:
    path = await cluster.write_ledger(_two_segments(3))
    taken = await _lock(store, queue)
    calls = 0

    def contended(m: LedgerMetadata) -> LedgerMetadata | None:
        nonlocal calls
        calls += 1
        interloper.rewrite(path, lambda same: same)  # a write that bumps the version
        return replace_bookies(0, {B: E})(m)

    with pytest.raises(ConcurrentUpdateError, match="3 attempts"):
        await update_ledger(queue.fenced(taken), store, path, LID, contended, attempts=3)
    assert calls == 3
    _, stored, version = await _stored(store, path)
    assert stored.segments[0].bookies == (A, B, C)
    assert version == 3


async def test_a_deleted_ledger(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue, interloper: Interloper
) -> None:
    path = await cluster.write_ledger(_two_segments(3))
    taken = await _lock(store, queue)
    fenced = queue.fenced(taken)

    def deleted_meanwhile(m: LedgerMetadata) -> LedgerMetadata | None:
        interloper.run(interloper.zk.delete(path))
        return replace_bookies(0, {B: E})(m)

    with pytest.raises(LedgerDeletedError, match=f"ledger {LID} was deleted"):
        await update_ledger(fenced, store, path, LID, deleted_meanwhile)
    assert await store.exists(path) is None
    with pytest.raises(LedgerDeletedError) as info:
        await update_ledger(fenced, store, path, LID, replace_bookies(0, {B: E}))
    assert (info.value.ledger_id, info.value.path) == (LID, path)


async def test_a_lost_lock_refuses_the_write(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue, interloper: Interloper
) -> None:
    path = await cluster.write_ledger(_two_segments(3))
    before, original, _ = await _stored(store, path)
    taken = await _lock(store, queue)
    fenced = queue.fenced(taken)
    interloper.run(interloper.zk.delete(taken.lock_path))
    with pytest.raises(FencedOutError):
        await update_ledger(fenced, store, path, LID, replace_bookies(0, {B: E}))
    assert await _stored(store, path) == (before, original, 0)


async def test_a_session_replaced_between_the_read_and_the_write_writes_nothing(
    zk: ZkClient, zk_hosts: str
) -> None:
    """The worker's commit looks at its lock's session once more right before writing.

    Between the commit's read and its write our event loop stalls (a long pause; the
    transform runs between the two and stands for it), and meanwhile, on ZooKeeper's
    side, our session ends (its lock goes with it), kazoo makes a new one, and another
    worker takes the ledger: its lock is at version 0, as ours was, so the lock's
    version check inside the write would pass. The session, looked at again just
    before the write, is no longer the one that took the lock: nothing is written.
    (Looked at only before the read, as the commit did, the write went through.)
    """
    cluster = ClusterWriter(zk, ROOT)
    await cluster.init_cluster()
    path = await cluster.write_ledger(_two_segments(3))
    before, original, _ = await _stored(zk, path)
    queue = ReplicationQueue(zk, ROOT, "worker")
    other = Interloper(lambda: ZkClient(zk_hosts, timeout=10.0))
    try:
        taken = await _lock(zk, queue)
        ours, cid = zk.session, zk.client_id
        assert taken.lock_version == 0 and cid is not None

        def session_replaced(m: LedgerMetadata) -> LedgerMetadata | None:
            expire_session(zk_hosts, cid)
            # The loop is stalled on purpose, so nothing can be awaited here: kazoo's
            # own thread makes the new session, which is looked for until it is there.
            deadline = time.monotonic() + 30
            while zk.session in (None, ours):
                assert time.monotonic() < deadline, "no new session"
                time.sleep(0.02)
            other.run(other.zk.create(taken.lock_path, b'bookieId: "other"\n', ephemeral=True))
            return replace_bookies(0, {B: E})(m)

        with pytest.raises(FencedOutError, match=taken.lock_path):
            await update_ledger(
                queue.fenced(taken),
                zk,
                path,
                LID,
                session_replaced,
                before_write=lambda: queue.fenced(taken),
            )
        assert await _stored(zk, path) == (before, original, 0)
        stat = await zk.exists(taken.lock_path)
        assert stat is not None
        assert (stat.version, stat.ephemeralOwner) == (0, other.zk.session)
    finally:
        await queue.close()
        other.close()


async def test_corrupt_metadata_names_its_znode(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue
) -> None:
    path = await cluster.write_raw(LID, b"BookieMetadataFormatVersion\t3\n\xff\xff")
    taken = await _lock(store, queue)
    with pytest.raises(LedgerMetadataFormatError, match=path):
        await update_ledger(queue.fenced(taken), store, path, LID, replace_bookies(0, {B: E}))


async def test_recovery_begins_and_closes_with_exact_bytes(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue
) -> None:
    md = make_metadata(LID, [A, B, C], write_quorum=2, state=LedgerState.OPEN, ctime=CTIME)
    path = await cluster.write_ledger(md)
    _, original, _ = await _stored(store, path)
    taken = await _lock(store, queue)
    fenced = queue.fenced(taken)
    started = await update_ledger(fenced, store, path, LID, begin_recovery())
    in_recovery = dataclasses.replace(original, state=LedgerState.IN_RECOVERY)
    assert started == UpdateResult(True, in_recovery, 1)
    closed = await update_ledger(fenced, store, path, LID, close_ledger(41, 4200))
    expected = dataclasses.replace(
        original, state=LedgerState.CLOSED, last_entry_id=41, length=4200
    )
    assert closed == UpdateResult(True, expected, 2)
    data, stored, _ = await _stored(store, path)
    assert stored == expected
    assert data == encode_ledger_metadata(expected)


# --- the transforms alone -------------------------------------------------------------


def test_close_ledger_closes_only_a_ledger_in_recovery() -> None:
    recovering = make_metadata(LID, [A, B, C], state=LedgerState.IN_RECOVERY, ctoken=7)
    closed = close_ledger(99, 12345)(recovering)
    assert closed == dataclasses.replace(
        recovering, state=LedgerState.CLOSED, last_entry_id=99, length=12345
    )
    assert close_ledger(-1, 0)(recovering) == dataclasses.replace(
        recovering, state=LedgerState.CLOSED, last_entry_id=-1, length=0
    )
    # Closed by someone else: theirs stands. Still open: recovery never began.
    assert close_ledger(5, 10)(closed) is None
    assert close_ledger(5, 10)(dataclasses.replace(recovering, state=LedgerState.OPEN)) is None
    for last, length in ((-2, 0), (5, -1), (-1, 10)):
        with pytest.raises(LedgerUpdateError):
            close_ledger(last, length)


def test_begin_recovery_only_from_open() -> None:
    md = make_metadata(LID, [A, B, C], state=LedgerState.OPEN, ctoken=7)
    assert begin_recovery()(md) == dataclasses.replace(md, state=LedgerState.IN_RECOVERY)
    for state in (LedgerState.IN_RECOVERY, LedgerState.CLOSED):
        assert begin_recovery()(dataclasses.replace(md, state=state)) is None


def test_replace_bookies_touches_one_segment_at_its_positions() -> None:
    md = make_metadata(LID, [(0, [A, B, C]), (10, [B, A, C]), (20, [C, B, A])], ctoken=7)
    assert replace_bookies(10, {A: D, B: E})(md) == dataclasses.replace(
        md, segments=(Segment(0, (A, B, C)), Segment(10, (E, D, C)), Segment(20, (C, B, A)))
    )
    # Some old bookies already replaced: the rest still are.
    partly = _with_segment(md, 1, (E, A, C))
    assert replace_bookies(10, {A: D, B: E})(partly) == _with_segment(md, 1, (E, D, C))
    assert replace_bookies(10, {X: D})(md) is None
    assert replace_bookies(11, {A: D})(md) is None


# --- a write tried from what the caller read (`known`) ----------------------------------


async def test_a_write_from_known_bytes_needs_no_read_and_writes_the_same(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue
) -> None:
    path = await cluster.write_ledger(_two_segments(3))
    taken = await _lock(store, queue)
    data, stat = await store.get(path)
    seen: list[LedgerMetadata] = []
    ours = replace_bookies(10, {B: E})

    def counted(m: LedgerMetadata) -> LedgerMetadata | None:
        seen.append(m)
        return ours(m)

    result = await update_ledger(queue.fenced(taken), store, path, LID, counted, known=(data, stat))
    original = decode_ledger_metadata(data, LID, int(stat.ctime))
    expected = _with_segment(original, 1, (A, E, D))
    assert seen == [original]  # one transform: no read after the known one
    assert result == UpdateResult(True, expected, 1)
    assert await _stored(store, path) == (encode_ledger_metadata(expected), expected, 1)


async def test_known_bytes_moved_since_fall_back_to_a_fresh_read(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue, interloper: Interloper
) -> None:
    md = make_metadata(LID, [A, B, C], write_quorum=2, state=LedgerState.OPEN, ctime=CTIME)
    path = await cluster.write_ledger(md)
    taken = await _lock(store, queue)
    known = await store.get(path)
    _, original, _ = await _stored(store, path)

    def writer_adds_a_segment(m: LedgerMetadata) -> LedgerMetadata:
        return dataclasses.replace(m, segments=(*m.segments, Segment(5, (A, X, C))))

    interloper.rewrite(path, writer_adds_a_segment)  # after our read, before our write
    result = await update_ledger(
        queue.fenced(taken), store, path, LID, replace_bookies(0, {B: E}), known=known
    )
    expected = dataclasses.replace(
        original, segments=(Segment(0, (A, E, C)), Segment(5, (A, X, C)))
    )
    assert result == UpdateResult(True, expected, 2)  # the writer's segment kept
    assert await _stored(store, path) == (encode_ledger_metadata(expected), expected, 2)


async def test_known_bytes_deciding_nothing_are_judged_again_on_a_fresh_read(
    store: MetadataStore, cluster: ClusterWriter, queue: ReplicationQueue, interloper: Interloper
) -> None:
    """Known bytes in which the bookie is already replaced (or would conflict) decide
    nothing: the stored metadata may say otherwise, and it is what is judged."""
    path = await cluster.write_ledger(_two_segments(3))
    taken = await _lock(store, queue)
    _, original, _ = await _stored(store, path)
    stale = _with_segment(original, 1, (A, E, D))  # as if B were replaced already
    stat = (await store.get(path))[1]
    result = await update_ledger(
        queue.fenced(taken),
        store,
        path,
        LID,
        replace_bookies(10, {B: E}),
        known=(encode_ledger_metadata(stale), stat),
    )
    assert result == UpdateResult(True, _with_segment(original, 1, (A, E, D)), 1)
    with pytest.raises(EnsembleConflictError):
        await update_ledger(
            queue.fenced(taken),
            store,
            path,
            LID,
            replace_bookies(10, {A: E}),
            known=(encode_ledger_metadata(original), stat),  # now stale: E is there
        )
