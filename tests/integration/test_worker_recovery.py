"""Open ledgers under the worker: the grace period, then fencing, recovery, close and copy.

A real ZooKeeper and emulated bookies over TCP; ledgers written with the real protocol.
The ledger is E3/W2/A2 and OPEN: entries 0..9 acknowledged (on their whole write
set), then a tail the writer never got acknowledged, each entry on one member of its
write set only: 10 on b1, 11 on b2, 12 on the lost b0, 13 on b1. What recovery must
make of it (spec §2.4): 10 and 11 are found (a copy exists) and re-added to their
whole write set; 12 is missing (its one live replica has no copy, so with A2 it was
never acknowledged), which ends the ledger; 13, past the gap, is dropped. The ledger
closes at lastEntryId 11 with the length entry 11 carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from auditor.bookie.protocol import Status, encode_entry_body
from auditor.bookie.results import ErrorStatus
from auditor.metadata.model import DigestType, LedgerMetadata, LedgerState, Segment
from auditor.metadata.serde import decode_ledger_metadata, encode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.inprocess import until
from auditor.worker.loop import ReplicationWorker
from auditor.worker.recovery import NotCoveredError, recover_open_ledger
from auditor.worker.repair import WorkerConnection
from auditor.worker.state import Failure, WorkerState
from auditor.zk import ZkClient

ROOT = "/ledgers"
PASSWORD = b"open-secret"
LID = 7
ACKED = 10  # entries 0..9 acknowledged
PAYLOAD = 16  # LedgerWriter's default payload size
GRACE_MS = 1500

pytestmark = pytest.mark.timeout(90)


class RecordingLog:
    """The worker's logger: every line kept with the time it was logged."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any], float]] = []
        self.changed = asyncio.Event()

    def _add(self, level: str, event: str, fields: dict[str, Any]) -> None:
        self.lines.append((level, event, fields, time.monotonic()))
        self.changed.set()

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

    def find(self, event: str) -> list[tuple[str, dict[str, Any], float]]:
        return [(lvl, f, t) for lvl, e, f, t in self.lines if e == event]


def tail_body(tc: TestCluster, entry_id: int) -> bytes:
    """An entry of the unacknowledged tail as its writer sent it: LAC 9 (the last
    acknowledged entry), the running length, the writer's payload."""
    w = tc.writer
    return encode_entry_body(
        LID,
        entry_id,
        ACKED - 1,
        (entry_id + 1) * PAYLOAD,
        w.payload(LID, entry_id),
        DigestType.CRC32C,
        PASSWORD,
    )


async def open_ledger(tc: TestCluster, *, tail: bool = True) -> str:
    """Ledger 7 on (b0, b1, b2), OPEN, entries 0..9 acknowledged and the tail above."""
    b = tc.ids
    written = await tc.writer.write_ledger(
        LID,
        [(0, (b[0], b[1], b[2]))],
        write_quorum=2,
        ack_quorum=2,
        num_entries=ACKED,
        state=LedgerState.OPEN,
    )
    if tail:
        for entry_id, holder in {10: b[1], 11: b[2], 12: b[0], 13: b[1]}.items():
            tc.by_id(holder).put_entry(LID, entry_id, tail_body(tc, entry_id))
    return written.path


async def metadata(zk: ZkClient, path: str) -> LedgerMetadata:
    data, stat = await zk.get(path)
    return decode_ledger_metadata(data, LID, int(stat.ctime))


async def lose_b0_and_mark(zk: ZkClient, tc: TestCluster) -> None:
    await tc.by_id(tc.ids[0]).crash()  # unregistered, its data kept (to compare with)
    await UnderreplicationManager(zk, ROOT).mark_underreplicated(LID, [tc.ids[0]])
    for emu in tc.bookies:
        emu.reset_stats()


@contextlib.asynccontextmanager
async def worker(tc: TestCluster) -> AsyncIterator[tuple[ReplicationWorker, RecordingLog]]:
    log = RecordingLog()
    overrides = [f"openLedgerRereplicationGracePeriod={GRACE_MS}"]
    async with tc.context(overrides=overrides) as ctx:
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


async def deferred(log: RecordingLog) -> float:
    """When the worker deferred the open ledger (its grace period starts after this)."""
    await until(log.changed, lambda: bool(log.find("ledger not re-replicated")), "deferral", 30)
    [(level, fields, at)] = log.find("ledger not re-replicated")
    assert (level, fields["reason"], fields["ledger"]) == ("warning", "open_ledger", LID)
    return at


async def replicated(w: ReplicationWorker, log: RecordingLog) -> None:
    await until(
        w.released,
        lambda: w.state.ledgers_replicated == 1,
        f"ledger re-replicated; log: {log.lines}",
        within=45,
    )


def recovery_adds(tc: TestCluster) -> dict[str, Counter[tuple[int, int]]]:
    return {e.bookie_id: +e.recovery_adds_per_entry for e in tc.bookies[1:]}


async def test_an_open_ledger_is_fenced_recovered_closed_and_copied_only_after_the_grace(
    zk: ZkClient,
) -> None:
    async with test_cluster(zk, 4, password=PASSWORD) as tc:
        b = tc.ids
        b0, b1, b2, b3 = (tc.by_id(x) for x in b)
        path = await open_ledger(tc)
        await lose_b0_and_mark(zk, tc)
        async with worker(tc) as (w, log):
            at = await deferred(log)
            # The grace period: nothing fenced, nothing re-added, the ledger still OPEN.
            assert [e.fence_reads[LID] for e in tc.bookies] == [0, 0, 0, 0]
            assert not any(e.is_fenced(LID) for e in (b1, b2, b3))
            assert sum(e.recovery_add_requests[LID] for e in tc.bookies) == 0
            assert (await metadata(zk, path)).state is LedgerState.OPEN
            await replicated(w, log)
            assert w.state.failures == Counter({Failure.OPEN_LEDGER: 1})

        # Fenced only once the grace period was over, on every live member.
        assert b1.first_fence_read_at[LID] - at >= GRACE_MS / 1000
        assert b2.first_fence_read_at[LID] - at >= GRACE_MS / 1000
        assert (b1.is_fenced(LID), b2.is_fenced(LID), b3.is_fenced(LID)) == (True, True, False)
        # The LAC probe, then the forward reads: 10 (b1, b2), 11 (b2, b0), 12 (b0, b1).
        assert (b1.fence_reads[LID], b2.fence_reads[LID], b3.fence_reads[LID]) == (3, 3, 0)
        # As Java's client sends them: the LAC probe without priority (ReadLastConfirmedOp),
        # the recovery reads at high priority (PendingReadOp).
        assert b1.fence_reads_by_priority == Counter(
            {(LID, -1, 0): 1, (LID, 10, 100): 1, (LID, 12, 100): 1}
        )
        assert b2.fence_reads_by_priority == Counter(
            {(LID, -1, 0): 1, (LID, 10, 100): 1, (LID, 11, 100): 1}
        )
        # The writer, were it still writing, is refused.
        refused = await tc.writer.client.add_entry(
            b[1], LID, 14, tail_body(tc, 14), password=PASSWORD
        )
        assert refused == ErrorStatus(Status.EFENCED)

        # Closed at 11 with entry 11's length; the tail's failed member (b0) replaced
        # from entry 10 on; then segment 0's lost position copied to b3.
        md = await metadata(zk, path)
        assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 11, 12 * PAYLOAD)
        assert md.segments == (Segment(0, (b[3], b[1], b[2])), Segment(10, (b[3], b[1], b[2])))
        [(_, rec, _)] = log.find("open ledger recovered")
        assert (rec["lac"], rec["entries_readded"], rec["replaced"]) == (9, 2, {b[0]: b[3]})

        # Re-added: 10 to (b1, b2), 11 to (b2, b3); copied: b0's share of 0..9 to b3.
        copied = [e for e in range(ACKED) if e % 3 in (0, 2)]
        assert recovery_adds(tc) == {
            b[1]: Counter({(LID, 10): 1}),
            b[2]: Counter({(LID, 10): 1, (LID, 11): 1}),
            b[3]: Counter({(LID, 11): 1, **{(LID, e): 1 for e in copied}}),
        }
        assert sum(e.add_requests[LID] for e in tc.bookies) == 1  # the refused one
        for e in copied:
            assert b3.entry_body(LID, e) == b0.entry_body(LID, e), e
        assert b3.entry_body(LID, 11) == tail_body(tc, 11)
        assert b1.entry_body(LID, 10) == b2.entry_body(LID, 10) == tail_body(tc, 10)
        assert not b3.has_entry(LID, 12) and not b2.has_entry(LID, 13)

        assert await UnderreplicationManager(zk, ROOT).get(LID) is None
        assert await zk.get_children(f"{ROOT}/underreplication/locks") == []


async def test_a_writer_that_closes_its_ledger_in_the_grace_period_is_never_fenced(
    zk: ZkClient,
) -> None:
    async with test_cluster(zk, 4, password=PASSWORD) as tc:
        b = tc.ids
        path = await open_ledger(tc, tail=False)
        await lose_b0_and_mark(zk, tc)
        async with worker(tc) as (w, log):
            await deferred(log)
            # The writer closes the ledger itself, as its own close does.
            data, stat = await zk.get(path)
            md = decode_ledger_metadata(data, LID)
            closed = dataclasses.replace(
                md, state=LedgerState.CLOSED, last_entry_id=ACKED - 1, length=ACKED * PAYLOAD
            )
            await zk.set(path, encode_ledger_metadata(closed), stat.version)
            await replicated(w, log)
            assert w.state.failures == Counter({Failure.OPEN_LEDGER: 1})

        assert [e.fence_reads[LID] for e in tc.bookies] == [0, 0, 0, 0]
        assert not any(e.is_fenced(LID) for e in tc.bookies)
        [(_, why, _)] = log.find("open ledger needs no recovery")
        assert why["why"] == "closed by its writer"
        assert log.find("recovering open ledger") == []
        md = await metadata(zk, path)
        assert (md.state, md.last_entry_id, md.length) == (
            LedgerState.CLOSED,
            ACKED - 1,
            ACKED * PAYLOAD,
        )
        assert md.segments == (Segment(0, (b[3], b[1], b[2])),)
        copied = [e for e in range(ACKED) if e % 3 in (0, 2)]
        assert recovery_adds(tc) == {
            b[1]: Counter(),
            b[2]: Counter(),
            b[3]: Counter({(LID, e): 1 for e in copied}),
        }
        assert await UnderreplicationManager(zk, ROOT).get(LID) is None


async def test_a_writer_that_replaces_the_lost_bookie_in_the_grace_period_keeps_writing(
    zk: ZkClient,
) -> None:
    async with test_cluster(zk, 4, password=PASSWORD) as tc:
        b = tc.ids
        path = await open_ledger(tc, tail=False)
        await lose_b0_and_mark(zk, tc)
        async with worker(tc) as (w, log):
            await deferred(log)
            # The writer's ensemble change: from entry 10 on, b3 instead of b0.
            data, stat = await zk.get(path)
            md = decode_ledger_metadata(data, LID)
            changed = dataclasses.replace(
                md, segments=(*md.segments, Segment(ACKED, (b[3], b[1], b[2])))
            )
            await zk.set(path, encode_ledger_metadata(changed), stat.version)
            await replicated(w, log)

        assert [e.fence_reads[LID] for e in tc.bookies] == [0, 0, 0, 0]
        [(_, why, _)] = log.find("open ledger needs no recovery")
        assert why["why"] == "its last segment has no bad position any more"
        md = await metadata(zk, path)
        assert md.state is LedgerState.OPEN  # the writer's ledger goes on
        assert md.segments == (
            Segment(0, (b[3], b[1], b[2])),
            Segment(ACKED, (b[3], b[1], b[2])),
        )
        plain = await tc.writer.client.add_entry(
            b[3], LID, ACKED, tail_body(tc, ACKED), password=PASSWORD
        )
        assert plain.ok
        assert await UnderreplicationManager(zk, ROOT).get(LID) is None


# --- recover_open_ledger on its own ------------------------------------------------------------


@contextlib.asynccontextmanager
async def lock(zk: ZkClient) -> AsyncIterator[ZkClient]:
    """A fenced view on a node standing for the replication lock."""
    node = f"{ROOT}/underreplication/locks/urL{LID:010d}"
    await zk.create(node, b'bookieId: "test-host"\n', makepath=True)
    stat = await zk.exists(node)
    assert stat is not None
    yield zk.fenced(node, int(stat.version))


async def test_an_empty_open_ledger_is_closed_at_minus_one_with_length_zero(
    zk: ZkClient,
) -> None:
    async with test_cluster(zk, 4, password=PASSWORD) as tc, lock(zk) as fenced:
        b = tc.ids
        written = await tc.writer.write_ledger(
            LID,
            [(0, (b[0], b[1], b[2]))],
            write_quorum=3,
            ack_quorum=2,
            num_entries=0,
            state=LedgerState.OPEN,
        )
        await tc.by_id(b[0]).crash()
        rec = await recover_open_ledger(
            tc.writer.client, fenced, zk, written.path, LID, read_timeout=5, add_timeout=5
        )
        md = await metadata(zk, written.path)
        assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, -1, 0)
        assert (rec.closed_here, rec.lac, rec.entries_readded, rec.fenced) == (
            True,
            -1,
            0,
            (b[1], b[2]),
        )
        assert rec.metadata == md
        assert (tc.by_id(b[1]).is_fenced(LID), tc.by_id(b[2]).is_fenced(LID)) == (True, True)


async def test_fence_answers_that_do_not_cover_a_write_quorum_close_nothing(
    zk: ZkClient,
) -> None:
    async with test_cluster(zk, 4, password=PASSWORD) as tc, lock(zk) as fenced:
        b = tc.ids
        path = await open_ledger(tc)
        await tc.by_id(b[0]).crash()
        await tc.by_id(b[1]).crash()  # positions 0 and 1: the write quorum of entry 0 ...
        with pytest.raises(NotCoveredError, match="do not cover every write quorum"):
            await recover_open_ledger(
                tc.writer.client, fenced, zk, path, LID, read_timeout=5, add_timeout=5
            )
        md = await metadata(zk, path)
        # In recovery (as any client's attempt leaves it), not closed, segments unchanged.
        assert (md.state, md.last_entry_id, md.length) == (LedgerState.IN_RECOVERY, -1, 0)
        assert md.segments == (Segment(0, (b[0], b[1], b[2])),)
        assert sum(e.recovery_add_requests[LID] for e in tc.bookies) == 0


async def test_a_ledger_closed_before_recovery_is_returned_as_closed(zk: ZkClient) -> None:
    async with test_cluster(zk, 3, password=PASSWORD) as tc, lock(zk) as fenced:
        b = tc.ids
        written = await tc.writer.write_ledger(
            LID, [(0, tuple(b))], write_quorum=2, ack_quorum=2, num_entries=4
        )
        rec = await recover_open_ledger(tc.writer.client, fenced, zk, written.path, LID)
        assert (rec.closed_here, rec.lac, rec.metadata.last_entry_id) == (False, None, 3)
        assert [e.fence_reads[LID] for e in tc.bookies] == [0, 0, 0]


async def test_a_read_only_member_is_fenced_read_and_re_added_to_not_replaced(
    zk: ZkClient,
) -> None:
    """A read-only member of the last ensemble serves the fencing read and the recovery
    reads (a real 4.17.2 bookie does, with or without priority:
    tests/interop/test_conformance.py) and takes the re-adds, which carry Java's high
    priority (without it: EREADONLY): it stays in the ensemble, nothing is replaced."""
    async with test_cluster(zk, 3, password=PASSWORD) as tc, lock(zk) as fenced:
        b = tc.ids
        b0, b1, b2 = (tc.by_id(x) for x in b)
        path = await open_ledger(tc, tail=False)
        # Unacknowledged: 10 on b1 alone (write set b1, b2), 11 on b2 alone (b2, b0).
        b1.put_entry(LID, 10, tail_body(tc, 10))
        b2.put_entry(LID, 11, tail_body(tc, 11))
        await b1.set_readonly(True)
        for e in tc.bookies:
            e.reset_stats()
        rec = await recover_open_ledger(
            tc.writer.client, fenced, zk, path, LID, read_timeout=5, add_timeout=5
        )
        md = await metadata(zk, path)
        assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 11, 12 * PAYLOAD)
        assert md.segments == (Segment(0, (b[0], b[1], b[2])),)
        assert (rec.lac, rec.entries_readded, dict(rec.replaced)) == (9, 2, {})
        assert b1.entry_body(LID, 10) == b2.entry_body(LID, 10) == tail_body(tc, 10)
        assert b2.entry_body(LID, 11) == b0.entry_body(LID, 11) == tail_body(tc, 11)
        assert b1.recovery_adds_per_entry == Counter({(LID, 10): 1})
        # The LAC probe without priority, then 10 and 12 (missing from b0 and b1: the end).
        assert b1.fence_reads_by_priority == Counter(
            {(LID, -1, 0): 1, (LID, 10, 100): 1, (LID, 12, 100): 1}
        )
