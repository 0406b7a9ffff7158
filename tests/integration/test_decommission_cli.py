"""`bk-auditor decommission`, run as a user runs it, on a real cluster with a real worker.

A real ZooKeeper, emulated bookies in three racks, closed E3/W2/A2 ledgers; the command
in a child process; for the wait, a daemon in this process whose worker moves the marked
ledgers.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from auditor.metadata.paths import ledger_path
from auditor.metadata.serde import decode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.cli import bk
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.inprocess import fast_config, running
from auditor.testing.zkdump import dump_tree
from auditor.zk import ZkClient
from tests.integration.test_recover_cli import racks_file, write_ledgers

ROOT = "/ledgers"


def cli(zk_hosts: str, racks: str, *args: str) -> list[str]:
    return ["decommission", *args, "--zk", zk_hosts, "--set", f"checks.racks_file={racks}"]


async def names(zk: ZkClient, tc: TestCluster, lid: int, bookie: str) -> bool:
    data, _ = await zk.get(ledger_path(tc.cluster.manager, ROOT, lid))
    return bookie in decode_ledger_metadata(data, lid).bookies()


async def marks(zk: ZkClient) -> dict[int, tuple[str, ...]]:
    urm = UnderreplicationManager(zk, ROOT)
    return {m.ledger_id: m.replicas async for m in urm.list_underreplicated()}


async def test_a_writable_bookie_is_refused_with_one_line(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        await write_ledgers(tc)
        before = await dump_tree(zk)
        code, out, err = await bk(*cli(zk_hosts, racks, b[0]))
        assert (code, out) == (1, "")
        assert err == (
            f"bk-auditor: error: {b[0]} is writable: make it read-only or stop it first "
            "(a writable bookie keeps taking new ledgers); nothing was written\n"
        )
        assert await dump_tree(zk) == before


async def test_a_stopped_bookie_no_wait_marks_exactly_its_ledgers(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        await write_ledgers(tc)  # 0..3 name b0, 4 does not
        await tc.cluster.add_cookie(b[0])
        await tc.by_id(b[0]).crash()
        code, out, err = await bk(*cli(zk_hosts, racks, b[0], "--no-wait"))
        assert code == 0, err
        assert err == (
            f"decommission {b[0]}: marked 4 ledgers under-replicated "
            "(4 new, 0 merged, 0 already marked)\n"
        )
        assert out == f"{b[0]}: not waiting (--no-wait); the cookie stays\n"
        assert await marks(zk) == {lid: (b[0],) for lid in range(4)}
        assert await zk.exists(f"{ROOT}/cookies/{b[0]}") is not None


async def test_ledgers_whose_metadata_does_not_decode_stop_it_unless_overridden(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    """A ledger whose metadata does not decode may name the bookie: the command refuses in
    one line, exit 1, nothing written (before, it noted them, went on, deleted the cookie
    and exited 0, as if the bookie were empty); `--ignore-undecodable` goes on, still
    naming them."""
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        await write_ledgers(tc)  # 0..3 name b0, 4 does not
        await zk.create(ledger_path(tc.cluster.manager, ROOT, 7), b"\xffgarbage", makepath=True)
        await tc.cluster.add_cookie(b[0])
        await tc.by_id(b[0]).crash()
        before = await dump_tree(zk)
        code, out, err = await bk(*cli(zk_hosts, racks, b[0], "--no-wait"))
        assert (code, out) == (1, "")
        assert err == (
            "bk-auditor: error: the metadata of 1 ledger does not decode (7); any of them may "
            f"name {b[0]}, so it cannot be shown empty; nothing was written. Repair or delete "
            "them, or pass --ignore-undecodable to decommission without them\n"
        )
        assert await dump_tree(zk) == before
        code, out, err = await bk(*cli(zk_hosts, racks, b[0], "--no-wait", "--ignore-undecodable"))
        assert code == 0, err
        assert f"1 ledgers' metadata does not decode; they may name {b[0]}" in err
        assert await marks(zk) == {lid: (b[0],) for lid in range(4)}


async def test_the_wait_ends_when_the_workers_moved_every_ledger_and_the_cookie_goes(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        await write_ledgers(tc)
        await tc.cluster.add_cookie(b[0])
        await tc.by_id(b[0]).crash()
        config = fast_config(
            zk_hosts,
            "w-a:3181",
            [f"checks.racks_file={racks}", "worker.enabled=true", "worker.lock_holder=w-a"],
        )
        command = asyncio.ensure_future(bk(*cli(zk_hosts, racks, b[0], "--json"), within=120))
        # The daemon starts once the command has marked and waits (else its own auditor
        # and worker may move everything before the command looks).
        deadline = time.monotonic() + 60
        while len(await marks(zk)) < 4:
            assert time.monotonic() < deadline and not command.done()
            await asyncio.sleep(0.05)
        async with running(config) as daemon:
            code, out, err = await command
            assert code == 0, err
            assert daemon.state.worker.ledgers_replicated == 4
        docs = [json.loads(line) for line in out.splitlines()]
        assert docs[0] == {
            "bookie": b[0],
            "event": "marked",
            "marked": 4,
            "created": docs[0]["created"],
            "merged": docs[0]["merged"],
            "unchanged": docs[0]["unchanged"],
        }
        waits = [d["remaining"] for d in docs if d.get("event") == "waiting"]
        assert waits[-1] == 0 and waits == sorted(waits, reverse=True)
        assert docs[-1] == {
            "summary": True,
            "bookie": b[0],
            "state": "not registered",
            "ledgers": 4,
            "metadata_invalid": [],
            "marked": 4,
            "waited": True,
            "cookie_deleted": True,
        }
        for lid in range(5):
            assert not await names(zk, tc, lid, b[0])
        assert await zk.exists(f"{ROOT}/cookies/{b[0]}") is None
        assert await marks(zk) == {}


async def test_the_wait_timeout_ends_with_exit_1_and_the_count_left(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        await write_ledgers(tc)
        await tc.cluster.add_cookie(b[0])
        await tc.by_id(b[0]).crash()
        # No worker runs: nothing moves.
        code, out, err = await bk(*cli(zk_hosts, racks, b[0], "--wait-timeout", "1"))
        assert (code, out) == (1, "")
        assert err.splitlines() == [
            f"decommission {b[0]}: marked 4 ledgers under-replicated "
            "(4 new, 0 merged, 0 already marked)",
            f"decommission {b[0]}: 4 ledgers still name it",
            f"bk-auditor: error: decommission of {b[0]} timed out after 1s: 4 ledgers still "
            "name it (0, 1, 2, 3); the marks and the cookie stay",
        ]
        assert await zk.exists(f"{ROOT}/cookies/{b[0]}") is not None
        assert await marks(zk) == {lid: (b[0],) for lid in range(4)}


async def test_a_read_only_bookie_is_emptied_by_the_command_itself(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        ledgers = await write_ledgers(tc)
        await tc.cluster.add_cookie(b[0])
        await tc.by_id(b[0]).set_readonly()
        code, out, err = await bk(*cli(zk_hosts, racks, b[0], "--no-wait"))
        assert (code, out) == (2, "")
        assert err.startswith(f"bk-auditor: error: --no-wait: {b[0]} is read-only")
        code, out, err = await bk(*cli(zk_hosts, racks, b[0]))
        assert code == 0, err
        moved = [
            f"decommission {b[0]}: [{lid + 1}/4] ledger {lid}: moved: segment 0 [0-11] "
            f"position {ledgers[lid].index(b[0])} {b[0]} -> {b[3]}"
            for lid in range(4)
        ]
        assert err.splitlines() == [*moved, f"decommission {b[0]}: 0 ledgers still name it"]
        assert out == (
            f"decommissioned {b[0]}: no ledger names it; cookie {ROOT}/cookies/{b[0]} deleted\n"
        )
        assert await zk.exists(f"{ROOT}/cookies/{b[0]}") is None
        assert await marks(zk) == {}
        for lid in range(5):
            assert not await names(zk, tc, lid, b[0])
