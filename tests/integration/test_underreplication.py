"""The under-replication manager against a real ZooKeeper and a real etcd, byte for byte."""

from __future__ import annotations

import asyncio

import pytest

from auditor.etcd import EtcdStore
from auditor.metadata.paths import LONG_MAX, InvalidLedgerIdError
from auditor.metadata.records import CheckKind
from auditor.metadata.underreplication import (
    CorruptMark,
    MarkOutcome,
    UnderreplicatedLedger,
    UnderreplicationFormatError,
    UnderreplicationManager,
    ur_ledger_path,
    ur_lock_path,
)
from auditor.store import FencedOutError, MetadataStore, NodeChangedError
from auditor.zk import ZkClient

ROOT = "/ledgers"
BASE = "/ledgers/underreplication"


def other_session(request: pytest.FixtureRequest, store: MetadataStore) -> MetadataStore:
    """Another session (another process's) on the store `store` talks to, rooted where it is:
    the test's ZooKeeper chroot, or its etcd key prefix."""
    if isinstance(store, EtcdStore):
        return EtcdStore([request.getfixturevalue("etcd_server").endpoint], prefix=store.prefix)
    return ZkClient(request.getfixturevalue("zk_hosts"))


def test_mark_path_layout() -> None:
    assert ur_ledger_path(BASE, 1234567) == f"{BASE}/ledgers/0000/0000/0012/d687/urL0001234567"
    assert ur_ledger_path(BASE, 2**63 - 1) == (
        f"{BASE}/ledgers/7fff/ffff/ffff/ffff/urL9223372036854775807"
    )
    assert ur_ledger_path(BASE, 0xDEADBEEF).endswith("/0000/0000/dead/beef/urL3735928559")
    assert ur_lock_path(BASE, 42) == f"{BASE}/locks/urL0000000042"
    for bad in (-1, 2**63):
        with pytest.raises(InvalidLedgerIdError):
            ur_ledger_path(BASE, bad)
        with pytest.raises(InvalidLedgerIdError):
            ur_lock_path(BASE, bad)


async def test_layout_is_created_then_checked(store: MetadataStore) -> None:
    urm = UnderreplicationManager(store, ROOT)
    await urm.check_layout()
    data, _ = await store.get(f"{BASE}/LAYOUT")
    assert data == b'type: "BASIC"\nversion: 1\n'
    await urm.check_layout()  # idempotent
    await store.set(f"{BASE}/LAYOUT", b'type: "FANCY"\nversion: 2\n')
    with pytest.raises(UnderreplicationFormatError, match="FANCY"):
        await urm.check_layout()


async def test_mark_create_merge_unchanged_exact_bytes(store: MetadataStore) -> None:
    urm = UnderreplicationManager(store, ROOT)
    await urm.check_layout()
    path = ur_ledger_path(BASE, 5)
    assert await urm.mark_underreplicated(5, ["10.0.0.1:3181"], now_ms=1700000000000) is (
        MarkOutcome.CREATED
    )
    data, stat = await store.get(path)
    assert data == b'replica: "10.0.0.1:3181"\nctime: 1700000000000\n'
    # Same replica again: nothing written, ctime kept.
    assert await urm.mark_underreplicated(5, ["10.0.0.1:3181"], now_ms=1800000000000) is (
        MarkOutcome.UNCHANGED
    )
    data2, stat2 = await store.get(path)
    assert (data2, stat2.version) == (data, stat.version)
    # A new replica merges and refreshes ctime.
    assert await urm.mark_underreplicated(5, ["10.0.0.2:3181"], now_ms=1800000000000) is (
        MarkOutcome.MERGED
    )
    data3, _ = await store.get(path)
    assert data3 == (b'replica: "10.0.0.1:3181"\nreplica: "10.0.0.2:3181"\nctime: 1800000000000\n')


async def test_a_guarded_mark_is_written_only_while_the_ledger_is_at_the_version_judged(
    store: MetadataStore,
) -> None:
    urm = UnderreplicationManager(store, ROOT)
    await urm.check_layout()
    ledger, mark = f"{ROOT}/00/0000/L0005", ur_ledger_path(BASE, 5)
    await store.create(ledger, b"v0", makepath=True)
    await store.set(ledger, b"v1", version=0)  # a worker committed meanwhile: version 1
    with pytest.raises(NodeChangedError) as refused:
        await urm.mark_underreplicated(5, ["10.0.0.1:3181"], judged=(ledger, 0))
    assert refused.value.path == ledger
    assert await store.exists(mark) is None
    assert await urm.mark_underreplicated(5, ["10.0.0.1:3181"], judged=(ledger, 1)) is (
        MarkOutcome.CREATED
    )
    # A merge is guarded too: nothing written on a stale judgement.
    await store.set(ledger, b"v2", version=1)
    with pytest.raises(NodeChangedError):
        await urm.mark_underreplicated(5, ["10.0.0.2:3181"], judged=(ledger, 1))
    assert (await store.get(mark))[0].startswith(b'replica: "10.0.0.1:3181"\nctime: ')
    # Deleted is changed; a fence that fails is reported before the guard.
    await store.create("/vote", b"me")
    fenced = UnderreplicationManager(store.fenced("/vote", 0), ROOT)
    await store.delete(ledger)
    with pytest.raises(NodeChangedError):
        await fenced.mark_underreplicated(6, ["10.0.0.1:3181"], judged=(ledger, 2))
    await store.set("/vote", b"someone else")
    with pytest.raises(FencedOutError, match="leadership lost"):
        await fenced.mark_underreplicated(6, ["10.0.0.1:3181"], judged=(ledger, 2))
    assert await store.exists(ur_ledger_path(BASE, 6)) is None


async def test_similar_replica_names_are_all_kept(store: MetadataStore) -> None:
    """Upstream S62/S63: matching is by exact string, not substring."""
    urm = UnderreplicationManager(store, ROOT)
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


async def test_without_store_ctime_no_ctime_is_written(store: MetadataStore) -> None:
    urm = UnderreplicationManager(store, ROOT, store_ctime=False)
    await urm.mark_underreplicated(9, ["b1:3181"])
    data, _ = await store.get(ur_ledger_path(BASE, 9))
    assert data == b'replica: "b1:3181"\n'
    ur = await urm.get(9)
    assert ur is not None and ur.ctime == -1


async def test_two_clients_marking_concurrently_keep_both_replicas(
    store: MetadataStore, request: pytest.FixtureRequest
) -> None:
    """Upstream S60 and the merge CAS: two sessions, one ledger, different replicas."""
    async with other_session(request, store) as zk2:
        m1 = UnderreplicationManager(store, ROOT)
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


async def test_list_underreplicated_walks_the_hex_tree(store: MetadataStore) -> None:
    urm = UnderreplicationManager(store, ROOT)
    ids = [0xDEADBEEF, 0xDEADBEEE, 0xBEEFCAFE, 0xCAFED00D, 2**63 - 1, 1, 2147483647]
    for i in ids:
        await urm.mark_underreplicated(i, [f"bk{i % 3}:3181"], now_ms=1000 + i % 7)
    got = {u.ledger_id: (u.replicas, u.ctime) async for u in urm.list_underreplicated()}
    assert got == {i: ((f"bk{i % 3}:3181",), 1000 + i % 7) for i in ids}
    assert await urm.count_underreplicated() == len(ids)
    assert sorted(await store.get_children(f"{BASE}/ledgers/0000/0000")) == [
        "0000",
        "7fff",
        "beef",
        "cafe",
        "dead",
    ]


async def test_corrupt_mark_is_a_typed_error_and_nothing_is_written(store: MetadataStore) -> None:
    urm = UnderreplicationManager(store, ROOT)
    path = ur_ledger_path(BASE, 42)
    await store.create(path, b"this is not { a mark", makepath=True)
    with pytest.raises(UnderreplicationFormatError, match="ledger 42"):
        await urm.mark_underreplicated(42, ["x:3181"])
    data, stat = await store.get(path)
    assert (data, stat.version) == (b"this is not { a mark", 0)


async def test_one_corrupt_mark_hides_no_other(store: MetadataStore) -> None:
    urm = UnderreplicationManager(store, ROOT)
    await urm.check_layout()
    for i in (1, 5, 2**40):
        await urm.mark_underreplicated(i, ["bk:3181"], now_ms=1000)
    leaves = f"{BASE}/ledgers/0000/0000/0000"
    bad = {
        # Data that does not decode: garbage, truncated, huge.
        ur_ledger_path(BASE, 2): b"this is not { a mark",
        ur_ledger_path(BASE, 3): b'replica: "bk:31',
        ur_ledger_path(BASE, 4): b"\xff" * 1_000_000,
        # Names that are not urL%010d of a valid id, or not where BookKeeper keeps them.
        f"{BASE}/ledgers/7fff/ffff/ffff/ffff/urL9223372036854775808": b"",
        f"{leaves}/0006/urL6": b"",
        f"{leaves}/0007/urLseven": b"",
        f"{BASE}/ledgers/urL0000000008": b"",
        f"{leaves}/0009/stray": b"",
        # Names of thousands of digits: never converted whole.
        f"{leaves}/000a/urL{'9' * 5000}": b"",
        f"{leaves}/000a/urL{'0' * 5000}1": b"",
    }
    for path, data in bad.items():
        await store.create(path, data, makepath=True)
    listing = await urm.read_marks()
    assert listing.marks == [
        UnderreplicatedLedger(1, ("bk:3181",), 1000, 0),
        UnderreplicatedLedger(5, ("bk:3181",), 1000, 0),
        UnderreplicatedLedger(2**40, ("bk:3181",), 1000, 0),
    ]
    mark_of_8 = ur_ledger_path(BASE, 8)
    assert listing.corrupt == [
        CorruptMark(
            f"{BASE}/ledgers/urL0000000008",
            8,
            f"not where BookKeeper keeps the mark of ledger 8 ({mark_of_8})",
        ),
        CorruptMark(
            ur_ledger_path(BASE, 2),
            2,
            "does not decode: 1:6: expected '{' or '<', found 'i'",
        ),
        CorruptMark(
            ur_ledger_path(BASE, 3), 3, "does not decode: 1:16: unterminated string literal"
        ),
        CorruptMark(
            ur_ledger_path(BASE, 4),
            4,
            "does not decode: 1:1: expected a field name, found byte 0xff",
        ),
        CorruptMark(
            f"{leaves}/0006/urL6",
            6,
            "mark name is not urL%010d: BookKeeper names ledger 6's mark urL0000000006",
        ),
        CorruptMark(
            f"{leaves}/0007/urLseven", None, "mark name 'urLseven' is not urL and a ledger id"
        ),
        CorruptMark(
            f"{leaves}/000a/urL{'0' * 5000}1",
            1,
            "mark name is not urL%010d: BookKeeper names ledger 1's mark urL0000000001",
        ),
        CorruptMark(
            f"{leaves}/000a/urL{'9' * 5000}",
            None,
            f"mark name spells ledger id {'9' * 20}... (5000 digits), outside 0..{LONG_MAX}",
        ),
        CorruptMark(
            f"{BASE}/ledgers/7fff/ffff/ffff/ffff/urL9223372036854775808",
            None,
            f"mark name spells ledger id {2**63}, outside 0..{LONG_MAX}",
        ),
        CorruptMark(
            f"{leaves}/0009/stray",
            None,
            "neither an under-replication mark nor a directory of marks",
        ),
    ]
    # A corrupt mark that names a ledger still marks it: the checks skip it.
    assert listing.marked_ids() == {1, 2, 3, 4, 5, 6, 8, 2**40}
    assert [u.ledger_id async for u in urm.list_underreplicated()] == [1, 5, 2**40]
    assert await urm.count_underreplicated() == 9
    assert len((await urm.read_marks()).corrupt) == 10
    assert isinstance(await urm.get_mark(2), CorruptMark)
    assert await urm.get_mark(1) == UnderreplicatedLedger(1, ("bk:3181",), 1000, 0)
    assert await urm.get_mark(77) is None
    assert str(listing.corrupt[0]) == (
        f"{BASE}/ledgers/urL0000000008: not where BookKeeper keeps the mark of ledger 8 "
        f"({mark_of_8})"
    )


async def test_disable_flag_and_recovery_delay(store: MetadataStore) -> None:
    urm = UnderreplicationManager(store, ROOT)
    await urm.check_layout()
    assert await urm.is_replication_enabled()
    await urm.disable_replication()
    data, _ = await store.get(f"{BASE}/disable")
    assert data == b""
    assert not await urm.is_replication_enabled()
    await urm.enable_replication()
    assert await urm.is_replication_enabled()

    await urm.init_lost_bookie_recovery_delay(30)
    await urm.init_lost_bookie_recovery_delay(99)  # existing value wins
    assert (await store.get(f"{BASE}/lostBookieRecoveryDelay"))[0] == b"30"
    await urm.set_lost_bookie_recovery_delay(5)
    assert await urm.get_lost_bookie_recovery_delay() == 5
    await store.set(f"{BASE}/lostBookieRecoveryDelay", b" +7\n")
    assert await urm.get_lost_bookie_recovery_delay() == 7
    path = f"{BASE}/lostBookieRecoveryDelay"
    for data, why in [
        (b"abc", f"{path} is not an integer: 'abc'"),
        (b"\xff" * 1000, f"{path} is not an integer: '{chr(0xFFFD) * 40}'"),
        (b"1.5", f"{path} is not an integer: '1.5'"),
        (b"2147483648", f"{path} is 2147483648, outside 0..2147483647 seconds"),
        (b"-1", f"{path} is -1, outside 0..2147483647 seconds"),
    ]:
        await store.set(path, data)
        with pytest.raises(UnderreplicationFormatError) as caught:
            await urm.get_lost_bookie_recovery_delay()
        assert str(caught.value) == why


@pytest.mark.parametrize("which", list(CheckKind))
async def test_check_ctimes_are_binary_protobuf(
    store: MetadataStore, request: pytest.FixtureRequest, which: CheckKind
) -> None:
    """Upstream S68-S70, plus the exact bytes."""
    urm = UnderreplicationManager(store, ROOT)
    assert await urm.get_check_ctime(which) == -1
    await urm.set_check_ctime(which, 1700000000000)
    data, _ = await store.get(f"{BASE}/{which.znode}")
    assert data == bytes.fromhex("0880d095ffbc31")
    async with other_session(request, store) as other:
        assert await UnderreplicationManager(other, ROOT).get_check_ctime(which) == 1700000000000
    await urm.set_check_ctime(which, 5)
    assert await urm.get_check_ctime(which) == 5
