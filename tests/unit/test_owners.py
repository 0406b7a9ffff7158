"""Pulsar owners from ledger custom metadata: every key spelling Pulsar has used."""

from __future__ import annotations

import pytest

from auditor.checks.owners import Owner, owner_of, topic_of_managed_ledger


def test_managed_ledger_and_cursor() -> None:
    ml = [
        ("application", b"pulsar"),
        ("component", b"managed-ledger"),
        ("pulsar/managed-ledger", b"shop/orders/persistent/payments"),
    ]
    assert owner_of(ml) == Owner(
        key="persistent://shop/orders/payments",
        application="pulsar",
        component="managed-ledger",
        managed_ledger="shop/orders/persistent/payments",
        topic="persistent://shop/orders/payments",
    )
    cursor = owner_of([*ml, ("pulsar/cursor", b"sub-1")])
    assert cursor is not None and cursor.cursor == "sub-1"
    assert cursor.to_json() == {
        "key": "persistent://shop/orders/payments",
        "application": "pulsar",
        "component": "managed-ledger",
        "managed_ledger": "shop/orders/persistent/payments",
        "topic": "persistent://shop/orders/payments",
        "cursor": "sub-1",
    }
    assert Owner.from_json(cursor.to_json()) == cursor


def test_pre_2_7_keys_compacted_and_schema() -> None:
    old = owner_of([("psr/managed-ledger", b"t/ns/persistent/x"), ("psr/cursor", b"c")])
    assert old is not None
    assert (old.key, old.cursor) == ("persistent://t/ns/x", "c")
    compacted = owner_of(
        [("component", b"compacted-ledger"), ("pulsar/compactedTopic", b"persistent://t/ns/y")]
    )
    assert compacted is not None and compacted.key == "persistent://t/ns/y"
    assert compacted.managed_ledger is None
    schema = owner_of([("component", b"schema"), ("pulsar/schemaId", b"t/ns/z")])
    assert schema is not None
    assert (schema.key, schema.schema_id, schema.topic) == ("schema:t/ns/z", "t/ns/z", None)


def test_no_owner() -> None:
    assert owner_of([]) is None
    assert owner_of([("application", b"pulsar"), ("component", b"managed-ledger")]) is None
    assert owner_of([("pulsar/managed-ledger", b"\xff\xfe")]) is None


@pytest.mark.parametrize(
    ("name", "topic"),
    [
        ("t/ns/persistent/a", "persistent://t/ns/a"),
        ("t/ns/non-persistent/a", "non-persistent://t/ns/a"),
        ("t/cluster/ns/persistent/a", "persistent://t/cluster/ns/a"),
        ("t/ns/persistent/a/b", "persistent://t/ns/a/b"),
        # Local names decoded, as a real broker's (pulsar-broker 4.0.7) are stored encoded.
        ("t/ns/persistent/orders%3Aeu", "persistent://t/ns/orders:eu"),
        ("t/ns/persistent/with+space", "persistent://t/ns/with space"),
        ("t/ns/persistent/z%C3%BCrich", "persistent://t/ns/zürich"),
        ("t/ns/persistent", None),
        ("plain-name", None),
        ("t/persistent/a", None),
    ],
)
def test_topic_of_managed_ledger(name: str, topic: str | None) -> None:
    assert topic_of_managed_ledger(name) == topic
