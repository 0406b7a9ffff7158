"""Real Java AutoRecovery (`AutoRecoveryMain`) and our daemons in one real cluster.

Every process is the real thing: BookKeeper 4.17.2's bookies, its AutoRecovery (auditor
elector and replication worker, `tests/interop/javaar.py`), its shell and client, and
`bk-auditor run` as deployed (a child process). What one side writes, the other reads:

* one auditor at a time, whichever side holds the oldest vote, and each side's
  `whoisauditor` names the other's auditor; the leader stops (or crashes), the other
  side leads;
* the marks either auditor writes are listed by the other side's tool, missing replicas
  (and lock holders) included, and repaired by the other side's worker, open and empty
  ledgers too: every entry reads back through the Java client, the new bookie holds its
  entries, no ensemble names the lost bookie, an open ledger's writer is fenced;
* the shared locks: with both workers at the same marks, each ledger's metadata is
  rewritten exactly once for the one bookie it lost (an open one also recovered once),
  and each ledger is repaired by exactly one of the two workers.

Java's AutoRecovery always runs its worker beside its auditor. So where our worker must
be the one to repair Java's marks, the Java process is stopped before a spare bookie
exists (until then no worker can repair anything); where Java's worker must repair ours,
our daemon runs with `worker.enabled=false`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import pytest

from auditor.daemon.election import current_auditor, election_path
from auditor.metadata.elections import pulsar_leader_path
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.replication import ReplicationQueue
from auditor.metadata.schedule import stores_entry
from auditor.metadata.serde import decode_ledger_metadata
from auditor.metadata.underreplication import (
    UnderreplicatedLedger,
    UnderreplicationManager,
    ur_ledger_path,
)
from auditor.testing.cli import bk
from auditor.testing.watching import until_watched
from auditor.testing.zkserver import free_port
from auditor.zk import ZkClient
from tests.interop.conftest import MakeCluster
from tests.interop.javaar import JavaAutoRecovery
from tests.interop.realbk import RealCluster

#: Our daemons' ZooKeeper session (seconds): a daemon stopped by SIGTERM closes it anyway.
SESSION = 10.0
#: What Java's auditor logs when it becomes the auditor (`Auditor.start`).
JAVA_LEADS = "I'm starting as Auditor Bookie. ID: "
#: What Java's worker logs for a ledger it repaired and unmarked, and for a failed try.
JAVA_REPAIRED = re.compile(r"Ledger replicated successfully\. ledger id is: (\d+)$", re.M)
JAVA_FAILED = re.compile(r"failed to replicate Ledger : (\d+) for \d+ number of times", re.M)
IS_LEADER = "bookkeeper_auditor_is_leader"
ELECTED = "bookkeeper_auditor_leader_elected"


@dataclass
class OurDaemon:
    """One `bk-auditor run` child process."""

    proc: asyncio.subprocess.Process
    identity: str
    metrics_port: int

    def scrape(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())

    def sample(self, name: str) -> float | None:
        """One series of its metrics, labels included as exposed (`name{reason="x"}`);
        None until the endpoint serves."""
        try:
            text = self.scrape()
        except OSError:
            return None
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else None

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        return await asyncio.wait_for(self.proc.wait(), 30)


def log_file(cluster: RealCluster, name: str) -> BinaryIO:
    """A log for a child process, in the cluster's directory (the child keeps its copy)."""
    return open(cluster.workdir / name, "ab")


@contextlib.asynccontextmanager
async def our_daemons(
    cluster: RealCluster,
) -> AsyncIterator[Callable[..., Awaitable[OurDaemon]]]:
    """Starts `bk-auditor run` daemons on `cluster` (`start(name, *sets)`); every one still
    running at the end is killed."""
    started: list[OurDaemon] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("BK_AUDITOR_")}

    async def start(name: str, *sets: str) -> OurDaemon:
        api, metrics = free_port(), free_port()
        identity = f"{name}:{api}"
        holder = f"bk-auditor-{name}"
        args = [
            "run",
            "--set", f"daemon.metadata_service_uri={cluster.uri}",
            "--set", f"daemon.identity={identity}",
            "--set", f"daemon.zk_session_timeout={SESSION}",
            "--set", "daemon.jitter=0",
            "--set", "api.host=127.0.0.1", "--set", f"api.port={api}",
            "--set", "metrics.host=127.0.0.1", "--set", f"metrics.port={metrics}",
            "--set", "logging.format=json",
            "--set", f"worker.lock_holder={holder}",
            # As the Java AutoRecovery's TEST_SETTINGS: only the lost-bookie audit.
            "--set", "lostBookieRecoveryDelay=0",
            "--set", "auditorPeriodicBookieCheckInterval=60",
            "--set", "auditorPeriodicCheckInterval=0",
            "--set", "auditorPeriodicPlacementPolicyCheckInterval=0",
            "--set", "auditorReplicasCheckInterval=0",
            "--set", "underreplicatedLedgerRecoveryGracePeriod=0",
            "--set", "rwRereplicateBackoffMs=500",
            "--set", "lockReleaseOfFailedLedgerGracePeriod=1600",
            "--set", "openLedgerRereplicationGracePeriod=1000",
            "--set", "readEntryTimeout=2",
            "--set", "checks.retry_delay=0.5",
            "--set", "selftest.enabled=false",
            *sets,
        ]  # fmt: skip
        with log_file(cluster, f"daemon-{name}.log") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "auditor", *args,
                stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL, env=env,
            )  # fmt: skip
        daemon = OurDaemon(proc, identity, metrics)
        started.append(daemon)
        return daemon

    try:
        yield start
    finally:
        for d in started:
            if d.proc.returncode is None:
                d.proc.kill()
            await d.proc.wait()


@contextlib.contextmanager
def logs_on_failure(cluster: RealCluster) -> Iterator[None]:
    """A failing test prints the tail of every log of the cluster's processes (the
    directory goes with the cluster)."""
    try:
        yield
    except BaseException:
        for log in sorted(cluster.workdir.rglob("*.log")):
            lines = log.read_text(errors="replace").splitlines()
            print(f"===== {log.name} =====", *lines[-60:], sep="\n")
        raise


@contextlib.asynccontextmanager
async def sides(
    cluster: RealCluster, **java_settings: object
) -> AsyncIterator[tuple[ZkClient, Callable[..., Awaitable[OurDaemon]], JavaAutoRecovery]]:
    """A ZooKeeper client on the cluster, the starter of our daemons, and one Java
    AutoRecovery (not started); at the end every process is killed, and a failure
    prints their logs."""
    java = JavaAutoRecovery(cluster.cluster, cluster.workdir, settings=java_settings)
    with logs_on_failure(cluster):
        try:
            async with (
                our_daemons(cluster) as start,
                ZkClient(cluster.zk_hosts, timeout=10.0) as zk,
            ):
                yield zk, start, java
        finally:
            java.kill()


# --- watching ZooKeeper -------------------------------------------------------------------


async def leader_becomes(zk: ZkClient, root: str, leader: str, within: float = 30) -> None:
    """Until BookKeeper's `getCurrentAuditor` (the oldest vote) names `leader`."""
    path = election_path(root)

    async def look() -> tuple[str | None, asyncio.Event]:
        await zk.ensure_path(path)
        _, changed = await zk.get_children_watched(path)
        return await current_auditor(zk, root), changed

    await until_watched(look, lambda seen: seen == leader, within, f"{leader} leads")


async def leader_key_names(zk: ZkClient, root: str, leader: str, within: float = 30) -> None:
    """Until Pulsar's leader key holds `leader` as Pulsar's JSON serde writes it."""
    path = pulsar_leader_path(root)

    async def look() -> tuple[bytes | None, asyncio.Event]:
        stat, changed = await zk.exists_watched(path)
        if stat is None:
            return None, changed
        try:
            data, _ = await zk.get(path)
        except Exception:  # gone between the two reads: look again on the watch
            return None, changed
        return data, changed

    want = json.dumps(leader).encode()
    await until_watched(look, lambda seen: seen == want, within, f"Pulsar's key names {leader}")


async def voters_become(zk: ZkClient, root: str, voters: set[str], within: float = 30) -> None:
    """Until the election's votes are exactly those of `voters` (by the ids they carry)."""
    path = election_path(root)

    async def look() -> tuple[set[str], asyncio.Event]:
        await zk.ensure_path(path)
        children, changed = await zk.get_children_watched(path)
        ids = set()
        for child in children:
            with contextlib.suppress(Exception):
                data, _ = await zk.get(f"{path}/{child}")
                ids.add(data.decode())
        return ids, changed

    want = {f'bookieId: "{v}"\n' for v in voters}
    await until_watched(look, lambda seen: seen == want, within, f"the votes of {voters}")


async def election_names(zk: ZkClient, root: str, leader: str, within: float = 30) -> None:
    """Until the election znode's own data (what each new leader writes there) names
    `leader`."""
    path = election_path(root)

    async def look() -> tuple[bytes, asyncio.Event]:
        data, _, changed = await zk.get_watched(path)
        return data, changed

    want = f'bookieId: "{leader}"\n'.encode()
    await until_watched(look, lambda seen: seen == want, within, f"the election names {leader}")


async def until_true(probe: Callable[[], bool], what: str, within: float = 30) -> None:
    """For what no watch can tell (a process's metrics): looks every 0.2 s until `within`."""
    deadline = asyncio.get_running_loop().time() + within
    while not probe():
        assert asyncio.get_running_loop().time() < deadline, f"not within {within}s: {what}"
        await asyncio.sleep(0.2)


# --- the tools of each side ---------------------------------------------------------------


async def java_whoisauditor(cluster: RealCluster) -> str:
    """BookieShell `whoisauditor`: the id it logs as `Auditor: <id>`."""
    out = await asyncio.to_thread(cluster.shell, "whoisauditor")
    found = re.findall(r"WhoIsAuditorCommand@\d+\] - Auditor: (\S+)$", out, re.M)
    assert len(found) == 1, out[-2000:]
    return str(found[0])


async def our_whoisauditor(cluster: RealCluster) -> str:
    code, out, err = await bk(
        "whoisauditor", "--metadata-service-uri", cluster.uri, "--json", within=60
    )
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 1, out
    doc = json.loads(lines[0])
    assert doc["election"] == "bookkeeper", doc
    return str(doc["auditor"])


async def both_name(cluster: RealCluster, auditor: str) -> None:
    """BookKeeper's shell and ours, at once, name `auditor`."""
    named = await asyncio.gather(java_whoisauditor(cluster), our_whoisauditor(cluster))
    assert list(named) == [auditor, auditor]


# --- 1. one auditor at a time ---------------------------------------------------------------


async def test_one_auditor_whichever_side_wins(real_cluster: MakeCluster) -> None:
    """Ours votes first and leads, Java's queues behind; ours stops and Java's leads; a new
    daemon of ours queues behind it; Java's crashes and, once its session expires, ours
    leads. At each step exactly one auditor runs, the election's own znode names it (each
    new leader writes its id there, as Java's does), and both sides' `whoisauditor` name
    it."""
    # One bookie: Java's auditor exits at start in a cluster where no bookie ever
    # registered (no `cookies` znode to list), and nothing else here needs one.
    cluster = real_cluster("sorted")
    root = cluster.ledgers_root
    # A 4 s session: a crashed Java AutoRecovery's vote goes 4 s after its last heartbeat.
    async with sides(cluster, zkTimeout=4000) as (zk, start, java):
        first = await start("ours-1")
        await leader_becomes(zk, root, first.identity)
        await until_true(lambda: first.sample(IS_LEADER) == 1, "ours leads")
        await election_names(zk, root, first.identity)

        await asyncio.to_thread(java.start)
        await voters_become(zk, root, {first.identity, java.bookie_id})
        # Java's elector waits behind our vote: it never started its auditor.
        assert JAVA_LEADS not in java.log_text()
        await both_name(cluster, first.identity)

        # Ours stops: its vote goes with its session, and Java's auditor starts.
        assert await first.stop() == 0
        await leader_becomes(zk, root, java.bookie_id)
        await election_names(zk, root, java.bookie_id)
        await both_name(cluster, java.bookie_id)
        assert java.log_text().count(JAVA_LEADS) == 1

        # A new daemon of ours queues behind Java's vote: it sees an auditor, is none.
        second = await start("ours-2")
        await voters_become(zk, root, {java.bookie_id, second.identity})
        await until_true(lambda: second.sample(ELECTED) == 1, "ours sees an auditor")
        assert second.sample(IS_LEADER) == 0

        # Java's crashes (SIGKILL): its vote stays until its session expires, then ours leads.
        await asyncio.to_thread(java.kill)
        await leader_becomes(zk, root, second.identity)
        await until_true(lambda: second.sample(IS_LEADER) == 1, "ours leads again")
        await election_names(zk, root, second.identity)
        await both_name(cluster, second.identity)
        assert java.log_text().count(JAVA_LEADS) == 1


# --- 2 and 3: each side lists and repairs the other's marks --------------------------------

PASSWORD = "secret"
#: (ensemble, write quorum, ack quorum, digest, entries, closed): every shape on all three
#: bookies, two still open (their writer holds them), two empty, and one (E2) that the
#: lost bookie is no member of.
SHAPES = [
    (3, 2, 2, "CRC32", 20, True),
    (3, 3, 2, "MAC", 10, True),
    (3, 2, 1, "CRC32C", 7, True),
    (3, 2, 2, "CRC32", 7, False),
    (3, 2, 2, "CRC32", 0, True),
    (3, 3, 2, "CRC32", 0, False),
    (2, 2, 2, "CRC32", 10, True),
]
#: A ledger id whose mark uses all four levels of the hierarchy (0001/0007/0000/3039).
BIG = (1 << 48) + (7 << 32) + 12345
#: What the writer of a recovered ledger gets for its next add: BKException.Code's
#: LedgerFencedException, or LedgerClosedException when its handle saw the recovery's
#: close in the metadata first.
WRITER_SHUT_OUT = {-101, -11}


@dataclass(frozen=True)
class Written:
    ledger: int
    ensemble: int
    write: int
    digest: str
    entries: int
    closed: bool


def write_ledgers(cluster: RealCluster) -> list[Written]:
    """The SHAPES, by the real Java client."""
    written = []
    for ensemble, write, ack, digest, entries, closed in SHAPES:
        answer = cluster.client.ok(
            "create",
            ensemble=ensemble,
            write=write,
            ack=ack,
            digest=digest,
            password=PASSWORD,
            entries=entries,
            close=closed,
        )
        written.append(Written(int(answer["ledger"]), ensemble, write, digest, entries, closed))
    return written


def ledger_znode(root: str, ledger: int) -> str:
    """The hierarchical ledger manager's znode of a small ledger id."""
    return f"{root}/00/0000/L{ledger:04d}"


async def metadata(zk: ZkClient, root: str, ledger: int) -> tuple[LedgerMetadata, int]:
    """A ledger's metadata as stored, and the znode's version (one more per rewrite)."""
    data, stat = await zk.get(ledger_znode(root, ledger))
    return decode_ledger_metadata(data, ledger), int(stat.version)


async def marks_become(
    zk: ZkClient, root: str, want: dict[int, list[str]], within: float = 60
) -> dict[int, UnderreplicatedLedger]:
    """Until the marks are exactly `want` (ledger: its missing replicas), woken by a
    persistent watch on the under-replication tree; the marks as they are then."""
    urm = UnderreplicationManager(zk, root)
    tree = f"{urm.base}/ledgers"
    await zk.ensure_path(tree)
    changes = await zk.watch_tree(tree)
    deadline = asyncio.get_running_loop().time() + within
    try:
        while True:
            listing = await urm.read_marks()
            assert listing.corrupt == []
            marks = listing.by_id()
            seen = {ledger: sorted(m.replicas) for ledger, m in marks.items()}
            if seen == want:
                return marks
            left = deadline - asyncio.get_running_loop().time()
            assert left > 0, f"marks {want} not within {within}s (now {seen})"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changes.get(), min(left, 1.0))
            while not changes.empty():
                changes.get_nowait()
    finally:
        await zk.unwatch_tree(tree)


async def java_listunderreplicated(cluster: RealCluster, *flags: str) -> list[str]:
    """BookieShell `listunderreplicated FLAGS`: the lines the command logs, tabs kept."""
    out = await asyncio.to_thread(cluster.shell, "listunderreplicated", *flags)
    return re.findall(r"ListUnderReplicatedCommand@\d+\] - (.*)$", out, re.M)


def by_ledger(lines: list[str]) -> tuple[dict[int, list[str]], int]:
    """`listunderreplicated`'s lines as {ledger: the lines under it} (it walks the marks'
    hierarchy in ZooKeeper's child order, not by id) and the count it ends with."""
    *body, last = lines
    blocks: dict[int, list[str]] = {}
    under: list[str] = []
    for line in body:
        if line.startswith("\t"):
            under.append(line.strip())
        else:
            under = blocks[int(line)] = []
    found = re.fullmatch(r"Under replicated ledger count: (\d+)", last)
    assert found is not None, lines
    return blocks, int(found.group(1))


def java_listing(
    marks: dict[int, UnderreplicatedLedger],
    *,
    replicas: bool = False,
    holders: dict[int, str] | None = None,
) -> tuple[dict[int, list[str]], int]:
    """What `listunderreplicated` shows of `marks`, as by_ledger gives it: with `-pmr`
    (`replicas`) each missing replica, with `-prw` (`holders`) who holds its lock."""
    blocks = {}
    for ledger, mark in marks.items():
        blocks[ledger] = [f"Ctime : {mark.ctime}"]
        if replicas:
            blocks[ledger] += [f"MissingReplica : {r}" for r in mark.replicas]
        if holders is not None and ledger in holders:
            blocks[ledger].append(f"ReplicationWorkerId : {holders[ledger]}")
    return blocks, len(marks)


async def our_listing(cluster: RealCluster) -> list[dict[str, object]]:
    code, out, err = await bk(
        "list-underreplicated", "--metadata-service-uri", cluster.uri, "--json", within=60
    )
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def lost_bookie(
    cluster: RealCluster, written: list[Written], ensembles: dict[int, set[str]]
) -> str:
    """The bookie of the three that the E2 ledger does not use."""
    (e2,) = (w.ledger for w in written if w.ensemble == 2)
    (lost,) = {b.bookie_id for b in cluster.bookies} - ensembles[e2]
    return lost


async def the_lost_bookie(
    cluster: RealCluster, zk: ZkClient, written: list[Written]
) -> tuple[dict[int, tuple[LedgerMetadata, int]], str, set[int]]:
    """Each ledger's metadata and version as written, the bookie a test will lose (the
    one the E2 ledger does not use: `lost_bookie`), and the ledgers that have it."""
    root = cluster.ledgers_root
    before = {w.ledger: await metadata(zk, root, w.ledger) for w in written}
    ensembles = {ledger: md.bookies() for ledger, (md, _) in before.items()}
    lost = lost_bookie(cluster, written, ensembles)
    return before, lost, {ledger for ledger, bookies in ensembles.items() if lost in bookies}


async def assert_holds(cluster: RealCluster, md: LedgerMetadata, bookie: str) -> None:
    """`bookie` holds every entry the ledger's ensembles give it, as it says itself
    (GET_LIST_OF_ENTRIES_OF_LEDGER through the Java client): the copy happened, not only
    the metadata's swap. (Java's worker may copy more: with E > W it writes the whole
    range to the new bookie.)"""
    owned = {
        entry
        for seg in md.segment_ranges()
        if bookie in seg.bookies
        for entry in range(seg.first, seg.last + 1)
        if stores_entry(seg.bookies.index(bookie), entry, md.ensemble_size, md.write_quorum)
    }
    if not owned:
        return
    listed = await asyncio.to_thread(
        cluster.client.ok, "list", bookie=bookie, ledger=md.ledger_id, last=md.last_entry_id
    )
    assert owned <= set(listed["entries"]), (md.ledger_id, bookie, listed)


async def assert_repaired(
    cluster: RealCluster,
    zk: ZkClient,
    written: list[Written],
    versions: dict[int, int],
    lost: str,
    spare: str,
    segments: dict[int, int] | None = None,
) -> None:
    """Every entry reads back through the Java client; every ledger that had the lost
    bookie now has the spare in its place, holding its entries, its metadata rewritten
    exactly once (an open ledger: recovered first, once, and its writer fenced), or once
    per segment the lost bookie was in where `segments` counts them (both workers commit
    each segment's new ensemble as a write of its own)."""
    root = cluster.ledgers_root
    for w in written:
        read = await asyncio.to_thread(
            cluster.client.ok, "read", ledger=w.ledger, digest=w.digest, password=PASSWORD
        )
        assert (read["entries"], read["mismatched"]) == (w.entries, []), w
        md, version = await metadata(zk, root, w.ledger)
        assert lost not in md.bookies(), w
        if w.ledger in versions:
            assert spare in md.bookies(), w
            await assert_holds(cluster, md, spare)
            # A closed ledger: one rewrite (the ensemble). An open one: two more before it,
            # the recovery's (IN_RECOVERY, then CLOSED), as Java's worker does it.
            rewrites = (segments or {}).get(w.ledger, 1) + (0 if w.closed else 2)
            assert version == versions[w.ledger] + rewrites, (w, md.segments)
        if not w.closed:
            # Recovered: closed at the writer's last entry, and the writer is fenced.
            assert (md.closed, md.last_entry_id) == (True, w.entries - 1), w
            add = await asyncio.to_thread(cluster.client.call, "add", ledger=w.ledger)
            assert not add["ok"] and add["code"] in WRITER_SHUT_OUT, add


async def assert_serves_alone(
    cluster: RealCluster, written: list[Written], repaired: set[int], spare: str
) -> None:
    """With every other bookie stopped, the spare alone serves the repaired closed
    ledgers that store every entry on every member (W = E): each entry of them is read,
    its digest checked, from the copy the worker wrote (with others up, a bad copy would
    go unnoticed: the client reads the next replica)."""
    for bookie in cluster.bookies:
        if bookie.bookie_id != spare:
            await asyncio.to_thread(bookie.stop)
    whole = [
        w
        for w in written
        if w.ledger in repaired and w.closed and w.entries and w.write == w.ensemble
    ]
    assert whole
    for w in whole:
        read = await asyncio.to_thread(
            cluster.client.ok, "read", ledger=w.ledger, digest=w.digest, password=PASSWORD
        )
        assert (read["entries"], read["mismatched"]) == (w.entries, []), w


async def test_java_lists_our_marks_and_its_worker_repairs_them(
    real_cluster: MakeCluster,
) -> None:
    """Our auditor leads (our worker off). A bookie stops: our marks name it; Java's shell
    lists them (and one of a ledger id with every hierarchy level in use), with `-pmr`
    their missing replicas, with `-c` their count, with `-prw` the holder of the lock our
    replication queue took on one. Java's AutoRecovery starts and
    follows; with no spare bookie its worker cannot repair. A spare starts: Java's worker
    repairs every marked ledger."""
    cluster = real_cluster("sorted", "sorted", "sorted")
    root = cluster.ledgers_root
    written = await asyncio.to_thread(write_ledgers, cluster)
    async with sides(cluster) as (zk, start, java):
        before, lost, on_lost = await the_lost_bookie(cluster, zk, written)
        assert len(on_lost) == len(SHAPES) - 1

        ours = await start("ours", "--set", "worker.enabled=false")
        await leader_becomes(zk, root, ours.identity)
        await asyncio.to_thread(cluster.bookie(lost).stop)
        marks = await marks_become(zk, root, {ledger: [lost] for ledger in on_lost})
        assert all(m.ctime > 0 for m in marks.values())

        # Beside them, a mark as our auditor writes it for a ledger id that uses every
        # level of the marks' hierarchy and more than ten digits, missing two bookies.
        urm = UnderreplicationManager(zk, root)
        await urm.mark_underreplicated(BIG, [lost, "10.0.0.9:3181"])
        big = await urm.get(BIG)
        assert big is not None
        listed = {**marks, BIG: big}
        # One marked ledger locked as our worker locks it (no worker runs yet: the
        # listing holds still).
        queue = ReplicationQueue(zk, root, "bk-auditor-test-worker")
        taken = await queue.take()
        assert taken is not None
        try:
            plain, with_replicas, count, with_holder = await asyncio.gather(
                java_listunderreplicated(cluster),
                java_listunderreplicated(cluster, "-pmr"),
                java_listunderreplicated(cluster, "-c"),
                java_listunderreplicated(cluster, "-prw"),
            )
        finally:
            await queue.close()
        assert by_ledger(plain) == java_listing(listed)
        assert by_ledger(with_replicas) == java_listing(listed, replicas=True)
        assert by_ledger(count) == ({}, len(listed))
        holders = {taken.ledger_id: "bk-auditor-test-worker"}
        assert by_ledger(with_holder) == java_listing(listed, holders=holders)
        await zk.delete(ur_ledger_path(urm.base, BIG))  # no such ledger: not for a worker

        await asyncio.to_thread(java.start)
        await voters_become(zk, root, {ours.identity, java.bookie_id})
        # No spare bookie: Java's worker tries, fails, and the marks stay.
        await until_true(lambda: bool(JAVA_FAILED.search(java.log_text())), "Java's worker tried")
        assert set(map(int, JAVA_FAILED.findall(java.log_text()))) <= on_lost
        assert await marks_become(zk, root, {ledger: [lost] for ledger in on_lost}) == marks
        assert JAVA_REPAIRED.findall(java.log_text()) == []

        spare = await asyncio.to_thread(cluster.add_bookie, "sorted")
        await marks_become(zk, root, {})
        versions = {ledger: before[ledger][1] for ledger in on_lost}
        await assert_repaired(cluster, zk, written, versions, lost, spare.bookie_id)
        # Java's worker repaired each ledger once; ours never ran; ours still leads.
        assert sorted(map(int, JAVA_REPAIRED.findall(java.log_text()))) == sorted(on_lost)
        assert ours.sample("bookkeeper_auditor_worker_running") == 0
        assert ours.sample(IS_LEADER) == 1
        assert JAVA_LEADS not in java.log_text()
        # Both sides stopped (else the bookies stopped next would be audited and
        # repaired): the copies Java's worker wrote are read alone.
        await asyncio.gather(ours.stop(), asyncio.to_thread(java.stop))
        await assert_serves_alone(cluster, written, on_lost, spare.bookie_id)


async def test_we_list_javas_marks_and_our_worker_repairs_them(
    real_cluster: MakeCluster,
) -> None:
    """Java's auditor leads, our daemon follows. A bookie stops: Java's marks name it; our
    `list-underreplicated` lists them as Java wrote them. Java's AutoRecovery, auditor and
    worker, then stops (there is no way to run its auditor without its worker, which
    would race ours to the marks); a spare starts: our worker repairs Java's marks."""
    cluster = real_cluster("sorted", "sorted", "sorted")
    root = cluster.ledgers_root
    written = await asyncio.to_thread(write_ledgers, cluster)
    async with sides(cluster) as (zk, start, java):
        before, lost, on_lost = await the_lost_bookie(cluster, zk, written)

        await asyncio.to_thread(java.start)
        await leader_becomes(zk, root, java.bookie_id)
        ours = await start("ours")
        await voters_become(zk, root, {java.bookie_id, ours.identity})
        await until_true(lambda: ours.sample(ELECTED) == 1, "ours sees Java's auditor")

        await asyncio.to_thread(cluster.bookie(lost).stop)
        marks = await marks_become(zk, root, {ledger: [lost] for ledger in on_lost})
        listed = await our_listing(cluster)
        assert sorted(listed, key=lambda m: str(m["ledger_id"])) == sorted(
            (
                {"ledger_id": ledger, "replicas": [lost], "ctime": marks[ledger].ctime}
                for ledger in on_lost
            ),
            key=lambda m: str(m["ledger_id"]),
        )
        assert all(isinstance(m["ctime"], int) and m["ctime"] > 0 for m in listed)
        # No spare bookie: neither worker can repair (ours says why), the marks stay.
        no_target = 'bookkeeper_auditor_worker_failures_total{reason="no_target"}'
        await until_true(lambda: (ours.sample(no_target) or 0) >= 1, "ours found no target")
        assert await marks_become(zk, root, {ledger: [lost] for ledger in on_lost}) == marks

        await asyncio.to_thread(java.stop)
        await leader_becomes(zk, root, ours.identity)
        spare = await asyncio.to_thread(cluster.add_bookie, "sorted")
        await marks_become(zk, root, {})
        versions = {ledger: before[ledger][1] for ledger in on_lost}
        await assert_repaired(cluster, zk, written, versions, lost, spare.bookie_id)
        assert JAVA_REPAIRED.findall(java.log_text()) == []
        replicated = "bookkeeper_auditor_worker_ledgers_replicated_total"
        assert ours.sample(replicated) == len(on_lost)
        # Ours stopped (else the bookies stopped next would be audited and repaired):
        # the copies our worker wrote are read alone.
        assert await ours.stop() == 0
        await assert_serves_alone(cluster, written, on_lost, spare.bookie_id)


# --- 4. the shared locks --------------------------------------------------------------------


def our_repairs(cluster: RealCluster, name: str) -> list[int]:
    """The ledgers our daemon `name` logged as re-replicated (its JSON log)."""
    log = cluster.workdir / f"daemon-{name}.log"
    repaired = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == "ledger re-replicated":
                repaired.append(int(event["ledger"]))
    return repaired


async def until_unused(zk: ZkClient, root: str, ledger: int, bookie: str) -> None:
    """Until no ensemble of `ledger` names `bookie` (a watch on its metadata)."""

    async def look() -> tuple[set[str], asyncio.Event]:
        data, _, changed = await zk.get_watched(ledger_znode(root, ledger))
        return decode_ledger_metadata(data, ledger).bookies(), changed

    await until_watched(look, lambda bookies: bookie not in bookies, 60, f"{ledger} repaired")


@pytest.mark.parametrize("driver", ["bookkeeper", "pulsar"])
async def test_both_workers_copy_each_ledger_once(real_cluster: MakeCluster, driver: str) -> None:
    """Java's worker and ours at the same marks, a spare bookie ready: the shared locks let
    exactly one of them recover and repair each ledger, so each ledger's metadata is
    rewritten once for the one bookie it lost (an open one: once more for each step of
    its recovery), and between them every marked ledger is repaired once. On BookKeeper's
    driver and on Pulsar's (its leader key; the same marks and locks)."""
    cluster = real_cluster("sorted", "sorted", "sorted", "sorted", driver=driver)
    root = cluster.ledgers_root
    written = []
    for closed in [True] * 8 + [False] * 2:
        answer = await asyncio.to_thread(
            cluster.client.ok,
            "create",
            ensemble=3,
            write=2,
            ack=2,
            digest="CRC32",
            password=PASSWORD,
            entries=10,
            close=closed,
        )
        written.append(Written(int(answer["ledger"]), 3, 2, "CRC32", 10, closed))
    async with sides(cluster) as (zk, start, java):
        before = {w.ledger: await metadata(zk, root, w.ledger) for w in written}
        # The bookie in most ensembles is lost.
        members = [b for md, _ in before.values() for b in md.bookies()]
        lost = max(sorted(set(members)), key=members.count)
        on_lost = {ledger for ledger, (md, _) in before.items() if lost in md.bookies()}

        await asyncio.to_thread(java.start)
        if driver == "pulsar":
            await leader_key_names(zk, root, java.bookie_id)
        else:
            await leader_becomes(zk, root, java.bookie_id)
        ours = await start("ours")
        if driver == "pulsar":
            await until_true(lambda: ours.sample(ELECTED) == 1, "ours sees Java's auditor")
        else:
            await voters_become(zk, root, {java.bookie_id, ours.identity})
        await until_true(lambda: ours.sample("bookkeeper_auditor_worker_running") == 1, "ours")

        await asyncio.to_thread(cluster.bookie(lost).stop)
        for ledger in on_lost:
            await until_unused(zk, root, ledger, lost)
        await marks_become(zk, root, {})
        for w in written:
            read = await asyncio.to_thread(
                cluster.client.ok, "read", ledger=w.ledger, digest=w.digest, password=PASSWORD
            )
            # A ledger still open reads to the last entry its bookies know confirmed: one
            # short of what the writer added (an entry carries the confirmed before it).
            readable = w.entries if w.closed or w.ledger in on_lost else w.entries - 1
            assert (read["entries"], read["mismatched"]) == (readable, []), w
            md, version = await metadata(zk, root, w.ledger)
            old, old_version = before[w.ledger]
            if w.ledger not in on_lost:
                assert (md, version) == (old, old_version)
                continue
            # One rewrite for the lost bookie, replaced by one that was no member; an
            # open ledger was recovered first (IN_RECOVERY, CLOSED), once.
            assert version == old_version + (1 if w.closed else 3), w
            (added,) = md.bookies() - old.bookies()
            assert md.bookies() == old.bookies() - {lost} | {added}
            await assert_holds(cluster, md, added)
            assert (md.closed, md.last_entry_id) == (True, w.entries - 1), w
        by_java = list(map(int, JAVA_REPAIRED.findall(java.log_text())))
        by_ours = our_repairs(cluster, "ours")
        assert sorted(by_java + by_ours) == sorted(on_lost), (by_java, by_ours)
