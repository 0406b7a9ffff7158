"""Pulsar's managed-ledger, cursor and schema records: exact values from hand-built bytes."""

from __future__ import annotations

import struct
import zlib

import cramjam
import pytest

from auditor.metadata.pulsar.formats import (
    PulsarFormatError,
    bucket_key,
    compress,
    cursor_refs,
    decode_cursor_info,
    decode_managed_ledger_info,
    decode_schema_locator,
    decompress,
    encode_cursor_info,
    encode_managed_ledger_info,
    managed_ledger_refs,
    schema_refs,
)
from auditor.metadata.pulsar.naming import (
    managed_ledger_of_topic,
    namespace_of_managed_ledger,
    schema_id_of_topic,
    topic_of_managed_ledger,
    topic_of_schema_id,
)
from auditor.metadata.pulsar.refs import CursorRecord, LedgerRef, RefKind
from auditor.proto import pulsar_ml_formats_pb2 as ml

ML = "shop/orders/persistent/payments"
TOPIC = "persistent://shop/orders/payments"
ZNODE = f"/managed-ledgers/{ML}"

# ManagedLedgerInfo { ledgerInfo { ledgerId: 5 entries: 10 size: 1000
#   offloadContext { complete: true } } ledgerInfo { ledgerId: 6 } }, field by field.
LEDGER_5 = b"\x08\x05" + b"\x10\x0a" + b"\x18\xe8\x07" + b"\x2a\x02\x18\x01"
ML_INFO = b"\x0a" + bytes([len(LEDGER_5)]) + LEDGER_5 + b"\x0a\x02\x08\x06"


def header(kind: int, size: int) -> bytes:
    """Magic 0x4778, the metadata's size (4 bytes), ManagedLedgerInfoMetadata by hand."""
    meta = b"\x08" + bytes([kind]) + b"\x10" + bytes([size])
    return b"\x47\x78" + struct.pack(">i", len(meta)) + meta


def expected_ml_refs(znode: str = ZNODE) -> list[LedgerRef]:
    return [
        LedgerRef(5, RefKind.LEDGER, ML, TOPIC, "shop/orders", znode, None, True, 10, 1000),
        LedgerRef(6, RefKind.LEDGER, ML, TOPIC, "shop/orders", znode),
    ]


def test_managed_ledger_info_binary() -> None:
    assert managed_ledger_refs(ML, ZNODE, ML_INFO) == expected_ml_refs()


def test_managed_ledger_info_empty_znode_has_no_ledgers() -> None:
    # A managed ledger created and never updated: MetaStoreImpl puts an empty znode.
    assert managed_ledger_refs(ML, ZNODE, b"") == []


def test_managed_ledger_info_text_format() -> None:
    text = (
        b"ledgerInfo {\n  ledgerId: 5\n  entries: 10\n  size: 1000\n"
        b"  offloadContext {\n    complete: true\n  }\n}\nledgerInfo {\n  ledgerId: 6\n}\n"
    )
    assert managed_ledger_refs(ML, ZNODE, text) == expected_ml_refs()


def test_managed_ledger_info_zlib() -> None:
    # Pulsar's deflater: zlib stream ended by a sync flush, never finished.
    deflater = zlib.compressobj()
    payload = deflater.compress(ML_INFO) + deflater.flush(zlib.Z_SYNC_FLUSH)
    data = header(2, len(ML_INFO)) + payload
    assert managed_ledger_refs(ML, ZNODE, data) == expected_ml_refs()
    assert encode_managed_ledger_info(decode_managed_ledger_info(ML_INFO), ml.ZLIB) == data


def test_managed_ledger_info_lz4_raw_block() -> None:
    data = header(1, len(ML_INFO)) + bytes(cramjam.lz4.compress_block(ML_INFO, store_size=False))
    assert managed_ledger_refs(ML, ZNODE, data) == expected_ml_refs()


@pytest.mark.parametrize("kind", [ml.LZ4, ml.ZLIB, ml.ZSTD, ml.SNAPPY])
def test_every_codec_round_trips(kind: int) -> None:
    info = decode_managed_ledger_info(ML_INFO)
    data = encode_managed_ledger_info(info, kind)
    assert data[:2] == b"\x47\x78"
    assert decode_managed_ledger_info(data) == info
    cursor = ml.ManagedCursorInfo(cursorsLedgerId=7)
    assert decode_cursor_info(encode_cursor_info(cursor, kind)) == cursor
    assert decompress(kind, compress(kind, ML_INFO), len(ML_INFO)) == ML_INFO


def test_cursor_with_ledger_compacted_and_bucket() -> None:
    name = b"CompactedTopicLedger"
    long_prop = b"\x0a" + bytes([len(name)]) + name + b"\x10\x09"
    key = bucket_key(3, 4).encode()
    string_prop = b"\x0a" + bytes([len(key)]) + key + b"\x12\x02" + b"12"
    other = b"\x0a\x01k\x12\x01v"
    data = (
        b"\x08\x07"  # cursorsLedgerId 7
        + b"\x2a"
        + bytes([len(long_prop)])
        + long_prop
        + b"\x42"
        + bytes([len(string_prop)])
        + string_prop
        + b"\x42"
        + bytes([len(other)])
        + other
    )
    znode = f"{ZNODE}/__compaction"
    got = cursor_refs(ML, "__compaction", znode, data)
    assert got.record == CursorRecord(ML, "__compaction", znode, 7)
    common = (ML, TOPIC, "shop/orders", znode, "__compaction")
    assert got.refs == [
        LedgerRef(7, RefKind.CURSOR, *common),
        LedgerRef(9, RefKind.COMPACTED, *common),
        LedgerRef(12, RefKind.DELAYED_BUCKET, *common),
    ]
    assert got.problems == []
    # Only the compaction subscription's property names a compacted ledger.
    plain = cursor_refs(ML, "sub", f"{ZNODE}/sub", data)
    assert [r.kind for r in plain.refs] == [RefKind.CURSOR, RefKind.DELAYED_BUCKET]


def test_cursor_without_ledger() -> None:
    data = b"\x08" + b"\xff" * 9 + b"\x01" + b"\x10\x03\x18\x04"  # -1, mark-delete 3:4
    got = cursor_refs(ML, "sub", f"{ZNODE}/sub", data)
    assert got.record == CursorRecord(ML, "sub", f"{ZNODE}/sub", None)
    assert got.refs == []


def test_cursor_text_format() -> None:
    got = cursor_refs(ML, "sub", "/c", b"cursorsLedgerId: 21\nmarkDeleteLedgerId: 3\n")
    assert got.record.ledger_id == 21


def test_cursor_bucket_value_not_a_ledger_is_a_problem() -> None:
    info = ml.ManagedCursorInfo(cursorsLedgerId=-1)
    info.cursorProperties.add(name=bucket_key(1, 2), value="x")
    got = cursor_refs(ML, "sub", "/c", encode_cursor_info(info))
    assert got.refs == []
    assert got.problems == [f"cursor property {bucket_key(1, 2)} names no ledger: 'x'"]


def test_schema_locator() -> None:
    def entry(version: int, ledger: int) -> bytes:
        return bytes([0x08, version, 0x12, 0x04, 0x08, ledger, 0x10, 0x00, 0x1A, 0x00])

    e0, e1 = entry(0, 10), entry(1, 11)
    data = b"\x0a\x0a" + e1 + b"\x12\x0a" + e0 + b"\x12\x0a" + e1
    locator = decode_schema_locator(data)
    assert locator.info.position.ledgerId == 11
    path = "/schemas/shop/orders/payments"
    assert schema_refs("shop/orders/payments", path, data) == [
        LedgerRef(11, RefKind.SCHEMA, "shop/orders/payments", None, "shop/orders", path),
        LedgerRef(10, RefKind.SCHEMA, "shop/orders/payments", None, "shop/orders", path),
    ]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x0a\x02\x10\x01", "ManagedLedgerInfo without required ledgerInfo[0].ledgerId"),
        (b"garbage", "not a ManagedLedgerInfo: "),
        (b"\x47\x78", "compressed ManagedLedgerInfo: compression header cut short"),
        (
            b"\x47\x78\x00\x00\x00\x02\x08\x01",
            "compressed ManagedLedgerInfo: ManagedLedgerInfoMetadata without required "
            "uncompressedSize",
        ),
        (
            header(2, 50) + b"not zlib",
            "compressed ManagedLedgerInfo: ZLIB payload does not decompress: ",
        ),
        (  # an enum value proto2 does not know is an unknown field: the type is missing
            header(9, len(ML_INFO)) + ML_INFO,
            "compressed ManagedLedgerInfo: ManagedLedgerInfoMetadata without required "
            "compressionType",
        ),
        (
            header(1, 3) + bytes(cramjam.lz4.compress_block(ML_INFO, store_size=False)),
            "compressed ManagedLedgerInfo: LZ4 payload does not decompress",
        ),
    ],
)
def test_bad_managed_ledger_info_is_named(data: bytes, reason: str) -> None:
    with pytest.raises(PulsarFormatError) as err:
        decode_managed_ledger_info(data)
    assert str(err.value).startswith(reason)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "ManagedCursorInfo without required cursorsLedgerId"),
        (b"\x10\x01", "ManagedCursorInfo without required cursorsLedgerId"),
        (b"\xff\xff", "not a ManagedCursorInfo"),
    ],
)
def test_bad_cursor_is_named(data: bytes, reason: str) -> None:
    with pytest.raises(PulsarFormatError, match=reason):
        decode_cursor_info(data)


def test_bad_schema_locator_is_named() -> None:
    with pytest.raises(PulsarFormatError, match="SchemaLocator without required info"):
        decode_schema_locator(b"")
    # TextFormat is no fallback for the locator: BookkeeperSchemaStorage reads binary only.
    with pytest.raises(PulsarFormatError, match="not a SchemaLocator"):
        decode_schema_locator(b"info { version: 0 }")


def test_naming() -> None:
    assert topic_of_managed_ledger(ML) == TOPIC
    assert namespace_of_managed_ledger("t/c/ns/persistent/a") == "t/c/ns"
    assert topic_of_managed_ledger("t/c/ns/persistent/a") == "persistent://t/c/ns/a"
    assert managed_ledger_of_topic(TOPIC) == ML
    assert managed_ledger_of_topic("persistent://t/c/ns/a") == "t/c/ns/persistent/a"
    assert schema_id_of_topic(TOPIC) == "shop/orders/payments"
    assert schema_id_of_topic("persistent://t/c/ns/a-partition-3") == "t/ns/a"
    assert schema_id_of_topic("persistent://t/ns/a-partition-03") == "t/ns/a-partition-03"
    assert managed_ledger_of_topic("persistent://t/ns/a b~") == "t/ns/persistent/a+b%7E"
    # A schema counts under its topic, the name decoded (ids as a real broker writes them).
    assert topic_of_schema_id("shop/orders/orders%3Aeu") == "persistent://shop/orders/orders:eu"
    assert topic_of_schema_id("t/ns/k%3Dv+z%C3%BCrich") == "persistent://t/ns/k=v zürich"
    assert topic_of_schema_id(schema_id_of_topic("persistent://t/ns/a=b c")) == (
        "persistent://t/ns/a=b c"
    )
    assert [topic_of_schema_id(bad) for bad in ("t/ns", "t//x", "")] == [None, None, None]
    with pytest.raises(ValueError, match="not a topic name"):
        managed_ledger_of_topic("shop/orders/payments")
