"""The daemon on etcd: both elections, the replication worker, a lost lease, an unreachable etcd.

Each daemon test runs a fresh etcd of its own: Pulsar's root is always `/ledgers` on etcd
(no chroot), so the keys asserted are the ones a Java node would see, not a prefix's.
What Pulsar (or a Java node) would write or read is done with a plain aetcd client beside
the daemon (`raw`), and what the daemon wrote is read from etcd's own history (a watch
from a past revision), so "wrote nothing" is exact: no revision at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any

import aetcd
import pytest
from aetcd import rpc

from auditor.checks.findings import Check
from auditor.daemon.config import DaemonConfig
from auditor.daemon.leadership import Phase, Reason
from auditor.etcd import EtcdStore
from auditor.metadata.bk_etcd import BookKeeperEtcdView
from auditor.metadata.elections import encode_pulsar_leader, leader_key_path
from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_update import replace_bookies, update_ledger
from auditor.metadata.paths import ledger_path
from auditor.metadata.replication import ReplicationQueue
from auditor.metadata.schedule import write_set
from auditor.metadata.serde import decode_ledger_metadata, encode_ledger_metadata
from auditor.metadata.service_uri import MetadataDriver
from auditor.metadata.underreplication import (
    UnderreplicationManager,
    ur_ledger_path,
    ur_lock_path,
)
from auditor.store import BadVersionError, FencedOutError, MetadataStore, NoNodeError
from auditor.testing.cluster import ClusterWriter
from auditor.testing.etcdserver import EtcdServer
from auditor.testing.harness import test_cluster
from auditor.testing.inprocess import fast_config, running, until
from auditor.testing.observe import events_of
from auditor.testing.watching import until_watched
from auditor.testing.zkserver import free_port

ROOT = "/ledgers"
BASE = f"{ROOT}/underreplication"
PULSAR_KEY = leader_key_path(MetadataDriver.PULSAR, ROOT)
OUR_KEY = leader_key_path(MetadataDriver.ETCD, ROOT)
#: The daemons' session timeout, so the TTL of their leases (s).
SESSION = 4.0
#: The TTL of the lease the test's "Java node" holds Pulsar's leader key on (s).
JAVA_TTL = 6
JAVA = "java:3181"
ENTRIES = 12
Logs = list[MutableMapping[str, Any]]


# --- fixtures and helpers -----------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[EtcdServer]:
    """An etcd of this test's own (the daemons' keys are at /ledgers, unprefixed)."""
    s = EtcdServer()
    s.start()
    try:
        yield s
    finally:
        s.destroy()


@pytest.fixture
async def raw(server: EtcdServer) -> AsyncIterator[aetcd.Client]:
    client = aetcd.Client(host="127.0.0.1", port=server.port, timeout=10)
    await client.connect()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def meta(server: EtcdServer) -> AsyncIterator[EtcdStore]:
    """The test's own session on the store, Pulsar's layout (the daemons' tree)."""
    async with EtcdStore([server.endpoint], timeout=10.0, session_timeout=10.0) as store:
        yield store


def pulsar_config(server: EtcdServer, identity: str, *extra: str) -> DaemonConfig:
    """A daemon on Pulsar's driver on etcd, as Pulsar's bookies configure it."""
    return fast_config(
        server.hosts,
        identity,
        [
            f"daemon.metadata_service_uri=metadata-store:etcd:{server.endpoint}",
            f"daemon.zk_session_timeout={SESSION}",
            *extra,
        ],
    )


def worker_config(server: EtcdServer, identity: str) -> DaemonConfig:
    return pulsar_config(
        server,
        identity,
        "worker.enabled=true",
        "worker.lock_holder=worker-host",
        "lockReleaseOfFailedLedgerGracePeriod=3200",
    )


async def revision(raw: aetcd.Client) -> int:
    reply = await rpc.KVStub(raw.channel).Range(rpc.RangeRequest(key=b"/", count_only=True))
    return int(reply.header.revision)


async def history(raw: aetcd.Client, after: int) -> list[Any]:
    """Every event on a key under /ledgers/ after revision `after`, up to now, in order
    (a sentinel key beside the tree ends the watch)."""
    kv = rpc.KVStub(raw.channel)
    end = int((await kv.Put(rpc.PutRequest(key=b"/~end", value=b""))).header.revision)
    call = rpc.WatchStub(raw.channel).Watch()
    events: list[Any] = []
    try:
        await call.write(
            rpc.WatchRequest(
                create_request=rpc.WatchCreateRequest(
                    key=b"/", range_end=b"\0", start_revision=after + 1
                )
            )
        )
        async with asyncio.timeout(10):
            while True:
                reply = await call.read()
                for event in reply.events:
                    if int(event.kv.mod_revision) >= end:
                        return events
                    if bytes(event.kv.key).startswith(b"/ledgers/"):
                        events.append(event)
    finally:
        call.cancel()


def described(events: list[Any]) -> list[tuple[str, str]]:
    return [
        ("PUT" if e.type == rpc.Event.PUT else "DELETE", bytes(e.kv.key).decode()) for e in events
    ]


async def under(raw: aetcd.Client, prefix: str) -> dict[str, bytes]:
    """The keys below `prefix`/ and their values."""
    return {
        bytes(kv.key).decode(): bytes(kv.value)
        for kv in await raw.get_prefix(f"{prefix}/".encode())
    }


async def wait_key(store: MetadataStore, path: str, present: bool, within: float = 30) -> None:
    """Until `path` exists (or is gone), woken by a watch."""
    async with asyncio.timeout(within):
        while True:
            stat, changed = await store.exists_watched(path)
            if (stat is not None) == present:
                return
            await changed.wait()


@contextlib.asynccontextmanager
async def java_holds(raw: aetcd.Client, key: str) -> AsyncIterator[Any]:
    """A Java node's leader key, as Pulsar writes it, on a lease of the test's own."""
    lease = await raw.lease(JAVA_TTL)
    await raw.put(key.encode(), encode_pulsar_leader(JAVA), lease=lease)
    yield lease


# --- the root cause of the stalled workers: hex directories without nodes of their own -----


async def test_the_queue_finds_marks_in_directories_new_since_its_last_walk(
    store: MetadataStore,
) -> None:
    """A walk caches each level's listing. On etcd a hex directory is only the keys below
    it: a mark in a new directory (ledger 0x10000 after ledger 1) comes with no event for
    the directories above it, so a listing cached before it must still be dropped, or
    the worker never sees the mark (the demo on etcd stalled after one ledger each)."""
    urm = UnderreplicationManager(store, ROOT)
    await urm.check_layout()
    q = ReplicationQueue(store, ROOT, "w")
    try:
        await urm.mark_underreplicated(1, ["b:1"])
        first = await q.take()
        assert first is not None and first.ledger_id == 1
        for lid in (0x10000, 0x1_0000_0000, 2**48, 0x10001):
            await urm.mark_underreplicated(lid, ["b:1"])
            # As a worker does: take, and when nothing comes, wait for the next change
            # (a wake-up may be the last unmark's events, before the new mark's).
            while True:
                changed = await q.changed()
                taken = await q.take()
                if taken is not None:
                    break
                await asyncio.wait_for(changed.wait(), 10)
            assert taken.ledger_id == lid
            assert await q.mark_replicated(taken)
        assert await q.take() is None
        assert await q.mark_replicated(first)
        # Every directory above the marks went with them; a walk then finds nothing,
        # and lists no gone directory again.
        assert await q.take() is None
        assert await store.get_children(f"{BASE}/ledgers") == []
    finally:
        await q.close()


# --- Pulsar's election on etcd ---------------------------------------------------------------


async def test_pulsars_election_on_etcd_follows_a_java_leader_then_leads_and_releases(
    server: EtcdServer, raw: aetcd.Client, meta: EtcdStore
) -> None:
    await ClusterWriter(meta, ROOT).init_cluster()
    async with java_holds(raw, PULSAR_KEY) as lease:
        before = await revision(raw)
        async with running(pulsar_config(server, "pulsar-a:3181")) as daemon:
            assert daemon.driver is MetadataDriver.PULSAR
            await until(
                events_of(daemon).leader_read, lambda: daemon.state.leader == JAVA, "follows"
            )
            assert daemon.state.phase is Phase.VOTING and not daemon.state.is_leader
            assert daemon.state.election == "pulsar"
            # It wrote nothing at all: not a key, not a revision.
            assert await revision(raw) == before
            got = await raw.get(PULSAR_KEY.encode())
            assert got is not None and (got.value, got.lease) == (b'"java:3181"', lease.id)

            await lease.revoke()  # the Java node is gone
            gone = time.monotonic()
            await until(
                events_of(daemon).decided, lambda: daemon.state.is_leader, "leads", JAVA_TTL + 2
            )
            assert time.monotonic() - gone < JAVA_TTL + 2
            assert daemon.store is not None and daemon.store.session is not None
            got = await raw.get(PULSAR_KEY.encode())
            assert got is not None
            assert (got.value, got.lease) == (b'"pulsar-a:3181"', daemon.store.session)
            assert got.version == 1
            session = daemon.store.session
        # stop() (what SIGTERM calls) deleted the key, and the lease went with the session.
        assert await raw.get(PULSAR_KEY.encode()) is None
        info = await raw.get_lease_info(session)
        assert info.TTL == -1  # revoked


# --- BookKeeper's own etcd driver: our own key, reports only -----------------------------


async def test_bookkeepers_etcd_driver_elects_on_our_key_reports_and_never_marks(
    server: EtcdServer, raw: aetcd.Client, info_logs: Logs
) -> None:
    async with (
        EtcdStore([server.endpoint], timeout=10.0) as etcd,
        test_cluster(BookKeeperEtcdView(etcd, ROOT), 3, manager=LedgerManager.ETCD) as tc,
    ):
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=10)
        await tc.writer.write_ledger(2, tc.ids, write_quorum=2, num_entries=10)
        await tc.bookies[2].crash()  # both ledgers lose a replica
        assert (await raw.get(b"/ledgers/layout")) is not None  # BookKeeper's etcd layout
        config = fast_config(
            server.hosts,
            "bk-a:3181",
            [
                f"daemon.metadata_service_uri=etcd://{server.hosts}/ledgers",
                f"daemon.zk_session_timeout={SESSION}",
                "worker.enabled=true",
            ],
        )
        async with java_holds(raw, OUR_KEY) as lease:
            before = await revision(raw)
            async with running(config) as daemon:
                assert daemon.driver is MetadataDriver.ETCD
                await until(
                    events_of(daemon).leader_read, lambda: daemon.state.leader == JAVA, "follows"
                )
                assert not daemon.state.is_leader
                assert await revision(raw) == before  # nothing written while it follows

                await lease.revoke()
                await until(
                    events_of(daemon).decided, lambda: daemon.state.is_leader, "leads", JAVA_TTL + 2
                )
                assert daemon.store is not None
                got = await raw.get(OUR_KEY.encode())
                assert got is not None
                assert (got.value, got.lease) == (b'"bk-a:3181"', daemon.store.session)

                # The leader's first bookie check finds the lost bookie's ledgers: reported,
                # never marked, and no worker started to act on marks.
                def reported() -> bool:
                    cs = daemon.state.checks[Check.BOOKIES]
                    return cs.last_report is not None

                await until(events_of(daemon).check_ended, reported, "the bookie check ran")
                report = daemon.state.checks[Check.BOOKIES].last_report
                assert report is not None
                assert report.lost_bookies == [tc.ids[2]]
                assert report.marked_underreplicated == []
                assert await under(raw, f"{BASE}/ledgers") == {}
                assert daemon.worker is None
                assert any(
                    e["event"].startswith("replication worker not started") for e in info_logs
                )
            assert await raw.get(OUR_KEY.encode()) is None


# --- the worker on etcd --------------------------------------------------------------------


async def test_the_worker_on_etcd_locks_on_its_lease_copies_commits_and_unmarks(
    server: EtcdServer, raw: aetcd.Client, meta: EtcdStore
) -> None:
    async with test_cluster(meta, 4) as tc:
        b = tc.ids
        ensemble = (b[0], b[1], b[2])
        await tc.writer.write_ledger(
            1, [(0, ensemble)], write_quorum=2, ack_quorum=2, num_entries=ENTRIES
        )
        path = ledger_path(tc.cluster.manager, ROOT, 1)
        original = decode_ledger_metadata((await meta.get(path))[0], 1)
        lost = tc.by_id(b[0])
        await lost.crash()
        await UnderreplicationManager(meta, ROOT).mark_underreplicated(1, [b[0]])
        mark, lock = ur_ledger_path(BASE, 1), ur_lock_path(BASE, 1)
        before = await revision(raw)
        async with running(worker_config(server, "w-a:3181")) as daemon:
            await wait_key(meta, mark, present=False)
            assert daemon.store is not None and daemon.worker is not None
            session = daemon.store.session
            await until(
                daemon.worker.released,
                lambda: daemon.state.worker.ledgers_replicated == 1,
                "counted as re-replicated",
            )
        events = await history(raw, before)
        # What the worker wrote, in order: its lock on its lease, the ledger's metadata
        # (once), the mark's deletion, the lock's.
        worker = [e for e in events if bytes(e.kv.key).decode() in (mark, lock, path)]
        assert described(worker) == [
            ("PUT", lock),
            ("PUT", path),
            ("DELETE", mark),
            ("DELETE", lock),
        ]
        put_lock, put_md = worker[0], worker[1]
        assert bytes(put_lock.kv.value) == b'bookieId: "worker-host"\n'
        assert int(put_lock.kv.lease) == session
        # The commit: exactly the ensemble with the lost bookie replaced, etcd version 2
        # (one write on top of the writer's create), on no lease.
        committed = decode_ledger_metadata(bytes(put_md.kv.value), 1)
        [segment] = committed.segments
        target = segment.bookies[0]
        assert target == b[3]
        expected = replace_bookies(0, {b[0]: target})(original)
        assert expected is not None
        assert bytes(put_md.kv.value) == encode_ledger_metadata(expected)
        assert (int(put_md.kv.version), int(put_md.kv.lease)) == (2, 0)
        # The entries the lost bookie had to hold are on the target, byte for byte.
        copied = 0
        for e in range(ENTRIES):
            if 0 in write_set(e, 3, 2):
                copied += 1
                assert tc.by_id(target).entry_body(1, e) == lost.entry_body(1, e), e
        assert copied == 8
        assert await under(raw, f"{BASE}/locks") == {}


async def test_a_commit_at_a_stale_version_fails_on_etcd_and_writes_nothing(
    raw: aetcd.Client, meta: EtcdStore
) -> None:
    """The worker's commit is a versioned put fenced on its lock, in one etcd txn: a
    change of the metadata after the worker read it makes that commit fail, and the
    key keeps the other writer's bytes and revision."""
    async with test_cluster(meta, 4) as tc:
        b = tc.ids
        await tc.writer.write_ledger(
            1, [(0, (b[0], b[1], b[2]))], write_quorum=2, ack_quorum=2, num_entries=4
        )
        path = ledger_path(tc.cluster.manager, ROOT, 1)
        await UnderreplicationManager(meta, ROOT).mark_underreplicated(1, [b[0]])
        q = ReplicationQueue(meta, ROOT, "worker-host")
        try:
            taken = await q.take()
            assert taken is not None and taken.ledger_id == 1
            got = await raw.get(taken.lock_path.encode())
            assert got is not None and got.lease == meta.session
            data, stat = await meta.get(path)
            ours = replace_bookies(0, {b[0]: b[3]})(decode_ledger_metadata(data, 1))
            assert ours is not None
            # Another worker replaced the bookie meanwhile (its commit at this version).
            theirs = replace_bookies(0, {b[0]: b[3]})(decode_ledger_metadata(data, 1))
            assert theirs is not None
            theirs = dataclasses.replace(theirs, custom_metadata=(("by", b"other"),))
            await raw.put(path.encode(), encode_ledger_metadata(theirs))
            after = await raw.get(path.encode())
            assert after is not None
            with pytest.raises(BadVersionError):
                await q.fenced(taken).set(path, encode_ledger_metadata(ours), int(stat.version))
            # The whole commit (read, transform, versioned put): nothing left to do.
            result = await update_ledger(
                q.fenced(taken), meta, path, 1, replace_bookies(0, {b[0]: b[3]})
            )
            assert not result.written
            now = await raw.get(path.encode())
            assert now is not None
            assert (now.value, now.mod_revision, now.version) == (
                encode_ledger_metadata(theirs),
                after.mod_revision,
                2,
            )
            assert await q.mark_replicated(taken)
            assert await raw.get(taken.mark_path.encode()) is None
            assert await raw.get(taken.lock_path.encode()) is None
        finally:
            await q.close()


# --- a lost lease --------------------------------------------------------------------------


async def test_a_lost_lease_stops_every_write_until_a_new_one_then_it_leads_again(
    server: EtcdServer,
    raw: aetcd.Client,
    meta: EtcdStore,
    info_logs: Logs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with test_cluster(meta, 5) as tc:
        b = tc.ids
        # Ledger 2's entries 0, 3, 6, 9 are only on b0 and b1: both lost, it is
        # unrecoverable (b3 and b4 could take the positions, nothing can be read for
        # them), and the worker holds its lock for worker.unrecoverable_retry.
        await tc.writer.write_ledger(
            2, [(0, (b[0], b[1], b[2]))], write_quorum=2, ack_quorum=2, num_entries=ENTRIES
        )
        await tc.by_id(b[0]).crash()
        await tc.by_id(b[1]).crash()
        await UnderreplicationManager(meta, ROOT).mark_underreplicated(2, [b[0], b[1]])
        lock = ur_lock_path(BASE, 2)
        async with running(worker_config(server, "w-a:3181")) as daemon:
            await until(events_of(daemon).decided, lambda: daemon.state.is_leader, "leads")
            await wait_key(meta, lock, present=True)
            store = daemon.store
            assert isinstance(store, EtcdStore)
            old = store.session
            assert old is not None
            key = await raw.get(PULSAR_KEY.encode())
            held = await raw.get(lock.encode())
            assert key is not None and held is not None
            assert key.lease == held.lease == old
            leaders_view = store.fenced(PULSAR_KEY, key.version - 1)

            # No new lease until the test says so: what happens without one is seen whole.
            granting = asyncio.Event()
            grant = store._grant

            async def held_back(limit: float) -> None:
                await granting.wait()
                await grant(limit)

            monkeypatch.setattr(store, "_grant", held_back)
            t_revoke = time.time()
            logs_seen = len(info_logs)
            await raw.revoke_lease(old)  # as etcd does when the lease expires
            revoked = await revision(raw)
            # It steps down at once (its key went with the lease: its vote is lost) or when
            # etcd answers a keep-alive of that lease (the session is LOST), and says why.
            await until(
                events_of(daemon).decided,
                lambda: (
                    Reason.SESSION_LOST
                    in [d.reason for d in daemon.state.decisions if d.at >= t_revoke]
                ),
                "session lost",
                SESSION,
            )
            assert not daemon.state.is_leader
            since = [d for d in daemon.state.decisions if d.at >= t_revoke]
            step_down = since[0]
            # A fenced write of the leader (a check's, the recovery delay's) may be refused
            # first: leadership lost all the same, and said so.
            assert step_down.reason in (Reason.VOTE_LOST, Reason.SESSION_LOST, Reason.FENCED_OUT)
            logged = [e for e in info_logs[logs_seen:] if "action" in e and "reason" in e]
            assert logged[0]["reason"] == str(step_down.reason)
            assert str(Reason.SESSION_LOST) in [e["reason"] for e in logged]
            with pytest.raises(FencedOutError):
                await leaders_view.set(f"{BASE}/auditorelection", b"late")
            with pytest.raises(FencedOutError):
                await leaders_view.create(f"{BASE}/late", b"")
            assert await raw.get(PULSAR_KEY.encode()) is None
            assert await raw.get(lock.encode()) is None
            assert await revision(raw) == revoked  # nothing written without a lease

            granting.set()
            await until(
                events_of(daemon).decided, lambda: daemon.state.is_leader, "leads again", 10
            )
            new = store.session
            assert new not in (None, old)
            await wait_key(meta, lock, present=True)
            # Every write after the loss is the new session's: the first ones are its
            # leader key and its lock, both on the new lease.
            events = await history(raw, revoked)
            first = [e for e in events if e.type == rpc.Event.PUT][:2]
            assert sorted(described(first)) == sorted([("PUT", PULSAR_KEY), ("PUT", lock)])
            assert {int(e.kv.lease) for e in first} == {new}
            got = await raw.get(PULSAR_KEY.encode())
            assert got is not None and (got.value, got.lease) == (b'"w-a:3181"', new)
            got = await raw.get(lock.encode())
            assert got is not None and (got.value, got.lease) == (b'bookieId: "worker-host"\n', new)


# --- an unreachable etcd -------------------------------------------------------------------


def _run(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "auditor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc, time.monotonic() - t0


@pytest.mark.parametrize(
    "uri",
    ["metadata-store:etcd:http://127.0.0.1:{port}", "etcd://127.0.0.1:{port}/ledgers"],
    ids=["pulsar", "bookkeeper"],
)
def test_an_unreachable_etcd_is_one_line_exit_3(uri: str) -> None:
    port = free_port()
    proc, elapsed = _run(
        "ledgers", "--metadata-service-uri", uri.format(port=port), "--timeout", "2"
    )
    assert proc.returncode == 3
    assert proc.stderr.splitlines() == [
        f"bk-auditor: error: cannot connect to etcd at http://127.0.0.1:{port} within 2s"
    ]
    assert elapsed < 10


def test_marking_on_bookkeepers_etcd_driver_is_refused_before_connecting() -> None:
    proc, elapsed = _run(
        "check",
        "replicas",
        "--mark",
        "--metadata-service-uri",
        f"etcd://127.0.0.1:{free_port()}/ledgers",
    )
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("bk-auditor: error: --mark: BookKeeper's etcd driver (etcd://) has no ")
    assert "under-replication manager" in line
    assert elapsed < 10  # no connection attempt (etcd is not there)


async def _leader_value(meta: EtcdStore, values: set[bytes], within: float) -> bytes:
    """Waits, on watches, until Pulsar's leader key holds one of `values`."""

    async def look() -> tuple[bytes, asyncio.Event]:
        try:
            data, _, changed = await meta.get_watched(PULSAR_KEY)
        except NoNodeError:
            _, changed = await meta.exists_watched(PULSAR_KEY)
            return b"", changed
        return data, changed

    return await until_watched(look, values.__contains__, within, f"a leader among {values}")


async def test_sigterm_hands_the_leader_key_over_within_5s_and_exits_0(
    server: EtcdServer, meta: EtcdStore
) -> None:
    """Two `bk-auditor run` processes on Pulsar's driver on etcd: SIGTERM to the leader
    deletes its key (and revokes its lease) at once, so the other leads within 5 s, not
    after the lease's TTL; the process exits 0."""
    await ClusterWriter(meta, ROOT).init_cluster()
    procs: dict[bytes, asyncio.subprocess.Process] = {}
    try:
        for name in ("gamma", "delta"):
            identity = f"{name}:{free_port()}"
            procs[encode_pulsar_leader(identity)] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "auditor", "run",
                "--set", f"daemon.metadata_service_uri=metadata-store:etcd:{server.endpoint}",
                "--set", f"daemon.identity={identity}",
                "--set", "daemon.zk_session_timeout=30",  # a lease that outlives the test
                "--set", "api.host=127.0.0.1", "--set", "api.port=0",
                "--set", "metrics.enabled=false",
                "--set", "daemon.jitter=0", "--set", "worker.enabled=false",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        first = await _leader_value(meta, set(procs), 30)
        (other,) = set(procs) - {first}
        t0 = time.monotonic()
        procs[first].send_signal(signal.SIGTERM)
        assert await _leader_value(meta, {other}, 5) == other
        assert time.monotonic() - t0 < 5
        assert await asyncio.wait_for(procs[first].wait(), 15) == 0
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
