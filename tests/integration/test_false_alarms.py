"""False-alarm accounting and bounded reports, against real ZooKeeper or etcd and emulated bookies.

Each drop path of the checks is driven for real: a bookie silent on the first
pass, a mark or a deletion landing while the check waits for a bookie, a lost
bookie registering again during the walk. The reports must count exactly
those ledgers under exactly that cause, and report nothing for them.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from auditor.api.convert import report_from_json
from auditor.bookie.protocol import Operation, Status
from auditor.checks.bookie_check_run import run_bookie_check
from auditor.checks.context import CheckContext
from auditor.checks.findings import Category, CheckReport
from auditor.checks.ledger_check_run import run_ledger_check
from auditor.checks.replicas_run import run_replicas_check
from auditor.cli.check import render_text
from auditor.metadata.serde import decode_ledger_metadata, encode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.metadata.walk import LedgerRecord, LedgerWalker
from auditor.store import MetadataStore
from auditor.testing.cluster import make_metadata
from auditor.testing.harness import TestCluster, test_cluster

FAST = ["checks.retry_delay=0.1", "checks.retry_attempts=1", "readEntryTimeout=1"]


async def replicas(tc: TestCluster, *extra: str) -> CheckReport:
    async with tc.context(overrides=[*FAST, *extra]) as ctx:
        return await run_replicas_check(ctx)


def accounting(report: CheckReport) -> tuple[object, ...]:
    doc = report.to_json()
    return (
        [(v["ledger_id"], v["category"]) for v in doc["violations"]],
        doc["would_be_violations_dropped"],
        doc["false_alarm_share"],
    )


async def test_retry_that_succeeds_is_a_dropped_would_be_violation(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        await tc.writer.write_ledger(3, b, write_quorum=2, num_entries=10)
        # Ledger 4 (bookies 0 and 1 only) really is below its ack quorum: entry 0 has one copy.
        await tc.writer.write_ledger(4, b[:2], write_quorum=2, num_entries=10)
        tc.bookies[1].drop_entries(4, [0])
        silent = tc.bookies[2]
        silent.inject_status(Status.EIO)  # no answer on the first pass ...
        async with tc.context(overrides=FAST) as ctx:

            def heal(waiting: int) -> None:
                if waiting:  # ... and a good one once ledger 3 waits for its re-check
                    silent.inject_status(None)

            ctx.on_retry_queue = heal
            report = await run_replicas_check(ctx)
        assert silent.list_requests[3] == 2
        assert accounting(report) == (
            [(4, "below_ack_quorum")],
            {"retry_succeeded": 1},
            0.5,
        )
        assert report.ledgers_checked == 2
        text = io.StringIO()
        render_text(report, text)
        assert "  would-be violations dropped: retry_succeeded=1 (false-alarm share 0.50)\n" in (
            text.getvalue()
        )


async def held_check(
    tc: TestCluster,
    meanwhile: Callable[[CheckContext], Awaitable[None]],
    run: Callable[[CheckContext], Awaitable[CheckReport]] = run_replicas_check,
    held_op: Operation = Operation.GET_LIST_OF_ENTRIES_OF_LEDGER,
    overrides: list[str] = FAST,
) -> CheckReport:
    """Runs a check; while bookie 0 sits on its answer to `held_op`, `meanwhile` happens."""
    held = tc.bookies[0]
    held.set_latency(0.5, held_op)
    async with tc.context(overrides=overrides) as ctx:
        task = asyncio.ensure_future(run(ctx))
        await held.wait_requests(1, held_op)
        await meanwhile(ctx)
        return await task


async def test_ledger_marked_while_checked_is_dropped_as_marked_meanwhile(
    store: MetadataStore,
) -> None:
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        await tc.writer.write_ledger(7, b, write_quorum=2, num_entries=30)
        tc.bookies[1].drop_ledger(7)  # below write quorum, as the first look sees it

        async def mark(ctx: CheckContext) -> None:
            await ctx.urm.mark_underreplicated(7, [b[1]])  # re-replication takes it over

        report = await held_check(tc, mark)
        assert accounting(report) == ([], {"marked_meanwhile": 1}, 1.0)
        assert report.ledgers_skipped == {"underreplicated": 1}
        assert report.marked_underreplicated == []


async def test_ledger_deleted_while_checked_is_dropped_as_deleted(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(7, b, write_quorum=2, num_entries=30)
        tc.bookies[1].drop_ledger(7)

        async def delete(_ctx: CheckContext) -> None:
            await store.delete(written.path)

        report = await held_check(tc, delete)
        assert accounting(report) == ([], {"ledger_deleted": 1}, 1.0)
        assert report.ledgers_skipped == {"deleted": 1}


async def test_metadata_changed_while_checked_is_dropped_as_metadata_changed(
    store: MetadataStore,
) -> None:
    async with test_cluster(store, 4) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(7, b[0:3], write_quorum=2, num_entries=30)
        tc.bookies[1].drop_ledger(7)

        async def replace(_ctx: CheckContext) -> None:
            # Re-replicated meanwhile: b3 takes b1's place and holds its entries.
            await tc.writer.rereplicate(written, [b[0], b[3], b[2]])

        report = await held_check(tc, replace)
        assert accounting(report) == ([], {"metadata_changed": 1}, 1.0)
        assert report.ledgers_checked == 1


async def test_ledger_check_counts_a_deleted_ledger_as_dropped(store: MetadataStore) -> None:
    async with test_cluster(store, 3) as tc:
        b = tc.ids
        written = await tc.writer.write_ledger(5, b, write_quorum=2, num_entries=10)
        tc.bookies[1].drop_ledger(5)

        async def delete(_ctx: CheckContext) -> None:
            await store.delete(written.path)

        report = await held_check(
            tc,
            delete,
            run_ledger_check,
            Operation.READ_ENTRY,
            ["auditorLedgerVerificationPercentage=100"],
        )
        assert accounting(report) == ([], {"ledger_deleted": 1}, 1.0)
        assert report.ledgers_skipped == {"deleted": 1}


class _ChangingWalker(LedgerWalker):
    """The real walk; after its first ledger, `change` runs (a real write to the store)."""

    def __init__(self, ctx: CheckContext, change: Callable[[], Awaitable[None]]) -> None:
        super().__init__(ctx.store, ctx.root, ctx.manager)
        self.change = change

    async def ledgers(self, concurrency: int = 64) -> AsyncIterator[LedgerRecord]:
        first = True
        async for rec in super().ledgers(concurrency):
            yield rec
            if first:
                first = False
                await self.change()


async def test_bookie_back_during_the_walk_is_dropped_as_bookie_returned(
    store: MetadataStore,
) -> None:
    async with test_cluster(store, 4) as tc:
        b = tc.ids
        await tc.cluster.write_ledger(make_metadata(1, b[0:3], write_quorum=2))
        await tc.cluster.write_ledger(make_metadata(2, [b[0], b[1], b[3]], write_quorum=2))
        await tc.cluster.write_ledger(make_metadata(3, [b[2], b[3], b[1]], write_quorum=2))
        await tc.bookies[2].crash()  # unregistered before the walk ...
        await tc.bookies[3].crash()  # ... and this one stays away
        async with tc.context() as ctx:
            # After the walk's first ledger, a lost bookie starts again (and registers).
            back = _ChangingWalker(ctx, tc.bookies[2].start)
            setattr(ctx, "walker", lambda: back)  # noqa: B010
            report = await run_bookie_check(ctx)
        # Ledger 1 only had b2 lost: dropped. Ledger 3 keeps b3; ledger 2 only had b3.
        doc = report.to_json()
        assert [(v["ledger_id"], v["bookie"]) for v in doc["violations"]] == [
            (2, b[3]),
            (3, b[3]),
        ]
        assert doc["would_be_violations_dropped"] == {"bookie_returned": 1}
        assert doc["false_alarm_share"] == round(1 / 3, 6)
        assert doc["lost_bookies"] == [b[3]]


async def replace_bookie(tc: TestCluster, ledger_id: int, old: str, new: str) -> None:
    """What a worker's commit does to the metadata: `old` replaced by `new`, version + 1."""
    path = tc.cluster.path(ledger_id)
    data, stat = await tc.store.get(path)
    md = decode_ledger_metadata(data, ledger_id)
    segments = tuple(
        replace(seg, bookies=tuple(new if b == old else b for b in seg.bookies))
        for seg in md.segments
    )
    await tc.store.set(path, encode_ledger_metadata(replace(md, segments=segments)), stat.version)


async def marks(tc: TestCluster) -> dict[int, tuple[str, ...]]:
    urm = UnderreplicationManager(tc.store, tc.root)
    return {m.ledger_id: m.replicas async for m in urm.list_underreplicated()}


async def test_bookie_check_reads_lost_ledgers_again_before_reporting_or_marking(
    store: MetadataStore,
) -> None:
    """A ledger re-replicated during the walk (the daemon's index a moment behind the
    store, or a long walk) is judged again on the store's version, and a deleted one is
    dropped: neither is reported nor marked."""
    async with test_cluster(store, 4) as tc:
        b = tc.ids
        for lid in (1, 2, 3):
            await tc.cluster.write_ledger(make_metadata(lid, b[0:3], write_quorum=2))
        await tc.bookies[2].crash()

        async def change() -> None:
            await replace_bookie(tc, 1, b[2], b[3])
            await tc.store.delete(tc.cluster.path(3))

        async with tc.context(mark=True) as ctx:
            setattr(ctx, "walker", lambda: _ChangingWalker(ctx, change))  # noqa: B010
            report = await run_bookie_check(ctx)
        doc = report.to_json()
        assert [(v["ledger_id"], v["bookie"]) for v in doc["violations"]] == [(2, b[2])]
        assert doc["would_be_violations_dropped"] == {"metadata_changed": 1, "ledger_deleted": 1}
        assert report.ledgers_skipped == {"deleted": 1}
        assert report.marked_underreplicated == [2]
        assert await marks(tc) == {2: (b[2],)}


async def test_bookie_check_marks_only_while_the_ledger_is_at_the_version_it_judged(
    store: MetadataStore,
) -> None:
    """The metadata changes between the report and the mark: the guarded mark is refused
    and the ledger judged again: marked at its new version when it still names the lost
    bookie (ledger 2: closed meanwhile), not at all when a worker replaced it (ledger 1)."""
    async with test_cluster(store, 4) as tc:
        b = tc.ids
        for lid in (1, 2):
            await tc.cluster.write_ledger(make_metadata(lid, b[0:3], write_quorum=2))
        await tc.bookies[2].crash()
        async with tc.context(mark=True) as ctx:
            original = ctx.mark_underreplicated
            changed: list[int] = []

            async def change_first(
                report: CheckReport, ledger_id: int, missing: Sequence[str], **kw: Any
            ) -> bool:
                if ledger_id not in changed:
                    changed.append(ledger_id)
                    if ledger_id == 1:
                        await replace_bookie(tc, 1, b[2], b[3])
                    else:
                        await replace_bookie(tc, 2, b[3], b[3])  # same bytes, version + 1
                return await original(report, ledger_id, missing, **kw)

            setattr(ctx, "mark_underreplicated", change_first)  # noqa: B010
            report = await run_bookie_check(ctx)
        assert sorted(changed) == [1, 2]
        assert report.marked_underreplicated == [2]
        assert await marks(tc) == {2: (b[2],)}
        assert (await tc.store.get(tc.cluster.path(2)))[1].version == 1


async def test_a_mark_keeps_only_the_bookies_a_ledger_changed_meanwhile_still_names(
    store: MetadataStore,
) -> None:
    """The replicas check's marks too: between the report and the mark, ledger 1's first
    bookie is replaced (a worker's commit) and ledger 2 deleted. Ledger 1 is marked for the
    two bookies it still names, at its new version; ledger 2 not at all."""
    async with test_cluster(store, 4) as tc:
        b = tc.ids
        await tc.cluster.write_ledgers(
            make_metadata(lid, b[0:3], write_quorum=2, last_entry_id=4, length=50) for lid in (1, 2)
        )
        async with tc.context(mark=True) as ctx:
            original = ctx.mark_underreplicated

            async def change_first(
                report: CheckReport, ledger_id: int, missing: Sequence[str], **kw: Any
            ) -> bool:
                assert sorted(missing) == sorted(b[0:3])  # every copy missing
                if ledger_id == 1:
                    await replace_bookie(tc, 1, b[0], b[3])
                else:
                    await tc.store.delete(tc.cluster.path(2))
                return await original(report, ledger_id, missing, **kw)

            setattr(ctx, "mark_underreplicated", change_first)  # noqa: B010
            report = await run_replicas_check(ctx)
        assert sorted(v.ledger_id for v in report.violations) == [1, 2]
        assert report.marked_underreplicated == [1]
        assert {lid: sorted(bs) for lid, bs in (await marks(tc)).items()} == {1: sorted(b[1:3])}


# --- samples and truncation ----------------------------------------------------------------


async def unreplicated_cluster(tc: TestCluster, ids: list[int]) -> None:
    """Closed ledgers whose bookies answer but hold nothing: `no_replica`, every one."""
    await tc.cluster.write_ledgers(
        make_metadata(lid, tc.ids, write_quorum=2, last_entry_id=4, length=50) for lid in ids
    )


async def test_samples_are_the_first_hundred_ids_and_listing_is_bounded(
    store: MetadataStore,
) -> None:
    ids = [1000 + 7 * i for i in range(105)]
    async with test_cluster(store, 3) as tc:
        await unreplicated_cluster(tc, ids)
        full = (await replicas(tc)).to_json()
        assert full["counts"]["no_replica"] == 105
        assert full["samples"] == {
            "no_replica": ids[:100],
            "below_ack_quorum": [],
            "below_write_quorum": [],
            "bookie_unavailable_registered": [],
            "underreplicated_past_grace_period": [],
            "metadata_invalid": [],
        }
        assert [v["ledger_id"] for v in full["violations"]] == ids
        assert (full["violations_total"], full["violations_truncated"]) == (105, False)

        report = await replicas(tc, "checks.max_violations_listed=10")
        cut = report.to_json()
        assert [v["ledger_id"] for v in cut["violations"]] == ids[:10]
        assert cut["violations"] == full["violations"][:10]
        assert (cut["violations_total"], cut["violations_truncated"]) == (105, True)
        assert cut["counts"] == full["counts"]
        assert cut["samples"] == full["samples"]
        assert report.ledgers_checked == 105
        assert len(report.violations) == 10 and report.has_violations
        # What a daemon serves (the document) rebuilds into the same report.
        again = report_from_json(cut)
        assert again.to_json() == cut
        assert again.counts() == report.counts()
        assert again.violations.total == 105
        text = io.StringIO()
        render_text(report, text)
        rows = [line.split()[0] for line in text.getvalue().splitlines() if line[:14].strip()]
        assert [int(r) for r in rows if r.isdigit()] == ids[:10]
        assert "  ... the first 10 of 105 violations (checks.max_violations_listed)\n" in (
            text.getvalue()
        )


async def test_limit_zero_lists_everything(store: MetadataStore) -> None:
    ids = list(range(1, 13))
    async with test_cluster(store, 3) as tc:
        await unreplicated_cluster(tc, ids)
        report = await replicas(tc, "checks.max_violations_listed=0")
        doc = report.to_json()
        assert [v["ledger_id"] for v in doc["violations"]] == ids
        assert (doc["violations_total"], doc["violations_truncated"]) == (12, False)
        assert {v.category for v in report.violations} == {Category.NO_REPLICA}
