"""Bookie faults against the replicas and ledger checks: exact outcomes, nothing left behind.

Every scenario runs the checks through their drivers (`runner.driver`) on a
real ZooKeeper and emulated bookies speaking the real protocol, injects one
kind of fault (crash, pause, slow answers, error storms, a bookie back with
the same identity and no data, a ledger deleted or re-replicated while it is
being checked), and asserts what is reported, under which category and
bookie, what is marked, and what the retry queue held. Each test ends by
counting what it leaves behind: no task, no connection, no descriptor more
than when its cluster was built (`auditor.testing.leaks`).

The cluster is the same everywhere: bookies 0..3 (plus a spare, 4, where a
ledger is re-replicated), ledgers 1..8 of 10 entries, ledger `i`'s ensemble
is every bookie but `i % 4` (so each bookie holds six ledgers), ledgers 1..4
with W=2/A=2 and 5..8 with W=3/A=2 (losing one copy is then below the ack
quorum for the first, below the write quorum for the second).

Not repeated here: the ledger check meeting a ledger deleted while it is
being checked (S19 in test_ledger_check.py drives exactly that path).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from auditor.api import LIVENESS, READINESS
from auditor.api.server import start_api_server
from auditor.bookie.availability import expected_count
from auditor.bookie.protocol import Operation, Status
from auditor.checks.context import CheckContext
from auditor.checks.findings import Category, Check, CheckReport, LedgerOutcome
from auditor.checks.replicas import probe_entries
from auditor.checks.runner import driver
from auditor.daemon.config import load_daemon_config
from auditor.daemon.election import current_auditor
from auditor.daemon.service import Daemon
from auditor.daemon.state import Outcome as RunState
from auditor.metadata.model import Segment
from auditor.metadata.registry import register_bookie
from auditor.metadata.serde import encode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.bookie import BookieEmulator, Storage
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.leaks import assert_no_leaks, snapshot, wait_disconnected
from auditor.testing.writer import WrittenLedger
from auditor.zk import ZkClient

#: The read timeout (readEntryTimeout, whole seconds) and the BP-34 retry delay.
T = 1.0
DELAY = 0.2
FAST = [f"readEntryTimeout={T:g}", f"checks.retry_delay={DELAY}", "checks.retry_attempts=1"]
#: For scenarios where no timeout is expected: held answers have room on a busy machine.
PATIENT = ["readEntryTimeout=5", f"checks.retry_delay={DELAY}", "checks.retry_attempts=1"]
LEDGERS = range(1, 9)
ENTRIES = 10
BUR = Category.BOOKIE_UNAVAILABLE_REGISTERED
LIST = Operation.GET_LIST_OF_ENTRIES_OF_LEDGER
READ = Operation.READ_ENTRY
INFO = Operation.GET_BOOKIE_INFO


def quorums(ledger_id: int) -> tuple[int, int]:
    return (2, 2) if ledger_id <= 4 else (3, 2)


def ensemble(ids: Sequence[str], ledger_id: int) -> list[str]:
    return [b for j, b in enumerate(ids[:4]) if j != ledger_id % 4]


def on(index: int) -> list[int]:
    """The ledgers bookie `index` is in the ensemble of."""
    return [lid for lid in LEDGERS if lid % 4 != index]


@dataclass
class Faulty:
    tc: TestCluster
    written: dict[int, WrittenLedger]

    @property
    def ids(self) -> list[str]:
        return self.tc.ids

    @property
    def bookies(self) -> list[BookieEmulator]:
        return self.tc.bookies

    def context(
        self, overrides: Sequence[str], *, mark: bool = True
    ) -> contextlib.AbstractAsyncContextManager[CheckContext]:
        return self.tc.context(overrides=overrides, mark=mark)

    async def marks(self) -> dict[int, tuple[str, ...]]:
        urm = UnderreplicationManager(self.tc.store, self.tc.root)
        return {u.ledger_id: tuple(sorted(u.replicas)) async for u in urm.list_underreplicated()}


@contextlib.asynccontextmanager
async def faulty_cluster(
    zk: ZkClient, bookies: int | Sequence[Storage] = 4
) -> AsyncIterator[Faulty]:
    """The cluster above; on a clean exit, asserts nothing leaked since it was built."""
    async with test_cluster(zk, bookies) as tc:
        written = {}
        for lid in LEDGERS:
            w, a = quorums(lid)
            written[lid] = await tc.writer.write_ledger(
                lid, ensemble(tc.ids, lid), write_quorum=w, ack_quorum=a, num_entries=ENTRIES
            )
        # The writer's connections would hide the checks' own from the count.
        await tc.writer.client.close()
        await wait_disconnected(tc.bookies)
        for b in tc.bookies:
            b.reset_stats()
        before = snapshot()
        yield Faulty(tc, written)
        for b in tc.bookies:
            b.clear_faults()  # held requests are answered (to closed connections) and dropped
        await assert_no_leaks(before, bookies=tc.bookies)


async def replicas(ctx: CheckContext) -> CheckReport:
    return await driver(Check.REPLICAS)(ctx)


async def ledgers(ctx: CheckContext) -> CheckReport:
    return await driver(Check.LEDGERS)(ctx)


def found(report: CheckReport) -> list[tuple[int, str, str | None]]:
    return sorted(
        ((v.ledger_id, str(v.category), v.bookie) for v in report.violations),
        key=lambda x: (x[0], x[1], x[2] or ""),
    )


def expect(*items: tuple[int, Category, str | None]) -> list[tuple[int, str, str | None]]:
    return sorted(((lid, str(c), b) for lid, c, b in items), key=lambda x: (x[0], x[1], x[2] or ""))


def coverage(report: CheckReport) -> tuple[int, int, int]:
    assert report.coverage is not None
    return report.coverage.listed, report.coverage.probed, report.coverage.unverified


def recorder(ctx: CheckContext, then: Callable[[int], None] | None = None) -> list[int]:
    """Records what the replicas run says about its retry queue (after each pass, then 0)."""
    seen: list[int] = []

    def on_queue(n: int) -> None:
        seen.append(n)
        if then is not None:
            then(n)

    ctx.on_retry_queue = on_queue
    return seen


def outcomes(ctx: CheckContext) -> dict[int, str]:
    """How each ledger came out of the replicas run: ok, violation, or the skip reason."""
    seen: dict[int, str] = {}

    def on_ledger(o: LedgerOutcome) -> None:
        assert o.ledger_id not in seen, o  # once per ledger and run
        seen[o.ledger_id] = o.skip_reason or str(o.outcome)

    ctx.on_ledger = on_ledger
    return seen


def bad_bookies(report: CheckReport) -> dict[int, dict[str, dict[str, int]]]:
    """Ledger check: per ledger, each bad bookie's read errors (every fragment together)."""
    out: dict[int, dict[str, dict[str, int]]] = {}
    for v in report.violations:
        assert v.category is Category.UNREADABLE_FRAGMENTS, v
        per = out.setdefault(v.ledger_id, {})
        for frag in v.detail["fragments"]:
            for bad in frag["bad_bookies"]:
                errors = per.setdefault(bad["bookie"], {})
                for reason, n in bad.get("errors", {}).items():
                    errors[reason] = errors.get(reason, 0) + n
    return out


# --- 1. crash -----------------------------------------------------------------------------


async def test_crash_mid_replicas_check_reports_only_bookies_still_registered(
    zk: ZkClient,
) -> None:
    """Two bookies crash while their list requests are out.

    Bookie 2 unregisters at once (a clean crash: its session ended); bookie 3's
    registration lingers (its session has not expired yet), which the test
    plays by registering it again. Every ledger with a silent bookie waits for
    the retry; then only bookie 3, still registered, is reported, once per
    ledger it is in. Bookie 2's ledgers are the bookie check's business: no
    violation, nothing marked, and no durability category for anybody.
    """
    async with faulty_cluster(zk) as fc:
        gone, lingering = fc.bookies[2], fc.bookies[3]
        for b in (gone, lingering):
            b.set_latency(0.3, LIST)
        async with fc.context(FAST) as ctx:
            queue = recorder(ctx)
            run = asyncio.ensure_future(replicas(ctx))
            await gone.wait_requests(1, LIST)
            await lingering.wait_requests(1, LIST)
            await gone.crash()
            await lingering.crash()
            await register_bookie(zk, fc.tc.root, lingering.bookie_id, *lingering.address)
            report = await run
        assert found(report) == expect(*((lid, BUR, lingering.bookie_id) for lid in on(3)))
        for v in report.violations:
            assert v.detail["reason"].startswith(("unreachable", "not resolved")), v.detail
            assert v.detail["attempts"] == 2
            assert v.detail["segments"] == [[0, ENTRIES - 1]]
            assert v.detail["metadata_version"] == 0
        assert queue == [8, 0, 0]  # every ledger has bookie 2 or 3
        assert report.ledgers_checked == 8 and report.ledgers_skipped == {}
        assert coverage(report) == (24 - 12, 0, 12)
        assert report.marked_underreplicated == [] and await fc.marks() == {}
        # One list request each reached them: the probe of their ability to list.
        assert gone.received[LIST] == 1 and lingering.received[LIST] == 1


async def test_bookie_back_before_the_retry_is_no_violation(zk: ZkClient) -> None:
    """A crash mid-check and a restart (same id, data kept) within the retry delay."""
    async with faulty_cluster(zk) as fc:
        bounced = fc.bookies[2]
        bounced.set_latency(0.3, LIST)
        # A longer delay than elsewhere: the restart's registration must land before
        # the retry pass reads the registered bookies.
        async with fc.context([*FAST, "checks.retry_delay=0.5"]) as ctx:
            first_pass = asyncio.Event()
            queue = recorder(ctx, lambda _n: first_pass.set())
            run = asyncio.ensure_future(replicas(ctx))
            await bounced.wait_requests(1, LIST)
            await bounced.crash()
            await first_pass.wait()
            bounced.set_latency(None, LIST)
            await bounced.start()
            report = await run
        assert report.violations == []
        assert queue == [len(on(2)), 0, 0]
        assert report.ledgers_checked == 8 and coverage(report) == (24, 0, 0)
        assert bounced.received[LIST] == 1 + len(on(2))  # the one cut off, then the retries
        assert await fc.marks() == {}


async def test_crash_mid_ledger_check_marks_the_crashed_bookie(zk: ZkClient) -> None:
    """The ledger check has no retry (upstream's rule): a read that fails is a bad fragment."""
    async with faulty_cluster(zk) as fc:
        crashed = fc.bookies[2]
        crashed.set_latency(0.3, READ)
        async with fc.context(FAST) as ctx:
            run = asyncio.ensure_future(ledgers(ctx))
            await crashed.wait_requests(1, READ)
            await crashed.crash()
            report = await run
        assert found(report) == expect(
            *((lid, Category.UNREADABLE_FRAGMENTS, crashed.bookie_id) for lid in on(2))
        )
        bad = bad_bookies(report)
        assert set(bad) == set(on(2))
        for lid, per in bad.items():
            assert list(per) == [crashed.bookie_id], lid
            assert set(per[crashed.bookie_id]) <= {"disconnected", "not resolved", "unreachable"}
        assert report.ledgers_checked == 8
        assert report.marked_underreplicated == on(2)
        assert await fc.marks() == {lid: (crashed.bookie_id,) for lid in on(2)}


# --- 2. pause -----------------------------------------------------------------------------


async def test_paused_bookie_costs_bounded_timeouts_then_is_reported(zk: ZkClient) -> None:
    """Connections open, no answers: the list probe and the bookie-info request sent beside
    it both time out, so the bookie is stalled, not unable to list: the probe's waiters share
    its answer, one timeout per pass, the retry delay between, and the bookie keeps its
    full verification for when it answers again.
    """
    async with faulty_cluster(zk) as fc:
        paused = fc.bookies[3]
        paused.pause()
        pid = paused.bookie_id
        async with fc.context(FAST) as ctx:
            queue = recorder(ctx)
            started = time.monotonic()
            report = await replicas(ctx)
            took = time.monotonic() - started
        assert found(report) == expect(*((lid, BUR, pid) for lid in on(3)))
        for v in report.violations:
            assert v.detail["reason"] == f"timeout: {pid} did not answer within {T:g}s"
        assert queue == [len(on(3)), 0, 0]
        assert report.ledgers_checked == 8
        assert coverage(report) == (24 - 6, 0, 6)
        assert await fc.marks() == {}
        assert paused.received[LIST] == 2  # one probe per pass
        assert paused.received[INFO] == 2
        assert paused.received[READ] == 0  # never downgraded to probing by reads
        assert 2 * T + DELAY <= took < 2 * T + DELAY + 2.0, took

        started = time.monotonic()
        async with fc.context(FAST) as ctx:
            report = await ledgers(ctx)
        took = time.monotonic() - started
        assert found(report) == expect(
            *((lid, Category.UNREADABLE_FRAGMENTS, pid) for lid in on(3))
        )
        assert bad_bookies(report) == {lid: {pid: {"timeout": 2}} for lid in on(3)}
        assert await fc.marks() == {lid: (pid,) for lid in on(3)}
        assert T <= took < T + 2.0, took


async def test_a_stall_does_not_turn_off_full_verification(zk: ZkClient) -> None:
    """After a stall the same client still lists the bookie's entries: an entry lost from
    the middle of a ledger is found at once (probing only first and last would miss it)."""
    async with faulty_cluster(zk) as fc:
        stalled = fc.bookies[3]
        sid = stalled.bookie_id
        async with fc.context(FAST) as ctx:
            stalled.pause()
            report = await replicas(ctx)
            assert found(report) == expect(*((lid, BUR, sid) for lid in on(3)))
            stalled.resume()
            lid = on(3)[0]
            held = sorted(e for e in range(10) if stalled.has_entry(lid, e))
            middle = held[len(held) // 2]
            assert middle not in (held[0], held[-1])
            stalled.drop_entries(lid, [middle])
            report = await replicas(ctx)
        assert [(v.ledger_id, v.category) for v in report.violations] == [
            (lid, Category.BELOW_ACK_QUORUM if lid <= 4 else Category.BELOW_WRITE_QUORUM)
        ]
        assert coverage(report) == (24, 0, 0)


# --- 3. slow answers ----------------------------------------------------------------------


async def test_slow_answers_below_the_timeout_raise_no_alarm(zk: ZkClient) -> None:
    kinds = [Storage.SORTED, Storage.SORTED, Storage.SORTED, Storage.DBLEDGER]
    async with faulty_cluster(zk, kinds) as fc:
        for b in fc.bookies[:3]:
            b.set_latency(0.2)
        slowest = fc.bookies[3]
        slowest.set_latency(0.6 * T)
        async with fc.context(FAST) as ctx:
            queue = recorder(ctx)
            report = await replicas(ctx)
        assert report.violations == [] and report.ledgers_checked == 8
        assert queue == [0, 0]  # nothing waited for a retry
        # DbLedgerStorage: one list timeout to learn it cannot list, then probed.
        assert coverage(report) == (18, 6, 0)
        assert [b.received[LIST] for b in fc.bookies] == [6, 6, 6, 1]
        assert slowest.received[READ] == 2 * len(on(3))

        for b in fc.bookies:
            b.reset_stats()
        async with fc.context(FAST) as ctx:
            report = await ledgers(ctx)
        assert report.violations == [] and report.ledgers_checked == 8
        assert [b.received[READ] for b in fc.bookies] == [12, 12, 12, 12]
        assert await fc.marks() == {}


# --- 4. error storms ----------------------------------------------------------------------


def storm(fc: Faulty) -> tuple[BookieEmulator, BookieEmulator]:
    """Bookie 2 (lists) throttles every request; bookie 3 (DbLedgerStorage) fails reads.

    Bookie 3 stays silent on list requests, as DbLedgerStorage is, so the
    replicas check meets its storm on the probe path.
    """
    throttled, failing = fc.bookies[2], fc.bookies[3]
    throttled.inject_status(Status.ETOOMANYREQUESTS)
    failing.inject_status(Status.EIO, READ)
    return throttled, failing


DB_LAST = [Storage.SORTED, Storage.SORTED, Storage.SORTED, Storage.DBLEDGER]


async def test_error_storm_is_unanswered_not_missing(zk: ZkClient) -> None:
    async with faulty_cluster(zk, DB_LAST) as fc:
        throttled, failing = storm(fc)
        tid, fid = throttled.bookie_id, failing.bookie_id
        async with fc.context(FAST) as ctx:
            queue = recorder(ctx)
            report = await replicas(ctx)
        assert found(report) == expect(
            *((lid, BUR, tid) for lid in on(2)), *((lid, BUR, fid) for lid in on(3))
        )
        for v in report.violations:
            if v.bookie == tid:
                assert v.detail["reason"] == "ETOOMANYREQUESTS"
            else:
                first = probe_entries(fc.written[v.ledger_id].metadata, fid)[0]
                assert v.detail["reason"] == f"probe read of entry {first}: EIO"
        assert queue == [8, 0, 0]
        assert coverage(report) == (24 - 12, 0, 12)
        assert await fc.marks() == {}

        # The ledger check reads: any failed read makes a bad fragment, as upstream.
        async with fc.context(FAST) as ctx:
            report = await ledgers(ctx)
        expected: dict[int, dict[str, dict[str, int]]] = {}
        for lid in LEDGERS:
            ens = ensemble(fc.ids, lid)
            if tid in ens:
                expected.setdefault(lid, {})[tid] = {"ETOOMANYREQUESTS": 2}
            if fid in ens:
                expected.setdefault(lid, {})[fid] = {"EIO": 2}
        assert bad_bookies(report) == expected
        assert report.marked_underreplicated == list(LEDGERS)
        assert await fc.marks() == {lid: tuple(sorted(per)) for lid, per in expected.items()}


async def test_error_storm_over_before_the_retry_is_no_violation(zk: ZkClient) -> None:
    async with faulty_cluster(zk, DB_LAST) as fc:
        throttled, failing = storm(fc)

        def calm(n: int) -> None:
            if n:
                throttled.clear_faults()
                failing.clear_faults()

        async with fc.context(FAST) as ctx:
            queue = recorder(ctx, calm)
            report = await replicas(ctx)
        assert report.violations == [] and report.ledgers_checked == 8
        assert queue == [8, 0, 0]
        assert coverage(report) == (18, 6, 0)
        # Every ledger asked twice: in the first pass and in the retry.
        assert throttled.received[LIST] == 2 * len(on(2))
        assert failing.received[LIST] == 1  # learnt once that it cannot list
        assert failing.received[READ] == 2 * 2 * len(on(3))
        assert await fc.marks() == {}


# --- 5. same identity, empty storage ------------------------------------------------------


@pytest.mark.parametrize("storage", [Storage.SORTED, Storage.DBLEDGER])
async def test_bookie_back_empty_with_the_same_identity_is_reported(
    zk: ZkClient, storage: Storage
) -> None:
    """Stopped, wiped, started on the same address: every ledger it held is reported.

    Listed (SORTED, and DBLEDGER asked afresh: ENOLEDGER is an answer) or
    probed (DBLEDGER already known not to list): either way the copies it
    should hold are missing, below the ack quorum for W=2/A=2 and below the
    write quorum for W=3/A=2, and with marking on, it is the missing replica.
    """
    async with faulty_cluster(zk, [Storage.SORTED] * 3 + [storage]) as fc:
        wiped = fc.bookies[3]
        wid = wiped.bookie_id
        want = expect(
            *(
                (
                    lid,
                    Category.BELOW_ACK_QUORUM if lid <= 4 else Category.BELOW_WRITE_QUORUM,
                    None,
                )
                for lid in on(3)
            )
        )

        def assert_evidence(report: CheckReport, how: str) -> None:
            assert found(report) == want
            for v in report.violations:
                md = fc.written[v.ledger_id].metadata
                index = list(md.segments[0].bookies).index(wid)
                count = (
                    expected_count(0, ENTRIES - 1, 3, md.write_quorum, index)
                    if how == "listed"
                    else len(probe_entries(md, wid))
                )
                assert [(m["bookie"], m["count"]) for m in v.detail["missing"]] == [(wid, count)]
                assert v.detail["verified"][wid] == how
                assert v.detail["copies_found"] == md.write_quorum - 1

        async with fc.context(FAST, mark=False) as ctx:
            clean = await replicas(ctx)
            assert clean.violations == [] and clean.ledgers_checked == 8
            await wiped.stop()
            for lid in wiped.ledger_ids():
                wiped.drop_ledger(lid)
            await wiped.start()
            assert wiped.bookie_id == wid
            report = await replicas(ctx)
        # The same client: it reconnected, and still knows how this bookie answers.
        assert_evidence(report, "listed" if storage is Storage.SORTED else "probed")

        async with fc.context(FAST) as ctx:
            report = await replicas(ctx)
        assert_evidence(report, "listed")
        assert sorted(report.marked_underreplicated) == on(3)
        assert await fc.marks() == {lid: (wid,) for lid in on(3)}

        async with fc.context(FAST) as ctx:
            report = await ledgers(ctx)
        assert found(report) == expect(
            *((lid, Category.UNREADABLE_FRAGMENTS, wid) for lid in on(3))
        )
        assert bad_bookies(report) == {lid: {wid: {"ENOLEDGER": 2}} for lid in on(3)}
        assert await fc.marks() == {lid: (wid,) for lid in on(3)}


# --- 6. deleted while being checked -------------------------------------------------------


async def test_ledgers_deleted_while_checked_are_skipped_not_reported(zk: ZkClient) -> None:
    async with faulty_cluster(zk) as fc:
        async with fc.context(PATIENT) as ctx:
            assert (await replicas(ctx)).violations == []  # every bookie known to list
            for b in fc.bookies:
                b.reset_stats()
                b.pause()
            judged = outcomes(ctx)
            run = asyncio.ensure_future(replicas(ctx))
            for b in fc.bookies:
                await b.wait_requests(6, LIST)  # every ledger walked, every bookie asked
            # Deleted as BookKeeper deletes: metadata first, then the bookies' data.
            for lid in (1, 2):
                await zk.delete(fc.tc.cluster.path(lid))
                for b in fc.bookies:
                    b.drop_ledger(lid)
            await zk.delete(fc.tc.cluster.path(3))  # its data not collected yet
            for b in fc.bookies:
                b.resume()
            report = await run
        # 1 and 2 looked lost (ENOLEDGER everywhere); the re-read before reporting
        # found them deleted. 3 still had its copies: checked, and fine.
        assert judged == {1: "deleted", 2: "deleted", **{lid: "ok" for lid in range(3, 9)}}
        assert report.violations == []
        assert report.ledgers_skipped == {"deleted": 2}
        assert report.ledgers_checked == 6

        # Deleted while waiting for the retry: bookie 0 fails every list request.
        fc.bookies[0].inject_status(Status.EIO, LIST)
        doomed = (5, 6)

        def delete(n: int) -> None:
            if n:
                # Submitted now, so ZooKeeper applies them before the retry pass reads.
                for lid in doomed:
                    zk.kazoo.delete_async(fc.tc.cluster.path(lid))
                    for b in fc.bookies:
                        b.drop_ledger(lid)

        async with fc.context(PATIENT) as ctx:
            queue = recorder(ctx, delete)
            judged = outcomes(ctx)
            report = await replicas(ctx)
        assert queue == [3, 0, 0]  # 5, 6, 7: the remaining ledgers on bookie 0
        assert judged == {4: "ok", 5: "deleted", 6: "deleted", 7: "violation", 8: "ok"}
        assert found(report) == expect((7, BUR, fc.ids[0]))
        assert report.ledgers_skipped == {"deleted": 2}
        assert report.ledgers_checked == 3  # 4, 7, 8
        for lid in doomed:
            assert await zk.exists(fc.tc.cluster.path(lid)) is None
        assert await fc.marks() == {}


# --- 7. re-replicated while being checked -------------------------------------------------


@pytest.mark.parametrize("check", [Check.REPLICAS, Check.LEDGERS])
async def test_ledger_re_replicated_while_checked_is_judged_on_its_new_metadata(
    zk: ZkClient, check: Check
) -> None:
    """Bookie 1 lost ledgers 2, 3 and 4; while the check waits for the answers,
    the replication worker moves 2 to bookie 4 (copies made) and 3 to bookie 4
    (metadata updated, copies not made yet). 2 is fine; 3 is reported against
    its new metadata, bookie 4 missing; 4 is reported as it was, bookie 1.
    """
    async with faulty_cluster(zk, 5) as fc:
        lost, spare = fc.bookies[1], fc.bookies[4]
        vid, sid = lost.bookie_id, spare.bookie_id
        if check is Check.REPLICAS:
            category = Category.BELOW_ACK_QUORUM  # ledgers 2..4 are W=2/A=2
            op, per_ledger = LIST, 1
        else:
            category = Category.UNREADABLE_FRAGMENTS
            op, per_ledger = READ, 2
        async with fc.context(PATIENT) as ctx:
            assert (await driver(check)(ctx)).violations == []
            for lid in (2, 3, 4):
                lost.drop_ledger(lid)
            for b in fc.bookies:
                b.reset_stats()
                b.pause()
            run = asyncio.ensure_future(driver(check)(ctx))
            for i, b in enumerate(fc.bookies[:4]):
                await b.wait_requests(per_ledger * len(on(i)), op)
            for lid in (2, 3):
                old = fc.written[lid].metadata
                moved = [sid if b == vid else b for b in old.segments[0].bookies]
                new = replace(old, segments=(Segment(0, tuple(moved)),))
                await zk.set(fc.written[lid].path, encode_ledger_metadata(new), version=0)
            for e in range(ENTRIES):  # ledger 2's copies, from the bookies that kept them
                body = next(b.entry_body(2, e) for b in fc.bookies if b.has_entry(2, e))
                assert body is not None
                spare.put_entry(2, e, body)
            for b in fc.bookies:
                b.resume()
            report = await run
        # The replicas check names the bookie in the evidence, the ledger check in the violation.
        named = check is Check.LEDGERS
        assert found(report) == expect(
            (3, category, sid if named else None), (4, category, vid if named else None)
        )
        assert report.ledgers_checked == 8 and report.ledgers_skipped == {}
        v3, v4 = sorted(report.violations, key=lambda v: v.ledger_id)
        assert (v3.detail["metadata_version"], v4.detail["metadata_version"]) == (1, 0)
        if check is Check.REPLICAS:
            assert [m["bookie"] for m in v3.detail["missing"]] == [sid]
            assert [m["bookie"] for m in v4.detail["missing"]] == [vid]
        else:
            assert (v3.detail["bad_bookies"], v4.detail["bad_bookies"]) == ([sid], [vid])
        assert sorted(report.marked_underreplicated) == [3, 4]
        assert await fc.marks() == {3: (sid,), 4: (vid,)}


# --- the daemon stays responsive ------------------------------------------------------------


@pytest.mark.usefixtures("grpc_held")
async def test_daemon_answers_health_within_a_second_through_bookie_faults(zk: ZkClient) -> None:
    """A leading daemon runs its first replicas and ledger checks into three faulty bookies
    (one paused, one failing every request, one slow) on the loop that also serves them,
    while health probes keep coming: each answers SERVING within a second.
    """
    async with faulty_cluster(zk) as fc:
        slow, failing, paused = fc.bookies[1], fc.bookies[2], fc.bookies[3]
        slow.set_latency(0.3)
        failing.inject_status(Status.EIO)
        paused.pause()
        identity = "faults-auditor:1"
        cfg = load_daemon_config(
            None,
            [
                f"daemon.zk={zk.hosts}",
                f"daemon.identity={identity}",
                "worker.enabled=false",  # the auditor's findings are what is tested
                "daemon.jitter=0",
                "metrics.enabled=false",
                "auditorPeriodicBookieCheckInterval=3600",
                "auditorPeriodicCheckInterval=3600",
                "auditorPeriodicPlacementPolicyCheckInterval=0",
                "auditorReplicasCheckInterval=3600",
                *FAST,
            ],
            env={},
        )
        daemon = Daemon(cfg)

        async def api_factory(control: Daemon) -> Any:
            return await start_api_server(control, host="127.0.0.1", port=0, token=None)

        run = asyncio.ensure_future(daemon.run(api_factory=api_factory, signals=False))
        checks = daemon.state.checks
        latencies: list[float] = []
        during: dict[Check, int] = {Check.REPLICAS: 0, Check.LEDGERS: 0}
        try:
            while daemon.api is None:  # no event marks the API being up
                assert not run.done(), run
                await asyncio.sleep(0.01)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.api.port}") as channel:
                health = health_pb2_grpc.HealthStub(channel)
                while checks[Check.LEDGERS].last_report is None:
                    assert not run.done(), run
                    for check, n in during.items():
                        during[check] = n + (checks[check].outcome is RunState.RUNNING)
                    for service in ("", LIVENESS, READINESS):
                        started = time.monotonic()
                        resp = await health.Check(
                            health_pb2.HealthCheckRequest(service=service), timeout=T
                        )
                        latencies.append(time.monotonic() - started)
                        assert resp.status == health_pb2.HealthCheckResponse.SERVING, service
                    await asyncio.sleep(0.05)  # the probe rate, not a wait for an event
            assert daemon.state.is_leader and daemon.state.leader == identity
            assert await current_auditor(zk, fc.tc.root) == identity
        finally:
            daemon.stop()
            await asyncio.wait_for(run, 30)
        assert max(latencies) < T, max(latencies)
        # Probed all along both checks, not only before or after them.
        assert during[Check.REPLICAS] >= 10 and during[Check.LEDGERS] >= 3, during

        fid, pid = failing.bookie_id, paused.bookie_id
        rep = checks[Check.REPLICAS].last_report
        assert rep is not None
        assert found(rep) == expect(
            *((lid, BUR, fid) for lid in on(2)), *((lid, BUR, pid) for lid in on(3))
        )
        led = checks[Check.LEDGERS].last_report
        assert led is not None
        expected: dict[int, dict[str, dict[str, int]]] = {}
        for lid in LEDGERS:
            ens = ensemble(fc.ids, lid)
            expected[lid] = {
                b: {"EIO" if b == fid else "timeout": 2} for b in (fid, pid) if b in ens
            }
        assert bad_bookies(led) == expected
        assert await fc.marks() == {lid: tuple(sorted(per)) for lid, per in expected.items()}
        bookies_report = checks[Check.BOOKIES].last_report
        assert bookies_report is not None and bookies_report.lost_bookies == []
