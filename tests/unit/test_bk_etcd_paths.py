"""BookKeeper's etcd driver: ledger keys (UUID(0, id)), its LAYOUT, and the view's names."""

from __future__ import annotations

import uuid

import pytest

from auditor.metadata.bk_etcd import BookKeeperEtcdView
from auditor.metadata.layout import Layout, LedgerManager, parse_layout
from auditor.metadata.paths import (
    LONG_MAX,
    InvalidLedgerIdError,
    etcd_ledger_id,
    etcd_ledger_key,
    etcd_uuid,
    ledger_id_from_path,
    ledger_path,
)

ETCD_LAYOUT = b"2\norg.apache.bookkeeper.metadata.etcd.EtcdLedgerManagerFactory:0"


def test_ledger_key_is_javas_uuid_of_0_and_the_id() -> None:
    assert (
        etcd_ledger_key("/ledgers", 10) == "/ledgers/ledgers/00000000-0000-0000-0000-00000000000a"
    )
    assert ledger_path(LedgerManager.ETCD, "/ledgers", 10) == etcd_ledger_key("/ledgers", 10)
    assert (
        etcd_ledger_key("/ledgers/", 0) == "/ledgers/ledgers/00000000-0000-0000-0000-000000000000"
    )
    # new UUID(0, Long.MAX_VALUE).toString(), and Python's UUID of the same 128 bits.
    assert etcd_uuid(LONG_MAX) == "00000000-0000-0000-7fff-ffffffffffff"
    for i in (0, 1, 255, 2**31 - 1, 2**48, 2**48 + 1, 2**63 - 1):
        assert etcd_uuid(i) == str(uuid.UUID(int=i))
    with pytest.raises(InvalidLedgerIdError):
        etcd_ledger_key("/ledgers", LONG_MAX + 1)


def test_ledger_keys_sort_in_id_order() -> None:
    ids = [0, 9, 10, 15, 16, 255, 2**31, 2**47, 2**48 - 1, 2**48, 2**62, LONG_MAX]
    keys = [etcd_ledger_key("/s", i) for i in ids]
    assert sorted(keys) == keys


def test_ledger_id_from_a_ledger_key() -> None:
    key = "/ledgers/ledgers/00000000-0000-0000-0001-000000000002"
    assert ledger_id_from_path("/ledgers", key) == 2**48 + 2
    assert etcd_ledger_id("00000000-0000-0000-7fff-ffffffffffff") == LONG_MAX
    # The hierarchical paths are read as before.
    assert ledger_id_from_path("/ledgers", "/ledgers/00/0000/L0012") == 12


@pytest.mark.parametrize(
    "name",
    [
        "00000000-0000-0000-0000-00000000000A",  # upper case: BookKeeper writes lower
        "00000000-0000-0001-0000-00000000000a",  # a scope id (high half) other than 0
        "0-0-0-0-a",  # Java's UUID.fromString takes it; BookKeeper never writes it
        "00000000-0000-0000-0000-0000000000a",  # 11 digits in the last group
        "L0000000010",
        "",
    ],
)
def test_a_malformed_ledger_key_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="UUID"):
        etcd_ledger_id(name)
    with pytest.raises(ValueError, match="/ledgers/ledgers/"):
        ledger_id_from_path("/ledgers", f"/ledgers/ledgers/{name}")


def test_a_negative_java_long_is_an_id_out_of_range() -> None:
    with pytest.raises(InvalidLedgerIdError, match="9223372036854775807"):
        etcd_ledger_id("00000000-0000-0000-8000-000000000000")


def test_layout_of_the_etcd_factory_exact_bytes() -> None:
    assert Layout.current(LedgerManager.ETCD).encode() == ETCD_LAYOUT
    assert parse_layout(ETCD_LAYOUT) == Layout(LedgerManager.ETCD, 0, 2)
    # Shaded (Pulsar's dlshade.) and short names resolve to the same manager.
    shaded = b"2\ndlshade.org.apache.bookkeeper.metadata.etcd.EtcdLedgerManagerFactory:0"
    assert parse_layout(shaded).manager is LedgerManager.ETCD
    assert parse_layout(b"2\nEtcdLedgerManagerFactory:0").manager is LedgerManager.ETCD
    # The ZooKeeper managers' current version stays 1.
    assert Layout.current(LedgerManager.HIERARCHICAL) == Layout(LedgerManager.HIERARCHICAL)


@pytest.mark.parametrize(
    ("zk_path", "etcd_key"),
    [
        ("/s/LAYOUT", "/s/layout"),
        ("/s/INSTANCEID", "/s/instanceid"),
        ("/s/available", "/s/bookies/writable"),
        ("/s/available/b1:3181", "/s/bookies/writable/b1:3181"),
        ("/s/available/readonly", "/s/bookies/readonly"),
        ("/s/available/readonly/b1:3181", "/s/bookies/readonly/b1:3181"),
        ("/s/cookies/b1:3181", "/s/cookies/b1:3181"),
        (
            "/s/ledgers/00000000-0000-0000-0000-00000000000a",
            "/s/ledgers/00000000-0000-0000-0000-00000000000a",
        ),
        ("/s/underreplication/ledgers", "/s/underreplication/ledgers"),
        ("/s", "/s"),
        ("/other/LAYOUT", "/other/LAYOUT"),
        ("/s/LAYOUTS", "/s/LAYOUTS"),
    ],
)
def test_view_names(zk_path: str, etcd_key: str) -> None:
    view = BookKeeperEtcdView(None, "/s/")  # type: ignore[arg-type]  # names only
    assert view.to_store(zk_path) == etcd_key
    assert view.from_store(etcd_key) == zk_path
