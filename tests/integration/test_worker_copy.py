"""Copying a fragment: emulated bookies over TCP, ledgers written with the real protocol.

Each test writes a ledger with `LedgerWriter`, loses a bookie, copies its position to
another one with `FragmentCopier`, and checks at the emulators exactly what arrived:
which entries, byte for byte, under which master key, how many RECOVERY_ADDs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import pytest

from auditor.bookie.client import BookieClient
from auditor.bookie.protocol import Operation, Status, master_key
from auditor.bookie.results import ErrorStatus, Ok
from auditor.metadata.model import DigestType, LedgerMetadata, LedgerState
from auditor.metadata.registry import resolve_bookie
from auditor.metadata.schedule import stores_entry
from auditor.testing.bookie import BookieEmulator
from auditor.testing.cluster import ClusterWriter
from auditor.testing.writer import LedgerWriter
from auditor.worker.copy import (
    ByteRate,
    CopyEvent,
    CopyResult,
    CopyTask,
    FragmentCopier,
    InvalidCopyTaskError,
    TargetInEnsembleError,
    as_ranges,
    stored_entries,
)
from auditor.zk import ZkClient

ROOT = "/ledgers"
PASSWORD = b"secret"
READ, ADD = Operation.READ_ENTRY, Operation.ADD_ENTRY

pytestmark = pytest.mark.timeout(60)


@dataclass
class Cluster:
    bookies: list[BookieEmulator]
    client: BookieClient
    writer: LedgerWriter

    @property
    def ids(self) -> list[str]:
        return [b.bookie_id for b in self.bookies]


@contextlib.asynccontextmanager
async def cluster(
    zk: ZkClient,
    n: int,
    *,
    digest_type: DigestType = DigestType.CRC32C,
    payload_size: int = 16,
    request_timeout: float = 5.0,
) -> AsyncIterator[Cluster]:
    cw = ClusterWriter(zk, ROOT)
    await cw.init_cluster()
    bookies = [BookieEmulator(zk, ledgers_root=ROOT) for _ in range(n)]
    for b in bookies:
        await b.start()

    async def resolve(bookie_id: str) -> tuple[str, int] | None:
        return await resolve_bookie(zk, ROOT, bookie_id)

    client = BookieClient(resolve, request_timeout=request_timeout, backoff_max=0.5)
    writer = LedgerWriter(
        cw, client, digest_type=digest_type, password=PASSWORD, payload_size=payload_size
    )
    try:
        yield Cluster(bookies, client, writer)
    finally:
        await client.close()
        for b in bookies:
            await b.stop()


class Events:
    """Sums the copier's events, as the worker's metrics do."""

    def __init__(self) -> None:
        self.totals: Counter[str] = Counter()
        self.details: list[str] = []

    def __call__(self, event: CopyEvent) -> None:
        for name in (
            "entries_read",
            "bytes_read",
            "entries_written",
            "bytes_written",
            "read_failures",
            "entries_unreadable",
            "entries_unavailable",
        ):
            self.totals[name] += getattr(event, name)
        if event.detail:
            self.details.append(f"{event.entry_id}@{event.bookie}: {event.detail}")


def held(bookie: BookieEmulator, ledger_id: int) -> list[int]:
    avail = bookie.availability(ledger_id)
    return [] if avail is None else list(avail.entries())


def position_entries(md: LedgerMetadata, first: int, last: int, index: int) -> list[int]:
    return [
        e
        for e in range(first, last + 1)
        if stores_entry(index, e, md.ensemble_size, md.write_quorum)
    ]


def reset(c: Cluster) -> None:
    for b in c.bookies:
        b.reset_stats()


# --- pure parts ------------------------------------------------------------------------------


def test_stored_entries_and_ranges() -> None:
    assert list(stored_entries(0, 11, 3, 2, 1)) == [0, 1, 3, 4, 6, 7, 9, 10]
    assert list(stored_entries(10, 14, 3, 2, 1)) == [10, 12, 13]
    assert list(stored_entries(0, 5, 3, 3, 2)) == [0, 1, 2, 3, 4, 5]
    assert list(stored_entries(5, 4, 3, 2, 0)) == []
    assert list(stored_entries(0, 20, 5, 1, 3)) == [3, 8, 13, 18]
    assert as_ranges([13, 10, 12, 40, 12]) == ((10, 10), (12, 13), (40, 40))
    assert as_ranges([]) == ()


def test_byte_rate_settles_to_the_real_size() -> None:
    now = [0.0]
    rate = ByteRate(1000.0, clock=lambda: now[0])
    assert rate.reserve(500) == pytest.approx(0.5)  # the bucket starts empty
    rate.settle(500, 2000)  # the body weighed 2000: 1500 more owed
    assert rate.reserve(0) == pytest.approx(2.0)
    now[0] = 2.0
    assert rate.reserve(100) == pytest.approx(0.1)
    rate.settle(100, 0)  # nothing arrived: the reservation is given back
    assert rate.reserve(0) == 0.0
    now[0] = 100.0  # idle credit is capped at one second
    assert rate.reserve(3000) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        ByteRate(0)


def test_result_is_complete_only_without_failure_or_unreadable() -> None:
    assert CopyResult(3, 1, 1, (), None).complete
    assert not CopyResult(3, 1, 1, ((4, 4),), None).complete
    assert not CopyResult(3, 1, 1, (), "target gone").complete


# --- copies ------------------------------------------------------------------------------------


async def test_copies_exactly_the_round_robin_entries_byte_for_byte(zk: ZkClient) -> None:
    async with cluster(zk, 4) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            7, ids[:3], write_quorum=2, ack_quorum=2, num_entries=50
        )
        md = written.metadata
        lost = c.bookies[1]
        await lost.stop()
        target = c.bookies[3]
        reset(c)
        events = Events()
        copier = FragmentCopier(c.client, observer=events)
        task = CopyTask(7, md, 0, 1, ids[3], ((0, 49),), (ids[0], ids[2]))
        result = await copier.copy(task)

        expected = position_entries(md, 0, 49, 1)
        assert len(expected) == 34 and expected[:6] == [0, 1, 3, 4, 6, 7]
        bodies = [lost.entry_body(7, e) for e in expected]
        size = sum(len(b) for b in bodies if b is not None)
        assert result == CopyResult(34, size, size, (), None) and result.complete
        assert held(target, 7) == expected
        for e in expected:
            copy = target.entry_body(7, e)
            survivor = next(b for b in (c.bookies[0], c.bookies[2]) if b.has_entry(7, e))
            assert copy == survivor.entry_body(7, e) == lost.entry_body(7, e)
        assert target.ledger_master_key(7) == master_key(PASSWORD)
        # One RECOVERY_ADD per entry, no plain add, nothing written anywhere else.
        assert target.recovery_add_requests == Counter({7: 34})
        assert set(target.recovery_adds_per_entry.values()) == {1}
        assert target.add_requests == Counter() and target.received[READ] == 0
        assert target.stats()["recovery_adds_repeated"] == 0
        # Each entry was read once, from the other member of its write set.
        for i in (0, 2):
            mine = [e for e in expected if stores_entry(i, e, 3, 2)]
            assert c.bookies[i].received == Counter({READ: len(mine)})
        assert events.totals == Counter(
            entries_read=34, bytes_read=size, entries_written=34, bytes_written=size
        )

        # Copying again is harmless: the same bytes once more.
        again = await copier.copy(task)
        assert again == result
        assert [target.entry_body(7, e) for e in expected] == bodies
        assert target.stats()["recovery_adds_repeated"] == 34


async def test_ensemble_equal_to_write_quorum_with_hmac(zk: ZkClient) -> None:
    async with cluster(zk, 4, digest_type=DigestType.HMAC) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            9, ids[:3], write_quorum=3, ack_quorum=2, num_entries=20
        )
        await c.bookies[2].crash()
        reset(c)
        copier = FragmentCopier(c.client, batch=3)
        result = await copier.copy(
            CopyTask(9, written.metadata, 0, 2, ids[3], ((0, 19),), (ids[0], ids[1]))
        )
        assert result.complete and result.entries_copied == 20
        assert held(c.bookies[3], 9) == list(range(20))
        assert all(
            c.bookies[3].entry_body(9, e) == c.bookies[0].entry_body(9, e) for e in range(20)
        )
        # Write-set order: entry e goes to e%3, e%3+1, ...; position 2 is skipped, so
        # the first of the others serves it.
        assert c.bookies[0].received[READ] == len([e for e in range(20) if e % 3 != 1])
        assert c.bookies[1].received[READ] == len([e for e in range(20) if e % 3 == 1])


async def test_second_segment_to_a_bookie_of_the_first(zk: ZkClient) -> None:
    """Only the segment's own ensemble is excluded: a bookie of an earlier segment may
    take the position, and gets only this segment's entries."""
    async with cluster(zk, 4) as c:
        ids = c.ids
        seg0, seg1 = [ids[0], ids[1], ids[2]], [ids[0], ids[3], ids[2]]
        written = await c.writer.write_ledger(
            7, [(0, seg0), (10, seg1)], write_quorum=2, ack_quorum=2, num_entries=25
        )
        md = written.metadata
        await c.bookies[3].stop()
        before = held(c.bookies[1], 7)
        result = await FragmentCopier(c.client).copy(
            CopyTask(7, md, 1, 1, ids[1], ((10, 24),), (ids[0], ids[2]))
        )
        moved = position_entries(md, 10, 24, 1)
        assert result.complete and result.entries_copied == len(moved) == 10
        assert held(c.bookies[1], 7) == sorted(before + moved)
        assert all(c.bookies[1].entry_body(7, e) == c.bookies[3].entry_body(7, e) for e in moved)


async def test_entries_with_no_copy_are_listed_and_the_rest_copied(zk: ZkClient) -> None:
    async with cluster(zk, 4) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            7, ids[:3], write_quorum=2, ack_quorum=2, num_entries=50
        )
        md = written.metadata
        await c.bookies[1].stop()
        for b in (c.bookies[0], c.bookies[2]):
            b.drop_entries(7, [range(10, 15), 40])
        events = Events()
        result = await FragmentCopier(c.client, observer=events).copy(
            CopyTask(7, md, 0, 1, ids[3], ((0, 49),), (ids[0], ids[2]))
        )
        assert result.failure is None and not result.complete
        assert result.unreadable == ((10, 10), (12, 13), (40, 40))
        copied = [e for e in position_entries(md, 0, 49, 1) if e not in (10, 12, 13, 40)]
        assert result.entries_copied == len(copied) == 30
        assert held(c.bookies[3], 7) == copied
        # W=2: one other copy per entry, asked once, answered ENOENTRY.
        assert events.totals["entries_unreadable"] == 4 and events.totals["read_failures"] == 4
        assert all(d.endswith("ENOENTRY") for d in events.details)


@pytest.mark.parametrize("fault", ["EIO", "ETOOMANYREQUESTS", "silence"])
async def test_a_failing_source_makes_an_entry_unavailable_never_unreadable(
    zk: ZkClient, fault: str
) -> None:
    # W3, b2 lost: each entry has two sources, b0 first. b0 fails every read (an error
    # status, or no answer at all), so b1 serves 0-4; b1 lacks entry 5, which b0 may
    # still hold: unavailable, not lost, and the copy stops there.
    async with cluster(zk, 4, request_timeout=0.5) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            5, ids[:3], write_quorum=3, ack_quorum=2, num_entries=12
        )
        await c.bookies[2].stop()
        failing, other = c.bookies[0], c.bookies[1]
        other.drop_entries(5, [5])
        if fault == "silence":
            failing.pause()
        else:
            failing.inject_status(Status[fault], READ)
        reset(c)
        events = Events()
        result = await FragmentCopier(c.client, batch=1, observer=events).copy(
            CopyTask(5, written.metadata, 0, 2, ids[3], ((0, 11),), (ids[0], ids[1]))
        )
        failing.clear_faults()
        assert (result.entries_copied, result.unreadable, result.unavailable, result.failure) == (
            5,
            (),
            ((5, 5),),
            None,
        )
        assert not result.complete
        assert held(c.bookies[3], 5) == [0, 1, 2, 3, 4]
        assert (events.totals["entries_unavailable"], events.totals["entries_unreadable"]) == (
            1,
            0,
        )
        if fault == "silence":
            # Silent once (entry 0), then asked last: b1's ENOENTRY comes first for 5.
            assert result.unavailable_why.startswith(
                f"entry 5: {ids[1]}: ENOENTRY; {ids[0]}: timeout"
            )
        else:
            assert result.unavailable_why == f"entry 5: {ids[0]}: {fault}; {ids[1]}: ENOENTRY"
        # Nothing past the unavailable entry was asked for.
        assert other.received[READ] == 6


async def test_no_copy_on_any_source_is_unreadable(zk: ZkClient) -> None:
    # Every source answers ENOENTRY, or serves a copy whose digest fails: lost.
    async with cluster(zk, 4) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            5, ids[:3], write_quorum=3, ack_quorum=2, num_entries=6
        )
        await c.bookies[2].stop()
        c.bookies[0].drop_entries(5, [3])
        bad = c.bookies[1].entry_body(5, 3)
        assert bad is not None
        c.bookies[1].put_entry(5, 3, bad[:-1] + bytes([bad[-1] ^ 1]))
        result = await FragmentCopier(c.client, batch=1).copy(
            CopyTask(5, written.metadata, 0, 2, ids[3], ((0, 5),), (ids[0], ids[1]))
        )
        assert (result.entries_copied, result.unreadable, result.unavailable) == (
            5,
            ((3, 3),),
            (),
        )


async def test_corrupt_or_wrong_copy_is_read_from_the_other_source(zk: ZkClient) -> None:
    async with cluster(zk, 4) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            5, ids[:3], write_quorum=3, ack_quorum=2, num_entries=12
        )
        await c.bookies[2].stop()
        first = c.bookies[0]  # first in write-set order for entries with e % 3 != 1
        good5 = first.entry_body(5, 5)
        assert good5 is not None
        first.put_entry(5, 5, good5[:-1] + bytes([good5[-1] ^ 1]))  # a flipped payload bit
        body8 = first.entry_body(5, 8)
        assert body8 is not None
        first.put_entry(5, 6, body8)  # a valid body, of another entry
        reset(c)
        events = Events()
        result = await FragmentCopier(c.client, observer=events).copy(
            CopyTask(5, written.metadata, 0, 2, ids[3], ((0, 11),), (ids[0], ids[1]))
        )
        assert result.complete and result.entries_copied == 12
        for e in range(12):
            assert c.bookies[3].entry_body(5, e) == c.bookies[1].entry_body(5, e)
        assert c.bookies[3].entry_body(5, 5) == good5
        assert events.totals["read_failures"] == 2
        assert sorted(events.details) == [
            f"5@{ids[0]}: CRC32C digest mismatch for ledger 5 entry 5",
            f"6@{ids[0]}: body of ledger 5 entry 8 returned",
        ]
        assert c.bookies[1].received[READ] == len([e for e in range(12) if e % 3 == 1]) + 2


async def test_silent_source_costs_one_timeout_not_one_per_entry(zk: ZkClient) -> None:
    async with cluster(zk, 4, request_timeout=0.5) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            5, ids[:3], write_quorum=3, ack_quorum=2, num_entries=60
        )
        await c.bookies[2].stop()
        c.bookies[0].pause()
        reset(c)
        start = time.monotonic()
        result = await FragmentCopier(c.client, batch=10).copy(
            CopyTask(5, written.metadata, 0, 2, ids[3], ((0, 59),), (ids[0], ids[1]))
        )
        elapsed = time.monotonic() - start
        c.bookies[0].resume()
        assert result.complete and result.entries_copied == 60
        # Each of the 10 workers waited on the silent bookie once; then it went last.
        assert c.bookies[0].received[READ] == 10
        assert elapsed < 2.0


@pytest.mark.parametrize("refusal", ["master key", "read-only"])
async def test_target_refusal_stops_the_copy(zk: ZkClient, refusal: str) -> None:
    async with cluster(zk, 4) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            7, ids[:3], write_quorum=2, ack_quorum=2, num_entries=50
        )
        await c.bookies[1].stop()
        target = c.bookies[3]
        if refusal == "master key":
            target.put_ledger(7, password=b"another")
        else:
            await target.set_readonly(True)
        result = await FragmentCopier(c.client, batch=1).copy(
            CopyTask(7, written.metadata, 0, 1, ids[3], ((0, 49),), (ids[0], ids[2]))
        )
        status = "EUA" if refusal == "master key" else "EREADONLY"
        assert result == CopyResult(
            0,
            result.bytes_read,
            0,
            (),
            f"target {ids[3]}, entry 0 of ledger 7: refused it with {status}",
        )
        assert not result.complete and held(target, 7) == []
        assert target.recovery_add_requests == Counter({7: 1})


async def test_target_crash_mid_copy(zk: ZkClient) -> None:
    async with cluster(zk, 4) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            7, ids[:3], write_quorum=2, ack_quorum=2, num_entries=50
        )
        await c.bookies[1].stop()
        target = c.bookies[3]
        target.set_latency(0.02, ADD)
        copy = asyncio.ensure_future(
            FragmentCopier(c.client, batch=2).copy(
                CopyTask(7, written.metadata, 0, 1, ids[3], ((0, 49),), (ids[0], ids[2]))
            )
        )
        await target.wait_requests(10, ADD)
        await target.crash()
        result = await asyncio.wait_for(copy, 10)
        assert result.failure is not None and result.failure.startswith(f"target {ids[3]}, entry ")
        assert "did not acknowledge it" in result.failure and not result.complete
        stored = held(target, 7)
        assert 8 <= result.entries_copied <= len(stored) <= 10 < 34
        assert all(target.entry_body(7, e) == c.bookies[1].entry_body(7, e) for e in stored)
        assert target.received[ADD] <= 11


async def test_batch_is_the_window_of_entries_in_flight(zk: ZkClient) -> None:
    async with cluster(zk, 4) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            7, ids[:3], write_quorum=2, ack_quorum=2, num_entries=50
        )
        await c.bookies[1].stop()
        target = c.bookies[3]
        target.set_latency(0.03, ADD)
        task = CopyTask(7, written.metadata, 0, 1, ids[3], ((0, 49),), (ids[0], ids[2]))
        for batch in (4, 1):
            reset(c)
            result = await FragmentCopier(c.client, batch=batch).copy(task)
            assert result.complete and result.entries_copied == 34
            assert target.max_in_flight == batch


async def test_byte_rate_limit(zk: ZkClient) -> None:
    async with cluster(zk, 4, payload_size=2048) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            3, ids[:2], write_quorum=2, ack_quorum=2, num_entries=24
        )
        await c.bookies[1].stop()
        body = 32 + 4 + 2048
        total = 24 * body
        task = CopyTask(3, written.metadata, 0, 1, ids[2], ((0, 23),), (ids[0],))
        start = time.monotonic()
        free = await FragmentCopier(c.client, bytes_per_second=0).copy(task)
        unlimited = time.monotonic() - start
        assert free.complete and free.bytes_read == total

        rate = 25_000.0
        task = replace(task, target=ids[3])
        start = time.monotonic()
        result = await FragmentCopier(c.client, bytes_per_second=rate).copy(task)
        elapsed = time.monotonic() - start
        assert result.complete and result.bytes_read == result.bytes_written == total
        # Every byte but the last body's is paid for before the last read is sent.
        assert elapsed >= (total - body) / rate - 0.05
        assert elapsed <= total / rate + 1.0
        assert unlimited < 1.0


async def test_refusals_before_any_request(zk: ZkClient) -> None:
    async with cluster(zk, 4) as c:
        ids = c.ids
        seg0, seg1 = [ids[0], ids[1], ids[2]], [ids[0], ids[3], ids[2]]
        written = await c.writer.write_ledger(
            7, [(0, seg0), (10, seg1)], write_quorum=2, ack_quorum=2, num_entries=25
        )
        md = written.metadata
        base = CopyTask(7, md, 0, 1, "bk-new:3181", ((0, 9),), (ids[0], ids[2]))
        reset(c)
        copier = FragmentCopier(c.client)
        with pytest.raises(TargetInEnsembleError, match="already in the segment's ensemble"):
            await copier.copy(replace(base, target=ids[2]))
        with pytest.raises(TargetInEnsembleError):
            await copier.copy(replace(base, segment_index=1, target=ids[3]))
        bad = [
            replace(base, entries=((5, 12),)),  # past the segment's end
            replace(base, entries=((4, 3),)),
            replace(base, segment_index=2),
            replace(base, bookie_index=3),
            replace(base, ledger_id=8),
            # The last segment of a ledger that is not closed has no known end.
            replace(
                base,
                metadata=replace(md, state=LedgerState.OPEN, last_entry_id=-1),
                segment_index=1,
                target=ids[1],
                entries=((10, 12),),
            ),
        ]
        for task in bad:
            with pytest.raises(InvalidCopyTaskError):
                await copier.copy(task)
        # Nothing at all for no entries.
        assert (await copier.copy(replace(base, entries=()))).complete
        assert all(b.received.total() == 0 for b in c.bookies)
        assert c.client.connections_opened("bk-new:3181") == 0


# --- the pipeline: answers drive the copy ---------------------------------------------------


async def test_corrupt_entry_in_a_full_window_is_never_written(zk: ZkClient) -> None:
    """A bad digest in the middle of a window of entries in flight: that entry is refused
    (its only source served a bad copy: unreadable, so the copy is not complete and the
    repair commits nothing), every other entry arrives byte for byte, and the bad body
    is never sent to the target."""
    async with cluster(zk, 4) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            7, ids[:3], write_quorum=2, ack_quorum=2, num_entries=60
        )
        md = written.metadata
        lost = c.bookies[1]
        await lost.stop()
        expected = position_entries(md, 0, 59, 1)
        bad_entry = expected[15]  # well inside the window, never its first entry
        [source] = [b for b in (c.bookies[0], c.bookies[2]) if b.has_entry(7, bad_entry)]
        good = source.entry_body(7, bad_entry)
        assert good is not None
        source.put_entry(7, bad_entry, good[:40] + bytes([good[40] ^ 1]) + good[41:])
        reset(c)
        events = Events()
        result = await FragmentCopier(c.client, batch=10, observer=events).copy(
            CopyTask(7, md, 0, 1, ids[3], ((0, 59),), (ids[0], ids[2]))
        )
        target = c.bookies[3]
        copied = [e for e in expected if e != bad_entry]
        assert result.unreadable == ((bad_entry, bad_entry),) and result.failure is None
        assert not result.complete and result.entries_copied == len(copied)
        assert held(target, 7) == copied
        assert (7, bad_entry) not in target.recovery_adds_per_entry
        assert target.received[ADD] == len(copied)
        assert all(target.entry_body(7, e) == lost.entry_body(7, e) for e in copied)
        assert events.details == [
            f"{bad_entry}@{source.bookie_id}: CRC32C digest mismatch for ledger 7 entry {bad_entry}"
        ]


@pytest.mark.parametrize("digest_type", [DigestType.CRC32C, DigestType.CRC32, DigestType.HMAC])
async def test_one_mib_entries_are_copied_intact(zk: ZkClient, digest_type: DigestType) -> None:
    """Entries of 1 MiB (Pulsar's largest batches), several in flight: frames that span
    many socket reads, digests checked on views of the bodies, bodies sent in parts."""
    size = 1 << 20
    async with cluster(zk, 3, digest_type=digest_type, payload_size=size) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            4, ids[:2], write_quorum=2, ack_quorum=2, num_entries=6
        )
        await c.bookies[1].stop()
        result = await FragmentCopier(c.client, batch=4).copy(
            CopyTask(4, written.metadata, 0, 1, ids[2], ((0, 5),), (ids[0],))
        )
        body = 32 + {DigestType.CRC32C: 4, DigestType.CRC32: 8, DigestType.HMAC: 20}[digest_type]
        assert result == CopyResult(6, 6 * (body + size), 6 * (body + size), (), None)
        for e in range(6):
            copy = c.bookies[2].entry_body(4, e)
            assert copy is not None and len(copy) == body + size
            assert copy == c.bookies[0].entry_body(4, e) == c.bookies[1].entry_body(4, e)


async def test_target_time_out_mid_window_stops_the_copy(zk: ZkClient) -> None:
    """The target stops answering while a window of adds is in flight: each times out
    (one sweep of the connection, no timer per add), the copy stops with the first as
    its failure, and no entry more is read."""
    async with cluster(zk, 4, request_timeout=0.5) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            7, ids[:3], write_quorum=2, ack_quorum=2, num_entries=60
        )
        await c.bookies[1].stop()
        target = c.bookies[3]
        target.set_latency(0.01, ADD)
        reset(c)
        copy = asyncio.ensure_future(
            FragmentCopier(c.client, batch=5).copy(
                CopyTask(7, written.metadata, 0, 1, ids[3], ((0, 59),), (ids[0], ids[2]))
            )
        )
        await target.wait_requests(12, ADD)
        target.pause()
        paused_at = time.monotonic()
        result = await asyncio.wait_for(copy, 10)
        waited = time.monotonic() - paused_at
        stored = held(target, 7)
        reads = c.bookies[0].received[READ] + c.bookies[2].received[READ]
        adds = target.received[ADD]
        target.resume()
        assert result.failure is not None
        assert result.failure.startswith(f"target {ids[3]}, entry ")
        assert "did not acknowledge it (timeout" in result.failure
        assert not result.complete and result.entries_copied == len(stored)
        assert 12 - 5 <= result.entries_copied <= 12
        # At most the window was in flight when the target went silent: no read beyond it.
        assert adds <= result.entries_copied + 5
        assert reads <= result.entries_copied + 5
        assert waited < 3.0


async def test_cancelled_copy_sends_nothing_more(zk: ZkClient) -> None:
    """Cancelled (the worker's metadata session was suspended): the answers of the reads
    in flight arrive later and start no write."""
    async with cluster(zk, 4) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            7, ids[:3], write_quorum=2, ack_quorum=2, num_entries=50
        )
        await c.bookies[1].stop()
        sources = (c.bookies[0], c.bookies[2])
        for b in sources:
            b.pause()
        reset(c)
        copy = asyncio.ensure_future(
            FragmentCopier(c.client, batch=8).copy(
                CopyTask(7, written.metadata, 0, 1, ids[3], ((0, 49),), (ids[0], ids[2]))
            )
        )
        # The window's first 8 entries (0, 1, 3, 4, 6, 7, 9, 10): four from each source.
        for b in sources:
            await b.wait_requests(4, READ)
        copy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await copy
        for b in sources:
            b.resume()  # the held reads are answered now, in order
        for b in sources:
            # Answered after the held ones on the same connection: they have arrived.
            assert isinstance(await c.client.read_entry(b.bookie_id, 7, 0), Ok | ErrorStatus)
        assert [b.received[READ] for b in sources] == [5, 5]
        # And a write those answers had started would be at the target before this read.
        await c.client.read_entry(ids[3], 7, 0)
        assert c.bookies[3].received == Counter({READ: 1})
        assert c.client.in_flight(ids[0]) == c.client.in_flight(ids[2]) == 0


async def test_copy_under_a_small_in_flight_cap(zk: ZkClient) -> None:
    """A window larger than the client's cap per bookie: the requests that find no free
    slot wait for one (not counted against their timeout), and the bookie never sees
    more than the cap."""
    async with cluster(zk, 4) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            7, ids[:3], write_quorum=2, ack_quorum=2, num_entries=50
        )
        await c.bookies[1].stop()

        async def resolve(bookie_id: str) -> tuple[str, int] | None:
            return await resolve_bookie(zk, ROOT, bookie_id)

        async with BookieClient(resolve, max_in_flight=2) as small:
            target = c.bookies[3]
            target.set_latency(0.005, ADD)
            reset(c)
            result = await FragmentCopier(small, batch=10).copy(
                CopyTask(7, written.metadata, 0, 1, ids[3], ((0, 49),), (ids[0], ids[2]))
            )
            assert result.complete and result.entries_copied == 34
            assert target.max_in_flight == 2
            assert c.bookies[0].max_in_flight <= 2 and c.bookies[2].max_in_flight <= 2
            assert small.in_flight(ids[3]) == 0


async def test_an_observer_that_raises_ends_the_copy(zk: ZkClient) -> None:
    """A callback's error (here the observer's) ends the copy with it, as the coroutine
    per entry did, instead of leaving an entry that never ends."""
    async with cluster(zk, 4) as c:
        ids = c.ids
        written = await c.writer.write_ledger(
            7, ids[:3], write_quorum=2, ack_quorum=2, num_entries=50
        )
        await c.bookies[1].stop()

        def observer(event: CopyEvent) -> None:
            if event.entries_written:
                raise RuntimeError("counting broke")

        copy = FragmentCopier(c.client, batch=4, observer=observer).copy(
            CopyTask(7, written.metadata, 0, 1, ids[3], ((0, 49),), (ids[0], ids[2]))
        )
        with pytest.raises(RuntimeError, match="counting broke"):
            await asyncio.wait_for(copy, 10)
