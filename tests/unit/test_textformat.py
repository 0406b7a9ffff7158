"""TextFormat printing and parsing against what BookKeeper's Java writers produce.

The all-bytes strings below were produced by running the Java code, not derived
from our implementation: protobuf-java 4.32.1 `TextFormat.escapeBytes` for
PROTOBUF_JAVA, and LightProto 0.7.0's `appendTextFormatEscapedByte` for LIGHTPROTO.
"""

from __future__ import annotations

import contextlib

import pytest
from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from auditor.errors import FormatError
from auditor.metadata.textformat import (
    DEFAULT_STYLE,
    EscapeStyle,
    TextFormatError,
    escape_bytes,
    from_text,
    missing_required_fields,
    to_text,
    unescape_bytes,
)
from auditor.proto.data_formats_pb2 import (
    BookieServiceInfoFormat,
    CookieFormat,
    LedgerMetadataFormat,
    LedgerRereplicationLayoutFormat,
    UnderreplicatedLedgerFormat,
)

FAST = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

LIGHTPROTO_ALL_BYTES = (
    "\\000\\001\\002\\003\\004\\005\\006\\007\\b\\t\\n\\013\\f\\r\\016\\017"  # 0x00
    "\\020\\021\\022\\023\\024\\025\\026\\027\\030\\031\\032\\033\\034\\035\\036\\037"  # 0x10
    " !\\\"#$%&\\'()*+,-./"  # 0x20
    "0123456789:;<=>?"  # 0x30
    "@ABCDEFGHIJKLMNO"  # 0x40
    "PQRSTUVWXYZ[\\\\]^_"  # 0x50
    "`abcdefghijklmno"  # 0x60
    "pqrstuvwxyz{|}~\\177"  # 0x70
    "\\200\\201\\202\\203\\204\\205\\206\\207\\210\\211\\212\\213\\214\\215\\216\\217"  # 0x80
    "\\220\\221\\222\\223\\224\\225\\226\\227\\230\\231\\232\\233\\234\\235\\236\\237"  # 0x90
    "\\240\\241\\242\\243\\244\\245\\246\\247\\250\\251\\252\\253\\254\\255\\256\\257"  # 0xa0
    "\\260\\261\\262\\263\\264\\265\\266\\267\\270\\271\\272\\273\\274\\275\\276\\277"  # 0xb0
    "\\300\\301\\302\\303\\304\\305\\306\\307\\310\\311\\312\\313\\314\\315\\316\\317"  # 0xc0
    "\\320\\321\\322\\323\\324\\325\\326\\327\\330\\331\\332\\333\\334\\335\\336\\337"  # 0xd0
    "\\340\\341\\342\\343\\344\\345\\346\\347\\350\\351\\352\\353\\354\\355\\356\\357"  # 0xe0
    "\\360\\361\\362\\363\\364\\365\\366\\367\\370\\371\\372\\373\\374\\375\\376\\377"  # 0xf0
)
PROTOBUF_JAVA_ALL_BYTES = (
    "\\000\\001\\002\\003\\004\\005\\006\\a\\b\\t\\n\\v\\f\\r\\016\\017"  # 0x00
    "\\020\\021\\022\\023\\024\\025\\026\\027\\030\\031\\032\\033\\034\\035\\036\\037"  # 0x10
    " !\\\"#$%&\\'()*+,-./"  # 0x20
    "0123456789:;<=>?"  # 0x30
    "@ABCDEFGHIJKLMNO"  # 0x40
    "PQRSTUVWXYZ[\\\\]^_"  # 0x50
    "`abcdefghijklmno"  # 0x60
    "pqrstuvwxyz{|}~\\177"  # 0x70
    "\\200\\201\\202\\203\\204\\205\\206\\207\\210\\211\\212\\213\\214\\215\\216\\217"  # 0x80
    "\\220\\221\\222\\223\\224\\225\\226\\227\\230\\231\\232\\233\\234\\235\\236\\237"  # 0x90
    "\\240\\241\\242\\243\\244\\245\\246\\247\\250\\251\\252\\253\\254\\255\\256\\257"  # 0xa0
    "\\260\\261\\262\\263\\264\\265\\266\\267\\270\\271\\272\\273\\274\\275\\276\\277"  # 0xb0
    "\\300\\301\\302\\303\\304\\305\\306\\307\\310\\311\\312\\313\\314\\315\\316\\317"  # 0xc0
    "\\320\\321\\322\\323\\324\\325\\326\\327\\330\\331\\332\\333\\334\\335\\336\\337"  # 0xd0
    "\\340\\341\\342\\343\\344\\345\\346\\347\\350\\351\\352\\353\\354\\355\\356\\357"  # 0xe0
    "\\360\\361\\362\\363\\364\\365\\366\\367\\370\\371\\372\\373\\374\\375\\376\\377"  # 0xf0
)

# The body of the upstream "version2" golden vector (spec §4.7).
V2_TEXT = (
    b"quorumSize: 2\n"
    b"ensembleSize: 3\n"
    b"length: 0\n"
    b"lastEntryId: -1\n"
    b"state: IN_RECOVERY\n"
    b"segment {\n"
    b'  ensembleMember: "192.0.2.1:1234"\n'
    b'  ensembleMember: "192.0.2.2:1234"\n'
    b'  ensembleMember: "192.0.2.3:1234"\n'
    b"  firstEntryId: 0\n"
    b"}\n"
    b"digestType: CRC32\n"
    b'password: "passwd"\n'
    b"ackQuorumSize: 2\n"
)


def _lmf(text: bytes | str) -> LedgerMetadataFormat:
    return from_text(text, LedgerMetadataFormat, check_required=False)


def _password(literal: str) -> bytes:
    return _lmf(f"password: {literal}").password


# ---------------------------------------------------------------------------
# Escaping


def test_default_style_is_the_spec_snapshot_writer() -> None:
    assert DEFAULT_STYLE is EscapeStyle.LIGHTPROTO


@pytest.mark.parametrize(
    ("style", "expected"),
    [
        (EscapeStyle.LIGHTPROTO, LIGHTPROTO_ALL_BYTES),
        (EscapeStyle.PROTOBUF_JAVA, PROTOBUF_JAVA_ALL_BYTES),
    ],
)
def test_escape_every_byte_like_java(style: EscapeStyle, expected: str) -> None:
    assert escape_bytes(bytes(range(256)), style) == expected
    assert unescape_bytes(expected) == bytes(range(256))


def test_styles_differ_only_for_bell_and_vertical_tab() -> None:
    differing = [
        b
        for b in range(256)
        if escape_bytes(bytes([b]), EscapeStyle.LIGHTPROTO)
        != escape_bytes(bytes([b]), EscapeStyle.PROTOBUF_JAVA)
    ]
    assert differing == [0x07, 0x0B]


def test_strings_are_escaped_as_utf8_octal() -> None:
    # Both Java writers agree for BMP characters; outside the BMP we write real UTF-8.
    msg = CookieFormat(bookieHost="é€😀", journalDir="a\tb", ledgerDirs="1\t/x")
    assert to_text(msg) == (
        b'bookieHost: "\\303\\251\\342\\202\\254\\360\\237\\230\\200"\n'
        b'journalDir: "a\\tb"\n'
        b'ledgerDirs: "1\\t/x"\n'
    )
    assert from_text(to_text(msg), CookieFormat) == msg


# ---------------------------------------------------------------------------
# Printing


def test_print_nested_message_like_the_v2_vector() -> None:
    msg = LedgerMetadataFormat(
        quorumSize=2,
        ensembleSize=3,
        length=0,
        lastEntryId=-1,
        state=LedgerMetadataFormat.IN_RECOVERY,
        digestType=LedgerMetadataFormat.CRC32,
        password=b"passwd",
        ackQuorumSize=2,
    )
    msg.segment.add(
        firstEntryId=0,
        ensembleMember=["192.0.2.1:1234", "192.0.2.2:1234", "192.0.2.3:1234"],
    )
    for style in EscapeStyle:
        assert to_text(msg, style=style) == V2_TEXT


def test_print_only_set_fields_and_repeated_in_order() -> None:
    msg = UnderreplicatedLedgerFormat(replica=["b:1", "a:2"])
    assert to_text(msg) == b'replica: "b:1"\nreplica: "a:2"\n'
    msg.ctime = 1700000000000
    assert to_text(msg) == b'replica: "b:1"\nreplica: "a:2"\nctime: 1700000000000\n'
    assert to_text(UnderreplicatedLedgerFormat()) == b""


def test_print_custom_metadata_and_ctoken() -> None:
    msg = LedgerMetadataFormat(cToken=-5)
    msg.customMetadata.add(key="k", value=b"\x00v")
    assert to_text(msg) == b'customMetadata {\n  key: "k"\n  value: "\\000v"\n}\ncToken: -5\n'


def test_print_and_parse_map_sorted_by_key() -> None:
    msg = BookieServiceInfoFormat()
    msg.properties["z"] = "1"
    msg.properties["a"] = "2"
    ep = msg.endpoints.add(id="bookie", port=3181, host="h", protocol="bookie-rpc")
    ep.extensions.append("tls")
    text = to_text(msg)
    assert text == (
        b"endpoints {\n"
        b'  id: "bookie"\n'
        b"  port: 3181\n"
        b'  host: "h"\n'
        b'  protocol: "bookie-rpc"\n'
        b'  extensions: "tls"\n'
        b"}\n"
        b'properties {\n  key: "a"\n  value: "2"\n}\n'
        b'properties {\n  key: "z"\n  value: "1"\n}\n'
    )
    assert from_text(text, BookieServiceInfoFormat) == msg


# ---------------------------------------------------------------------------
# Parsing: escapes Java writes or accepts


@pytest.mark.parametrize(
    ("literal", "expected"),
    [
        (r'"\a"', b"\x07"),
        (r'"\b\f\n\r\t\v"', b"\x08\x0c\n\r\t\x0b"),
        (r'"\001"', b"\x01"),
        (r'"\1x"', b"\x01x"),
        (r'"\18"', b"\x018"),
        (r'"\x01"', b"\x01"),
        (r'"\x7"', b"\x07"),
        (r'"\X41"', b"A"),
        (r'"\x414"', b"A4"),
        (r'"\""', b'"'),
        (r'"\\"', b"\\"),
        (r'"\'"', b"'"),
        (r'"\?"', b"?"),
        (r'"\777"', b"\xff"),  # Java keeps the low byte
        (r'"\u00e9"', b"\xc3\xa9"),
        (r'"\U0001F600"', b"\xf0\x9f\x98\x80"),
        (r"'single'", b"single"),
        (r"'it\'s' " + '"a" "b"', b"it'sab"),
        ('""', b""),
    ],
)
def test_parse_java_escapes(literal: str, expected: bytes) -> None:
    assert _password(literal) == expected


@pytest.mark.parametrize(
    "literal",
    [
        r'"\q"',
        r'"\x"',
        r'"\xg"',
        r'"\u12"',
        r'"\uD83D\uDE00"',
        r'"\U00110000"',
        r'"\8"',
        r'"abc',
        '"abc\\',
        "abc",
        "",
    ],
)
def test_parse_rejects_bad_literals(literal: str) -> None:
    with pytest.raises(TextFormatError):
        _lmf(f"password: {literal}")


def test_raw_non_ascii_bytes_in_bytes_literal_are_taken_as_is() -> None:
    # LightProto reads bytes, not characters: a raw byte stands for itself.
    assert _lmf(b'password: "\xff\x00"').password == b"\xff\x00"


def test_string_field_must_be_utf8() -> None:
    with pytest.raises(TextFormatError, match="UTF-8"):
        from_text(r'bookieHost: "\377"', CookieFormat, check_required=False)
    with pytest.raises(TextFormatError, match="UTF-8"):
        from_text(b'bookieHost: "\xff"', CookieFormat, check_required=False)
    assert from_text(r'bookieHost: "\303\251"', CookieFormat, check_required=False).bookieHost == (
        "é"
    )


def test_all_byte_passwords_round_trip_in_both_styles() -> None:
    for b in range(256):
        msg = LedgerMetadataFormat(password=bytes([b, b, 0x41]))
        for style in EscapeStyle:
            assert _lmf(to_text(msg, style=style)).password == bytes([b, b, 0x41])


# ---------------------------------------------------------------------------
# Parsing: syntax


def test_parse_lenient_syntax() -> None:
    text = b"""
    # a comment
    quorumSize: 0x2, ensembleSize: 03; length: -0
    state: 3   # enum by number
    segment < firstEntryId: 7 ensembleMember: ["a:1", 'b:2'] >
    segment { ensembleMember: "c:3" firstEntryId: -1 }
    segment: { firstEntryId: 9 }
    customMetadata [ { key: "k" }, { value: "v" } ]
    lastEntryId: 1
    lastEntryId: 2
    """
    msg = from_text(text, LedgerMetadataFormat)
    assert msg.quorumSize == 2
    assert msg.ensembleSize == 3
    assert msg.length == 0
    assert msg.state == LedgerMetadataFormat.CLOSED
    assert [list(s.ensembleMember) for s in msg.segment] == [["a:1", "b:2"], ["c:3"], []]
    assert [s.firstEntryId for s in msg.segment] == [7, -1, 9]
    assert [(c.key, c.value) for c in msg.customMetadata] == [("k", b""), ("", b"v")]
    assert msg.lastEntryId == 2  # a repeated singular field keeps its last value, as in Java


def test_parse_accepts_str_and_empty_input() -> None:
    assert from_text(V2_TEXT.decode(), LedgerMetadataFormat) == from_text(
        V2_TEXT, LedgerMetadataFormat
    )
    assert from_text(b"", UnderreplicatedLedgerFormat) == UnderreplicatedLedgerFormat()
    assert (
        from_text(b"  \n# nothing\n", UnderreplicatedLedgerFormat) == UnderreplicatedLedgerFormat()
    )


def test_unknown_fields_are_skipped_like_lightproto() -> None:
    text = (
        b'replica: "a:1"\n'
        b"futureScalar: 12\n"
        b'futureString: "x" "y"\n'
        b"futureEnum: SOMETHING\n"
        b"futureList: [1, -2, {a: 1}]\n"
        b"futureEmptyList: []\n"
        b"futureMessage { inner < deeper: [ 'q' ] > x: 1.5e3 }\n"
        b"futureNoColon < a: 1 >;\n"
        b"ctime: 5\n"
    )
    msg = from_text(text, UnderreplicatedLedgerFormat)
    assert list(msg.replica) == ["a:1"]
    assert msg.ctime == 5
    with pytest.raises(TextFormatError, match="futureScalar"):
        from_text(text, UnderreplicatedLedgerFormat, allow_unknown_fields=False)


def test_required_fields_are_checked() -> None:
    with pytest.raises(TextFormatError, match="version"):
        from_text(b'type: "BASIC"\n', LedgerRereplicationLayoutFormat)
    msg = from_text(b'type: "BASIC"\n', LedgerRereplicationLayoutFormat, check_required=False)
    assert msg.type == "BASIC"
    partial = _lmf(b"quorumSize: 1 segment { }")
    assert missing_required_fields(partial) == [
        "ensembleSize",
        "length",
        "state",
        "segment[0].firstEntryId",
    ]


@pytest.mark.parametrize(
    "text",
    [
        b"quorumSize: 2147483648",
        b"quorumSize: -2147483649",
        b"length: 9223372036854775808",
        b"quorumSize: 1.5",
        b"quorumSize: 08",
        b"quorumSize: 0x",
        b"quorumSize: " + b"1" * 100,
        b"quorumSize: abc",
        b"quorumSize 2",
        b"quorumSize: [1, 2]",
        b"quorumSize:",
        b"state: FOO",
        b"state: 7",
        b"state: 'OPEN'",
        b"segment: 1",
        b"segment { firstEntryId: 1",
        b"segment { firstEntryId: 1 >",
        b"} quorumSize: 1",
        b"[ext.field]: 1",
        b"2: 1",
        b'password: "a" ,, quorumSize: 1',
        b"futureField: ",
        b"futureField { a: 1 ",
        b"futureField: [1, 2",
        b"\xff\xfe",
        b"{" * 10000,
        b"future {" * 10000,
    ],
)
def test_parse_errors(text: bytes) -> None:
    with pytest.raises(TextFormatError):
        _lmf(text)


def test_error_positions_and_type() -> None:
    with pytest.raises(TextFormatError) as info:
        _lmf(b"quorumSize: 1\nensembleSize: x\n")
    assert str(info.value).startswith("2:15:")
    assert isinstance(info.value, FormatError)


def test_unsupported_types_are_refused_when_printing() -> None:
    # No DataFormats record has a float field; printing one must fail loudly,
    # not guess Java's float formatting.
    from google.protobuf import descriptor_pb2

    msg = descriptor_pb2.UninterpretedOption(double_value=1.5)
    with pytest.raises(TextFormatError):
        to_text(msg)


# ---------------------------------------------------------------------------
# Properties


_int64 = st.integers(-(2**63), 2**63 - 1)
_int32 = st.integers(-(2**31), 2**31 - 1)


@st.composite
def _ledger_formats(draw: st.DrawFn) -> LedgerMetadataFormat:
    msg = LedgerMetadataFormat()
    if draw(st.booleans()):
        msg.quorumSize = draw(_int32)
    if draw(st.booleans()):
        msg.length = draw(_int64)
    if draw(st.booleans()):
        msg.state = draw(st.sampled_from(list(LedgerMetadataFormat.State.values())))
    if draw(st.booleans()):
        msg.digestType = draw(st.sampled_from(list(LedgerMetadataFormat.DigestType.values())))
    if draw(st.booleans()):
        msg.password = draw(st.binary(max_size=40))
    for _ in range(draw(st.integers(0, 3))):
        seg = msg.segment.add(firstEntryId=draw(_int64))
        seg.ensembleMember.extend(draw(st.lists(st.text(max_size=8), max_size=3)))
    for _ in range(draw(st.integers(0, 2))):
        msg.customMetadata.add(key=draw(st.text(max_size=8)), value=draw(st.binary(max_size=8)))
    if draw(st.booleans()):
        msg.cToken = draw(_int64)
    return msg


@FAST
@given(_ledger_formats(), st.sampled_from(list(EscapeStyle)))
def test_round_trip_random_messages(msg: LedgerMetadataFormat, style: EscapeStyle) -> None:
    text = to_text(msg, style=style)
    assert _lmf(text) == msg
    # Python's own parser agrees with what we print...
    assert text_format.Parse(text.decode("ascii"), LedgerMetadataFormat()) == msg


@FAST
@given(_ledger_formats())
def test_parse_what_python_prints(msg: LedgerMetadataFormat) -> None:
    # ...and we read what Python prints (its octal and \\x spellings, UTF-8 or not).
    assert _lmf(text_format.MessageToString(msg)) == msg
    assert _lmf(text_format.MessageToString(msg, as_utf8=True)) == msg
    assert _lmf(text_format.MessageToString(msg, as_one_line=True)) == msg


@FAST
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_text_format_error(data: bytes) -> None:
    with contextlib.suppress(TextFormatError):
        _lmf(data)


_TOKENS = st.sampled_from(
    [
        "quorumSize",
        "segment",
        "password",
        "state",
        "unknown",
        ":",
        "{",
        "}",
        "<",
        ">",
        "[",
        "]",
        ",",
        ";",
        "#",
        "\n",
        " ",
        '"',
        "'",
        "\\",
        "\\x",
        "\\u",
        "0x",
        "-",
        "1",
        "OPEN",
        "9" * 20,
    ]
)


@FAST
@given(st.lists(_TOKENS, max_size=40))
def test_random_token_soup_only_raises_text_format_error(tokens: list[str]) -> None:
    with contextlib.suppress(TextFormatError):
        _lmf("".join(tokens))
