"""Placement repair on real Apache BookKeeper: `bk-auditor run` with
`repairedPlacementPolicyNotAdheringBookieEnabled`, on a cluster whose ledger the real Java
client wrote on one rack, marks it (its placement check, as upstream's auditor marks) and
moves one copy to a bookie of another rack (its worker); the Java client then reads every
entry back, digest-checked, with only the moved copy left up.

This is upstream's own scenario (`TestReplicationWorker
#testRepairedNotAdheringPlacementPolicyLedgerFragmentsOnRack`): three bookies in /rack1, an
E3/W3/A2 ledger of ten entries, a fourth bookie in /rack2; the new bookie joins segment 0,
the mark goes, and with the three first bookies stopped every entry still reads.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.interop.conftest import MakeCluster
from tests.interop.test_worker_real import (
    PASSWORD,
    Ledger,
    check_lists,
    daemon,
    java_segments,
    locks,
    poll,
    zk_of,
)

ENTRIES = 10


async def test_a_real_ledger_on_one_rack_is_moved_to_adhere_and_java_reads_it(
    real_cluster: MakeCluster, tmp_path: Path
) -> None:
    rc = real_cluster("sorted", "interleaved", "sorted")
    first_three = list(rc.bookies)
    created = rc.client.ok(
        "create", ensemble=3, write=3, ack=2, digest="CRC32", password=PASSWORD, entries=ENTRIES
    )
    lid = created["ledger"]
    before = java_segments(rc, lid)
    assert sorted(before[0]) == sorted(b.bookie_id for b in first_three)
    spare = rc.add_bookie("interleaved")
    racks = tmp_path / "racks.json"
    racks.write_text(
        json.dumps({b.bookie_id: "/rack1" for b in first_three} | {spare.bookie_id: "/rack2"})
    )
    async with zk_of(rc) as (zk, urm):

        async def repaired() -> bool:
            if await urm.count_underreplicated() or await locks(zk, urm):
                return False
            return spare.bookie_id in java_segments(rc, lid)[0]

        with daemon(
            rc,
            f"checks.racks_file={racks}",
            "repairedPlacementPolicyNotAdheringBookieEnabled=true",
        ) as d:
            await poll(repaired, "the ledger moved to adhere and unmarked", proc=d)
        lines = [json.loads(x) for x in d.log.read_text().splitlines() if x.startswith("{")]
    # Our auditor marked it (empty replica list), our worker moved one copy.
    assert any(
        x.get("event") == "marked under-replicated"
        and x.get("check") == "placement"
        and x.get("ledger_id") == lid
        and x.get("missing_replicas") == []
        for x in lines
    )
    committed = [
        x for x in lines if x.get("event") == "fragments committed" and x.get("ledger") == lid
    ]
    assert len(committed) == 1
    after = java_segments(rc, lid)
    assert sorted(after) == [0]
    changed = [i for i, (x, y) in enumerate(zip(before[0], after[0], strict=True)) if x != y]
    assert len(changed) == 1 and after[0][changed[0]] == spare.bookie_id
    assert committed[0]["replaced"] == {before[0][changed[0]]: spare.bookie_id}
    read = rc.client.ok("read", ledger=lid, digest="CRC32", password=PASSWORD)
    assert (read["entries"], read["lac"], read["mismatched"]) == (ENTRIES, ENTRIES - 1, [])
    # Each member holds exactly what its position holds (W == E: every entry).
    check_lists(rc, {lid: Ledger("CRC32", ENTRIES - 1, 3, 3, after)})
    # The moved copy alone serves every entry, through the Java client's digest check.
    for bookie in first_three:
        bookie.stop()
    read = rc.client.ok("read", ledger=lid, digest="CRC32", password=PASSWORD)
    assert (read["entries"], read["mismatched"]) == (ENTRIES, [])
