"""Placement repair end to end: our placement check marks, our worker moves copies.

A real ZooKeeper and emulated bookies over TCP; ledgers written with the real protocol
(CRC32C digests under a password). Racks come from a racks file: b0..b3 in /r1, b4 and
b5 in /r2, b6 (when it is up) in /r3. With BookKeeper's
`repairedPlacementPolicyNotAdheringBookieEnabled`, the placement check marks each closed
ledger with a segment that fails the rack-aware policy (an empty replica list, as
upstream's `AuditorPlacementPolicyCheckTask` writes it), and the worker moves the fewest
copies that make it adhere, through the copy and commit every repair uses.

E3/W2 cannot be made to adhere with two racks: its three windows of two wrap around,
so one of them always stays in one rack. That ledger is refused, reported once, and
left marked (upstream leaves it marked and retries it after its failed-ledger delay);
once a third rack has a writable bookie, the next attempt repairs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from auditor.bookie.protocol import verify_entry_body
from auditor.bookie.results import Ok
from auditor.checks.findings import CheckReport
from auditor.checks.placement import Adherence, PlacementPolicy
from auditor.checks.placement_run import run_placement_check
from auditor.metadata.model import DigestType, LedgerMetadata
from auditor.metadata.schedule import stores_entry
from auditor.metadata.serde import decode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager, ur_ledger_path
from auditor.store import NoNodeError
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.inprocess import until
from auditor.worker.loop import ReplicationWorker
from auditor.worker.repair import WorkerConnection
from auditor.worker.state import Failure, WorkerState
from auditor.zk import ZkClient

ROOT = "/ledgers"
PASSWORD = b"placement-secret"
ENTRIES = 20
RACKS = ["/r1", "/r1", "/r1", "/r1", "/r2", "/r2", "/r3"]
KEY = "repairedPlacementPolicyNotAdheringBookieEnabled=true"
#: Upstream's failed-ledger delay starts at 1/32 of this (10 ms) and doubles.
FAST_RETRY = "lockReleaseOfFailedLedgerGracePeriod=320"

pytestmark = pytest.mark.timeout(120)


class RecordingLog:
    """The worker's logger: every line kept, at every level."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def _add(self, level: str, event: str, fields: dict[str, Any]) -> None:
        self.lines.append((level, event, fields))

    def debug(self, event: str, **fields: Any) -> None:
        self._add("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._add("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._add("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._add("error", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._add("exception", event, fields)

    def find(self, event: str, ledger: int) -> list[tuple[str, dict[str, Any]]]:
        return [(lvl, f) for lvl, e, f in self.lines if e == event and f.get("ledger") == ledger]


def racks_option(tmp_path: Path, tc: TestCluster) -> str:
    path = tmp_path / "racks.json"
    path.write_text(json.dumps(dict(zip(tc.ids, RACKS, strict=True))))
    return f"checks.racks_file={path}"


async def check(tc: TestCluster, options: Sequence[str]) -> CheckReport:
    """The placement check as the leader runs it: marks written."""
    async with tc.context(overrides=list(options), mark=True) as ctx:
        return await run_placement_check(ctx)


@contextlib.asynccontextmanager
async def worker(
    tc: TestCluster, options: Sequence[str]
) -> AsyncIterator[tuple[ReplicationWorker, RecordingLog]]:
    log = RecordingLog()
    async with tc.context(overrides=list(options)) as ctx:
        connected = asyncio.Event()
        connected.set()
        conn = WorkerConnection(connected, asyncio.Event())
        w = ReplicationWorker(ctx, conn, WorkerState(), holder="test-host", log=log)
        run = asyncio.ensure_future(w.run())
        try:
            yield w, log
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)


async def metadata(zk: ZkClient, path: str, lid: int) -> tuple[LedgerMetadata, int]:
    data, stat = await zk.get(path)
    return decode_ledger_metadata(data, lid), int(stat.version)


async def mark_of(zk: ZkClient, lid: int) -> tuple[bytes, int] | None:
    try:
        data, stat = await zk.get(ur_ledger_path(f"{ROOT}/underreplication", lid))
    except NoNodeError:
        return None
    return data, int(stat.version)


def rack_of(tc: TestCluster, bookie: str) -> str:
    return RACKS[tc.ids.index(bookie)]


async def assert_moved_copies(
    tc: TestCluster, lid: int, before: Sequence[str], after: Sequence[str], w: int
) -> int:
    """Every entry a moved position stores is on its new bookie: read back over the
    protocol, its digest checked, byte for byte the old bookie's copy; the new bookie
    holds nothing else of the ledger. Returns the number of entries moved."""
    e = len(before)
    moved = 0
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        if old == new:
            continue
        target, source = tc.by_id(new), tc.by_id(old)
        for entry in range(ENTRIES):
            if not stores_entry(i, entry, e, w):
                assert not target.has_entry(lid, entry), (lid, entry, new)
                continue
            read = await tc.writer.client.read_entry(new, lid, entry)
            assert isinstance(read, Ok), (lid, entry, read)
            body = verify_entry_body(read.value.body, DigestType.CRC32C, PASSWORD)
            assert (body.ledger_id, body.entry_id) == (lid, entry)
            assert body.payload == tc.writer.payload(lid, entry)
            assert read.value.body == source.entry_body(lid, entry)
            moved += 1
    return moved


async def test_ledgers_on_one_rack_are_moved_so_that_they_adhere(
    zk: ZkClient, tmp_path: Path
) -> None:
    """L1 E3/W3 (upstream's own scenario: one copy moves to /r2), L2 E4/W2 (two copies
    move, to alternate positions, each holding half the entries), L3 E3/W3 already
    across two racks (never marked, never touched)."""
    async with test_cluster(zk, 7, password=PASSWORD) as tc:
        b = tc.ids
        await tc.by_id(b[6]).crash()  # no third rack here
        options = [racks_option(tmp_path, tc), KEY, FAST_RETRY]
        ensembles = {1: (b[0], b[1], b[2]), 2: (b[0], b[1], b[2], b[3]), 3: (b[0], b[1], b[4])}
        quorum = {1: 3, 2: 2, 3: 3}
        paths = {}
        for lid, ens in ensembles.items():
            written = await tc.writer.write_ledger(
                lid, [(0, ens)], write_quorum=quorum[lid], ack_quorum=2, num_entries=ENTRIES
            )
            paths[lid] = written.path
        report = await check(tc, options)
        assert sorted(report.marked_underreplicated) == [1, 2]
        for lid in (1, 2):
            mark = await mark_of(zk, lid)
            assert mark is not None and re.fullmatch(rb"ctime: \d+\n", mark[0]), mark
        for emu in tc.bookies:
            emu.reset_stats()

        async with worker(tc, options) as (w, log):
            await until(
                w.released,
                lambda: w.state.ledgers_replicated == 2,
                f"two ledgers re-replicated; log: {log.lines}",
                within=60,
            )
            assert w.state.failures == Counter()
            assert w.state.fragments_replicated == 3

        policy = PlacementPolicy()
        where = dict(zip(b, RACKS, strict=True))
        moved_entries: Counter[str] = Counter()
        for lid in (1, 2):
            md, version = await metadata(zk, paths[lid], lid)
            # one version-checked write: the one segment's commit
            assert version == 1
            [seg] = md.segments
            before, after = ensembles[lid], seg.bookies
            changed = [i for i in range(len(before)) if before[i] != after[i]]
            assert (md.last_entry_id, md.length) == (ENTRIES - 1, ENTRIES * 16)
            assert policy.check(after, md.write_quorum, where).adherence is Adherence.MEETS_STRICT
            assert {rack_of(tc, x) for x in after} == {"/r1", "/r2"}
            assert all(rack_of(tc, after[i]) == "/r2" for i in changed)
            if lid == 1:
                assert len(changed) == 1
            else:
                assert changed in ([0, 2], [1, 3])
            count = await assert_moved_copies(tc, lid, before, after, md.write_quorum)
            assert count == {1: ENTRIES, 2: ENTRIES}[lid]
            for i in changed:
                moved_entries[after[i]] += sum(
                    stores_entry(i, e, len(before), md.write_quorum) for e in range(ENTRIES)
                )
            assert await UnderreplicationManager(zk, ROOT).get(lid) is None
        # Each moved entry written once, with RECOVERY_ADD, to its new bookie only.
        assert {
            e.bookie_id: (e.stats()["recovery_adds"], e.stats()["recovery_adds_repeated"])
            for e in tc.bookies
            if e.stats()["recovery_adds"]
        } == {x: (n, 0) for x, n in moved_entries.items()}
        assert sum(e.stats()["adds"] for e in tc.bookies) == 0
        assert (await metadata(zk, paths[3], 3))[1] == 0
        assert await zk.get_children(f"{ROOT}/underreplication/locks") == []
        moves = [
            f for lvl, f in log.find("copying fragments", 1) + log.find("copying fragments", 2)
        ]
        assert all("(not_adhering) ->" in line for f in moves for line in f["fragments"])
        # The placement check finds nothing to report any more.
        again = await check(tc, options)
        assert again.violations == [] and again.marked_underreplicated == []


async def test_a_ledger_that_cannot_adhere_is_reported_once_and_left_marked(
    zk: ZkClient, tmp_path: Path
) -> None:
    """L4 E3/W2 on /r1 with only /r1 and /r2 to move to: refused on every attempt, one warning,
    the mark and the metadata untouched; with b6 up in /r3, the next attempt moves two
    copies (one to /r2, one to /r3) and the mark goes."""
    async with test_cluster(zk, 7, password=PASSWORD) as tc:
        b = tc.ids
        third = tc.by_id(b[6])
        await third.crash()
        options = [racks_option(tmp_path, tc), KEY, FAST_RETRY]
        before = (b[0], b[1], b[2])
        written = await tc.writer.write_ledger(
            4, [(0, before)], write_quorum=2, ack_quorum=2, num_entries=ENTRIES
        )
        assert (await check(tc, options)).marked_underreplicated == [4]
        mark = await mark_of(zk, 4)
        assert mark is not None
        for emu in tc.bookies:
            emu.reset_stats()

        async with worker(tc, options) as (w, log):
            await until(
                w.released,
                lambda: w.state.failures[Failure.NO_TARGET] >= 4,
                f"four refused attempts; log: {log.lines}",
                within=60,
            )
            refusals = log.find("ledger not re-replicated", 4)
            assert [lvl for lvl, _ in refusals] == ["warning"] + ["debug"] * (len(refusals) - 1)
            assert {f["detail"] for _, f in refusals} == {
                "ledger 4 segment 0 (from entry 0) cannot be made to adhere to the placement "
                "policy: write quorum spans 1 rack(s), needs 2, and no move to the 3 writable "
                "bookie(s) outside the ensemble in /r1, /r2 makes every write quorum adhere; "
                "its mark stays"
            }
            assert {f["reason"] for _, f in refusals} == {"no_target"}
            # Left as upstream leaves it: marked (the same znode, the same bytes), the
            # metadata as it was, nothing copied.
            assert await mark_of(zk, 4) == mark
            assert (await metadata(zk, written.path, 4))[1] == 0
            assert sum(e.stats()["recovery_adds"] + e.stats()["adds"] for e in tc.bookies) == 0
            # The next placement check marks it again: nothing changes.
            assert (await check(tc, options)).marked_underreplicated == [4]
            assert await mark_of(zk, 4) == mark

            await third.restart()
            await until(
                w.released,
                lambda: w.state.ledgers_replicated == 1,
                f"ledger 4 re-replicated; log: {log.lines}",
                within=60,
            )
        md, version = await metadata(zk, written.path, 4)
        after = md.segments[0].bookies
        assert version == 1
        assert sorted(rack_of(tc, x) for x in after) == ["/r1", "/r2", "/r3"]
        assert b[6] in after
        changed = [i for i in range(3) if before[i] != after[i]]
        assert len(changed) == 2
        held = sum(stores_entry(i, e, 3, 2) for i in changed for e in range(ENTRIES))
        assert await assert_moved_copies(tc, 4, before, after, 2) == held
        assert await mark_of(zk, 4) is None
        assert await zk.get_children(f"{ROOT}/underreplication/locks") == []


async def test_with_the_key_off_on_the_worker_a_placement_mark_goes_without_a_move(
    zk: ZkClient, tmp_path: Path
) -> None:
    """Spec §1.5: a worker without the key finds nothing to repair in a placement mark
    (its data is whole) and deletes it, as upstream's does; nothing moves."""
    async with test_cluster(zk, 7, password=PASSWORD) as tc:
        b = tc.ids
        racks = racks_option(tmp_path, tc)
        written = await tc.writer.write_ledger(
            5, [(0, (b[0], b[1], b[2]))], write_quorum=3, ack_quorum=2, num_entries=ENTRIES
        )
        assert (await check(tc, [racks, KEY])).marked_underreplicated == [5]
        for emu in tc.bookies:
            emu.reset_stats()
        async with worker(tc, [racks, FAST_RETRY]) as (w, _):
            await until(
                w.released,
                lambda: w.state.ledgers_found_healthy == 1,
                "the placement mark removed",
                within=60,
            )
        assert await mark_of(zk, 5) is None
        assert (await metadata(zk, written.path, 5))[1] == 0
        assert sum(e.stats()["recovery_adds"] for e in tc.bookies) == 0
