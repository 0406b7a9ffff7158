"""What the replication worker makes of a failure: passing, or loss; and whom it reads as.

A real ZooKeeper, emulated bookies over TCP, the worker's own loop (`ReplicationWorker`)
on ledgers written with the real protocol. Each test provokes one situation and asserts
the exact outcome: the failure counted, the line logged (level, reason, detail), how
long the lock was held, and what the metadata, the mark and the bookies hold after.

* A source that errs or stalls for a moment (EIO, ETOOMANYREQUESTS, no answer) is no
  evidence that an entry is gone: the ledger goes to upstream's failed-ledger delay
  (`source_failed`, seconds) and is repaired at the next take. Before, each entry it
  did not serve counted as having no copy anywhere: the ledger was reported
  unrecoverable and locked for `worker.unrecoverable_retry` (an hour).
* An open ledger whose lost bookies hold an ack quorum of a write set of its last
  ensemble can never be recovered: it is reported unrecoverable and held like any
  other, never fenced. Before, it was fenced, failed and logged an error every grace
  period, forever.
* A ledger whose metadata names no password or digest type (format 1) is read with
  BookKeeper's `digestType` and `passwd`, as upstream's admin opens it; the target gets
  the master key of `passwd`. Before, CRC32 and an empty password: a MAC ledger had
  "no readable copy".
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from auditor.bookie.protocol import Operation, Status, master_key
from auditor.metadata.model import DigestType, LedgerState, Segment
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
LID = 3
PASSWORD = b"outcome-secret"
ENTRIES = 12

pytestmark = pytest.mark.timeout(90)


@contextlib.asynccontextmanager
async def worker(
    tc: TestCluster, *overrides: str, unrecoverable_retry: float = 3600.0
) -> AsyncIterator[tuple[ReplicationWorker, RecordingLog]]:
    log = RecordingLog()
    async with tc.context(overrides=list(overrides)) as ctx:
        connected = asyncio.Event()
        connected.set()
        conn = WorkerConnection(connected, asyncio.Event())
        w = ReplicationWorker(
            ctx,
            conn,
            WorkerState(),
            holder="test-host",
            unrecoverable_retry=unrecoverable_retry,
            log=log,
        )
        run = asyncio.ensure_future(w.run())
        try:
            yield w, log
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)


def not_replicated(log: RecordingLog) -> list[tuple[str, str, str]]:
    """Each "ledger not re-replicated" line: (level, reason, detail)."""
    return [(lvl, f["reason"], f["detail"]) for lvl, f, _ in log.find("ledger not re-replicated")]


async def lose_and_mark(zk: ZkClient, tc: TestCluster, bookie: str) -> None:
    await tc.by_id(bookie).crash()  # unregistered, its data kept (to compare with)
    await UnderreplicationManager(zk, ROOT).mark_underreplicated(LID, [bookie])
    for emu in tc.bookies:
        emu.reset_stats()


async def replicated(w: ReplicationWorker, log: RecordingLog) -> None:
    await until(
        w.released,
        lambda: w.state.ledgers_replicated == 1,
        f"ledger re-replicated; log: {log.lines}",
        within=30,
    )


# --- a) a passing read failure is no loss ----------------------------------------------------

#: Longer than readEntryTimeout (1 s below): a read sent during the stall times out.
STALL = 3.0


@pytest.mark.parametrize("fault", ["EIO", "ETOOMANYREQUESTS", "stall"])
async def test_a_source_failing_for_a_moment_is_retried_soon_not_taken_for_loss(
    zk: ZkClient, fault: str
) -> None:
    # E3/W2/A2 on b0, b1, b2; b0 lost. Entry 0 (write set b0, b1) has one copy left, on
    # b1, and b1 fails its reads (an error, or silence) during the first attempt.
    async with test_cluster(zk, 4, password=PASSWORD) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(
            LID, [(0, (b[0], b[1], b[2]))], write_quorum=2, ack_quorum=2, num_entries=ENTRIES
        )
        lost, survivor, target = tc.by_id(b[0]), tc.by_id(b[1]), tc.by_id(b[3])
        await lose_and_mark(zk, tc, b[0])
        if fault == "stall":
            survivor.set_latency(STALL, Operation.READ_ENTRY)
        else:
            survivor.inject_status(Status[fault], Operation.READ_ENTRY)
        overrides = ("readEntryTimeout=1", "lockReleaseOfFailedLedgerGracePeriod=32000")
        async with worker(tc, *overrides) as (w, log):
            await until(log.changed, lambda: bool(not_replicated(log)), "the first attempt", 30)
            survivor.clear_faults()  # the bookie is itself again before the retry
            [(level, reason, detail)] = not_replicated(log)
            [(_, fields, _)] = log.find("ledger not re-replicated")
            # Upstream's failed-ledger delay (32000 ms / 32), not worker.unrecoverable_retry.
            assert (level, reason, fields["lock_held_for_s"]) == ("warning", "source_failed", 1.0)
            # The window (10 entries) held all eight of b0's: b1's four failed together.
            answer = "timeout: .*" if fault == "stall" else fault
            assert re.fullmatch(
                re.escape(
                    f"a source failed or did not answer: segment 0 [0-11] position 0 {b[0]} "
                    f"(lost): entries 0, 3, 6, 9 not served (entry "
                )
                + f"[0369]: {re.escape(b[1])}: {answer}\\)",
                detail,
            ), detail
            assert w.state.unrecoverable == {}
            await replicated(w, log)
            assert w.state.failures == Counter({Failure.SOURCE_FAILED: 1})
            assert w.state.unrecoverable == {}
        data, _ = await zk.get(written.path)
        md = decode_ledger_metadata(data, LID)
        assert md.segments == (Segment(0, (b[3], b[1], b[2])),)
        for e in range(ENTRIES):
            if stores_entry(0, e, 3, 2):
                assert target.entry_body(LID, e) == lost.entry_body(LID, e), e
        assert await UnderreplicationManager(zk, ROOT).get(LID) is None


async def test_copies_only_on_a_bookie_the_mark_does_not_name_are_away_not_lost(
    zk: ZkClient,
) -> None:
    """Found by the soak with real workers: E3/W2 on b0, b1, b2; b0 lost its data (the
    mark names it) and, as the worker copies, b1 (entry 0's other holder) is down for a
    restart, unregistered, within lostBookieRecoveryDelay, so the mark does not name it.
    Entry 0 then has no source to read, but its copy on b1 is away, not gone: a passing
    failure (the failed-ledger delay, seconds), repaired once b1 is back. Before, it was
    unrecoverable: reported as loss and locked for worker.unrecoverable_retry (an hour).
    A bookie the mark names stays lost (`test_worker_faults.py::
    test_an_unrecoverable_ledger_is_reported_kept_marked_and_tried_once_per_backoff`)."""
    async with test_cluster(zk, 5, password=PASSWORD) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(
            LID, [(0, (b[0], b[1], b[2]))], write_quorum=2, ack_quorum=2, num_entries=ENTRIES
        )
        emptied, restarting = tc.by_id(b[0]), tc.by_id(b[1])
        kept = {e: emptied.entry_body(LID, e) for e in range(ENTRIES)}
        emptied.drop_ledger(LID)
        await UnderreplicationManager(zk, ROOT).mark_underreplicated(LID, [b[0]])
        await restarting.crash()  # unregistered, its data kept
        overrides = ("lockReleaseOfFailedLedgerGracePeriod=32000",)
        async with worker(tc, *overrides) as (w, log):
            await until(log.changed, lambda: bool(not_replicated(log)), "the first attempt", 30)
            [(level, reason, detail)] = not_replicated(log)
            [(_, fields, _)] = log.find("ledger not re-replicated")
            assert (level, reason, fields["lock_held_for_s"]) == ("warning", "source_failed", 1.0)
            assert f"{b[1]}: not registered, not named lost by the mark" in detail, detail
            assert w.state.unrecoverable == {}
            await restarting.start()
            await replicated(w, log)
            assert w.state.failures == Counter({Failure.SOURCE_FAILED: 1})
        data, _ = await zk.get(written.path)
        md = decode_ledger_metadata(data, LID)
        [seg] = md.segments
        assert seg.bookies[1:] == (b[1], b[2]) and seg.bookies[0] in (b[3], b[4])
        for e in range(ENTRIES):
            if stores_entry(0, e, 3, 2):
                assert tc.by_id(seg.bookies[0]).entry_body(LID, e) == kept[e], e
        assert await UnderreplicationManager(zk, ROOT).get(LID) is None


# --- b) an open ledger no recovery can close -------------------------------------------------

GRACE_MS = 500
#: worker.unrecoverable_retry (s): the lock is held this long after each report.
RETRY = 2.0


async def test_an_open_ledger_no_recovery_can_close_is_unrecoverable_and_never_fenced(
    zk: ZkClient,
) -> None:
    # E1/W1/A1 on b0 alone, OPEN, and b0 lost: no fencing read can ever say where the
    # ledger ends (every write quorum is b0), so recovery cannot succeed until b0 is back.
    async with test_cluster(zk, 3, password=PASSWORD) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(
            LID, [(0, (b[0],))], write_quorum=1, ack_quorum=1, num_entries=5, state=LedgerState.OPEN
        )
        data, stat = await zk.get(written.path)
        await lose_and_mark(zk, tc, b[0])
        mark_path = ur_ledger_path(f"{ROOT}/underreplication", LID)
        mark = await zk.get(mark_path)
        grace = f"openLedgerRereplicationGracePeriod={GRACE_MS}"
        async with worker(tc, grace, unrecoverable_retry=RETRY) as (w, log):

            def reports() -> list[float]:
                lines = log.find("ledger not re-replicated")
                return [t for lvl, f, t in lines if f["reason"] == "unrecoverable"]

            await until(log.changed, lambda: len(reports()) == 2, f"two reports: {log.lines}", 30)
            first, second = reports()
            state = w.state
            failures, recovered, failed = (
                state.failures.copy(),
                state.ledgers_recovered,
                state.recoveries_failed,
            )
            unrecoverable = state.unrecoverable[LID]
            held = state.in_hand[LID]
        why = (
            f"open ledger: its last segment (from entry 0) has lost {b[0]}: 1 of the 1 "
            "bookies of the write quorum at positions [0], where 1 acknowledge an entry "
            "(E1/W1/A1), so no fencing read can learn where the ledger ends until one "
            "comes back; kept marked for an operator"
        )
        # Each attempt: deferred for the grace period, then reported once, as an error.
        assert not_replicated(log)[:4] == [
            ("warning", "open_ledger", f"open ledger: its last segment is under-replicated "
             f"(segment 0 [0-?] position 0 {b[0]} (lost))"),
            ("error", "unrecoverable", why),
        ] * 2  # fmt: skip
        assert failures == Counter({Failure.OPEN_LEDGER: 2, Failure.UNRECOVERABLE: 2})
        # The lock held for worker.unrecoverable_retry after the report (then the grace).
        assert second - first >= RETRY + GRACE_MS / 1000 - 0.1
        assert (unrecoverable.ranges, held.step) == ((), "deferred")
        # Never fenced, never recovered, never failed: nothing was attempted.
        assert (recovered, failed) == (0, 0)
        assert log.find("recovering open ledger") == []
        assert log.find("open ledger not recovered; its mark stays") == []
        assert [e.fence_reads[LID] for e in tc.bookies] == [0, 0, 0]
        # The metadata (still OPEN, not IN_RECOVERY) and the mark are untouched.
        after, after_stat = await zk.get(written.path)
        assert (after, after_stat.version) == (data, stat.version)
        assert await zk.get(mark_path) == mark


# --- c) no password in the metadata ----------------------------------------------------------


async def test_a_ledger_whose_metadata_holds_no_password_is_read_with_digest_type_and_passwd(
    zk: ZkClient,
) -> None:
    # Metadata format 1 holds neither password nor digest type; the entries are MAC'd.
    async with test_cluster(zk, 4, password=PASSWORD) as tc:
        tc.writer.digest_type = DigestType.HMAC
        b = tc.ids
        written = await tc.writer.write_ledger(
            LID,
            [(0, (b[0], b[1], b[2]))],
            write_quorum=2,
            ack_quorum=2,
            num_entries=ENTRIES,
            format_version=1,
        )
        assert (written.metadata.digest_type, written.metadata.password) == (None, None)
        lost, target = tc.by_id(b[0]), tc.by_id(b[3])
        await lose_and_mark(zk, tc, b[0])
        keys = ("digestType=MAC", f"passwd={PASSWORD.decode()}")
        async with worker(tc, *keys) as (w, log):
            await replicated(w, log)
            assert w.state.failures == Counter()
        data, _ = await zk.get(written.path)
        md = decode_ledger_metadata(data, LID)
        assert (md.format_version, md.segments) == (1, (Segment(0, (b[3], b[1], b[2])),))
        # The master key of `passwd`, as the writer's bookies hold it; the bodies unchanged.
        assert target.ledger_master_key(LID) == master_key(PASSWORD)
        assert target.ledger_master_key(LID) == tc.by_id(b[1]).ledger_master_key(LID)
        copied = [e for e in range(ENTRIES) if stores_entry(0, e, 3, 2)]
        assert copied == [0, 2, 3, 5, 6, 8, 9, 11]
        for e in copied:
            assert target.entry_body(LID, e) == lost.entry_body(LID, e), e
