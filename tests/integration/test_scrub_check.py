"""The deep scrub against emulated bookies and a real metadata store: each corruption mode
found exactly and marked (or, for divergent copies, only reported), every digest type, a
silent bookie re-checked and left unverified, marked ledgers skipped, the byte budget kept,
and `check scrub` with its range and JSON report.

Round robin with E=3, W=2: entry e on bookies (e mod 3) and (e + 1 mod 3).
"""

from __future__ import annotations

import asyncio
import time

from auditor.bookie.protocol import Operation, Status
from auditor.checks.findings import CheckReport, ScrubCoverage
from auditor.checks.scrub_run import ENTRIES_OPEN, ScrubRun, run_scrub_check
from auditor.metadata.model import DigestType, LedgerState
from auditor.metadata.underreplication import UnderreplicatedLedger
from auditor.store import MetadataStore
from auditor.testing.cli import bk, one_json
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.writer import LedgerWriter
from auditor.zk import ZkClient

FAST = ["checks.retry_delay=0.1", "checks.retry_attempts=1", "readEntryTimeout=1"]
#: Payload bytes of the test writer's entries.
PAYLOAD = 16


async def run(tc: TestCluster, *extra: str, mark: bool = False) -> CheckReport:
    async with tc.context(overrides=[*FAST, *extra], mark=mark) as ctx:
        return await run_scrub_check(ctx)


def found(report: CheckReport) -> list[tuple[int, str, str | None, list[list[int]], int]]:
    """(ledger, category, bookie, entries, count) of every violation, in order."""
    return sorted(
        (v.ledger_id, str(v.category), v.bookie, v.detail["entries"], v.detail["count"])
        for v in report.violations
    )


async def test_each_corruption_mode_is_found_exactly_and_repairable_ones_marked(
    store: MetadataStore,
) -> None:
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        for lid in (1, 2, 3):
            await tc.writer.write_ledger(lid, b, write_quorum=2, num_entries=9)
        await tc.writer.write_ledger(4, b, write_quorum=3, num_entries=9)
        await tc.writer.write_ledger(5, b, write_quorum=2, num_entries=3, state=LedgerState.OPEN)
        tc.bookies[0].corrupt_entry(2, 3)  # entry 3: b0, b1
        tc.bookies[0].corrupt_entry(2, 6, at=5)  # a header byte of entry 6 (b0, b1)
        # b1 holds 0, 1, 3, 4, 6, 7; entry 8 is not on it (never read there).
        tc.bookies[1].make_unreadable(3, [4, range(6, 9)])
        tc.bookies[2].diverge_entry(4, 5, b"not what was written")
        report = await run(tc, mark=True)
        assert found(report) == [
            (2, "corrupt_copy", b[0], [[3, 3], [6, 6]], 2),
            (3, "unreadable_copy", b[1], [[4, 4], [6, 7]], 3),
            (4, "divergent_copies", b[2], [[5, 5]], 1),
        ]
        v2 = next(v for v in report.violations if v.ledger_id == 2)
        assert v2.detail["reasons"] == {
            "3": "CRC32C digest mismatch for ledger 2 entry 3",
            # The flipped byte is in the header's ledger id: the message names what it says.
            "6": "CRC32C digest mismatch for ledger 65538 entry 6",
        }
        v3 = next(v for v in report.violations if v.ledger_id == 3)
        assert v3.detail["reasons"] == {"4": "EIO", "6": "EIO", "7": "EIO"}
        assert report.counts() == {
            "corrupt_copy": 1,
            "divergent_copies": 1,
            "unreadable_copy": 1,
            "metadata_invalid": 0,
        }
        assert report.ledgers_checked == 4
        assert dict(report.ledgers_skipped) == {"open": 1}
        # 9 entries x 2 copies x 3 ledgers + 9 x 3 of ledger 4, less the 2 corrupt and
        # 3 unreadable copies.
        verified = 9 * 2 * 3 + 9 * 3 - 2 - 3
        assert report.scrub == ScrubCoverage(
            entries=36,
            copies_verified=verified,
            bytes_verified=(verified - 1) * PAYLOAD + len(b"not what was written"),
            copies_absent=0,
            copies_unverified=0,
        )
        # Corrupt and unreadable copies marked for their bookie; divergent ones not.
        assert report.marked_underreplicated == [2, 3]
        async with tc.context() as ctx:
            marks = {m.ledger_id: m for m in (await ctx.urm.read_marks()).marks}
        assert sorted(marks) == [2, 3]
        assert isinstance(marks[2], UnderreplicatedLedger) and marks[2].replicas == (b[0],)
        assert marks[3].replicas == (b[1],)


async def test_an_entry_missing_from_the_index_is_absent_not_unreadable(
    store: MetadataStore,
) -> None:
    """A copy the bookie neither lists nor returns is missing: the replicas check's finding."""
    async with test_cluster(store, 3) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=6)
        tc.bookies[2].drop_entries(1, [1, 2])
        report = await run(tc)
        assert found(report) == []
        assert report.scrub is not None
        assert (report.scrub.copies_absent, report.scrub.copies_verified) == (2, 10)


async def test_every_digest_type_with_its_password(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        for lid, digest in enumerate(
            (DigestType.CRC32, DigestType.CRC32C, DigestType.HMAC, DigestType.DUMMY), start=1
        ):
            writer = LedgerWriter(tc.cluster, tc.writer.client, digest_type=digest, password=b"pw")
            await writer.write_ledger(lid, tc.ids, write_quorum=3, num_entries=4)
            tc.bookies[1].corrupt_entry(lid, 2)
        report = await run(tc)
        # DUMMY has no digest: the flipped copy differs from the two others.
        assert found(report) == [
            (1, "corrupt_copy", tc.ids[1], [[2, 2]], 1),
            (2, "corrupt_copy", tc.ids[1], [[2, 2]], 1),
            (3, "corrupt_copy", tc.ids[1], [[2, 2]], 1),
            (4, "divergent_copies", tc.ids[1], [[2, 2]], 1),
        ]
        v3 = next(v for v in report.violations if v.ledger_id == 3)
        assert v3.detail["reasons"] == {"2": "HMAC digest mismatch for ledger 3 entry 2"}


async def test_a_silent_bookie_is_rechecked_then_left_unverified(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=6)
        tc.bookies[0].corrupt_entry(1, 0)
        await tc.bookies[2].crash()
        report = await run(tc, mark=True)
        # b2 holds entries 1, 2, 4, 5 of ledger 1: unverified; b0's corrupt copy found.
        assert found(report) == [(1, "corrupt_copy", tc.ids[0], [[0, 0]], 1)]
        assert report.scrub is not None
        assert (report.scrub.copies_unverified, report.scrub.copies_verified) == (4, 7)
        assert report.marked_underreplicated == [1]


async def test_a_bookie_that_answers_on_the_recheck_is_judged_then(
    store: MetadataStore,
) -> None:
    """b2 throttles (ETOOMANYREQUESTS: no answer about the entry) on the first look and
    answers on the re-check: ledger 1 comes out clean (a drop, `retry_succeeded`), ledger
    2's corrupt copy on b2 is found on the re-check."""
    async with test_cluster(store, 3) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=6)
        await tc.writer.write_ledger(2, tc.ids, write_quorum=2, num_entries=6)
        tc.bookies[2].corrupt_entry(2, 4)
        b2 = tc.bookies[2]
        b2.reset_stats()
        b2.inject_status(Status.ETOOMANYREQUESTS, Operation.READ_ENTRY)

        async def answer_again() -> None:
            # b2 holds entries 1, 2, 4, 5 of each ledger: 8 reads on the first look.
            await b2.wait_requests(8, Operation.READ_ENTRY)
            b2.clear_faults()

        again = asyncio.create_task(answer_again())
        report = await run(tc, "checks.retry_delay=1.0")
        await again
        assert found(report) == [(2, "corrupt_copy", tc.ids[2], [[4, 4]], 1)]
        assert dict(report.dropped) == {"retry_succeeded": 1}
        assert b2.received[Operation.READ_ENTRY] == 16
        assert report.scrub is not None and report.scrub.copies_unverified == 0


async def test_a_ledger_replaced_while_scrubbed_is_judged_again(store: MetadataStore) -> None:
    """b1's corrupt copies are seen on the first look, but the ledger is re-replicated to
    b3 meanwhile: the re-read finds a new version, the scrub of it is clean, nothing is
    reported or marked (a drop, `metadata_changed`)."""
    async with test_cluster(store, 4) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(7, b[0:3], write_quorum=2, num_entries=30)
        for entry in (0, 1, 3):  # all on b1
            tc.bookies[1].corrupt_entry(7, entry)
        held = tc.bookies[0]
        held.set_latency(0.5, Operation.GET_LIST_OF_ENTRIES_OF_LEDGER)
        async with tc.context(overrides=FAST, mark=True) as ctx:
            task = asyncio.ensure_future(run_scrub_check(ctx))
            await held.wait_requests(1, Operation.GET_LIST_OF_ENTRIES_OF_LEDGER)
            await tc.writer.rereplicate(written, [b[0], b[3], b[2]])
            report = await task
        assert found(report) == []
        assert dict(report.dropped) == {"metadata_changed": 1}
        assert report.marked_underreplicated == []
        assert report.ledgers_checked == 1
        assert tc.bookies[3].received[Operation.READ_ENTRY] == 20  # b3's share of 30


async def test_reads_are_pipelined_up_to_the_in_flight_cap(store: MetadataStore) -> None:
    """`checks.bookie_max_in_flight` reads at once per bookie, and no more, however many
    entries and ledgers want it."""
    async with test_cluster(store, 3) as tc:
        for lid in (1, 2):
            await tc.writer.write_ledger(lid, tc.ids, write_quorum=3, num_entries=15)
        for emu in tc.bookies:
            emu.set_latency(0.2, Operation.READ_ENTRY)
            emu.reset_stats()
        report = await run(tc, "checks.bookie_max_in_flight=5")
        assert found(report) == []
        assert report.scrub is not None and report.scrub.copies_verified == 90
        assert [emu.max_in_flight for emu in tc.bookies] == [5, 5, 5]


async def test_a_cancelled_scrub_gives_the_gates_back(store: MetadataStore) -> None:
    """A ledger's scrub cancelled with reads out: their answers still return the gates'
    slots (their copies are dropped) and the reads not yet sent are never sent, so the
    run's next scrub of the ledger reads every copy once, still no more than the cap at
    once per bookie."""
    async with test_cluster(store, 3) as tc:
        written = await tc.writer.write_ledger(1, tc.ids, write_quorum=3, num_entries=6)
        for emu in tc.bookies:
            # Long enough that no answer comes back before the cancellation.
            emu.set_latency(0.5, Operation.READ_ENTRY)
            emu.reset_stats()
        overrides = [*FAST, "readEntryTimeout=5", "checks.bookie_max_in_flight=2"]
        async with tc.context(overrides=overrides) as ctx:
            scrub_run = ScrubRun(ctx)
            first = asyncio.ensure_future(scrub_run.scrub(written.metadata))
            for emu in tc.bookies:
                await emu.wait_requests(2, Operation.READ_ENTRY)
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            assert first.cancelled()
            async with asyncio.timeout(30):
                scrub = await scrub_run.scrub(written.metadata)
        assert (scrub.entries, scrub.copies_verified, scrub.found) == (6, 18, False)
        # The cancelled scrub's 2 reads a bookie, then every copy once.
        assert [emu.received[Operation.READ_ENTRY] for emu in tc.bookies] == [8, 8, 8]
        assert [emu.max_in_flight for emu in tc.bookies] == [2, 2, 2]
        # Every slot and all the room for open entries back.
        assert [scrub_run.gates.of(b).free for b in tc.ids] == [2, 2, 2]
        assert scrub_run.room.free == ENTRIES_OPEN * 2


async def test_marked_ledgers_are_skipped_unread(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=6)
        await tc.writer.write_ledger(2, tc.ids, write_quorum=2, num_entries=6)
        tc.bookies[0].corrupt_entry(1, 0)
        async with tc.context() as ctx:
            await ctx.urm.mark_underreplicated(1, [tc.ids[0]])
        for emu in tc.bookies:
            emu.reset_stats()
        report = await run(tc)
        assert found(report) == []
        assert dict(report.ledgers_skipped) == {"underreplicated": 1}
        assert report.ledgers_checked == 1
        assert report.scrub is not None and report.scrub.entries == 6
        # Ledger 2's 6 entries x 2 copies, nothing of ledger 1.
        assert sum(emu.received[Operation.READ_ENTRY] for emu in tc.bookies) == 12


async def test_the_byte_budget_holds_per_bookie(store: MetadataStore) -> None:
    """One bookie holding every entry, read at 4000 bytes/s: the bytes answered never
    exceed rate * elapsed + one second's burst + the reads in flight (entries of 16
    payload bytes, 52-byte bodies)."""
    async with test_cluster(store, 1) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=1, num_entries=240)
        rate, in_flight, body = 4000, 4, 32 + 4 + PAYLOAD
        started = time.monotonic()
        report = await run(
            tc, f"scrub.bytes_per_second={rate}", f"checks.bookie_max_in_flight={in_flight}"
        )
        elapsed = time.monotonic() - started
        total = 240 * body
        assert report.scrub is not None and report.scrub.copies_verified == 240
        # Payload bytes are what is verified; the budget counts whole bodies.
        assert report.scrub.bytes_verified == 240 * PAYLOAD
        assert total <= rate * elapsed + rate + in_flight * body
        assert elapsed >= (total - rate - in_flight * body) / rate


async def test_check_scrub_cli_range_and_json(zk: ZkClient) -> None:
    async with test_cluster(zk, 3) as tc:
        for lid in (1, 2, 3):
            await tc.writer.write_ledger(lid, tc.ids, write_quorum=2, num_entries=5)
            tc.bookies[0].corrupt_entry(lid, 0)
        args = ["--zk", zk.hosts, "--json", "--set", "checks.retry_delay=0.1"]
        code, out, err = await bk("check", "scrub", "--from", "2", "--to", "2", *args)
        assert code == 1, err
        doc = one_json(out)
        assert doc["check"] == "scrub"
        assert doc["ledgers_checked"] == 1
        assert doc["counts"] == {
            "corrupt_copy": 1,
            "divergent_copies": 0,
            "unreadable_copy": 0,
            "metadata_invalid": 0,
        }
        assert [(v["ledger_id"], v["category"], v["bookie"]) for v in doc["violations"]] == [
            (2, "corrupt_copy", tc.ids[0])
        ]
        assert doc["violations"][0]["detail"]["entries"] == [[0, 0]]
        assert doc["scrub"] == {
            "entries": 5,
            "copies_verified": 9,
            "bytes_verified": 9 * PAYLOAD,
            "copies_absent": 0,
            "copies_unverified": 0,
        }
        assert doc["marked_underreplicated"] == []
        code, out, err = await bk("check", "scrub", "--to", "1", *args[:2], *args[3:])
        assert code == 1, err
        assert out.splitlines()[:6] == [
            "check scrub: 1 ledgers checked",
            "  corrupt_copy                         1",
            "  divergent_copies                     0",
            "  unreadable_copy                      0",
            "  metadata_invalid                     0",
            "  read: 5 entries, 9 copies verified (144 bytes), 0 absent, 0 unverified",
        ]
        assert out.splitlines()[7].split()[:3] == ["1", "corrupt_copy", tc.ids[0]]
        assert out.splitlines()[7].endswith(
            "1 copies, entries 0: CRC32C digest mismatch for ledger 1 entry 0"
        )
        code, out, err = await bk("check", "replicas", "--from", "2", *args)
        assert code == 2
        assert "--from and --to are for `check scrub` only" in err
        code, out, err = await bk("check", "scrub", "--from", "3", "--to", "2", *args)
        assert code == 2
        assert "names no ledger id" in err
