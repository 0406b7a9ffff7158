"""Pulsar's own records are where it names the ledgers it owns, written by brokers of many
versions in several encodings and compressions; the audit must read every one as a broker
would, and the tests must write them as brokers do.

Pulsar's ZooKeeper records, decoded as its brokers read them and encoded as they write them.

Three records name ledgers (`MLDataFormats.proto`, `SchemaStorageFormat.proto`):

* `/managed-ledgers/<name>`: `ManagedLedgerInfo`, the managed ledger's ledgers.
  A managed ledger created and never updated has an empty znode (an empty
  message: no ledgers).
* `/managed-ledgers/<name>/<cursor>`: `ManagedCursorInfo`. `cursorsLedgerId` is
  the cursor ledger (negative: none, the position is kept in the znode). The
  `__compaction` cursor's mark-delete property `CompactedTopicLedger` (a
  `LongProperty`) names the compacted ledger; cursor properties
  (`StringProperty`) `#pulsar.internal.delayed.bucket_<start>_<end>` name
  delayed-delivery bucket snapshot ledgers (the value is the ledger id).
* `/schemas/<schema id>`: `SchemaLocator`, the positions of schema versions.

How `MetaStoreImpl` (managed-ledger module) stores the first two: plain binary
protobuf, or, when metadata compression is configured, a header and the
compressed message: the 2-byte magic 0x4778 (the same for both records), a
4-byte big-endian size, that many bytes of `ManagedLedgerInfoMetadata` /
`ManagedCursorInfoMetadata` (compression type, uncompressed size), then the
payload compressed by Pulsar's codec: LZ4 as a raw block, ZLIB as a zlib stream
ended by a sync flush (never finished), ZSTD as a frame, SNAPPY raw. A header
that does not decompress makes Pulsar parse the whole bytes as the plain
message, and so do we. Brokers before 2.8 (`MetaStoreImplZookeeper`) also read
protobuf TextFormat, written by the oldest ones: what does not parse as binary
is tried as text. Like Java's parsers we refuse a message missing a required
field. The schema locator is binary only (`BookkeeperSchemaStorage`).

Every failure is a `PulsarFormatError` with a one-line reason; nothing else
escapes from decoding arbitrary bytes.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import TypeVar

import cramjam
from google.protobuf import text_format
from google.protobuf.message import DecodeError, Message

from auditor.metadata.pulsar.naming import (
    namespace_of_managed_ledger,
    namespace_of_schema_id,
    topic_of_managed_ledger,
)
from auditor.metadata.pulsar.refs import CursorRecord, LedgerRef, RefKind
from auditor.proto import pulsar_ml_formats_pb2 as ml
from auditor.proto import pulsar_schema_formats_pb2 as sc

#: The first two bytes of a compressed ManagedLedgerInfo or ManagedCursorInfo.
MAGIC_MANAGED_INFO_METADATA = 0x4778
#: Pulsar's name of the compaction subscription (`Compactor.COMPACTION_SUBSCRIPTION`).
COMPACTION_CURSOR = "__compaction"
#: The mark-delete property naming the compacted ledger (`Compactor`).
COMPACTED_TOPIC_LEDGER = "CompactedTopicLedger"
#: Cursor properties `<prefix>_<start ledger>_<end ledger>` name bucket snapshot ledgers.
DELAYED_BUCKET_KEY_PREFIX = "#pulsar.internal.delayed.bucket"
#: The largest uncompressed size we decompress to (a sanity bound: ZooKeeper's
#: default znode limit is 1 MiB; compressed metadata may expand well beyond it).
MAX_UNCOMPRESSED = 64 * 1024 * 1024

Compression = ml.CompressionType.ValueType
LONG_MAX = 2**63 - 1
#: A Java long as `String.valueOf` writes it (how bucket ids are kept).
_LONG = re.compile(r"-?[0-9]{1,19}")

_M = TypeVar("_M", bound=Message)


class PulsarFormatError(ValueError):
    """Bytes that are not the record Pulsar keeps at that place (a one-line reason)."""


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _missing(msg: Message) -> str | None:
    if msg.IsInitialized():
        return None
    errors: list[str] = msg.FindInitializationErrors()  # type: ignore[attr-defined]
    return ", ".join(errors) or "required fields"


def _parse_binary(cls: type[_M], data: bytes) -> _M:
    msg = cls()
    try:
        msg.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise PulsarFormatError(f"not a {cls.__name__}: {_one_line(str(exc))}") from exc
    missing = _missing(msg)
    if missing is not None:
        raise PulsarFormatError(f"{cls.__name__} without required {missing}")
    return msg


def _parse_text(cls: type[_M], data: bytes) -> _M:
    msg = cls()
    try:
        text_format.Parse(data.decode("utf-8"), msg)
    except (text_format.ParseError, UnicodeDecodeError, ValueError, RuntimeError) as exc:
        raise PulsarFormatError(f"not a {cls.__name__}: {_one_line(str(exc))}") from exc
    missing = _missing(msg)
    if missing is not None:
        raise PulsarFormatError(f"{cls.__name__} (text) without required {missing}")
    return msg


def _parse_binary_or_text(cls: type[_M], data: bytes) -> _M:
    try:
        return _parse_binary(cls, data)
    except PulsarFormatError as binary:
        try:
            return _parse_text(cls, data)
        except PulsarFormatError:
            raise binary from None


def _check_declared(name: str, declared: int, size: int) -> None:
    """A payload that says it holds other than `size` bytes is refused before it is
    decompressed (so that no header makes us allocate more than it claims)."""
    if declared != size:
        raise PulsarFormatError(f"{name} payload holds {declared} bytes, the header says {size}")


def _snappy_length(payload: bytes) -> int:
    """The uncompressed length a raw snappy block starts with (a varint)."""
    value = shift = 0
    for i, byte in enumerate(payload[:5]):
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
        if i == 4:
            break
    raise PulsarFormatError("SNAPPY payload without its length")


_ZSTD_MAGIC = 0xFD2FB528


def _zstd_content_size(payload: bytes) -> int:
    """The content size the one zstd frame of `payload` declares (Pulsar's codecs always
    write it). The frame must end where the payload does: its blocks are walked (their
    3-byte headers), so that no second frame, which could claim any size, is decompressed."""
    if len(payload) < 5 or struct.unpack_from("<I", payload)[0] != _ZSTD_MAGIC:
        raise PulsarFormatError("ZSTD payload is not a zstd frame")
    descriptor = payload[4]
    fcs_flag, single, checksum = descriptor >> 6, (descriptor >> 5) & 1, (descriptor >> 2) & 1
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if width == 0:
        raise PulsarFormatError("ZSTD frame without its content size")
    if len(payload) < at + width:
        raise PulsarFormatError("ZSTD frame header cut short")
    value = int.from_bytes(payload[at : at + width], "little")
    at += width
    while True:
        if len(payload) < at + 3:
            raise PulsarFormatError("ZSTD frame cut short")
        block = int.from_bytes(payload[at : at + 3], "little")
        last, kind, length = block & 1, (block >> 1) & 3, block >> 3
        at += 3 + (1 if kind == 1 else length)
        if last:
            break
    if at + 4 * checksum != len(payload):
        raise PulsarFormatError("ZSTD payload is not exactly one frame")
    return value + 256 if width == 2 else value


def decompress(kind: int, payload: bytes, size: int) -> bytes:
    """Pulsar's codec `kind` undone on `payload`, which must give exactly `size` bytes."""
    if size < 0 or size > MAX_UNCOMPRESSED:
        raise PulsarFormatError(f"uncompressed size {size} out of range")
    try:
        if kind == ml.NONE:
            out = payload
        elif kind == ml.LZ4:
            # A raw LZ4 block expands at most 255-fold: refuse a size it cannot hold
            # before allocating it.
            if size > 255 * len(payload) + 16:
                raise PulsarFormatError(f"LZ4 payload of {len(payload)} bytes cannot hold {size}")
            out = bytes(cramjam.lz4.decompress_block(payload, output_len=size))
        elif kind == ml.ZLIB:
            # Pulsar's deflater ends with a sync flush, not a finished stream.
            out = zlib.decompressobj().decompress(payload, size + 1)
        elif kind == ml.ZSTD:
            _check_declared("ZSTD", _zstd_content_size(payload), size)
            out = bytes(cramjam.zstd.decompress(payload, output_len=size))
        elif kind == ml.SNAPPY:
            _check_declared("SNAPPY", _snappy_length(payload), size)
            out = bytes(cramjam.snappy.decompress_raw(payload))
        else:
            raise PulsarFormatError(f"unknown compression type {kind}")
    except PulsarFormatError:
        raise
    except (cramjam.DecompressionError, zlib.error, ValueError, OverflowError) as exc:
        name = _codec_name(kind)
        raise PulsarFormatError(
            f"{name} payload does not decompress: {_one_line(str(exc))}"
        ) from exc
    if len(out) != size:
        name = _codec_name(kind)
        raise PulsarFormatError(
            f"{name} payload decompresses to {len(out)} bytes, the header says {size}"
        )
    return out


def compress(kind: int, payload: bytes) -> bytes:
    """`payload` compressed as Pulsar's codec `kind` does (what the test writer stores)."""
    if kind == ml.NONE:
        return payload
    if kind == ml.LZ4:
        return bytes(cramjam.lz4.compress_block(payload, store_size=False))
    if kind == ml.ZLIB:
        deflater = zlib.compressobj()
        return deflater.compress(payload) + deflater.flush(zlib.Z_SYNC_FLUSH)
    if kind == ml.ZSTD:
        return bytes(cramjam.zstd.compress(payload))
    if kind == ml.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(payload))
    raise ValueError(f"unknown compression type {kind}")


_Meta = ml.ManagedLedgerInfoMetadata | ml.ManagedCursorInfoMetadata


def _codec_name(kind: int) -> str:
    return {1: "LZ4", 2: "ZLIB", 3: "ZSTD", 4: "SNAPPY"}.get(kind, f"compression {kind}")


def _header(data: bytes, cls: type[_Meta]) -> tuple[_Meta, bytes] | None:
    """(compression metadata, compressed payload) when `data` starts with the magic."""
    if len(data) < 2 or struct.unpack_from(">H", data)[0] != MAGIC_MANAGED_INFO_METADATA:
        return None
    if len(data) < 6:
        raise PulsarFormatError("compression header cut short")
    (size,) = struct.unpack_from(">i", data, 2)
    if size < 0 or 6 + size > len(data):
        raise PulsarFormatError(f"compression metadata size {size} beyond the znode's bytes")
    return _parse_binary(cls, data[6 : 6 + size]), data[6 + size :]


def _decode_info(data: bytes, cls: type[_M], meta_cls: type[_Meta]) -> _M:
    try:
        header = _header(data, meta_cls)
    except PulsarFormatError as exc:
        header_error: PulsarFormatError | None = exc
        header = None
    else:
        header_error = None
    if header is not None:
        meta, payload = header
        try:
            kind = int(meta.compressionType)
            size = int(meta.uncompressedSize)
            return _parse_binary(cls, decompress(kind, payload, size))
        except PulsarFormatError as exc:
            header_error = exc
    if header_error is not None:
        # Pulsar falls back to parsing the whole bytes as the plain message.
        try:
            return _parse_binary(cls, data)
        except PulsarFormatError:
            raise PulsarFormatError(f"compressed {cls.__name__}: {header_error}") from None
    return _parse_binary_or_text(cls, data)


def decode_managed_ledger_info(data: bytes) -> ml.ManagedLedgerInfo:
    """The `ManagedLedgerInfo` of a managed ledger znode (empty bytes: no ledgers)."""
    return _decode_info(bytes(data), ml.ManagedLedgerInfo, ml.ManagedLedgerInfoMetadata)


def decode_cursor_info(data: bytes) -> ml.ManagedCursorInfo:
    """The `ManagedCursorInfo` of a cursor znode."""
    return _decode_info(bytes(data), ml.ManagedCursorInfo, ml.ManagedCursorInfoMetadata)


def decode_schema_locator(data: bytes) -> sc.SchemaLocator:
    """The `SchemaLocator` of a schema znode (binary protobuf only)."""
    return _parse_binary(sc.SchemaLocator, bytes(data))


def _encode(msg: Message, meta: _Meta, kind: int) -> bytes:
    body = msg.SerializeToString()
    if kind == ml.NONE:
        return body
    meta.compressionType = ml.CompressionType.ValueType(kind)
    meta.uncompressedSize = len(body)
    head = meta.SerializeToString()
    return struct.pack(">Hi", MAGIC_MANAGED_INFO_METADATA, len(head)) + head + compress(kind, body)


def encode_managed_ledger_info(info: ml.ManagedLedgerInfo, compression: int = ml.NONE) -> bytes:
    """The znode bytes `MetaStoreImpl` writes for `info` with that compression."""
    return _encode(info, ml.ManagedLedgerInfoMetadata(), compression)


def encode_cursor_info(info: ml.ManagedCursorInfo, compression: int = ml.NONE) -> bytes:
    """The znode bytes `MetaStoreImpl` writes for a cursor with that compression."""
    return _encode(info, ml.ManagedCursorInfoMetadata(), compression)


def bucket_key(start_ledger_id: int, end_ledger_id: int) -> str:
    """The cursor property naming a delayed-delivery bucket's snapshot ledger."""
    return f"{DELAYED_BUCKET_KEY_PREFIX}_{start_ledger_id}_{end_ledger_id}"


def managed_ledger_refs(name: str, znode: str, data: bytes) -> list[LedgerRef]:
    """The ledgers a managed ledger znode lists, in its order."""
    info = decode_managed_ledger_info(data)
    topic = topic_of_managed_ledger(name)
    namespace = namespace_of_managed_ledger(name) or ""
    refs: list[LedgerRef] = []
    for li in info.ledgerInfo:
        offloaded = li.HasField("offloadContext") and li.offloadContext.complete
        refs.append(
            LedgerRef(
                ledger_id=li.ledgerId,
                kind=RefKind.LEDGER,
                owner=name,
                topic=topic,
                namespace=namespace,
                znode=znode,
                offloaded=offloaded,
                entries=li.entries if li.HasField("entries") else None,
                size=li.size if li.HasField("size") else None,
            )
        )
    return refs


def _text(value: str | bytes) -> str:
    """A proto2 string field: Python's protobuf hands over bytes that are not UTF-8 as
    bytes; Java reads them with replacement characters, and so do we."""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


@dataclass
class CursorRefs:
    """A cursor znode as read: the record, the ledgers it names, and values it holds that
    name no ledger (a bucket property whose value is no ledger id), each a one-line reason."""

    record: CursorRecord
    refs: list[LedgerRef] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def cursor_refs(managed_ledger: str, cursor: str, znode: str, data: bytes) -> CursorRefs:
    """The ledgers one cursor znode names: its cursor ledger, a compacted ledger (the
    `__compaction` cursor), delayed-delivery bucket snapshots."""
    info = decode_cursor_info(data)
    topic = topic_of_managed_ledger(managed_ledger)
    namespace = namespace_of_managed_ledger(managed_ledger) or ""
    ledger_id = info.cursorsLedgerId if info.cursorsLedgerId >= 0 else None
    out = CursorRefs(CursorRecord(managed_ledger, cursor, znode, ledger_id))

    def ref(lid: int, kind: RefKind) -> LedgerRef:
        return LedgerRef(lid, kind, managed_ledger, topic, namespace, znode, cursor=cursor)

    if ledger_id is not None:
        out.refs.append(ref(ledger_id, RefKind.CURSOR))
    if cursor == COMPACTION_CURSOR:
        for prop in info.properties:
            if _text(prop.name) == COMPACTED_TOPIC_LEDGER and prop.value >= 0:
                out.refs.append(ref(prop.value, RefKind.COMPACTED))
    for sprop in info.cursorProperties:
        key, value = _text(sprop.name), _text(sprop.value)
        if not key.startswith(DELAYED_BUCKET_KEY_PREFIX + "_"):
            continue
        bucket = int(value) if _LONG.fullmatch(value) else None
        if bucket is None or bucket > LONG_MAX:
            out.problems.append(
                f"cursor property {_one_line(key, 80)} names no ledger: "
                f"{_one_line(repr(value), 80)}"
            )
            continue
        if bucket >= 0:
            out.refs.append(ref(bucket, RefKind.DELAYED_BUCKET))
    return out


def schema_refs(schema_id: str, znode: str, data: bytes) -> list[LedgerRef]:
    """The ledgers a schema locator points at (the latest version and the index), each
    ledger once; a negative ledger id (Pulsar's placeholder) names none."""
    locator = decode_schema_locator(data)
    namespace = namespace_of_schema_id(schema_id)
    seen: set[int] = set()
    refs: list[LedgerRef] = []
    for entry in [locator.info, *locator.index]:
        lid = entry.position.ledgerId
        if lid < 0 or lid in seen:
            continue
        seen.add(lid)
        refs.append(LedgerRef(lid, RefKind.SCHEMA, schema_id, None, namespace, znode))
    return refs
