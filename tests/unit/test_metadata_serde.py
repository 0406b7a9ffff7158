"""Ledger metadata serde and the small ZooKeeper records, against BookKeeper's bytes.

The golden vectors come from upstream's TestLedgerMetadataSerDe (spec §4.7), and
are kept in tests/vectors so that the suite reads nothing outside the repository.
"""

from __future__ import annotations

import base64
import dataclasses
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from auditor.errors import FormatError
from auditor.metadata.model import DigestType, LedgerMetadata, LedgerState, Segment
from auditor.metadata.paths import InvalidLedgerIdError
from auditor.metadata.records import (
    BASIC_REREPLICATION_LAYOUT,
    UNASSIGNED_CTIME,
    BookieServiceInfo,
    CheckKind,
    Cookie,
    Endpoint,
    RecordFormatError,
    RereplicationLayout,
    UnderreplicatedLedgerRecord,
    decode_auditor_vote,
    decode_bookie_service_info,
    decode_check_ctime,
    decode_cookie,
    decode_lock_data,
    decode_rereplication_layout,
    decode_underreplicated_ledger,
    encode_auditor_vote,
    encode_bookie_service_info,
    encode_check_ctime,
    encode_cookie,
    encode_lock_data,
    encode_rereplication_layout,
    encode_underreplicated_ledger,
)
from auditor.metadata.serde import (
    HEADER_PREFIX,
    LedgerMetadataFormatError,
    decode_ledger_metadata,
    encode_ledger_metadata,
    is_valid_bookie_id,
    java_read_lines,
    java_split_tabs,
    parse_java_int,
    read_format_version,
)
from auditor.metadata.textformat import EscapeStyle
from auditor.proto.data_formats_pb2 import LedgerMetadataFormat
from tests.vectors import load

VECTORS: dict[str, Any] = load("ledger-metadata.json")
GOLDEN = {v["name"]: v for v in VECTORS["vectors"]}

FAST = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

BOOKIES = ("192.0.2.1:3181", "192.0.2.2:3181", "192.0.2.3:3181")
MAX_LONG = 2**63 - 1


def _b64(name: str) -> bytes:
    return base64.b64decode(GOLDEN[name]["base64"])


def _md(**overrides: Any) -> LedgerMetadata:
    base: dict[str, Any] = {
        "ledger_id": 7,
        "format_version": 3,
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "state": LedgerState.OPEN,
        "segments": (Segment(0, BOOKIES),),
        "digest_type": DigestType.CRC32C,
        "password": b"pw",
    }
    base.update(overrides)
    return LedgerMetadata(**base)


def _v2(body: str) -> bytes:
    return HEADER_PREFIX + b"2\n" + body.encode()


def _v3(msg: LedgerMetadataFormat) -> bytes:
    raw = msg.SerializeToString()
    assert len(raw) < 128
    return HEADER_PREFIX + b"3\n" + bytes([len(raw)]) + raw


def _valid_format() -> LedgerMetadataFormat:
    msg = LedgerMetadataFormat(
        quorumSize=2, ensembleSize=3, length=0, state=LedgerMetadataFormat.OPEN
    )
    msg.segment.add(firstEntryId=0, ensembleMember=BOOKIES)
    return msg


# ---------------------------------------------------------------------------
# Golden vectors


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_vector_decodes_to_listed_values(name: str) -> None:
    expect = GOLDEN[name]["expect"]
    md = decode_ledger_metadata(_b64(name), 59)
    assert md.ledger_id == 59
    assert md.format_version == expect["format_version"]
    assert md.write_quorum == expect["write_quorum"]
    assert md.ensemble_size == expect["ensemble_size"]
    assert md.ack_quorum == expect["ack_quorum"]
    assert md.length == expect["length"]
    assert md.state is LedgerState[expect["state"]]
    assert md.last_entry_id == expect["last_entry_id"]
    assert {str(s.first_entry_id): list(s.bookies) for s in md.segments} == expect["ensembles"]
    digest = expect["digest_type"]
    assert md.digest_type is (None if digest is None else DigestType[digest])
    password = expect["password"]
    assert md.password == (None if password is None else password.encode())
    assert md.ctime == expect["ctime"]
    assert md.ctime_stored is expect["ctime_stored"]
    assert md.ctoken == expect["ctoken"]
    assert md.custom_metadata == ()


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_vector_reencodes_byte_identically(name: str) -> None:
    data = _b64(name)
    assert encode_ledger_metadata(decode_ledger_metadata(data, 59)) == data
    # The v2 vectors contain no byte where the two Java writers differ.
    md = decode_ledger_metadata(data, 59)
    assert encode_ledger_metadata(md, text_style=EscapeStyle.PROTOBUF_JAVA) == data


@pytest.mark.parametrize("case", VECTORS["must_fail"], ids=lambda c: str(c["name"]))
def test_golden_must_fail(case: dict[str, str]) -> None:
    with pytest.raises(LedgerMetadataFormatError):
        decode_ledger_metadata(base64.b64decode(case["base64"]), 59)


@pytest.mark.parametrize("seed", range(20))
def test_thousand_random_bytes_fail(seed: int) -> None:
    data = random.Random(seed).randbytes(1000)
    with pytest.raises(LedgerMetadataFormatError):
        decode_ledger_metadata(data, 59)


def test_error_names_the_ledger_and_is_a_format_error() -> None:
    with pytest.raises(LedgerMetadataFormatError) as info:
        decode_ledger_metadata(b"junk", 1234)
    assert isinstance(info.value, FormatError)
    assert info.value.ledger_id == 1234
    assert str(info.value).startswith("ledger 1234: ")


def test_bad_ledger_id_argument_is_a_caller_bug() -> None:
    with pytest.raises(ValueError):
        decode_ledger_metadata(_b64("version3"), -1)
    with pytest.raises(ValueError):
        decode_ledger_metadata(_b64("version3"), 2**63)
    # The one rule for ledger ids, and its error.
    with pytest.raises(
        InvalidLedgerIdError, match=r"^a ledger id is 0\.\.9223372036854775807, got"
    ):
        decode_ledger_metadata(_b64("version3"), 2**63)


# ---------------------------------------------------------------------------
# Header


def test_header_versions() -> None:
    v3_body = _b64("version3")[len(HEADER_PREFIX) + 2 :]
    assert read_format_version(_b64("version1")) == (1, len(HEADER_PREFIX) + 2)
    # Java parses with Integer.parseInt over at most 9 bytes before the LF.
    for version in (b"000000003", b"+3"):
        md = decode_ledger_metadata(HEADER_PREFIX + version + b"\n" + v3_body, 59)
        assert md.format_version == 3
    for bad in (b"0000000003", b"0", b"4", b"-1", b"", b" 3", b"3 ", b"\xd9\xa3"):
        with pytest.raises(LedgerMetadataFormatError):
            decode_ledger_metadata(HEADER_PREFIX + bad + b"\n" + v3_body, 59)
    for bad_prefix in (b"BookieMetadataFormatVersion 3\n", b"bookieMetadataFormatVersion\t3\n"):
        with pytest.raises(LedgerMetadataFormatError):
            decode_ledger_metadata(bad_prefix + v3_body, 59)
    with pytest.raises(LedgerMetadataFormatError):
        read_format_version(b"nope")


# ---------------------------------------------------------------------------
# ctime: stored value versus znode ctime (§4.5, §4.7 "other tests")


@pytest.mark.parametrize("version", [2, 3])
def test_stored_ctime_wins_over_znode_ctime(version: int) -> None:
    md = _md(format_version=version, ctime=123456, ctime_stored=True)
    back = decode_ledger_metadata(encode_ledger_metadata(md), 7, znode_ctime=654321)
    assert (back.ctime, back.ctime_stored) == (123456, True)


@pytest.mark.parametrize("version", [2, 3])
def test_missing_ctime_takes_znode_ctime(version: int) -> None:
    md = _md(format_version=version)
    data = encode_ledger_metadata(md)
    msg = LedgerMetadataFormat()
    if version == 2:
        assert b"ctime" not in data
    else:
        msg.ParseFromString(data[len(HEADER_PREFIX) + 3 :])
        assert not msg.HasField("ctime")
    first = decode_ledger_metadata(data, 7, znode_ctime=654321)
    assert (first.ctime, first.ctime_stored) == (654321, False)
    second = decode_ledger_metadata(encode_ledger_metadata(first), 7, znode_ctime=98765)
    assert (second.ctime, second.ctime_stored) == (98765, False)
    assert decode_ledger_metadata(data, 7).ctime == -1


def test_v1_never_uses_znode_ctime() -> None:
    md = decode_ledger_metadata(_b64("version1"), 59, znode_ctime=654321)
    assert (md.ctime, md.ctime_stored) == (-1, False)


def test_golden_v2_takes_znode_ctime_only_without_stored_ctime() -> None:
    assert decode_ledger_metadata(_b64("version2"), 59, znode_ctime=42).ctime == 42
    assert decode_ledger_metadata(_b64("version2ctime"), 59, znode_ctime=42).ctime == 1544002383075
    # v3 golden has ctime -1 present: stored, so the znode ctime is ignored.
    assert decode_ledger_metadata(_b64("version3"), 59, znode_ctime=42).ctime == -1


# ---------------------------------------------------------------------------
# Ledger ids and passwords


@pytest.mark.parametrize("ledger_id", [0, 2147483646, 2147483647, MAX_LONG])
@pytest.mark.parametrize("version", [1, 2, 3])
def test_large_ledger_ids_round_trip(ledger_id: int, version: int) -> None:
    md = _md(ledger_id=ledger_id, format_version=version)
    if version == 1:
        md = dataclasses.replace(md, digest_type=None, password=None, ack_quorum=2)
    back = decode_ledger_metadata(encode_ledger_metadata(md), ledger_id)
    assert back == md


@pytest.mark.parametrize("style", list(EscapeStyle))
def test_every_password_byte_round_trips_in_v2(style: EscapeStyle) -> None:
    for b in range(256):
        md = _md(format_version=2, password=bytes([b]) * 2 + b"x")
        data = encode_ledger_metadata(md, text_style=style)
        assert decode_ledger_metadata(data, 7) == md
    md = _md(format_version=2, password=bytes(range(256)))
    data = encode_ledger_metadata(md, text_style=style)
    assert decode_ledger_metadata(data, 7).password == bytes(range(256))
    assert data.isascii()


def test_v2_password_spelling_per_style() -> None:
    md = _md(format_version=2, password=b"\x07\x0b\x00\"'\\\xff")
    assert b'password: "\\007\\013\\000\\"\\\'\\\\\\377"\n' in encode_ledger_metadata(md)
    java = encode_ledger_metadata(md, text_style=EscapeStyle.PROTOBUF_JAVA)
    assert b'password: "\\a\\v\\000\\"\\\'\\\\\\377"\n' in java


def test_v2_password_java_escape_forms_parse() -> None:
    body = (
        "quorumSize: 2\nensembleSize: 3\nlength: 0\nlastEntryId: -1\nstate: OPEN\n"
        'segment {\n  ensembleMember: "192.0.2.1:3181"\n  ensembleMember: "192.0.2.2:3181"\n'
        '  ensembleMember: "192.0.2.3:3181"\n  firstEntryId: 0\n}\n'
        "digestType: HMAC\n"
        'password: "\\a\\001\\x01\\"\\\\\\\'\\v\\?\\377"\n'
    )
    md = decode_ledger_metadata(_v2(body), 7)
    assert md.password == b"\x07\x01\x01\"\\'\x0b?\xff"
    assert md.digest_type is DigestType.HMAC


# ---------------------------------------------------------------------------
# Decode rules (§4.6)


def test_ack_quorum_defaults_to_write_quorum() -> None:
    msg = _valid_format()
    assert decode_ledger_metadata(_v3(msg), 7).ack_quorum == 2
    msg.ackQuorumSize = 1
    assert decode_ledger_metadata(_v3(msg), 7).ack_quorum == 1


@pytest.mark.parametrize("state", [LedgerMetadataFormat.OPEN, LedgerMetadataFormat.IN_RECOVERY])
def test_not_closed_forces_last_entry_and_length(
    state: LedgerMetadataFormat.State.ValueType,
) -> None:
    msg = _valid_format()
    msg.state = state
    msg.lastEntryId = 55
    msg.length = 1000
    md = decode_ledger_metadata(_v3(msg), 7)
    assert (md.last_entry_id, md.length) == (-1, 0)


def test_closed_takes_last_entry_and_length() -> None:
    msg = _valid_format()
    msg.state = LedgerMetadataFormat.CLOSED
    msg.lastEntryId = 55
    msg.length = 1000
    md = decode_ledger_metadata(_v3(msg), 7)
    assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 55, 1000)
    # Java's getter for an absent optional lastEntryId returns 0, and so do we.
    msg.ClearField("lastEntryId")
    assert decode_ledger_metadata(_v3(msg), 7).last_entry_id == 0


def test_password_and_digest_only_with_password() -> None:
    msg = _valid_format()
    msg.digestType = LedgerMetadataFormat.HMAC
    md = decode_ledger_metadata(_v3(msg), 7)
    assert (md.password, md.digest_type) == (None, None)
    msg.password = b""
    md = decode_ledger_metadata(_v3(msg), 7)
    assert (md.password, md.digest_type) == (b"", DigestType.HMAC)
    msg.ClearField("digestType")
    assert decode_ledger_metadata(_v3(msg), 7).digest_type is DigestType.CRC32


def test_ctoken_and_custom_metadata() -> None:
    msg = _valid_format()
    msg.cToken = 99
    msg.customMetadata.add(key="a", value=b"1")
    msg.customMetadata.add(key="b", value=b"2")
    msg.customMetadata.add(key="a", value=b"3")  # a HashMap in Java: the last one wins
    md = decode_ledger_metadata(_v3(msg), 7)
    assert md.ctoken == 99
    assert md.custom_metadata == (("a", b"3"), ("b", b"2"))


def test_v2_ctoken_is_read_but_never_written() -> None:
    data = encode_ledger_metadata(_md(format_version=2, ctoken=5))
    assert b"cToken" not in data
    text = data.decode() + "cToken: 5\n"
    md = decode_ledger_metadata(text.encode(), 7)
    assert md.ctoken == 5
    assert encode_ledger_metadata(md) == data


def test_v3_trailing_bytes_are_ignored() -> None:
    data = _b64("version3")
    assert decode_ledger_metadata(data + b"\x00garbage", 59) == decode_ledger_metadata(data, 59)


def test_v1_details() -> None:
    header = HEADER_PREFIX + b"1\n"
    closed = header + b"2\n3\n100\n0\ta:1\tb:1\tc:1\n10\td:1\te:1\tf:1\n20\tCLOSED"
    md = decode_ledger_metadata(closed, 9)
    assert (md.state, md.last_entry_id, md.length, md.ack_quorum) == (
        LedgerState.CLOSED,
        20,
        100,
        2,
    )
    assert [s.first_entry_id for s in md.segments] == [0, 10]
    assert encode_ledger_metadata(md) == closed
    # An open v1 ledger ends with the LF of its last ensemble, and its length reads as 0.
    opened = header + b"2\n3\n0\n0\ta:1\tb:1\tc:1\n"
    md = decode_ledger_metadata(opened, 9)
    assert md.state is LedgerState.OPEN
    assert encode_ledger_metadata(md) == opened
    assert decode_ledger_metadata(header + b"2\n3\n77\n0\ta:1\tb:1\tc:1\n", 9).length == 0
    # CR and CRLF end lines too (BufferedReader.readLine), trailing TABs vanish
    # (String.split), and lines after CLOSED are ignored.
    odd = header + b"2\r\n3\r1\n0\ta:1\tb:1\tc:1\t\t\n-102\tCLOSED\nwhatever"
    md = decode_ledger_metadata(odd, 9)
    assert md.state is LedgerState.IN_RECOVERY
    assert (md.length, md.last_entry_id) == (0, -1)


# ---------------------------------------------------------------------------
# Malformed inputs


def _fail(data: bytes) -> None:
    with pytest.raises(LedgerMetadataFormatError):
        decode_ledger_metadata(data, 7)


@pytest.mark.parametrize(
    "tail",
    [
        b"",  # no varint
        b"\x80",  # truncated varint
        b"\x80\x80\x80\x80\x80\x01",  # more than 5 bytes
        b"\xff\xff\xff\xff\x0f",  # -1 as a signed 32-bit size
        b"\x80\x80\x80\x80\x08",  # -2**31
        b"\x10\x08\x02",  # declares 16 bytes, has 2
        b"\x02\x08",  # truncated field
        b"\x03\x0a\xff\x01",  # bad length-delimited field
        b"\x02\x08\x02",  # missing required fields
    ],
)
def test_v3_malformed(tail: bytes) -> None:
    _fail(HEADER_PREFIX + b"3\n" + tail)


def test_v3_bad_utf8_member() -> None:
    msg = _valid_format()
    raw = bytearray(msg.SerializeToString())
    i = raw.index(b"192.0.2.1")
    raw[i] = 0xFF
    _fail(HEADER_PREFIX + b"3\n" + bytes([len(raw)]) + bytes(raw))


def test_v3_unknown_state_is_missing_state() -> None:
    msg = _valid_format()
    raw = msg.SerializeToString().replace(b"\x28\x01", b"\x28\x07")
    _fail(HEADER_PREFIX + b"3\n" + bytes([len(raw)]) + raw)


@pytest.mark.parametrize(
    "body",
    [
        "quorumSize: 2",  # missing required fields
        "quorumSize: 2 ensembleSize: 3 length: 0 state: OPEN",  # no ensembles
        "garbage",
        'quorumSize: "2"',
        "quorumSize: 2 ensembleSize: 3 length: 0 state: OPEN segment { firstEntryId: 0 }",
    ],
)
def test_v2_malformed(body: str) -> None:
    _fail(_v2(body))


def test_v2_non_utf8() -> None:
    _fail(HEADER_PREFIX + b"2\nquorumSize: 2\xff")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"2\n3\n",
        b"2\n3\n0\n",  # no ensemble
        b"x\n3\n0\n0\ta\tb\tc",
        b"2\n3\nlen\n0\ta\tb\tc",
        b" 2\n3\n0\n0\ta\tb\tc",
        b"2\n3\n0\nzero\ta\tb\tc",
        b"2\n3\n0\n0 a b c",  # no TAB
        b"2\n3\n0\n\n",  # empty line
        b"2\n3\n0\n\t\t\n",  # only TABs
        b"2\n3\n0\n0\ta\tb",  # ensemble too small
        b"2\n3\n0\n0\ta\t\tc",  # empty bookie id
        b"2\n3\n0\n0\ta\tb b\tc",  # bad bookie id
        b"2\n3\n0\n0\ta\treadonly\tc",  # reserved bookie id
        b"2\n3\n0\n5\ta\tb\tc\n5\ta\tb\tc",  # first entries not increasing
        b"2\n3\n0\n0\ta\tb\tc\nx\tCLOSED",
        b"4\n3\n0\n0\ta\tb\tc",  # write quorum > ensemble
        b"0\n0\n0\n0",  # zero quorum
        b"-1\n3\n0\n0\ta\tb\tc",
        b"2\n3\n-5\n0\ta\tb\tc\n3\tCLOSED",  # closed with negative length
        b"2\n3\n0\n0\ta\tb\t\xff",
        b"99999999999\n3\n0\n0\ta\tb\tc",
    ],
)
def test_v1_malformed(body: bytes) -> None:
    _fail(HEADER_PREFIX + b"1\n" + body)


@pytest.mark.parametrize(
    ("es", "wq", "aq"),
    [(2, 3, 1), (3, 2, 3), (3, 2, 0), (3, 2, -1), (0, 0, 0), (-1, -1, -1)],
)
def test_impossible_quorums(es: int, wq: int, aq: int) -> None:
    msg = _valid_format()
    msg.ensembleSize, msg.quorumSize, msg.ackQuorumSize = es, wq, aq
    del msg.segment[:]
    msg.segment.add(firstEntryId=0, ensembleMember=BOOKIES[: max(es, 0)])
    _fail(_v3(msg))


def test_segment_checks() -> None:
    msg = _valid_format()
    msg.segment.add(firstEntryId=0, ensembleMember=BOOKIES)  # not strictly increasing
    _fail(_v3(msg))
    msg = _valid_format()
    msg.segment.add(firstEntryId=5, ensembleMember=BOOKIES[:2])  # wrong size
    _fail(_v3(msg))
    msg = _valid_format()
    msg.segment[0].ensembleMember[0] = "not a bookie"
    _fail(_v3(msg))


# ---------------------------------------------------------------------------
# Encoding rules (§4.5)


def test_missing_password_is_written_empty_with_crc32() -> None:
    md = _md(format_version=2, password=None, digest_type=None)
    data = encode_ledger_metadata(md)
    assert b'digestType: CRC32\npassword: ""\n' in data
    back = decode_ledger_metadata(data, 7)
    assert (back.password, back.digest_type) == (b"", DigestType.CRC32)
    back3 = decode_ledger_metadata(
        encode_ledger_metadata(dataclasses.replace(md, format_version=3)), 7
    )
    assert (back3.password, back3.digest_type) == (b"", DigestType.CRC32)


def test_v3_field_layout() -> None:
    md = _md(
        state=LedgerState.CLOSED,
        last_entry_id=5,
        length=6,
        ctime=1,
        ctime_stored=True,
        ctoken=2,
        custom_metadata=(("k", b"v"),),
    )
    data = encode_ledger_metadata(md)
    assert data.startswith(HEADER_PREFIX + b"3\n")
    msg = LedgerMetadataFormat()
    msg.ParseFromString(data[len(HEADER_PREFIX) + 3 :])
    assert data[len(HEADER_PREFIX) + 2] == len(data) - len(HEADER_PREFIX) - 3
    assert (msg.quorumSize, msg.ackQuorumSize, msg.ensembleSize) == (2, 2, 3)
    assert (msg.lastEntryId, msg.length, msg.ctime, msg.cToken) == (5, 6, 1, 2)
    assert [(c.key, c.value) for c in msg.customMetadata] == [("k", b"v")]
    no_token = encode_ledger_metadata(dataclasses.replace(md, ctoken=None, ctime_stored=False))
    msg.ParseFromString(no_token[len(HEADER_PREFIX) + 3 :])
    assert not msg.HasField("cToken") and not msg.HasField("ctime")


def test_v1_drops_what_it_cannot_store() -> None:
    md = _md(format_version=1, ctime=5, ctime_stored=True, ctoken=3, custom_metadata=(("k", b""),))
    back = decode_ledger_metadata(encode_ledger_metadata(md), 7)
    assert (back.password, back.digest_type, back.ctime, back.ctoken) == (None, None, -1, None)
    assert back.custom_metadata == ()


@pytest.mark.parametrize(
    "overrides",
    [
        {"format_version": 4},
        {"format_version": 0},
        {"ack_quorum": 0},
        {"write_quorum": 4},
        {"ack_quorum": 3},
        {"segments": ()},
        {"segments": (Segment(0, BOOKIES[:2]),)},
        {"segments": (Segment(0, ("a", "b", "bad id")),)},
        {"segments": (Segment(3, BOOKIES), Segment(3, BOOKIES))},
        {"last_entry_id": 5},
        {"length": 5},
        {"state": LedgerState.CLOSED, "length": -1},
        {"ctime": 2**63, "ctime_stored": True},
        {"ctoken": -(2**63) - 1},
        {"ensemble_size": 2**31, "segments": (Segment(0, BOOKIES),)},
        {"format_version": 1, "state": LedgerState.CLOSED, "last_entry_id": -102},
    ],
)
def test_encode_refuses_what_java_cannot_hold(overrides: dict[str, Any]) -> None:
    with pytest.raises(LedgerMetadataFormatError, match=r"^ledger 7: cannot encode"):
        encode_ledger_metadata(_md(**overrides))


# ---------------------------------------------------------------------------
# Properties: round trips and fuzzing

_BOOKIE_IDS = st.from_regex(r"[a-zA-Z0-9:-_.\-]{1,16}", fullmatch=True).filter(
    lambda s: s.lower() != "readonly"
)
_INT64 = st.integers(-(2**63), MAX_LONG)


@st.composite
def ledger_metadata(draw: st.DrawFn, version: int) -> LedgerMetadata:
    """Metadata as Java could hold it: every value survives decode(encode(md))."""
    ensemble = draw(st.integers(1, 5))
    write = draw(st.integers(1, ensemble))
    ack = write if version == 1 else draw(st.integers(1, write))
    firsts = sorted(draw(st.sets(_INT64, min_size=1, max_size=4)))
    segments = tuple(
        Segment(f, tuple(draw(st.lists(_BOOKIE_IDS, min_size=ensemble, max_size=ensemble))))
        for f in firsts
    )
    state = draw(st.sampled_from(LedgerState))
    last, length = -1, 0
    if state is LedgerState.CLOSED:
        last = draw(st.integers(-1, MAX_LONG))
        length = draw(st.integers(0, MAX_LONG))
    common: dict[str, Any] = {
        "ledger_id": draw(st.integers(0, MAX_LONG)),
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
        password=draw(st.binary(max_size=24)),
        ctime=draw(_INT64) if stored else draw(st.integers(-1, 2**45)),
        ctime_stored=stored,
        ctoken=draw(st.none() | _INT64) if version == 3 else None,
        custom_metadata=tuple(
            draw(st.dictionaries(st.text(max_size=8), st.binary(max_size=8), max_size=3)).items()
        ),
    )


@pytest.mark.parametrize("version", [1, 2, 3])
@FAST
@given(data=st.data())
def test_round_trip_random_metadata(version: int, data: st.DataObject) -> None:
    md = data.draw(ledger_metadata(version))
    style = data.draw(st.sampled_from(list(EscapeStyle)))
    encoded = encode_ledger_metadata(md, text_style=style)
    znode_ctime = None if md.ctime_stored or md.ctime == -1 else md.ctime
    back = decode_ledger_metadata(encoded, md.ledger_id, znode_ctime)
    assert back == md
    assert encode_ledger_metadata(back, text_style=style) == encoded


def _decode_or_format_error(data: bytes) -> None:
    try:
        md = decode_ledger_metadata(data, 5)
    except LedgerMetadataFormatError:
        return
    assert isinstance(md, LedgerMetadata)


@FAST
@given(
    st.sampled_from([b"", HEADER_PREFIX + b"1\n", HEADER_PREFIX + b"2\n", HEADER_PREFIX + b"3\n"]),
    st.binary(max_size=200),
)
def test_fuzz_random_bytes(prefix: bytes, tail: bytes) -> None:
    _decode_or_format_error(prefix + tail)


@FAST
@given(
    st.sampled_from([HEADER_PREFIX + b"1\n", HEADER_PREFIX + b"2\n"]),
    st.text(
        alphabet="0123456789-\t\n\r :{}\"'\\abcCLOSEDquorumSizesegmentfirstEntryId", max_size=200
    ),
)
def test_fuzz_random_text(prefix: bytes, tail: str) -> None:
    _decode_or_format_error(prefix + tail.encode())


_MUTATION = st.tuples(
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


@FAST
@given(st.sampled_from(sorted(GOLDEN)), st.lists(_MUTATION, min_size=1, max_size=4))
def test_fuzz_mutated_golden_vectors(name: str, mutations: list[tuple[str, int, int]]) -> None:
    _decode_or_format_error(_mutate(_b64(name), mutations))


@FAST
@given(st.data(), st.sampled_from([1, 2, 3]), st.lists(_MUTATION, min_size=1, max_size=4))
def test_fuzz_mutated_random_metadata(
    data: st.DataObject, version: int, mutations: list[tuple[str, int, int]]
) -> None:
    encoded = encode_ledger_metadata(data.draw(ledger_metadata(version)))
    _decode_or_format_error(_mutate(encoded, mutations))


# ---------------------------------------------------------------------------
# Java text helpers


def test_java_helpers() -> None:
    assert parse_java_int("+5") == 5
    assert parse_java_int("-2147483648") == -(2**31)
    assert parse_java_int("9223372036854775807", 64) == MAX_LONG
    for bad in ("", "+", "1_000", " 1", "1 ", "٣", "2147483648", "0x10"):
        with pytest.raises(ValueError):
            parse_java_int(bad)
    assert java_read_lines("") == []
    assert java_read_lines("a\r\nb\rc\nd\n") == ["a", "b", "c", "d"]
    assert java_read_lines("a\n\nb") == ["a", "", "b"]
    assert java_read_lines("a\x0bb\x0cc\u2028d") == ["a\x0bb\x0cc\u2028d"]
    assert java_split_tabs("") == [""]
    assert java_split_tabs("\ta\t\tb\t\t") == ["", "a", "", "b"]
    assert java_split_tabs("\t\t") == []
    for good in ("test", "1.2.3.4:1234", "this.is.an.hostname:1234", "a;b<c>@[d]^_", "READONLY1"):
        assert is_valid_bookie_id(good)
    for bad in ("non valid", "non$valid", "readonly", "ReadOnly", "", "a\tb", "é"):
        assert not is_valid_bookie_id(bad)


# ---------------------------------------------------------------------------
# Small records


def test_underreplicated_ledger_record() -> None:
    rec = UnderreplicatedLedgerRecord(("10.0.0.1:3181", "10.0.0.2:3181", "bk-3"), 1700000000000)
    data = encode_underreplicated_ledger(rec)
    assert data == (
        b'replica: "10.0.0.1:3181"\nreplica: "10.0.0.2:3181"\nreplica: "bk-3"\n'
        b"ctime: 1700000000000\n"
    )
    assert decode_underreplicated_ledger(data) == rec
    no_time = decode_underreplicated_ledger(b'replica: "10.0.0.1:3181"\n')
    assert no_time == UnderreplicatedLedgerRecord(("10.0.0.1:3181",), None)
    assert no_time.ctime_or_unassigned == UNASSIGNED_CTIME == -1
    assert encode_underreplicated_ledger(no_time) == b'replica: "10.0.0.1:3181"\n'
    assert decode_underreplicated_ledger(b"") == UnderreplicatedLedgerRecord()
    for bad in (b"replica: 1", b"ctime: x", b'replica: "\xff"', b"{"):
        with pytest.raises(RecordFormatError, match=r"^under-replicated ledger: "):
            decode_underreplicated_ledger(bad)
    with pytest.raises(RecordFormatError):
        encode_underreplicated_ledger(UnderreplicatedLedgerRecord((), 2**63))


def test_rereplication_layout() -> None:
    assert encode_rereplication_layout() == b'type: "BASIC"\nversion: 1\n'
    layout = decode_rereplication_layout(b'type: "BASIC"\nversion: 1\n')
    assert layout == BASIC_REREPLICATION_LAYOUT and layout.supported
    other = decode_rereplication_layout(b'type: "FANCY"\nversion: 2\n')
    assert other == RereplicationLayout("FANCY", 2) and not other.supported
    for bad in (b'type: "BASIC"\n', b"version: 1\n", b"type: BASIC version: 1"):
        with pytest.raises(RecordFormatError):
            decode_rereplication_layout(bad)


def test_auditor_vote_and_lock_data() -> None:
    assert encode_auditor_vote("10.0.0.1:3181") == b'bookieId: "10.0.0.1:3181"\n'
    assert decode_auditor_vote(b'bookieId: "10.0.0.1:3181"\n') == "10.0.0.1:3181"
    assert decode_auditor_vote(b"") is None
    assert encode_lock_data("host-1") == b'bookieId: "host-1"\n'
    assert decode_lock_data(b'bookieId: "host-1"\n') == "host-1"
    assert decode_lock_data(b"") is None
    for decode in (decode_auditor_vote, decode_lock_data):
        with pytest.raises(RecordFormatError):
            decode(b"bookieId: 3")


@pytest.mark.parametrize("kind", list(CheckKind))
def test_check_ctime_records_are_binary(kind: CheckKind) -> None:
    data = encode_check_ctime(kind, 1700000000000)
    assert data.hex() == "0880d095ffbc31"
    assert decode_check_ctime(kind, data) == 1700000000000
    assert decode_check_ctime(kind, b"") == UNASSIGNED_CTIME
    assert decode_check_ctime(kind, encode_check_ctime(kind, -1)) == -1
    for bad in (b"\x08", b"\x08\x80", b"\xff\xff", b"checkAllLedgersCTime: 1"):
        with pytest.raises(RecordFormatError, match=f"^{kind.znode}: "):
            decode_check_ctime(kind, bad)
    with pytest.raises(RecordFormatError):
        encode_check_ctime(kind, 2**63)


def test_check_ctime_znode_names() -> None:
    assert [k.znode for k in CheckKind] == [
        "checkallledgersctime",
        "placementpolicycheckctime",
        "replicascheckctime",
    ]


BSI_EXAMPLE = (
    "32210a06626f6f6b696510ed181a0831302e302e302e31220a626f6f6b69652d7270633a060a016b120176"
)


def test_bookie_service_info_example() -> None:
    info = BookieServiceInfo(
        endpoints=(Endpoint("bookie", 3181, "10.0.0.1", "bookie-rpc"),),
        properties=(("k", "v"),),
    )
    assert encode_bookie_service_info(info).hex() == BSI_EXAMPLE
    decoded = decode_bookie_service_info(bytes.fromhex(BSI_EXAMPLE))
    assert decoded == info
    assert decoded.endpoint() == info.endpoints[0]
    assert decoded.endpoint("http") is None
    assert decoded.get_property("k") == "v" and decoded.get_property("x") is None


def test_bookie_service_info_more() -> None:
    info = BookieServiceInfo(
        endpoints=(
            Endpoint("httpserver", 8080, "h", "http"),
            Endpoint("bookie", 3181, "h", "bookie-rpc", auth=("a",), extensions=("tls",)),
        ),
        properties=(("a", "1"), ("b", "2")),
    )
    data = encode_bookie_service_info(info)
    assert decode_bookie_service_info(data) == info
    assert decode_bookie_service_info(data).endpoint() == info.endpoints[1]
    assert decode_bookie_service_info(b"") == BookieServiceInfo()
    bad_utf8 = bytes.fromhex(BSI_EXAMPLE.replace("626f6f6b6965", "ff6f6f6b6965", 1))
    missing_port = bytes.fromhex("3208" + "0a06626f6f6b6965")
    for bad in (b"\x32\x05\x0a", bad_utf8, missing_port, b"\xff"):
        with pytest.raises(RecordFormatError, match=r"^bookie service info: "):
            decode_bookie_service_info(bad)
    with pytest.raises(RecordFormatError):
        encode_bookie_service_info(BookieServiceInfo((Endpoint("b", 2**31, "h", "p"),)))


def test_cookie_text_format() -> None:
    cookie = Cookie(
        5,
        "10.0.0.1:3181",
        "1\t/data/journal",
        "2\t/data/l1\t/data/l2",
        instance_id="9e1a-uuid",
    )
    data = encode_cookie(cookie)
    assert data == (
        b"5\n"
        b'bookieHost: "10.0.0.1:3181"\n'
        b'journalDir: "1\\t/data/journal"\n'
        b'ledgerDirs: "2\\t/data/l1\\t/data/l2"\n'
        b'instanceId: "9e1a-uuid"\n'
    )
    assert decode_cookie(data) == cookie
    assert cookie.ledger_dir_paths() == ("/data/l1", "/data/l2")
    assert cookie.index_dir_paths() is None
    with_index = dataclasses.replace(cookie, index_dirs="1\t/idx", instance_id=None)
    assert decode_cookie(encode_cookie(with_index)) == with_index
    assert with_index.index_dir_paths() == ("/idx",)
    # Layout 4 reads fine, and Java rewrites every TextFormat cookie as layout 5.
    v4 = decode_cookie(
        b'4\r\nbookieHost: "b:1"\njournalDir: "j"\nledgerDirs: "1\\tl"\ninstanceId: ""\n'
    )
    assert v4 == Cookie(4, "b:1", "j", "1\tl")
    assert encode_cookie(v4).startswith(b"5\n")
    assert (
        decode_cookie(b' 5 \nbookieHost: "b" journalDir: "j" ledgerDirs: "l"').layout_version == 5
    )


def test_cookie_version_3_lines() -> None:
    cookie = decode_cookie(b"3\n10.0.0.1:3181\n/journal\n1\t/ledgers\n")
    assert cookie == Cookie(3, "10.0.0.1:3181", "/journal", "1\t/ledgers")
    assert encode_cookie(cookie) == b"3\n10.0.0.1:3181\n/journal\n1\t/ledgers\n"
    assert decode_cookie(b"3\r\nb\r\nj\r\nl") == Cookie(3, "b", "j", "l")


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"abc\n",
        b"2\nb\nj\nl\n",
        b"3\nb\nj\n",
        b'5\nbookieHost: "b"\n',
        b"5\ngarbage",
        b"\xff\n",
        b'5\nbookieHost: "\\377" journalDir: "j" ledgerDirs: "l"',
    ],
)
def test_cookie_garbage(data: bytes) -> None:
    with pytest.raises(RecordFormatError, match=r"^cookie: "):
        decode_cookie(data)


def test_cookie_encode_refusals() -> None:
    with pytest.raises(RecordFormatError):
        encode_cookie(Cookie(2, "b", "j", "l"))
    with pytest.raises(RecordFormatError):
        encode_cookie(Cookie(3, "b\nx", "j", "l"))
