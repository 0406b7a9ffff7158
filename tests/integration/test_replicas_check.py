"""The replicas check (BP-34 durability contract) against emulated bookies.

Scenarios S1-S5 are upstream's AuditorReplicasCheckTest, ported: each fake
bookie's answer becomes what an emulated bookie really holds (or an error it
really returns). Where this check deliberately differs from upstream, the test
says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

from auditor.bookie.protocol import Operation, Status
from auditor.checks.findings import Category, CheckReport
from auditor.checks.replicas_run import run_replicas_check
from auditor.metadata.model import LedgerState
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.store import MetadataStore
from auditor.testing.bookie import Storage
from auditor.testing.cluster import make_metadata
from auditor.testing.harness import TestCluster, test_cluster
from auditor.zk import ZkClient

FAST = ["checks.retry_delay=0.1", "checks.retry_attempts=1", "readEntryTimeout=1"]
DURABILITY = (Category.NO_REPLICA, Category.BELOW_ACK_QUORUM, Category.BELOW_WRITE_QUORUM)


async def run(tc: TestCluster, *extra: str, mark: bool = False) -> CheckReport:
    async with tc.context(overrides=[*FAST, *extra], mark=mark) as ctx:
        return await run_replicas_check(ctx)


def by_category(report: CheckReport) -> dict[Category, list[int]]:
    out: dict[Category, list[int]] = {}
    for v in report.violations:
        out.setdefault(v.category, []).append(v.ledger_id)
    return {c: sorted(set(ids)) for c, ids in out.items()}


def rc(report: CheckReport) -> tuple[int, int, int]:
    c = report.counts()
    return (c["no_replica"], c["below_ack_quorum"], c["below_write_quorum"])


async def closed(
    tc: TestCluster,
    ledger_id: int,
    segments: Sequence[tuple[int, Sequence[str]]],
    e: int,
    w: int,
    a: int,
    last: int,
    state: LedgerState = LedgerState.CLOSED,
) -> None:
    md = make_metadata(
        ledger_id,
        [(f, list(b)) for f, b in segments],
        write_quorum=w,
        ack_quorum=a,
        state=state,
        last_entry_id=last,
        length=max(last + 1, 0) * 10,
    )
    assert md.ensemble_size == e
    await tc.cluster.write_ledger(md)


def hold(tc: TestCluster, ledger_id: int, holdings: Sequence[Sequence[int] | None]) -> None:
    """holdings[i] is what bookie i holds of the ledger (None: it never heard of it)."""
    for bookie, entries in zip(tc.bookies, holdings, strict=False):
        if entries is not None:
            bookie.put_ledger(ledger_id, list(entries))


async def test_s1_unanswering_bookies_are_retried_then_reported_if_registered(
    store: MetadataStore,
) -> None:
    """S1. Upstream: an unreachable bookie is never a violation (RC gauges 0,0,0).

    Here (BP-34): the ledgers are re-checked after the retry delay, and a bookie
    still silent while registered is `bookie_unavailable_registered`; durability
    categories stay at zero, as upstream.
    """
    async with test_cluster(store, 5) as tc:
        b = tc.ids
        segs = [(0, b[0:4]), (20, b[1:5]), (60, b[0:4])]
        await closed(tc, 1, [(0, b)], 5, 4, 2, 100)
        await closed(tc, 2, segs, 4, 4, 2, 100)
        await closed(tc, 3, [(0, b[0:4])], 4, 4, 2, -1, LedgerState.OPEN)
        await closed(tc, 4, segs, 4, 4, 2, -1, LedgerState.OPEN)
        for bk in tc.bookies:
            bk.inject_status(Status.EIO)
        report = await run(tc)
        assert rc(report) == (0, 0, 0)
        assert by_category(report) == {Category.BOOKIE_UNAVAILABLE_REGISTERED: [1, 2]}
        assert {(v.ledger_id, v.bookie) for v in report.violations} == {
            *((1, x) for x in b),
            *((2, x) for x in b),
        }
        assert report.ledgers_skipped == {"open": 2}
        assert report.ledgers_checked == 2
        # Retried once: every bookie was asked about each closed ledger twice.
        assert all(bk.received[Operation.GET_LIST_OF_ENTRIES_OF_LEDGER] >= 2 for bk in tc.bookies)


async def test_s2_ledgers_with_no_replica_of_an_entry(store: MetadataStore) -> None:
    async with test_cluster(store, 5) as tc:
        b = tc.ids
        await closed(tc, 1, [(0, b)], 5, 4, 2, 100)
        hold(tc, 1, [[], [], [], [], []])  # every bookie answers: empty
        await closed(tc, 2, [(0, b[0:4]), (20, b[1:5]), (60, b[0:4])], 4, 4, 2, 100)
        # ledger 2: nobody has it (ENOLEDGER counts as empty)
        await closed(tc, 3, [(0, b[0:4])], 4, 4, 2, -1, LedgerState.OPEN)
        await closed(tc, 4, [(0, b[0:3])], 3, 3, 2, 1)
        hold(tc, 4, [[0], [0], [0]])
        await closed(tc, 5, [(0, b[0:4])], 4, 3, 2, 3)
        hold(tc, 5, [[0], [0, 3], [0], [2, 3]])
        report = await run(tc)
        assert rc(report) == (4, 0, 0)
        assert by_category(report) == {Category.NO_REPLICA: [1, 2, 4, 5]}
        v5 = next(v for v in report.violations if v.ledger_id == 5)
        assert v5.detail["copies_found"] == 0
        assert [1, 1] in v5.detail["worst_entries"]


async def test_s3_ledgers_below_ack_quorum(store: MetadataStore) -> None:
    """S3. L5's unanswering bookie: upstream ignores it and counts L5 below AQ.

    Here the same category results after the retry, and the silent registered
    bookie is reported as well (`bookie_unavailable_registered`).
    """
    async with test_cluster(store, 6) as tc:
        b = tc.ids
        await closed(tc, 1, [(0, b[0:4])], 4, 3, 2, 3)
        hold(tc, 1, [[0], [0, 1, 3], [0, 1], [1, 2, 3]])
        for lid, b0 in ((2, []), (3, [2])):
            await closed(tc, lid, [(0, b[0:4]), (2, b[1:5])], 4, 3, 2, 3)
            hold(tc, lid, [b0, [0, 1, 2, 3], [0, 1, 3], [1], [3]])
        await closed(tc, 4, [(0, b[0:4]), (2, b[1:5])], 4, 3, 2, -1, LedgerState.OPEN)
        await closed(tc, 5, [(0, [b[0], b[1], b[5]])], 3, 3, 2, 1)
        hold(tc, 5, [[], [], None, None, None, None])
        tc.bookies[5].inject_status(Status.EIO)
        report = await run(tc)
        assert rc(report) == (0, 4, 0)
        assert by_category(report) == {
            Category.BELOW_ACK_QUORUM: [1, 2, 3, 5],
            Category.BOOKIE_UNAVAILABLE_REGISTERED: [5],
        }


async def test_s4_ledgers_below_write_quorum(store: MetadataStore) -> None:
    async with test_cluster(store, 6) as tc:
        b = tc.ids
        await closed(tc, 1, [(0, b[0:4])], 4, 3, 2, 3)
        hold(tc, 1, [[0, 2], [0, 1, 3], [0, 1], [1, 2, 3]])
        await closed(tc, 2, [(0, b[0:4]), (2, b[1:5])], 4, 3, 2, 3)
        hold(tc, 2, [[], [0, 1, 2, 3], [0, 1, 3], [1], [2, 3]])
        await closed(tc, 3, [(0, b[0:4]), (2, b[1:5])], 4, 3, 2, -1, LedgerState.OPEN)
        await closed(tc, 4, [(0, b[0:4])], 4, 3, 2, 1)
        hold(tc, 4, [[0, 1], [0, 1, 2, 3], [1, 3], [0]])  # b3's entry 0 is extra: ignored
        await closed(tc, 5, [(0, [b[0], b[1], b[5]])], 3, 3, 2, 1)
        hold(tc, 5, [[], [0, 1], None, None, None, None])
        tc.bookies[5].inject_status(Status.EIO)
        report = await run(tc)
        assert rc(report) == (0, 0, 4)
        assert by_category(report)[Category.BELOW_WRITE_QUORUM] == [1, 2, 4, 5]


async def test_s5_empty_segments(store: MetadataStore) -> None:
    async with test_cluster(store, 5) as tc:
        b = tc.ids
        await closed(tc, 1, [(0, b[0:4])], 4, 3, 2, -1)
        await closed(tc, 2, [(0, b[0:4]), (3, b[1:5])], 4, 3, 2, 2)
        hold(tc, 2, [[0, 2], [0, 1], [0, 1, 2], [1, 2]])
        await closed(tc, 3, [(0, b[0:4]), (4, b[0:4]), (6, b[0:4])], 4, 3, 2, 5)
        hold(tc, 3, [[0, 2], [0, 1], [0, 1, 2], [1, 2]])
        await closed(tc, 4, [(0, b[0:4])], 4, 3, 2, -1, LedgerState.OPEN)
        for bk in tc.bookies:
            bk.reset_stats()
        report = await run(tc)
        assert rc(report) == (1, 0, 0)
        assert by_category(report) == {Category.NO_REPLICA: [3]}
        assert report.ledgers_skipped == {"empty": 1, "open": 1}
        v = report.violations[0]
        assert v.detail["worst_entries"] == [[3, 5]]
        # The empty closed ledger cost no request.
        assert b[4] not in {m["bookie"] for m in v.detail["missing"]}


async def test_layouts_where_upstream_raises_false_alarms(store: MetadataStore) -> None:
    """E-W >= 2: upstream's getUnavailableEntries reports entries past a gap as missing.

    With every entry present there is no violation here; with one entry removed
    from one bookie exactly that ledger is reported once, with that entry in the
    evidence: below write quorum when the remaining copies still reach the ack
    quorum (E=5/W=3/A=2), below ack quorum when W == A (E=4/W=2/A=2, E=6/W=2/A=2:
    one copy left is fewer than the two an add needed; the categories are
    exclusive and the worse one wins).
    """
    layouts = [(5, 3, 2), (4, 2, 2), (6, 2, 2)]
    async with test_cluster(store, 6) as tc:
        for lid, (e, w, a) in enumerate(layouts, start=1):
            await tc.writer.write_ledger(
                lid, tc.ids[:e], write_quorum=w, ack_quorum=a, num_entries=40
            )
        report = await run(tc)
        assert report.violations == []
        assert report.ledgers_checked == 3
        assert report.coverage is not None and report.coverage.listed == 5 + 4 + 6
        for lid, (e, w, a) in enumerate(layouts, start=1):
            victim = tc.bookies[0]  # bookie 0 holds entry 0 (write set of 0 is 0..w-1)
            victim.drop_entries(lid, [0])
            report = await run(tc)
            expected = Category.BELOW_WRITE_QUORUM if w - 1 >= a else Category.BELOW_ACK_QUORUM
            assert [(v.ledger_id, v.category, v.bookie) for v in report.violations] == [
                (lid, expected, None)
            ], (e, w)
            d = report.violations[0].detail
            assert d["copies_found"] == w - 1
            assert d["worst_entries"] == [[0, 0]]
            assert d["missing"] == [
                {"segment": [0, 39], "bookie": victim.bookie_id, "entries": [[0, 0]], "count": 1}
            ]
            victim.put_ledger(lid, [0])  # heal before the next layout


async def test_metadata_changed_mid_check_is_analysed_again(store: MetadataStore) -> None:
    """A ledger re-replicated while we look (ensemble replaced) is not reported."""
    async with test_cluster(store, 4) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(7, b[0:3], write_quorum=2, num_entries=30)
        tc.bookies[1].drop_ledger(7)  # b1 lost everything ...
        held = tc.bookies[0]
        held.set_latency(0.5, Operation.GET_LIST_OF_ENTRIES_OF_LEDGER)
        async with tc.context(overrides=FAST) as ctx:
            task = asyncio.ensure_future(run_replicas_check(ctx))
            await held.wait_requests(1, Operation.GET_LIST_OF_ENTRIES_OF_LEDGER)
            # ... and is replaced by b3 while the check waits for b0.
            await tc.writer.rereplicate(written, [b[0], b[3], b[2]])
            report = await task
        assert report.violations == []
        assert report.ledgers_checked == 1


async def test_bookie_slow_once_is_not_a_violation(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        await tc.writer.write_ledger(3, tc.ids, write_quorum=2, num_entries=10)
        slow = tc.bookies[2]
        first = [True]

        def once(_req: pb.Request) -> float:
            if first[0]:
                first[0] = False
                return 1.5  # longer than the 1 s read timeout
            return 0.0

        slow.set_latency(once, Operation.GET_LIST_OF_ENTRIES_OF_LEDGER)
        report = await run(tc)
        assert report.violations == []
        assert report.ledgers_checked == 1


async def test_bookie_paused_past_the_retries_while_registered(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        await tc.writer.write_ledger(3, tc.ids, write_quorum=2, num_entries=10)
        tc.bookies[1].pause()
        try:
            report = await run(tc)
        finally:
            tc.bookies[1].resume()
        assert [(v.ledger_id, v.category, v.bookie) for v in report.violations] == [
            (3, Category.BOOKIE_UNAVAILABLE_REGISTERED, tc.ids[1])
        ]
        assert report.coverage is not None and report.coverage.unverified == 1


async def test_crashed_unregistered_bookie_is_left_to_the_bookie_check(
    store: MetadataStore,
) -> None:
    async with test_cluster(store, 3) as tc:
        await tc.writer.write_ledger(3, tc.ids, write_quorum=2, num_entries=10)
        await tc.bookies[1].crash()  # unregisters
        report = await run(tc)
        assert report.violations == []
        assert report.ledgers_checked == 1


async def test_dbledger_bookie_costs_one_timeout_and_is_probed(store: MetadataStore) -> None:
    async with test_cluster(store, [Storage.SORTED, Storage.DBLEDGER, Storage.SORTED]) as tc:
        for lid in range(1, 21):
            await tc.writer.write_ledger(lid, tc.ids, write_quorum=2, num_entries=9)
        db = tc.bookies[1]
        db.reset_stats()
        report = await run(tc)
        assert report.violations == []
        assert db.received[Operation.GET_LIST_OF_ENTRIES_OF_LEDGER] == 1
        # First and last entry it must hold, per ledger.
        assert db.received[Operation.READ_ENTRY] == 2 * 20
        assert report.coverage is not None
        assert (report.coverage.listed, report.coverage.probed) == (40, 20)
        # A probe that finds an entry gone is a real finding.
        db.drop_entries(5, [0])  # entry 0 is the first entry bookie index 1 holds (W=2)
        report = await run(tc)
        assert [(v.ledger_id, v.category) for v in report.violations] == [
            (5, Category.BELOW_ACK_QUORUM)  # W == A == 2: one copy left
        ]
        assert report.violations[0].detail["verified"][db.bookie_id] == "probed"


async def test_marks_only_with_mark_and_already_marked_is_skipped(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        await tc.writer.write_ledger(1, tc.ids, write_quorum=2, num_entries=6)
        tc.bookies[0].drop_ledger(1)
        report = await run(tc)
        assert report.marked_underreplicated == []
        assert await store.exists("/ledgers/underreplication/ledgers/0000/0000/0000/0001") is None
        report = await run(tc, mark=True)
        assert report.marked_underreplicated == [1]
        async with tc.context() as ctx:
            ur = await ctx.urm.get(1)
        assert ur is not None and ur.replicas == (tc.ids[0],)
        # Marked now: skipped, or past the grace period a violation of its own.
        report = await run(tc)
        assert report.violations == [] and report.ledgers_skipped == {"underreplicated": 1}
        report = await run(tc, "underreplicatedLedgerRecoveryGracePeriod=1")
        assert report.violations == [] and report.ledgers_skipped == {"underreplicated": 1}


async def test_invalid_metadata_is_reported(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        path = await tc.cluster.write_raw(9, b"BookieMetadataFormatVersion\t3\nxx")
        report = await run(tc)
        assert [(v.ledger_id, v.category) for v in report.violations] == [
            (9, Category.METADATA_INVALID)
        ]
        assert report.violations[0].detail["path"] == path
        assert report.ledgers_checked == 1
        assert report.to_json()["counts"]["metadata_invalid"] == 1


#: The soak's retry setting: each bookie that falls silent is owed two delayed re-checks.
TWICE = ["checks.retry_delay=0.1", "checks.retry_attempts=2", "readEntryTimeout=1"]
BUR = Category.BOOKIE_UNAVAILABLE_REGISTERED


async def run_between_passes(
    tc: TestCluster, overrides: Sequence[str], between: Mapping[int, Callable[[], None]]
) -> tuple[CheckReport, list[int]]:
    """Runs the check; `between[n]` acts right after pass n (0: the first pass).

    The retry queue's hook is called at the end of each pass, before the delay
    to the next one starts, so a fault set there is in place for exactly the
    next look, whatever the machine's load. Returns the report and the queue
    lengths the hook saw (after each pass, then 0 at the end).
    """
    queue: list[int] = []
    async with tc.context(overrides=overrides) as ctx:

        def after_pass(waiting: int) -> None:
            act = between.get(len(queue))
            queue.append(waiting)
            if act is not None:
                act()

        ctx.on_retry_queue = after_pass
        report = await run_replicas_check(ctx)
    return report, queue


async def second_silence(zk: ZkClient, *, back_after_pass: int | None) -> None:
    """Soak seed 5151's interleaving, on ledger 7 of bookies A, B, C (W=2).

    A answers EIO on every look, so the ledger waits for its re-checks (looks 1
    and 2). B stops answering (paused: registered, connections open) right
    before look 2, A's last: before the fix, B was reported on that one look
    (`bookie_unavailable_registered`, beside A), as the soak's short crash was.
    B is owed its own two re-checks (looks 3 and 4). Back before look 4 (after
    pass 3), nothing is reported for it; still silent there, it is reported.
    """
    async with test_cluster(zk, 3) as tc:
        await tc.writer.write_ledger(7, tc.ids, write_quorum=2, num_entries=10)
        a, b = tc.bookies[0], tc.bookies[1]
        a.inject_status(Status.EIO)
        between = {1: b.pause}
        if back_after_pass is not None:
            between[back_after_pass] = b.resume
        try:
            report, queue = await run_between_passes(tc, TWICE, between)
        finally:
            b.resume()
        # Each reported bookie with how many looks in a row it did not answer.
        expected = (
            {a.bookie_id: 5} if back_after_pass is not None else {a.bookie_id: 5, b.bookie_id: 3}
        )
        assert {v.bookie: v.detail["attempts"] for v in report.violations} == expected
        assert [(v.ledger_id, v.category) for v in report.violations] == [(7, BUR)] * len(expected)
        # Looks 0-2 are A's own re-checks, 3 and 4 B's: the ledger waited after four passes.
        assert queue == [1, 1, 1, 1, 0, 0]
        assert report.ledgers_checked == 1 and report.ledgers_skipped == {}
        assert not report.dropped  # a violation was reported: no drop
        assert (a.list_requests[7], b.list_requests[7], tc.bookies[2].list_requests[7]) == (
            5,
            5,
            5,
        )


async def test_a_bookie_silent_on_anothers_last_recheck_back_in_its_own_is_not_reported(
    zk: ZkClient,
) -> None:
    await second_silence(zk, back_after_pass=3)


async def test_a_bookie_silent_on_anothers_last_recheck_is_reported_after_its_own(
    zk: ZkClient,
) -> None:
    await second_silence(zk, back_after_pass=None)


async def test_bookies_taking_turns_at_silence_are_rechecked_within_the_bound(
    zk: ZkClient, info_logs: list[MutableMapping[str, Any]]
) -> None:
    """The bound: a ledger is re-checked at most 2 * retry_attempts times.

    With one re-check owed per silence (retry_attempts=1): A is silent on look
    0, B on look 1, A again on look 2. Each new silence is owed a re-check, so
    without a bound the ledger would be looked at for as long as they take
    turns. Look 2 is the bound: the ledger is judged there, and A, silent on
    that look only, is not reported (a late report, from the next run, never
    an early one); nothing else is wrong with the ledger.
    """
    async with test_cluster(zk, 3) as tc:
        await tc.writer.write_ledger(7, tc.ids, write_quorum=2, num_entries=10)
        a, b = tc.bookies[0], tc.bookies[1]

        def b_silent() -> None:
            a.inject_status(None)
            b.pause()

        def a_silent() -> None:
            b.resume()
            a.inject_status(Status.EIO)

        a.inject_status(Status.EIO)
        try:
            report, queue = await run_between_passes(
                tc, [*FAST, "checks.retry_attempts=1"], {0: b_silent, 1: a_silent}
            )
        finally:
            b.resume()
        assert queue == [1, 1, 0, 0]
        assert report.violations == []
        assert report.ledgers_checked == 1 and not report.dropped
        assert report.coverage is not None and report.coverage.unverified == 1
        assert [
            (e["ledger_id"], e["bookie"], e["silent_looks"], e["rechecks"])
            for e in info_logs
            if e["event"].startswith("unanswering bookie not re-checked enough")
        ] == [(7, a.bookie_id, 1, 2)]
        assert (a.list_requests[7], b.list_requests[7]) == (3, 3)
