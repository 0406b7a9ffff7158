"""The take order by risk, end to end, on a real ZooKeeper with emulated bookies in racks.

Eight bookies, b0 and b1 lost (crashed: unregistered, data kept). 200 closed ledgers
(E=W=3, A=2) of four kinds, marked as the auditor marks them, each mark with a ctime of
its own in an order unrelated to its kind:

========================  ==============  =============  ==========================
kind (copies, racks left) ensemble        mark names     after the repair
========================  ==============  =============  ==========================
(1, 1)                    b0, b1, b2      b0, b1         two positions copied
(2, 1)                    b0, b2, b4      b0             b2, b4: both in /r1
(2, 2)                    b0, b3, b6      b0             b3 in /r2, b6 in /r3
(3, 3)                    b2, b3, b6      nothing        found whole, unmarked
========================  ==============  =============  ==========================

Two daemons' workers (one ledger at a time each) drain them. A test-side watch on the
whole tree records, in ZooKeeper's own order, every lock created, every commit (a change
of a ledger's metadata) and every mark removed. What is guaranteed, and asserted:

* **Lock order.** A worker locks a ledger only after every ledger before it in the order
  is locked (by it or the other worker) or gone: in ZooKeeper's order, the ledgers are
  first locked exactly in the order of (copies left, racks left, mark ctime). Exactly,
  since both workers rank alike and no repair fails (asserted: no failure counted). A
  take that fails once its lock is made (a ZooKeeper timeout on a loaded machine) leaves
  that lock to be deleted at the next take, and the ledger is locked again later: such
  a ledger is held to the order by its first lock only.
* **Per worker**, commits come in take order: every one-copy-left ledger a worker
  commits, it commits before any two-copies-left one.
* **Overall**, a two-copies-left ledger is committed before a one-copy-left one only if
  that one was already in flight (locked) when the two-copies-left one was taken: at
  every two-copies-left commit, every one-copy-left ledger was committed or locked, and
  at most one was not yet committed (the other worker's one ledger in hand).
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import time
from collections import defaultdict
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from auditor.api.convert import status_json, status_response
from auditor.api.page import render_page
from auditor.cli.api_commands import render_status
from auditor.daemon.config import DaemonConfig
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.metadata.paths import ledger_path
from auditor.metadata.serde import decode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager, ur_ledger_path
from auditor.store import Event, EventType, Gap
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.inprocess import fast_config, running, until
from auditor.worker.risk import QueueRisk
from auditor.zk import ZkClient

ROOT = "/ledgers"
BASE = f"{ROOT}/underreplication"
#: b0,b2,b4 in /r1; b1,b3,b5 in /r2; b6,b7 in /r3. b0 and b1 are lost.
RACKS = ["/r1", "/r2", "/r1", "/r2", "/r1", "/r2", "/r3", "/r3"]
ENTRIES = 2
CTIME = 1_700_000_000_000
#: (copies left, racks left) -> (ensemble, the mark's missing bookies: indexes; how many).
KINDS: dict[tuple[int, int], tuple[tuple[int, ...], tuple[int, ...], int]] = {
    (1, 1): ((0, 1, 2), (0, 1), 60),
    (2, 1): ((0, 2, 4), (0,), 40),
    (2, 2): ((0, 3, 6), (0,), 70),
    (3, 3): ((2, 3, 6), (), 30),
}


#: The leader's own work off: the marks stay exactly as written (no check merges into
#: them), and the two cores go to the workers being observed.
QUIET = (
    "auditorPeriodicBookieCheckInterval=0",
    "auditorPeriodicCheckInterval=0",
    "auditorPeriodicPlacementPolicyCheckInterval=0",
    "auditorReplicasCheckInterval=0",
    "selftest.enabled=false",
    "risk.interval=0",
    "daemon.standby_index=false",
)


def worker_config(hosts: str, identity: str, racks: str) -> DaemonConfig:
    return fast_config(
        hosts,
        identity,
        [
            f"checks.racks_file={racks}",
            "worker.enabled=true",
            "worker.ledgers_in_parallel=1",
            f"worker.lock_holder={identity}",
            # Generous: under a loaded machine a timed-out read would fail an attempt,
            # release the ledger and take it again later, out of the order asserted.
            "readEntryTimeout=15",
            *QUIET,
        ],
    )


def racks_file(tmp_path: Path, tc: TestCluster) -> str:
    path = tmp_path / "racks.json"
    path.write_text(json.dumps(dict(zip(tc.ids, RACKS, strict=True))))
    return str(path)


Kinds = dict[tuple[int, int], tuple[tuple[int, ...], tuple[int, ...], int]]


async def seed(
    zk: ZkClient, tc: TestCluster, kinds: Kinds, seed: int
) -> dict[int, tuple[tuple[int, int], int]]:
    """Writes and marks the ledgers, b0 and b1 crashed; ledger id -> (kind, mark ctime ms).
    Ids and ctimes are shuffled apart from the kinds."""
    rng = random.Random(seed)
    kinds_list = [k for k, (_, _, n) in kinds.items() for _ in range(n)]
    rng.shuffle(kinds_list)
    ctimes = list(range(len(kinds_list)))
    rng.shuffle(ctimes)
    b = tc.ids
    ledgers = {lid: (kind, CTIME + 1000 * ctimes[lid]) for lid, kind in enumerate(kinds_list)}
    sem = asyncio.Semaphore(32)

    async def write(lid: int) -> None:
        ens = tuple(b[i] for i in kinds[ledgers[lid][0]][0])
        async with sem:
            await tc.writer.write_ledger(
                lid, [(0, ens)], write_quorum=3, ack_quorum=2, num_entries=ENTRIES
            )

    await asyncio.gather(*(write(lid) for lid in ledgers))
    for i in (0, 1):
        await tc.by_id(b[i]).crash()
    urm = UnderreplicationManager(zk, ROOT)
    await urm.check_layout()

    async def mark(lid: int) -> None:
        kind, ctime = ledgers[lid]
        async with sem:
            await urm.mark_underreplicated(lid, [b[i] for i in kinds[kind][1]], now_ms=ctime)

    await asyncio.gather(*(mark(lid) for lid in ledgers))
    return ledgers


async def settled(daemons: list[Daemon], count: int) -> None:
    """Until the workers of `daemons` counted `count` ledgers done between them (a mark's
    removal is seen before its worker counts it)."""
    changed = asyncio.Event()

    async def relay(ev: asyncio.Event) -> None:
        while True:
            await ev.wait()
            ev.clear()
            changed.set()

    relays = []
    for d in daemons:
        assert d.worker is not None
        relays.append(asyncio.ensure_future(relay(d.worker.released)))
    try:
        await until(
            changed,
            lambda: (
                sum(
                    d.state.worker.ledgers_replicated + d.state.worker.ledgers_found_healthy
                    for d in daemons
                )
                >= count
            ),
            f"{count} ledgers counted done",
            within=30,
        )
    finally:
        for r in relays:
            r.cancel()
        await asyncio.gather(*relays, return_exceptions=True)


def diverging(got: list[int], want: list[int], ledgers: dict[int, Any]) -> str:
    """Where two lock orders part, with each ledger's (kind, ctime) around it."""
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if at is None:
        return f"{len(got)} locks, {len(want)} expected"
    around = slice(max(at - 2, 0), at + 3)
    return (
        f"at {at}: locked {[(lid, ledgers.get(lid)) for lid in got[around]]}, "
        f"expected {[(lid, ledgers.get(lid)) for lid in want[around]]}"
    )


def take_order(ledgers: dict[int, tuple[tuple[int, int], int]]) -> list[int]:
    """The order the workers must lock them in: copies left, racks left, mark ctime."""
    return sorted(ledgers, key=lambda lid: (*ledgers[lid][0], ledgers[lid][1]))


async def test_two_workers_take_the_ledgers_closest_to_loss_first(
    zk: ZkClient, zk_hosts: str, tmp_path: Path, info_logs: list[MutableMapping[str, Any]]
) -> None:
    async with test_cluster(zk, 8) as tc:
        racks = racks_file(tmp_path, tc)
        ledgers = await seed(zk, tc, KINDS, seed=31)
        by_path = {ledger_path(tc.cluster.manager, ROOT, lid): lid for lid in ledgers}
        marks = {ur_ledger_path(BASE, lid): lid for lid in ledgers}
        lock_dir = f"{BASE}/locks/"
        # ZooKeeper's order of what matters: (what, ledger), one watch, one session.
        seen: list[tuple[str, int]] = []
        unmarked: set[int] = set()
        drained = asyncio.Event()
        events = await zk.watch_tree(ROOT)

        async def record() -> None:
            while True:
                item = await events.get()
                assert not isinstance(item, Gap), "the test's watch was lost"
                assert isinstance(item, Event)
                if item.type == EventType.CREATED and item.path.startswith(lock_dir):
                    seen.append(("lock", int(item.path.rsplit("urL", 1)[1])))
                elif item.type == EventType.CHANGED and item.path in by_path:
                    seen.append(("commit", by_path[item.path]))
                elif item.type != EventType.DELETED and item.path in marks:
                    seen.append(("mark", marks[item.path]))  # made again, or changed
                elif item.type == EventType.DELETED and item.path.startswith(lock_dir):
                    seen.append(("release", int(item.path.rsplit("urL", 1)[1])))
                elif item.type == EventType.DELETED and item.path in marks:
                    seen.append(("unmark", marks[item.path]))
                    unmarked.add(marks[item.path])
                    if len(unmarked) == len(ledgers):
                        drained.set()

        recorder = asyncio.ensure_future(record())
        try:
            async with (
                running(worker_config(zk_hosts, "w-a:3181", racks)) as a,
                running(worker_config(zk_hosts, "w-b:3181", racks)) as b,
            ):
                await asyncio.wait_for(drained.wait(), 120)
                daemons = [a, b]
                await settled(daemons, len(ledgers))
                failures = [dict(d.state.worker.failures) for d in daemons]
                done = [
                    (d.state.worker.ledgers_replicated, d.state.worker.ledgers_found_healthy)
                    for d in daemons
                ]
        finally:
            recorder.cancel()
            await asyncio.gather(recorder, return_exceptions=True)
            await zk.unwatch_tree(ROOT)

        assert failures == [{}, {}], failures  # nothing released early: the order is exact
        repaired = sum(n for kind, (_, _, n) in KINDS.items() if kind[0] < 3)
        assert sum(r for r, _ in done) == repaired
        assert sum(h for _, h in done) == KINDS[3, 3][2]
        assert all(r + h > 0 for r, h in done), done  # both workers took part

        # The lock order is the risk order, exactly: each ledger's first lock. A ledger may
        # be locked more than once: after a take that failed once its lock was made (a
        # ZooKeeper timeout or connection loss on a loaded machine; the next take deletes
        # that lock, as it deletes any such orphan), or by a worker that read the mark just
        # before the other worker unmarked it and let its lock go (it finds the mark gone
        # with its lock, and lets the lock go at once). Either way, one hold does the work
        # and unmarks; every other hold is released untouched, nothing committed in it.
        lock_at: dict[int, int] = {}
        for i, (what, lid) in enumerate(seen):
            if what == "lock":
                lock_at.setdefault(lid, i)
        locked = sorted(lock_at, key=lock_at.__getitem__)
        assert locked == take_order(ledgers), diverging(locked, take_order(ledgers), ledgers)
        relocked = {lid for lid, i in lock_at.items() if ("lock", lid) in seen[i + 1 :]}
        for lid in relocked:
            mine = [what for what, x in seen if x == lid]
            starts = [i for i, what in enumerate(mine) if what == "lock"]
            holds = [mine[i:j] for i, j in zip(starts, [*starts[1:], len(mine)], strict=True)]
            working = [h for h in holds if "unmark" in h]
            assert len(working) == 1, (lid, mine)
            assert all(h == ["lock", "release"] for h in holds if h is not working[0]), (lid, mine)
        commit_at = {lid: i for i, (what, lid) in enumerate(seen) if what == "commit"}
        copies = {lid: kind[0] for lid, (kind, _) in ledgers.items()}
        assert {lid for lid in commit_at} == {lid for lid, c in copies.items() if c < 3}

        # Per worker, commits in take order: its one-copy-left ledgers first (a ledger
        # locked again is free again meanwhile: held to the order by its first lock only).
        taker = {
            e["ledger"]: e["identity"]
            for e in info_logs
            if e["event"] == "ledger taken for re-replication"
        }
        assert set(taker) == set(ledgers)
        # Each take says where it stood: its ledger's copies left, and the fewest copies
        # left among the marks free beside it, never fewer (what the soak counts).
        takes = [e for e in info_logs if e["event"] == "ledger taken for re-replication"]
        assert all(e["copies_left"] == copies[e["ledger"]] for e in takes)
        out_of_order = [
            e
            for e in takes
            if e["fewest_copies_left_waiting"] is not None
            and e["fewest_copies_left_waiting"] < e["copies_left"]
        ]
        assert out_of_order == []
        assert sum(1 for e in takes if e["free_beside"] > 0) > len(ledgers) // 2
        per_worker: dict[str, list[int]] = defaultdict(list)
        for lid in sorted(commit_at, key=commit_at.__getitem__):
            if lid not in relocked:
                per_worker[taker[lid]].append(copies[lid])
        assert set(per_worker) == {"w-a:3181", "w-b:3181"}
        for who, order in per_worker.items():
            assert order == sorted(order), who

        # Overall: at each two-copies-left commit, every one-copy-left ledger was committed
        # or in flight, and at most one (the other worker's) was still in flight.
        ones = [lid for lid, c in copies.items() if c == 1 and lid not in relocked]
        for lid, at in commit_at.items():
            if copies[lid] != 2:
                continue
            assert all(lock_at[one] < at for one in ones), lid
            in_flight = [one for one in ones if commit_at[one] > at]
            assert len(in_flight) <= 1, (lid, in_flight)

        # Every copy made: no metadata names a lost bookie; no mark or lock is left.
        lost = {tc.ids[0], tc.ids[1]}
        for path, lid in by_path.items():
            data, _ = await zk.get(path)
            assert not lost & decode_ledger_metadata(data, lid).bookies(), lid
        assert await UnderreplicationManager(zk, ROOT).count_underreplicated() == 0
        assert await zk.get_children(f"{BASE}/locks") == []


#: The queue a worker that may not take (replication disabled) shows: a few of each kind,
#: and one mark whose ledger has no metadata.
SMALL: Kinds = {
    (1, 1): ((0, 1, 2), (0, 1), 2),
    (2, 1): ((0, 2, 4), (0,), 3),
    (2, 2): ((0, 3, 6), (0,), 1),
    (3, 3): ((2, 3, 6), (), 1),
}
NO_METADATA = 1000


def metric_samples(m: Metrics) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("copies_left", "")): s.value
        for f in text_string_to_metric_families(m.exposition().decode())
        for s in f.samples
        if s.name.startswith("bookkeeper_auditor_worker_")
    }


async def ranked(d: Daemon, done: Callable[[QueueRisk], bool], what: str) -> QueueRisk:
    """The worker's queue by risk once `done` holds for it (waiting on each publication)."""
    deadline = time.monotonic() + 30
    while d.worker is None:  # no event says the daemon started its worker: as test_worker
        assert time.monotonic() < deadline, "worker not started"
        await asyncio.sleep(0.02)

    def ok() -> bool:
        q = d.state.worker.queue
        return q is not None and done(q)

    await until(d.worker.ranked, ok, what, within=deadline - time.monotonic())
    q = d.state.worker.queue
    assert q is not None
    return q


async def test_the_queue_by_risk_in_metrics_status_and_the_page(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    async with test_cluster(zk, 8) as tc:
        racks = racks_file(tmp_path, tc)
        ledgers = await seed(zk, tc, SMALL, seed=7)
        urm = UnderreplicationManager(zk, ROOT)
        await urm.mark_underreplicated(NO_METADATA, [tc.ids[0]], now_ms=CTIME + 500)
        await urm.disable_replication()  # the worker ranks, and takes nothing
        order = take_order(ledgers)
        ones = [lid for lid in order if ledgers[lid][0][0] == 1]
        metrics = Metrics()
        async with ZkClient(zk_hosts) as java:
            # A Java worker holds the second one-copy-left ledger.
            await java.create(
                f"{BASE}/locks/urL{ones[1]:010d}",
                b'bookieId: "java-host"\n',
                ephemeral=True,
                makepath=True,
            )
            async with running(worker_config(zk_hosts, "w-a:3181", racks), metrics) as d:
                q = await ranked(d, lambda q: q.total == 8, "8 marks ranked")
                now = CTIME / 1000 + 3600
                d.state.tallies.clock = lambda: now
                assert dict(q.by_copies) == {"0": 0, "1": 2, "2": 4, "3+": 1, "unknown": 1}
                oldest = {
                    str(c): min(ctime for (cc, _), ctime in ledgers.values() if cc == c) / 1000
                    for c in (1, 2)
                }
                assert dict(q.oldest) == {
                    **oldest,
                    "3+": next(ct for (c, _), ct in ledgers.values() if c == 3) / 1000,
                    "unknown": (CTIME + 500) / 1000,
                }
                head = [(item.ledger_id, item.in_flight) for item in q.head]
                assert head == [(lid, lid == ones[1]) for lid in order] + [(NO_METADATA, False)]
                first = q.head[0].risk
                assert (first.copies_left, first.racks_left) == (1, 1)

                s = metric_samples(metrics)
                assert {
                    b: s["bookkeeper_auditor_worker_marked_ledgers", b]
                    for b in ("0", "1", "2", "3+", "unknown")
                } == {"0": 0, "1": 2, "2": 4, "3+": 1, "unknown": 1}
                age = "bookkeeper_auditor_worker_oldest_marked_ledger_age_seconds"
                assert s[age, "1"] == now - oldest["1"]
                assert s[age, "0"] == 0.0

                out = io.StringIO()
                render_status(status_json(status_response(d.state)), out)
                text = out.getvalue()
                assert "    marked ledgers by copies left: 0: 0, 1: 2 (oldest marked " in text
                assert (
                    f"    next in take order: {ones[0]} (1 copy, 1 rack), "
                    f"{ones[1]} (1 copy, 1 rack; in flight), " in text
                )
                page = render_page(d.state, now)
                assert "<h3>Marked ledgers by copies left</h3>" in page
                assert '<tr><td>1</td><td><span class="bad">2</span></td>' in page

                # The auditor finds b3 missing too on a ledger with b0 lost: down to one copy,
                # re-ranked from the watch while the worker takes nothing.
                [two_racks] = [lid for lid in order if ledgers[lid][0] == (2, 2)]
                await urm.mark_underreplicated(
                    two_racks, [tc.ids[0], tc.ids[3]], now_ms=CTIME + 900_000
                )
                q = await ranked(d, lambda q: q.by_copies["1"] == 3, "the re-mark ranked")
                assert dict(q.by_copies) == {"0": 0, "1": 3, "2": 3, "3+": 1, "unknown": 1}
                assert [item.ledger_id for item in q.head][:3] == [*ones, two_racks]
