"""The replication worker end to end, on a real ZooKeeper with emulated bookies in racks.

A bookie is lost; the daemons' auditor marks its ledgers; both daemons' workers take
them (each exactly once), copy the lost position's entries to a bookie of the same
rack, commit the ensemble change, verify and unmark. Afterwards: every entry the lost
bookie held is on its replacement byte for byte, no metadata names the lost bookie,
no mark or lock is left, and the replicas and placement checks are clean.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from auditor.checks.findings import Check
from auditor.checks.runner import driver
from auditor.daemon.config import DaemonConfig
from auditor.daemon.service import Daemon
from auditor.metadata.paths import ledger_path
from auditor.metadata.schedule import write_set
from auditor.metadata.serde import decode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.inprocess import fast_config, running, until
from auditor.zk import ZkClient

ROOT = "/ledgers"
#: Six bookies, two per rack: b0,b3 in /r1; b1,b4 in /r2; b2,b5 in /r3.
RACKS = ["/r1", "/r2", "/r3", "/r1", "/r2", "/r3"]
ENTRIES = 12


def worker_config(
    hosts: str, identity: str, racks: str, extra: tuple[str, ...] = ()
) -> DaemonConfig:
    return fast_config(
        hosts,
        identity,
        [
            f"checks.racks_file={racks}",
            "worker.enabled=true",
            "worker.lock_holder=worker-host",
            "lockReleaseOfFailedLedgerGracePeriod=3200",
            *extra,
        ],
    )


def racks_file(tmp_path: Path, tc: TestCluster) -> str:
    path = tmp_path / "racks.json"
    path.write_text(json.dumps(dict(zip(tc.ids, RACKS, strict=True))))
    return str(path)


async def write_ledgers(tc: TestCluster, count: int) -> dict[int, tuple[str, ...]]:
    """Closed E3/W2/A2 ledgers, each with b0 and one bookie of each other rack."""
    b = tc.ids
    ensembles = [(b[0], b[1], b[2]), (b[0], b[4], b[5]), (b[1], b[0], b[5]), (b[2], b[4], b[0])]
    out: dict[int, tuple[str, ...]] = {}
    sem = asyncio.Semaphore(64)

    async def one(lid: int) -> None:
        ens = ensembles[lid % len(ensembles)]
        async with sem:
            await tc.writer.write_ledger(
                lid, [(0, ens)], write_quorum=2, ack_quorum=2, num_entries=ENTRIES
            )
        out[lid] = ens

    await asyncio.gather(*(one(lid) for lid in range(count)))
    return out


async def wait_replicated(daemons: list[Daemon], count: int, within: float) -> None:
    """Until the workers of `daemons` re-replicated `count` ledgers between them."""
    changed = asyncio.Event()
    deadline = time.monotonic() + within
    while any(d.worker is None for d in daemons):
        assert time.monotonic() < deadline, "workers not started"
        await asyncio.sleep(0.05)
    relays = []
    for d in daemons:
        assert d.worker is not None
        w = d.worker

        async def relay(w: object = w) -> None:
            ev = w.released  # type: ignore[attr-defined]
            while True:
                await ev.wait()
                ev.clear()
                changed.set()

        relays.append(asyncio.ensure_future(relay()))
    try:
        await until(
            changed,
            lambda: sum(d.state.worker.ledgers_replicated for d in daemons) >= count,
            f"{count} ledgers re-replicated",
            within=max(deadline - time.monotonic(), 1),
        )
    finally:
        for r in relays:
            r.cancel()
        await asyncio.gather(*relays, return_exceptions=True)


@contextlib.asynccontextmanager
async def two_daemons(hosts: str, racks: str) -> AsyncIterator[list[Daemon]]:
    async with (
        running(worker_config(hosts, "w-a:3181", racks)) as a,
        running(worker_config(hosts, "w-b:3181", racks)) as b,
    ):
        yield [a, b]


@pytest.mark.slow
async def test_a_lost_bookie_is_re_replicated_once_each_by_two_daemons(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    count = 400
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        ledgers = await write_ledgers(tc, count)
        lost = tc.by_id(b[0])
        await lost.crash()  # unregistered, its data kept (to compare with)
        for emu in tc.bookies:
            emu.reset_stats()
        async with two_daemons(zk_hosts, racks) as daemons:
            await wait_replicated(daemons, count, within=240)
            per_daemon = [d.state.worker.ledgers_replicated for d in daemons]
        assert sum(per_daemon) == count

        target = tc.by_id(b[3])  # the spare bookie of b0's rack
        expected_adds = 0
        for lid, ens in ledgers.items():
            data, _ = await zk.get(ledger_path(tc.cluster.manager, ROOT, lid))
            md = decode_ledger_metadata(data, lid)
            [seg] = md.segments
            position = ens.index(b[0])
            want = tuple(b[3] if x == b[0] else x for x in ens)
            assert seg.bookies == want, lid
            for e in range(ENTRIES):
                if position in write_set(e, 3, 2):
                    expected_adds += 1
                    assert target.entry_body(lid, e) == lost.entry_body(lid, e), (lid, e)
        # Each entry copied exactly once, whichever daemon copied it; nothing else written.
        stats = target.stats()
        assert (stats["recovery_adds"], stats["recovery_adds_repeated"], stats["adds"]) == (
            expected_adds,
            0,
            0,
        )
        for other in (b[1], b[2], b[4], b[5]):
            assert tc.by_id(other).stats()["recovery_adds"] == 0
        urm = UnderreplicationManager(zk, ROOT)
        assert await urm.count_underreplicated() == 0
        assert await zk.get_children(f"{ROOT}/underreplication/locks") == []
        async with tc.context(overrides=[f"checks.racks_file={racks}"]) as ctx:
            replicas = await driver(Check.REPLICAS)(ctx)
            placement = await driver(Check.PLACEMENT)(ctx)
        assert set(replicas.counts().values()) == {0}, replicas.counts()
        assert set(placement.counts().values()) == {0}, placement.counts()
        assert replicas.ledgers_checked == count and placement.ledgers_checked == count


async def test_a_java_lock_makes_the_worker_skip_that_ledger(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        ledgers = await write_ledgers(tc, 4)
        await tc.by_id(b[0]).crash()
        urm = UnderreplicationManager(zk, ROOT)
        for lid in ledgers:
            await urm.mark_underreplicated(lid, [b[0]])
        async with ZkClient(zk_hosts) as java:
            # A Java worker holds ledger 2's lock: `bookieId: "<its host>"`, ephemeral.
            await java.create(
                f"{ROOT}/underreplication/locks/urL{2:010d}",
                b'bookieId: "java-host"\n',
                ephemeral=True,
                makepath=True,
            )
            async with running(worker_config(zk_hosts, "w-a:3181", racks)) as daemon:
                await wait_replicated([daemon], 3, within=60)
                assert await urm.get(2) is not None
                data, _ = await zk.get(ledger_path(tc.cluster.manager, ROOT, 2))
                assert b[0] in decode_ledger_metadata(data, 2).segments[0].bookies
                assert daemon.state.worker.ledgers_replicated == 3
        assert sorted([lid async for lid in _marked(urm)]) == [2]


async def _marked(urm: UnderreplicationManager) -> AsyncIterator[int]:
    async for m in urm.list_underreplicated():
        yield m.ledger_id
