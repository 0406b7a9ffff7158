"""A ledger keeps its stored format across updates and one corrupt znode must not stop a walk
of the cluster, so the auditor reads all three formats as Java does, rewrites a record in
exactly the bytes Java would write, and fails on bad input in one way only.

Ledger metadata znode bytes <-> `LedgerMetadata`, as BookKeeper's LedgerMetadataSerDe.

Three stored formats exist:

* v1 (BookKeeper 4.0): TAB/LF-separated lines;
* v2 (4.2): protobuf TextFormat of `LedgerMetadataFormat` (see `textformat`);
* v3 (4.9, the default for new ledgers): varint32-delimited binary protobuf.

Each starts with `BookieMetadataFormatVersion\\t<n>\\n`.

Decoding keeps exactly what Java keeps, so that two auditors agree on a ledger. For
example, a ledger that is not closed always has lastEntryId -1 and length 0,
whatever was serialized. It also adds the checks Java's `LedgerMetadataBuilder`
makes. Beyond Java, quorums below 1 and a negative length of a closed ledger are
rejected: Java would accept them, but no client can write them and every
downstream computation (entry distribution, replica checks) would be meaningless.
Ensemble members must be valid BookieIds, because Java's `BookieId.parse` rejects
anything else while decoding.

Every malformed input raises `LedgerMetadataFormatError`. It never raises another
exception type and never hangs, because the auditor walks every ledger of a
cluster and one corrupt znode must not stop the walk.

The Java-compatible helpers for integers, lines and TAB splitting are public
because `records` parses cookies with the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from google.protobuf.message import DecodeError

from auditor.errors import FormatError
from auditor.metadata.model import (
    INVALID_ENTRY_ID,
    DigestType,
    LedgerMetadata,
    LedgerState,
    Segment,
)
from auditor.metadata.paths import check_ledger_id
from auditor.metadata.textformat import (
    DEFAULT_STYLE,
    EscapeStyle,
    TextFormatError,
    from_text,
    missing_required_fields,
    to_text,
)
from auditor.proto.data_formats_pb2 import LedgerMetadataFormat

__all__ = [
    "CURRENT_FORMAT_VERSION",
    "FORMAT_VERSION_1",
    "FORMAT_VERSION_2",
    "FORMAT_VERSION_3",
    "HEADER_PREFIX",
    "LedgerMetadataFormatError",
    "decode_ledger_metadata",
    "encode_ledger_metadata",
    "is_valid_bookie_id",
    "read_format_version",
]

HEADER_PREFIX = b"BookieMetadataFormatVersion\t"
FORMAT_VERSION_1 = 1
FORMAT_VERSION_2 = 2
FORMAT_VERSION_3 = 3
CURRENT_FORMAT_VERSION = FORMAT_VERSION_3
SUPPORTED_FORMAT_VERSIONS = (FORMAT_VERSION_1, FORMAT_VERSION_2, FORMAT_VERSION_3)

# Java reads at most this many bytes after the prefix looking for the LF, so a
# version has at most 9 characters.
_MAX_VERSION_BYTES = 10
_V1_CLOSED_TAG = "CLOSED"
_V1_IN_RECOVERY_ENTRY_ID = -102

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


class LedgerMetadataFormatError(FormatError):
    """Bytes that are not ledger metadata BookKeeper could have written or read.

    The message names the ledger. The caller knows the znode path and adds it.
    """

    def __init__(self, ledger_id: int, reason: str) -> None:
        super().__init__(f"ledger {ledger_id}: {reason}")
        self.ledger_id = ledger_id
        self.reason = reason


class _Invalid(Exception):
    """Internal: a reason, turned into LedgerMetadataFormatError at the API edge
    so that helpers need not carry the ledger id."""


# ---------------------------------------------------------------------------
# Java-compatible text helpers

_JAVA_INT_RE = re.compile(r"[+-]?[0-9]+")
_BOOKIE_ID_RE = re.compile(r"[a-zA-Z0-9:-_.\-]+")
_LINE_BREAK_RE = re.compile(r"\r\n|\r|\n")


def parse_java_int(text: str, bits: int = 32) -> int:
    """`Integer.parseInt` (bits=32) or `Long.parseLong` (bits=64).

    There is an optional sign, then digits, with no spaces and no underscores,
    unlike Python's `int()`. Java also accepts non-ASCII Unicode digits; this
    accepts ASCII digits only. Raises ValueError.
    """
    if len(text) > 25 or _JAVA_INT_RE.fullmatch(text) is None:
        raise ValueError(f"not an integer: {text[:25]!r}")
    value = int(text)
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise ValueError(f"integer out of range: {text}")
    return value


def java_read_lines(text: str) -> list[str]:
    """The successive results of `BufferedReader.readLine()` until it returns null.

    Lines end at LF, CR or CRLF, and a final terminator does not start an empty
    line. Python's `splitlines` also breaks at other characters (VT, FF, U+2028...),
    so it cannot be used here.
    """
    if not text:
        return []
    lines = _LINE_BREAK_RE.split(text)
    if lines[-1] == "":
        lines.pop()
    return lines


def java_split_tabs(text: str) -> list[str]:
    """`text.split("\\t")` in Java: trailing empty fields are dropped, leading ones kept.

    `""` gives `[""]`.
    """
    if text == "":
        return [""]
    parts = text.split("\t")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def is_valid_bookie_id(bookie_id: str) -> bool:
    """What `BookieId.parse` accepts (spec §6).

    Because `:-_` is a range in Java's regex, `:;<=>?@[\\]^_` are allowed too. The
    name `readonly` is reserved.
    """
    # A cluster has a few hundred bookie ids, each in a great many ensembles: a walk
    # asks about the same ones for every ledger.
    known = _VALID_BOOKIE_IDS.get(bookie_id)
    if known is None:
        known = _BOOKIE_ID_RE.fullmatch(bookie_id) is not None and bookie_id.lower() != "readonly"
        if len(_VALID_BOOKIE_IDS) >= _BOOKIE_IDS_KEPT:
            _VALID_BOOKIE_IDS.clear()
        _VALID_BOOKIE_IDS[bookie_id] = known
    return known


#: `is_valid_bookie_id`'s answers, forgotten wholesale when full.
_VALID_BOOKIE_IDS: dict[str, bool] = {}
_BOOKIE_IDS_KEPT: Final = 65_536


# ---------------------------------------------------------------------------
# Public API


def read_format_version(data: bytes, ledger_id: int = -1) -> tuple[int, int]:
    """The format version in the header, and the offset where the body starts.

    This lets a caller learn a ledger's format without decoding all of it. The
    version is not checked against the supported range. Raises
    LedgerMetadataFormatError, naming `ledger_id`, if the header is corrupt.
    """
    try:
        return _read_header(bytes(data))
    except _Invalid as e:
        raise LedgerMetadataFormatError(ledger_id, str(e)) from None


def decode_ledger_metadata(
    data: bytes, ledger_id: int, znode_ctime: int | None = None
) -> LedgerMetadata:
    """Decode the data of a ledger znode as Java's `LedgerMetadataSerDe.parseConfig` does.

    `znode_ctime` is the znode's `Stat.ctime`. For v2 and v3 it becomes the ledger's
    ctime (not stored) when the metadata carries none. v1 never uses it, as in Java.
    Raises LedgerMetadataFormatError for any malformed `data`, and InvalidLedgerIdError
    (a ValueError) for a `ledger_id` outside 0..2**63-1, which is a bug in the caller
    (the walk never yields one), not in the data.
    """
    check_ledger_id(ledger_id)
    try:
        return _decode(bytes(data), ledger_id, znode_ctime)
    # One name per clause: mypyc types an `except ... as` name by its first clause.
    except _Invalid as invalid:
        raise LedgerMetadataFormatError(ledger_id, str(invalid)) from None
    except (TextFormatError, DecodeError) as bad:
        raise LedgerMetadataFormatError(ledger_id, str(bad)) from bad
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, RecursionError) as e:
        # Defensive: every expected failure is an _Invalid above. This keeps the
        # "only LedgerMetadataFormatError" promise if a protobuf corner case slips
        # through.
        raise LedgerMetadataFormatError(ledger_id, f"{type(e).__name__}: {e}") from e


def encode_ledger_metadata(md: LedgerMetadata, *, text_style: EscapeStyle = DEFAULT_STYLE) -> bytes:
    """The bytes Java's `LedgerMetadataSerDe.serialize` writes for `md`, in `md.format_version`.

    Written fields, as in Java's `buildLedgerMetadataFormat`:

    * v2/v3: ctime only if `ctime_stored`. cToken only in v3, and only if not None
      (Java would write 0; our model keeps "absent" apart).
    * v2/v3: a missing password is written as empty bytes, as Java does, and a
      missing digest type as CRC32, the proto2 default a reader would infer anyway.
      Java cannot encode a ledger without a digest type at all (it throws). So such
      a ledger decodes back with `password == b""` and CRC32, not None.
    * v1: password, digest type, ctime, cToken and custom metadata are not written.

    `text_style` chooses the v2 escaping (see `textformat`). It differs only for
    bytes 0x07 and 0x0b.
    Raises LedgerMetadataFormatError if `md` breaks an invariant Java's builder
    enforces, since Java could never have written such metadata.
    """
    try:
        _validate(md)
        if md.format_version == FORMAT_VERSION_1:
            return _encode_v1(md)
        if md.format_version == FORMAT_VERSION_2:
            body = to_text(_build_format(md, include_ctoken=False), style=text_style)
            return _header(FORMAT_VERSION_2) + body
        raw = _build_format(md, include_ctoken=True).SerializeToString()
        return _header(FORMAT_VERSION_3) + varint(len(raw)) + raw
    except _Invalid as invalid:  # one name per clause (mypyc: see decode_ledger_metadata)
        raise LedgerMetadataFormatError(md.ledger_id, f"cannot encode: {invalid}") from None
    except (TextFormatError, ValueError, TypeError) as e:
        raise LedgerMetadataFormatError(md.ledger_id, f"cannot encode: {e}") from e


# ---------------------------------------------------------------------------
# Header


def _header(version: int) -> bytes:
    return HEADER_PREFIX + str(version).encode("ascii") + b"\n"


def _read_header(data: bytes) -> tuple[int, int]:
    if not data.startswith(HEADER_PREFIX):
        raise _Invalid("header corrupt: does not start with 'BookieMetadataFormatVersion\\t'")
    start = len(HEADER_PREFIX)
    nl = data.find(b"\n", start, start + _MAX_VERSION_BYTES)
    if nl < 0:
        raise _Invalid("header corrupt: no end of version number")
    try:
        version = parse_java_int(data[start:nl].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise _Invalid(f"header corrupt: bad version number {data[start:nl]!r}") from None
    return version, nl + 1


# ---------------------------------------------------------------------------
# Decoding


def _decode(data: bytes, ledger_id: int, znode_ctime: int | None) -> LedgerMetadata:
    version, offset = _read_header(data)
    body = data[offset:]
    if version == FORMAT_VERSION_1:
        md = _decode_v1(body, ledger_id)
    elif version == FORMAT_VERSION_2:
        fmt = from_text(body, LedgerMetadataFormat)
        md = _decode_format(fmt, ledger_id, FORMAT_VERSION_2, znode_ctime)
    elif version == FORMAT_VERSION_3:
        md = _decode_format(_read_delimited(body), ledger_id, FORMAT_VERSION_3, znode_ctime)
    else:
        raise _Invalid(f"unsupported metadata format version {version}; expected 1 to 3")
    _validate(md)
    return md


def _decode_v1(body: bytes, ledger_id: int) -> LedgerMetadata:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _Invalid("v1 metadata is not UTF-8 text") from None
    lines = java_read_lines(text)
    if len(lines) < 3:
        raise _Invalid("v1 metadata is truncated: no quorum, ensemble size and length lines")
    try:
        write_quorum = parse_java_int(lines[0])
        ensemble_size = parse_java_int(lines[1])
        length = parse_java_int(lines[2], 64)
    except ValueError as e:
        raise _Invalid(f"v1 metadata: {e}") from None
    state = LedgerState.OPEN
    last_entry_id = INVALID_ENTRY_ID
    segments: list[Segment] = []
    for lineno, line in enumerate(lines[3:], start=4):
        parts = java_split_tabs(line)
        if len(parts) < 2:
            raise _Invalid(f"v1 metadata line {lineno} has no TAB-separated fields")
        try:
            first = parse_java_int(parts[0], 64)
        except ValueError as e:
            raise _Invalid(f"v1 metadata line {lineno}: {e}") from None
        if parts[1] == _V1_CLOSED_TAG:
            if first == _V1_IN_RECOVERY_ENTRY_ID:
                state = LedgerState.IN_RECOVERY
            else:
                state = LedgerState.CLOSED
                last_entry_id = first
            break  # Java ignores anything after the CLOSED line
        segments.append(Segment(first, tuple(parts[1:])))
    return LedgerMetadata(
        ledger_id=ledger_id,
        format_version=FORMAT_VERSION_1,
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=write_quorum,
        state=state,
        segments=tuple(segments),
        last_entry_id=last_entry_id,
        length=length if state is LedgerState.CLOSED else 0,
    )


def _read_delimited(body: bytes) -> LedgerMetadataFormat:
    """Java's `readRawVarint32`, then exactly that many bytes of message.

    The varint has at most 5 bytes and is a signed 32-bit value. Anything after
    the message is ignored.
    """
    result = 0
    pos = 0
    for shift in range(0, 35, 7):
        if pos >= len(body):
            raise _Invalid("v3 metadata truncated inside the length varint")
        b = body[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
    else:
        raise _Invalid("v3 metadata: malformed length varint (more than 5 bytes)")
    result &= 0xFFFFFFFF
    if result >= 2**31:
        raise _Invalid(f"v3 metadata: negative message length {result - 2**32}")
    if len(body) - pos < result:
        raise _Invalid(
            f"v3 metadata truncated: message of {result} bytes, only {len(body) - pos} present"
        )
    fmt = LedgerMetadataFormat()
    try:
        fmt.ParseFromString(body[pos : pos + result])
    except DecodeError as e:
        raise _Invalid(f"v3 metadata is not a LedgerMetadataFormat message: {e}") from None
    if not fmt.IsInitialized():
        missing = ", ".join(missing_required_fields(fmt))
        raise _Invalid(f"v3 metadata is missing required fields: {missing}")
    return fmt


def _text(value: object, what: str) -> str:
    # Python's protobuf hands back bytes for a proto2 string field whose bytes are
    # not UTF-8. Java would substitute U+FFFD; we refuse.
    if not isinstance(value, str):
        raise _Invalid(f"{what} is not valid UTF-8")
    return value


#: LedgerState members by wire value (the enum's call costs more than the lookup).
_STATES: Final = {int(m): m for m in LedgerState}


def _members(members: Iterable[object], segment: int) -> tuple[str, ...]:
    """An ensemble's bookie ids, refused unless every one is text (see `_text`)."""
    out = tuple(members)
    for m in out:
        if type(m) is not str:
            _text(m, f"ensemble member of segment {segment}")
    return out  # type: ignore[return-value]


def _decode_format(
    fmt: LedgerMetadataFormat, ledger_id: int, version: int, znode_ctime: int | None
) -> LedgerMetadata:
    """Java's `decodeFormat` plus the ctime choice of `parseVersion2/3Config`."""
    write_quorum = fmt.quorumSize
    ack_quorum = fmt.ackQuorumSize if fmt.HasField("ackQuorumSize") else write_quorum
    state = _STATES.get(fmt.state) or LedgerState(fmt.state)
    if state is LedgerState.CLOSED:
        # An absent lastEntryId reads as 0, as Java's optional-field getter returns.
        last_entry_id, length = fmt.lastEntryId, fmt.length
    else:
        last_entry_id, length = INVALID_ENTRY_ID, 0
    password: bytes | None = None
    digest: DigestType | None = None
    if fmt.HasField("password"):
        password = bytes(fmt.password)
        digest = DigestType(fmt.digestType)
    segments = tuple(
        Segment(seg.firstEntryId, _members(seg.ensembleMember, i))
        for i, seg in enumerate(fmt.segment)
    )
    custom: dict[str, bytes] = {}
    for entry in fmt.customMetadata:  # a Java HashMap: a repeated key keeps the last value
        custom[_text(entry.key, "custom metadata key")] = bytes(entry.value)
    if fmt.HasField("ctime"):
        ctime, stored = fmt.ctime, True
    elif znode_ctime is not None:
        ctime, stored = znode_ctime, False
    else:
        ctime, stored = -1, False
    return LedgerMetadata(
        ledger_id=ledger_id,
        format_version=version,
        ensemble_size=fmt.ensembleSize,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        state=state,
        segments=segments,
        last_entry_id=last_entry_id,
        length=length,
        digest_type=digest,
        password=password,
        ctime=ctime,
        ctime_stored=stored,
        ctoken=fmt.cToken if fmt.HasField("cToken") else None,
        custom_metadata=tuple(custom.items()),
    )


# ---------------------------------------------------------------------------
# Invariants shared by decode and encode


def _in_range(value: int, bounds: tuple[int, int], what: str) -> None:
    if not bounds[0] <= value <= bounds[1]:
        raise _Invalid(f"{what} {value} does not fit in {bounds[1].bit_length() + 1} bits")


def _validate(md: LedgerMetadata) -> None:
    """What Java's LedgerMetadataBuilder / LedgerMetadataImpl insist on, plus
    quorums of at least 1 and a non-negative length (see the module docstring)."""
    if md.format_version not in SUPPORTED_FORMAT_VERSIONS:
        raise _Invalid(f"unsupported metadata format version {md.format_version}")
    for value, what in (
        (md.ensemble_size, "ensemble size"),
        (md.write_quorum, "write quorum"),
        (md.ack_quorum, "ack quorum"),
    ):
        _in_range(value, _INT32, what)
    if md.write_quorum > md.ensemble_size:
        raise _Invalid(f"write quorum {md.write_quorum} exceeds ensemble size {md.ensemble_size}")
    if md.ack_quorum > md.write_quorum:
        raise _Invalid(f"ack quorum {md.ack_quorum} exceeds write quorum {md.write_quorum}")
    if md.ack_quorum < 1:
        raise _Invalid(f"ack quorum {md.ack_quorum} is below 1")
    if not md.segments:
        raise _Invalid("there must be at least one ensemble")
    previous: int | None = None
    for seg in md.segments:
        _in_range(seg.first_entry_id, _INT64, "first entry id")
        if previous is not None and seg.first_entry_id <= previous:
            raise _Invalid(
                f"ensemble first entry ids not strictly increasing: {seg.first_entry_id} "
                f"after {previous}"
            )
        previous = seg.first_entry_id
        if len(seg.bookies) != md.ensemble_size:
            raise _Invalid(
                f"ensemble at entry {seg.first_entry_id} has {len(seg.bookies)} bookies, "
                f"ensemble size is {md.ensemble_size}"
            )
        for bookie in seg.bookies:
            if not is_valid_bookie_id(bookie):
                raise _Invalid(f"ensemble at entry {seg.first_entry_id}: bad bookie id {bookie!r}")
    _in_range(md.last_entry_id, _INT64, "last entry id")
    _in_range(md.length, _INT64, "length")
    if md.state is LedgerState.CLOSED:
        if md.length < 0:
            raise _Invalid(f"closed ledger has negative length {md.length}")
    elif md.last_entry_id != INVALID_ENTRY_ID or md.length != 0:
        raise _Invalid(
            f"a {md.state.name} ledger must have last entry id -1 and length 0, "
            f"not {md.last_entry_id} and {md.length}"
        )
    _in_range(md.ctime, _INT64, "ctime")
    if md.ctoken is not None:
        _in_range(md.ctoken, _INT64, "cToken")


# ---------------------------------------------------------------------------
# Encoding


def varint(value: int) -> bytes:
    """A protobuf base-128 varint of a value in 0..2^64-1 (a delimited message's length
    here; the bookie protocol's hand-encoded requests too)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _encode_v1(md: LedgerMetadata) -> bytes:
    lines = [str(md.write_quorum), str(md.ensemble_size), str(md.length)]
    lines += ["\t".join([str(seg.first_entry_id), *seg.bookies]) for seg in md.segments]
    text = "".join(line + "\n" for line in lines)
    # The closing line has no LF. An open ledger ends with the LF of its last ensemble.
    if md.state is LedgerState.IN_RECOVERY:
        text += f"{_V1_IN_RECOVERY_ENTRY_ID}\t{_V1_CLOSED_TAG}"
    elif md.state is LedgerState.CLOSED:
        if md.last_entry_id == _V1_IN_RECOVERY_ENTRY_ID:
            raise _Invalid("v1 cannot store a closed ledger whose last entry id is -102")
        text += f"{md.last_entry_id}\t{_V1_CLOSED_TAG}"
    return _header(FORMAT_VERSION_1) + text.encode("utf-8")


def _build_format(md: LedgerMetadata, *, include_ctoken: bool) -> LedgerMetadataFormat:
    fmt = LedgerMetadataFormat()
    fmt.quorumSize = md.write_quorum
    fmt.ackQuorumSize = md.ack_quorum
    fmt.ensembleSize = md.ensemble_size
    fmt.length = md.length
    fmt.lastEntryId = md.last_entry_id
    fmt.state = LedgerMetadataFormat.State.Value(md.state.name)
    if md.ctime_stored:
        fmt.ctime = md.ctime
    digest = md.digest_type if md.digest_type is not None else DigestType.CRC32
    fmt.digestType = LedgerMetadataFormat.DigestType.Value(digest.name)
    fmt.password = md.password if md.password is not None else b""
    for key, value in md.custom_metadata:
        fmt.customMetadata.add(key=key, value=value)
    for seg in md.segments:
        fmt.segment.add(firstEntryId=seg.first_entry_id, ensembleMember=seg.bookies)
    if include_ctoken and md.ctoken is not None:
        fmt.cToken = md.ctoken
    return fmt
