"""The audit checks against real Apache BookKeeper: real bookies (SortedLedgerStorage and
InterleavedLedgerStorage, which answer GET_LIST_OF_ENTRIES_OF_LEDGER; DbLedgerStorage,
which never does), ledgers written by the real Java client, and Java's own tools as the
judge of what our checks report and mark: BookieShell's `listunderreplicated`,
BookKeeperAdmin's per-bookie entry lists, BookKeeper's LedgerChecker (BkClient's `check`).

One cluster serves the first three scenarios, in order: the healthy cluster, a stopped
bookie (restarted after, marks removed), entries lost on two bookies (left damaged: the
last one). DbLedgerStorage bookies get a cluster of their own. The placement check runs
under `DefaultEnsemblePlacementPolicy`: the Java client chose every ensemble without any
rack information, so no rack rule describes how this cluster was written (under the
default `RackawareEnsemblePlacementPolicy` every write quorum on `/default-rack` is
reported `placement_not_adhering`, as Java's own placement check reports it; that is
asserted once).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from auditor.metadata.schedule import stores_entry
from auditor.metadata.underreplication import (
    UnderreplicatedLedger,
    UnderreplicationManager,
    ur_ledger_path,
)
from auditor.testing.cli import bk, one_json
from auditor.zk import ZkClient
from tests.interop.conftest import MakeCluster
from tests.interop.realbk import NO_RACKS, RealBookie, RealCluster

PASSWORD = "secret"
#: (ensemble, write, ack, digest, entries): E == W, E > W (striped), A == 1, DUMMY, empty.
SHAPES = [
    (3, 3, 2, "CRC32", 10),
    (3, 2, 2, "CRC32C", 10),
    (3, 2, 1, "MAC", 7),
    (2, 2, 2, "DUMMY", 3),
    (3, 2, 2, "CRC32", 0),
]
#: Real bookies answer in milliseconds; a second look comes soon.
FAST = ["--set", "checks.retry_delay=0.2", "--set", "readEntryTimeout=3"]


@dataclass
class Written:
    """What the Java client wrote: per ledger its digest and last entry (-1: none)."""

    digests: dict[int, str]
    last: dict[int, int]
    open_ledger: int  # still open, its handle held by the Java client
    changed: int  # closed, two segments: a bookie was stopped while it was written


@dataclass
class Scene:
    rc: RealCluster
    written: Written


def java_metadata(rc: RealCluster, ledger: int) -> dict[str, Any]:
    md: dict[str, Any] = rc.client.ok("metadata", ledger=ledger)["metadata"]
    return md


def ensembles(rc: RealCluster, ledger: int) -> dict[int, list[str]]:
    """The ledger's segments as Java reads them: first entry -> ensemble."""
    return {int(k): v for k, v in java_metadata(rc, ledger)["ensembles"].items()}


def write_ledgers(rc: RealCluster) -> Written:
    c = rc.client
    digests: dict[int, str] = {}
    last: dict[int, int] = {}
    for e, w, a, digest, entries in SHAPES:
        lid = c.ok(
            "create", ensemble=e, write=w, ack=a, digest=digest, password=PASSWORD, entries=entries
        )["ledger"]
        digests[lid], last[lid] = digest, entries - 1
    # An open ledger with five confirmed entries.
    opened = c.ok(
        "create", ensemble=3, write=2, ack=2, digest="CRC32C", password=PASSWORD, entries=5,
        close=False,
    )  # fmt: skip
    digests[opened["ledger"]], last[opened["ledger"]] = "CRC32C", 4
    # An ensemble change: a bookie of the ensemble stops between two adds; the client
    # replaces it with the spare bookie and goes on.
    changing = c.ok(
        "create", ensemble=3, write=2, ack=2, digest="CRC32", password=PASSWORD, entries=5,
        close=False,
    )  # fmt: skip
    lid = changing["ledger"]
    victim = rc.bookie(changing["metadata"]["ensembles"]["0"][0])
    victim.stop()
    added = c.ok("add", ledger=lid, entries=5)
    assert added["confirmed"] == [5, 6, 7, 8, 9]
    c.ok("close", ledger=lid)
    digests[lid], last[lid] = "CRC32", 9
    # A ledger the stopped bookie cannot be in: not every ledger shares one bookie.
    without = c.ok(
        "create", ensemble=2, write=2, ack=2, digest="CRC32", password=PASSWORD, entries=4
    )
    digests[without["ledger"]], last[without["ledger"]] = "CRC32", 3
    victim.start()
    segments = ensembles(rc, lid)
    assert sorted(segments) == [0, 5]
    assert victim.bookie_id in segments[0] and victim.bookie_id not in segments[5]
    return Written(digests, last, opened["ledger"], lid)


@pytest.fixture(scope="module")
def scene(module_cluster_factory: MakeCluster) -> Iterator[Scene]:
    rc = module_cluster_factory("sorted", "interleaved", "sorted", "interleaved")
    yield Scene(rc, write_ledgers(rc))


async def check(rc: RealCluster, which: str, *extra: str) -> tuple[int, dict[str, Any]]:
    code, out, err = await bk(
        "check", which, "--metadata-service-uri", rc.uri, "--json", *FAST, *extra, within=90
    )
    assert code in (0, 1), err
    return code, one_json(out)


async def test_a_healthy_real_cluster_reports_nothing(scene: Scene) -> None:
    rc, w = scene.rc, scene.written
    code, doc = await check(rc, "all", "--set", NO_RACKS)
    reports = doc["reports"]
    assert code == 0
    for name, report in reports.items():
        assert set(report["counts"].values()) == {0}, (name, report["counts"])
        assert report["violations"] == [] and report["invalid_znodes"]["total"] == 0, name
        assert report["would_be_violations_dropped"] == {}, name
    closed = len(w.digests) - 1
    assert reports["bookies"]["lost_bookies"] == []
    assert reports["bookies"]["ledgers_checked"] == len(w.digests)
    assert reports["ledgers"]["ledgers_checked"] == len(w.digests)
    assert (reports["placement"]["ledgers_checked"], reports["placement"]["ledgers_skipped"]) == (
        closed,
        {"open": 1},
    )
    # Closed ledgers with entries are verified: every (ledger, bookie) pair by listing.
    assert (reports["replicas"]["ledgers_checked"], reports["replicas"]["ledgers_skipped"]) == (
        closed - 1,
        {"empty": 1, "open": 1},
    )
    pairs = sum(
        len({b for e in ensembles(rc, lid).values() for b in e})
        for lid, last in w.last.items()
        if last >= 0 and lid != w.open_ledger
    )
    assert reports["replicas"]["coverage"] == {"listed": pairs, "probed": 0, "unverified": 0}
    assert reports["grace"]["ledgers_checked"] == 0
    # Under the default rack-aware policy, with every bookie on /default-rack, each closed
    # ledger's write quorums span one rack where two are asked for: not adhering, as Java's
    # placement check says of this cluster.
    code, doc = await check(rc, "placement")
    assert code == 1
    assert doc["counts"]["placement_not_adhering"] == closed
    assert sorted(v["ledger_id"] for v in doc["violations"]) == sorted(
        lid for lid in w.digests if lid != w.open_ledger
    )


async def marks(rc: RealCluster) -> dict[int, UnderreplicatedLedger]:
    """Every under-replication mark of the cluster, read from ZooKeeper."""
    async with ZkClient(rc.zk_hosts, timeout=10.0) as zk:
        urm = UnderreplicationManager(zk, rc.ledgers_root)
        return {m.ledger_id: m async for m in urm.list_underreplicated()}


async def clear_marks(rc: RealCluster) -> None:
    """Removes every mark, as a worker that found nothing to do would."""
    async with ZkClient(rc.zk_hosts, timeout=10.0) as zk:
        urm = UnderreplicationManager(zk, rc.ledgers_root)
        async for m in urm.list_underreplicated():
            await zk.delete(ur_ledger_path(urm.base, m.ledger_id))


_LISTED = re.compile(r"ListUnderReplicatedCommand@\d+\] - (\d+)$")
_CTIME = re.compile(r"\tCtime : (-?\d+)$")
_MISSING = re.compile(r"\tMissingReplica : (\S+)$")


def java_underreplicated(rc: RealCluster) -> dict[int, tuple[int, tuple[str, ...]]]:
    """BookieShell `listunderreplicated -pmr`: ledger -> (ctime, missing replicas)."""
    listed: dict[int, tuple[int, tuple[str, ...]]] = {}
    current: int | None = None
    for line in rc.shell("listunderreplicated", "-pmr").splitlines():
        if found := _LISTED.search(line):
            current = int(found.group(1))
            listed[current] = (-1, ())
        elif current is not None and (found := _CTIME.search(line)):
            listed[current] = (int(found.group(1)), listed[current][1])
        elif current is not None and (found := _MISSING.search(line)):
            ctime, replicas = listed[current]
            listed[current] = (ctime, (*replicas, found.group(1)))
    return listed


async def test_a_stopped_bookie_marks_exactly_its_ledgers_as_java_lists_them(
    scene: Scene,
) -> None:
    rc, w = scene.rc, scene.written
    # The bookie the ensemble change replaced: in the old segment of that ledger only.
    victim = rc.bookie(ensembles(rc, w.changed)[0][0])
    expected = {
        lid for lid in w.digests if any(victim.bookie_id in e for e in ensembles(rc, lid).values())
    }
    victim.stop()
    try:
        code, doc = await check(rc, "bookies", "--mark")
        assert code == 1
        assert doc["lost_bookies"] == [victim.bookie_id]
        assert sorted(v["ledger_id"] for v in doc["violations"]) == sorted(expected)
        assert sorted(doc["marked_underreplicated"]) == sorted(expected)
        ours = await marks(rc)
        assert {lid: m.replicas for lid, m in ours.items()} == {
            lid: (victim.bookie_id,) for lid in expected
        }
        # Java's own listing reads our marks as it reads its auditor's.
        assert java_underreplicated(rc) == {lid: (m.ctime, m.replicas) for lid, m in ours.items()}
        # The ledger check finds the fragments BookKeeper's LedgerChecker finds.
        java = java_checker(rc, w, 0)
        code, doc = await check(rc, "ledgers")
        assert code == 1
        # (the empty ledger's fragment too, and the open ledger's up to its LAC)
        assert our_fragments(doc) == {lid: found for lid, found in java.items() if found}
    finally:
        victim.start()
        await clear_marks(rc)


#: InterleavedLedgerStorage's index file (FileInfo): a 1024-byte header, then one 8-byte
#: entry-log position per entry id; 0 means "no such entry" to the bookie.
INDEX_HEADER = 1024


def punch_index(bookie: RealBookie, ledger: int, entries: list[int]) -> None:
    """Makes a stopped bookie forget `entries` of `ledger` (their data stays in the entry
    log, unreachable): zeroes their slots in the ledger's index file.

    Its journal goes too: a bookie replays its journal from the last mark it persisted,
    which lags behind what its shutdown flushed (seen: a few KB), and the replay would
    write the last entries back. The shutdown flushed every entry into the ledger storage,
    so without the journal and its mark nothing else is lost."""
    [index] = (bookie.ledger_dir / "current").glob(f"*/*/{ledger:x}.idx")
    with open(index, "r+b") as f:
        for e in entries:
            f.seek(INDEX_HEADER + 8 * e)
            f.write(bytes(8))
    for journal in (bookie.dir / "journal" / "current").glob("*.txn"):
        journal.unlink()
    (bookie.ledger_dir / "current" / "lastMark").unlink()


def held_by(rc: RealCluster, ledger: int, last: int, bookie: str) -> set[int]:
    """The entries `bookie` must hold by round robin (one segment)."""
    md = java_metadata(rc, ledger)
    [members] = ensembles(rc, ledger).values()
    pos = members.index(bookie)
    return {e for e in range(last + 1) if stores_entry(pos, e, md["ensemble"], md["write"])}


Fragments = dict[int, list[tuple[int, int, list[str]]]]


def java_checker(rc: RealCluster, w: Written, percentage: int) -> Fragments:
    """BookKeeper's LedgerChecker on every ledger: (first, last, bad bookies) per bad
    fragment."""
    return {
        lid: [
            (f["first"], f["last"], f["bookies"])
            for f in rc.client.ok(
                "check", ledger=lid, digest=w.digests[lid], password=PASSWORD,
                percentage=percentage,
            )["fragments"]
        ]
        for lid in w.digests
    }  # fmt: skip


def our_fragments(doc: dict[str, Any]) -> Fragments:
    """The ledger check's report in the same terms."""
    return {
        v["ledger_id"]: [
            (f["first_entry"], f["last_entry"], [b["bookie"] for b in f["bad_bookies"]])
            for f in v["detail"]["fragments"]
        ]
        for v in doc["violations"]
    }


def member(rc: RealCluster, members: list[str], storage: str) -> RealBookie:
    return next(b for b in rc.bookies if b.storage == storage and b.bookie_id in members)


def ranges(entries: set[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for e in sorted(entries):
        if out and out[-1][1] == e - 1:
            out[-1][1] = e
        else:
            out.append([e, e])
    return out


async def test_entries_lost_on_one_bookie_are_the_holes_java_lists(scene: Scene) -> None:
    """The replicas check finds exactly the holes BookKeeperAdmin lists, the ledger check
    exactly the fragments BookKeeper's LedgerChecker finds. Leaves its two damaged
    bookies damaged: the module's last scenario on its cluster."""
    rc, w = scene.rc, scene.written
    # Ledger 0 (E3/W3/A2) loses three entries on its InterleavedLedgerStorage member;
    # ledger 1 (E3/W2/A2, striped) two of those its SortedLedgerStorage member holds.
    full, striped = list(w.digests)[:2]
    [members0] = ensembles(rc, full).values()
    [members1] = ensembles(rc, striped).values()
    interleaved = member(rc, members0, "interleaved")
    sorted_ = member(rc, members1, "sorted")
    holes = {
        (full, interleaved.bookie_id): {0, 4, 5},
        (striped, sorted_.bookie_id): set(sorted(held_by(rc, striped, 9, sorted_.bookie_id))[1:3]),
    }
    interleaved.stop()
    sorted_.stop()
    punch_index(interleaved, full, sorted(holes[full, interleaved.bookie_id]))
    punch_index(sorted_, striped, sorted(holes[striped, sorted_.bookie_id]))
    interleaved.start()
    sorted_.start()
    # Java's view of each member: what it must hold, less exactly the holes made.
    for lid in (full, striped):
        [members] = ensembles(rc, lid).values()
        for b in members:
            want = held_by(rc, lid, w.last[lid], b) - holes.get((lid, b), set())
            assert rc.listed(b, lid, w.last[lid]) == sorted(want), (lid, b)
    code, doc = await check(rc, "replicas", "--mark")
    assert code == 1
    got = {v["ledger_id"]: v for v in doc["violations"]}
    assert sorted(got) == [full, striped] and doc["marked_underreplicated"] == [full, striped]
    assert (got[full]["category"], got[striped]["category"]) == (
        "below_write_quorum",  # two copies of three left, at least the ack quorum
        "below_ack_quorum",  # one copy of two left
    )
    for (lid, b), lost in holes.items():
        assert got[lid]["detail"]["missing"] == [
            {"segment": [0, w.last[lid]], "bookie": b, "entries": ranges(lost), "count": len(lost)}
        ]
        assert got[lid]["detail"]["worst_entries"] == ranges(lost)
        assert set(got[lid]["detail"]["verified"].values()) == {"listed"}
    assert {lid: m.replicas for lid, m in (await marks(rc)).items()} == {
        lid: (b,) for lid, b in holes
    }
    await clear_marks(rc)
    # The ledger check finds what BookKeeper's own LedgerChecker finds, fragment by
    # fragment: by default the first and last entry each bookie must hold are read (entry
    # 0 of ledger 0 is gone; ledger 1 lost entries in the middle), with
    # auditorLedgerVerificationPercentage=100 every entry.
    for percentage in (0, 100):
        java = java_checker(rc, w, percentage)
        code, doc = await check(
            rc, "ledgers", "--set", f"auditorLedgerVerificationPercentage={percentage}"
        )
        assert code == 1
        ours = our_fragments(doc)
        assert ours == {lid: found for lid, found in java.items() if found}
        assert sorted(ours) == ([full] if percentage == 0 else [full, striped])
        failed = {
            v["ledger_id"]: v["detail"]["fragments"][0]["bad_bookies"][0]["failed_entries"]
            for v in doc["violations"]
        }
        if percentage == 0:
            assert failed == {full: [[0, 0]]}
        else:
            assert failed == {lid: ranges(lost) for (lid, _), lost in holes.items()}


async def test_db_ledger_storage_bookies_are_probed_as_documented(
    real_cluster: MakeCluster,
) -> None:
    rc = real_cluster("db", "db", "sorted")
    lids = [
        rc.client.ok(
            "create", ensemble=3, write=w, ack=2, digest="CRC32C", password=PASSWORD, entries=n
        )["ledger"]
        for w, n in ((3, 8), (2, 9))
    ]
    # Each (ledger, member) pair: the SortedLedgerStorage member lists; the two
    # DbLedgerStorage members do not answer the list request (the real bookie sends no
    # reply at all), so after one timeout each they are probed by reading.
    pairs = {"listed": len(lids), "probed": 2 * len(lids), "unverified": 0}
    code, doc = await check(rc, "replicas")
    assert (code, doc["violations"], doc["ledgers_checked"]) == (0, [], len(lids))
    assert doc["coverage"] == pairs
    # Without probing, those pairs are not verified, and not reported either.
    code, doc = await check(rc, "replicas", "--set", "checks.probe_unlistable=false")
    assert (code, doc["violations"], doc["ledgers_checked"]) == (0, [], len(lids))
    assert doc["coverage"] == {**pairs, "probed": 0, "unverified": pairs["probed"]}
