"""Fuzzing Pulsar's record decoders: random bytes, mutated valid records, crafted headers.

Whatever the bytes, decoding a managed ledger, cursor or schema znode gives refs
or raises `PulsarFormatError` (which the reader turns into a named bad znode):
no other exception, no hang, no allocation beyond what the bytes can justify.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from auditor.metadata.pulsar.formats import (
    PulsarFormatError,
    bucket_key,
    cursor_refs,
    encode_cursor_info,
    encode_managed_ledger_info,
    managed_ledger_refs,
    schema_refs,
)
from auditor.proto import pulsar_ml_formats_pb2 as ml
from auditor.proto import pulsar_schema_formats_pb2 as sc
from tests.fuzz.support import (
    ALLOCATION_LIMIT,
    MUTATIONS,
    fuzz_settings,
    mutate,
    peak_allocation,
    run,
)

pytestmark = pytest.mark.fuzz

ML = "t/ns/persistent/a"


def _decode_all(data: bytes) -> None:
    for call in (
        lambda: managed_ledger_refs(ML, "/m", data),
        lambda: cursor_refs(ML, "__compaction", "/m/c", data),
        lambda: schema_refs("t/ns/a", "/s", data),
    ):
        try:
            call()
        except PulsarFormatError as exc:
            assert "\n" not in str(exc)


def _seeds() -> list[bytes]:
    info = ml.ManagedLedgerInfo()
    for lid in (3, 4, 2**40):
        li = info.ledgerInfo.add(ledgerId=lid, entries=7, size=700)
        li.offloadContext.complete = lid == 3
    cursor = ml.ManagedCursorInfo(cursorsLedgerId=9, markDeleteLedgerId=3, markDeleteEntryId=1)
    cursor.properties.add(name="CompactedTopicLedger", value=12)
    cursor.cursorProperties.add(name=bucket_key(3, 4), value="13")
    locator = sc.SchemaLocator()
    locator.info.version = 1
    locator.info.position.ledgerId, locator.info.position.entryId = 20, 0
    locator.info.hash = b"h"
    locator.index.add().CopyFrom(locator.info)
    out = [locator.SerializeToString(), str(info).encode(), str(cursor).encode()]
    for kind in (ml.NONE, ml.LZ4, ml.ZLIB, ml.ZSTD, ml.SNAPPY):
        out.append(encode_managed_ledger_info(info, kind))
        out.append(encode_cursor_info(cursor, kind))
    return out


SEEDS = _seeds()


@fuzz_settings(500)
@given(st.binary(max_size=512))
def test_random_bytes(data: bytes) -> None:
    run(_decode_all, data)


@fuzz_settings(500)
@given(st.sampled_from(SEEDS), MUTATIONS, st.sampled_from(SEEDS))
def test_mutated_records(seed: bytes, mutations: list[tuple[str, int, int]], donor: bytes) -> None:
    run(_decode_all, mutate(seed, mutations, donor))


@fuzz_settings(300)
@given(
    st.integers(0, 6),
    st.integers(-(2**31), 2**31 - 1),
    st.one_of(st.integers(-1, 2**31 - 1), st.none()),
    st.binary(max_size=64),
)
def test_compression_headers_claiming_anything(
    kind: int, size: int, meta_size: int | None, payload: bytes
) -> None:
    """A header may claim any codec and size: nothing is allocated for a claimed size."""
    meta = ml.ManagedLedgerInfoMetadata()
    meta.compressionType = ml.CompressionType.ValueType(min(kind, 4))
    meta.uncompressedSize = size
    raw = meta.SerializeToString()
    length = len(raw) if meta_size is None else meta_size
    data = b"\x47\x78" + struct.pack(">i", length) + raw + payload
    run(_decode_all, data)
    assert peak_allocation(lambda: _decode_all(data)) < ALLOCATION_LIMIT
