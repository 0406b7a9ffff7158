"""The under-replication manager against a real ZooKeeper, byte for byte."""

from __future__ import annotations

import asyncio

import pytest

from auditor.metadata.records import CheckKind
from auditor.metadata.underreplication import (
    MarkOutcome,
    UnderreplicationFormatError,
    UnderreplicationManager,
    ur_ledger_path,
)
from auditor.zk import ZkClient

ROOT = "/ledgers"
BASE = "/ledgers/underreplication"


def test_mark_path_layout() -> None:
    assert ur_ledger_path(BASE, 1234567) == f"{BASE}/ledgers/0000/0000/0012/d687/urL0001234567"
    assert ur_ledger_path(BASE, 2**63 - 1) == (
        f"{BASE}/ledgers/7fff/ffff/ffff/ffff/urL9223372036854775807"
    )
    assert ur_ledger_path(BASE, 0xDEADBEEF).endswith("/0000/0000/dead/beef/urL3735928559")


async def test_layout_is_created_then_checked(zk: ZkClient) -> None:
    urm = UnderreplicationManager(zk, ROOT)
    await urm.check_layout()
    data, _ = await zk.get(f"{BASE}/LAYOUT")
    assert data == b'type: "BASIC"\nversion: 1\n'
    await urm.check_layout()  # idempotent
    await zk.set(f"{BASE}/LAYOUT", b'type: "FANCY"\nversion: 2\n')
    with pytest.raises(UnderreplicationFormatError, match="FANCY"):
        await urm.check_layout()


async def test_mark_create_merge_unchanged_exact_bytes(zk: ZkClient) -> None:
    urm = UnderreplicationManager(zk, ROOT)
    await urm.check_layout()
    path = ur_ledger_path(BASE, 5)
    assert await urm.mark_underreplicated(5, ["10.0.0.1:3181"], now_ms=1700000000000) is (
        MarkOutcome.CREATED
    )
    data, stat = await zk.get(path)
    assert data == b'replica: "10.0.0.1:3181"\nctime: 1700000000000\n'
    # Same replica again: nothing written, ctime kept.
    assert await urm.mark_underreplicated(5, ["10.0.0.1:3181"], now_ms=1800000000000) is (
        MarkOutcome.UNCHANGED
    )
    data2, stat2 = await zk.get(path)
    assert (data2, stat2.version) == (data, stat.version)
    # A new replica merges and refreshes ctime.
    assert await urm.mark_underreplicated(5, ["10.0.0.2:3181"], now_ms=1800000000000) is (
        MarkOutcome.MERGED
    )
    data3, _ = await zk.get(path)
    assert data3 == (b'replica: "10.0.0.1:3181"\nreplica: "10.0.0.2:3181"\nctime: 1800000000000\n')


async def test_similar_replica_names_are_all_kept(zk: ZkClient) -> None:
    """Upstream S62/S63: matching is by exact string, not substring."""
    urm = UnderreplicationManager(zk, ROOT)
    names = [
        "localhost:3181",
        "localhost:318",
        "localhost:31812",
        "1.cluster.com",
        "2.cluster.com",
        "11.cluster.com",
        "12.cluster.com",
    ]
    for n in names:
        await urm.mark_underreplicated(77, [n])
    ur = await urm.get(77)
    assert ur is not None
    assert ur.replicas == tuple(names)


async def test_without_store_ctime_no_ctime_is_written(zk: ZkClient) -> None:
    urm = UnderreplicationManager(zk, ROOT, store_ctime=False)
    await urm.mark_underreplicated(9, ["b1:3181"])
    data, _ = await zk.get(ur_ledger_path(BASE, 9))
    assert data == b'replica: "b1:3181"\n'
    ur = await urm.get(9)
    assert ur is not None and ur.ctime == -1


async def test_two_clients_marking_concurrently_keep_both_replicas(
    zk: ZkClient, zk_hosts: str
) -> None:
    """Upstream S60 and the merge CAS: two sessions, one ledger, different replicas."""
    async with ZkClient(zk_hosts) as zk2:
        m1 = UnderreplicationManager(zk, ROOT)
        m2 = UnderreplicationManager(zk2, ROOT)
        for ledger in range(20):
            a = [f"a{i}:3181" for i in range(5)]
            b = [f"b{i}:3181" for i in range(5)]
            await asyncio.gather(
                *(m1.mark_underreplicated(ledger, [r]) for r in a),
                *(m2.mark_underreplicated(ledger, [r]) for r in b),
            )
            ur = await m1.get(ledger)
            assert ur is not None
            assert sorted(ur.replicas) == sorted(a + b)
        # The same replica from both: recorded once.
        await asyncio.gather(
            m1.mark_underreplicated(1000, ["same:3181"]),
            m2.mark_underreplicated(1000, ["same:3181"]),
        )
        ur = await m2.get(1000)
        assert ur is not None and ur.replicas == ("same:3181",)


async def test_list_underreplicated_walks_the_hex_tree(zk: ZkClient) -> None:
    urm = UnderreplicationManager(zk, ROOT)
    ids = [0xDEADBEEF, 0xDEADBEEE, 0xBEEFCAFE, 0xCAFED00D, 2**63 - 1, 1, 2147483647]
    for i in ids:
        await urm.mark_underreplicated(i, [f"bk{i % 3}:3181"], now_ms=1000 + i % 7)
    got = {u.ledger_id: (u.replicas, u.ctime) async for u in urm.list_underreplicated()}
    assert got == {i: ((f"bk{i % 3}:3181",), 1000 + i % 7) for i in ids}
    assert await urm.count_underreplicated() == len(ids)
    assert sorted(await zk.get_children(f"{BASE}/ledgers/0000/0000")) == [
        "0000",
        "7fff",
        "beef",
        "cafe",
        "dead",
    ]


async def test_corrupt_mark_is_a_typed_error_and_nothing_is_written(zk: ZkClient) -> None:
    urm = UnderreplicationManager(zk, ROOT)
    path = ur_ledger_path(BASE, 42)
    await zk.create(path, b"this is not { a mark", makepath=True)
    with pytest.raises(UnderreplicationFormatError, match="ledger 42"):
        await urm.mark_underreplicated(42, ["x:3181"])
    data, stat = await zk.get(path)
    assert (data, stat.version) == (b"this is not { a mark", 0)


async def test_disable_flag_and_recovery_delay(zk: ZkClient) -> None:
    urm = UnderreplicationManager(zk, ROOT)
    await urm.check_layout()
    assert await urm.is_replication_enabled()
    await urm.disable_replication()
    data, _ = await zk.get(f"{BASE}/disable")
    assert data == b""
    assert not await urm.is_replication_enabled()
    await urm.enable_replication()
    assert await urm.is_replication_enabled()

    await urm.init_lost_bookie_recovery_delay(30)
    await urm.init_lost_bookie_recovery_delay(99)  # existing value wins
    assert (await zk.get(f"{BASE}/lostBookieRecoveryDelay"))[0] == b"30"
    await urm.set_lost_bookie_recovery_delay(5)
    assert await urm.get_lost_bookie_recovery_delay() == 5


@pytest.mark.parametrize("which", list(CheckKind))
async def test_check_ctimes_are_binary_protobuf(zk: ZkClient, which: CheckKind) -> None:
    """Upstream S68-S70, plus the exact bytes."""
    urm = UnderreplicationManager(zk, ROOT)
    assert await urm.get_check_ctime(which) == -1
    await urm.set_check_ctime(which, 1700000000000)
    data, _ = await zk.get(f"{BASE}/{which.znode}")
    assert data == bytes.fromhex("0880d095ffbc31")
    async with ZkClient(zk.hosts) as other:
        assert await UnderreplicationManager(other, ROOT).get_check_ctime(which) == 1700000000000
    await urm.set_check_ctime(which, 5)
    assert await urm.get_check_ctime(which) == 5
