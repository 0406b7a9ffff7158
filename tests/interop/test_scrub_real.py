"""The deep scrub and its repair on real Apache BookKeeper: a bookie with
InterleavedLedgerStorage whose entry log has one entry's payload flipped on disk.

The rot is where it lasts: in the entry log, after a checkpoint past the entry (before
one, the bookie's journal replay at start would write the sound bytes back).

The real bookie is the judge of what a rotten copy looks like on the wire: it serves the
bytes its entry log holds (InterleavedLedgerStorage checks only the ledger and entry ids
stored before the body, never the digest), so the flipped copy comes back as a body whose
digest fails. Our scrub (`bk-auditor check scrub --mark`) reports `corrupt_copy` for
exactly that ledger, entry and bookie and marks it; our worker (`bk-auditor run`)
re-verifies the named bookie, replaces it with the spare bookie, and unmarks; the Java
client reads every entry back, from the new copy alone once the other members are stopped.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from auditor.testing.cli import bk, one_json
from tests.interop.conftest import MakeCluster
from tests.interop.realbk import NO_RACKS, RealBookie, RealCluster, payload
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
#: The entry whose copy rots on the first member.
ROTTEN = 6
#: Entry logs this small (the 1,024-byte header and an entry or two) roll every few adds,
#: and InterleavedLedgerStorage checkpoints at each roll, as it would every 1 GB in use.
#: The harness's `journalSyncData=false` is set back to upstream's true here: without the
#: journal's fsync its mark never moves past the journal's header (observed: `lastMark`
#: stayed at position 1,024 through every checkpoint), so a start would replay it all.
LOG_SIZE_LIMIT = 1200
FAST = ["--set", "checks.retry_delay=0.2", "--set", "readEntryTimeout=3"]


async def scrub(rc: RealCluster, *extra: str) -> dict[str, Any]:
    code, out, err = await bk(
        "check",
        "scrub",
        "--metadata-service-uri",
        rc.uri,
        "--json",
        *FAST,
        "--set",
        NO_RACKS,
        *extra,
        within=90,
    )
    doc = one_json(out)
    assert code in (0, 1), (code, err)
    return doc


def journal_record(bookie: RealBookie, ledger: int, entry: int) -> tuple[int, int]:
    """Where the entry's record ends in the bookie's journal: the journal's id (its file
    is that id in hex, `.txn`) and the offset just past the payload."""
    wanted = payload(ledger, entry)
    for path in sorted((bookie.dir / "journal").rglob("*.txn")):
        at = path.read_bytes().find(wanted)
        if at >= 0:
            return int(path.stem, 16), at + len(wanted)
    raise AssertionError(f"entry {ledger}/{entry} is in no journal of {bookie.bookie_id}")


def checkpointed(bookie: RealBookie, past: tuple[int, int]) -> bool:
    """Whether the bookie's last checkpoint is past `past`: its `lastMark` (in each ledger
    directory, 16 bytes: the journal's id and position, big-endian) names the point from
    which a start replays the journal; what lies before it is in the entry log for good."""
    for mark in bookie.ledger_dir.rglob("lastMark"):
        data = mark.read_bytes()
        if len(data) >= 16 and struct.unpack(">qq", data[:16]) >= past:
            return True
    return False


def flip_in_entry_log(bookie: RealBookie, ledger: int, entry: int) -> Path:
    """Flips one byte in the middle of the entry's payload in the bookie's entry log
    (`*.log` under its ledger directory), found by the bytes the Java client wrote."""
    wanted = payload(ledger, entry)
    hits: list[Path] = []
    for path in sorted(bookie.ledger_dir.rglob("*.log")):
        data = bytearray(path.read_bytes())
        at = data.find(wanted)
        if at < 0:
            continue
        assert data.find(wanted, at + 1) < 0, f"two copies of the payload in {path}"
        data[at + len(wanted) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        hits.append(path)
    assert len(hits) == 1, hits
    return hits[0]


async def _now(value: bool) -> bool:
    return value


async def test_a_flipped_entry_on_a_real_bookie_is_found_repaired_and_read_back(
    real_cluster: MakeCluster,
) -> None:
    rc = real_cluster(
        "interleaved",
        "interleaved",
        "interleaved",
        logSizeLimit=LOG_SIZE_LIMIT,
        journalSyncData="true",
    )
    created = rc.client.ok(
        "create", ensemble=3, write=3, ack=2, digest="CRC32", password=PASSWORD, entries=ENTRIES
    )
    lid = created["ledger"]
    before = java_segments(rc, lid)
    victim = rc.bookie(before[0][0])
    others = [rc.bookie(b) for b in before[0][1:]]
    spare = rc.add_bookie("interleaved")
    # A bookie replays its journal from its last checkpoint on every start and re-adds
    # what it finds there: an entry log flipped before a checkpoint passed the entry is put
    # right by the replay (observed: "Replaying journal ... from position 1024" and a clean
    # scrub). Rot on disk is rot in what was checkpointed, so the test waits for that.
    past = journal_record(victim, lid, ROTTEN)
    await poll(lambda: _now(checkpointed(victim, past)), "the victim's checkpoint past the entry")
    victim.stop()
    flip_in_entry_log(victim, lid, ROTTEN)
    victim.start()
    assert rc.listed(victim.bookie_id, lid, ENTRIES - 1) == list(range(ENTRIES))

    doc = await scrub(rc, "--mark")
    found = [
        (v["ledger_id"], v["category"], v["bookie"], v["detail"]["entries"])
        for v in doc["violations"]
    ]
    assert found == [(lid, "corrupt_copy", victim.bookie_id, [[ROTTEN, ROTTEN]])]
    [violation] = doc["violations"]
    # What the real bookie answered: the bytes on disk, the digest no longer theirs.
    assert violation["detail"]["reasons"] == {
        str(ROTTEN): f"CRC32 digest mismatch for ledger {lid} entry {ROTTEN}"
    }
    assert doc["marked_underreplicated"] == [lid]

    async with zk_of(rc) as (zk, urm):

        async def repaired() -> bool:
            if await urm.count_underreplicated() or await locks(zk, urm):
                return False
            return spare.bookie_id in java_segments(rc, lid)[0]

        with daemon(rc, NO_RACKS) as d:
            await poll(repaired, "the corrupt copy replaced and the mark gone", proc=d)
        lines = [json.loads(x) for x in d.log.read_text().splitlines() if x.startswith("{")]
    committed = [
        x for x in lines if x.get("event") == "fragments committed" and x.get("ledger") == lid
    ]
    assert [(x["replaced"], x["reasons"]) for x in committed] == [
        ({victim.bookie_id: spare.bookie_id}, {victim.bookie_id: "corrupt_copy"})
    ]
    after = java_segments(rc, lid)
    assert after == {0: [spare.bookie_id if b == victim.bookie_id else b for b in before[0]]}
    read = rc.client.ok("read", ledger=lid, digest="CRC32", password=PASSWORD)
    assert (read["entries"], read["lac"], read["mismatched"]) == (ENTRIES, ENTRIES - 1, [])
    check_lists(rc, {lid: Ledger("CRC32", ENTRIES - 1, 3, 3, after)})
    # Every copy, the new one included, verifies now.
    doc = await scrub(rc)
    assert (doc["violations"], doc["ledgers_checked"]) == ([], 1)
    # The new copy alone serves every entry through the Java client's digest check.
    for b in others:
        b.stop()
    read = rc.client.ok("read", ledger=lid, digest="CRC32", password=PASSWORD)
    assert (read["entries"], read["mismatched"]) == (ENTRIES, [])
