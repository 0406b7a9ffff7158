"""The index's shortcut from znode bytes to packed records (`index.decode`) against the full
decoder: the same record for every input, valid or not, and the shortcut taken for what
Java writes today (v3), so that the agreement is not won by always falling back."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.protocol.states import ZnodeStat

from auditor.index.decode import pack_decoded, pack_v3, pack_znode
from auditor.index.packed import Tables, is_error, pack, pack_error, unpack
from auditor.index.store import MetadataIndex
from auditor.metadata.layout import LedgerManager
from auditor.metadata.model import DigestType, LedgerMetadata, LedgerState, Segment
from auditor.metadata.serde import (
    HEADER_PREFIX,
    LedgerMetadataFormatError,
    decode_ledger_metadata,
    encode_ledger_metadata,
    varint,
)
from auditor.metadata.textformat import EscapeStyle
from auditor.metadata.walk import LedgerRecord
from auditor.proto.data_formats_pb2 import LedgerMetadataFormat

PROPERTY = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

INT64 = st.integers(-(2**63), 2**63 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
BOOKIE_IDS = st.one_of(
    st.sampled_from(["10.0.0.1:3181", "10.0.0.2:3181", "bookie-3.example:3181", "b4"]),
    st.from_regex(r"[a-zA-Z0-9:-_.\-]{1,12}", fullmatch=True),
)
#: Ids BookieId.parse refuses (and so the full decoder).
BAD_BOOKIE_IDS = st.sampled_from(["readonly", "ReadOnly", "a b", "", "x/y", "é:3181"])


@dataclasses.dataclass(frozen=True)
class Znode:
    ledger_id: int
    data: bytes
    version: int
    ctime: int


def _agree(z: Znode) -> bytes:
    """Both ways from fresh tables give the same bytes (so the same numbering too); the
    record is returned for further checks."""
    fast = pack_znode(z.ledger_id, z.data, z.version, z.ctime, Tables())
    full = pack_decoded(z.ledger_id, z.data, z.version, z.ctime, Tables())
    assert fast == full
    try:
        decode_ledger_metadata(z.data, z.ledger_id, znode_ctime=z.ctime)
    except LedgerMetadataFormatError:
        # What the full decoder refuses, the shortcut refuses too (leaves it to the
        # full decoder, whose reason is what the record holds).
        assert pack_v3(z.data, z.version, z.ctime, Tables()) is None
        assert is_error(fast)
    return fast


# ---------------------------------------------------------------------------
# Metadata as Java could hold it, in every format


@st.composite
def metadata(draw: st.DrawFn, version: int) -> LedgerMetadata:
    """Valid metadata: closed, open or in recovery; one to four segments; with or without
    password, ctime, cToken and custom metadata (v2, v3)."""
    ensemble = draw(st.integers(1, 6))
    write = draw(st.integers(1, ensemble))
    ack = write if version == 1 else draw(st.integers(1, write))
    firsts = sorted(draw(st.sets(INT64, min_size=1, max_size=4)))
    segments = tuple(
        Segment(f, tuple(draw(st.lists(BOOKIE_IDS, min_size=ensemble, max_size=ensemble))))
        for f in firsts
    )
    state = draw(st.sampled_from(LedgerState))
    last, length = -1, 0
    if state is LedgerState.CLOSED:
        last = draw(INT64)
        length = draw(st.integers(0, 2**63 - 1))
    common: dict[str, Any] = {
        "ledger_id": draw(st.integers(0, 2**63 - 1)),
        "format_version": version,
        "ensemble_size": ensemble,
        "write_quorum": write,
        "ack_quorum": ack,
        "state": state,
        "segments": segments,
        "last_entry_id": last,
        "length": length,
    }
    if version == 1:
        return LedgerMetadata(**common)
    stored = draw(st.booleans())
    return LedgerMetadata(
        **common,
        digest_type=draw(st.sampled_from(DigestType)),
        password=draw(st.sampled_from([b"", b"secret"]) | st.binary(max_size=24)),
        ctime=draw(INT64) if stored else -1,
        ctime_stored=stored,
        ctoken=draw(st.none() | INT64) if version == 3 else None,
        custom_metadata=tuple(
            draw(st.dictionaries(st.text(max_size=8), st.binary(max_size=40), max_size=4)).items()
        ),
    )


ZNODE_FIELDS = st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**45))


@pytest.mark.parametrize("version", [1, 2, 3])
@PROPERTY
@given(data=st.data())
def test_valid_metadata_packs_the_same_either_way(version: int, data: st.DataObject) -> None:
    md = data.draw(metadata(version))
    style = data.draw(st.sampled_from(list(EscapeStyle)))
    encoded = encode_ledger_metadata(md, text_style=style)
    znode_version, znode_ctime = data.draw(ZNODE_FIELDS)
    record = _agree(Znode(md.ledger_id, encoded, znode_version, znode_ctime))
    tables = Tables()
    fast = pack_v3(encoded, znode_version, znode_ctime, tables)
    if version == 3:
        # The shortcut is the way v3 goes, not a fallback that happens to agree.
        assert fast == record
        # Every field the index keeps, as the full decoder reads it.
        decoded = decode_ledger_metadata(encoded, md.ledger_id, znode_ctime=znode_ctime)
        assert unpack(md.ledger_id, fast, tables) == dataclasses.replace(
            decoded, custom_metadata=()
        )
    else:
        assert fast is None


def test_a_two_byte_length_varint_takes_the_shortcut() -> None:
    md = LedgerMetadata(
        ledger_id=9,
        format_version=3,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        state=LedgerState.CLOSED,
        segments=(Segment(0, ("a:1", "b:1", "c:1")), Segment(50, ("a:1", "d:1", "c:1"))),
        last_entry_id=99,
        length=4096,
        digest_type=DigestType.CRC32C,
        password=b"",
        ctime=1_700_000_000_000,
        ctime_stored=True,
        ctoken=123,
        custom_metadata=(("application", b"pulsar"), ("pulsar/managed-ledger", b"x" * 200)),
    )
    encoded = encode_ledger_metadata(md)
    assert encoded[len(HEADER_PREFIX) + 2] >= 0x80  # the length takes two bytes
    tables = Tables()
    fast = pack_v3(encoded, 4, 1, tables)
    assert fast is not None
    assert unpack(9, fast, tables) == dataclasses.replace(md, custom_metadata=())


# ---------------------------------------------------------------------------
# Protobuf messages with any field present or absent and values at and past the rules


STATES = [LedgerMetadataFormat.OPEN, LedgerMetadataFormat.IN_RECOVERY, LedgerMetadataFormat.CLOSED]
DIGESTS = [
    LedgerMetadataFormat.CRC32,
    LedgerMetadataFormat.HMAC,
    LedgerMetadataFormat.CRC32C,
    LedgerMetadataFormat.DUMMY,
]
BREAKS = [
    "no quorumSize",
    "no ensembleSize",
    "no length",
    "no state",
    "no firstEntryId",
    "write quorum above ensemble",
    "ack quorum 0",
    "ack quorum negative",
    "ack quorum above write",
    "quorums 0",
    "closed with negative length",
    "no segments",
    "a member short",
    "a member more",
    "first entry ids not increasing",
    "a bad bookie id",
]


@st.composite
def format_messages(draw: st.DrawFn) -> bytes:
    """The body of a `LedgerMetadataFormat`: valid, with optional fields present or not
    and values at their edges, then broken in up to two ways the rules refuse (a field
    missing, quorums, lengths, segments, bookie ids)."""
    ensemble = draw(st.integers(1, 5))
    write = draw(st.integers(1, ensemble))
    msg = LedgerMetadataFormat(
        quorumSize=write,
        ensembleSize=ensemble,
        length=draw(st.integers(0, 2) | st.integers(0, 2**63 - 1)),
        state=draw(st.sampled_from(STATES)),
    )
    if draw(st.booleans()):
        msg.lastEntryId = draw(st.integers(-2, 2) | INT64)
    for first in sorted(draw(st.sets(st.integers(-1, 3) | INT64, min_size=1, max_size=3))):
        members = draw(st.lists(BOOKIE_IDS, min_size=ensemble, max_size=ensemble))
        msg.segment.add(firstEntryId=first, ensembleMember=members)
    if draw(st.booleans()):
        msg.digestType = draw(st.sampled_from(DIGESTS))
    if draw(st.booleans()):
        msg.password = draw(st.sampled_from([b"", b"pw"]))
    if draw(st.booleans()):
        msg.ackQuorumSize = draw(st.integers(1, write))
    if draw(st.booleans()):
        msg.ctime = draw(st.integers(-1, 1) | INT64)
    for key in draw(st.lists(st.text(max_size=4), max_size=2)):
        msg.customMetadata.add(key=key, value=b"v")
    if draw(st.booleans()):
        msg.cToken = draw(st.integers(-1, 1) | INT64)
    for broken in draw(st.sets(st.sampled_from(BREAKS), max_size=2)):
        _break(msg, broken, draw)
    return msg.SerializePartialToString()


def _break(msg: LedgerMetadataFormat, how: str, draw: st.DrawFn) -> None:
    seg = msg.segment[draw(st.integers(0, len(msg.segment) - 1))] if msg.segment else None
    if how.startswith("no ") and how != "no segments":
        field = how[3:]
        if field != "firstEntryId":
            msg.ClearField(field)  # type: ignore[arg-type]
        elif seg is not None:  # "no segments" may have come first: nothing to clear then
            seg.ClearField("firstEntryId")
    elif how == "write quorum above ensemble":
        msg.quorumSize = msg.ensembleSize + 1
    elif how == "ack quorum 0":
        msg.ackQuorumSize = 0
    elif how == "ack quorum negative":
        msg.ackQuorumSize = draw(st.integers(-(2**31), -1))
    elif how == "ack quorum above write":
        msg.ackQuorumSize = msg.quorumSize + 1
    elif how == "quorums 0":
        msg.quorumSize = msg.ackQuorumSize = 0
    elif how == "closed with negative length":
        msg.state = LedgerMetadataFormat.CLOSED
        msg.length = draw(st.integers(-(2**63), -1))
    elif how == "no segments":
        msg.ClearField("segment")
    elif how == "a member short" and seg is not None:
        del seg.ensembleMember[-1]
    elif how == "a member more" and seg is not None:
        seg.ensembleMember.append(draw(BOOKIE_IDS))
    elif how == "first entry ids not increasing" and len(msg.segment) > 1:
        msg.segment[1].firstEntryId = msg.segment[0].firstEntryId
    elif how == "a bad bookie id" and seg is not None and len(seg.ensembleMember):
        seg.ensembleMember[draw(st.integers(0, len(seg.ensembleMember) - 1))] = draw(BAD_BOOKIE_IDS)


def _v3(body: bytes) -> bytes:
    return HEADER_PREFIX + b"3\n" + varint(len(body)) + body


@PROPERTY
@given(format_messages(), ZNODE_FIELDS)
def test_any_v3_message_packs_the_same_either_way(body: bytes, znode: tuple[int, int]) -> None:
    _agree(Znode(77, _v3(body), *znode))


MUTATION = st.tuples(
    st.sampled_from(["flip", "set", "delete", "insert", "truncate"]),
    st.integers(0, 10**6),
    st.integers(0, 255),
)


def _mutate(data: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(data)
    for kind, where, value in mutations:
        if not buf:
            break
        i = where % len(buf)
        if kind == "flip":
            buf[i] ^= 1 << (value % 8)
        elif kind == "set":
            buf[i] = value
        elif kind == "delete":
            del buf[i]
        elif kind == "insert":
            buf.insert(i, value)
        else:
            del buf[i:]
    return bytes(buf)


@PROPERTY
@given(st.data(), st.sampled_from([1, 2, 3]), st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_metadata_packs_the_same_either_way(
    data: st.DataObject, version: int, mutations: list[tuple[str, int, int]]
) -> None:
    md = data.draw(metadata(version))
    _agree(Znode(md.ledger_id, _mutate(encode_ledger_metadata(md), mutations), 1, 2))


@PROPERTY
@given(
    st.sampled_from([b"", HEADER_PREFIX + b"3\n", HEADER_PREFIX + b"03\n", HEADER_PREFIX]),
    st.binary(max_size=200),
)
def test_random_bytes_pack_the_same_either_way(prefix: bytes, tail: bytes) -> None:
    _agree(Znode(5, prefix + tail, 0, 0))


# ---------------------------------------------------------------------------
# Refusals, each named as the full decoder names it


def _valid() -> LedgerMetadataFormat:
    msg = LedgerMetadataFormat(
        quorumSize=2, ensembleSize=3, length=10, lastEntryId=4, state=LedgerMetadataFormat.CLOSED
    )
    msg.segment.add(firstEntryId=0, ensembleMember=["a:1", "b:1", "c:1"])
    return msg


def _reason(data: bytes) -> str:
    with pytest.raises(LedgerMetadataFormatError) as raised:
        decode_ledger_metadata(data, 3)
    return raised.value.reason


@pytest.mark.parametrize(
    "data",
    [
        # A member, then a custom metadata key, that is not UTF-8 (protobuf parses both).
        _v3(_valid().SerializeToString().replace(b"b:1", b"\xff:1")),
        _v3(
            (lambda m: (m.customMetadata.add(key="kk", value=b""), m)[1])(_valid())
            .SerializeToString()
            .replace(b"kk", b"\xc3\x28")
        ),
        _v3(_valid().SerializeToString().replace(b"b:1", b"b 1")),  # not a BookieId
        _v3(_valid().SerializePartialToString()[:-3]),  # truncated inside the segment
        _v3(b""),  # required fields missing
        HEADER_PREFIX + b"3\n" + b"\xff\xff\xff\xff\x0f",  # a negative length
        HEADER_PREFIX + b"4\n",  # a version that does not exist
    ],
)
def test_refusals_are_recorded_with_the_full_decoders_reason(data: bytes) -> None:
    tables = Tables()
    assert pack_v3(data, 1, 0, tables) is None
    record = pack_znode(3, data, 1, 0, tables)
    assert record == pack_error(_reason(data), 1, Tables())
    assert len(tables.bookies) == 0  # a refused ledger numbers none of its bookies


def test_the_index_holds_the_same_records_either_way() -> None:
    """`put_znodes` (the load) and `put` (a re-read) fill the index alike, refusals too."""
    good = encode_ledger_metadata(
        LedgerMetadata(
            ledger_id=1,
            format_version=3,
            ensemble_size=2,
            write_quorum=2,
            ack_quorum=1,
            state=LedgerState.OPEN,
            segments=(Segment(0, ("a:1", "b:1")),),
            digest_type=DigestType.CRC32,
            password=b"pw",
        )
    )
    bad = good[:-2]

    def stat(version: int, ctime: int) -> ZnodeStat:
        return ZnodeStat(1, 1, ctime, ctime, version, 0, 0, 0, len(good), 0, 1)

    by_load = MetadataIndex("/ledgers", LedgerManager.HIERARCHICAL)
    by_load.put_znodes([(1, "p1", good, stat(3, 1000)), (2, "p2", bad, stat(4, 2000))])
    by_put = MetadataIndex("/ledgers", LedgerManager.HIERARCHICAL)
    for ledger_id, data, version, ctime in ((1, good, 3, 1000), (2, bad, 4, 2000)):
        try:
            md: LedgerMetadata | None = decode_ledger_metadata(data, ledger_id, ctime)
            error = None
        except LedgerMetadataFormatError as exc:
            md, error = None, exc
        by_put.put(LedgerRecord(ledger_id, "", md, version, error))

    def seen(index: MetadataIndex) -> list[tuple[Any, ...]]:
        return [
            (r.ledger_id, r.path, r.metadata, r.znode_version, r.error and r.error.reason)
            for r in index.records()
        ]

    assert seen(by_load) == seen(by_put)
    loaded = list(by_load.records())
    assert loaded[0].metadata is not None and loaded[0].metadata.ctime == 1000
    assert loaded[1].error is not None and loaded[1].znode_version == 4
    assert loaded[1].error.reason == _reason(bad)
    assert pack(loaded[0].metadata, 3, Tables()) == pack_znode(1, good, 3, 1000, Tables())
