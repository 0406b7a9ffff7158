"""Fuzzing the bookie wire: frame streams, v3 responses, availability, entry bodies.

tests/unit/test_bookie_protocol.py fuzzes random bytes and byte flips of the
frame vectors, and tests/unit/test_availability.py random and mutated
availability encodings. These tests add what those do not reach: responses
of every kind with any field values (the path from a frame to an
`Availability`, an entry header or a LAC), streams mixing good frames,
garbage and boundary length prefixes cut at any size, and availability
headers whose group count is a boundary value.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from auditor.bookie.availability import Availability
from auditor.bookie.protocol import MAX_FRAME_SIZE, Operation, Status, encode_entry_body
from auditor.metadata.model import DigestType
from auditor.proto import bookkeeper_protocol_pb2 as pb
from tests.fuzz.support import MUTATIONS, fuzz_settings, mutate, run, varint
from tests.fuzz.targets import availability, frames
from tests.vectors import load

pytestmark = pytest.mark.fuzz

FRAMES = [bytes.fromhex(f["hex"]) for f in load("frames.json")["frames"]]
AVAILABILITY = [
    Availability.from_entries(case["entries"]).encode()
    for case in load("availability.json")["encode"]
]

INT64 = st.integers(-(2**63), 2**63 - 1)
ENTRY_IDS = st.one_of(st.integers(-2, 20), INT64)
STATUSES = st.sampled_from([pb.StatusCode.ValueType(s) for s in Status])
LENGTHS = st.sampled_from(
    [0, 1, 63, 64, MAX_FRAME_SIZE, MAX_FRAME_SIZE + 1, 2**31 - 1, 2**31, 2**32 - 1]
)


def _maybe(draw: st.DrawFn) -> bool:
    return draw(st.integers(0, 9)) > 0


@st.composite
def availability_bytes(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        entries = draw(st.sets(st.integers(0, 200), max_size=40))
        data = Availability.from_entries(entries).encode()
    else:
        data = draw(st.sampled_from(AVAILABILITY))
    return mutate(
        data, draw(st.one_of(st.just([]), MUTATIONS)), draw(st.sampled_from(AVAILABILITY))
    )


@st.composite
def entry_bodies(draw: st.DrawFn) -> bytes:
    body = encode_entry_body(
        draw(st.integers(0, 2**63 - 1)),
        draw(st.integers(0, 2**63 - 1)),
        draw(st.integers(-1, 2**63 - 1)),
        draw(st.integers(0, 2**63 - 1)),
        draw(st.binary(max_size=16)),
        draw(st.sampled_from(list(DigestType))),
        b"pw",
    )
    return draw(st.sampled_from([body, body[:31], body[:40], body + b"x"]))


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    """A serialized Response of any kind, required fields sometimes missing."""
    resp = pb.Response()
    operation = pb.OperationType.ValueType(draw(st.sampled_from(list(Operation))))
    if _maybe(draw):
        resp.header.version = pb.ProtocolVersion.ValueType(draw(st.integers(1, 3)))
        resp.header.operation = operation
        resp.header.txnId = draw(st.integers(0, 2**64 - 1))
    if _maybe(draw):
        resp.status = draw(STATUSES)
    kind = draw(st.sampled_from(["read", "list", "lac", "info", "add", "none"]))
    if kind == "read":
        read = resp.readResponse
        read.status = draw(STATUSES)
        read.ledgerId, read.entryId = draw(ENTRY_IDS), draw(ENTRY_IDS)
        if draw(st.booleans()):
            read.body = draw(entry_bodies())
        if draw(st.booleans()):
            read.maxLAC = draw(ENTRY_IDS)
    elif kind == "list":
        listing = resp.getListOfEntriesOfLedgerResponse
        listing.status = draw(STATUSES)
        if _maybe(draw):
            listing.ledgerId = draw(ENTRY_IDS)
        if draw(st.booleans()):
            listing.availabilityOfEntriesOfLedger = draw(availability_bytes())
    elif kind == "lac":
        lac = resp.readLacResponse
        lac.status = draw(STATUSES)
        lac.ledgerId = draw(ENTRY_IDS)
        if draw(st.booleans()):
            lac.lacBody = draw(st.binary(max_size=24))
        if draw(st.booleans()):
            lac.lastEntryBody = draw(entry_bodies())
    elif kind == "info":
        info = resp.getBookieInfoResponse
        info.status = draw(STATUSES)
        if draw(st.booleans()):
            info.totalDiskCapacity = draw(INT64)
    elif kind == "add":
        add = resp.addResponse
        add.status = draw(STATUSES)
        add.ledgerId, add.entryId = draw(ENTRY_IDS), draw(ENTRY_IDS)
    payload = resp.SerializePartialToString()
    if draw(st.integers(0, 9)) == 0:
        # A status the enum does not have: protobuf's API refuses to set one, so append
        # the field (2, varint) on the wire, where a later value wins.
        payload += b"\x10" + varint(draw(st.integers(0, 2**32)))
    return payload


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    """Frames in a row: good responses, vector frames, garbage, boundary length prefixes."""
    parts: list[bytes] = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["response", "response", "vector", "garbage", "prefix"]))
        if kind == "response":
            payload = draw(responses())
            parts.append(struct.pack(">I", len(payload)) + payload)
        elif kind == "vector":
            parts.append(draw(st.sampled_from(FRAMES)))
        elif kind == "garbage":
            parts.append(draw(st.binary(max_size=40)))
        else:
            parts.append(struct.pack(">I", draw(LENGTHS)) + draw(st.binary(max_size=16)))
    return b"".join(parts)


@fuzz_settings(400)
@given(st.integers(0, 255), streams())
def test_frame_streams(chunk: int, stream: bytes) -> None:
    """Any stream, cut into chunks of any size (the target's first byte)."""
    run(frames, bytes([chunk]) + stream)


@fuzz_settings(200)
@given(st.integers(0, 255), streams(), MUTATIONS)
def test_mutated_frame_streams(chunk: int, stream: bytes, mutations: list[Any]) -> None:
    run(frames, bytes([chunk]) + mutate(stream, mutations, FRAMES[-1]))


_COUNTS = st.sampled_from([-(2**31), -1, 0, 1, 2, 1000, 2**24, 2**31 - 1])


@fuzz_settings(200)
@given(
    st.sampled_from(AVAILABILITY), _COUNTS, st.sampled_from([0, -1, 1, 2**31 - 1]), st.booleans()
)
def test_availability_boundary_headers(seed: bytes, count: int, version: int, cut: bool) -> None:
    """Vector encodings under a header whose version or group count is a boundary value."""
    data = struct.pack(">ii", version, count) + seed[8:]
    run(availability, data[: len(data) // 2] if cut else data)
