"""Our replication worker on real Apache BookKeeper: `bk-auditor run` (the daemon, its
auditor and its worker, started as an operator starts it, stopped by its pid)
re-replicates what a stopped real bookie held, fences and recovers an open ledger only
after `openLedgerRereplicationGracePeriod`, and `bk-auditor recover` / `decommission`
move a real bookie's ledgers. The real Java client then reads every entry back,
digest-checked (a writer learns it was fenced, another never was), BookieShell shows the
new ensembles and our worker's locks, and BookKeeperAdmin's per-bookie entry lists show
exactly which entries each bookie holds: nothing beyond what its positions hold.

The daemon runs in a child process: the Java client's calls block, and a daemon on the
test's own event loop would stall behind them. ZooKeeper has no event for "the worker is
done", so those waits poll it with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass

from auditor.metadata.schedule import stores_entry
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.store.errors import NoNodeError
from auditor.testing.cli import bk
from auditor.testing.inprocess import FAST
from auditor.zk import ZkClient
from tests.interop.conftest import MakeCluster
from tests.interop.realbk import RealBookie, RealCluster

PASSWORD = "secret"
#: (ensemble, write, ack, digest, entries)
SHAPES = [
    (3, 3, 2, "CRC32", 10),
    (3, 2, 2, "CRC32C", 10),  # E > W: striped
    (3, 3, 2, "MAC", 7),
    (2, 2, 2, "DUMMY", 3),
    (3, 2, 2, "CRC32", 0),  # empty
    (3, 2, 1, "CRC32C", 6),
]
WITHIN = 60.0
CLI_FAST = ("--set", "readEntryTimeout=3", "--set", "checks.retry_delay=0.2")


@dataclass
class Ledger:
    digest: str
    last: int  # last entry id, -1 for none
    ensemble: int
    write: int
    segments: dict[int, list[str]]  # as written


def java_segments(rc: RealCluster, ledger: int) -> dict[int, list[str]]:
    md = rc.client.ok("metadata", ledger=ledger)["metadata"]
    return {int(k): v for k, v in md["ensembles"].items()}


def write_ledgers(rc: RealCluster) -> dict[int, Ledger]:
    out: dict[int, Ledger] = {}
    for e, w, a, digest, entries in SHAPES:
        answer = rc.client.ok(
            "create", ensemble=e, write=w, ack=a, digest=digest, password=PASSWORD, entries=entries
        )
        lid = answer["ledger"]
        out[lid] = Ledger(digest, entries - 1, e, w, java_segments(rc, lid))
    return out


def held(ledger: Ledger, segments: dict[int, list[str]], bookie: str) -> list[int]:
    """The entries `bookie` must hold by round robin, over the ledger's `segments`."""
    firsts = sorted(segments)
    out: list[int] = []
    for i, first in enumerate(firsts):
        last = firsts[i + 1] - 1 if i + 1 < len(firsts) else ledger.last
        ens = segments[first]
        if bookie in ens:
            pos = ens.index(bookie)
            out += [
                e
                for e in range(first, last + 1)
                if stores_entry(pos, e, ledger.ensemble, ledger.write)
            ]
    return out


_ENSEMBLES = re.compile(r"ensembles=\{(.*?)\}, customMetadata")
_SEGMENT = re.compile(r"(\d+)=\[([^\]]*)\]")


def shell_ensembles(rc: RealCluster, ledger: int) -> dict[int, list[str]]:
    """BookieShell `ledgermetadata -ledgerid N`: the segments it prints."""
    out = rc.shell("ledgermetadata", "-ledgerid", str(ledger))
    found = _ENSEMBLES.search(out)
    assert found is not None, out
    return {int(k): v.split(", ") for k, v in _SEGMENT.findall(found.group(1))}


class Daemon:
    """`bk-auditor run` in a child process, stopped by its own pid."""

    def __init__(self, rc: RealCluster, identity: str, *settings: str) -> None:
        self.log = rc.workdir / f"daemon-{time.monotonic_ns()}.log"
        args = [
            f"daemon.metadata_service_uri={rc.uri}",
            f"daemon.identity={identity}",
            *FAST,
            "logging.format=json",
            "logging.level=debug",
            "worker.enabled=true",
            "worker.lock_holder=interop-worker",
            "lostBookieRecoveryDelay=0",
            "rwRereplicateBackoffMs=200",
            "lockReleaseOfFailedLedgerGracePeriod=3200",
            "selftest.enabled=false",
            *settings,
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "auditor", "run", *(a for s in args for a in ("--set", s))],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def alive(self) -> None:
        assert self.proc.poll() is None, f"the daemon exited; see {self.log}"


@contextlib.contextmanager
def daemon(rc: RealCluster, *settings: str) -> Iterator[Daemon]:
    d = Daemon(rc, "interop-auditor:3181", *settings)
    try:
        yield d
    finally:
        d.stop()


async def poll(
    check: Callable[[], Awaitable[bool]],
    what: str,
    within: float = WITHIN,
    proc: Daemon | None = None,
) -> None:
    """ZooKeeper has no event for "the worker is done": look until `check()` holds."""
    deadline = time.monotonic() + within
    while not await check():
        if proc is not None:
            proc.alive()
        assert time.monotonic() < deadline, f"not within {within:g}s: {what}"
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def zk_of(rc: RealCluster) -> AsyncIterator[tuple[ZkClient, UnderreplicationManager]]:
    async with ZkClient(rc.zk_hosts, timeout=10.0) as zk:
        yield zk, UnderreplicationManager(zk, rc.ledgers_root)


async def locks(zk: ZkClient, urm: UnderreplicationManager) -> list[str]:
    try:
        return await zk.get_children(f"{urm.base}/locks")
    except NoNodeError:
        return []


async def test_a_lost_real_bookie_is_re_replicated_and_java_reads_everything(
    real_cluster: MakeCluster,
) -> None:
    # Three bookies take every ledger; the fourth, a spare, comes after them.
    rc = real_cluster("sorted", "interleaved", "sorted")
    lost, a, b = rc.bookies
    ledgers = write_ledgers(rc)
    # Two segments: the spare replaces the lost bookie after entry 4 or 5, so the lost
    # bookie is in the first segment only (and the spare in the second).
    changing = rc.client.ok(
        "create", ensemble=3, write=2, ack=2, digest="CRC32", password=PASSWORD, entries=5,
        close=False,
    )  # fmt: skip
    spare = rc.add_bookie("interleaved")
    lost.stop()
    assert rc.client.ok("add", ledger=changing["ledger"], entries=5)["confirmed"] == [5, 6, 7, 8, 9]
    # It stays open, its writer live: its first segment is closed (the writer moved on),
    # so it is repaired without fencing, and the writer goes on.
    ledgers[changing["ledger"]] = Ledger("CRC32", 11, 3, 2, java_segments(rc, changing["ledger"]))
    # (the change comes with the first entry whose write set names the lost bookie)
    assert sorted(ledgers[changing["ledger"]].segments) in ([0, 5], [0, 6])
    mine = naming(ledgers, lost.bookie_id)

    async with zk_of(rc) as (zk, urm):

        async def repaired() -> bool:
            if await urm.count_underreplicated() or await locks(zk, urm):
                return False
            return all(
                lost.bookie_id not in e for lid in mine for e in java_segments(rc, lid).values()
            )

        with daemon(rc) as d:
            await poll(repaired, "the lost bookie's ledgers re-replicated", proc=d)

    added = rc.client.ok("add", ledger=changing["ledger"], entries=2)
    assert added["confirmed"] == [10, 11]
    # The writer's close reads the metadata our worker wrote, and keeps the repair.
    assert rc.client.ok("close", ledger=changing["ledger"])["metadata"]["last_entry"] == 11
    targets: dict[tuple[int, int], str] = {}
    for lid, ledger in ledgers.items():
        now = java_segments(rc, lid)
        assert sorted(now) == sorted(ledger.segments), lid
        for first, before in ledger.segments.items():
            after = now[first]
            if lost.bookie_id not in before:
                assert after == before, (lid, first)
                continue
            # In place, as Java's replicator does: the lost bookie's position only, by a
            # bookie that was not in that segment's ensemble.
            pos = before.index(lost.bookie_id)
            targets[lid, first] = after[pos]
            assert after[:pos] + after[pos + 1 :] == before[:pos] + before[pos + 1 :]
            assert after[pos] not in before, (lid, first)
    assert {lid for lid, _ in targets} == mine
    # The spare was the only bookie outside every first segment of three.
    assert {targets[lid, 0] for lid in mine if ledgers[lid].ensemble == 3} == {spare.bookie_id}
    # BookieShell reads the new ensembles too (one JVM start: the ledger of two segments).
    lid = changing["ledger"]
    assert shell_ensembles(rc, lid) == java_segments(rc, lid) != ledgers[lid].segments
    for lid, ledger in ledgers.items():
        ledger.segments = java_segments(rc, lid)
        read = rc.client.ok("read", ledger=lid, digest=ledger.digest, password=PASSWORD)
        assert (read["entries"], read["lac"], read["mismatched"]) == (
            ledger.last + 1,
            ledger.last,
            [],
        ), lid
    # Nothing was written to a bookie beyond what its positions hold.
    check_lists(rc, ledgers)
    # The copies alone: with the other two bookies stopped, every entry of the ledgers
    # with W == E is read from the spare only, and passes the client's digest check.
    a.stop()
    b.stop()
    for lid, ledger in ledgers.items():
        if lid in mine and ledger.write == ledger.ensemble == 3 and ledger.last >= 0:
            read = rc.client.ok("read", ledger=lid, digest=ledger.digest, password=PASSWORD)
            assert (read["entries"], read["mismatched"]) == (ledger.last + 1, []), lid


async def test_an_open_ledger_is_fenced_only_after_the_grace_period(
    real_cluster: MakeCluster,
) -> None:
    """Beside it, a second open ledger whose writer replaces the lost bookie itself within
    the grace period: that one is never fenced; its old segment is copied."""
    grace_ms = 6000
    rc = real_cluster("sorted", "interleaved", "sorted")
    c = rc.client
    # Live writers: E3/W2/A2, five entries confirmed, their handles kept open.
    created = c.ok(
        "create", ensemble=3, write=2, ack=2, digest="CRC32", password=PASSWORD, entries=5,
        close=False,
    )  # fmt: skip
    other = c.ok(
        "create", ensemble=3, write=2, ack=2, digest="CRC32C", password=PASSWORD, entries=5,
        close=False,
    )["ledger"]  # fmt: skip
    rc.add_bookie("interleaved")  # a fourth: the target outside both ensembles
    lid = created["ledger"]
    ensemble = created["metadata"]["ensembles"]["0"]
    # The bookie at position 1: entry 5 goes to positions 2 and 0, never to it.
    lost = rc.bookie(ensemble[1])
    lost.stop()
    lock = f"{rc.ledgers_root}/underreplication/locks/urL{lid:010d}"
    path = f"{rc.ledgers_root}/00/0000/L{lid:04d}"
    async with zk_of(rc) as (zk, urm):
        with daemon(rc, f"openLedgerRereplicationGracePeriod={grace_ms}") as d:

            async def locked() -> bool:
                return await zk.exists(lock) is not None

            await poll(locked, "the worker took the open ledger", proc=d)
            taken = await zk.exists(lock)
            assert taken is not None
            # Within the grace period the writer goes on: nothing is fenced.
            added = c.call("add", ledger=lid, entries=1)
            assert (added["ok"], added["confirmed"]) == (True, [5]), added
            # The other writer meets the lost bookie and replaces it (an ensemble change).
            added = c.call("add", ledger=other, entries=3)
            assert (added["ok"], added["confirmed"]) == (True, [5, 6, 7]), added
            written = {int(k): v for k, v in added["metadata"]["ensembles"].items()}
            assert len(written) == 2 and lost.bookie_id not in written[max(written)]
            # Java's shell names our worker as the one re-replicating it (the lock's data).
            listing = rc.shell("listunderreplicated", "-prw")
            assert re.search(rf"\] - {lid}\n.*\n.*ReplicationWorkerId : interop-worker\n", listing)
            # ... and the metadata is not touched (ZooKeeper's clock for both times).
            while time.time() * 1000 < taken.ctime + grace_ms - 500:
                _, stat = await zk.get(path)
                assert stat.version == 0
                await asyncio.sleep(0.2)

            async def closed() -> bool:
                return bool(c.ok("metadata", ledger=lid)["metadata"]["closed"])

            await poll(closed, "the open ledger recovered", proc=d)
            _, stat = await zk.get(path)
            assert stat.mtime >= taken.ctime + grace_ms
            md = c.ok("metadata", ledger=lid)["metadata"]
            assert (md["last_entry"], md["length"]) == (5, 6 * 64)

            async def repaired() -> bool:
                if await urm.count_underreplicated() or await locks(zk, urm):
                    return False
                return all(
                    lost.bookie_id not in e
                    for ledger in (lid, other)
                    for e in java_segments(rc, ledger).values()
                )

            await poll(repaired, "the recovered ledger re-replicated", proc=d)
    # The other writer was never fenced: its old segment was copied, its own kept.
    now = java_segments(rc, other)
    assert now[max(written)] == written[max(written)]
    pos = written[0].index(lost.bookie_id)
    assert [x for i, x in enumerate(now[0]) if i != pos] == [
        x for i, x in enumerate(written[0]) if i != pos
    ]
    assert now[0][pos] not in written[0]
    assert c.ok("add", ledger=other, entries=2)["confirmed"] == [8, 9]
    assert c.ok("close", ledger=other)["metadata"]["last_entry"] == 9
    read = c.ok("read", ledger=other, digest="CRC32C", password=PASSWORD)
    assert (read["entries"], read["lac"], read["mismatched"]) == (10, 9, [])
    # The writer learns it was fenced at its next add. Entry 6 goes to positions 0 and 1:
    # the lost bookie comes back first, and the client sees it registered (it was down
    # when the others were fenced, so it takes the entry); else the writer could fail on
    # the dead bookie first, try to replace it, find the ledger closed and fail with
    # LedgerClosedException (-11) instead.
    lost.start()
    assert rc.listed(lost.bookie_id, lid, 5) == held(
        Ledger("CRC32", 5, 3, 2, {0: ensemble}), {0: ensemble}, lost.bookie_id
    )
    refused = c.call("add", ledger=lid, entries=1)
    assert (refused["ok"], refused["code"], refused["confirmed"]) == (False, -101, [])
    # Every entry it saw confirmed is there, and readable by another client.
    read = c.ok("read", ledger=lid, digest="CRC32", password=PASSWORD)
    assert (read["entries"], read["lac"], read["mismatched"]) == (6, 5, [])
    now = java_segments(rc, lid)
    [after] = now.values()
    assert after[0] == ensemble[0] and after[2] == ensemble[2]
    assert after[1] not in ensemble
    ledger = Ledger("CRC32", 5, 3, 2, {0: ensemble})
    for bookie in after:
        assert rc.listed(bookie, lid, 5) == held(ledger, now, bookie), bookie


def moved(rc: RealCluster, ledgers: dict[int, Ledger], gone: str) -> dict[int, str]:
    """Each ledger that named `gone`: the bookie now at its position, where nothing else
    changed; every ledger read in full by Java, digest-checked; `ledgers` updated."""
    targets: dict[int, str] = {}
    for lid, ledger in ledgers.items():
        now = java_segments(rc, lid)
        [(first, before)] = ledger.segments.items()
        [(first_now, after)] = now.items()
        assert first_now == first and len(after) == len(before)
        changed = [i for i, (x, y) in enumerate(zip(before, after, strict=True)) if x != y]
        if gone in before:
            [pos] = changed
            assert before[pos] == gone and after[pos] not in before, (lid, before, after)
            targets[lid] = after[pos]
        else:
            assert changed == [], lid
        read = rc.client.ok("read", ledger=lid, digest=ledger.digest, password=PASSWORD)
        assert (read["entries"], read["mismatched"]) == (ledger.last + 1, []), lid
        ledger.segments = now
    return targets


def naming(ledgers: dict[int, Ledger], bookie: str) -> set[int]:
    return {
        lid for lid, ledger in ledgers.items() if any(bookie in e for e in ledger.segments.values())
    }


def check_lists(
    rc: RealCluster, ledgers: dict[int, Ledger], kept: Mapping[tuple[int, str], list[int]] = {}
) -> None:
    """Each member of each ledger holds exactly the entries its positions must hold, and
    what it `kept` (ledger, bookie) from an earlier position in the ledger: nothing else."""
    for lid, ledger in ledgers.items():
        if ledger.last >= 0:
            for bookie in {x for e in ledger.segments.values() for x in e}:
                want = set(held(ledger, ledger.segments, bookie)) | set(kept.get((lid, bookie), []))
                assert rc.listed(bookie, lid, ledger.last) == sorted(want), (lid, bookie)


async def test_recover_and_decommission_move_real_bookies_ledgers(
    real_cluster: MakeCluster,
) -> None:
    """`recover` of a live bookie, of a stopped one, then `decommission` of a stopped one
    while a daemon's worker moves what the command marked."""
    rc = real_cluster("sorted", "interleaved", "sorted")
    first, second, third = rc.bookies
    ledgers = write_ledgers(rc)
    rc.add_bookie("interleaved")
    # What a bookie held stays on its disk after its ledgers move away (the first's and
    # the third's come back into these ledgers, at other positions).
    kept: dict[tuple[int, str], list[int]] = {}

    async def recover(bookie: RealBookie) -> None:
        for lid, ledger in ledgers.items():
            kept[lid, bookie.bookie_id] = held(ledger, ledger.segments, bookie.bookie_id)
        n = len(naming(ledgers, bookie.bookie_id))
        code, out, err = await bk(
            "recover", bookie.bookie_id, "--metadata-service-uri", rc.uri, *CLI_FAST, within=90
        )
        assert code == 0, err
        assert out == (
            f"recover {bookie.bookie_id}: {n} ledgers named it; {n} moved, 0 no longer named, "
            "0 not moved\n"
        )
        assert len(err.splitlines()) == n
        assert len(moved(rc, ledgers, bookie.bookie_id)) == n
        check_lists(rc, ledgers, kept)

    # recover a live bookie: its ledgers move now, to the spare.
    await recover(third)
    # recover a stopped one: its ledgers move now, read from the others, to the third.
    first.stop()
    await recover(first)
    # decommission: the second bookie is stopped; the first, back and no longer in these
    # ledgers, is where they can go. The command marks them, and waits for the workers.
    first.start()
    second.stop()
    mine = naming(ledgers, second.bookie_id)
    n = len(mine)
    async with zk_of(rc) as (zk, urm):
        command = asyncio.ensure_future(
            bk("decommission", second.bookie_id, "--metadata-service-uri", rc.uri, "--json",
               *CLI_FAST, within=90)
        )  # fmt: skip

        async def marked() -> bool:
            return command.done() or await urm.count_underreplicated() == n

        await poll(marked, "decommission marked them")
        # The daemon comes once the command has marked (else its own auditor and worker
        # could move everything before the command looks).
        with daemon(rc):
            code, out, err = await asyncio.wait_for(command, 90)
        assert code == 0, err
        docs = [json.loads(line) for line in out.splitlines()]
        assert (docs[0]["event"], docs[0]["marked"], docs[0]["created"]) == ("marked", n, n)
        assert docs[-1] == {
            "summary": True,
            "bookie": second.bookie_id,
            "state": "not registered",
            "ledgers": n,
            "metadata_invalid": [],
            "marked": n,
            "waited": True,
            "cookie_deleted": True,
        }
        assert await zk.exists(f"{rc.ledgers_root}/cookies/{second.bookie_id}") is None
        assert await urm.count_underreplicated() == 0 and await locks(zk, urm) == []
    targets = moved(rc, ledgers, second.bookie_id)
    assert set(targets) == mine
    check_lists(rc, ledgers, kept)
