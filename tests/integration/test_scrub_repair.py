"""The deep scrub's marks repaired by the worker: a real ZooKeeper, emulated bookies over
TCP, the scrub driver and the worker's own loop.

A copy the scrub finds corrupt or unreadable is listed by its bookie like a sound one, so
the worker's plan (from listings) finds nothing missing. Before the re-verification
(`worker/reverify.py`) the worker unmarked such a ledger as healthy and the bad copy
stayed; now it reads the named bookie's share back, replaces it in exactly the segments
where a copy is bad, and keeps the mark when that bookie does not answer.

Round robin with E=3, W=2: entry e on positions (e mod 3) and (e + 1 mod 3).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.bookie.protocol import Operation, verify_entry_body
from auditor.checks.findings import CheckReport
from auditor.checks.scrub_run import run_scrub_check
from auditor.daemon.metrics import Metrics
from auditor.daemon.state import DaemonState
from auditor.metadata.model import DigestType, Segment
from auditor.metadata.schedule import stores_entry
from auditor.metadata.serde import decode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager, ur_ledger_path
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.inprocess import until
from auditor.worker.loop import ReplicationWorker
from auditor.worker.repair import WorkerConnection
from auditor.worker.state import Failure, WorkerState
from auditor.zk import ZkClient
from tests.integration.test_worker_recovery import RecordingLog

ROOT = "/ledgers"
LID = 5
PASSWORD = b"scrub-repair"
FAST = ["checks.retry_delay=0.1", "checks.retry_attempts=1", "readEntryTimeout=1"]
#: A first failed attempt holds the lock for 3200000/32 ms = 100 s: one attempt per test.
HOLD = "lockReleaseOfFailedLedgerGracePeriod=3200000"
READ, ADD = Operation.READ_ENTRY, Operation.ADD_ENTRY

pytestmark = pytest.mark.timeout(90)


async def scrub(tc: TestCluster, *, mark: bool) -> CheckReport:
    async with tc.context(overrides=FAST, mark=mark) as ctx:
        return await run_scrub_check(ctx)


def found(report: CheckReport) -> list[tuple[int, str, str | None, list[list[int]]]]:
    return sorted(
        (v.ledger_id, str(v.category), v.bookie, v.detail["entries"]) for v in report.violations
    )


@contextlib.asynccontextmanager
async def worker(tc: TestCluster) -> AsyncIterator[tuple[ReplicationWorker, RecordingLog]]:
    log = RecordingLog()
    async with tc.context(overrides=[*FAST, HOLD]) as ctx:
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


async def mark_of(zk: ZkClient, tc: TestCluster) -> bytes | None:
    path = ur_ledger_path(f"{tc.root}/underreplication", LID)
    if await zk.exists(path) is None:
        return None
    data, _ = await zk.get(path)
    return data


async def metadata(zk: ZkClient, path: str) -> tuple[tuple[Segment, ...], int]:
    data, stat = await zk.get(path)
    return decode_ledger_metadata(data, LID).segments, stat.version


def share(first: int, last: int, position: int) -> list[int]:
    return [e for e in range(first, last + 1) if stores_entry(position, e, 3, 2)]


def sound(body: bytes | None, entry: int) -> bool:
    assert body is not None, entry
    out = verify_entry_body(body, DigestType.CRC32C, PASSWORD)
    return (out.ledger_id, out.entry_id) == (LID, entry)


async def replicated(w: ReplicationWorker, log: RecordingLog) -> None:
    await until(
        w.released,
        lambda: w.state.ledgers_replicated + w.state.ledgers_found_healthy == 1,
        f"ledger done; log: {log.lines}",
        within=30,
    )


async def test_a_corrupt_copy_is_replaced_in_exactly_its_segment(zk: ZkClient) -> None:
    """b0 holds position 0 of both segments; its copy of entry 9 (segment 1) is flipped.
    Only segment 1's b0 goes, to b2 (the one bookie outside that segment's ensemble)."""
    async with test_cluster(zk, 4, password=PASSWORD) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(
            LID, [(0, (b[0], b[1], b[2])), (6, (b[0], b[1], b[3]))], write_quorum=2, num_entries=12
        )
        tc.bookies[0].corrupt_entry(LID, 9)
        report = await scrub(tc, mark=True)
        assert found(report) == [(LID, "corrupt_copy", b[0], [[9, 9]])]
        assert report.marked_underreplicated == [LID]
        _, version = await metadata(zk, written.path)
        async with worker(tc) as (w, log):
            await replicated(w, log)
            assert w.state.ledgers_replicated == 1
            assert w.state.fragments_replicated == 1
            assert w.state.fragments_by_reason == Counter({"corrupt_copy": 1})
            # b0's shares of both segments were read back: 0, 2, 3, 5 and 6, 8, 9, 11.
            assert w.state.entries_reverified == 8
            # The metrics say why the bookie was replaced.
            samples = {
                (x.name, x.labels.get("reason", "")): x.value
                for f in text_string_to_metric_families(
                    Metrics(DaemonState(identity="", worker=w.state)).exposition().decode()
                )
                for x in f.samples
            }
            reasons = "bookkeeper_auditor_worker_fragments_replicated_by_reason_total"
            assert samples[reasons, "corrupt_copy"] == 1
            assert samples["bookkeeper_auditor_worker_entries_reverified_total", ""] == 8
        segments, after = await metadata(zk, written.path)
        assert segments == (Segment(0, (b[0], b[1], b[2])), Segment(6, (b[2], b[1], b[3])))
        assert after == version + 1
        assert await mark_of(zk, tc) is None
        [(_, fields, _)] = log.find("fragments committed")
        assert (fields["replaced"], fields["reasons"]) == ({b[0]: b[2]}, {b[0]: "corrupt_copy"})
        [(level, warned, _)] = log.find(
            "bad copies found on a bookie the mark names; it is replaced there"
        )
        assert (level, warned["bookie"], warned["segment"], warned["reason"]) == (
            "warning",
            b[0],
            1,
            "corrupt_copy",
        )
        assert warned["bad_copies"] == {"corrupt_copy": 1}
        # The new bookie holds every entry of position 0 of segment 1, each sound and
        # byte for byte what the good copy holds.
        new, b1, b3 = tc.bookies[2], tc.bookies[1], tc.bookies[3]
        for e in share(6, 11, 0):
            body = new.entry_body(LID, e)
            assert sound(body, e)
            assert body == (b1.entry_body(LID, e) if e % 3 == 0 else b3.entry_body(LID, e))
        assert found(await scrub(tc, mark=False)) == []


async def test_a_corrupt_source_is_skipped_for_another(zk: ZkClient) -> None:
    """E3/W3: every bookie holds every entry. b0's entry 2 is marked corrupt; then b2's
    copy of entry 2 rots too. Entry 2's write set starts at b2: the copy reads b2's,
    finds its digest bad, and takes b1's; the new bookie's copy verifies."""
    async with test_cluster(zk, 4, password=PASSWORD) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(
            LID, [(0, (b[0], b[1], b[2]))], write_quorum=3, num_entries=6
        )
        tc.bookies[0].corrupt_entry(LID, 2)
        report = await scrub(tc, mark=True)
        assert found(report) == [(LID, "corrupt_copy", b[0], [[2, 2]])]
        tc.bookies[2].corrupt_entry(LID, 2)
        for emu in tc.bookies:
            emu.reset_stats()
        async with worker(tc) as (w, log):
            await replicated(w, log)
            assert w.state.fragments_by_reason == Counter({"corrupt_copy": 1})
        segments, _ = await metadata(zk, written.path)
        assert segments == (Segment(0, (b[3], b[1], b[2])),)
        assert await mark_of(zk, tc) is None
        new = tc.bookies[3]
        for e in range(6):
            assert sound(new.entry_body(LID, e), e)
        assert new.entry_body(LID, 2) == tc.bookies[1].entry_body(LID, 2)
        assert new.entry_body(LID, 2) != tc.bookies[2].entry_body(LID, 2)
        # The rotten source was asked (and refused as a source), then another.
        assert tc.bookies[2].received[READ] >= 1
        # b2's own corrupt copy is the next scrub's finding, and nothing else.
        assert found(await scrub(tc, mark=False)) == [(LID, "corrupt_copy", b[2], [[2, 2]])]


async def test_an_unreadable_copy_is_replaced(zk: ZkClient) -> None:
    """b1 lists entries 4 and 7 but answers EIO for them: replaced by b3."""
    async with test_cluster(zk, 4, password=PASSWORD) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(
            LID, [(0, (b[0], b[1], b[2]))], write_quorum=2, num_entries=9
        )
        tc.bookies[1].make_unreadable(LID, [4, 7])
        report = await scrub(tc, mark=True)
        assert found(report) == [(LID, "unreadable_copy", b[1], [[4, 4], [7, 7]])]
        async with worker(tc) as (w, log):
            await replicated(w, log)
            assert w.state.fragments_by_reason == Counter({"unreadable_copy": 1})
        segments, _ = await metadata(zk, written.path)
        assert segments == (Segment(0, (b[0], b[3], b[2])),)
        assert await mark_of(zk, tc) is None
        new = tc.bookies[3]
        held = new.availability(LID)
        assert held is not None and list(held.entries()) == share(0, 8, 1)
        for e in share(0, 8, 1):
            assert sound(new.entry_body(LID, e), e)
        [(_, fields, _)] = log.find("fragments committed")
        assert fields["reasons"] == {b[1]: "unreadable_copy"}
        assert found(await scrub(tc, mark=False)) == []


async def test_a_silent_bookie_on_re_verification_keeps_the_mark(zk: ZkClient) -> None:
    """b0 is marked for a corrupt copy, then answers lists but not reads (longer than
    readEntryTimeout): the attempt fails (unknown_bookies), nothing is written, the mark
    stays and the lock is held for the failed-ledger delay."""
    async with test_cluster(zk, 4, password=PASSWORD) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(
            LID, [(0, (b[0], b[1], b[2]))], write_quorum=2, num_entries=6
        )
        tc.bookies[0].corrupt_entry(LID, 3)
        await scrub(tc, mark=True)
        mark = await mark_of(zk, tc)
        assert mark is not None
        before = await metadata(zk, written.path)
        tc.bookies[0].set_latency(3.0, READ)
        for emu in tc.bookies:
            emu.reset_stats()
        async with worker(tc) as (w, log):
            await until(
                log.changed,
                lambda: bool(log.find("ledger not re-replicated")),
                f"the attempt; log: {log.lines}",
                within=30,
            )
            [(level, fields, _)] = log.find("ledger not re-replicated")
            assert (level, fields["reason"], fields["lock_held_for_s"]) == (
                "warning",
                "unknown_bookies",
                100.0,
            )
            assert fields["detail"].startswith(
                f"re-verifying the copies on {b[0]}, named by the mark: no answer (entry "
            )
            assert fields["detail"].endswith("; the mark stays")
            assert w.state.failures == Counter({Failure.UNKNOWN_BOOKIES: 1})
            assert (w.state.ledgers_found_healthy, w.state.ledgers_replicated) == (0, 0)
            assert await mark_of(zk, tc) == mark
            assert await metadata(zk, written.path) == before
            assert all(emu.received[ADD] == 0 for emu in tc.bookies)


async def test_a_mark_for_a_live_bookie_with_sound_copies_goes_and_nothing_is_written(
    zk: ZkClient,
) -> None:
    """A mark naming b1 (as Java's auditor writes it) whose copies are all sound: b1's
    share is read back once, the mark goes, nothing is copied or committed."""
    async with test_cluster(zk, 4, password=PASSWORD) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(
            LID, [(0, (b[0], b[1], b[2]))], write_quorum=2, num_entries=9
        )
        await UnderreplicationManager(zk, ROOT).mark_underreplicated(LID, [b[1]])
        before = await metadata(zk, written.path)
        for emu in tc.bookies:
            emu.reset_stats()
        async with worker(tc) as (w, log):
            await replicated(w, log)
            assert (w.state.ledgers_found_healthy, w.state.ledgers_replicated) == (1, 0)
            assert w.state.entries_reverified == len(share(0, 8, 1))
            assert w.state.fragments_replicated == 0
        assert await mark_of(zk, tc) is None
        assert await metadata(zk, written.path) == before
        assert [emu.received[READ] for emu in tc.bookies] == [0, len(share(0, 8, 1)), 0, 0]
        assert all(emu.received[ADD] == 0 for emu in tc.bookies)
        [(_, fields, _)] = log.find("copies re-verified sound on a bookie the mark names")
        assert fields == {"ledger": LID, "bookie": b[1], "entries": 6}
