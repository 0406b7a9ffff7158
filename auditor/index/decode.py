"""The index reads every ledger of the cluster at each (re)load, and decoding each znode into
the model's objects (`LedgerMetadata`, its segments, their validation) and packing those costs
about three times the ZooKeeper read it came from; this packs the common case straight from
the znode's bytes, so that a standby is ready sooner after a start or a lost watch.

Ledger znode bytes -> the index's packed record, without building the model's objects.

`serde.decode_ledger_metadata` stays the one decoder of record: every format, every rule
Java's builder applies, the exact reason for every refusal. `pack_znode` is a shortcut
beside it for what nearly every cluster stores today, v3 (binary protobuf) metadata: one
protobuf parse (upb, in C), the same rules applied to the fields read, and the fields the
index keeps packed as `packed.pack` packs them, bookie ids and the password interned only
once the whole ledger has passed. Whatever it is not sure of (another format version, a
header or a length varint spelled unusually, bytes protobuf will not parse, required fields
missing, any rule broken, text that is not UTF-8) it does not judge: it hands the bytes to
the full decoder, whose metadata, or refusal with its reason, is what the index stores.
The shortcut can make a load faster and never changes what the index holds:
`tests/unit/test_index_decode.py` checks, over generated metadata of every kind and
mutations of it, that both ways give the same record.
"""

from __future__ import annotations

import struct
from typing import Final

from auditor.index.packed import (
    CTIME_STORED,
    HAS_CTOKEN,
    HEADER,
    NO_PASSWORD,
    Tables,
    pack,
    pack_error,
)
from auditor.metadata.serde import (
    HEADER_PREFIX,
    LedgerMetadataFormatError,
    decode_ledger_metadata,
    is_valid_bookie_id,
)
from auditor.proto.data_formats_pb2 import LedgerMetadataFormat

#: The header of v3 metadata as Java writes it (any other spelling goes the full way).
_V3: Final = HEADER_PREFIX + b"3\n"
_V3_LEN: Final = len(_V3)
_FORMAT_V3: Final = 3
_CLOSED: Final = 3
_OPEN_STATES: Final = (1, 2)
_DIGESTS: Final = (1, 2, 3, 4)
_parse: Final = LedgerMetadataFormat.FromString

#: A segment's packed form (first entry id, then its bookies' numbers) by ensemble size;
#: and a one-segment ledger's whole record (header and segment) in one.
_SEGMENT: dict[int, struct.Struct] = {}
_ONE_SEGMENT: dict[int, struct.Struct] = {}


def _segment_struct(ensemble_size: int) -> struct.Struct:
    s = _SEGMENT.get(ensemble_size)
    if s is None:
        s = _SEGMENT[ensemble_size] = struct.Struct(f"<q{ensemble_size}H")
    return s


def _one_segment_struct(ensemble_size: int) -> struct.Struct:
    s = _ONE_SEGMENT.get(ensemble_size)
    if s is None:
        s = _ONE_SEGMENT[ensemble_size] = struct.Struct(
            HEADER.format + _segment_struct(ensemble_size).format[1:]
        )
    return s


def pack_znode(
    ledger_id: int, data: bytes, version: int, znode_ctime: int, tables: Tables
) -> bytes:
    """The packed record of one ledger znode: what `packed.pack` makes of the full
    decoder's metadata (or `packed.pack_error` of its refusal), the same bytes."""
    record = pack_v3(data, version, znode_ctime, tables)
    if record is None:
        record = pack_decoded(ledger_id, data, version, znode_ctime, tables)
    return record


def pack_decoded(
    ledger_id: int, data: bytes, version: int, znode_ctime: int, tables: Tables
) -> bytes:
    """The full decoder's way: its metadata packed, or its refusal's reason."""
    try:
        md = decode_ledger_metadata(data, ledger_id, znode_ctime=znode_ctime)
    except LedgerMetadataFormatError as exc:
        return pack_error(exc.reason, version, tables)
    return pack(md, version, tables)


def pack_v3(data: bytes, version: int, znode_ctime: int, tables: Tables) -> bytes | None:
    """The packed record of v3 metadata that passes every rule, or None for anything
    else (the full decoder then decides, and names what is wrong)."""
    if not data.startswith(_V3):
        return None
    size = len(data)
    if size <= _V3_LEN:
        return None
    # The length varint: one or two bytes cover messages below 16 KiB.
    first = data[_V3_LEN]
    if first < 0x80:
        length, start = first, _V3_LEN + 1
    elif size > _V3_LEN + 1 and data[_V3_LEN + 1] < 0x80:
        length, start = (first & 0x7F) | (data[_V3_LEN + 1] << 7), _V3_LEN + 2
    else:
        return None
    if size - start < length:
        return None
    try:
        fmt = _parse(data[start : start + length])
    except Exception:  # DecodeError or anything else: the full decoder names it
        return None
    if not fmt.IsInitialized():
        return None
    # An optional field read as 0 may be absent (then HasField says so) or stored as 0.
    ensemble_size = fmt.ensembleSize
    write_quorum = fmt.quorumSize
    ack_quorum = fmt.ackQuorumSize
    if not ack_quorum and not fmt.HasField("ackQuorumSize"):
        ack_quorum = write_quorum
    if not 1 <= ack_quorum <= write_quorum <= ensemble_size:
        return None
    state = fmt.state
    if state == _CLOSED:
        last_entry_id, ledger_length = fmt.lastEntryId, fmt.length
        if ledger_length < 0:
            return None
    elif state in _OPEN_STATES:
        last_entry_id, ledger_length = -1, 0
    else:
        return None
    password: bytes | None = fmt.password
    digest = 0
    if password or fmt.HasField("password"):
        digest = fmt.digestType
        if digest not in _DIGESTS:
            return None
    else:
        password = None
    if fmt.customMetadata:
        for entry in fmt.customMetadata:
            # Not kept, but a key that is not text is a refusal (serde's `_text`).
            if type(entry.key) is not str:
                return None
    segments = fmt.segment
    if not segments:
        return None
    # Bookie ids already numbered passed these rules before; the others are checked here
    # and numbered only once the whole ledger has passed.
    known = tables.bookies.numbers.get
    ensembles: list[tuple[int, list[int | None], list[str]]] = []
    previous: int | None = None
    fresh = False
    for seg in segments:
        first_entry_id = seg.firstEntryId
        if previous is not None and first_entry_id <= previous:
            return None
        previous = first_entry_id
        members = seg.ensembleMember[:]
        if len(members) != ensemble_size:
            return None
        numbers = [known(m) for m in members]
        if None in numbers:
            for member in members:
                if type(member) is not str or not is_valid_bookie_id(member):
                    return None
            fresh = True
        ensembles.append((first_entry_id, numbers, members))
    ctime = fmt.ctime
    if ctime or fmt.HasField("ctime"):
        flags = CTIME_STORED
    else:
        ctime, flags = znode_ctime, 0
    ctoken = fmt.cToken
    if ctoken or fmt.HasField("cToken"):
        flags |= HAS_CTOKEN
    # Every rule passed: only now is anything numbered.
    password_number = NO_PASSWORD
    if password is not None:
        known_password = tables.passwords.numbers.get(password)
        password_number = (
            tables.passwords.number(password) if known_password is None else known_password
        )
    if fresh:
        number = tables.bookies.number
        ensembles = [
            (first, [number(m) for m in members], members) for first, _, members in ensembles
        ]
    head = (
        version,
        _FORMAT_V3,
        state,
        ensemble_size,
        write_quorum,
        ack_quorum,
        digest,
        flags,
        password_number,
        last_entry_id,
        ledger_length,
        ctime,
        ctoken,
        len(ensembles),
    )
    if len(ensembles) == 1:
        first_entry_id, numbers, _ = ensembles[0]
        whole = _ONE_SEGMENT.get(ensemble_size) or _one_segment_struct(ensemble_size)
        return whole.pack(*head, first_entry_id, *numbers)
    segment = _segment_struct(ensemble_size)
    parts = [HEADER.pack(*head)]
    for first_entry_id, numbers, _ in ensembles:
        parts.append(segment.pack(first_entry_id, *numbers))
    return b"".join(parts)
