"""The replication worker's queue on a real ZooKeeper: taking, waiting, unmarking, releasing,
and the order it takes marks in (`RiskOrder`: the ranking cached, refreshed from the watch)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import pytest

from auditor.logs import get_logger
from auditor.metadata.replication import (
    POLL_WITHOUT_WATCH,
    RateLimiter,
    ReplicationQueue,
    TakenLedger,
)
from auditor.metadata.underreplication import (
    MarkOutcome,
    UnderreplicationManager,
    ur_ledger_path,
    ur_lock_path,
)
from auditor.store import StoreUnavailableError
from auditor.testing.harness import test_cluster
from auditor.testing.netproxy import TcpProxy
from auditor.testing.zkserver import expire_session
from auditor.worker.risk import Risk
from auditor.worker.risk_run import REGISTRY_REFRESH, RiskOrder
from auditor.zk import FencedOutError, SessionState, ZkClient, ZkUnavailableError

ROOT = "/ledgers"
BASE = f"{ROOT}/underreplication"
LEDGERS = f"{BASE}/ledgers"
LOCKS = f"{BASE}/locks"
CTIME = 1700000000000


async def _layout(zk: ZkClient) -> UnderreplicationManager:
    urm = UnderreplicationManager(zk, ROOT)
    await urm.check_layout()
    return urm


async def _tree(zk: ZkClient, path: str) -> set[str]:
    """Every znode below `path` (not `path` itself)."""
    found: set[str] = set()
    for child in await zk.get_children(path):
        found.add(f"{path}/{child}")
        found |= await _tree(zk, f"{path}/{child}")
    return found


def _spread_ids(count: int, seed: int) -> list[int]:
    """Ledger ids spread over every hex level, some sharing directories."""
    rng = random.Random(seed)
    ids: set[int] = set()
    while len(ids) < count:
        kind = rng.randrange(3)
        if kind == 0:
            ids.add(rng.randrange(0, 2**63))
        elif kind == 1:
            ids.add(rng.randrange(0, 2**20))
        else:
            ids.add(0x0000_0007_0000_0000 + rng.randrange(0, 8))
    return sorted(ids)


@pytest.fixture
async def other(zk_hosts: str) -> AsyncIterator[ZkClient]:
    client = ZkClient(zk_hosts, timeout=10.0, session_timeout=10.0)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def _take_all(queue: ReplicationQueue) -> list[TakenLedger]:
    taken: list[TakenLedger] = []
    while (t := await queue.take()) is not None:
        taken.append(t)
    return taken


# --- taking -----------------------------------------------------------------------


async def test_two_workers_racing_take_each_ledger_exactly_once(
    zk: ZkClient, other: ZkClient
) -> None:
    urm = await _layout(zk)
    ids = _spread_ids(200, seed=16)
    for lid in ids:
        await urm.mark_underreplicated(lid, [f"bookie-{lid % 5}:3181"], now_ms=CTIME)
    a = ReplicationQueue(zk, ROOT, "worker-a", rng=random.Random(1))
    b = ReplicationQueue(other, ROOT, "worker-b", rng=random.Random(2))
    try:
        # Two takers in each worker, all four at once.
        results = await asyncio.gather(_take_all(a), _take_all(a), _take_all(b), _take_all(b))
        by_a = [t for r in results[:2] for t in r]
        by_b = [t for r in results[2:] for t in r]
        taken_ids = [t.ledger_id for t in by_a + by_b]
        assert sorted(taken_ids) == ids  # each exactly once
        assert by_a and by_b  # both took some
        for t in by_a + by_b:
            assert t.mark_path == ur_ledger_path(BASE, t.ledger_id)
            assert t.lock_path == ur_lock_path(BASE, t.ledger_id)
            assert t.mark_version == 0
            assert t.lock_version == 0
            assert t.missing_replicas == (f"bookie-{t.ledger_id % 5}:3181",)
        assert sorted(await zk.get_children(LOCKS)) == sorted(f"urL{lid:010d}" for lid in ids)
        for queue, client, holder, mine in (
            (a, zk, "worker-a", by_a),
            (b, other, "worker-b", by_b),
        ):
            assert sorted(queue.held(), key=lambda t: t.ledger_id) == sorted(
                mine, key=lambda t: t.ledger_id
            )
            cid = client.client_id
            assert cid is not None
            for t in mine:
                data, stat = await zk.get(t.lock_path)
                assert data == f'bookieId: "{holder}"\n'.encode()
                assert stat.ephemeralOwner == cid[0]
        assert await a.take() is None
        assert await b.take() is None
    finally:
        await a.close()
        await b.close()
    # close released every lock; the marks stay.
    assert await zk.get_children(LOCKS) == []
    assert len((await urm.read_marks()).marks) == 200


async def test_a_java_lock_of_another_process_is_skipped_until_it_goes(
    zk: ZkClient, zk_hosts: str
) -> None:
    urm = await _layout(zk)
    await urm.mark_underreplicated(7, ["10.0.0.1:3181"], now_ms=CTIME)
    await urm.mark_underreplicated(8, ["10.0.0.1:3181"], now_ms=CTIME)
    java = ZkClient(zk_hosts, timeout=10.0, session_timeout=10.0)
    await java.start()
    # What Java's worker writes: LockDataFormat with its host name, ephemeral.
    await java.create(ur_lock_path(BASE, 7), b'bookieId: "host"\n', ephemeral=True)
    queue = ReplicationQueue(zk, ROOT, "py-worker")
    try:
        first = await queue.take()
        assert first is not None and first.ledger_id == 8
        assert await queue.take() is None
        woken = await queue.changed()
        assert not woken.is_set()
        data, _ = await zk.get(ur_lock_path(BASE, 7))
        assert data == b'bookieId: "host"\n'  # untouched
        await java.close()  # the Java process ends: its lock goes with its session
        await asyncio.wait_for(woken.wait(), 10)
        second = await queue.take()
        assert second is not None and second.ledger_id == 7
        data, _ = await zk.get(ur_lock_path(BASE, 7))
        assert data == b'bookieId: "py-worker"\n'
    finally:
        await queue.close()
        await java.close()


async def test_corrupt_marks_are_never_locked(zk: ZkClient) -> None:
    await _layout(zk)
    corrupt = [
        f"{LEDGERS}/0000/0000/0000/002a/urL42",  # not urL%010d
        f"{LEDGERS}/0000/0000/0000/0001/urL0000000002",  # ledger 2's mark, misplaced
        f"{LEDGERS}/7fff/ffff/ffff/ffff/urL9223372036854775808",  # 2^63: no ledger id
        f"{LEDGERS}/zzzz/0000/0000/0005/urL0000000005",  # under a non-hex directory
        f"{LEDGERS}/0000/0000/0000/0006/0006/urL0000000006",  # one level too deep
        f"{LEDGERS}/0000/0000/0000/0003/junk",
    ]
    for path in corrupt:
        await zk.create(path, b'replica: "10.0.0.1:3181"\n', makepath=True)
    # In its place, but its data is not TextFormat: taken, with no replicas known.
    garbage = ur_ledger_path(BASE, 9)
    await zk.create(garbage, b"\xff\x00not a mark", makepath=True)
    queue = ReplicationQueue(zk, ROOT, "w")
    try:
        taken = await queue.take()
        assert taken == TakenLedger(9, garbage, 0, ur_lock_path(BASE, 9), 0, ())
        assert await queue.take() is None
        assert await zk.get_children(LOCKS) == ["urL0000000009"]
    finally:
        await queue.close()


async def test_the_rate_limit_spaces_takes(zk: ZkClient) -> None:
    urm = await _layout(zk)
    for lid in range(1, 7):
        await urm.mark_underreplicated(lid, ["b:3181"], now_ms=CTIME)
    queue = ReplicationQueue(zk, ROOT, "w", rate_limit=10.0)
    try:
        started = time.monotonic()
        taken = [await queue.take() for _ in range(6)]
        elapsed = time.monotonic() - started
        assert sorted(t.ledger_id for t in taken if t is not None) == [1, 2, 3, 4, 5, 6]
        # The first take is free, each of the next five waits 1/10 s.
        assert elapsed >= 0.5 - 0.01
    finally:
        await queue.close()


def test_rate_limiter_is_guava_smooth_bursty() -> None:
    now = [100.0]
    limiter = RateLimiter(2.0, clock=lambda: now[0])
    assert [limiter.reserve() for _ in range(3)] == [0.0, 0.5, 1.0]
    now[0] = 110.0  # idle: at most one second of permits (2) is stored
    assert [limiter.reserve() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]
    off = RateLimiter(0.0, clock=lambda: now[0])
    assert [off.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]


async def test_changed_fires_on_a_new_mark_and_not_on_other_changes(
    zk: ZkClient, other: ZkClient
) -> None:
    await _layout(zk)
    queue = ReplicationQueue(zk, ROOT, "w")
    try:
        assert await queue.take() is None
        woken = await queue.changed()
        # Nothing a walk could find: a check ctime and a lock of a ledger nobody marked.
        await other.create(f"{BASE}/replicascheckctime", b"\x08\x01")
        await other.create(ur_lock_path(BASE, 99), b'bookieId: "x"\n', ephemeral=True)
        await other.sync(BASE)
        await zk.sync(BASE)
        assert not woken.is_set()
        await UnderreplicationManager(other, ROOT).mark_underreplicated(5, ["b:3181"])
        await asyncio.wait_for(woken.wait(), 10)
        taken = await queue.take()
        assert taken is not None and taken.ledger_id == 5
    finally:
        await queue.close()


async def test_a_change_between_the_walk_and_changed_is_not_lost(
    zk: ZkClient, other: ZkClient
) -> None:
    await _layout(zk)
    queue = ReplicationQueue(zk, ROOT, "w")
    try:
        assert await queue.take() is None
        await UnderreplicationManager(other, ROOT).mark_underreplicated(5, ["b:3181"])
        await other.sync(BASE)
        await zk.sync(BASE)
        woken = await queue.changed()
        await asyncio.wait_for(woken.wait(), 10)
        taken = await queue.take()
        assert taken is not None and taken.ledger_id == 5
    finally:
        await queue.close()


async def test_wait_enabled_blocks_while_disabled(zk: ZkClient, other: ZkClient) -> None:
    urm = await _layout(zk)
    queue = ReplicationQueue(zk, ROOT, "w")
    await asyncio.wait_for(queue.wait_enabled(), 5)  # absent: at once
    await urm.disable_replication()
    waiting = asyncio.ensure_future(queue.wait_enabled())
    try:
        done, _ = await asyncio.wait({waiting}, timeout=0.5)
        assert not done
        await other.set(f"{BASE}/disable", b"still disabled")  # a change, not a delete
        done, _ = await asyncio.wait({waiting}, timeout=0.5)
        assert not done
        await UnderreplicationManager(other, ROOT).enable_replication()
        await asyncio.wait_for(waiting, 10)
    finally:
        waiting.cancel()
        await queue.close()


# --- unmarking and releasing -------------------------------------------------------


async def _take_ids(queue: ReplicationQueue, count: int) -> dict[int, TakenLedger]:
    taken: dict[int, TakenLedger] = {}
    for _ in range(count):
        t = await queue.take()
        assert t is not None
        taken[t.ledger_id] = t
    return taken


async def test_unmarking_deletes_the_mark_and_exactly_the_empty_parents(zk: ZkClient) -> None:
    urm = await _layout(zk)
    a, b, c = 0x0001_0002_0003_0004, 0x0000_0000_0005_0001, 0x0000_0000_0005_0002
    for lid in (a, b, c):
        await urm.mark_underreplicated(lid, ["b:3181"], now_ms=CTIME)
    queue = ReplicationQueue(zk, ROOT, "w")
    try:
        taken = await _take_ids(queue, 3)
        assert await queue.mark_replicated(taken[a]) is True
        assert await _tree(zk, LEDGERS) == {
            f"{LEDGERS}/0000",
            f"{LEDGERS}/0000/0000",
            f"{LEDGERS}/0000/0000/0005",
            f"{LEDGERS}/0000/0000/0005/0001",
            f"{LEDGERS}/0000/0000/0005/0001/urL{b:010d}",
            f"{LEDGERS}/0000/0000/0005/0002",
            f"{LEDGERS}/0000/0000/0005/0002/urL{c:010d}",
        }
        assert sorted(await zk.get_children(LOCKS)) == [f"urL{b:010d}", f"urL{c:010d}"]
        assert await queue.mark_replicated(taken[b]) is True
        assert await _tree(zk, LEDGERS) == {
            f"{LEDGERS}/0000",
            f"{LEDGERS}/0000/0000",
            f"{LEDGERS}/0000/0000/0005",
            f"{LEDGERS}/0000/0000/0005/0002",
            f"{LEDGERS}/0000/0000/0005/0002/urL{c:010d}",
        }
        assert await queue.mark_replicated(taken[c]) is True
        assert await _tree(zk, LEDGERS) == set()  # `ledgers` itself stays
        assert await zk.exists(LEDGERS) is not None
        assert await zk.get_children(LOCKS) == []
        assert queue.held() == []
    finally:
        await queue.close()


async def test_a_mark_changed_after_the_take_is_kept(zk: ZkClient) -> None:
    urm = await _layout(zk)
    await urm.mark_underreplicated(7, ["a:3181"], now_ms=CTIME)
    queue = ReplicationQueue(zk, ROOT, "w")
    try:
        taken = await queue.take()
        assert taken is not None and taken.missing_replicas == ("a:3181",)
        # The auditor finds another bookie missing while we work.
        assert await urm.mark_underreplicated(7, ["b:3181"], now_ms=CTIME + 1) is (
            MarkOutcome.MERGED
        )
        assert await queue.mark_replicated(taken) is False
        data, stat = await zk.get(ur_ledger_path(BASE, 7))
        assert data == b'replica: "a:3181"\nreplica: "b:3181"\nctime: 1700000000001\n'
        assert stat.version == 1
        assert await zk.get_children(LOCKS) == []  # released all the same
        again = await queue.take()
        assert again is not None
        assert (again.mark_version, again.missing_replicas) == (1, ("a:3181", "b:3181"))
        assert await queue.mark_replicated(again) is True
        assert await _tree(zk, LEDGERS) == set()
        assert await zk.get_children(LOCKS) == []
    finally:
        await queue.close()


async def test_a_mark_removed_by_someone_else_is_fine(zk: ZkClient) -> None:
    urm = await _layout(zk)
    await urm.mark_underreplicated(7, ["a:3181"], now_ms=CTIME)
    queue = ReplicationQueue(zk, ROOT, "w")
    try:
        taken = await queue.take()
        assert taken is not None
        await zk.delete(taken.mark_path)
        assert await queue.mark_replicated(taken) is False
        assert await zk.get_children(LOCKS) == []
        # The empty directories it leaves are tolerated by the next walk.
        assert await queue.take() is None
    finally:
        await queue.close()


class BeforeLock:
    """The real store, with `action` run once just before the first lock is created (what
    another worker does between our read of a mark and our lock on it)."""

    def __init__(self, store: ZkClient, action: Callable[[], Awaitable[None]]) -> None:
        self.store = store
        self.action: Callable[[], Awaitable[None]] | None = action

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def create(self, path: str, data: bytes = b"", **kwargs: Any) -> str:
        if path.startswith(LOCKS + "/") and self.action is not None:
            action, self.action = self.action, None
            await action()
        return await self.store.create(path, data, **kwargs)


async def test_a_mark_gone_as_we_lock_it_is_let_go_and_the_next_one_taken(zk: ZkClient) -> None:
    """Another worker repaired ledger 7, unmarked it and let its lock go, between our read
    of its mark and our lock: the take lets that lock go at once and takes ledger 8."""
    urm = await _layout(zk)
    await urm.mark_underreplicated(7, ["a:3181"], now_ms=CTIME)
    await urm.mark_underreplicated(8, ["b:3181"], now_ms=CTIME + 1)

    async def repaired_by_another() -> None:
        await zk.delete(ur_ledger_path(BASE, 7))

    queue = ReplicationQueue(cast(Any, BeforeLock(zk, repaired_by_another)), ROOT, "w")
    try:
        taken = await queue.take()
        assert taken is not None and taken.ledger_id == 8
        assert await zk.get_children(LOCKS) == [ur_lock_path(BASE, 8).rsplit("/", 1)[1]]
        assert await queue.mark_replicated(taken) is True
        assert await queue.take() is None
        assert await zk.get_children(LOCKS) == []
    finally:
        await queue.close()


async def test_a_mark_changed_as_we_lock_it_is_taken_as_it_is_now(zk: ZkClient) -> None:
    """The auditor added a bookie to the mark between our read and our lock: the take
    holds the mark's new version and replicas, so unmarking it deletes that version."""
    urm = await _layout(zk)
    await urm.mark_underreplicated(7, ["a:3181"], now_ms=CTIME)

    async def marked_again() -> None:
        await urm.mark_underreplicated(7, ["b:3181"], now_ms=CTIME + 1)

    queue = ReplicationQueue(cast(Any, BeforeLock(zk, marked_again)), ROOT, "w")
    try:
        taken = await queue.take()
        assert taken is not None
        assert (taken.mark_version, taken.missing_replicas) == (1, ("a:3181", "b:3181"))
        assert await queue.mark_replicated(taken) is True
        assert await _tree(zk, LEDGERS) == set()
    finally:
        await queue.close()


async def test_a_lock_deleted_under_us_refuses_the_unmark(zk: ZkClient, other: ZkClient) -> None:
    urm = await _layout(zk)
    await urm.mark_underreplicated(7, ["a:3181"], now_ms=CTIME)
    queue = ReplicationQueue(zk, ROOT, "w")
    try:
        taken = await queue.take()
        assert taken is not None
        assert await queue.still_held(taken) is True
        await other.delete(taken.lock_path)  # an operator, say
        assert await queue.still_held(taken) is False
        with pytest.raises(FencedOutError):
            await queue.mark_replicated(taken)
        data, stat = await zk.get(taken.mark_path)
        assert (data, stat.version) == (b'replica: "a:3181"\nctime: 1700000000000\n', 0)
        assert queue.held() == []
    finally:
        await queue.close()


async def test_release_deletes_only_our_own_lock(zk: ZkClient, other: ZkClient) -> None:
    urm = await _layout(zk)
    await urm.mark_underreplicated(7, ["a:3181"], now_ms=CTIME)
    queue = ReplicationQueue(zk, ROOT, "w")
    try:
        taken = await queue.take()
        assert taken is not None
        await other.delete(taken.lock_path)
        await other.create(taken.lock_path, b'bookieId: "host"\n', ephemeral=True)
        await queue.release(taken)  # the lock at that path is not ours any more
        data, stat = await zk.get(taken.lock_path)
        other_id = other.client_id
        assert other_id is not None
        assert (data, stat.ephemeralOwner) == (b'bookieId: "host"\n', other_id[0])
        assert queue.held() == []
        await queue.release(taken)  # twice: nothing
    finally:
        await queue.close()
    assert await zk.exists(ur_lock_path(BASE, 7)) is not None


async def _take_when_woken(queue: ReplicationQueue, woken: asyncio.Event) -> TakenLedger:
    """Takes as the worker does: at each wake, until a take finds a ledger."""
    while True:
        await woken.wait()
        taken = await queue.take()
        if taken is not None:
            return taken
        woken = await queue.changed()


async def test_after_our_session_expired_nothing_is_unmarked(zk: ZkClient, zk_hosts: str) -> None:
    urm = await _layout(zk)
    await urm.mark_underreplicated(7, ["a:3181"], now_ms=CTIME)
    worker = ZkClient(zk_hosts, timeout=5, session_timeout=4)
    await worker.start()
    states = worker.states()
    queue = ReplicationQueue(worker, ROOT, "w")
    rival = ReplicationQueue(zk, ROOT, "rival")
    try:
        taken = await queue.take()
        assert taken is not None
        woken = await queue.changed()
        cid = worker.client_id
        assert cid is not None
        await asyncio.to_thread(expire_session, zk_hosts, cid)
        await asyncio.wait_for(woken.wait(), 15)  # the watch is gone: walk again
        # Whatever state kazoo is in now, the unmark must not happen.
        with pytest.raises((FencedOutError, ZkUnavailableError)):
            await queue.mark_replicated(taken)
        assert (await zk.get(taken.mark_path))[1].version == 0
        # Another worker takes the ledger; its lock has version 0, as ours had.
        theirs = await rival.take()
        assert theirs is not None and theirs.ledger_id == 7 and theirs.lock_version == 0
        # Again once kazoo runs a new session: the rival's lock passes a version check,
        # so it is the session that refuses.
        seen: list[SessionState] = []
        while not (SessionState.LOST in seen and seen[-1] == SessionState.CONNECTED):
            seen.append(await asyncio.wait_for(states.__anext__(), 15))
        stale = TakenLedger(7, taken.mark_path, 0, taken.lock_path, 0, ("a:3181",))
        assert await queue.still_held(stale) is False
        with pytest.raises(FencedOutError):
            queue.fenced(stale)
        with pytest.raises(FencedOutError):
            await queue.mark_replicated(stale)
        data, stat = await zk.get(taken.mark_path)
        assert (data, stat.version) == (b'replica: "a:3181"\nctime: 1700000000000\n', 0)
        data, _ = await zk.get(taken.lock_path)
        assert data == b'bookieId: "rival"\n'  # the rival's lock is untouched
        assert await rival.still_held(theirs) is True
        assert await rival.mark_replicated(theirs) is True
        # The queue works on in the new session: a new watch, a new mark, taken.
        assert await queue.take() is None
        woken = await queue.changed()
        await urm.mark_underreplicated(8, ["a:3181"], now_ms=CTIME)
        # A wake may come from the rival's unmark, its event delivered late (before the
        # new mark's): then the take finds nothing yet, and the worker waits again.
        again = await asyncio.wait_for(_take_when_woken(queue, woken), 10)
        assert again.ledger_id == 8
        assert await queue.still_held(again) is True
        assert await queue.mark_replicated(again) is True
    finally:
        await states.aclose()
        await queue.close()
        await rival.close()
        await worker.close()


async def test_a_take_cancelled_at_any_point_leaves_no_lock_of_ours_behind(zk: ZkClient) -> None:
    urm = await _layout(zk)
    await urm.mark_underreplicated(7, ["a:3181"], now_ms=CTIME)
    queue = ReplicationQueue(zk, ROOT, "w")
    try:
        for steps in range(60):
            attempt = asyncio.ensure_future(queue.take())
            await asyncio.sleep(steps * 0.0001)  # a point somewhere in the take
            attempt.cancel()
            try:
                done = await attempt
            except asyncio.CancelledError:
                done = None
            if done is not None:
                await queue.release(done)
            # Whatever the cancel interrupted (the create, or the read after it), the
            # next take finds the ledger free.
            taken = await queue.take()
            assert taken is not None and taken.ledger_id == 7, steps
            await queue.release(taken)
            assert await zk.get_children(LOCKS) == []
    finally:
        await queue.close()


async def test_without_persistent_watches_a_walk_every_second(
    zk: ZkClient, other: ZkClient
) -> None:
    await _layout(zk)
    queue = ReplicationQueue(zk, ROOT, "w")
    queue._watch_supported = False  # as on a ZooKeeper older than 3.6
    try:
        assert await queue.take() is None
        started = time.monotonic()
        woken = await queue.changed()
        await UnderreplicationManager(other, ROOT).mark_underreplicated(5, ["b:3181"])
        await asyncio.wait_for(woken.wait(), 5)
        assert time.monotonic() - started >= POLL_WITHOUT_WATCH - 0.01
        taken = await queue.take()
        assert taken is not None and taken.ledger_id == 5
        assert await queue.mark_replicated(taken) is True
    finally:
        await queue.close()


@contextlib.asynccontextmanager
async def behind_a_proxy(zk_hosts: str) -> AsyncIterator[tuple[ReplicationQueue, TcpProxy]]:
    """A queue whose ZooKeeper client reaches the server through a cuttable proxy (the
    session outlives a short cut), with ledger 7 taken."""
    hosts, _, chroot = zk_hosts.partition("/")
    host, port = hosts.split(",")[0].rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    await proxy.start()
    worker = ZkClient(f"{proxy.address}/{chroot}", timeout=1.0, session_timeout=20.0)
    await worker.start()
    queue = ReplicationQueue(worker, ROOT, "w")
    try:
        yield queue, proxy
    finally:
        await queue.close()
        await worker.close()
        await proxy.stop()


async def until_state(states: AsyncIterator[SessionState], wanted: SessionState) -> None:
    async with asyncio.timeout(30):
        async for state in states:
            if state is wanted:
                return


async def taken_again_and_released(zk: ZkClient, queue: ReplicationQueue, lock_path: str) -> None:
    """The next take deletes the lock left behind and finds ledger 7 free."""
    again = await queue.take()
    assert again is not None and again.ledger_id == 7
    assert again.lock_path == lock_path
    await queue.release(again)
    assert await zk.get_children(LOCKS) == []


async def test_a_release_the_store_did_not_answer_is_retried_at_the_next_take(
    zk: ZkClient, zk_hosts: str
) -> None:
    """The delete of our lock goes unanswered (ZooKeeper unreachable for a moment, the
    session alive): the release raises, and the next take deletes the lock and finds the
    ledger free. Before, the lock stayed with our session (days, for a daemon), and no
    worker, ours or Java's, could take the ledger."""
    urm = await _layout(zk)
    await urm.mark_underreplicated(7, ["a:3181"], now_ms=CTIME)
    async with behind_a_proxy(zk_hosts) as (queue, proxy):
        taken = await queue.take()
        assert taken is not None and taken.ledger_id == 7
        states = queue.store.states()  # subscribed before the cut: no change is missed
        proxy.cut()
        with pytest.raises(ZkUnavailableError):
            await queue.release(taken)
        proxy.mend()
        await until_state(states, SessionState.CONNECTED)
        assert queue.held() == []
        await taken_again_and_released(zk, queue, taken.lock_path)


async def test_a_release_while_the_connection_is_suspended_is_retried_at_the_next_take(
    zk: ZkClient, zk_hosts: str
) -> None:
    """The release comes once the client knows the connection is down (SUSPENDED: kazoo
    then shows no session id). The lock is not taken for one of a session that is over:
    the release raises, and the next take, the session back, deletes it and finds the
    ledger free. Before, the release returned as if the lock were gone with its session,
    and it stayed with the session that came back (the soak: every ledger whose lock was
    released during a ZooKeeper restart stayed locked until the daemon's end)."""
    urm = await _layout(zk)
    await urm.mark_underreplicated(7, ["a:3181"], now_ms=CTIME)
    async with behind_a_proxy(zk_hosts) as (queue, proxy):
        taken = await queue.take()
        assert taken is not None and taken.ledger_id == 7
        states = queue.store.states()
        proxy.cut()
        await until_state(states, SessionState.SUSPENDED)
        assert queue.store.session is None
        with pytest.raises(StoreUnavailableError):
            await queue.release(taken)
        proxy.mend()
        await until_state(states, SessionState.CONNECTED)
        assert await zk.get_children(LOCKS) == ["urL0000000007"]  # still ours
        await taken_again_and_released(zk, queue, taken.lock_path)


# --- the order ----------------------------------------------------------------------


async def test_a_ledger_whose_metadata_moved_since_ranked_is_tried_in_its_new_place(
    zk: ZkClient, other: ZkClient
) -> None:
    """Ledger metadata is not watched: the candidate about to be locked is read again with
    its mark, in one batch, and a ledger repaired meanwhile goes back to its new place."""
    async with test_cluster(zk, 5) as tc:
        b = tc.ids
        urm = await _layout(zk)
        # Both on b0, b1, b2, every bookie registered: the marks alone say what is lost.
        two = await tc.writer.write_ledger(1, [(0, b[:3])], write_quorum=3, num_entries=3)
        one = await tc.writer.write_ledger(2, [(0, b[:3])], write_quorum=3, num_entries=3)
        await urm.mark_underreplicated(1, [b[0]], now_ms=CTIME)
        await urm.mark_underreplicated(2, [b[0], b[1]], now_ms=CTIME + 1)
        async with tc.context() as ctx:
            order = RiskOrder(ctx, log=get_logger("test"))
            queue = ReplicationQueue(zk, ROOT, "w", order=order)
            try:
                await queue.refresh()
                assert {lid: (r.copies_left, r.marked_at) for lid, r in order.risks.items()} == {
                    1: (2, CTIME / 1000),
                    2: (1, (CTIME + 1) / 1000),
                }
                assert queue.queued(5) == [(2, False), (1, False)]
                # A writer (or a Java worker) replaced b1 in ledger 2: two copies left now,
                # and its mark is younger than ledger 1's. Nothing tells the queue.
                await tc.writer.rereplicate(one, [b[0], b[3], b[2]])
                taken = await queue.take()
                assert taken is not None and taken.ledger_id == 1
                assert order.risks[2].copies_left == 2  # ranked again on the way
                assert queue.queued(5) == [(1, True), (2, False)]
                # Another worker repairs ledger 1 under its lock (ours, released here, then
                # theirs): its release sends the ledger to be read again.
                await queue.release(taken)
                lock = ur_lock_path(BASE, 1)
                await other.create(lock, b'bookieId: "java"\n', ephemeral=True)
                await tc.writer.rereplicate(two, [b[4], b[1], b[2]])
                outdated = await queue.outdated()
                await other.delete(lock)
                await asyncio.wait_for(outdated.wait(), 10)
                await queue.refresh()
                assert order.risks[1].copies_left == 3  # the mark lists b0, gone from it
                assert queue.queued(5) == [(2, False), (1, False)]
            finally:
                await queue.close()


async def test_the_order_follows_a_re_mark_and_forgets_an_unmark(zk: ZkClient) -> None:
    async with test_cluster(zk, 4) as tc:
        b = tc.ids
        urm = await _layout(zk)
        for lid in (1, 2, 3):
            await tc.writer.write_ledger(lid, [(0, b[:3])], write_quorum=3, num_entries=1)
            await urm.mark_underreplicated(lid, [b[0]], now_ms=CTIME + lid)
        # A mark whose ledger has no metadata: unknown, last.
        await urm.mark_underreplicated(9, [b[0]], now_ms=CTIME)
        async with tc.context() as ctx:
            now = [0.0]
            order = RiskOrder(ctx, log=get_logger("test"), clock=lambda: now[0])
            queue = ReplicationQueue(zk, ROOT, "w", order=order)
            try:
                await queue.refresh()
                assert [lid for lid, _ in queue.queued(10)] == [1, 2, 3, 9]
                assert order.risks[9] == Risk(None, None, CTIME / 1000)
                outdated = await queue.outdated()
                # The auditor adds b1 to ledger 3's mark: one copy left, first.
                await urm.mark_underreplicated(3, [b[1]], now_ms=CTIME + 50)
                await asyncio.wait_for(outdated.wait(), 10)
                await queue.refresh()
                assert [lid for lid, _ in queue.queued(10)] == [3, 1, 2, 9]
                assert order.risks[3] == Risk(1, None, (CTIME + 50) / 1000)
                outdated = await queue.outdated()
                await zk.delete(ur_ledger_path(BASE, 1))  # unmarked by someone else
                await asyncio.wait_for(outdated.wait(), 10)
                await queue.refresh()
                assert [lid for lid, _ in queue.queued(10)] == [3, 2, 9]
                assert 1 not in order.risks
                # A bookie leaves the registry: every mark ranked again, from what was kept.
                await tc.by_id(b[2]).crash()
                now[0] += REGISTRY_REFRESH  # the registry is read again from now on
                await queue.refresh()
                assert [lid for lid, _ in queue.queued(10)] == [3, 2, 9]
                assert (order.risks[3].copies_left, order.risks[2].copies_left) == (0, 1)
            finally:
                await queue.close()


async def test_replication_disabled_follows_the_watch(zk: ZkClient, other: ZkClient) -> None:
    """The disable flag is read once, then taken from the tree watch's events: each
    change shows before the mark made after it wakes a taker (events come in order)."""
    await _layout(zk)
    queue = ReplicationQueue(zk, ROOT, "w")
    urm = UnderreplicationManager(other, ROOT)
    try:
        assert await queue.replication_disabled() is False
        woken = await queue.changed()
        await urm.disable_replication()
        await urm.mark_underreplicated(5, ["b:3181"])
        await asyncio.wait_for(woken.wait(), 10)
        assert await queue.replication_disabled() is True
        assert await queue.take() is not None  # taking is the loop's call, not the queue's
        woken = await queue.changed()
        await urm.enable_replication()
        await urm.mark_underreplicated(6, ["b:3181"])
        await asyncio.wait_for(woken.wait(), 10)
        assert await queue.replication_disabled() is False
    finally:
        await queue.close()


async def test_replication_disabled_without_a_watch_reads_each_time(
    zk: ZkClient, other: ZkClient
) -> None:
    """Where the store has no persistent watch (ZooKeeper before 3.6), every call reads."""
    await _layout(zk)
    queue = ReplicationQueue(zk, ROOT, "w")
    queue._watch_supported = False  # as `_ensure_watch` leaves it on such a server
    try:
        assert await queue.replication_disabled() is False
        await UnderreplicationManager(other, ROOT).disable_replication()
        assert await queue.replication_disabled() is True
    finally:
        await queue.close()


async def test_free_marks_leave_out_exactly_the_locked_ledgers(
    zk: ZkClient, other: ZkClient
) -> None:
    """A lock counts for the ledger whose `urL%010d` name it has, and no other: a name
    with other digits (`urL7`, more zeros) locks nothing a worker would take."""
    urm = await _layout(zk)
    for lid in (7, 8, 9):
        await urm.mark_underreplicated(lid, ["a:3181"], now_ms=CTIME)
    await other.create(ur_lock_path(BASE, 8), b'bookieId: "x"\n', ephemeral=True)
    for name in ("urL7", "urL000000000009", "urLx"):
        await other.create(f"{LOCKS}/{name}", b"", ephemeral=True)
    queue = ReplicationQueue(zk, ROOT, "w")
    try:
        await queue.refresh()
        assert sorted(queue.free_marks()) == [7, 9]
        taken = await queue.take()
        assert taken is not None and taken.ledger_id in (7, 9)
        assert sorted(queue.free_marks()) == sorted({7, 9} - {taken.ledger_id})
    finally:
        await queue.close()
