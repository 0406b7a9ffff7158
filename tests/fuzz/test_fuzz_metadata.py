"""Fuzzing the metadata parsers: ledger metadata v1/v2/v3, TextFormat, records, LAYOUT.

tests/unit/test_metadata_serde.py and test_textformat.py already throw random
bytes, token soup and byte flips at the decoders. These tests add structure:
messages whose fields take any value (so the validation behind a well-formed
encoding is reached), line and token edits of v1/v2 text, mutations with
splices and boundary values seeded from the golden vectors, and the records
and LAYOUT parsers, which had no fuzzing. Each input goes through a target in
`tests.fuzz.targets`, which also checks that what decodes re-encodes to the
same value.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from auditor.metadata.layout import LedgerManager
from auditor.metadata.records import (
    BookieServiceInfo,
    Cookie,
    Endpoint,
    RecordFormatError,
    decode_bookie_service_info,
    encode_bookie_service_info,
    encode_cookie,
)
from auditor.metadata.serde import (
    HEADER_PREFIX,
    decode_ledger_metadata,
    encode_ledger_metadata,
    read_format_version,
)
from auditor.metadata.textformat import EscapeStyle, to_text
from auditor.proto.data_formats_pb2 import (
    BookieServiceInfoFormat,
    CookieFormat,
    LedgerMetadataFormat,
    UnderreplicatedLedgerFormat,
)
from tests.fuzz.support import MUTATIONS, fuzz_settings, mutate, run, varint
from tests.fuzz.targets import LEDGER_ID, layout, ledger_metadata, records, text_format
from tests.vectors import load

pytestmark = pytest.mark.fuzz

VECTORS: dict[str, Any] = load("ledger-metadata.json")
GOLDEN = {v["name"]: base64.b64decode(v["base64"]) for v in VECTORS["vectors"]}
SEEDS = [*GOLDEN.values(), *(base64.b64decode(v["base64"]) for v in VECTORS["must_fail"])]

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
SMALL = st.integers(-2, 6)
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
BOOKIES = st.one_of(
    st.sampled_from(["192.0.2.1:3181", "192.0.2.2:3181", "bk-3", "readonly", "a b", ""]), TEXT
)


def _present(draw: st.DrawFn) -> bool:
    """Mostly yes: a required field left out now and then."""
    return draw(st.integers(0, 9)) > 0


@st.composite
def ledger_formats(draw: st.DrawFn) -> LedgerMetadataFormat:
    """A LedgerMetadataFormat whose fields take any value their wire type allows."""
    msg = LedgerMetadataFormat()
    ensemble = draw(st.one_of(SMALL, INT32))
    if _present(draw):
        msg.ensembleSize = ensemble
    if _present(draw):
        msg.quorumSize = draw(st.one_of(SMALL, INT32))
    if draw(st.booleans()):
        msg.ackQuorumSize = draw(st.one_of(SMALL, INT32))
    if _present(draw):
        msg.length = draw(st.one_of(SMALL, INT64))
    if draw(st.booleans()):
        msg.lastEntryId = draw(st.one_of(SMALL, INT64))
    if _present(draw):
        msg.state = LedgerMetadataFormat.State.ValueType(draw(st.sampled_from([1, 2, 3])))
    width = ensemble if 0 <= ensemble <= 5 and draw(st.booleans()) else draw(st.integers(0, 5))
    first = draw(st.integers(-2, 3))
    for _ in range(draw(st.integers(0, 3))):
        seg = msg.segment.add(
            ensembleMember=draw(st.lists(BOOKIES, min_size=width, max_size=width))
        )
        if _present(draw):
            seg.firstEntryId = first
        first += draw(st.one_of(st.integers(-1, 10), INT64.map(abs)))
        first = min(first, 2**63 - 1)
    if draw(st.booleans()):
        msg.digestType = LedgerMetadataFormat.DigestType.ValueType(draw(st.integers(1, 4)))
    if draw(st.booleans()):
        msg.password = draw(st.binary(max_size=8))
    if draw(st.booleans()):
        msg.ctime = draw(INT64)
    if draw(st.booleans()):
        msg.cToken = draw(INT64)
    for key, value in draw(st.lists(st.tuples(TEXT, st.binary(max_size=6)), max_size=3)):
        msg.customMetadata.add(key=key, value=value)
    return msg


@fuzz_settings(300)
@given(ledger_formats(), st.one_of(st.none(), st.integers(-1, 2**35)), st.binary(max_size=8))
def test_v3_messages_with_any_field_values(
    msg: LedgerMetadataFormat, claimed: int | None, trailer: bytes
) -> None:
    """v3: any message, under its true length or a wrong one, with bytes after it."""
    raw = msg.SerializePartialToString()
    length = varint(len(raw) if claimed is None else claimed)
    run(ledger_metadata, HEADER_PREFIX + b"3\n" + length + raw + trailer)


_TEXT_EDITS = st.lists(
    st.tuples(
        st.sampled_from(["drop", "duplicate", "swap", "number", "rename", "nest", "junk"]),
        st.integers(0, 1000),
        st.integers(0, 1000),
    ),
    min_size=1,
    max_size=5,
)
_NUMBERS = ["-1", "0", "2147483648", "-2147483649", "9223372036854775808", "0x10", "077", "1e3"]
_FIELDS = [f.name for f in LedgerMetadataFormat.DESCRIPTOR.fields] + ["unknownField", "segment"]
_JUNK = ["{", "}", "<", ">", "[", "]", ":", ";", ",", "#", '"', "'", "\\", "\\x", "\\u00"]


def edit_text(text: str, edits: list[tuple[str, int, int]]) -> str:
    """Line and token edits of TextFormat: the mistakes a hand edit or a torn write makes."""
    lines = text.split("\n")
    for kind, i, j in edits:
        k = i % len(lines)
        line = lines[k]
        if kind == "drop":
            del lines[k]
        elif kind == "duplicate":
            lines.insert(k, line)
        elif kind == "swap":
            m = j % len(lines)
            lines[k], lines[m] = lines[m], line
        elif kind == "number" and ":" in line:
            lines[k] = line.split(":", 1)[0] + ": " + _NUMBERS[j % len(_NUMBERS)]
        elif kind == "rename":
            rest = line.lstrip().split(" ", 1)[1:] or [""]
            lines[k] = _FIELDS[j % len(_FIELDS)] + " " + rest[0]
        elif kind == "nest":
            lines[k] = "unknownField { " * (j % 8) + line + " }" * (j % 5)
        else:
            lines.insert(k, _JUNK[j % len(_JUNK)])
        if not lines:
            lines = [""]
    return "\n".join(lines)


@fuzz_settings(300)
@given(ledger_formats(), st.sampled_from(list(EscapeStyle)), _TEXT_EDITS)
def test_v2_text_with_line_and_token_edits(
    msg: LedgerMetadataFormat, style: EscapeStyle, edits: list[tuple[str, int, int]]
) -> None:
    text = to_text(msg, style=style).decode("ascii")
    body = edit_text(text, edits).encode()
    run(ledger_metadata, HEADER_PREFIX + b"2\n" + body)
    run(text_format, body)


_V1_NUMBERS = st.one_of(
    st.integers(-3, 8).map(str),
    st.sampled_from(["", " 1", "+2", "2147483648", "9" * 30, "0x1", "1_0", "\u0663", "-0"]),
)


@st.composite
def v1_documents(draw: st.DrawFn) -> bytes:
    """v1 text: quorum, ensemble size and length lines, ensembles, maybe a CLOSED line."""
    lines = [draw(_V1_NUMBERS), draw(_V1_NUMBERS), draw(st.one_of(_V1_NUMBERS, INT64.map(str)))]
    for _ in range(draw(st.integers(0, 4))):
        first = draw(st.one_of(st.integers(-2, 50).map(str), _V1_NUMBERS))
        lines.append("\t".join([first, *draw(st.lists(BOOKIES, max_size=4))]))
    closing = draw(st.sampled_from(["", "CLOSED", "closed", "CLOSED\tjunk"]))
    if closing:
        last = draw(st.sampled_from(["-102", "-1", "5", "x", "9223372036854775807"]))
        lines.append(f"{last}\t{closing}")
    lines += draw(st.lists(st.sampled_from(["", "\t", "junk", "1\tCLOSED"]), max_size=2))
    newline = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    body = newline.join(lines) + (newline if draw(st.booleans()) else "")
    return HEADER_PREFIX + b"1\n" + body.encode()


@fuzz_settings(300)
@given(v1_documents())
def test_v1_documents(data: bytes) -> None:
    run(ledger_metadata, data)


@fuzz_settings(400)
@given(st.sampled_from(SEEDS), st.sampled_from(SEEDS), MUTATIONS)
def test_mutated_golden_vectors(seed: bytes, donor: bytes, mutations: list[Any]) -> None:
    """Byte edits with boundary values and splices between the vectors."""
    run(ledger_metadata, mutate(seed, mutations, donor))


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_vectors_pass_the_target_and_round_trip(name: str) -> None:
    data = GOLDEN[name]
    run(ledger_metadata, data)
    md = decode_ledger_metadata(data, LEDGER_ID)
    version, _ = read_format_version(data)
    if version in (2, 3):
        assert encode_ledger_metadata(md) == data


# --- TextFormat literals ---------------------------------------------------------------

_ESCAPES = [
    *"abfnrtv\\'\"?",
    "x4",
    "x41",
    "x",
    "X7f",
    "0",
    "7",
    "377",
    "400",
    "777",
    "8",
    "u00e9",
    "u12",
    "uD800",
    "U0001F600",
    "U00110000",
    "Ufffffff",
    "z",
    "",
]
_LITERAL_PIECES = st.one_of(
    st.sampled_from(["\\" + e for e in _ESCAPES]),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=4),
)


@fuzz_settings(300)
@given(st.lists(_LITERAL_PIECES, max_size=12), st.sampled_from(['"', "'"]))
def test_quoted_literals(pieces: list[str], quote: str) -> None:
    """Escapes of every kind, in unescape_bytes and inside a v2 password and bookie id."""
    inner = "".join(pieces)
    run(text_format, inner.encode())
    body = (
        "quorumSize: 1\nensembleSize: 1\nlength: 0\nstate: OPEN\n"
        f"segment {{ ensembleMember: {quote}{inner}{quote} firstEntryId: 0 }}\n"
        f"password: {quote}{inner}{quote}\ndigestType: CRC32\n"
    )
    run(ledger_metadata, HEADER_PREFIX + b"2\n" + body.encode())


# --- records: cookies, bookie service info, marks, votes, check times ---------------------


@st.composite
def cookies(draw: st.DrawFn) -> bytes:
    version = draw(st.sampled_from(["3", "4", "5", "6", "2", "-1", " 5 ", "x", "2147483648", ""]))
    newline = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    if version == "3" and draw(st.booleans()):
        body = newline.join(draw(st.lists(TEXT, max_size=4)))
    else:
        fmt = CookieFormat()
        for name in ("bookieHost", "journalDir", "ledgerDirs", "instanceId", "indexDirs"):
            if _present(draw):
                setattr(fmt, name, draw(TEXT))
        body = to_text(fmt).decode("ascii")
    return (version + newline + body).encode()


@st.composite
def service_infos(draw: st.DrawFn) -> bytes:
    msg = BookieServiceInfoFormat()
    for _ in range(draw(st.integers(0, 3))):
        ep = msg.endpoints.add()
        for name in ("id", "host", "protocol"):
            if _present(draw):
                setattr(ep, name, draw(TEXT))
        if _present(draw):
            ep.port = draw(st.one_of(st.integers(0, 65536), INT32))
        ep.auth.extend(draw(st.lists(TEXT, max_size=2)))
        ep.extensions.extend(draw(st.lists(TEXT, max_size=2)))
    for key, value in draw(st.dictionaries(TEXT, TEXT, max_size=3)).items():
        msg.properties[key] = value
    return msg.SerializePartialToString()


@st.composite
def marks(draw: st.DrawFn) -> bytes:
    fmt = UnderreplicatedLedgerFormat(replica=draw(st.lists(BOOKIES, max_size=3)))
    if draw(st.booleans()):
        fmt.ctime = draw(INT64)
    return to_text(fmt)


_VALID_RECORDS = [
    encode_cookie(Cookie(5, "bk1:3181", "1\t/j", "2\t/l1\t/l2", "inst", "1\t/i")),
    encode_cookie(Cookie(3, "bk1:3181", "1\t/j", "1\t/l")),
    encode_bookie_service_info(
        BookieServiceInfo(
            (Endpoint("ep", 3181, "10.0.0.1", "bookie-rpc", ("tls",), ("x",)),),
            (("k", "v"),),
        )
    ),
    b'replica: "192.0.2.1:3181"\nctime: 1700000000000\n',
    b'type: "BASIC"\nversion: 1\n',
    b'bookieId: "192.0.2.1:3181"\n',
    b"\x08\x80\xd0\x95\xff\xbc\x31",
]


@fuzz_settings(250)
@given(
    st.one_of(cookies(), service_infos(), marks(), st.sampled_from(_VALID_RECORDS)),
    st.sampled_from(_VALID_RECORDS),
    st.one_of(st.just([]), MUTATIONS),
)
def test_records(data: bytes, donor: bytes, mutations: list[Any]) -> None:
    """Each record decoder on generated records, as they are or mutated."""
    run(records, mutate(data, mutations, donor))


def test_bookie_service_info_with_a_non_utf8_property_name() -> None:
    """Found by test_records: upb raises UnicodeDecodeError for a bad map key."""
    data = bytes.fromhex("3a080a04c080c2801200")  # properties {"\xc0\x80\xc2\x80": ""}
    with pytest.raises(RecordFormatError, match="property name is not valid UTF-8"):
        decode_bookie_service_info(data)
    run(records, data)


# --- LAYOUT and metadata service URIs ----------------------------------------------------

_LAYOUT_NUMBERS = st.one_of(
    st.integers(-1, 3).map(str),
    st.sampled_from(["", " 2", "02", "2147483648", "0" * 4400 + "2", "1" * 4400, "\u00b2"]),
    st.sampled_from(["\u0663", "\uff12", "+1", "1.0"]),
)
_MANAGER_NAMES = st.one_of(
    st.sampled_from(
        [
            "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory",
            "org.apache.pulsar.shade.org.apache.bookkeeper.meta.FlatLedgerManagerFactory",
            "LongHierarchicalLedgerManagerFactory",
            "x.LegacyHierarchicalLedgerManagerFactory",
            "a:b",
            "",
        ]
    ),
    st.sampled_from([m.value for m in LedgerManager]),
    TEXT,
)


@fuzz_settings(300)
@given(
    _LAYOUT_NUMBERS,
    _MANAGER_NAMES,
    _LAYOUT_NUMBERS,
    st.sampled_from(["", "\n", "\nextra", "\r\n", " "]),
)
def test_layouts(version: str, name: str, manager_version: str, tail: str) -> None:
    run(layout, f"{version}\n{name}:{manager_version}{tail}".encode())


@fuzz_settings(300)
@given(
    st.sampled_from(["zk", "zk+", "ZK", "etcd", "", "zk+hierarchical", "zk+null", "zk+flat"]),
    st.lists(st.sampled_from(["h1:2181", "", ";", "[::1]:2181", "h/2", " "]) | TEXT, max_size=4),
    st.sampled_from(["", "/", "/ledgers", "//", "/a/b/", "\n/x"]) | TEXT,
)
def test_metadata_service_uris(scheme: str, hosts: list[str], path: str) -> None:
    run(layout, f"{scheme}://{';'.join(hosts)}{path}".encode())


@fuzz_settings(300)
@given(
    st.lists(
        st.sampled_from(["http://h1:2379", "h2:2379", "https://[::1]:2379", "", ";", "ftp://x"])
        | TEXT,
        max_size=4,
    ),
    st.sampled_from(["", "/", "/x", "?sessionTimeoutMillis=5000", "?configFilePath=%2Fnone"])
    | TEXT,
)
def test_pulsar_etcd_uris(endpoints: list[str], tail: str) -> None:
    run(layout, f"metadata-store:etcd:{','.join(endpoints)}{tail}".encode())
