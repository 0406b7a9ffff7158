"""The auditor reads and writes the same small records as BookKeeper's Java nodes, and Java
fixed each one's format (TextFormat or binary protobuf); a record in the wrong one makes
the Java auditor fail.

The small ZooKeeper records around ledger metadata, as BookKeeper stores them.

Java reads `underreplication/checkallledgersctime` as binary but an
under-replication mark as text, for example. So every record has its own pair of
functions, and the format is stated next to each one.

Decoders raise `RecordFormatError` (a FormatError) for anything Java could not
read: bad syntax, a missing required field, a string that is not UTF-8.
Encoders produce exactly the bytes Java writes for the same values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, TypeVar

from google.protobuf.message import DecodeError, Message

from auditor.errors import FormatError
from auditor.metadata.serde import java_read_lines, java_split_tabs, parse_java_int
from auditor.metadata.textformat import (
    DEFAULT_STYLE,
    EscapeStyle,
    TextFormatError,
    from_text,
    missing_required_fields,
    to_text,
)
from auditor.proto.data_formats_pb2 import (
    AuditorVoteFormat,
    BookieServiceInfoFormat,
    CheckAllLedgersFormat,
    CookieFormat,
    LedgerRereplicationLayoutFormat,
    LockDataFormat,
    PlacementPolicyCheckFormat,
    ReplicasCheckFormat,
    UnderreplicatedLedgerFormat,
)

__all__ = [
    "BASIC_REREPLICATION_LAYOUT",
    "CURRENT_COOKIE_LAYOUT_VERSION",
    "UNASSIGNED_CTIME",
    "BookieServiceInfo",
    "CheckKind",
    "Cookie",
    "Endpoint",
    "RecordFormatError",
    "RereplicationLayout",
    "UnderreplicatedLedgerRecord",
    "decode_auditor_vote",
    "decode_bookie_service_info",
    "decode_check_ctime",
    "decode_cookie",
    "decode_lock_data",
    "decode_rereplication_layout",
    "decode_underreplicated_ledger",
    "encode_auditor_vote",
    "encode_bookie_service_info",
    "encode_check_ctime",
    "encode_cookie",
    "encode_lock_data",
    "encode_rereplication_layout",
    "encode_underreplicated_ledger",
]

M = TypeVar("M", bound=Message)

#: Java's `UnderreplicatedLedger.UNASSIGNED_CTIME`, and what an absent check ctime reads as.
UNASSIGNED_CTIME: Final = -1
#: Cookie layout version that Java's `Cookie.toString` writes for every TextFormat cookie.
CURRENT_COOKIE_LAYOUT_VERSION: Final = 5


class RecordFormatError(FormatError):
    """A ZooKeeper record that does not decode, or a value that cannot be encoded.

    `record` names the kind of record (for example "cookie"), so that an operator
    can tell which znode type is corrupt.
    """

    def __init__(self, record: str, reason: str) -> None:
        super().__init__(f"{record}: {reason}")
        self.record = record
        self.reason = reason


def _parse_text(record: str, data: bytes | str, msg_type: type[M]) -> M:
    try:
        return from_text(data, msg_type)
    except TextFormatError as e:
        raise RecordFormatError(record, str(e)) from e


def _parse_binary(record: str, data: bytes, msg_type: type[M]) -> M:
    msg = msg_type()
    try:
        msg.ParseFromString(bytes(data))
    except DecodeError as e:
        raise RecordFormatError(record, f"not a {msg_type.__name__} message: {e}") from e
    if not msg.IsInitialized():
        missing = ", ".join(missing_required_fields(msg))
        raise RecordFormatError(record, f"missing required fields: {missing}")
    return msg


def _utf8(record: str, value: object, what: str) -> str:
    # Python's protobuf returns bytes for a binary proto2 string that is not UTF-8.
    if not isinstance(value, str):
        raise RecordFormatError(record, f"{what} is not valid UTF-8")
    return value


def _build(record: str, msg_type: type[M], **fields: object) -> M:
    """Construct a message, turning protobuf's range and type errors into ours."""
    try:
        return msg_type(**fields)
    except (ValueError, TypeError) as e:
        raise RecordFormatError(record, f"cannot encode: {e}") from e


# ---------------------------------------------------------------------------
# underreplication/ledgers/.../urL<id>: TextFormat UnderreplicatedLedgerFormat


@dataclass(frozen=True, slots=True)
class UnderreplicatedLedgerRecord:
    """An under-replication mark: the bookies that lost copies, and when it was marked.

    `ctime` is None when the mark carries no time. Java then uses
    UNASSIGNED_CTIME (-1). Keeping None apart preserves the exact bytes on a rewrite.
    """

    replicas: tuple[str, ...] = ()
    ctime: int | None = None

    @property
    def ctime_or_unassigned(self) -> int:
        return UNASSIGNED_CTIME if self.ctime is None else self.ctime


def encode_underreplicated_ledger(
    rec: UnderreplicatedLedgerRecord, *, style: EscapeStyle = DEFAULT_STYLE
) -> bytes:
    """TextFormat, for example `replica: "10.0.0.1:3181"\\nctime: 1700000000000\\n`."""
    fmt = _build("under-replicated ledger", UnderreplicatedLedgerFormat, replica=list(rec.replicas))
    if rec.ctime is not None:
        try:
            fmt.ctime = rec.ctime
        except (ValueError, TypeError) as e:
            raise RecordFormatError("under-replicated ledger", f"cannot encode: {e}") from e
    return to_text(fmt, style=style)


def decode_underreplicated_ledger(data: bytes) -> UnderreplicatedLedgerRecord:
    fmt = _parse_text("under-replicated ledger", data, UnderreplicatedLedgerFormat)
    return UnderreplicatedLedgerRecord(
        replicas=tuple(fmt.replica), ctime=fmt.ctime if fmt.HasField("ctime") else None
    )


# ---------------------------------------------------------------------------
# underreplication/LAYOUT: TextFormat LedgerRereplicationLayoutFormat


@dataclass(frozen=True, slots=True)
class RereplicationLayout:
    """The under-replication LAYOUT. Java accepts only type BASIC, version 1."""

    type: str
    version: int

    @property
    def supported(self) -> bool:
        return self == BASIC_REREPLICATION_LAYOUT


BASIC_REREPLICATION_LAYOUT: Final = RereplicationLayout("BASIC", 1)


def encode_rereplication_layout(layout: RereplicationLayout = BASIC_REREPLICATION_LAYOUT) -> bytes:
    """TextFormat: `type: "BASIC"\\nversion: 1\\n`."""
    fmt = _build(
        "rereplication layout",
        LedgerRereplicationLayoutFormat,
        type=layout.type,
        version=layout.version,
    )
    return to_text(fmt)


def decode_rereplication_layout(data: bytes) -> RereplicationLayout:
    """Any well-formed layout. Check `.supported` to decide whether to go on."""
    fmt = _parse_text("rereplication layout", data, LedgerRereplicationLayoutFormat)
    return RereplicationLayout(fmt.type, fmt.version)


# ---------------------------------------------------------------------------
# Auditor votes and replication locks: TextFormat `bookieId: "..."`


def encode_auditor_vote(bookie_id: str) -> bytes:
    """The data of an `auditorelection/V_...` vote and of the election node itself."""
    return to_text(_build("auditor vote", AuditorVoteFormat, bookieId=bookie_id))


def decode_auditor_vote(data: bytes) -> str | None:
    """The voter's bookie id, or None if the vote names none."""
    fmt = _parse_text("auditor vote", data, AuditorVoteFormat)
    return fmt.bookieId if fmt.HasField("bookieId") else None


def encode_lock_data(bookie_id: str) -> bytes:
    """The data of an `underreplication/locks/urL...` lock. Java puts its hostname here."""
    return to_text(_build("replication lock", LockDataFormat, bookieId=bookie_id))


def decode_lock_data(data: bytes) -> str | None:
    fmt = _parse_text("replication lock", data, LockDataFormat)
    return fmt.bookieId if fmt.HasField("bookieId") else None


# ---------------------------------------------------------------------------
# underreplication/*ctime: BINARY protobuf with one int64 field


class CheckKind(enum.Enum):
    """The three periodic checks whose last run time is kept in ZooKeeper."""

    CHECK_ALL_LEDGERS = ("checkallledgersctime", CheckAllLedgersFormat, "checkAllLedgersCTime")
    PLACEMENT_POLICY_CHECK = (
        "placementpolicycheckctime",
        PlacementPolicyCheckFormat,
        "placementPolicyCheckCTime",
    )
    REPLICAS_CHECK = ("replicascheckctime", ReplicasCheckFormat, "replicasCheckCTime")

    def __init__(self, znode: str, message: type[Message], field_name: str) -> None:
        #: The znode name under `<root>/underreplication`.
        self.znode = znode
        self.message = message
        self.field_name = field_name


def encode_check_ctime(kind: CheckKind, ctime_ms: int) -> bytes:
    """Binary: 1700000000000 -> `08 80d095ffbc31`."""
    msg = _build(kind.znode, kind.message, **{kind.field_name: ctime_ms})
    return msg.SerializeToString()


def decode_check_ctime(kind: CheckKind, data: bytes) -> int:
    """The time in ms, or UNASSIGNED_CTIME (-1) if the record has none, as in Java."""
    msg = _parse_binary(kind.znode, data, kind.message)
    if not msg.HasField(kind.field_name):
        return UNASSIGNED_CTIME
    value: int = getattr(msg, kind.field_name)
    return value


# ---------------------------------------------------------------------------
# available/<bookieId>: BINARY BookieServiceInfoFormat

_BSI = "bookie service info"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One way to reach a bookie. The auditor wants protocol `bookie-rpc`."""

    id: str
    port: int
    host: str
    protocol: str
    auth: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BookieServiceInfo:
    """What a bookie publishes in its registration znode.

    Properties are kept as pairs sorted by key, so the value stays hashable and
    compares equal whatever order the map arrived in.
    """

    endpoints: tuple[Endpoint, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()

    def endpoint(self, protocol: str = "bookie-rpc") -> Endpoint | None:
        """The first endpoint speaking `protocol`, as Java's address resolver picks it."""
        return next((e for e in self.endpoints if e.protocol == protocol), None)

    def get_property(self, name: str) -> str | None:
        return next((v for k, v in self.properties if k == name), None)


def encode_bookie_service_info(info: BookieServiceInfo) -> bytes:
    """Binary. Map entries come out sorted by key, which makes the encoding deterministic.
    Java's order is that of its map, and readers do not care about it."""
    msg = BookieServiceInfoFormat()
    try:
        for e in info.endpoints:
            msg.endpoints.add(
                id=e.id,
                port=e.port,
                host=e.host,
                protocol=e.protocol,
                auth=list(e.auth),
                extensions=list(e.extensions),
            )
        for key, value in info.properties:
            msg.properties[key] = value
    except (ValueError, TypeError) as err:
        raise RecordFormatError(_BSI, f"cannot encode: {err}") from err
    return msg.SerializeToString(deterministic=True)


def decode_bookie_service_info(data: bytes) -> BookieServiceInfo:
    """Decode registration data.

    Empty data decodes to no endpoints. A bookie older than 4.12 writes nothing,
    and the caller must then derive the legacy endpoint from the bookie id
    (spec §6).
    """
    msg = _parse_binary(_BSI, data, BookieServiceInfoFormat)
    endpoints = tuple(
        Endpoint(
            id=_utf8(_BSI, e.id, "endpoint id"),
            port=e.port,
            host=_utf8(_BSI, e.host, "endpoint host"),
            protocol=_utf8(_BSI, e.protocol, "endpoint protocol"),
            auth=tuple(_utf8(_BSI, a, "endpoint auth") for a in e.auth),
            extensions=tuple(_utf8(_BSI, x, "endpoint extension") for x in e.extensions),
        )
        for e in msg.endpoints
    )
    try:
        pairs = list(msg.properties.items())
    except UnicodeDecodeError:
        # upb hands back bytes for a bad string value but raises for a bad map key.
        raise RecordFormatError(_BSI, "property name is not valid UTF-8") from None
    properties = tuple(
        sorted(
            (_utf8(_BSI, k, "property name"), _utf8(_BSI, v, "property value")) for k, v in pairs
        )
    )
    return BookieServiceInfo(endpoints, properties)


# ---------------------------------------------------------------------------
# cookies/<bookieId>: "<layoutVersion>\n" + TextFormat CookieFormat (or v3 lines)

# Java's String.trim() removes every char <= U+0020, not just whitespace.
_JAVA_TRIM = "".join(chr(c) for c in range(0x21))


@dataclass(frozen=True, slots=True)
class Cookie:
    """A bookie's cookie.

    The directory fields keep Java's encoding: `<count>` followed by a TAB before
    each path.
    """

    layout_version: int
    bookie_id: str
    journal_dirs: str
    ledger_dirs: str
    instance_id: str | None = None
    index_dirs: str | None = None

    def ledger_dir_paths(self) -> tuple[str, ...]:
        return _dir_paths(self.ledger_dirs)

    def index_dir_paths(self) -> tuple[str, ...] | None:
        return None if self.index_dirs is None else _dir_paths(self.index_dirs)


def _dir_paths(encoded: str) -> tuple[str, ...]:
    # Java's decodeDirPathFromCookie: drop the count before the first TAB, split the rest.
    return tuple(java_split_tabs(encoded[encoded.find("\t") + 1 :]))


def encode_cookie(cookie: Cookie, *, style: EscapeStyle = DEFAULT_STYLE) -> bytes:
    """Encode a cookie as Java's `Cookie.toString` does, as UTF-8.

    A cookie of layout 4 or later is written as "5\\n" plus TextFormat, whatever
    its own layout version, as Java does. A layout-3 cookie is written as its
    three lines under "3\\n". Java would put "5" there too, which makes the cookie
    unreadable, and we do not copy that bug. Older layouts cannot be encoded.
    """
    if cookie.layout_version == 3:
        lines = (cookie.bookie_id, cookie.journal_dirs, cookie.ledger_dirs)
        if any("\n" in s or "\r" in s for s in lines):
            raise RecordFormatError("cookie", "cannot encode: line break inside a v3 field")
        return ("3\n" + "".join(s + "\n" for s in lines)).encode("utf-8")
    if cookie.layout_version < 3:
        raise RecordFormatError("cookie", f"cannot encode layout version {cookie.layout_version}")
    fields: dict[str, object] = {
        "bookieHost": cookie.bookie_id,
        "journalDir": cookie.journal_dirs,
        "ledgerDirs": cookie.ledger_dirs,
    }
    if cookie.instance_id is not None:
        fields["instanceId"] = cookie.instance_id
    if cookie.index_dirs is not None:
        fields["indexDirs"] = cookie.index_dirs
    fmt = _build("cookie", CookieFormat, **fields)
    return f"{CURRENT_COOKIE_LAYOUT_VERSION}\n".encode("ascii") + to_text(fmt, style=style)


def decode_cookie(data: bytes) -> Cookie:
    """Decode a cookie as Java's `Cookie.parseFromBytes` does.

    The first line is the layout version. Layout 3 has three plain lines (bookie
    id, journal dirs, ledger dirs), and layout 4 or later has TextFormat after the
    first line. An empty instanceId or indexDirs counts as absent, as in Java.
    Layouts before 3 are refused, because Java cannot verify them either. So is a
    layout-3 cookie with fewer than three lines, where Java would keep nulls.
    """
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise RecordFormatError("cookie", "not UTF-8 text") from None
    lines = java_read_lines(text)
    if not lines:
        raise RecordFormatError("cookie", "empty")
    try:
        version = parse_java_int(lines[0].strip(_JAVA_TRIM))
    except ValueError as e:
        raise RecordFormatError("cookie", f"bad layout version line: {e}") from None
    if version == 3:
        if len(lines) < 4:
            raise RecordFormatError(
                "cookie", "a layout 3 cookie needs bookie id, journal and ledger lines"
            )
        return Cookie(3, lines[1], lines[2], lines[3])
    if version < 3:
        raise RecordFormatError("cookie", f"layout version {version} is too old")
    # The TextFormat starts after the first line terminator (LF, CR or CRLF).
    first = len(lines[0])
    rest = text[first + 2 :] if text.startswith("\r\n", first) else text[first + 1 :]
    fmt = _parse_text("cookie", rest, CookieFormat)
    return Cookie(
        layout_version=version,
        bookie_id=fmt.bookieHost,
        journal_dirs=fmt.journalDir,
        ledger_dirs=fmt.ledgerDirs,
        instance_id=fmt.instanceId or None,
        index_dirs=fmt.indexDirs or None,
    )
