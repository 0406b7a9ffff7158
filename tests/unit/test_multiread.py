"""The multiRead request and reply records (auditor/zk/multiread.py), byte for byte.

Replies are built here field by field from the jute layout (MultiHeader: int type,
bool done, int err; GetDataResponse: buffer, Stat; GetChildrenResponse:
vector<ustring>; ErrorResponse: int err), and then broken in every way a
server's bytes can be: each must give MalformedMultiReadError, never another
exception, a hang or a wrong answer.
"""

from __future__ import annotations

import contextlib
import struct

import pytest
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from auditor.zk.multiread import (
    GET_CHILDREN,
    GET_DATA,
    MAX_OPS,
    MAX_REQUEST_BYTES,
    MULTI_READ,
    MalformedMultiReadError,
    MultiRead,
    batches,
    chrooted,
)

STAT = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
END = struct.pack("!iBi", -1, 1, -1)


def header(kind: int, done: bool = False, err: int = 0) -> bytes:
    return struct.pack("!iBi", kind, int(done), err)


def string(s: bytes) -> bytes:
    return struct.pack("!i", len(s)) + s


def data_result(data: bytes | None, stat: tuple[int, ...] = STAT) -> bytes:
    buf = struct.pack("!i", -1) if data is None else string(data)
    return header(GET_DATA) + buf + struct.pack("!qqqqiiiqiiq", *stat)


def children_result(names: list[bytes]) -> bytes:
    return header(GET_CHILDREN) + struct.pack("!i", len(names)) + b"".join(map(string, names))


def error_result(code: int) -> bytes:
    return header(-1, err=code) + struct.pack("!i", code)


def test_request_bytes() -> None:
    req = MultiRead([(GET_DATA, "/a"), (GET_CHILDREN, "/bc")])
    assert req.type == MULTI_READ == 22
    assert bytes(req.serialize()) == (
        struct.pack("!iBi", 4, 0, -1)
        + string(b"/a")
        + b"\x00"
        + struct.pack("!iBi", 8, 0, -1)
        + string(b"/bc")
        + b"\x00"
        + END
    )


def test_request_takes_reads_only() -> None:
    with pytest.raises(ValueError, match="getData and getChildren only"):
        MultiRead([(5, "/a")])


def test_reply_of_data_children_and_errors() -> None:
    req = MultiRead([(GET_DATA, "/a"), (GET_DATA, "/b"), (GET_CHILDREN, "/c"), (GET_DATA, "/d")])
    reply = (
        data_result(b"\x00\xffbytes")
        + error_result(-101)
        + children_result([b"x", "\u00e9".encode()])
        + data_result(None)
        + END
    )
    prefix = b"\x00" * 16  # the reply header kazoo has read already
    got = req.deserialize(prefix + reply, len(prefix))
    assert got[0] == (b"\x00\xffbytes", ZnodeStat(*STAT))
    assert isinstance(got[1], NoNodeError)
    assert got[2] == ["x", "\u00e9"]
    assert got[3] == (b"", ZnodeStat(*STAT))


def test_an_error_result_is_kazoos_exception_for_its_code() -> None:
    got = MultiRead([(GET_CHILDREN, "/a")]).deserialize(error_result(-102) + END, 0)
    assert isinstance(got[0], NoAuthError)


GOOD_OPS = [(GET_DATA, "/a"), (GET_CHILDREN, "/b")]
GOOD = data_result(b"abc") + children_result([b"k1", b"k2"]) + END


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (b"", "truncated after 0 of 2"),
        (GOOD[:5], "truncated after 0 of 2"),
        (GOOD[:16], "result 0 is truncated"),  # data shorter than announced
        (GOOD[: len(data_result(b"abc")) - 1], "result 0 is truncated"),  # stat cut short
        (GOOD[:-1], "truncated after 2 of 2"),  # end marker cut short
        (GOOD[: -len(END)], "truncated after 2 of 2"),  # no end marker
        (GOOD + b"\x00", "1 bytes after its end"),
        (data_result(b"abc") + END, "1 results for 2 ops"),
        (GOOD[: -len(END)] + data_result(b"x") + END, "more than 2 results"),
        (children_result([]) + children_result([]) + END, "type 8 for an op of type 4"),
        (header(7) + GOOD, "type 7 for an op of type 4"),
        (header(GET_DATA) + struct.pack("!i", -5), "negative length -5"),
        (header(GET_DATA) + struct.pack("!i", 2**31 - 1), "result 0 is truncated"),
        (
            data_result(b"abc") + header(GET_CHILDREN) + struct.pack("!i", 2**30),
            "result 1 has a bad count",
        ),
        (
            data_result(b"abc") + header(GET_CHILDREN) + struct.pack("!i", -7),
            "result 1 has a bad count -7",
        ),
        (
            data_result(b"abc") + header(GET_CHILDREN) + struct.pack("!ii", 1, -1) + END,
            "null child name",
        ),
        (
            data_result(b"abc") + header(GET_CHILDREN) + struct.pack("!ii", 1, 9) + b"ab",
            "result 1 is truncated",
        ),
        (data_result(b"abc") + children_result([b"\xff\xfe"]) + END, "unreadable"),
        (error_result(-999) + children_result([]) + END, "unknown error code -999"),
        (error_result(0) + children_result([]) + END, "unknown error code 0"),
        (header(-1) + b"\x00\x00", "result 0 is truncated"),
        (data_result(b"abc") + children_result([]) + struct.pack("!iBi", -1, 2, -1), "bad header"),
        (data_result(b"abc") + children_result([]) + struct.pack("!iBi", 4, 1, -1), "bad header"),
    ],
)
def test_malformed_replies_are_typed_errors(reply: bytes, reason: str) -> None:
    with pytest.raises(MalformedMultiReadError, match=reason):
        MultiRead(GOOD_OPS).deserialize(reply, 0)


def test_the_good_reply_of_the_malformed_cases_parses() -> None:
    assert MultiRead(GOOD_OPS).deserialize(GOOD, 0) == [
        (b"abc", ZnodeStat(*STAT)),
        ["k1", "k2"],
    ]


def test_every_truncation_is_a_typed_error() -> None:
    for cut in range(len(GOOD)):
        with pytest.raises(MalformedMultiReadError):
            MultiRead(GOOD_OPS).deserialize(GOOD[:cut], 0)


def test_every_flipped_byte_is_an_answer_or_a_typed_error() -> None:
    """No byte of a reply, whatever its value, raises anything but the typed error."""
    for i in range(len(GOOD)):
        for value in (0x00, 0x7F, 0x80, 0xFF):
            bad = GOOD[:i] + bytes([value]) + GOOD[i + 1 :]
            with contextlib.suppress(MalformedMultiReadError):
                MultiRead(GOOD_OPS).deserialize(bad, 0)


def test_batches_split_by_count_and_by_bytes() -> None:
    ops = [(GET_DATA, f"/l/{i:08d}") for i in range(2 * MAX_OPS + 5)]
    cut = list(batches(ops))
    assert [len(b) for b in cut] == [MAX_OPS, MAX_OPS, 5]
    assert [op for b in cut for op in b] == ops
    long_path = "/" + "x" * 20_000
    cut = list(batches([(GET_DATA, long_path)] * 10))
    assert all(len(b) * (14 + 4 * len(long_path)) <= MAX_REQUEST_BYTES for b in cut)
    assert sum(len(b) for b in cut) == 10 and len(cut) > 1
    # One op larger than the limit still goes (alone): the server is the judge.
    huge = "/" + "y" * MAX_REQUEST_BYTES
    assert [len(b) for b in batches([(GET_DATA, huge), (GET_DATA, "/a")])] == [1, 1]
    assert list(batches([])) == []


def test_chrooted_paths_are_kazoos() -> None:
    assert chrooted("", "/a/b") == "/a/b"
    assert chrooted("/c", "/a/b") == "/c/a/b"
    assert chrooted("/c", "/") == "/c"
    assert chrooted("/c", "/a//b/") == "/c/a/b"
    assert chrooted(None, "/") == "/"
    for bad in ("a", "", "/a/../b", "/./a"):
        with pytest.raises(ValueError):
            chrooted("/c", bad)
