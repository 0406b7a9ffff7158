"""Reading ledger metadata is the auditor's hot path, and one `getData` per znode costs a
request, a reply, a kazoo async result and a hop to the event loop each; ZooKeeper 3.6+ reads
a whole batch in one request, but kazoo has no API for it.

ZooKeeper 3.6+ `multiRead` (opcode 22) on top of kazoo 2.11's protocol layer.

`multiRead` carries many reads in one request and answers them in one
reply, each read with its own result (a read that fails, say on a znode that
is gone, does not fail the others). This module adds the request class kazoo's
connection sends like any of its own (`type`, `serialize()`,
`deserialize(buffer, offset)`), as `persistent.py` does for `addWatch`. It is
hand-written against the jute records (facts of the wire format, not code from
ZooKeeper or kazoo):

- request: per op, MultiHeader(int type, bool done=false, int err=-1), then
  the op's record: getData (4) and getChildren (8) both (ustring path, bool
  watch); then MultiHeader(-1, true, -1);
- reply: per op, MultiHeader(type, done, err), then getData: (buffer data,
  Stat), getChildren: (vector<ustring>), error (-1): (int err); a header
  with done=true ends it.

kazoo's connection sends requests as they are, so paths must already carry
the chroot (`chrooted`); replies carry no paths, so nothing is un-chrooted.
A server error in the reply header (an old server's UNIMPLEMENTED, say) is
raised by kazoo before `deserialize` is called.

Every byte of a reply is untrusted: `deserialize` checks each length against
what is left, each result's type against its op, the count of results, and
the end marker, and raises `MalformedMultiReadError` for anything else.
kazoo's reader hands an exception raised there to the request's async result
(and logs it) and goes on reading, so a bad reply fails its batch only: the
connection, its thread and every other request are untouched.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any, TypeAlias

from kazoo.exceptions import EXCEPTIONS
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import (
    int_struct,
    multiheader_struct,
    read_buffer,
    read_string,
    stat_struct,
    write_string,
)
from kazoo.protocol.states import ZnodeStat

MULTI_READ = 22
GET_DATA = 4
GET_CHILDREN = 8
#: The type of an error result in a multi reply.
ERROR = -1

#: The most ops one multiRead carries (a larger batch goes as several requests). The
#: server refuses a request above its `jute.maxbuffer` (1 MiB by default), and a
#: reply this size is already far past what per-request costs amortise over.
MAX_OPS = 1000
#: The most request bytes one multiRead carries, far below `jute.maxbuffer`.
MAX_REQUEST_BYTES = 256 * 1024

_OP_TYPES = (GET_DATA, GET_CHILDREN)
_END: bytes = multiheader_struct.pack(-1, True, -1)
_HEADER: int = multiheader_struct.size
_INT: int = int_struct.size
_STAT: int = stat_struct.size

#: One op's result: getData's (data, stat), getChildren's names, or the op's error
#: (kazoo's exception for its code, as a lone read of it would raise).
Result: TypeAlias = tuple[bytes, ZnodeStat] | list[str] | BaseException


class MalformedMultiReadError(ValueError):
    """A multiRead reply that does not parse as the answer to its request."""


def chrooted(chroot: str | None, path: str) -> str:
    """`path` as the server knows it, normalised as kazoo's own calls do (it prefixes
    the chroot in its API methods only, not in the requests it sends)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"not an absolute znode path: {path!r}")
    if path.endswith("/") or "//" in path or "/." in path:
        full: str = _prefix_root(chroot or "", path)  # normalised; ValueError for . and ..
        return full
    return (chroot or "") + path  # already normal (kazoo keeps its chroot normalised)


class MultiRead:
    """One multiRead request: `ops` is (op type, chrooted path) per read.

    kazoo's connection needs only `type`, `serialize` and `deserialize` of a
    request (and takes a missing `watcher` for none).
    """

    type = MULTI_READ
    __slots__ = ("ops",)

    def __init__(self, ops: Sequence[tuple[int, str]]) -> None:
        for op, _ in ops:
            if op not in _OP_TYPES:
                raise ValueError(f"multiRead carries getData and getChildren only, not {op}")
        self.ops = ops

    @property
    def paths(self) -> list[str]:
        """The paths it reads, in op order."""
        return [path for _, path in self.ops]

    def __repr__(self) -> str:
        first = self.ops[0][1] if self.ops else "-"
        return f"MultiRead({len(self.ops)} ops, first {first})"

    def serialize(self) -> bytearray:
        b = bytearray()
        for op, path in self.ops:
            b += multiheader_struct.pack(op, False, -1)
            b += write_string(path)
            b.append(0)  # no watch
        b += _END
        return b

    def deserialize(self, buffer: bytes, offset: int) -> list[Result]:
        """The results in op order; MalformedMultiReadError if the reply is not one."""
        try:
            return _parse(self.ops, buffer, offset)
        except MalformedMultiReadError:
            raise
        except (struct.error, UnicodeDecodeError, ValueError, IndexError) as exc:
            raise MalformedMultiReadError(f"multiRead reply unreadable: {exc}") from exc


def _parse(ops: Sequence[tuple[int, str]], buffer: bytes, offset: int) -> list[Result]:
    end = len(buffer)
    results: list[Result] = []
    while True:
        if end - offset < _HEADER:
            raise MalformedMultiReadError(
                f"multiRead reply truncated after {len(results)} of {len(ops)} results"
            )
        kind, done, _ = multiheader_struct.unpack_from(buffer, offset)
        offset += _HEADER
        if done:
            break
        i = len(results)
        if i >= len(ops):
            raise MalformedMultiReadError(f"multiRead reply has more than {len(ops)} results")
        op = ops[i][0]
        if kind == ERROR:
            _need(buffer, offset, _INT, i)
            code = int_struct.unpack_from(buffer, offset)[0]
            offset += _INT
            results.append(_error(code, i))
        elif kind != op:
            raise MalformedMultiReadError(
                f"multiRead result {i} is of type {kind} for an op of type {op}"
            )
        elif kind == GET_DATA:
            _need(buffer, offset, _length(buffer, offset, i) + _STAT, i)
            data, offset = read_buffer(buffer, offset)
            stat = ZnodeStat._make(stat_struct.unpack_from(buffer, offset))
            offset += _STAT
            results.append((b"" if data is None else data, stat))
        else:
            children, offset = _children(buffer, offset, i)
            results.append(children)
    if done != 1 or kind != -1:
        raise MalformedMultiReadError(f"multiRead reply ends in a bad header ({kind}, {done})")
    if len(results) != len(ops):
        raise MalformedMultiReadError(
            f"multiRead reply has {len(results)} results for {len(ops)} ops"
        )
    if offset != end:
        raise MalformedMultiReadError(f"multiRead reply has {end - offset} bytes after its end")
    return results


def _need(buffer: bytes, offset: int, size: int, i: int) -> None:
    if size < 0 or len(buffer) - offset < size:
        raise MalformedMultiReadError(f"multiRead result {i} is truncated")


def _length(buffer: bytes, offset: int, i: int) -> int:
    """The length a buffer, string or vector at `offset` announces (its own 4 bytes
    included; -1, null, counts as empty), checked against what is left."""
    _need(buffer, offset, _INT, i)
    n: int = int_struct.unpack_from(buffer, offset)[0]
    if n < -1:
        raise MalformedMultiReadError(f"multiRead result {i} has a negative length {n}")
    size = _INT + max(n, 0)
    _need(buffer, offset, size, i)
    return size


def _children(buffer: bytes, offset: int, i: int) -> tuple[list[str], int]:
    _need(buffer, offset, _INT, i)
    count: int = int_struct.unpack_from(buffer, offset)[0]
    offset += _INT
    if count < -1 or count * _INT > len(buffer) - offset:
        raise MalformedMultiReadError(f"multiRead result {i} has a bad count {count}")
    names: list[str] = []
    for _ in range(max(count, 0)):
        _length(buffer, offset, i)
        name, offset = read_string(buffer, offset)
        if name is None:
            raise MalformedMultiReadError(f"multiRead result {i} has a null child name")
        names.append(name)
    return names, offset


def _error(code: int, i: int) -> BaseException:
    if code >= 0 or code not in EXCEPTIONS:
        raise MalformedMultiReadError(f"multiRead result {i} has an unknown error code {code}")
    exc: BaseException = EXCEPTIONS[code]()
    return exc


def batches(ops: Sequence[tuple[int, str]]) -> Iterator[Sequence[tuple[int, str]]]:
    """`ops` cut into requests of at most MAX_OPS ops and MAX_REQUEST_BYTES bytes."""
    start = 0
    size = 0
    for i, (_, path) in enumerate(ops):
        # header, string length, the path (UTF-8 is at most 4 bytes a character), watch
        cost = _HEADER + _INT + 4 * len(path) + 1
        if i > start and (i - start >= MAX_OPS or size + cost > MAX_REQUEST_BYTES):
            yield ops[start:i]
            start, size = i, 0
        size += cost
    if start < len(ops):
        yield ops[start:]


def submit(client: Any, request: MultiRead) -> Any:
    """Queues `request` on kazoo's connection; kazoo's async result for its reply."""
    result = client.handler.async_result()
    client._call(request, result)
    return result
