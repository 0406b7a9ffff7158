"""The packed index records: exact round trips and the per-ledger memory budget."""

from __future__ import annotations

import pytest

from auditor.index.packed import IndexCapacityError, Interner, Tables, pack, unpack
from auditor.index.store import MetadataIndex
from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_tree import UNEXPECTED_KEPT, IdRange, UnexpectedZnode, WalkStats
from auditor.metadata.model import LedgerMetadata, LedgerState
from auditor.metadata.serde import LedgerMetadataFormatError
from auditor.metadata.walk import LedgerRecord
from auditor.testing.cluster import make_metadata

A, B, C, D = "10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181", "bookie-4.example"


@pytest.mark.parametrize(
    "md",
    [
        make_metadata(
            7,
            [(0, [A, B, C]), (100, [A, D, C]), (250, [D, B, C])],
            write_quorum=2,
            ack_quorum=2,
            last_entry_id=400,
            length=12345,
            ctime=1_700_000_000_000,
            ctoken=99,
            password=b"secret",
        ),
        make_metadata(8, [A, B, C], state=LedgerState.OPEN),
        make_metadata(9, [A, B], format_version=2, state=LedgerState.IN_RECOVERY),
        make_metadata(2**63 - 1, [A], last_entry_id=0, length=1, format_version=1),
    ],
)
def test_records_round_trip_without_custom_metadata(md: LedgerMetadata) -> None:
    tables = Tables()
    assert unpack(md.ledger_id, pack(md, 5, tables), tables) == md


def test_what_the_index_hands_out() -> None:
    index = MetadataIndex("/ledgers", LedgerManager.HIERARCHICAL)
    md = make_metadata(3000000000, [A, B, C], write_quorum=2, custom_metadata=[("k", b"v")])
    index.put(LedgerRecord(md.ledger_id, "ignored", md, 4))
    err = LedgerMetadataFormatError(12, "not a LedgerMetadataFormat message")
    index.put(LedgerRecord(12, "ignored", None, 1, err))
    got = list(index.records())
    assert [r.ledger_id for r in got] == [12, 3000000000]
    assert got[0].path == "/ledgers/00/0000/L0012" and got[0].metadata is None
    assert got[0].error is not None and got[0].error.reason == err.reason
    assert got[0].znode_version == 1
    assert got[1].path == "/ledgers/000/0000/0030/0000/L0000"
    assert got[1].znode_version == 4
    # Custom metadata is not kept (no check reads it); everything else is.
    assert got[1].metadata is not None and got[1].metadata.custom_metadata == ()
    assert got[1].metadata.segments == md.segments
    assert [r.ledger_id for r in index.records(IdRange(13, 2**63))] == [3000000000]
    index.remove(12)
    assert 12 not in index and len(index) == 1


def test_bookie_ids_are_interned_and_numbered_within_bounds() -> None:
    table = Interner("bookie ids")
    assert [table.number(x) for x in (A, B, A, C, B)] == [0, 1, 0, 2, 1]
    for i in range(3, 0xFFFF):
        table.number(f"b{i}")
    with pytest.raises(IndexCapacityError, match="more than 65534 distinct bookie ids"):
        table.number("one too many")


def test_a_closed_three_bookie_ledger_costs_under_200_bytes() -> None:
    index = MetadataIndex("/ledgers", LedgerManager.HIERARCHICAL)
    bookies = [f"10.0.{i // 256}.{i % 256}:3181" for i in range(60)]
    template = make_metadata(1, bookies[:3], write_quorum=2, last_entry_id=999, length=99999)
    for lid in range(1, 100_001):
        ring = [bookies[(lid + k * 7) % 60] for k in range(3)]
        md = make_metadata(lid, ring, write_quorum=2, last_entry_id=999, length=99999)
        index.put(LedgerRecord(lid, "", md, 0))
    assert template.ensemble_size == 3
    per_ledger = index.bytes_per_ledger()
    assert 60 < per_ledger < 200, per_ledger


def test_unexpected_znodes_are_counted_all_and_kept_bounded() -> None:
    index = MetadataIndex("/ledgers", LedgerManager.HIERARCHICAL)
    stats = WalkStats()
    for n in range(UNEXPECTED_KEPT + 5):
        stats.note_unexpected(UnexpectedZnode(f"/ledgers/x{n}", "not a ledger znode", n % 2 == 0))
    index.loaded_unexpected(stats)
    assert len(index.unexpected) == UNEXPECTED_KEPT
    assert (index.unexpected_count, index.invalid_ledgers) == (UNEXPECTED_KEPT + 5, 53)
    index.add_unexpected(UnexpectedZnode("/ledgers/x0", "again", True))  # known: not counted twice
    index.remove_unexpected("/ledgers/x0")
    index.remove_unexpected("/ledgers/never-seen")
    assert (index.unexpected_count, index.invalid_ledgers) == (UNEXPECTED_KEPT + 4, 52)
    walked = WalkStats()
    index.note_unexpected(walked)
    assert [u.path for u in walked.unexpected] == [
        f"/ledgers/x{n}" for n in range(1, UNEXPECTED_KEPT)
    ]
    assert (walked.unexpected_count, walked.invalid_ledgers) == (UNEXPECTED_KEPT + 4, 52)
