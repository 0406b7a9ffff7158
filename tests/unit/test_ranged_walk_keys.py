"""The worked key examples of `auditor.metadata.ranged_walk`'s docstring, held true: each
layout's key of a ledger, and the key range the walk reads it in, on a store of sorted
keys (just enough of etcd for the ranged walk: range reads, each one noted)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from auditor.metadata.layout import LedgerManager
from auditor.metadata.ledger_tree import IdRange, WalkStats, ZnodeJudge
from auditor.metadata.paths import ledger_path
from auditor.metadata.ranged_walk import RangedLedger, RangedWalk, Span
from auditor.store import MetadataStore, RangeItem

ROOT = "/ledgers"


@dataclass(frozen=True)
class _Stat:
    version: int = 0
    ctime: int = 0
    mtime: int = 0
    ephemeralOwner: int = 0
    numChildren: int = 0


class _Keys:
    """Sorted keys read by range, as etcd answers; `reads` notes each request and what
    it returned."""

    ranged = True

    def __init__(self, keys: list[str]) -> None:
        self.keys = sorted(keys)
        self.reads: list[tuple[Span, list[str]]] = []

    async def read_range(self, start: str, end: str, *, limit: int) -> tuple[list[RangeItem], bool]:
        inside = [k for k in self.keys if start <= k and (not end or k < end)]
        self.reads.append((Span(start, end), inside[:limit]))
        return [RangeItem(k, b"", _Stat()) for k in inside[:limit]], len(inside) > limit


async def _walk(
    manager: LedgerManager, keys: list[str], *, page: int = 1, id_range: IdRange | None = None
) -> tuple[list[RangedLedger], _Keys, WalkStats]:
    store = _Keys(keys)
    stats = WalkStats()
    walk = RangedWalk(cast(MetadataStore, store), ZnodeJudge(ROOT, manager, id_range, stats), page)
    return [found async for found in walk.items()], store, stats


def _read_in(store: _Keys, key: str) -> Span:
    """The range of the last request that returned `key` (the first may be the walk's try
    of the whole family in one page)."""
    return [span for span, got in store.reads if key in got][-1]


async def test_legacy_hierarchical_key_and_span() -> None:
    key = "/ledgers/00/0000/L0042"
    assert ledger_path(LedgerManager.LEGACY_HIERARCHICAL, ROOT, 42) == key
    # A second ledger, so that the tree is more than one page and read span by span.
    keys = [key, "/ledgers/00/0000/L0043"]
    found, store, _ = await _walk(LedgerManager.LEGACY_HIERARCHICAL, keys)
    assert [(f.ledger_id, f.path) for f in found] == [(42, key), (43, keys[1])]
    assert _read_in(store, key) == Span("/ledgers/00/", "/ledgers/000")


async def test_legacy_hierarchical_id_range_reads_its_keys_then_the_tail() -> None:
    first, past, stray = "/ledgers/00/0100/L0000", "/ledgers/00/0200/L0500", "/ledgers/00/0200/x"
    found, store, stats = await _walk(
        LedgerManager.LEGACY_HIERARCHICAL,
        [first, past, stray],
        page=10,
        id_range=IdRange(1_000_000, 2_000_500),
    )
    assert [(f.ledger_id, f.path) for f in found] == [(1_000_000, first)]
    assert [span for span, _ in store.reads[:2]] == [
        Span("/ledgers/00/0100/", "/ledgers/00/0200/L0500"),
        Span("/ledgers/00/0200/L0500", "/ledgers/00/02000"),
    ]
    assert stats.foreign_znodes == [stray]


async def test_long_hierarchical_key_and_span() -> None:
    key = "/ledgers/000/0000/0021/4748/L3648"
    assert ledger_path(LedgerManager.LONG_HIERARCHICAL, ROOT, 2**31) == key
    keys = [key, "/ledgers/000/0000/0021/4748/L3649"]
    found, store, _ = await _walk(LedgerManager.LONG_HIERARCHICAL, keys)
    assert [f.ledger_id for f in found] == [2**31, 2**31 + 1]
    assert _read_in(store, key) == Span("/ledgers/000", "/ledgers/00:")


async def test_hierarchical_reads_the_legacy_family_then_the_long_one() -> None:
    legacy, long = "/ledgers/00/0000/L0042", "/ledgers/000/0000/0021/4748/L3648"
    assert ledger_path(LedgerManager.HIERARCHICAL, ROOT, 42) == legacy
    assert ledger_path(LedgerManager.HIERARCHICAL, ROOT, 2**31) == long
    keys = [legacy, "/ledgers/00/0000/L0043", long, "/ledgers/000/0000/0021/4748/L3649"]
    found, store, stats = await _walk(LedgerManager.HIERARCHICAL, keys)
    assert [f.ledger_id for f in found] == [42, 43, 2**31, 2**31 + 1]
    assert _read_in(store, legacy) == Span("/ledgers/00/", "/ledgers/000")
    assert _read_in(store, long) == Span("/ledgers/000", "/ledgers/00:")
    assert stats.unexpected == []


async def test_flat_key_and_span_and_layout_passed_over() -> None:
    key = "/ledgers/L0000000042"
    assert ledger_path(LedgerManager.FLAT, ROOT, 42) == key
    keys = [key, "/ledgers/L0000000043", "/ledgers/LAYOUT"]
    found, store, stats = await _walk(LedgerManager.FLAT, keys)
    assert [f.ledger_id for f in found] == [42, 43]
    assert _read_in(store, key) == Span("/ledgers/L", "/ledgers/M")
    assert any("/ledgers/LAYOUT" in got for _, got in store.reads)
    assert stats.unexpected == []


async def test_bookkeeper_etcd_key_and_span() -> None:
    key = "/ledgers/ledgers/00000000-0000-0000-0000-00000000002a"
    assert ledger_path(LedgerManager.ETCD, ROOT, 42) == key
    keys = [key, "/ledgers/ledgers/00000000-0000-0000-0000-00000000002b"]
    found, store, _ = await _walk(LedgerManager.ETCD, keys)
    assert [f.ledger_id for f in found] == [42, 43]
    assert _read_in(store, key) == Span("/ledgers/ledgers/", "/ledgers/ledgers0")
