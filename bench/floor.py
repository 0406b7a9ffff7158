"""The floor: the cheapest code making the replicas check's ZooKeeper reads and bookie requests.

    python -m bench.worker floor --zk HOST:PORT --racks FILE   (or python -m bench.floor ...)

One process, one thread of our own (kazoo adds its connection thread), no asyncio:

* **ZooKeeper**: a raw `kazoo.client.KazooClient` (not the project's ZkClient).
  The ledger tree is listed as the walk lists it (the root, then every
  two-digit top and four-digit middle of the 2-4-4 tree, and the 3-4-4-4-4
  tree's levels if there are any; one level's listings in flight together),
  then every ledger znode is read, about `WINDOW` (1,000) reads in flight,
  results drained in id order (no task, future or callback of ours per read),
  in one of two ways:
  - multiRead (ZooKeeper 3.6+, opcode 22; the default, and the floor's
    figure): `MULTI_BATCH` (250) getData ops per request, four requests in
    flight, sent through kazoo's connection as a request class of ours
    (`MultiGet`) whose reply parser keeps each znode's data and skips its
    stat; one kazoo `AsyncResult` per 250 reads. The auditor's walk reads in
    multiRead batches of 250 too (auditor/zk/multiread.py), so a floor of
    single reads would not be a floor;
  - one `get_async` per znode (issue #17's floor, the `-get` phases):
    results drained `BATCH` at a time, each drain followed by as many new
    reads (kazoo's own `AsyncResult` per read is all there is).
* **Decoding**: only as far as the ensemble bookies. For v3 metadata (what
  the bench cluster and BookKeeper >= 4.9 write) that is the header line,
  the length varint and one protobuf parse of `LedgerMetadataFormat` (upb, in
  C), then the `ensembleMember`s of its segments; no validation, no dataclass.
  Any other format falls back to `auditor.metadata.serde.decode_ledger_metadata`
  (never taken on the bench cluster). This is a decode the auditor cannot
  undercut: it needs the ensembles too, and must also validate.
* **Bookies**: ONE non-blocking socket per bookie (addresses are the ids of
  `<root>/available`, which are host:port here). Each ledger's
  GET_LIST_OF_ENTRIES_OF_LEDGER request (txnId = ledger id) is encoded once
  (`auditor.bookie.protocol.list_request_frame`, the hand encoder the auditor's
  hot path uses too, tested against protobuf's bytes) and queued for each
  distinct ensemble bookie. Between two ZooKeeper drains, queued requests move
  to each socket's output buffer while fewer than `DEPTH` (2,000) are
  unanswered there (an emulated bookie handed 50,000 at once spends its time
  buffering them), the buffers are written and whatever answers have arrived
  are read, with one `select` over the six sockets; after the last read, the
  same loop until every answer is in. An answer is parsed only as far as its
  frame and header: its length, the header's version and operation, and the
  status (EOK or not); anything laid out unexpectedly is parsed with protobuf
  instead. No task, future or timer per request.

Phases (the `bench.worker` protocol: one JSON line each, then wait for a line on stdin):

* `floor`: listing, reads (multiRead), decoding, requests and answers,
  overlapped as above; `floor-get` the same with one getData per znode;
* `zk-reads`: the same listing and reads (multiRead) and decoding, no bookie
  requests (the pairs it finds are kept for the last phase); `zk-reads-get`
  the same with one getData per znode;
* `prepared`: (not measured) every request of the last phase encoded, per bookie;
* `bookie-requests`: those requests only, released as above (DEPTH
  unanswered per bookie), until every answer is in.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.serialization import multiheader_struct

from auditor.bookie.protocol import Operation, Status, list_request_frame
from auditor.metadata.serde import HEADER_PREFIX, decode_ledger_metadata
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.proto.data_formats_pb2 import LedgerMetadataFormat

ROOT = "/ledgers"
#: ZooKeeper reads in flight.
WINDOW = 1000
#: Reads drained (in order) before the window is refilled and the bookie sockets served.
BATCH = 250
#: Bytes asked of a bookie socket per recv.
RECV = 1 << 18
#: List requests unanswered per bookie at most (a bookie sent everything at once spends
#: its time buffering; BENCH_FLOOR_DEPTH overrides).
DEPTH = int(os.environ.get("BENCH_FLOOR_DEPTH") or 2000)
#: Reads per multiRead request (the same as the walk's batches), WINDOW // this in flight.
MULTI_BATCH = 250
#: Seconds without any answer after which the floor gives up.
STALL = 120.0

_TOP = {2: re.compile(r"^[0-9]{2}$"), 3: re.compile(r"^[0-9]{3}$")}
_FOUR = re.compile(r"^[0-9]{4}$")
_LEAF = re.compile(r"^L[0-9]{4}$")
#: (top digits, levels of four digits below the top, the last being the leaf).
_TREES = ((2, 2), (3, 4))
_V3 = HEADER_PREFIX + b"3\n"
_LEN = struct.Struct(">I")


# --- the wire, by hand ---------------------------------------------------------------------


_HEADER_START = bytes([0x08, pb.VERSION_THREE, 0x10, int(Operation.GET_LIST_OF_ENTRIES_OF_LEDGER)])


def list_request(ledger_id: int) -> bytes:
    """One framed GET_LIST_OF_ENTRIES_OF_LEDGER request for `ledger_id`, txnId = ledger id
    (the project's hand encoder, byte for byte what protobuf writes)."""
    return list_request_frame(ledger_id, ledger_id)


def _slow_status(payload: bytes) -> bool:
    """EOK for a list answer laid out otherwise than a bookie lays it out (protobuf parse)."""
    resp = pb.Response.FromString(payload)
    return (
        int(resp.header.operation) == Operation.GET_LIST_OF_ENTRIES_OF_LEDGER
        and int(resp.status) == Status.EOK
    )


# --- multiRead (ZooKeeper 3.6+, opcode 22), the least kazoo will carry ---------------------

_MULTI_READ = 22
_GET_DATA = 4
_MH = multiheader_struct
_MH_SIZE = _MH.size
_MULTI_END = _MH.pack(-1, True, -1)
_GET_HEAD = _MH.pack(_GET_DATA, False, -1)
_I32 = struct.Struct(">i")
#: Bytes of a jute Stat (kazoo's stat_struct): skipped, never decoded.
_STAT_SIZE = 68


def multi_read_body(op_head: bytes, paths: list[str]) -> bytes:
    """A multiRead's body: one op (`op_head`: its multi-header) per path, not watched,
    then the end marker."""
    parts = [op_head + _I32.pack(len(raw)) + raw + b"\x00" for raw in map(str.encode, paths)]
    parts.append(_MULTI_END)
    return b"".join(parts)


class MultiGet:
    """One multiRead of getData ops, sent by kazoo's connection as it sends its own requests
    (`type`, `serialize`, `deserialize`); the reply is parsed to each znode's data only
    (None for a read that failed), the stats skipped."""

    __slots__ = ("paths",)
    type = _MULTI_READ

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def serialize(self) -> bytes:
        return multi_read_body(_GET_HEAD, self.paths)

    def deserialize(self, buffer: bytes, offset: int) -> list[bytes | None]:
        out: list[bytes | None] = []
        unpack_header = _MH.unpack_from
        unpack_int = _I32.unpack_from
        while True:
            kind, done, _ = unpack_header(buffer, offset)
            offset += _MH_SIZE
            if done:
                return out
            if kind == _GET_DATA:
                (length,) = unpack_int(buffer, offset)
                offset += 4
                size = max(length, 0)
                out.append(buffer[offset : offset + size])
                offset += size + _STAT_SIZE
            else:  # an error result: its code
                offset += 4
                out.append(None)


class Bookie:
    """One raw connection: an output buffer written when the socket takes it, answers counted."""

    __slots__ = ("answered", "head", "ok", "out", "queue", "released", "rest", "sent", "sock")

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.out = bytearray()
        self.rest = b""
        self.queue: list[bytes] = []  # requests not yet released, from `head` on
        self.head = 0
        self.sent = 0  # requests queued
        self.released = 0  # requests moved to `out` (written, or being written)
        self.answered = 0
        self.ok = 0

    def release(self) -> None:
        """Moves queued requests to the output buffer while fewer than DEPTH are unanswered."""
        room = DEPTH - (self.released - self.answered)
        if room > 0 and self.head < len(self.queue):
            head = self.head
            batch = self.queue[head : head + room]
            self.out += b"".join(batch)
            self.head = head + len(batch)
            self.released += len(batch)
            if self.head == len(self.queue):
                self.queue = []
                self.head = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def write(self) -> None:
        try:
            n = self.sock.send(self.out)
        except BlockingIOError:
            return
        del self.out[:n]

    def read(self) -> None:
        chunks = []
        try:
            while True:
                data = self.sock.recv(RECV)
                if not data:
                    raise ConnectionError("bookie closed the connection")
                chunks.append(data)
                if len(data) < RECV:
                    break
        except BlockingIOError:
            pass
        if not chunks:
            return
        buf = self.rest + b"".join(chunks) if self.rest else b"".join(chunks)
        end = len(buf)
        pos = 0
        answered = ok = 0
        unpack = _LEN.unpack_from
        start = _HEADER_START
        while end - pos >= 4:
            (length,) = unpack(buf, pos)
            p = pos + 4
            stop = p + length
            if stop > end:
                break
            answered += 1
            # header: 0x0a, its length, version, operation, txnId; then status (tag 0x10)
            hlen = buf[p + 1]
            s = p + 2 + hlen
            if buf[p] == 0x0A and hlen < 0x80 and buf[p + 2 : p + 6] == start and buf[s] == 0x10:
                if buf[s + 1] == 0:
                    ok += 1
            elif _slow_status(buf[p:stop]):
                ok += 1
            pos = stop
        self.rest = buf[pos:]
        self.answered += answered
        self.ok += ok


class Floor:
    def __init__(self, hosts: str, root: str = ROOT) -> None:
        self.root = root
        self.zk = KazooClient(hosts=hosts, timeout=60)
        self.zk.start(timeout=60)
        ids = [c for c in self.zk.get_children(f"{root}/available") if c != "readonly"]
        self.by_id: dict[str, Bookie] = {}
        for bookie_id in sorted(ids):
            host, port = bookie_id.rsplit(":", 1)
            self.by_id[bookie_id] = Bookie((host, int(port)))
        self.bookies = list(self.by_id.values())
        self.znodes = 0

    def close(self) -> None:
        for b in self.bookies:
            b.sock.close()
        self.zk.stop()
        self.zk.close()

    # --- ZooKeeper -----------------------------------------------------------------------

    def _list_level(
        self, parents: list[tuple[str, str]], names: re.Pattern[str]
    ) -> list[tuple[str, str]]:
        """Children matching `names` of every (path, digits) parent: listings in flight together."""
        pending = [(path, digits, self.zk.get_children_async(path)) for path, digits in parents]
        out = []
        for path, digits, res in pending:
            self.znodes += 1
            for name in sorted(res.get()):
                if names.match(name):
                    out.append((f"{path}/{name}", digits + name.lstrip("L")))
        return out

    def ledger_paths(self) -> list[tuple[int, str]]:
        """(ledger id, path) of every ledger znode, in id order, as the walk lists them."""
        top_names = sorted(self.zk.get_children(self.root))
        self.znodes += 1
        out: list[tuple[int, str]] = []
        for top_digits, levels in _TREES:
            level = [(f"{self.root}/{n}", n) for n in top_names if _TOP[top_digits].match(n)]
            for depth in range(levels):
                level = self._list_level(level, _LEAF if depth == levels - 1 else _FOUR)
            out.extend((int(digits), path) for path, digits in level)
        return out

    def read_ledgers(
        self,
        paths: list[tuple[int, str]],
        on_ledger: Callable[[int, bytes], None],
        between: Callable[[], None] | None = None,
        multi: bool = True,
    ) -> None:
        """Every ledger znode's data to `on_ledger`, in order; `between` after each drain.

        `multi`: in multiRead requests of MULTI_BATCH reads, WINDOW reads in flight;
        else one `get_async` per znode, WINDOW in flight, drained BATCH at a time."""
        if multi:
            self._read_multi(paths, on_ledger, between)
        else:
            self._read_gets(paths, on_ledger, between)
        self.znodes += len(paths)

    def _read_gets(
        self,
        paths: list[tuple[int, str]],
        on_ledger: Callable[[int, bytes], None],
        between: Callable[[], None] | None,
    ) -> None:
        get = self.zk.get_async
        it: Iterator[tuple[int, str]] = iter(paths)
        window: deque[tuple[int, Any]] = deque((lid, get(p)) for lid, p in islice(it, WINDOW))
        pop = window.popleft
        while window:
            for _ in range(min(BATCH, len(window))):
                lid, res = pop()
                on_ledger(lid, res.get()[0])
            window.extend((lid, get(p)) for lid, p in islice(it, WINDOW - len(window)))
            if between is not None:
                between()

    def _read_multi(
        self,
        paths: list[tuple[int, str]],
        on_ledger: Callable[[int, bytes], None],
        between: Callable[[], None] | None,
    ) -> None:
        zk = self.zk
        chroot = zk.chroot or ""

        def submit(start: int) -> tuple[int, Any]:
            batch = paths[start : start + MULTI_BATCH]
            result = zk.handler.async_result()
            zk._call(MultiGet([chroot + p for _, p in batch]), result)
            return start, result

        starts = iter(range(0, len(paths), MULTI_BATCH))
        depth = max(WINDOW // MULTI_BATCH, 1)
        window: deque[tuple[int, Any]] = deque(submit(i) for i in islice(starts, depth))
        while window:
            start, result = window.popleft()
            datas = result.get()
            for i in islice(starts, 1):
                window.append(submit(i))
            for (lid, _), data in zip(paths[start : start + MULTI_BATCH], datas, strict=True):
                if data is not None:
                    on_ledger(lid, data)
            if between is not None:
                between()

    # --- bookies ---------------------------------------------------------------------------

    def pump(self, timeout: float) -> None:
        """One select over the sockets: write what they take, read what has come."""
        for b in self.bookies:
            b.release()
        writers = [b for b in self.bookies if b.out]
        readable, writable, _ = select.select(self.bookies, writers, [], timeout)
        for b in writable:
            b.write()
        for b in readable:
            b.read()

    def finish(self) -> None:
        """Until every request queued has its answer."""
        last, seen = time.monotonic(), self.answered()
        while any(b.answered < b.sent for b in self.bookies):
            self.pump(1.0)
            now, got = time.monotonic(), self.answered()
            if got != seen:
                last, seen = now, got
            elif now - last > STALL:
                raise RuntimeError(f"bookies stopped answering: {self.counts()}")

    def answered(self) -> int:
        return sum(b.answered for b in self.bookies)

    def counts(self) -> dict[str, int]:
        return {
            "requests": sum(b.sent for b in self.bookies),
            "answered": self.answered(),
            "ok": sum(b.ok for b in self.bookies),
        }

    def reset_counts(self) -> None:
        for b in self.bookies:
            b.sent = b.released = b.answered = b.ok = 0


def ensemble_bookies(ledger_id: int, data: bytes) -> set[str]:
    """The distinct bookies of a ledger's ensembles (see the module docstring)."""
    if data.startswith(_V3):
        pos = len(_V3)
        size = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
        fmt = LedgerMetadataFormat.FromString(data[pos : pos + size])
        members: set[str] = set()
        for seg in fmt.segment:
            members.update(seg.ensembleMember)
        return members
    md = decode_ledger_metadata(data, ledger_id)
    return {b for seg in md.segments for b in seg.bookies}


# --- the phases --------------------------------------------------------------------------------


def run_floor(floor: Floor, multi: bool) -> dict[str, Any]:
    floor.reset_counts()
    floor.znodes = 0
    by_id = floor.by_id
    unknown = 0
    ledgers = 0

    def on_ledger(lid: int, data: bytes) -> None:
        nonlocal unknown, ledgers
        ledgers += 1
        request = list_request(lid)
        for bookie_id in ensemble_bookies(lid, data):
            b = by_id.get(bookie_id)
            if b is None:
                unknown += 1
                continue
            b.queue.append(request)
            b.sent += 1

    def between() -> None:
        floor.pump(0)

    started = time.monotonic()
    floor.read_ledgers(floor.ledger_paths(), on_ledger, between, multi)
    floor.finish()
    seconds = time.monotonic() - started
    return {
        "seconds": round(seconds, 4),
        "ledgers": ledgers,
        "znodes": floor.znodes,
        "unknown_bookies": unknown,
        **floor.counts(),
    }


def run_zk_reads(floor: Floor, pairs: list[tuple[int, set[str]]], multi: bool) -> dict[str, Any]:
    floor.znodes = 0
    append = pairs.append

    def on_ledger(lid: int, data: bytes) -> None:
        append((lid, ensemble_bookies(lid, data)))

    started = time.monotonic()
    floor.read_ledgers(floor.ledger_paths(), on_ledger, None, multi)
    seconds = time.monotonic() - started
    return {"seconds": round(seconds, 4), "znodes": floor.znodes, "ledgers": len(pairs)}


def prepare(floor: Floor, pairs: list[tuple[int, set[str]]]) -> dict[str, Any]:
    floor.reset_counts()
    for lid, bookie_ids in pairs:
        request = list_request(lid)
        for bookie_id in bookie_ids:
            b = floor.by_id.get(bookie_id)
            if b is not None:
                b.queue.append(request)
                b.sent += 1
    return {"requests": sum(b.sent for b in floor.bookies)}


def run_bookie_requests(floor: Floor) -> dict[str, Any]:
    started = time.monotonic()
    floor.finish()
    seconds = time.monotonic() - started
    return {"seconds": round(seconds, 4), **floor.counts()}


def phase(name: str, **fields: Any) -> None:
    """Reports a phase (as bench.worker does) and waits for the bench to say go on."""
    from bench.worker import usage

    print(json.dumps({"phase": name, "pid": os.getpid(), **fields, **usage()}), flush=True)
    sys.stdin.readline()


def main(args: argparse.Namespace) -> None:
    from bench.worker import usage

    floor = Floor(args.zk)
    try:
        phase("ready", bookies=len(floor.bookies))
        phase("floor", **run_floor(floor, multi=True))
        phase("floor-get", **run_floor(floor, multi=False))
        pairs: list[tuple[int, set[str]]] = []
        phase("zk-reads", **run_zk_reads(floor, pairs, multi=True))
        phase("zk-reads-get", **run_zk_reads(floor, [], multi=False))
        phase("prepared", **prepare(floor, pairs))
        del pairs
        phase("bookie-requests", **run_bookie_requests(floor))
    finally:
        floor.close()
    print(json.dumps({"phase": "done", **usage()}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.floor")
    parser.add_argument("--zk", required=True)
    parser.add_argument("--racks", default="")
    main(parser.parse_args())
