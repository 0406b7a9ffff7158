"""The replication worker under faults, on a real ZooKeeper with emulated bookies in racks.

Issue 16's safety rule: `kill -9` (or a lost session, or a bookie dying) at any point
leaves the cluster consistent. The metadata names only bookies that hold every entry
of their fragments, the mark stays until the metadata is updated, a copy repeated
after a crash is harmless, and in the end every ledger is repaired exactly as in the
normal case. Each test provokes one fault at a moment chosen from the outside, through
the emulated bookies' own request path (a request held, a bookie crashed on the n-th
request of a kind) or the daemon's ZooKeeper link (cut, or stalled so that what the
daemon sends is kept and never delivered), and asserts the exact outcome: which bytes
each znode holds, which entries each bookie holds and how often each was written.

The six bookies sit two per rack (b0, b3 in /r1; b1, b4 in /r2; b2, b5 in /r3), so the
replacement of a bookie of /r1 in a three-rack ensemble is the other bookie of /r1:
the target of every repair below is known in advance. Daemons that must be killed
with SIGKILL are real `bk-auditor run` processes; the others run in this process (their
state is read directly). The auditor is elsewhere: a Java auditor's vote leads the
election (every daemon runs a worker, leader or not), and the tests mark ledgers
themselves, so that nothing marks a ledger again while it is being repaired (our
auditor would, at once, for a second lost bookie: BookKeeper's rule for several).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from auditor.bookie.protocol import Operation
from auditor.daemon.config import DaemonConfig
from auditor.daemon.election import election_path
from auditor.daemon.metrics import Metrics
from auditor.metadata.model import LedgerMetadata, LedgerState, Segment
from auditor.metadata.paths import ledger_path
from auditor.metadata.registry import unregister_bookie
from auditor.metadata.schedule import write_set
from auditor.metadata.serde import decode_ledger_metadata, encode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager, ur_ledger_path, ur_lock_path
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.testing.bookie import BookieEmulator
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.inprocess import running
from auditor.testing.netproxy import TcpProxy
from auditor.testing.zkserver import ZooKeeperServer
from auditor.worker.state import Failure
from auditor.zk import NoNodeError, ZkClient
from tests.integration.test_worker import wait_replicated, worker_config

ROOT = "/ledgers"
LEDGER = 1
#: Six bookies, two per rack; a seventh (when asked for) makes /r1 three bookies.
RACKS = ["/r1", "/r2", "/r3", "/r1", "/r2", "/r3", "/r1"]
#: The daemons' ZooKeeper session (s): a killed daemon's lock goes this long after it.
SESSION = 4.0
#: Should a daemon lead after all: no check, no audit of lost bookies, no metadata index
#: (the worker is then the only part of a daemon that reads a ledger's metadata). One
#: entry in flight per copy, so that the n-th RECOVERY_ADD a target receives is the n-th
#: entry of the copy.
QUIET = (
    "daemon.metadata_index=false",
    "auditorPeriodicBookieCheckInterval=0",
    "auditorPeriodicCheckInterval=0",
    "auditorPeriodicPlacementPolicyCheckInterval=0",
    "auditorReplicasCheckInterval=0",
    "lostBookieRecoveryDelay=3600",
    "rereplicationEntryBatchSize=1",
    f"daemon.zk_session_timeout={SESSION}",
    "lockReleaseOfFailedLedgerGracePeriod=1600",
)


# --- the cluster --------------------------------------------------------------------------


def racks_file(tmp_path: Path, tc: TestCluster) -> str:
    path = tmp_path / "racks.json"
    path.write_text(json.dumps(dict(zip(tc.ids, RACKS, strict=False))))
    return str(path)


def stored(md: LedgerMetadata, segment: int, position: int) -> list[int]:
    """The entries of one closed segment the bookie at `position` must hold, ascending."""
    seg = list(md.segment_ranges())[segment]
    return [
        e
        for e in range(seg.first, seg.last + 1)
        if position in write_set(e, md.ensemble_size, md.write_quorum)
    ]


@dataclasses.dataclass
class Marked:
    """A ledger written, one of its bookies lost and the ledger marked: what it was."""

    md: LedgerMetadata
    path: str
    data: bytes
    version: int
    mark_path: str
    mark_data: bytes
    mark_version: int


async def lose_and_mark(zk: ZkClient, tc: TestCluster, lid: int, lost: str) -> Marked:
    """Crashes `lost` (unregistered, its data kept to compare with) and marks `lid` as
    the auditor would; returns the ledger's metadata and mark as they are then. A Java
    auditor's vote (in the test's session) leads the election from now on."""
    election = election_path(ROOT)
    await zk.ensure_path(election)
    await zk.create(
        f"{election}/V_", b'bookieId: "java-auditor:3181"\n', ephemeral=True, sequence=True
    )
    emu = tc.by_id(lost)
    if emu.running:
        await emu.crash()
    urm = UnderreplicationManager(zk, ROOT)
    await urm.mark_underreplicated(lid, [lost])
    path = ledger_path(tc.cluster.manager, ROOT, lid)
    data, stat = await zk.get(path)
    mark_path = ur_ledger_path(urm.base, lid)
    mark_data, mark_stat = await zk.get(mark_path)
    for b in tc.bookies:
        b.reset_stats()
    return Marked(
        decode_ledger_metadata(data, lid),
        path,
        data,
        int(stat.version),
        mark_path,
        mark_data,
        int(mark_stat.version),
    )


async def lose_the_first_of_three(zk: ZkClient, tc: TestCluster) -> Marked:
    """The fault tests' common start: LEDGER (30 entries, E3/W2/A2) on the cluster's
    first three bookies, the first of them lost and the ledger marked (`lose_and_mark`)."""
    b = tc.ids
    await tc.writer.write_ledger(
        LEDGER, [b[0], b[1], b[2]], write_quorum=2, ack_quorum=2, num_entries=30
    )
    return await lose_and_mark(zk, tc, LEDGER, b[0])


async def assert_untouched(zk: ZkClient, m: Marked) -> None:
    """The ledger's metadata and its mark are byte for byte what they were."""
    data, stat = await zk.get(m.path)
    assert (data, int(stat.version)) == (m.data, m.version)
    mark, mstat = await zk.get(m.mark_path)
    assert (mark, int(mstat.version)) == (m.mark_data, m.mark_version)


async def assert_consistent(zk: ZkClient, tc: TestCluster, lid: int) -> LedgerMetadata:
    """The safety invariant: every bookie the metadata names for an entry of a closed
    segment holds that entry (lost bookies keep their data in the emulator)."""
    data, _ = await zk.get(ledger_path(tc.cluster.manager, ROOT, lid))
    md = decode_ledger_metadata(data, lid)
    for seg in md.segment_ranges():
        for e in range(seg.first, seg.last + 1):
            for i in write_set(e, md.ensemble_size, md.write_quorum):
                assert tc.by_id(seg.bookies[i]).has_entry(lid, e), (seg.bookies[i], e)
    return md


async def assert_repaired(
    zk: ZkClient, tc: TestCluster, m: Marked, segments: Sequence[Segment], commits: int
) -> None:
    """The end state of a repaired ledger: the metadata is the original with `segments`
    (nothing else changed, `commits` writes), every named bookie holds its entries byte
    for byte as the writer wrote them, and the mark and every lock are gone."""
    data, stat = await zk.get(m.path)
    want = dataclasses.replace(m.md, segments=tuple(segments))
    assert decode_ledger_metadata(data, m.md.ledger_id) == want
    assert data == encode_ledger_metadata(want)
    assert int(stat.version) == m.version + commits
    md = await assert_consistent(zk, tc, m.md.ledger_id)
    lid = m.md.ledger_id
    for seg in md.segment_ranges():
        for e in range(seg.first, seg.last + 1):
            # The same bytes on every bookie that has the entry (copies and originals).
            bodies = {x.entry_body(lid, e) for x in tc.bookies if x.has_entry(lid, e)}
            assert len(bodies) == 1, (lid, e)
    assert await zk.exists(m.mark_path) is None
    assert await zk.get_children(f"{ROOT}/underreplication/locks") == []


# --- moments chosen from the outside ------------------------------------------------------


class Trip:
    """Runs `action` once, inside the emulator's request path, when `emu` receives the
    request `when` picks (called on each request of `op` after it is counted); the
    action's return value is that request's delay. `fired` is set then.

    Held requests (`emu.pause()` in the action, with a delay > 0) stay unanswered
    until `emu.resume()`; a request whose connection has closed meanwhile is dropped.
    """

    def __init__(
        self,
        emu: BookieEmulator,
        op: Operation,
        when: Callable[[pb.Request], bool],
        action: Callable[[pb.Request], float],
    ) -> None:
        self.emu = emu
        self.op = op
        self.fired = asyncio.Event()
        self.when = when
        self.action = action
        emu.set_latency(self._latency, op)

    def _latency(self, request: pb.Request) -> float:
        if self.fired.is_set() or not self.when(request):
            return 0.0
        self.fired.set()
        return self.action(request)

    def clear(self) -> None:
        self.emu.set_latency(None, self.op)
        self.emu.resume()

    async def wait(self, within: float) -> None:
        await asyncio.wait_for(self.fired.wait(), within)


def nth_recovery_add(emu: BookieEmulator, lid: int, n: int) -> Callable[[pb.Request], bool]:
    return lambda _r: emu.recovery_add_requests[lid] >= n


def hold(emu: BookieEmulator) -> Callable[[pb.Request], float]:
    """Holds this request and every later one (until `resume`)."""

    def action(_r: pb.Request) -> float:
        emu.pause()
        return 0.001  # a delayed request meets the pause and is held

    return action


class Crasher:
    """Crashes a bookie from inside its request path: the triggering request is held,
    the bookie's registration is deleted (so the next plan sees it gone), then its
    connections are reset."""

    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk
        self.tasks: set[asyncio.Task[None]] = set()
        self.crashed: list[str] = []

    def action(self, emu: BookieEmulator) -> Callable[[pb.Request], float]:
        def crash(_r: pb.Request) -> float:
            emu.pause()
            self.crashed.append(emu.bookie_id)
            task = asyncio.ensure_future(self._crash(emu))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return 0.001

        return crash

    async def _crash(self, emu: BookieEmulator) -> None:
        await unregister_bookie(self.zk, ROOT, emu.bookie_id)
        await emu.crash()

    async def settled(self) -> None:
        await asyncio.gather(*self.tasks)


class ZkLink:
    """A loopback proxy to ZooKeeper for one daemon, which the test can stall or
    interpose on.

    While stalled, connections stay open but nothing flows: what the daemon sends is
    kept in `kept` (never delivered) and what the server sends is dropped. So the
    daemon's next request can be seen (`sent`) and is certain not to reach ZooKeeper,
    without the daemon noticing anything for a while (a cut would suspend its session
    at once). `flow()` drops every connection and lets new ones through again.

    Otherwise each chunk the daemon sends is first given to `interpose` (when set),
    and forwarded once that returns: the test acts between two of the daemon's
    requests (which ZooKeeper answers in order, one session's at a time).
    """

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._stalled = False
        self.kept = bytearray()
        self._more = asyncio.Event()
        self.interpose: Callable[[bytes], Awaitable[None]] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self._drop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def stall(self) -> None:
        self._stalled = True

    def flow(self) -> None:
        self._stalled = False
        self._drop()

    def _drop(self) -> None:
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    async def sent(self, needle: bytes, within: float) -> None:
        """Returns once the daemon has sent `needle` while stalled."""
        deadline = time.monotonic() + within
        while True:
            self._more.clear()
            if needle in self.kept:
                return
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{needle!r} not sent within {within}s"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._more.wait(), remaining)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        up_writer: asyncio.StreamWriter | None = None
        try:
            if self._stalled:
                await self._pipe(reader, None)
                return
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            self._writers.add(up_writer)
            pipes = [
                asyncio.ensure_future(self._pipe(reader, up_writer)),
                asyncio.ensure_future(self._pipe(up_reader, writer, inbound=True)),
            ]
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            for p in pipes:
                p.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
        except OSError:
            pass
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    self._writers.discard(w)
                    w.transport.abort()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter | None,
        *,
        inbound: bool = False,
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if not self._stalled and not inbound and self.interpose is not None:
                    await self.interpose(bytes(data))
                if not self._stalled and writer is not None:
                    writer.write(data)
                    await writer.drain()
                elif not inbound:
                    self.kept += data
                    self._more.set()


# --- daemons as processes -----------------------------------------------------------------


class DaemonProcess:
    """`bk-auditor run` as deployed, its JSON log lines parsed as they come."""

    def __init__(self, name: str, zk_hosts: str, racks: str, *sets: str) -> None:
        self.name = name
        self.holder = f"{name}-host"
        self.zk_hosts = zk_hosts
        self.sets = [
            "daemon.jitter=0",
            "api.host=127.0.0.1",
            "api.port=0",
            "metrics.host=127.0.0.1",
            "metrics.port=0",
            "logging.format=json",
            "readEntryTimeout=10",
            f"checks.racks_file={racks}",
            "worker.enabled=true",
            f"worker.lock_holder={self.holder}",
            *QUIET,
            *sets,
        ]
        self.proc: asyncio.subprocess.Process | None = None
        self.incarnations = 0
        self.logs: list[dict[str, Any]] = []
        self._reader: asyncio.Task[None] | None = None
        self._more = asyncio.Event()

    async def start(self) -> None:
        args = ["run", "--zk", self.zk_hosts, "--set", f"daemon.identity={self.name}:3181"]
        for s in self.sets:
            args += ["--set", s]
        self.incarnations += 1
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "auditor",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.ensure_future(self._read(self.proc, self.incarnations))

    async def _read(self, proc: asyncio.subprocess.Process, incarnation: int) -> None:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": line.decode(errors="replace").rstrip()}
            if isinstance(event, dict):
                event["incarnation"] = incarnation
                self.logs.append(event)
                self._more.set()

    def events(self, event: str, **fields: object) -> list[dict[str, Any]]:
        return [
            e
            for e in self.logs
            if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
        ]

    async def logged(self, event: str, within: float, **fields: object) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while True:
            self._more.clear()
            if found := self.events(event, **fields):
                return found[0]
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{self.name} did not log {event!r} {fields} in {within}s"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._more.wait(), remaining)

    async def kill(self) -> None:
        """SIGKILL: no goodbye; the lock stays until the session expires."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        await self._drain()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await self._drain()

    async def _drain(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)


@contextlib.asynccontextmanager
async def processes(*daemons: DaemonProcess) -> AsyncIterator[None]:
    try:
        for d in daemons:
            await d.start()
        yield
    finally:
        for d in daemons:
            await d.stop()


# --- ZooKeeper, awaited on watches --------------------------------------------------------


async def until_exists(zk: ZkClient, path: str, exists: bool, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        stat, changed = await zk.exists_watched(path)
        if (stat is not None) == exists:
            return
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{path} {'never made' if exists else 'still there'} in {within}s"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), remaining)


def lock_path(lid: int) -> str:
    return ur_lock_path(f"{ROOT}/underreplication", lid)


def holder(data: bytes) -> str:
    """The holder a lock's `LockDataFormat` names."""
    text = data.decode()
    assert text.startswith('bookieId: "'), text
    return text.split('"')[1]


def in_process(hosts: str, name: str, racks: str, *extra: str) -> DaemonConfig:
    """A daemon in this process; its locks name `<name>-host`."""
    return worker_config(
        hosts, f"{name}:3181", racks, (*QUIET, f"worker.lock_holder={name}-host", *extra)
    )


# --- kill -9 ------------------------------------------------------------------------------


@pytest.mark.slow
async def test_kill_9_mid_copy_leaves_the_ledger_to_the_other_worker(
    zk: ZkClient, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        m = await lose_the_first_of_three(zk, tc)
        lost, target = tc.by_id(b[0]), tc.by_id(b[3])
        wanted = stored(m.md, 0, 0)  # what position 0 holds: 20 entries
        # The sixth entry's RECOVERY_ADD is held: five are on the target, the copy waits.
        trip = Trip(target, Operation.ADD_ENTRY, nth_recovery_add(target, LEDGER, 6), hold(target))
        pair = [DaemonProcess(name, zk.hosts, racks) for name in ("w-a", "w-b")]
        daemons = {d.holder: d for d in pair}
        async with processes(*pair):
            await trip.wait(within=60)
            data, lock = await zk.get(lock_path(LEDGER))
            copying = daemons[holder(data)]
            other = next(d for d in pair if d is not copying)
            await copying.kill()
            # Killed mid-copy: the target holds the first five entries, which no metadata
            # names; the metadata and the mark are untouched, the lock is the dead one's.
            still = await zk.exists(lock_path(LEDGER))
            assert still is not None and still.czxid == lock.czxid
            assert [e for e in wanted if target.has_entry(LEDGER, e)] == wanted[:5]
            assert target.ledger_ids() == [LEDGER]
            await assert_untouched(zk, m)
            await assert_consistent(zk, tc, LEDGER)
            trip.clear()
            # Its lock goes with its session; the mark stays until the other worker
            # has copied and committed.
            await until_exists(zk, lock_path(LEDGER), False, within=SESSION * 4)
            await until_exists(zk, m.mark_path, False, within=60)
            done = await other.logged("ledger re-replicated", within=10, ledger=LEDGER)
            assert done["mark_removed"] is True
        assert_single_copy_per_attempt(target, LEDGER, wanted, repeated=wanted[:6])
        await assert_repaired(zk, tc, m, [Segment(0, (b[3], b[1], b[2]))], commits=1)
        for e in wanted:
            assert target.entry_body(LEDGER, e) == lost.entry_body(LEDGER, e)
        assert copying.events("copying fragments", ledger=LEDGER)
        assert not copying.events("fragments committed")
        [commit] = other.events("fragments committed", ledger=LEDGER)
        assert commit["replaced"] == {b[0]: b[3]}
        assert commit["metadata_version"] == m.version + 1


def assert_single_copy_per_attempt(
    target: BookieEmulator, lid: int, wanted: list[int], repeated: Sequence[int]
) -> None:
    """The target received each entry once per attempt that reached it: twice for
    `repeated` (sent before the fault, sent again after it), once for the others; it
    received nothing else."""
    got = Counter({e: n for (ledger, e), n in target.recovery_adds_per_entry.items()})
    assert all(ledger == lid for ledger, _ in target.recovery_adds_per_entry)
    assert got == Counter({e: 2 if e in repeated else 1 for e in wanted})
    assert target.add_requests.total() == 0


@pytest.mark.slow
async def test_kill_9_between_the_copy_and_the_commit_then_a_restart_finishes(
    zk: ZkClient, zk_server: ZooKeeperServer, zk_hosts: str, tmp_path: Path
) -> None:
    chroot = zk_hosts[len(zk_server.hosts) :]
    proxy = ZkLink(zk_server.hosts)
    await proxy.start()
    try:
        async with test_cluster(zk, 6) as tc:
            b = tc.ids
            racks = racks_file(tmp_path, tc)
            m = await lose_the_first_of_three(zk, tc)
            lost, target = tc.by_id(b[0]), tc.by_id(b[3])
            wanted = stored(m.md, 0, 0)

            # When the last entry reaches the target, the daemon's ZooKeeper link stalls
            # before the acknowledgement leaves: whatever it sends after the copy is
            # kept here, and never reaches ZooKeeper.
            def stall(_r: pb.Request) -> float:
                proxy.stall()
                return 0.0

            trip = Trip(
                target, Operation.ADD_ENTRY, nth_recovery_add(target, LEDGER, len(wanted)), stall
            )
            daemon = DaemonProcess("w-a", proxy.address + chroot, racks)
            async with processes(daemon):
                await trip.wait(within=60)
                # The commit's first step, a read of the ledger's metadata, is sent
                # (and held): the copy is over, the metadata not yet updated. Kill now.
                await proxy.sent(m.path.encode(), within=30)
                await daemon.kill()
                assert [e for e in wanted if target.has_entry(LEDGER, e)] == wanted
                await assert_untouched(zk, m)
                await assert_consistent(zk, tc, LEDGER)
                assert not daemon.events("fragments committed")
                trip.clear()
                proxy.flow()
                # Restarted at once; it takes the ledger once the dead session's lock
                # is gone, copies every entry again (the same bytes) and commits.
                await daemon.start()
                await until_exists(zk, m.mark_path, False, within=60)
                done = await daemon.logged("ledger re-replicated", within=10, ledger=LEDGER)
                assert done["incarnation"] == 2
            assert_single_copy_per_attempt(target, LEDGER, wanted, repeated=wanted)
            await assert_repaired(zk, tc, m, [Segment(0, (b[3], b[1], b[2]))], commits=1)
            for e in wanted:
                assert target.entry_body(LEDGER, e) == lost.entry_body(LEDGER, e)
    finally:
        await proxy.stop()


@pytest.mark.slow
async def test_kill_9_between_the_commit_and_the_unmark_leaves_a_mark_a_restart_removes(
    zk: ZkClient, zk_server: ZooKeeperServer, zk_hosts: str, tmp_path: Path
) -> None:
    chroot = zk_hosts[len(zk_server.hosts) :]
    link = ZkLink(zk_server.hosts)
    await link.start()
    try:
        async with test_cluster(zk, 6) as tc:
            b = tc.ids
            racks = racks_file(tmp_path, tc)
            m = await lose_the_first_of_three(zk, tc)
            lost, target = tc.by_id(b[0]), tc.by_id(b[3])
            wanted = stored(m.md, 0, 0)
            last = Trip(
                target,
                Operation.ADD_ENTRY,
                nth_recovery_add(target, LEDGER, len(wanted)),
                lambda _r: 0.0,
            )
            unmark = asyncio.Event()
            mark, fence = m.mark_path.encode(), lock_path(LEDGER).encode()

            # The fenced delete of the mark (after the copy, the commit and the
            # verification) is kept, never delivered, and the link stalls.
            async def interpose(chunk: bytes) -> None:
                if last.fired.is_set() and mark in chunk and fence in chunk:
                    link.stall()
                    unmark.set()

            link.interpose = interpose
            daemon = DaemonProcess("w-a", link.address + chroot, racks)
            async with processes(daemon):
                await asyncio.wait_for(unmark.wait(), 60)
                await daemon.kill()
                # Committed and verified, not unmarked: the metadata names the new
                # bookie, which holds every entry; the mark is as the auditor wrote it.
                data, stat = await zk.get(m.path)
                repaired = dataclasses.replace(m.md, segments=(Segment(0, (b[3], b[1], b[2])),))
                assert (data, int(stat.version)) == (
                    encode_ledger_metadata(repaired),
                    m.version + 1,
                )
                await assert_consistent(zk, tc, LEDGER)
                mark_data, mark_stat = await zk.get(m.mark_path)
                assert (mark_data, int(mark_stat.version)) == (m.mark_data, m.mark_version)
                assert daemon.events("fragments committed", ledger=LEDGER)
                assert not daemon.events("ledger re-replicated")
                last.clear()
                link.interpose = None
                link.flow()
                # Restarted, it takes the ledger once the dead session's lock is gone,
                # finds every copy in place and removes the mark: nothing copied again.
                await daemon.start()
                await until_exists(zk, m.mark_path, False, within=60)
                done = await daemon.logged(
                    "ledger has every copy; nothing to copy", within=10, ledger=LEDGER
                )
                assert (done["incarnation"], done["unmarked"]) == (2, True)
                assert not daemon.events("copying fragments", incarnation=2)
            assert_single_copy_per_attempt(target, LEDGER, wanted, repeated=())
            await assert_repaired(zk, tc, m, [Segment(0, (b[3], b[1], b[2]))], commits=1)
            for e in wanted:
                assert target.entry_body(LEDGER, e) == lost.entry_body(LEDGER, e)
    finally:
        await link.stop()


# --- the session lost during a copy -------------------------------------------------------


async def test_a_session_expired_during_a_copy_stops_it_and_nothing_is_committed(
    zk: ZkClient, zk_server: ZooKeeperServer, zk_hosts: str, tmp_path: Path
) -> None:
    chroot = zk_hosts[len(zk_server.hosts) :]
    host, port = zk_server.hosts.rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    await proxy.start()
    try:
        async with test_cluster(zk, 6) as tc:
            b = tc.ids
            racks = racks_file(tmp_path, tc)
            m = await lose_the_first_of_three(zk, tc)
            lost, target = tc.by_id(b[0]), tc.by_id(b[3])
            wanted = stored(m.md, 0, 0)

            # At the fifth entry the daemon's ZooKeeper link is cut (its session
            # suspended at once) and the fifth entry is held.
            def cut(r: pb.Request) -> float:
                proxy.cut()
                return hold(target)(r)

            trip = Trip(target, Operation.ADD_ENTRY, nth_recovery_add(target, LEDGER, 5), cut)
            cfg = in_process(proxy.address + chroot, "w-a", racks)
            async with running(cfg) as daemon:
                await trip.wait(within=60)
                await asyncio.wait_for(daemon._disconnected.wait(), 10)
                # The server expires the session: the lock goes, nothing was committed,
                # and the copy stopped with the suspension (no entry after the fifth).
                await until_exists(zk, lock_path(LEDGER), False, within=SESSION * 4)
                await assert_untouched(zk, m)
                await assert_consistent(zk, tc, LEDGER)
                assert [e for e in wanted if target.has_entry(LEDGER, e)] == wanted[:4]
                assert daemon.state.worker.failures == Counter({Failure.LOCK_LOST: 1})
                # The held entry is answered now, to a copy that is no longer there: if
                # it were, the next entries would follow (and count twice below).
                trip.clear()
                proxy.mend()
                # Back on the network with a new session, the worker takes the ledger
                # again and repairs it from the start.
                await wait_replicated([daemon], 1, within=60)
                assert daemon.state.worker.failures == Counter({Failure.LOCK_LOST: 1})
            assert_single_copy_per_attempt(target, LEDGER, wanted, repeated=wanted[:5])
            await assert_repaired(zk, tc, m, [Segment(0, (b[3], b[1], b[2]))], commits=1)
            for e in wanted:
                assert target.entry_body(LEDGER, e) == lost.entry_body(LEDGER, e)
    finally:
        await proxy.stop()


# --- bookies crashing ---------------------------------------------------------------------


async def test_the_target_crashing_mid_copy_sends_the_ledger_to_another_target(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    # Seven bookies: /r1 has b0 (lost), b3 and b6, so either may be the first target
    # and the other is the only one left when it crashes.
    async with test_cluster(zk, 7) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        m = await lose_the_first_of_three(zk, tc)
        lost = tc.by_id(b[0])
        wanted = stored(m.md, 0, 0)
        crasher = Crasher(zk)

        def first_crash(sixth: Callable[[pb.Request], bool]) -> Callable[[pb.Request], bool]:
            return lambda r: not crasher.crashed and sixth(r)

        for t in (tc.by_id(b[3]), tc.by_id(b[6])):
            sixth = first_crash(nth_recovery_add(t, LEDGER, 6))
            Trip(t, Operation.ADD_ENTRY, sixth, crasher.action(t))
        cfg = in_process(zk_hosts, "w-a", racks)
        async with running(cfg) as daemon:
            await wait_replicated([daemon], 1, within=60)
            await crasher.settled()
            w = daemon.state.worker
            assert w.failures == Counter({Failure.TARGET_FAILED: 1})
            assert (w.fragments_replicated, w.ledgers_replicated) == (1, 1)
        [first] = crasher.crashed
        crashed = tc.by_id(first)
        final = tc.by_id(b[6] if first == b[3] else b[3])
        # The crashed target got five entries (the sixth held), and no metadata names it;
        # the other bookie of the rack got every entry once, and the commit.
        assert [e for e in wanted if crashed.has_entry(LEDGER, e)] == wanted[:5]
        assert_single_copy_per_attempt(final, LEDGER, wanted, repeated=())
        await assert_repaired(zk, tc, m, [Segment(0, (final.bookie_id, b[1], b[2]))], commits=1)
        for e in wanted:
            assert final.entry_body(LEDGER, e) == lost.entry_body(LEDGER, e)


async def test_a_source_crashing_mid_copy_the_copy_reads_the_other_replica(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    # E3/W3: every entry on all three bookies, so with b0 lost each entry still has two
    # copies; b1 crashes while the copy of b0's position reads from it, and the copy
    # goes on from b2. Then b1 is lost too, and a second repair replaces it.
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        entries = 30
        await tc.writer.write_ledger(
            LEDGER, [b[0], b[1], b[2]], write_quorum=3, ack_quorum=2, num_entries=entries
        )
        m = await lose_and_mark(zk, tc, LEDGER, b[0])
        lost, source, other = tc.by_id(b[0]), tc.by_id(b[1]), tc.by_id(b[2])
        first_target, second_target = tc.by_id(b[3]), tc.by_id(b[4])
        crasher = Crasher(zk)
        # b1 crashes on a read once the copy has put five entries on the target.
        Trip(
            source,
            Operation.READ_ENTRY,
            nth_recovery_add(first_target, LEDGER, 5),
            crasher.action(source),
        )
        cfg = in_process(zk_hosts, "w-a", racks)
        async with running(cfg) as daemon:
            await wait_replicated([daemon], 1, within=60)
            await crasher.settled()
            w = daemon.state.worker
            # The first attempt copied and committed b0's position, and its
            # verification found b1 lost; the second replaced b1.
            assert w.failures == Counter({Failure.VERIFY_FAILED: 1})
            assert (w.fragments_replicated, w.ledgers_replicated) == (2, 1)
            assert not daemon.state.is_leader  # the Java auditor leads: no mark merged
        assert crasher.crashed == [b[1]]
        # b1 served part of the copy's reads before it crashed, b2 the rest.
        assert 0 < source.received[Operation.READ_ENTRY] < entries
        everything = list(range(entries))
        assert_single_copy_per_attempt(first_target, LEDGER, everything, repeated=())
        assert_single_copy_per_attempt(second_target, LEDGER, everything, repeated=())
        await assert_repaired(zk, tc, m, [Segment(0, (b[3], b[4], b[2]))], commits=2)
        for e in everything:
            body = lost.entry_body(LEDGER, e)
            assert first_target.entry_body(LEDGER, e) == body
            assert second_target.entry_body(LEDGER, e) == body
            assert other.entry_body(LEDGER, e) == body


# --- a writer changing the metadata under the worker --------------------------------------


@pytest.mark.parametrize("moment", ["during the copy", "inside the commit"])
async def test_a_writers_ensemble_change_under_the_worker_is_kept_by_its_commit(
    moment: str,
    zk: ZkClient,
    zk_server: ZooKeeperServer,
    zk_hosts: str,
    tmp_path: Path,
    info_logs: list[MutableMapping[str, Any]],
) -> None:
    # An open ledger: segment 0 (entries 0-11) on b0, b1, b2; the writer's current
    # segment from entry 12 on b1, b2, b3. b0 is lost: segment 0 is repaired while the
    # ledger stays open. The writer adds a segment (a failed write on b2) while the
    # worker copies, or between the commit's read of the metadata and its write: the
    # commit must land on top of the writer's metadata (read again, applied again),
    # never over it.
    chroot = zk_hosts[len(zk_server.hosts) :]
    link = ZkLink(zk_server.hosts)
    await link.start()
    try:
        async with test_cluster(zk, 6) as tc:
            b = tc.ids
            racks = racks_file(tmp_path, tc)
            await tc.writer.write_ledger(
                LEDGER,
                [(0, [b[0], b[1], b[2]]), (12, [b[1], b[2], b[3]])],
                write_quorum=2,
                ack_quorum=2,
                num_entries=20,
                state=LedgerState.OPEN,
            )
            m = await lose_and_mark(zk, tc, LEDGER, b[0])
            lost, target = tc.by_id(b[0]), tc.by_id(b[3])
            wanted = stored(m.md, 0, 0)  # 0, 2, 3, 5, 6, 8, 9, 11
            writer_segment = Segment(20, (b[1], b[5], b[3]))
            changed = asyncio.Event()

            async def writer_change() -> None:
                data, stat = await zk.get(m.path)
                md = decode_ledger_metadata(data, LEDGER)
                new = dataclasses.replace(md, segments=(*md.segments, writer_segment))
                await zk.set(m.path, encode_ledger_metadata(new), int(stat.version))
                changed.set()

            tasks: set[asyncio.Task[None]] = set()
            #: The fenced writes of the ledger's metadata the daemon sent (each names the
            #: ledger and, for the check of the fence, the ledger's replication lock).
            writes: list[bytes] = []
            if moment == "during the copy":

                async def change_then_resume() -> None:
                    await writer_change()
                    target.set_latency(None, Operation.ADD_ENTRY)
                    target.resume()

                def change(_r: pb.Request) -> float:
                    target.pause()  # the copy waits on its third entry meanwhile
                    tasks.add(asyncio.ensure_future(change_then_resume()))
                    return 0.001

                Trip(target, Operation.ADD_ENTRY, nth_recovery_add(target, LEDGER, 3), change)
            else:
                fence = lock_path(LEDGER).encode()

                async def interpose(chunk: bytes) -> None:
                    if m.path.encode() in chunk and fence in chunk:
                        writes.append(chunk)
                        # The commit's write, sent once its read came back: the
                        # writer's write goes first.
                        if len(writes) == 1:
                            await writer_change()

                link.interpose = interpose
            cfg = in_process(link.address + chroot, "w-a", racks)
            async with running(cfg) as daemon:
                await wait_replicated([daemon], 1, within=60)
                await asyncio.gather(*tasks)
                assert changed.is_set()
                w = daemon.state.worker
                assert w.failures == Counter()
                assert (w.fragments_replicated, w.ledgers_replicated) == (1, 1)
            if moment == "inside the commit":
                # Two writes: the first refused (the writer's came first), the second
                # made on the metadata read again.
                assert len(writes) == 2
            [commit] = [e for e in info_logs if e["event"] == "fragments committed"]
            assert commit["replaced"] == {b[0]: b[3]}
            assert commit["metadata_version"] == m.version + 2
            # The writer's segment kept, ours on top: two writes, the ledger still open.
            await assert_repaired(
                zk,
                tc,
                m,
                [Segment(0, (b[3], b[1], b[2])), m.md.segments[1], writer_segment],
                commits=2,
            )
            assert_single_copy_per_attempt(target, LEDGER, wanted, repeated=())
            for e in wanted:
                assert target.entry_body(LEDGER, e) == lost.entry_body(LEDGER, e)
    finally:
        await link.stop()


# --- what cannot be repaired --------------------------------------------------------------

#: Seconds between attempts at an unrecoverable ledger, and the window they are counted in.
UNRECOVERABLE_RETRY = 8
WINDOW = 20.0


@pytest.mark.slow
async def test_an_unrecoverable_ledger_is_reported_kept_marked_and_tried_once_per_backoff(
    zk: ZkClient, zk_hosts: str, tmp_path: Path, info_logs: list[MutableMapping[str, Any]]
) -> None:
    # Write quorum 1 on b0 alone: once b0 is lost, no bookie has any of its entries.
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        entries = 10
        await tc.writer.write_ledger(
            LEDGER, [b[0]], write_quorum=1, ack_quorum=1, num_entries=entries
        )
        m = await lose_and_mark(zk, tc, LEDGER, b[0])
        extra = (f"worker.unrecoverable_retry={UNRECOVERABLE_RETRY}",)
        metrics = {name: Metrics() for name in ("w-a", "w-b")}
        async with (
            running(in_process(zk_hosts, "w-a", racks, *extra), metrics["w-a"]) as a,
            running(in_process(zk_hosts, "w-b", racks, *extra), metrics["w-b"]) as bb,
        ):
            attempts = await lock_takes(zk, lock_path(LEDGER), WINDOW, count=3)
            daemons = {"w-a-host": a, "w-b-host": bb}
            # The third attempt's outcome, before anything is read: a fourth cannot start
            # until a back-off period after the third (the daemons go on running while this
            # test reads; reading only a fixed window's worth later raced the fourth).
            deadline = time.monotonic() + 60
            while sum(d.state.worker.failures.total() for d in daemons.values()) < 3:
                assert time.monotonic() < deadline, "the third attempt never ended"
                await asyncio.sleep(0.05)
            # What follows reads the daemons' state and the log at that one moment (no await
            # between: the daemons run on this loop).
            for name, d in daemons.items():
                w = d.state.worker
                n = sum(1 for _, h in attempts if h == name)
                assert w.failures == (Counter({Failure.UNRECOVERABLE: n}) if n else Counter())
                # Reported in its state (the ranges) and metric by each daemon that tried.
                ranges = {lid: u.ranges for lid, u in w.unrecoverable.items()}
                assert ranges == ({LEDGER: ((0, entries - 1),)} if n else {})
                gauge = metrics[name.removesuffix("-host")].registry.get_sample_value(
                    "bookkeeper_auditor_worker_unrecoverable_ledgers", {}
                )
                assert gauge == (1 if n else 0)
                assert (w.ledgers_replicated, w.fragments_replicated) == (0, 0)
            logged = list(info_logs)
            # Unchanged: nothing was copied, committed or unmarked.
            await assert_untouched(zk, m)
        # At most one attempt per back-off period: three in 20 s, 8 s apart at least.
        assert len(attempts) == 3, attempts
        for (t0, _), (t1, _) in itertools.pairwise(attempts):
            assert t1 - t0 >= UNRECOVERABLE_RETRY - 0.5, attempts
        taken = [
            e
            for e in logged
            if e["event"] == "ledger taken for re-replication" and e["ledger"] == LEDGER
        ]
        assert len(taken) == 3
        reported = [e for e in logged if e["event"] == "ledger not re-replicated"]
        assert [(e["log_level"], e["ledger"], e["reason"], e["detail"]) for e in reported] == [
            (
                "error",
                LEDGER,
                "unrecoverable",
                f"entries with no readable copy anywhere: 0-{entries - 1}; "
                "kept marked for an operator",
            )
        ] * 3
        for emu in tc.bookies:
            assert emu.recovery_add_requests.total() == 0
        # The mark stays for an operator, byte for byte; the locks went with the daemons.
        await assert_untouched(zk, m)
        assert await zk.get_children(f"{ROOT}/underreplication/locks") == []


async def lock_takes(
    zk: ZkClient, path: str, window: float, count: int | None = None
) -> list[tuple[float, str]]:
    """Each creation of the lock at `path` (when, and its holder), from the first one
    until `window` seconds after it, seen on watches; with `count`, until the count-th
    (which must come within the window)."""
    seen: list[tuple[float, str]] = []
    last: int | None = None
    first_by = time.monotonic() + 60
    end: float | None = None
    while True:
        stat, changed = await zk.exists_watched(path)
        now = time.monotonic()
        if stat is not None and stat.czxid != last:
            last = stat.czxid
            with contextlib.suppress(NoNodeError):
                data, _ = await zk.get(path)
                seen.append((now, holder(data)))
                end = end if end is not None else now + window
                if len(seen) == count:
                    assert now <= end, f"{count} takes, not within {window} s: {seen}"
                    return seen
        remaining = (end if end is not None else first_by) - time.monotonic()
        if remaining <= 0:
            assert end is not None, "the ledger was never taken"
            return seen
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), remaining)
