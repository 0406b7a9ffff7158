"""The leader's continuous deep scrub on a real ZooKeeper and emulated bookies: a new leader
goes on from the record's cursor and reads nothing the last one verified in this cycle,
exactly (each bookie's request log); the bytes each bookie answers stay within its budget
over every span of the run; operators see the cycle in the metrics, `status` and the page.

Round robin with E=3, W=2: entry e of a ledger on bookies (e mod 3) and (e + 1 mod 3).
"""

from __future__ import annotations

import contextlib
import html
import io
from collections import Counter
from collections.abc import MutableMapping
from typing import Any

import pytest

from auditor.api.convert import status_json, status_response
from auditor.api.page import render_page
from auditor.checks.scrub_progress import decode
from auditor.checks.scrub_progress_store import progress_path
from auditor.cli.api_commands import render_status
from auditor.daemon import scrub_cycle
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.metadata.schedule import write_set
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.cli import bk, one_json
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.inprocess import fast_config, running, until
from auditor.testing.observe import events_of
from auditor.timefmt import from_iso
from auditor.zk import ZkClient

ROOT = "/ledgers"
#: Only the scrub reads entries: every periodic check off.
QUIET = [
    "auditorPeriodicBookieCheckInterval=0",
    "auditorPeriodicCheckInterval=0",
    "auditorPeriodicPlacementPolicyCheckInterval=0",
    "auditorReplicasCheckInterval=0",
    "scrub.continuous=true",
]
#: A body of the test writer: 32 bytes of header, a 4-byte CRC32C digest, 16 of payload.
BODY = 32 + 4 + 16
PAYLOAD = 16


def expected_reads(tc: TestCluster, ledgers: range, entries: int) -> list[Counter[tuple[int, int]]]:
    """Per bookie (in `tc.bookies` order): each (ledger, entry) of its write sets, once."""
    out: list[Counter[tuple[int, int]]] = [Counter() for _ in tc.bookies]
    for lid in ledgers:
        for e in range(entries):
            for i in write_set(e, 3, 2):
                out[i][lid, e] += 1
    return out


def reads_of(tc: TestCluster, ledgers: range) -> list[Counter[tuple[int, int]]]:
    return [
        Counter((lid, e) for _, lid, e in emu.entry_reads if lid in ledgers) for emu in tc.bookies
    ]


async def scrub_finished(daemon: Daemon) -> None:
    await until(
        events_of(daemon).check_ended,
        lambda: daemon.state.scrub is not None and daemon.state.scrub.finished is not None,
        "the scrub's cycle to finish",
        120,
    )


async def test_a_new_leader_goes_on_from_the_cursor_and_reads_nothing_verified_again(
    zk: ZkClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three ledgers a chunk, twelve ledgers of four entries, read slowly (300 bytes/s a
    bookie); the leader is stopped once its record has moved past a chunk. The second
    daemon, elected then, reads from that cursor: exactly the entries of the ledgers at or
    above it, each once on each bookie of its write set, and none below; it finishes the
    cycle and rests until an interval after the cycle started."""
    monkeypatch.setattr(scrub_cycle, "CHUNK_LEDGERS", 3)
    async with test_cluster(zk, 3) as tc:
        ledgers = range(1, 13)
        for lid in ledgers:
            await tc.writer.write_ledger(lid, tc.ids, write_quorum=2, num_entries=4)
        extra = [*QUIET, "scrub.bytes_per_second=300"]
        async with contextlib.AsyncExitStack() as keep:
            async with running(fast_config(zk.hosts, "a:1", extra)) as first:
                await until(events_of(first).decided, lambda: first.state.is_leader, "a leads")
                second = await keep.enter_async_context(
                    running(fast_config(zk.hosts, "b:1", extra))
                )
                await until(
                    events_of(first).check_ended,
                    lambda: first.state.scrub is not None and first.state.scrub.cursor > 1,
                    "the first leader's record past its first chunk",
                    60,
                )
                assert not second.state.is_leader
            data, _ = await zk.get(progress_path(ROOT))
            stopped = decode(data)
            assert stopped.cycle == 1 and stopped.finished is None
            # Stopped mid-cycle, after a whole chunk: the cursor is just past a chunk.
            assert stopped.cursor in (4, 7, 10), stopped
            for emu in tc.bookies:
                emu.reset_stats()
            await scrub_finished(second)
            assert second.state.is_leader
            rest = list(range(stopped.cursor, 13))
            assert reads_of(tc, ledgers) == expected_reads(tc, range(stopped.cursor, 13), 4)
            data, _ = await zk.get(progress_path(ROOT))
            done = decode(data)
            assert done.cycle == 1 and done.started == stopped.started
            assert done.cursor == 13 and done.finished is not None
            assert done.ledgers == stopped.ledgers + len(rest)
            # Every entry's two copies of the ledgers read, 16 payload bytes each.
            assert done.bytes == stopped.bytes + len(rest) * 4 * 2 * PAYLOAD
            status = second.state.scrub
            assert status is not None
            assert status.share == 1.0 and status.finished == done.finished
            assert status.rest_until == done.started + 7 * 86400


async def test_each_bookie_answers_within_its_byte_budget_over_every_span(
    zk: ZkClient,
) -> None:
    """One leader scrubbing 4 ledgers of 40 entries held by all three bookies (W=3) at
    2000 bytes/s a bookie, 4 reads in flight at most.

    The bound (`checks/scrub_pace.py`): a read goes out only while the bookie's bucket is
    not in debt, and its bytes are taken when it is answered; so over any span the bytes
    sent are at most rate x span + one second's burst (the bucket's size) + the reads in
    flight (4 bodies, sent before their bytes were taken). The emulator stamps a request
    when it reads it, not when the client sent it: a span between two stamps may be
    shorter than between their sends by the difference of their delays through one event
    loop, allowed here as 0.25 s of budget (500 bytes, about 10 reads). The whole run
    also takes at least what the budget demands: nothing is read faster than the rate.
    """
    rate, in_flight, entries = 2000, 4, 40
    async with test_cluster(zk, 3) as tc:
        ledgers = range(1, 5)
        for lid in ledgers:
            await tc.writer.write_ledger(lid, tc.ids, write_quorum=3, num_entries=entries)
        extra = [
            *QUIET,
            f"scrub.bytes_per_second={rate}",
            f"checks.bookie_max_in_flight={in_flight}",
        ]
        async with running(fast_config(zk.hosts, "a:1", extra)) as daemon:
            await scrub_finished(daemon)
        total = len(ledgers) * entries * BODY
        for emu in tc.bookies:
            times = [t for t, lid, _ in emu.entry_reads if lid in ledgers]
            assert len(times) == len(ledgers) * entries
            allowance = rate + in_flight * BODY + rate * 0.25
            worst = max(
                (j - i + 1) * BODY - rate * (times[j] - times[i])
                for i in range(len(times))
                for j in range(i, len(times))
            )
            assert worst <= allowance, (worst, allowance)
            spent = times[-1] - times[0]
            assert spent >= (total - rate - in_flight * BODY) / rate - 0.25


async def test_operators_see_the_cycle_and_its_findings(zk: ZkClient) -> None:
    """A corrupt copy found by the continuous scrub: counted per category, its bytes and
    the cycle's share in the metrics; the cycle in `status` (JSON and text) and the page."""
    async with test_cluster(zk, 3) as tc:
        for lid in (1, 2, 3):
            await tc.writer.write_ledger(lid, tc.ids, write_quorum=2, num_entries=6)
        tc.bookies[0].corrupt_entry(2, 3)  # entry 3: bookies 0 and 1
        metrics = Metrics()
        async with running(fast_config(zk.hosts, "a:1", QUIET), metrics) as daemon:
            await scrub_finished(daemon)
            state = daemon.state
            s = state.scrub
            assert s is not None and s.finished is not None

            def sample(name: str, **labels: str) -> float | None:
                value: float | None = metrics.registry.get_sample_value(name, labels)
                return value

            violations = "bookkeeper_auditor_violations_total"
            assert sample(violations, check="scrub", category="corrupt_copy") == 1
            assert sample(violations, check="scrub", category="unreadable_copy") == 0
            assert sample(violations, check="scrub", category="divergent_copies") == 0
            # 3 ledgers x 6 entries x 2 copies, less the corrupt one, 16 bytes each.
            assert sample("bookkeeper_auditor_scrub_bytes_verified_total") == 35 * PAYLOAD
            assert sample("bookkeeper_auditor_scrub_cycle_verified_ratio") == 1.0
            assert sample("bookkeeper_auditor_scrub_cycle") == 1
            assert sample("bookkeeper_auditor_scrub_interval_seconds") == 7 * 86400
            assert sample("bookkeeper_auditor_scrub_cycle_started_timestamp_seconds") == s.started
            end = "bookkeeper_auditor_scrub_cycle_expected_end_timestamp_seconds"
            assert sample(end) == s.finished
            # The corrupt copy is marked for its bookie.
            marks = {
                ur.ledger_id: list(ur.replicas)
                async for ur in UnderreplicationManager(zk, ROOT).list_underreplicated()
            }
            assert marks == {2: [tc.ids[0]]}
            # Read with the document, nothing awaited between (the loop updates it).
            s = state.scrub
            assert s is not None and s.finished is not None
            doc = status_json(status_response(state))
            scrub = dict(doc["scrub"])
            # Times go through protobuf Timestamps: microseconds, as `status` prints them.
            times = {k: scrub.pop(k) for k in ("started", "expected_end", "finished", "updated")}
            next_cycle = scrub.pop("next_cycle")
            assert scrub == {
                "cycle": 1,
                "interval_s": 7 * 86400.0,
                "cursor": 4,
                "bytes_verified": 35 * PAYLOAD,
                "ledgers": 3,
                "previous_cycle_bytes": 0,
                "share": 1.0,
                "rate": 8 * 1024 * 1024.0,
            }
            want = {"started": s.started, "expected_end": s.finished, "finished": s.finished}
            want["updated"] = s.updated
            assert times.keys() == want.keys()
            assert all(abs(from_iso(times[k]) - want[k]) <= 1e-6 for k in want), (times, want)
            assert abs(from_iso(next_cycle) - (s.started + 7 * 86400)) <= 1e-6
            assert doc["checks"]["scrub"]["counts"] is not None
            out = io.StringIO()
            render_status(doc, out)
            line = (
                f"  scrub: cycle 1 done at {times['finished']} (3 ledgers, 560 bytes); "
                f"next cycle at {next_cycle}"
            )
            assert line in out.getvalue().splitlines()
            page = render_page(state)
            assert f"<h2>Deep scrub</h2><p>{html.escape(line[9:])}</p>" in page


async def test_explain_scrub_gives_each_bookies_copies_read_now(zk: ZkClient) -> None:
    """`explain LEDGER --scrub`: every copy read now by the scrub's reads and judged by its
    judge, accounted per bookie; a finding joins the categories (exit 1); nothing marked.
    E=3, W=2, 6 entries: each bookie holds 4."""
    async with test_cluster(zk, 3) as tc:
        b = tc.ids
        await tc.writer.write_ledger(1, b, write_quorum=2, num_entries=6)
        await tc.writer.write_ledger(2, b, write_quorum=2, num_entries=6)
        tc.bookies[0].corrupt_entry(1, 3)  # entry 3 is on bookies 0 and 1
        tc.bookies[1].make_unreadable(1, [4])  # entry 4 is on bookies 1 and 2
        args = ["--zk", zk.hosts, "--set", "checks.retry_delay=0.1"]
        code, out, err = await bk("explain", "1", "--scrub", "--json", *args)
        assert code == 1, err
        doc = one_json(out)
        # The other checks' verdicts stay (no racks here: placement; the ledger check's
        # read of entry 4 on bookie 1), the scrub's join them.
        assert doc["categories"] == [
            "corrupt_copy",
            "placement_not_adhering",
            "unreadable_copy",
            "unreadable_fragments",
        ]
        assert doc["scrub"] == {
            "entries": 6,
            "bytes_verified": 10 * PAYLOAD,
            "categories": ["corrupt_copy", "unreadable_copy"],
            "bookies": {
                b[0]: {
                    "verified": 3,
                    "absent": 0,
                    "silent": 0,
                    "silent_reason": None,
                    "corrupt_copy": {
                        "count": 1,
                        "entries": [[3, 3]],
                        "reasons": {"3": "CRC32C digest mismatch for ledger 1 entry 3"},
                    },
                },
                b[1]: {
                    "verified": 3,
                    "absent": 0,
                    "silent": 0,
                    "silent_reason": None,
                    "unreadable_copy": {"count": 1, "entries": [[4, 4]], "reasons": {"4": "EIO"}},
                },
                b[2]: {"verified": 4, "absent": 0, "silent": 0, "silent_reason": None},
            },
        }
        assert await UnderreplicationManager(zk, ROOT).count_underreplicated() == 0
        code, out, err = await bk("explain", "1", "--scrub", *args)
        assert code == 1, err
        lines = out.splitlines()
        i = lines.index(
            "  scrub (read now): 6 entries, 160 bytes verified; corrupt_copy, unreadable_copy"
        )
        per_bookie = {
            b[0]: "verified 3; corrupt_copy 1 [3]",
            b[1]: "verified 3; unreadable_copy 1 [4]",
            b[2]: "verified 4",
        }
        # In bookie id order.
        assert lines[i + 1 : i + 4] == [f"    {x:<24} {per_bookie[x]}" for x in sorted(per_bookie)]
        # A sound ledger: no scrub category; without --scrub, no `scrub` key at all.
        code, out, err = await bk("explain", "2", "--scrub", "--json", *args)
        doc = one_json(out)
        assert doc["scrub"]["categories"] == []
        assert doc["categories"] == ["placement_not_adhering"]
        code, out, err = await bk("explain", "2", "--json", *args)
        assert "scrub" not in one_json(out)
        code, out, err = await bk("explain", "2", "--scrub", "--target", "127.0.0.1:1")
        assert code == 2 and "--scrub reads the bookies from here" in err


async def test_an_unusable_record_is_named_and_a_new_cycle_writes_over_it(
    zk: ZkClient, info_logs: list[MutableMapping[str, Any]]
) -> None:
    """What another writer might leave in the record: the leader warns once naming it, starts
    cycle 1 from ledger 0, and the record it writes is good again (and no longer named)."""
    async with test_cluster(zk, 3) as tc:
        for lid in (1, 2):
            await tc.writer.write_ledger(lid, tc.ids, write_quorum=2, num_entries=3)
        await zk.create(progress_path(ROOT), b"\xffnot ours", makepath=True)
        async with running(fast_config(zk.hosts, "a:1", QUIET)) as daemon:
            await scrub_finished(daemon)
            assert daemon.state.invalid_znodes == {}
        data, _ = await zk.get(progress_path(ROOT))
        record = decode(data)
        assert (record.cycle, record.cursor, record.ledgers) == (1, 3, 2)
        warned = [
            e for e in info_logs if e["event"].startswith("scrub progress record is unusable")
        ]
        assert [(e["value"], e["path"]) for e in warned] == [
            ("b'\\xffnot ours'", progress_path(ROOT))
        ]
        assert warned[0]["error"].startswith("not JSON")
