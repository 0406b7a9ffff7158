"""Ledger id <-> znode path, LAYOUT parsing, metadata service URIs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from auditor.errors import ConfigError
from auditor.metadata.layout import (
    Layout,
    LayoutError,
    LedgerManager,
    parse_layout,
)
from auditor.metadata.paths import (
    LONG_MAX,
    InvalidLedgerIdError,
    check_ledger_id,
    is_valid_ledger_id,
    ledger_id_from_path,
    ledger_path,
)
from auditor.metadata.service_uri import parse_metadata_service_uri

H = LedgerManager.HIERARCHICAL


@pytest.mark.parametrize(
    ("manager", "ledger_id", "path"),
    [
        (LedgerManager.FLAT, 1, "/ledgers/L0000000001"),
        (LedgerManager.LEGACY_HIERARCHICAL, 1, "/ledgers/00/0000/L0001"),
        (LedgerManager.LEGACY_HIERARCHICAL, 1234567, "/ledgers/00/0123/L4567"),
        (LedgerManager.LEGACY_HIERARCHICAL, 2147483646, "/ledgers/21/4748/L3646"),
        (LedgerManager.LONG_HIERARCHICAL, 1, "/ledgers/000/0000/0000/0000/L0001"),
        (LedgerManager.LONG_HIERARCHICAL, 2**63 - 1, "/ledgers/922/3372/0368/5477/L5807"),
        (H, 2147483646, "/ledgers/21/4748/L3646"),
        (H, 2147483647, "/ledgers/000/0000/0021/4748/L3647"),
        (H, 2147483648, "/ledgers/000/0000/0021/4748/L3648"),
        (H, 2**63 - 1, "/ledgers/922/3372/0368/5477/L5807"),
    ],
)
def test_ledger_paths(manager: LedgerManager, ledger_id: int, path: str) -> None:
    assert ledger_path(manager, "/ledgers", ledger_id) == path
    assert ledger_id_from_path("/ledgers", path) == ledger_id


@given(st.integers(min_value=0, max_value=2**63 - 1), st.sampled_from(list(LedgerManager)))
def test_path_round_trip(ledger_id: int, manager: LedgerManager) -> None:
    if manager in (LedgerManager.FLAT, LedgerManager.LEGACY_HIERARCHICAL) and ledger_id >= 10**10:
        return  # those managers cannot name such ids (upstream neither)
    assert ledger_id_from_path("/r", ledger_path(manager, "/r", ledger_id)) == ledger_id


def test_ledger_path_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        ledger_path(H, "/ledgers", -1)
    with pytest.raises(ValueError):
        ledger_path(H, "/ledgers", 2**63)


def test_one_rule_for_ledger_ids() -> None:
    assert [is_valid_ledger_id(i) for i in (-1, 0, LONG_MAX, LONG_MAX + 1)] == [
        False,
        True,
        True,
        False,
    ]
    assert check_ledger_id(LONG_MAX) == LONG_MAX
    with pytest.raises(InvalidLedgerIdError) as caught:
        check_ledger_id(2**63, where="argument LEDGER_ID")
    # A command-line id gets a configuration error's exit code; callers that caught
    # ledger_path's ValueError still catch it.
    assert isinstance(caught.value, ConfigError) and isinstance(caught.value, ValueError)
    assert str(caught.value) == (
        "argument LEDGER_ID: a ledger id is 0..9223372036854775807, got 9223372036854775808"
    )
    with pytest.raises(
        InvalidLedgerIdError, match=r"^a ledger id is 0\.\.9223372036854775807, got -5$"
    ):
        check_ledger_id(-5)


@pytest.mark.parametrize(
    "path",
    [
        "/ledgers/922/3372/0368/5477/L5808",  # 2^63, 19 digits: the long tree's shape
        "/ledgers/999/9999/9999/9999/L9999",
        "/ledgers/922/3372/0368/5477/L58080",  # 20 digits
        "/ledgers/L99999999999999999999",
    ],
)
def test_a_path_spelling_an_id_beyond_the_range_is_no_ledger(path: str) -> None:
    with pytest.raises(InvalidLedgerIdError, match=f"^{path}: a ledger id is 0..{LONG_MAX}, got "):
        ledger_id_from_path("/ledgers", path)


@pytest.mark.parametrize(
    ("data", "manager", "version"),
    [
        (b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1", H, 2),
        (
            b"2\norg.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1",
            LedgerManager.LONG_HIERARCHICAL,
            2,
        ),
        (
            b"2\norg.apache.bookkeeper.meta.LegacyHierarchicalLedgerManagerFactory:1",
            LedgerManager.LEGACY_HIERARCHICAL,
            2,
        ),
        (b"2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1", LedgerManager.FLAT, 2),
        (b"2\ndlshade.org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1", H, 2),
        (b"1\nhierarchical:1", H, 1),
        (b"1\nflat:1", LedgerManager.FLAT, 1),
    ],
)
def test_parse_layout(data: bytes, manager: LedgerManager, version: int) -> None:
    layout = parse_layout(data)
    assert layout.manager is manager
    assert layout.layout_version == version


def test_layout_encodes_as_bookkeeper_writes_it() -> None:
    assert Layout(H).encode() == (
        b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    )


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"3\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1",
        b"2\norg.example.MsLedgerManagerFactory:1",
        b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory",
        b"\xff\xfe",
        b"two\nflat:1",
    ],
)
def test_unknown_layout_is_a_typed_error(data: bytes) -> None:
    with pytest.raises(LayoutError):
        parse_layout(data)


def test_metadata_service_uris() -> None:
    u = parse_metadata_service_uri("zk+hierarchical://h1:2181;h2:2181/ledgers")
    assert (u.hosts, u.ledgers_root, u.manager) == ("h1:2181,h2:2181", "/ledgers", H)
    u = parse_metadata_service_uri("zk://zk:2181/pulsar/ledgers")
    assert (u.hosts, u.ledgers_root, u.manager) == ("zk:2181", "/pulsar/ledgers", None)
    u = parse_metadata_service_uri("zk+longhierarchical://zk:2181")
    assert (u.ledgers_root, u.manager) == ("/ledgers", LedgerManager.LONG_HIERARCHICAL)
    for bad in ["zk+etcd://h:2379/ledgers", "zk+ms://h:2181/ledgers", "nonsense"]:
        with pytest.raises(ConfigError):
            parse_metadata_service_uri(bad)


def test_metadata_service_uri_host_lists() -> None:
    uri = parse_metadata_service_uri("zk+hierarchical://h1:2181;h2:2181,h3:2181/ledgers")
    assert uri.hosts == "h1:2181,h2:2181,h3:2181"
    for bad in ("zk://,", "zk://;/ledgers", "zk:// ; /x"):
        with pytest.raises(ConfigError, match="no ZooKeeper host"):
            parse_metadata_service_uri(bad)
