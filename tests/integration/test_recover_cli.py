"""`bk-auditor recover` and `autorecovery-status`, run as a user runs them, on a real cluster.

A real ZooKeeper, emulated bookies in three racks, closed E3/W2/A2 ledgers; the command
in a child process, its exit status and its output compared exactly.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from auditor.metadata.model import LedgerState
from auditor.metadata.paths import ledger_path
from auditor.metadata.schedule import write_set
from auditor.metadata.serde import decode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.cli import bk
from auditor.testing.harness import TestCluster, test_cluster
from auditor.testing.zkdump import dump_tree
from auditor.zk import ZkClient

ROOT = "/ledgers"
#: b0,b3 in /r1; b1,b4 in /r2; b2,b5 in /r3.
RACKS = ["/r1", "/r2", "/r3", "/r1", "/r2", "/r3"]
ENTRIES = 12


def racks_file(tmp_path: Path, tc: TestCluster) -> str:
    path = tmp_path / "racks.json"
    path.write_text(json.dumps(dict(zip(tc.ids, RACKS, strict=True))))
    return str(path)


async def write_ledgers(tc: TestCluster) -> dict[int, tuple[str, ...]]:
    """Ledgers 0..4: four name b0 at each position, ledger 4 does not name it."""
    b = tc.ids
    ensembles = [
        (b[0], b[1], b[2]),
        (b[1], b[0], b[5]),
        (b[2], b[4], b[0]),
        (b[0], b[4], b[5]),
        (b[1], b[2], b[4]),
    ]
    for lid, ens in enumerate(ensembles):
        await tc.writer.write_ledger(
            lid, [(0, ens)], write_quorum=2, ack_quorum=2, num_entries=ENTRIES
        )
    return dict(enumerate(ensembles))


async def ensemble(zk: ZkClient, tc: TestCluster, lid: int) -> tuple[str, ...]:
    data, _ = await zk.get(ledger_path(tc.cluster.manager, ROOT, lid))
    [seg] = decode_ledger_metadata(data, lid).segments
    return seg.bookies


def cli(zk_hosts: str, racks: str, *args: str) -> list[str]:
    return [*args, "--zk", zk_hosts, "--set", f"checks.racks_file={racks}"]


def move_line(lid: int, ens: tuple[str, ...], old: str, new: str) -> str:
    return f"segment 0 [0-{ENTRIES - 1}] position {ens.index(old)} {old} -> {new}"


async def test_recover_moves_every_ledger_off_a_live_bookie(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        ledgers = await write_ledgers(tc)
        source, spare = tc.by_id(b[0]), tc.by_id(b[3])
        code, out, err = await bk(*cli(zk_hosts, racks, "recover", b[0]))
        assert code == 0, err
        # The spare of b0's rack takes each position: the only choice that keeps three racks.
        assert err.splitlines() == [
            f"[{i + 1}/4] ledger {lid}: moved: {move_line(lid, ledgers[lid], b[0], b[3])}"
            for i, lid in enumerate(range(4))
        ]
        assert (
            out == f"recover {b[0]}: 4 ledgers named it; 4 moved, 0 no longer named, 0 not moved\n"
        )
        for lid, ens in ledgers.items():
            want = tuple(b[3] if x == b[0] else x for x in ens)
            assert await ensemble(zk, tc, lid) == want, lid
            if b[0] not in ens:
                continue
            position = ens.index(b[0])
            for e in range(ENTRIES):
                held = position in write_set(e, 3, 2)
                assert spare.has_entry(lid, e) == held, (lid, e)
                if held:
                    assert spare.entry_body(lid, e) == source.entry_body(lid, e), (lid, e)
        assert source.stats()["recovery_adds"] == 0
        assert await zk.get_children(f"{ROOT}/underreplication/locks") == []
        assert await UnderreplicationManager(zk, ROOT).count_underreplicated() == 0


async def test_dry_run_prints_the_plan_and_writes_nothing(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        ledgers = await write_ledgers(tc)
        await tc.by_id(b[0]).crash()  # lost: the plan says so
        before = await dump_tree(zk)
        code, out, err = await bk(*cli(zk_hosts, racks, "recover", b[0], "--dry-run"))
        assert (code, err) == (0, "")
        lines = [
            f"ledger {lid}: planned: segment 0 [0-{ENTRIES - 1}] position "
            f"{ledgers[lid].index(b[0])} {b[0]} (lost) -> {b[3]}"
            for lid in range(4)
        ]
        assert out.splitlines() == [*lines, f"dry run: 4 ledgers name {b[0]}; nothing was written"]
        assert await dump_tree(zk) == before
        assert tc.by_id(b[3]).stats()["recovery_adds"] == 0

        code, out, err = await bk(*cli(zk_hosts, racks, "recover", b[0], "--dry-run", "--json"))
        assert (code, err) == (0, "")
        docs = [json.loads(line) for line in out.splitlines()]
        assert docs[0] == {
            "ledger_id": 0,
            "outcome": "planned",
            "fragments": [lines[0].split(": ", 2)[2]],
            "detail": None,
        }
        assert docs[-1] == {
            "summary": True,
            "bookies": [b[0]],
            "dry_run": True,
            "ledgers": 4,
            "per_bookie": {b[0]: 4},
            "moved": 0,
            "planned": 4,
            "no_longer_named": 0,
            "not_moved": [],
            "metadata_invalid": [],
        }
        assert await dump_tree(zk) == before


async def test_a_ledger_locked_by_a_java_worker_is_skipped_and_reported(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        ledgers = await write_ledgers(tc)
        await tc.by_id(b[0]).crash()
        lock = f"{ROOT}/underreplication/locks/urL{2:010d}"
        async with ZkClient(zk_hosts) as java:
            await java.create(lock, b'bookieId: "java-host"\n', ephemeral=True, makepath=True)
            code, out, err = await bk(*cli(zk_hosts, racks, "recover", b[0], "--json"))
            assert code == 1, err
            docs = [json.loads(line) for line in out.splitlines()]
            skipped = {
                "ledger_id": 2,
                "outcome": "locked",
                "fragments": [],
                "detail": "its replication lock is held by java-host",
            }
            assert [d["outcome"] for d in docs[:4]] == ["moved", "moved", "locked", "moved"]
            assert docs[2] == skipped
            assert docs[4]["not_moved"] == [skipped]
            assert (docs[4]["moved"], docs[4]["ledgers"]) == (3, 4)
            # The Java lock is untouched, and ours are gone.
            assert await zk.get_children(f"{ROOT}/underreplication/locks") == [f"urL{2:010d}"]
            assert (await zk.get(lock))[0] == b'bookieId: "java-host"\n'
            assert b[0] in await ensemble(zk, tc, 2)
            for lid in (0, 1, 3):
                assert b[0] not in await ensemble(zk, tc, lid)

            # autorecovery-status lists that lock, with its holder.
            code, out, err = await bk("autorecovery-status", "--zk", zk_hosts, "--json")
            assert (code, err) == (0, "")
            doc = json.loads(out)
            [entry] = doc["locks"]
            assert {k: entry[k] for k in ("ledger_id", "lock", "holder", "marked", "problem")} == {
                "ledger_id": 2,
                "lock": lock,
                "holder": "java-host",
                "marked": False,
                "problem": None,
            }
            assert (doc["count"], doc["replication_enabled"]) == (1, True)
            code, out, _ = await bk("autorecovery-status", "--zk", zk_hosts)
            assert code == 0
            assert out == (
                f"ledger 2: held by java-host since {entry['since']}; not marked\n"
                "1 ledger being re-replicated\n"
            )
        code, out, _ = await bk("autorecovery-status", "--zk", zk_hosts)
        assert (code, out) == (0, "no ledger is being re-replicated\n")
        # Again, now that the lock is gone: the last ledger moves; the others are off.
        code, out, err = await bk(*cli(zk_hosts, racks, "recover", b[0]))
        assert code == 0, err
        assert (
            out == f"recover {b[0]}: 1 ledger named it; 1 moved, 0 no longer named, 0 not moved\n"
        )
        assert ledgers[2] != await ensemble(zk, tc, 2)


async def test_bad_and_unknown_bookies_are_refused_with_one_line(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    async with test_cluster(zk, 6) as tc:
        racks = racks_file(tmp_path, tc)
        await write_ledgers(tc)
        before = await dump_tree(zk)
        runs = await asyncio.gather(
            bk(*cli(zk_hosts, racks, "recover", "nosuch:3181")),
            bk(*cli(zk_hosts, racks, "recover", "a/b:3181")),
            bk(*cli(zk_hosts, racks, "recover", f"{tc.ids[1]},")),
        )
        assert list(runs) == [
            (
                2,
                "",
                "bk-auditor: error: unknown bookie 'nosuch:3181': no ledger names it, it is "
                "not registered and it has no cookie (a typo?); nothing was written\n",
            ),
            (
                2,
                "",
                "bk-auditor: error: BOOKIE: 'a/b:3181' is not a bookie id (letters, digits "
                "and ':', '.', '_', '-' only)\n",
            ),
            (2, "", f"bk-auditor: error: BOOKIE: an empty bookie id in '{tc.ids[1]},'\n"),
        ]
        assert await dump_tree(zk) == before


async def test_marks_are_left_for_the_workers_to_judge(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    """`recover` locks as acquireUnderreplicatedLedger: no mark version, so a mark stays."""
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        await write_ledgers(tc)
        await tc.by_id(b[0]).crash()
        urm = UnderreplicationManager(zk, ROOT)
        for lid in (0, 1):
            await urm.mark_underreplicated(lid, [b[0]], now_ms=1)
        before = [await urm.get(lid) for lid in (0, 1)]
        code, out, err = await bk(*cli(zk_hosts, racks, "recover", b[0]))
        assert code == 0, err
        assert (
            out == f"recover {b[0]}: 4 ledgers named it; 4 moved, 0 no longer named, 0 not moved\n"
        )
        assert [await urm.get(lid) for lid in (0, 1)] == before
        for lid in range(4):
            assert b[0] not in await ensemble(zk, tc, lid)
        assert await zk.get_children(f"{ROOT}/underreplication/locks") == []


async def test_an_open_ledger_has_its_closed_segments_moved_and_is_reported(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    """The last segment of an open ledger is never copied (nor fenced) by `recover`."""
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        # Segment 0 (closed by the next one) and the open segment 1 both name b0.
        await tc.writer.write_ledger(
            7,
            [(0, (b[0], b[1], b[2])), (6, (b[2], b[0], b[4]))],
            write_quorum=2,
            ack_quorum=2,
            num_entries=ENTRIES,
            state=LedgerState.OPEN,
        )
        code, out, err = await bk(*cli(zk_hosts, racks, "recover", b[0]))
        assert code == 1, err
        tail = f"segment 1 [6-?] position 1 {b[0]} (requested)"
        assert err == (
            f"[1/1] ledger 7: open_ledger: segment 0 [0-5] position 0 {b[0]} -> {b[3]} "
            f"(open ledger: its last segment is under-replicated ({tail}))\n"
        )
        assert out == (
            f"recover {b[0]}: 1 ledger named it; 0 moved, 0 no longer named, 1 not moved\n"
            f"  not moved: ledger 7: open_ledger: segment 0 [0-5] position 0 {b[0]} -> {b[3]} "
            f"(open ledger: its last segment is under-replicated ({tail}))\n"
        )
        data, _ = await zk.get(ledger_path(tc.cluster.manager, ROOT, 7))
        md = decode_ledger_metadata(data, 7)
        assert [s.bookies for s in md.segments] == [(b[3], b[1], b[2]), (b[2], b[0], b[4])]
        assert md.state is LedgerState.OPEN
        assert not any(tc.by_id(x).is_fenced(7) for x in b)


async def test_autorecovery_status_names_what_is_wrong_with_a_lock(
    zk: ZkClient, zk_hosts: str
) -> None:
    async with test_cluster(zk, 3) as tc:
        locks = f"{ROOT}/underreplication/locks"
        await tc.writer.write_ledger(
            5, [(0, tuple(tc.ids))], write_quorum=2, ack_quorum=2, num_entries=3
        )
        await UnderreplicationManager(zk, ROOT).mark_underreplicated(5, [tc.ids[0]])
        await zk.create(f"{locks}/urL{5:010d}", b"\xff not text", makepath=True)
        await zk.create(f"{locks}/urL42", b'bookieId: "h"\n', ephemeral=True)
        await UnderreplicationManager(zk, ROOT).disable_replication()
        code, out, err = await bk("autorecovery-status", "--zk", zk_hosts)
        assert (code, err) == (0, "")
        lines = out.splitlines()
        assert lines[0] == "auto-recovery is DISABLED: workers take no new ledger"
        assert lines[1].startswith("ledger 5: held by (names no holder) since ")
        assert lines[1].endswith(
            f"; marked (missing: {tc.ids[0]}); lock data does not decode: 1:1: expected a "
            "field name, found byte 0xff; persistent: no session holds it, nothing will "
            "release it"
        )
        assert lines[2].startswith(f"{locks}/urL42: held by h since ")
        assert lines[2].endswith(
            "; not marked; not a BookKeeper lock name (urL and the 10-digit ledger id)"
        )
        assert lines[3:] == ["2 ledgers being re-replicated"]


async def test_a_live_bookie_with_the_only_copies_is_read_for_its_move(
    zk: ZkClient, zk_hosts: str, tmp_path: Path
) -> None:
    """Write quorum 1: the bookie being emptied is the only source of its entries."""
    async with test_cluster(zk, 6) as tc:
        b = tc.ids
        racks = racks_file(tmp_path, tc)
        await tc.writer.write_ledger(
            9, [(0, (b[0], b[1]))], write_quorum=1, ack_quorum=1, num_entries=ENTRIES
        )
        source = tc.by_id(b[0])
        code, out, err = await bk(*cli(zk_hosts, racks, "recover", b[0]))
        assert code == 0, err
        assert (
            out == f"recover {b[0]}: 1 ledger named it; 1 moved, 0 no longer named, 0 not moved\n"
        )
        [seg] = await decode_segments(zk, tc, 9)
        target = tc.by_id(seg[0])
        assert seg[1] == b[1] and seg[0] not in (b[0], b[1])
        for e in range(0, ENTRIES, 2):  # position 0 holds the even entries
            assert target.entry_body(9, e) == source.entry_body(9, e), e
        assert not any(target.has_entry(9, e) for e in range(1, ENTRIES, 2))


async def decode_segments(zk: ZkClient, tc: TestCluster, lid: int) -> list[tuple[str, ...]]:
    data, _ = await zk.get(ledger_path(tc.cluster.manager, ROOT, lid))
    return [s.bookies for s in decode_ledger_metadata(data, lid).segments]
