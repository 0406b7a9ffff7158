"""The bookie check's pure core: lost bookies per ledger, the compact index, the violations."""

from __future__ import annotations

from array import array

from auditor.checks.bookie_check import (
    BOOKIES_UNKNOWN,
    LedgerLoss,
    LostBookie,
    LostBookieIndex,
    invalid_metadata_violation,
    ledger_loss,
    loss_violations,
)
from auditor.checks.findings import Category, Violation
from auditor.metadata.model import LedgerState
from auditor.testing.cluster import make_metadata

B0, B1, B2, B3 = (f"10.0.0.{i}:3181" for i in range(4))
GHOST = "192.0.2.1:1000"  # never registered


def test_all_available_is_no_loss() -> None:
    md = make_metadata(1, [B0, B1, B2], write_quorum=2, last_entry_id=9)
    assert ledger_loss(md, {B0, B1, B2}) is None


def test_never_registered_member_is_lost_in_open_ledger() -> None:
    md = make_metadata(12345, [GHOST, B0, B1], state=LedgerState.OPEN)
    loss = ledger_loss(md, {B0, B1, B2}, znode_version=4)
    assert loss == LedgerLoss(12345, LedgerState.OPEN, 4, (LostBookie(GHOST, (0,)),))
    assert loss.bookies == (GHOST,)


def test_historical_ensembles_count_and_segments_are_the_evidence() -> None:
    # B2 only in the first segment, B1 in both, B3 only in the last.
    md = make_metadata(
        7, [(0, [B0, B1, B2]), (10, [B0, B1, B3]), (25, [B0, B1, B3])], last_entry_id=40
    )
    loss = ledger_loss(md, {B0})
    assert loss is not None
    assert loss.lost == (
        LostBookie(B1, (0, 10, 25)),
        LostBookie(B2, (0,)),
        LostBookie(B3, (10, 25)),
    )
    assert loss.bookies == (B1, B2, B3)  # sorted: the mark's replica order


def test_without_returned_bookies() -> None:
    md = make_metadata(7, [(0, [B0, B1, B2]), (10, [B0, B1, B3])], last_entry_id=20)
    loss = ledger_loss(md, {B0})
    assert loss is not None
    assert loss.without(set()) is loss
    kept = loss.without({B1, B3})
    assert kept is not None and kept.bookies == (B2,)
    assert loss.without({B1, B2, B3}) is None


def test_s53_index_counts_per_lost_bookie() -> None:
    a, b = "127.0.0.1:1000", "127.0.0.1:1001"
    # 1..10 on both, 11..20 on b only: a has 10 ledgers, b has 20.
    mds = [make_metadata(i, [a, b]) for i in range(1, 11)]
    mds += [make_metadata(i, [b, B0]) for i in range(11, 21)]

    only_b = LostBookieIndex({b, B0})
    losses = [only_b.add(md) for md in mds]
    assert only_b.lost_bookies == [a]
    assert only_b.ledger_counts() == {a: 10}
    assert list(only_b.ledgers(a)) == list(range(1, 11))
    assert sum(loss is not None for loss in losses) == 10

    only_a = LostBookieIndex({a, B0})
    for md in mds:
        only_a.add(md)
    assert only_a.ledger_counts() == {b: 20}
    assert only_a.ledgers(a) == array("q")


def test_index_holds_nothing_for_healthy_ledgers() -> None:
    index = LostBookieIndex({B0, B1, B2})
    for i in range(1000):
        assert index.add(make_metadata(i, [B0, B1, B2], write_quorum=2)) is None
    assert index.lost_bookies == [] and list(index) == []


def test_index_forget_and_iteration() -> None:
    index = LostBookieIndex({B0})
    index.add(make_metadata(1, [B0, B1, B2]))
    index.add(make_metadata(2, [B0, B2, B3]))
    assert [(b, list(ids)) for b, ids in index] == [(B1, [1]), (B2, [1, 2]), (B3, [2])]
    index.forget([B2, "not-lost:1"])
    assert index.lost_bookies == [B1, B3]


def test_violations_one_per_pair_with_evidence() -> None:
    md = make_metadata(9, [(0, [B0, B1, B2]), (5, [B0, B3, B2])], write_quorum=2, last_entry_id=8)
    loss = ledger_loss(md, {B0, B1}, znode_version=2)
    assert loss is not None
    assert loss_violations(loss) == [
        Violation(
            9,
            Category.LEDGERS_ON_LOST_BOOKIES,
            B2,
            {
                "segments": [0, 5],
                "ledger_state": "closed",
                "missing_replicas": [B2, B3],
                "metadata_version": 2,
            },
        ),
        Violation(
            9,
            Category.LEDGERS_ON_LOST_BOOKIES,
            B3,
            {
                "segments": [5],
                "ledger_state": "closed",
                "missing_replicas": [B2, B3],
                "metadata_version": 2,
            },
        ),
    ]


def test_invalid_metadata_violation_says_bookies_are_unknown() -> None:
    v = invalid_metadata_violation(3, "header corrupt", "/ledgers/00/0000/L0003", 1)
    assert v.category is Category.METADATA_INVALID and v.bookie is None
    assert v.detail == {
        "reason": "header corrupt",
        "path": "/ledgers/00/0000/L0003",
        "metadata_version": 1,
        "bookies": BOOKIES_UNKNOWN,
    }
