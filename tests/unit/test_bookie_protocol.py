"""The v3 wire protocol: golden frames, the incremental frame parser, fuzzing, entry bodies."""

from __future__ import annotations

import contextlib
import hashlib
import struct
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from auditor.bookie.availability import Availability
from auditor.bookie.protocol import (
    ENTRY_HEADER_SIZE,
    MAX_FRAME_SIZE,
    BookieProtocolError,
    DigestMismatchError,
    FrameParser,
    Operation,
    Status,
    add_entry_frame,
    add_entry_request,
    auth_request,
    decode_entry_body,
    decode_entry_header,
    decode_frame,
    decode_request,
    decode_response,
    digest_size,
    effective_status,
    encode_entry_body,
    encode_frame,
    encode_message,
    entry_digest,
    get_bookie_info_request,
    get_list_of_entries_request,
    list_request_frame,
    master_key,
    read_entry_frame,
    read_entry_request,
    read_lac_request,
    request_header,
    response_header,
    verified_entry_ids,
    verify_entry_body,
)
from auditor.errors import FormatError
from auditor.metadata.model import DigestType
from auditor.proto import bookkeeper_protocol_pb2 as pb
from tests.vectors import load

VECTORS: dict[str, Any] = load("frames.json")
FRAMES: dict[str, bytes] = {f["name"]: bytes.fromhex(f["hex"]) for f in VECTORS["frames"]}


def _fence_read() -> pb.Request:
    # The auditor never fences; this vector is built by hand to prove the codec agrees.
    req = read_entry_request(5, 5, 0)
    req.readRequest.flag = pb.ReadRequest.FENCE_LEDGER
    req.readRequest.masterKey = bytes(range(20))
    return req


def _list_response(txn: int, status: Status, ledger_id: int, avail: bytes | None) -> pb.Response:
    code = pb.StatusCode.ValueType(int(status))
    inner = pb.GetListOfEntriesOfLedgerResponse(status=code, ledgerId=ledger_id)
    if avail is not None:
        inner.availabilityOfEntriesOfLedger = avail
    return pb.Response(
        header=response_header(Operation.GET_LIST_OF_ENTRIES_OF_LEDGER, txn),
        status=code,
        getListOfEntriesOfLedgerResponse=inner,
    )


def _read_response(txn: int, status: Status, ledger_id: int, entry_id: int) -> pb.Response:
    code = pb.StatusCode.ValueType(int(status))
    return pb.Response(
        header=response_header(Operation.READ_ENTRY, txn),
        status=code,
        readResponse=pb.ReadResponse(status=code, ledgerId=ledger_id, entryId=entry_id),
    )


#: How each vector is produced by our code.
BUILDERS: dict[str, Callable[[], pb.Request | pb.Response]] = {
    "request READ_ENTRY txnId=1 ledgerId=5 entryId=0": lambda: read_entry_request(1, 5, 0),
    "request READ_LAC txnId=2 ledgerId=5": lambda: read_lac_request(2, 5),
    "request GET_BOOKIE_INFO txnId=3 requested=3": lambda: get_bookie_info_request(3, 3),
    "request GET_LIST_OF_ENTRIES_OF_LEDGER txnId=4 ledgerId=5": lambda: get_list_of_entries_request(
        4, 5
    ),
    "request READ_ENTRY fence txnId=5 ledgerId=5 entryId=0 masterKey=00..13": _fence_read,
    "response GET_LIST_OF_ENTRIES_OF_LEDGER txnId=4 ENOLEDGER ledgerId=5": lambda: _list_response(
        4, Status.ENOLEDGER, 5, None
    ),
    "response GET_LIST_OF_ENTRIES_OF_LEDGER txnId=6 EOK ledgerId=7 entries {0,1,2}": lambda: (
        _list_response(6, Status.EOK, 7, Availability.from_entries([0, 1, 2]).encode())
    ),
    "response READ_ENTRY txnId=1 ENOENTRY ledgerId=5 entryId=0": lambda: _read_response(
        1, Status.ENOENTRY, 5, 0
    ),
}


# -- golden frames ------------------------------------------------------------------------


def test_every_vector_has_a_builder() -> None:
    assert set(BUILDERS) == set(FRAMES)


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_vector_is_produced_byte_exactly(name: str) -> None:
    assert encode_message(BUILDERS[name]()) == FRAMES[name]


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_vector_parses_to_the_same_message(name: str) -> None:
    frame = FRAMES[name]
    payload = decode_frame(frame)
    assert len(payload) == struct.unpack(">I", frame[:4])[0]
    decode = decode_request if name.startswith("request") else decode_response
    msg = decode(payload)
    assert msg == BUILDERS[name]()
    assert msg.SerializeToString() == payload


def test_parsed_vectors_carry_the_expected_fields() -> None:
    req = decode_request(decode_frame(FRAMES["request READ_ENTRY txnId=1 ledgerId=5 entryId=0"]))
    assert req.header.version == pb.VERSION_THREE
    assert (int(req.header.operation), req.header.txnId) == (Operation.READ_ENTRY, 1)
    assert (req.readRequest.ledgerId, req.readRequest.entryId) == (5, 0)
    assert not req.readRequest.HasField("flag")

    ok = decode_response(
        decode_frame(
            FRAMES["response GET_LIST_OF_ENTRIES_OF_LEDGER txnId=6 EOK ledgerId=7 entries {0,1,2}"]
        )
    )
    assert effective_status(ok) is Status.EOK
    avail = Availability.decode(ok.getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger)
    assert list(avail.entries()) == [0, 1, 2]

    missing = decode_response(
        decode_frame(FRAMES["response READ_ENTRY txnId=1 ENOENTRY ledgerId=5 entryId=0"])
    )
    assert effective_status(missing) is Status.ENOENTRY
    assert (missing.header.txnId, int(missing.header.operation)) == (1, Operation.READ_ENTRY)


def test_reads_never_fence_or_long_poll() -> None:
    rr = read_entry_request(9, 1, -1).readRequest
    for field in ("flag", "masterKey", "previousLAC", "timeOut"):
        assert not rr.HasField(field)
    # -1 ("last entry") is a 10-byte varint
    assert (
        bytes.fromhex("10ffffffffffffffffff01") in read_entry_request(9, 1, -1).SerializeToString()
    )


def test_builders_set_every_required_field() -> None:
    key = master_key(b"pw")
    for req in (
        read_entry_request(1, 2, 3),
        read_lac_request(1, 2),
        get_bookie_info_request(1),
        get_list_of_entries_request(1, 2),
        add_entry_request(1, 2, 3, key, b"x" * 40),
        auth_request(1),
    ):
        assert req.IsInitialized()
        assert req.header.version == pb.VERSION_THREE
        assert decode_request(req.SerializeToString()) == req
    add = add_entry_request(1, 2, 3, key, b"body").addRequest
    assert not add.HasField("flag") and not add.HasField("writeFlags")


def test_recovery_add_request_bytes() -> None:
    """RECOVERY_ADD: flag 1 in field 100 of AddRequest, the 20-byte master key, no write
    flags, no priority (hand-encoded from the proto's field numbers, wire spec 1.5-1.6)."""
    key = bytes(range(20))
    frame = encode_message(add_entry_request(1, 5, 0, key, b"body", recovery=True))
    assert frame == bytes.fromhex(
        "0000002e"  # payload length 46
        "0a06080310021801"  # header: VERSION_THREE, ADD_ENTRY, txnId 1, no priority
        "aa0623"  # field 101 addRequest, 35 bytes
        "08051000"  # ledgerId 5, entryId 0
        "1a14000102030405060708090a0b0c0d0e0f10111213"  # masterKey, 20 bytes
        "2204626f6479"  # body
        "a00601"  # field 100 flag = RECOVERY_ADD
    )
    plain = encode_message(add_entry_request(1, 5, 0, key, b"body"))
    assert plain == bytes.fromhex("0000002b0a06080310021801aa0620") + frame[15:-3]
    req = decode_request(decode_frame(frame))
    assert req.addRequest.flag == pb.AddRequest.RECOVERY_ADD
    assert not req.addRequest.HasField("writeFlags") and not req.header.HasField("priority")
    assert len(master_key(b"secret")) == 20
    assert master_key(b"secret") == hashlib.sha1(b"ledgersecret").digest()


def test_a_recovery_re_add_carries_high_priority() -> None:
    """Ledger recovery's re-adds carry the header priority Java's client gives
    FLAG_HIGH_PRIORITY (100: field 4 of the header), the re-replicator's copies do not:
    otherwise the two frames are the same."""
    key = bytes(range(20))
    copy = encode_message(add_entry_request(1, 5, 0, key, b"body", recovery=True))
    readd = encode_message(
        add_entry_request(1, 5, 0, key, b"body", recovery=True, high_priority=True)
    )
    assert readd == bytes.fromhex("000000300a080803100218012064") + copy[12:]
    assert decode_request(decode_frame(readd)).header.priority == 100


def test_builders_reject_values_outside_the_wire_types() -> None:
    with pytest.raises(ValueError):
        read_entry_request(-1, 1, 0)
    with pytest.raises(ValueError):
        read_entry_request(2**64, 1, 0)
    with pytest.raises(ValueError):
        read_entry_request(1, 2**63, 0)
    with pytest.raises(ValueError):
        request_header(Operation.READ_LAC, -5)


def test_incomplete_messages_are_never_sent() -> None:
    req = pb.Request()
    req.header.version = pb.VERSION_THREE
    req.header.operation = pb.READ_ENTRY  # no txnId
    with pytest.raises(ValueError):
        encode_message(req)
    no_status = pb.Response(header=response_header(Operation.READ_LAC, 1))
    with pytest.raises(ValueError):
        encode_message(no_status)


def test_effective_status_prefers_a_non_eok_top_level_status() -> None:
    resp = _list_response(1, Status.EOK, 3, b"")
    resp.getListOfEntriesOfLedgerResponse.status = pb.EIO
    assert effective_status(resp) is Status.EIO  # top EOK -> inner
    resp.status = pb.ETOOMANYREQUESTS
    assert effective_status(resp) is Status.ETOOMANYREQUESTS  # top wins otherwise
    bare = pb.Response(header=response_header(Operation.AUTH, 1), status=pb.EOK)
    assert effective_status(bare) is Status.EOK


# -- framing ---------------------------------------------------------------------------------


@given(st.lists(st.binary(max_size=300), max_size=20), st.data())
def test_frame_parser_handles_any_chunking(payloads: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(p) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=30)))
    parser = FrameParser()
    got: list[bytes] = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        got += parser.feed(stream[prev:cut])
        prev = cut
    assert got == payloads
    assert parser.buffered == 0


def test_frame_parser_byte_by_byte_on_all_vectors() -> None:
    stream = b"".join(FRAMES.values())
    parser = FrameParser()
    got: list[bytes] = []
    for i in range(len(stream)):
        got += parser.feed(stream[i : i + 1])
    assert got == [frame[4:] for frame in FRAMES.values()]


def test_too_long_frames_are_rejected_and_poison_the_parser() -> None:
    parser = FrameParser()
    with pytest.raises(BookieProtocolError):
        parser.feed(struct.pack(">I", MAX_FRAME_SIZE + 1))
    with pytest.raises(BookieProtocolError):
        parser.feed(encode_frame(b"ok"))  # the stream has lost sync for good
    # the sign bit set: negative to Java, too long to us
    with pytest.raises(BookieProtocolError):
        FrameParser().feed(b"\x80\x00\x00\x00")
    # exactly the limit is fine (announced, not yet complete)
    assert FrameParser().feed(struct.pack(">I", MAX_FRAME_SIZE) + b"x") == []
    with pytest.raises(BookieProtocolError):
        encode_frame(bytes(MAX_FRAME_SIZE + 1))
    with pytest.raises(BookieProtocolError):
        FrameParser(max_frame_size=10).feed(encode_frame(bytes(11)))


def test_decode_frame_wants_exactly_one_frame() -> None:
    one = encode_frame(b"abc")
    assert decode_frame(one) == b"abc"
    for bad in (one[:-1], one + b"\0", one + one, b""):
        with pytest.raises(BookieProtocolError):
            decode_frame(bad)


def test_errors_are_format_errors() -> None:
    assert issubclass(BookieProtocolError, FormatError)
    assert issubclass(DigestMismatchError, BookieProtocolError)


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # no header
        bytes.fromhex("0a020803"),  # header without operation and txnId
        bytes.fromhex("0a0608091001180110"),  # unknown version 9, then truncated
        bytes.fromhex("0a060803100b18061099"),  # truncated varint
        bytes.fromhex("ff"),
    ],
)
def test_malformed_payloads_raise_protocol_errors(payload: bytes) -> None:
    with pytest.raises(BookieProtocolError):
        decode_response(payload)
    with pytest.raises(BookieProtocolError):
        decode_request(payload)


def test_unknown_status_makes_a_response_incomplete() -> None:
    # proto2 parks an unknown enum value as an unknown field, so `status` is missing
    payload = bytes.fromhex("0a060803100b1806109903")  # status 409
    with pytest.raises(BookieProtocolError):
        decode_response(payload)
    # to a Request, field 2 is merely unknown: still a valid Request
    assert decode_request(payload).header.txnId == 6


def test_nested_required_fields_are_checked() -> None:
    resp = _read_response(1, Status.EOK, 5, 0)
    payload = resp.SerializeToString()
    # drop the inner entryId (last 2 bytes "18 00") and fix the inner length
    broken = bytearray(payload[:-2])
    broken[broken.index(0xA2) + 2] -= 2
    with pytest.raises(BookieProtocolError):
        decode_response(bytes(broken))


# -- fuzzing ---------------------------------------------------------------------------------

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _parse_everything(stream: bytes) -> None:
    """Feeds a stream to the parser and every payload to both decoders; only typed errors."""
    parser = FrameParser()
    try:
        payloads = parser.feed(stream)
    except BookieProtocolError:
        return
    for payload in payloads:
        for decode in (decode_response, decode_request):
            with contextlib.suppress(BookieProtocolError):
                decode(payload)


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_only_raise_protocol_errors(blob: bytes) -> None:
    _parse_everything(blob)
    _parse_everything(encode_frame(blob))
    for decode in (decode_response, decode_request):
        with contextlib.suppress(BookieProtocolError):
            decode(blob)


@FUZZ
@given(
    st.sampled_from(sorted(FRAMES)),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    st.integers(0, 200),
)
def test_mutated_frames_only_raise_protocol_errors(
    name: str, flips: list[tuple[int, int]], cut: int
) -> None:
    frame = bytearray(FRAMES[name])
    for where, value in flips:
        frame[where % len(frame)] = value
    mutated = bytes(frame)
    _parse_everything(mutated)
    _parse_everything(mutated[: max(0, len(mutated) - cut)])
    payload = mutated[4:]
    for decode in (decode_response, decode_request):
        try:
            msg = decode(payload)
        except BookieProtocolError:
            continue
        assert msg.IsInitialized()
        if isinstance(msg, pb.Response):
            effective_status(msg)  # every status it reports is a known one


@FUZZ
@given(st.binary(max_size=64), st.sampled_from(list(DigestType)))
def test_random_entry_bodies_only_raise_protocol_errors(blob: bytes, digest: DigestType) -> None:
    with contextlib.suppress(BookieProtocolError):
        verify_entry_body(blob, digest)


# -- entry bodies --------------------------------------------------------------------------


@given(
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1),
    st.integers(-1, 2**63 - 1),
    st.integers(0, 2**63 - 1),
    st.binary(max_size=200),
    st.sampled_from(list(DigestType)),
    st.binary(max_size=16),
)
def test_entry_body_round_trip(
    ledger: int, entry: int, lac: int, length: int, payload: bytes, dt: DigestType, pw: bytes
) -> None:
    body = encode_entry_body(ledger, entry, lac, length, payload, dt, pw)
    assert len(body) == ENTRY_HEADER_SIZE + digest_size(dt) + len(payload)
    got = verify_entry_body(body, dt, pw)
    assert (got.ledger_id, got.entry_id, got.last_add_confirmed, got.length) == (
        ledger,
        entry,
        lac,
        length,
    )
    assert got.payload == payload
    assert decode_entry_header(body) == decode_entry_header(body[:ENTRY_HEADER_SIZE])
    assert decode_entry_body(body, dt) == got
    if dt is not DigestType.DUMMY:
        for i in (0, 31, len(body) - 1):
            tampered = bytearray(body)
            tampered[i] ^= 0x01
            with pytest.raises(DigestMismatchError):
                verify_entry_body(bytes(tampered), dt, pw)


def test_entry_digests_match_known_checksums() -> None:
    # CRC32C("123456789") = e3069283, CRC32("123456789") = cbf43926 (the standard checks);
    # the digest covers header then payload, wherever the split falls.
    assert entry_digest(DigestType.CRC32C, b"1234", b"56789") == bytes.fromhex("e3069283")
    assert entry_digest(DigestType.CRC32, b"12345678", b"9") == bytes.fromhex("00000000cbf43926")
    assert entry_digest(DigestType.DUMMY, b"1234", b"5") == b""
    assert len(entry_digest(DigestType.HMAC, b"1234", b"5", b"pw")) == 20


def test_entry_body_layout_is_big_endian_header_then_digest() -> None:
    body = encode_entry_body(7, 3, 2, 12, b"abcd", DigestType.CRC32C)
    assert body[:32] == struct.pack(">qqqq", 7, 3, 2, 12)
    assert body[32:36] == entry_digest(DigestType.CRC32C, body[:32], b"abcd")
    assert body[36:] == b"abcd"
    crc32_body = encode_entry_body(7, 3, 2, 12, b"abcd", DigestType.CRC32)
    assert crc32_body[32:40] == zlib.crc32(body[:32] + b"abcd").to_bytes(8, "big")


def test_short_entry_bodies_are_rejected() -> None:
    with pytest.raises(BookieProtocolError):
        decode_entry_header(bytes(31))
    with pytest.raises(BookieProtocolError):
        decode_entry_body(bytes(33), DigestType.CRC32C)  # no room for 4 digest bytes
    assert decode_entry_body(bytes(32), DigestType.DUMMY).payload == b""


def test_master_key_is_sha1_of_ledger_and_password() -> None:
    assert master_key(b"secret") == hashlib.sha1(b"ledgersecret").digest()
    assert len(master_key(b"")) == 20


@given(st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1))
def test_hand_encoded_list_frame_is_the_built_requests_bytes(txn_id: int, ledger_id: int) -> None:
    """The replicas check's list requests are encoded by hand: byte for byte what
    protobuf writes for the built request, and what a bookie parses back."""
    frame = list_request_frame(txn_id, ledger_id)
    assert frame == encode_message(get_list_of_entries_request(txn_id, ledger_id))
    parsed = pb.Request.FromString(frame[4:])
    assert parsed.header.txnId == txn_id
    assert parsed.header.operation == pb.GET_LIST_OF_ENTRIES_OF_LEDGER
    assert parsed.header.version == pb.VERSION_THREE
    assert parsed.getListOfEntriesOfLedgerRequest.ledgerId == ledger_id


def test_hand_encoded_list_frame_refuses_out_of_range_values() -> None:
    with pytest.raises(ValueError, match="txnId"):
        list_request_frame(-1, 1)
    with pytest.raises(ValueError, match="ledgerId"):
        list_request_frame(1, 2**63)


@given(
    st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1)
)
def test_hand_encoded_read_frame_is_the_built_requests_bytes(
    txn_id: int, ledger_id: int, entry_id: int
) -> None:
    """The worker's reads are encoded by hand: protobuf's bytes for the plain read."""
    frame = read_entry_frame(txn_id, ledger_id, entry_id)
    assert frame == encode_message(read_entry_request(txn_id, ledger_id, entry_id))
    with pytest.raises(ValueError, match="entryId"):
        read_entry_frame(txn_id, ledger_id, 2**63)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 2**64 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.binary(max_size=40),
    st.sampled_from([0, 1, 127, 128, 300, 70_000]),
    st.booleans(),
)
def test_hand_encoded_add_frame_is_the_built_requests_bytes(
    txn_id: int, ledger_id: int, entry_id: int, key: bytes, size: int, recovery: bool
) -> None:
    """An add's frame in three parts, the body itself in the middle (not a copy): joined,
    protobuf's bytes for the built request, the RECOVERY_ADD flag after the body."""
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    prefix, middle, suffix = add_entry_frame(
        txn_id, ledger_id, entry_id, key, body, recovery=recovery
    )
    assert middle is body
    built = add_entry_request(txn_id, ledger_id, entry_id, key, body, recovery=recovery)
    assert prefix + middle + suffix == encode_message(built)


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_verified_entry_ids_checks_as_verify_entry_body(digest_type: DigestType) -> None:
    """The worker's check (on views of the body) accepts and refuses exactly the bodies
    `verify_entry_body` does, with the same errors."""
    body = encode_entry_body(3, 9, 8, 1000, b"payload" * 100, digest_type, b"pw")
    assert verified_entry_ids(body, digest_type, b"pw") == (3, 9)
    candidates = [body[:-1] + bytes([body[-1] ^ 1]), body[:40], body[:33], body[:31]]
    if digest_type is DigestType.HMAC:
        candidates.append(body)  # checked with another password below
    for bad in candidates:
        password = b"other" if bad is body else b"pw"
        try:
            verify_entry_body(bad, digest_type, password)
        except BookieProtocolError as exc:
            with pytest.raises(type(exc)) as got:
                verified_entry_ids(bad, digest_type, password)
            assert str(got.value) == str(exc)
        else:
            assert verified_entry_ids(bad, digest_type, password) == struct.unpack_from(">qq", bad)
