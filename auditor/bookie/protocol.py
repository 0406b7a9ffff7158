"""Every byte to or from a bookie passes through here, so that what we send is always a
complete v3 message and what a broken bookie sends can only ever fail its own connection.

BookKeeper's v3 bookie protocol: frames, requests, responses and entry bodies.

A real bookie decides per connection whether it speaks v3 by parsing the
first frame as a v3 `Request`; a malformed one silently switches that
connection to the old binary protocol, after which nothing we send makes
sense to it. So every request leaves here through builders that set each
required field, and `encode_message` refuses anything not fully initialised.

In the other direction a peer may send anything at all. Everything that turns
bytes into values here (the frame parser, the message decoders, the entry body
decoder) raises `BookieProtocolError` and nothing else for input it cannot
use, so one broken bookie costs its own connection and never crashes a check.

The Python protobuf runtime does not enforce `required` on parse, so the
decoders check `IsInitialized()` themselves; that also rejects unknown enum
values in required fields (proto2 parks them as unknown fields).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

import google_crc32c
from google.protobuf.message import Message

from auditor.errors import FormatError
from auditor.metadata.model import DigestType
from auditor.metadata.serde import varint
from auditor.proto import bookkeeper_protocol_pb2 as pb

__all__ = [
    "AUTH_DISABLED_PLUGIN",
    "ENTRY_HEADER_SIZE",
    "LAST_ADD_CONFIRMED",
    "LENGTH_PREFIX_SIZE",
    "MAX_FRAME_SIZE",
    "BookieInfoFlag",
    "BookieProtocolError",
    "DigestMismatchError",
    "EntryBody",
    "EntryHeader",
    "FrameParser",
    "Operation",
    "Status",
    "add_entry_frame",
    "add_entry_request",
    "auth_request",
    "decode_entry_body",
    "decode_entry_header",
    "decode_frame",
    "decode_request",
    "decode_response",
    "digest_size",
    "effective_status",
    "encode_entry_body",
    "encode_frame",
    "encode_message",
    "entry_digest",
    "get_bookie_info_request",
    "get_list_of_entries_request",
    "is_auth_refusal",
    "master_key",
    "read_entry_frame",
    "read_entry_request",
    "read_lac_request",
    "request_header",
    "response_header",
    "start_tls_request",
    "verified_entry_ids",
    "verify_entry_body",
]

#: Bytes of the big-endian length that precedes every frame's payload.
LENGTH_PREFIX_SIZE: Final = 4
#: Upstream `nettyMaxFrameSizeBytes` default; both sides drop a longer frame.
MAX_FRAME_SIZE: Final = 5 * 1024 * 1024
#: Entry id that asks READ_ENTRY for the bookie's last entry of the ledger.
LAST_ADD_CONFIRMED: Final = -1
#: Plugin name a bookie without authentication reports in its AUTH reply.
AUTH_DISABLED_PLUGIN: Final = "AuthDisabledPlugin"
#: ledgerId, entryId, lastAddConfirmed, length: four big-endian int64.
ENTRY_HEADER_SIZE: Final = 32

_UINT64_MAX: Final = (1 << 64) - 1
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_HEADER = struct.Struct(">qqqq")
_LENGTH = struct.Struct(">I")


class BookieProtocolError(FormatError):
    """Bytes from a peer that are not a usable v3 frame, message or entry body."""


class DigestMismatchError(BookieProtocolError):
    """An entry body whose digest does not match its header and payload."""


class Status(enum.IntEnum):
    """`StatusCode`: what a bookie says about one request."""

    EOK = 0
    ENOLEDGER = 402
    ENOENTRY = 403
    EBADREQ = 404
    EIO = 501
    EUA = 502
    EBADVERSION = 503
    EFENCED = 504
    EREADONLY = 505
    ETOOMANYREQUESTS = 506
    EUNKNOWNLEDGERSTATE = 507


class Operation(enum.IntEnum):
    """`OperationType`: half of the key that matches a response to its request."""

    READ_ENTRY = 1
    ADD_ENTRY = 2
    RANGE_READ_ENTRY = 3
    RANGE_ADD_ENTRY = 4
    AUTH = 5
    WRITE_LAC = 6
    READ_LAC = 7
    GET_BOOKIE_INFO = 8
    START_TLS = 9
    FORCE_LEDGER = 10
    GET_LIST_OF_ENTRIES_OF_LEDGER = 11
    BATCH_READ_ENTRY = 12


class BookieInfoFlag(enum.IntFlag):
    """Bits of `GetBookieInfoRequest.requested`."""

    TOTAL_DISK_CAPACITY = 0x01
    FREE_DISK_SPACE = 0x02


# --- framing -----------------------------------------------------------------


def encode_frame(payload: bytes, *, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
    """Prefixes `payload` with its 4-byte big-endian length."""
    if len(payload) > max_frame_size:
        raise BookieProtocolError(
            f"frame payload of {len(payload)} bytes exceeds the {max_frame_size}-byte limit"
        )
    return _LENGTH.pack(len(payload)) + payload


def decode_frame(frame: bytes, *, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
    """The payload of exactly one complete frame (no bytes before or after it)."""
    parser = FrameParser(max_frame_size=max_frame_size)
    payloads = parser.feed(frame)
    if len(payloads) != 1 or parser.buffered:
        raise BookieProtocolError(
            f"expected exactly one frame, got {len(payloads)} and {parser.buffered} spare bytes"
        )
    return payloads[0]


class FrameParser:
    """Splits a byte stream into frame payloads, however the stream is chunked.

    A length above `max_frame_size` (which includes every length with the sign
    bit set, negative to Java) poisons the parser: the stream has lost sync and
    the only safe move is to close the connection, as Netty does.
    """

    __slots__ = ("_buf", "_error", "_max")

    def __init__(self, *, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()
        self._max = max_frame_size
        self._error: BookieProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet form a complete frame."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Adds `data` and returns the payloads of every frame it completes, in order.

        Each payload is copied once out of what was received: straight from `data` when
        nothing was left over from before (the common case, and what lets a large entry
        body through without a second copy), else out of the buffer through a view.
        """
        if self._error is not None:
            raise self._error
        if not self._buf and type(data) is bytes:
            out, pos = self._frames(data, len(data))
            if pos < len(data):
                self._buf += memoryview(data)[pos:]
            return out
        buf = self._buf
        buf += data
        with memoryview(buf) as view:
            out, pos = self._frames(view, len(buf))
        if pos:
            del buf[:pos]
        return out

    def _frames(self, src: bytes | memoryview, end: int) -> tuple[list[bytes], int]:
        """The payloads of the complete frames at the start of `src` (`end` bytes long),
        and where the first incomplete one starts."""
        out: list[bytes] = []
        pos = 0
        while end - pos >= LENGTH_PREFIX_SIZE:
            (length,) = _LENGTH.unpack_from(src, pos)
            if length > self._max:
                self._error = BookieProtocolError(
                    f"frame length {length} exceeds the {self._max}-byte limit"
                )
                self._buf = bytearray()  # a new one: `src` may be a view of the old
                raise self._error
            start = pos + LENGTH_PREFIX_SIZE
            if end - start < length:
                break
            out.append(bytes(src[start : start + length]))
            pos = start + length
        return out, pos


# --- messages ----------------------------------------------------------------

_M = TypeVar("_M", bound=Message)


def _parse(cls: Callable[[], _M], what: str, payload: bytes) -> _M:
    msg = cls()
    try:
        msg.ParseFromString(payload)
        complete = msg.IsInitialized()
    except Exception as exc:  # DecodeError, RuntimeError or whatever the runtime throws
        raise BookieProtocolError(f"payload is not a v3 {what}: {exc}") from exc
    if not complete:
        raise BookieProtocolError(f"v3 {what} lacks required fields")
    return msg


def decode_request(payload: bytes) -> pb.Request:
    """Parses a frame payload as a `Request` with every required field present."""
    return _parse(pb.Request, "Request", payload)


def decode_response(payload: bytes) -> pb.Response:
    """Parses a frame payload as a `Response` with every required field present."""
    return _parse(pb.Response, "Response", payload)


def encode_message(msg: pb.Request | pb.Response, *, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
    """Serialises a complete message into one frame (length prefix included)."""
    if not msg.IsInitialized():
        raise ValueError(f"refusing to send an incomplete {type(msg).__name__}")
    return encode_frame(msg.SerializeToString(), max_frame_size=max_frame_size)


def _check_txn(txn_id: int) -> int:
    if not 0 <= txn_id <= _UINT64_MAX:
        raise ValueError(f"txnId {txn_id} is not a uint64")
    return txn_id


def _check_i64(name: str, value: int) -> int:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{name} {value} is not an int64")
    return value


#: The header priority the Java client gives a request it flags FLAG_HIGH_PRIORITY
#: (`PerChannelBookieClient`'s DEFAULT_HIGH_PRIORITY_VALUE). Of the requests the product
#: sends, ledger recovery's re-adds (`PendingAddOp`: FLAG_RECOVERY_ADD |
#: FLAG_HIGH_PRIORITY) and its reads forward from the LAC (`PendingReadOp`:
#: FLAG_DO_FENCING | FLAG_HIGH_PRIORITY) carry it; the re-replicator's copies
#: (`LedgerFragmentReplicator`: FLAG_RECOVERY_ADD alone) and the fencing read of the last
#: entry (`ReadLastConfirmedOp`: FLAG_DO_FENCING alone) do not, as the 4.17.2 client's
#: bytecode shows. It matters for adds: a read-only bookie takes one only with a
#: priority above 0. A read-only 4.17.2 bookie serves fencing and recovery reads
#: whatever their priority (tests/interop/test_conformance.py); there the priority only
#: picks the bookie's high-priority thread pool, which FENCE_LEDGER picks anyway.
HIGH_PRIORITY: Final = 100


def request_header(operation: Operation, txn_id: int, priority: int = 0) -> pb.BKPacketHeader:
    """A v3 header as the Java client sends it: no priority unless the request is one the
    client sends at high priority (`HIGH_PRIORITY`)."""
    header = pb.BKPacketHeader(
        version=pb.VERSION_THREE,
        operation=pb.OperationType.ValueType(int(operation)),
        txnId=_check_txn(txn_id),
    )
    if priority:
        header.priority = priority
    return header


def response_header(operation: Operation | int, txn_id: int) -> pb.BKPacketHeader:
    """The header a bookie puts on its answers: version 3, the request's op and txnId."""
    return pb.BKPacketHeader(
        version=pb.VERSION_THREE,
        operation=pb.OperationType.ValueType(int(operation)),
        txnId=_check_txn(txn_id),
    )


def read_entry_request(
    txn_id: int,
    ledger_id: int,
    entry_id: int,
    *,
    fence_key: bytes | None = None,
    high_priority: bool = False,
) -> pb.Request:
    """A READ_ENTRY, never piggyback, never long-poll; fencing only with `fence_key`.

    With `fence_key` (the ledger's master key) it carries `flag = FENCE_LEDGER`, as
    ledger recovery sends it: the bookie fences the ledger (plain adds get EFENCED from
    then on) before it answers. `high_priority` adds the header's priority
    (`HIGH_PRIORITY`), as Java's recovery reads past the LAC have it.
    """
    read = pb.ReadRequest(
        ledgerId=_check_i64("ledgerId", ledger_id),
        entryId=_check_i64("entryId", entry_id),
    )
    if fence_key is not None:
        read.flag = pb.ReadRequest.FENCE_LEDGER
        read.masterKey = fence_key
    priority = HIGH_PRIORITY if high_priority else 0
    return pb.Request(
        header=request_header(Operation.READ_ENTRY, txn_id, priority), readRequest=read
    )


def read_lac_request(txn_id: int, ledger_id: int) -> pb.Request:
    return pb.Request(
        header=request_header(Operation.READ_LAC, txn_id),
        readLacRequest=pb.ReadLacRequest(ledgerId=_check_i64("ledgerId", ledger_id)),
    )


def get_bookie_info_request(txn_id: int, requested: int = 3) -> pb.Request:
    return pb.Request(
        header=request_header(Operation.GET_BOOKIE_INFO, txn_id),
        getBookieInfoRequest=pb.GetBookieInfoRequest(requested=_check_i64("requested", requested)),
    )


def get_list_of_entries_request(txn_id: int, ledger_id: int) -> pb.Request:
    return pb.Request(
        header=request_header(Operation.GET_LIST_OF_ENTRIES_OF_LEDGER, txn_id),
        getListOfEntriesOfLedgerRequest=pb.GetListOfEntriesOfLedgerRequest(
            ledgerId=_check_i64("ledgerId", ledger_id)
        ),
    )


#: Request.header (field 1, length-delimited) holds version = VERSION_THREE (field 1),
#: operation = GET_LIST_OF_ENTRIES_OF_LEDGER (field 2) and then txnId (field 3).
_LIST_HEADER_START: Final = b"\x08\x03\x10\x0b\x18"
#: Request.getListOfEntriesOfLedgerRequest: field 108, length-delimited (tag varint 866).
_LIST_BODY_TAG: Final = b"\xe2\x06"


def list_request_frame(txn_id: int, ledger_id: int) -> bytes:
    """`get_list_of_entries_request(txn_id, ledger_id)` as a complete frame, encoded here.

    The replicas check sends one per (ledger, bookie): building and serialising the
    protobuf message cost more than the rest of sending it. The bytes are those
    protobuf writes (fields in number order), which the tests check against
    `encode_message` of the built request.
    """
    header = _LIST_HEADER_START + varint(_check_txn(txn_id))
    body = b"\x08" + varint(_check_i64("ledgerId", ledger_id) & _UINT64_MAX)
    message = b"\x0a" + bytes((len(header),)) + header + _LIST_BODY_TAG + bytes((len(body),)) + body
    return _LENGTH.pack(len(message)) + message


#: Request.header of a READ_ENTRY: version = VERSION_THREE, operation = READ_ENTRY, then
#: the txnId's tag (its varint follows).
_READ_HEADER_START: Final = b"\x08\x03\x10\x01\x18"
#: Request.readRequest: field 100, length-delimited (tag varint 802).
_READ_BODY_TAG: Final = b"\xa2\x06"
#: Request.header of an ADD_ENTRY (operation = ADD_ENTRY), up to the txnId's varint.
_ADD_HEADER_START: Final = b"\x08\x03\x10\x02\x18"
#: Request.addRequest: field 101, length-delimited (tag varint 810).
_ADD_BODY_TAG: Final = b"\xaa\x06"
#: AddRequest.flag = RECOVERY_ADD: field 100, varint (tag 800), written after the body
#: because protobuf writes fields in number order.
_RECOVERY_FLAG: Final = b"\xa0\x06" + bytes((int(pb.AddRequest.RECOVERY_ADD),))


#: One-byte varints, by value.
_VARINT1: Final = tuple(bytes((v,)) for v in range(0x80))


def _uvarint(value: int) -> bytes:
    """`varint` with the common sizes unrolled: ids and txnIds below 2^14 (one or two
    bytes) are most of what the worker sends, several per entry."""
    if value < 0x80:
        return _VARINT1[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    return varint(value)


def read_entry_frame(txn_id: int, ledger_id: int, entry_id: int) -> bytes:
    """`read_entry_request(txn_id, ledger_id, entry_id)` (plain: no fencing, no priority) as
    a complete frame, encoded here.

    The replication worker sends one per entry it copies; building the protobuf message
    cost more than the rest of sending it. The bytes are protobuf's (fields in number
    order), which the tests check against `encode_message` of the built request.
    """
    if not (
        0 <= txn_id <= _UINT64_MAX and 0 <= ledger_id <= _INT64_MAX and 0 <= entry_id <= _INT64_MAX
    ):
        # Negative ids (ten-byte varints) and values out of range (refused).
        _check_txn(txn_id)
        ledger_id = _check_i64("ledgerId", ledger_id) & _UINT64_MAX
        entry_id = _check_i64("entryId", entry_id) & _UINT64_MAX
    header = _uvarint(txn_id)
    body = b"".join((b"\x08", _uvarint(ledger_id), b"\x10", _uvarint(entry_id)))
    size = 2 + len(_READ_HEADER_START) + len(header) + len(_READ_BODY_TAG) + 1 + len(body)
    return b"".join(
        (
            _LENGTH.pack(size),
            b"\x0a",
            _VARINT1[len(_READ_HEADER_START) + len(header)],
            _READ_HEADER_START,
            header,
            _READ_BODY_TAG,
            _VARINT1[len(body)],
            body,
        )
    )


def add_entry_frame(
    txn_id: int, ledger_id: int, entry_id: int, master_key: bytes, body: bytes, *, recovery: bool
) -> tuple[bytes, bytes, bytes]:
    """`add_entry_request(txn_id, ...)` (no priority) as a complete frame in three parts:
    what precedes the body, the body itself (the very object given, not a copy), and what
    follows it (the RECOVERY_ADD flag, or nothing).

    Joined, the parts are the bytes protobuf writes for the built request (the tests check
    it); kept apart, a large entry body (Pulsar batches reach 1 MiB) is not copied into a
    message and then into a frame: it is copied once, into the buffer the connection
    sends.
    """
    if not (
        0 <= txn_id <= _UINT64_MAX and 0 <= ledger_id <= _INT64_MAX and 0 <= entry_id <= _INT64_MAX
    ):
        _check_txn(txn_id)
        ledger_id = _check_i64("ledgerId", ledger_id) & _UINT64_MAX
        entry_id = _check_i64("entryId", entry_id) & _UINT64_MAX
    fields = b"".join(
        (
            b"\x08",
            _uvarint(ledger_id),
            b"\x10",
            _uvarint(entry_id),
            b"\x1a",
            _uvarint(len(master_key)),
            master_key,
            b"\x22",
            _uvarint(len(body)),
        )
    )
    suffix = _RECOVERY_FLAG if recovery else b""
    inner = _uvarint(len(fields) + len(body) + len(suffix))
    header = _uvarint(txn_id)
    size = 2 + len(_ADD_HEADER_START) + len(header) + len(_ADD_BODY_TAG) + len(inner) + len(fields)
    prefix = b"".join(
        (
            _LENGTH.pack(size + len(body) + len(suffix)),
            b"\x0a",
            _VARINT1[len(_ADD_HEADER_START) + len(header)],
            _ADD_HEADER_START,
            header,
            _ADD_BODY_TAG,
            inner,
            fields,
        )
    )
    return prefix, body, suffix


def add_entry_request(
    txn_id: int,
    ledger_id: int,
    entry_id: int,
    master_key: bytes,
    body: bytes,
    *,
    recovery: bool = False,
    high_priority: bool = False,
) -> pb.Request:
    """An ADD_ENTRY with no write flags; `body` is the full entry body.

    With `recovery` it carries `flag = RECOVERY_ADD`, as the Java replicator and ledger
    recovery send it: the bookie accepts it on a fenced ledger (still checking the
    master key). `high_priority` adds the header's priority (`HIGH_PRIORITY`), as ledger
    recovery's re-adds have it and the replicator's copies do not: a read-only bookie
    refuses an add without it (recovery re-adds to the ensemble it has, read-only
    members included; the replicator writes to writable bookies only).
    """
    add = pb.AddRequest(
        ledgerId=_check_i64("ledgerId", ledger_id),
        entryId=_check_i64("entryId", entry_id),
        masterKey=master_key,
        body=body,
    )
    if recovery:
        add.flag = pb.AddRequest.RECOVERY_ADD
    priority = HIGH_PRIORITY if high_priority else 0
    return pb.Request(header=request_header(Operation.ADD_ENTRY, txn_id, priority), addRequest=add)


def auth_request(
    txn_id: int, plugin: str = AUTH_DISABLED_PLUGIN, payload: bytes = b""
) -> pb.Request:
    return pb.Request(
        header=request_header(Operation.AUTH, txn_id),
        authRequest=pb.AuthMessage(authPluginName=plugin, payload=payload),
    )


def start_tls_request(txn_id: int) -> pb.Request:
    """START_TLS: the bookie answers in clear, then both ends upgrade the same connection."""
    return pb.Request(
        header=request_header(Operation.START_TLS, txn_id), startTLSRequest=pb.StartTLSRequest()
    )


#: The response body that carries each operation's own status.
_INNER: Final = {
    int(Operation.READ_ENTRY): "readResponse",
    int(Operation.ADD_ENTRY): "addResponse",
    int(Operation.READ_LAC): "readLacResponse",
    int(Operation.GET_BOOKIE_INFO): "getBookieInfoResponse",
    int(Operation.GET_LIST_OF_ENTRIES_OF_LEDGER): "getListOfEntriesOfLedgerResponse",
    int(Operation.WRITE_LAC): "writeLacResponse",
    int(Operation.FORCE_LEDGER): "forceLedgerResponse",
}
#: Status members by value: `Status(x)` goes through the enum machinery on every answer.
_STATUS_OF: Final = {int(s): s for s in Status}


def _inner_status(resp: pb.Response, op: int) -> int | None:
    body = _INNER.get(op)
    if body is None or not resp.HasField(body):  # type: ignore[arg-type]
        return None
    status: int = getattr(resp, body).status
    return status


def is_auth_refusal(resp: pb.Response) -> bool:
    """EUA from the bookie's authentication layer: the request was refused unread.

    That reply copies the request header and has no body; an EUA for a wrong
    master key comes inside the operation's own response instead.
    """
    return int(resp.status) == Status.EUA and _inner_status(resp, resp.header.operation) is None


def effective_status(resp: pb.Response) -> Status:
    """The status the Java client acts on: the top-level one, or the inner one if that is EOK."""
    top = int(resp.status)
    if top != Status.EOK:
        return _STATUS_OF.get(top) or Status(top)
    inner = _inner_status(resp, resp.header.operation)
    if inner is None or inner == Status.EOK:
        return Status.EOK
    return _STATUS_OF.get(inner) or Status(inner)


# --- entry bodies --------------------------------------------------------------


def master_key(password: bytes) -> bytes:
    """The 20-byte key adds carry: SHA-1 of b"ledger" followed by the ledger password."""
    return hashlib.sha1(b"ledger" + password).digest()


_DIGEST_SIZES: Final = {
    DigestType.DUMMY: 0,
    DigestType.CRC32C: 4,
    DigestType.CRC32: 8,
    DigestType.HMAC: 20,
}


def digest_size(digest_type: DigestType) -> int:
    return _DIGEST_SIZES[digest_type]


def entry_digest(
    digest_type: DigestType, header: bytes, payload: bytes, password: bytes = b""
) -> bytes:
    """The digest over the 32-byte header followed by the payload, as written on the wire."""
    if digest_type is DigestType.CRC32C:
        crc = google_crc32c.extend(google_crc32c.value(header), payload)
        return int(crc).to_bytes(4, "big")
    if digest_type is DigestType.CRC32:
        return zlib.crc32(payload, zlib.crc32(header)).to_bytes(8, "big")
    if digest_type is DigestType.HMAC:
        key = hashlib.sha1(b"mac" + password).digest()
        mac = hmac.new(key, header, hashlib.sha1)
        mac.update(payload)
        return mac.digest()
    return b""


@dataclass(frozen=True, slots=True)
class EntryHeader:
    """The digest-independent first 32 bytes of an entry body."""

    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    length: int


@dataclass(frozen=True, slots=True)
class EntryBody:
    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    length: int
    digest: bytes
    payload: bytes


def encode_entry_body(
    ledger_id: int,
    entry_id: int,
    last_add_confirmed: int,
    length: int,
    payload: bytes,
    digest_type: DigestType = DigestType.CRC32C,
    password: bytes = b"",
) -> bytes:
    """An entry as a writer sends it: header, digest of header + payload, payload.

    `length` is the ledger's total payload length up to and including this entry.
    """
    header = _HEADER.pack(
        _check_i64("ledgerId", ledger_id),
        _check_i64("entryId", entry_id),
        _check_i64("lastAddConfirmed", last_add_confirmed),
        _check_i64("length", length),
    )
    return header + entry_digest(digest_type, header, payload, password) + payload


def decode_entry_header(body: bytes) -> EntryHeader:
    if len(body) < ENTRY_HEADER_SIZE:
        raise BookieProtocolError(
            f"entry body of {len(body)} bytes is shorter than the {ENTRY_HEADER_SIZE}-byte header"
        )
    return EntryHeader(*_HEADER.unpack_from(body))


def decode_entry_body(body: bytes, digest_type: DigestType) -> EntryBody:
    """Splits a body into its fields without checking the digest."""
    h = decode_entry_header(body)
    m = digest_size(digest_type)
    if len(body) < ENTRY_HEADER_SIZE + m:
        raise BookieProtocolError(
            f"entry body of {len(body)} bytes has no room for a {m}-byte {digest_type.name} digest"
        )
    return EntryBody(
        h.ledger_id,
        h.entry_id,
        h.last_add_confirmed,
        h.length,
        bytes(body[ENTRY_HEADER_SIZE : ENTRY_HEADER_SIZE + m]),
        bytes(body[ENTRY_HEADER_SIZE + m :]),
    )


_IDS = struct.Struct(">qq")


def verified_entry_ids(
    body: bytes, digest_type: DigestType, password: bytes = b""
) -> tuple[int, int]:
    """`verify_entry_body`'s check, for a caller that needs only the (ledger, entry) ids
    the body names: the same errors, without copying the payload out of the body (the
    replication worker checks every entry it copies, up to 1 MiB each). CRC32C alone
    still takes the payload as a copy: its library reads bytes, not a view."""
    m = _DIGEST_SIZES[digest_type]
    size = len(body)
    if size < ENTRY_HEADER_SIZE + m:
        decode_entry_body(body, digest_type)  # raises the message it gives for this body
    view = memoryview(body)
    start = ENTRY_HEADER_SIZE + m
    if digest_type is DigestType.CRC32C:
        crc = google_crc32c.extend(google_crc32c.value(body[:ENTRY_HEADER_SIZE]), body[start:])
        expected = int(crc).to_bytes(4, "big")
    elif digest_type is DigestType.CRC32:
        crc32 = zlib.crc32(view[start:], zlib.crc32(view[:ENTRY_HEADER_SIZE]))
        expected = crc32.to_bytes(8, "big")
    elif digest_type is DigestType.HMAC:
        key = hashlib.sha1(b"mac" + password).digest()
        mac = hmac.new(key, view[:ENTRY_HEADER_SIZE], hashlib.sha1)
        mac.update(view[start:])
        expected = mac.digest()
    else:
        expected = b""
    ledger_id, entry_id = _IDS.unpack_from(body)
    if not hmac.compare_digest(expected, view[ENTRY_HEADER_SIZE:start]):
        raise DigestMismatchError(
            f"{digest_type.name} digest mismatch for ledger {ledger_id} entry {entry_id}"
        )
    return ledger_id, entry_id


def verify_entry_body(body: bytes, digest_type: DigestType, password: bytes = b"") -> EntryBody:
    """Decodes a body and checks its digest; raises `DigestMismatchError` when it is wrong."""
    entry = decode_entry_body(body, digest_type)
    expected = entry_digest(digest_type, body[:ENTRY_HEADER_SIZE], entry.payload, password)
    if not hmac.compare_digest(expected, entry.digest):
        raise DigestMismatchError(
            f"{digest_type.name} digest mismatch for ledger {entry.ledger_id} "
            f"entry {entry.entry_id}"
        )
    return entry
