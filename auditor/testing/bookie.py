"""A bookie emulator that speaks BookKeeper's real v3 protocol over TCP.

Tests and the demo need bookies the auditor reaches exactly as it reaches
production ones: resolved through their ZooKeeper registration, over TCP,
with v3 frames, answering with the statuses a real bookie uses (including its
quirks: READ_LAC's ENOENTRY for an unknown ledger, and DbLedgerStorage's
silence on list requests for ledgers it holds). So this is a protocol
emulator, not a mock of the client: anything the client gets wrong on the
wire shows up here as it would against a bookie.

It also has to build big clusters cheaply and break on demand:

* Ledgers can be seeded directly (`put_ledger`) as ranges with a body
  factory; nothing is materialised per entry, bodies are generated when
  read. Entries written over the wire (ADD_ENTRY) are kept byte for byte.
* Faults: drop entries or ledgers, turn read-only, pause (hold every request
  with connections left open), add latency, answer with a chosen status,
  crash (close everything, unregister) and restart with the same id and data.
* Counters (requests received per operation, requests in flight and their
  maximum, connections accepted, list requests per ledger) let tests assert
  what the client did; `stats()` is all of them as one JSON-able dict.
* A bookie in a process of its own (`run_emulator`, benchmarks) is seeded
  from a compact file (`write_seed_file`) rather than over the wire, and
  writes its counters to a file on SIGUSR1 (SIGUSR2 resets them first) and
  when it stops, so whoever started it can count what a client sent.

TLS works as on a bookie with `tlsProviderFactoryClass`: given a server
context (`tls`), START_TLS is answered EOK in clear and the same connection
then turns into a TLS server; without one it is answered EBADREQ. With
`tls_required` the emulator acts like a bookie whose authentication plugin
only accepts TLS connections (BookieAuthZFactory): until a connection has
finished its handshake every request but START_TLS gets a bodiless EUA
carrying the request's header. A context that wants client certificates
(`verify_mode = CERT_REQUIRED`, `tlsClientAuthentication` on a bookie) fails
the handshake of a client that presents none. START_TLS is handled on the
spot, untouched by latency and injected statuses; a pause holds it like any
request. Handshakes completed and failed are counted; each peer knows its
cipher and the client certificate it was shown.

Like a bookie, a frame that is not a valid v3 `Request` ends the connection.
Requests are handled inline unless latency or a pause defers them, so answers
to delayed requests leave in whatever order their delays end, the way a
bookie's per-ledger thread pools reorder them.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import signal
import ssl
import struct
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from auditor.bookie.availability import Availability
from auditor.bookie.protocol import (
    AUTH_DISABLED_PLUGIN,
    ENTRY_HEADER_SIZE,
    LAST_ADD_CONFIRMED,
    BookieInfoFlag,
    BookieProtocolError,
    FrameParser,
    Operation,
    Status,
    decode_entry_header,
    decode_request,
    encode_entry_body,
    encode_message,
    master_key,
    response_header,
)
from auditor.bookie.tls import cipher_name
from auditor.errors import FormatError
from auditor.metadata.model import DigestType
from auditor.metadata.registry import register_bookie, unregister_bookie
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.zk import ZkClient

__all__ = [
    "BodyFactory",
    "BookieEmulator",
    "Latency",
    "SeedFileError",
    "Storage",
    "default_body",
    "make_body_factory",
    "read_seed_file",
    "run_emulator",
    "write_seed_file",
]

#: Builds the stored body of a seeded entry: (ledger_id, entry_id) -> body.
BodyFactory = Callable[[int, int], bytes]
#: A fixed delay in seconds, or one computed per request.
Latency = float | Callable[[pb.Request], float]

_HANDLED: Final = frozenset(
    {
        Operation.READ_ENTRY,
        Operation.ADD_ENTRY,
        Operation.AUTH,
        Operation.WRITE_LAC,
        Operation.READ_LAC,
        Operation.GET_BOOKIE_INFO,
        Operation.FORCE_LEDGER,
        Operation.GET_LIST_OF_ENTRIES_OF_LEDGER,
    }
)
#: The sub-message each handled operation needs in its Request.
_REQUEST_FIELD: Final = {
    Operation.READ_ENTRY: "readRequest",
    Operation.ADD_ENTRY: "addRequest",
    Operation.AUTH: "authRequest",
    Operation.WRITE_LAC: "writeLacRequest",
    Operation.READ_LAC: "readLacRequest",
    Operation.GET_BOOKIE_INFO: "getBookieInfoRequest",
    Operation.FORCE_LEDGER: "forceLedgerRequest",
    Operation.GET_LIST_OF_ENTRIES_OF_LEDGER: "getListOfEntriesOfLedgerRequest",
}


class Storage(enum.StrEnum):
    """How the emulated ledger storage answers GET_LIST_OF_ENTRIES_OF_LEDGER."""

    #: SortedLedgerStorage (upstream default): answers with the availability encoding.
    SORTED = "sorted"
    #: DbLedgerStorage: ENOLEDGER for unknown ledgers, no answer at all for held ones.
    DBLEDGER = "dbledger"
    #: DbLedgerStorage with numReadWorkerThreads=0: closes the connection for held ones.
    DBLEDGER_NO_WORKERS = "dbledger-noworkers"


def make_body_factory(
    payload_size: int = 16, digest_type: DigestType = DigestType.CRC32C, password: bytes = b""
) -> BodyFactory:
    """Bodies of a writer that wrote `payload_size`-byte payloads, entry after entry.

    The payload is the ledger id and entry id (big-endian int64 each), cut or
    zero-padded to `payload_size`; lastAddConfirmed is entry - 1 and the length
    field counts all payloads up to this entry, as a sequential writer would.
    """

    def body(ledger_id: int, entry_id: int) -> bytes:
        stamp = ledger_id.to_bytes(8, "big", signed=True) + entry_id.to_bytes(8, "big", signed=True)
        payload = stamp[:payload_size].ljust(payload_size, b"\0")
        return encode_entry_body(
            ledger_id,
            entry_id,
            entry_id - 1,
            (entry_id + 1) * payload_size,
            payload,
            digest_type,
            password,
        )

    return body


default_body: Final = make_body_factory()


def _as_runs(entries: Iterable[int | range]) -> list[tuple[int, int]]:
    """Entries given as ints and step-1 ranges, as sorted half-open (start, stop) runs."""
    items: Iterable[int | range] = [entries] if isinstance(entries, range) else entries
    runs: list[tuple[int, int]] = []
    singles: list[int] = []
    for item in items:
        if isinstance(item, range):
            if item.step != 1:
                raise ValueError(f"entry ranges must have step 1, got {item}")
            if len(item):
                runs.append((item.start, item.stop))
        else:
            singles.append(int(item))
    if singles:
        singles.sort()
        start = prev = singles[0]
        for e in singles[1:]:
            if e > prev + 1:
                runs.append((start, prev + 1))
                start = e
            prev = e
        runs.append((start, prev + 1))
    runs.sort()
    if runs and runs[0][0] < 0:
        raise ValueError(f"entry ids must be >= 0, got {runs[0][0]}")
    return runs


#: A seed file: this magic, then per ledger its id and run count, then its runs.
SEED_MAGIC: Final = b"BKEMSEED"
_SEED_LEDGER: Final = struct.Struct("<qI")
_SEED_RUN: Final = struct.Struct("<qq")


class SeedFileError(FormatError):
    """A seed file that is not one `write_seed_file` wrote."""


def write_seed_file(
    path: str | Path, ledgers: Iterable[tuple[int, Sequence[tuple[int, int]]]]
) -> int:
    """Writes (ledger id, half-open entry runs) pairs for `load_seed_file`; returns how many.

    A benchmark's bookie holds 10^5 ledgers in a process of its own; seeding
    it over the wire would measure the emulator, and pickling its state would
    tie the file to this module's internals. This is 12 bytes a ledger and 16 a run.
    """
    count = 0
    with open(path, "wb") as f:
        f.write(SEED_MAGIC)
        for ledger_id, runs in ledgers:
            f.write(_SEED_LEDGER.pack(ledger_id, len(runs)))
            for start, stop in runs:
                if not 0 <= start < stop:
                    raise ValueError(f"ledger {ledger_id}: bad entry run [{start}, {stop})")
                f.write(_SEED_RUN.pack(start, stop))
            count += 1
    return count


def read_seed_file(path: str | Path) -> Iterator[tuple[int, list[tuple[int, int]]]]:
    """The (ledger id, runs) pairs of a seed file, in file order."""
    data = Path(path).read_bytes()
    if not data.startswith(SEED_MAGIC):
        raise SeedFileError(f"{path}: not a bookie emulator seed file")
    pos = len(SEED_MAGIC)
    while pos < len(data):
        if pos + _SEED_LEDGER.size > len(data):
            raise SeedFileError(f"{path}: truncated at byte {pos}")
        ledger_id, count = _SEED_LEDGER.unpack_from(data, pos)
        pos += _SEED_LEDGER.size
        end = pos + count * _SEED_RUN.size
        if end > len(data):
            raise SeedFileError(f"{path}: ledger {ledger_id} truncated at byte {pos}")
        runs = [_SEED_RUN.unpack_from(data, at) for at in range(pos, end, _SEED_RUN.size)]
        for start, stop in runs:
            if not 0 <= start < stop:
                raise SeedFileError(f"{path}: ledger {ledger_id}: bad entry run [{start}, {stop})")
        pos = end
        yield ledger_id, runs


class _Ledger:
    """One ledger's entries: seeded runs (bodies built on read) plus bodies received."""

    __slots__ = (
        "_availability",
        "_last_body",
        "bodies",
        "factories",
        "fenced",
        "lac_body",
        "master_key",
        "starts",
        "stops",
    )

    def __init__(self, key: bytes | None = None) -> None:
        # Seeded runs: parallel sorted lists, disjoint half-open [start, stop).
        self.starts: list[int] = []
        self.stops: list[int] = []
        self.factories: list[BodyFactory] = []
        self.bodies: dict[int, bytes] = {}
        self.master_key = key
        self.fenced = False
        self.lac_body: bytes | None = None
        self._availability: Availability | None = None
        #: Highest key of `bodies`, or None when unknown (recomputed on demand).
        self._last_body: int | None = None

    def _run_of(self, entry: int) -> int:
        i = bisect_right(self.starts, entry) - 1
        return i if i >= 0 and entry < self.stops[i] else -1

    def has(self, entry: int) -> bool:
        return entry in self.bodies or self._run_of(entry) >= 0

    def body(self, ledger_id: int, entry: int) -> bytes | None:
        stored = self.bodies.get(entry)
        if stored is not None:
            return stored
        i = self._run_of(entry)
        return None if i < 0 else self.factories[i](ledger_id, entry)

    def last_entry(self) -> int | None:
        candidates = []
        if self.stops:
            candidates.append(self.stops[-1] - 1)
        if self.bodies:
            if self._last_body is None:
                self._last_body = max(self.bodies)
            candidates.append(self._last_body)
        return max(candidates) if candidates else None

    def availability(self) -> Availability:
        if self._availability is None:
            runs = [(s, e - s) for s, e in zip(self.starts, self.stops, strict=True)]
            runs.extend((e, 1) for e in self.bodies)
            self._availability = Availability.from_runs(runs)
        return self._availability

    def put(self, entry: int, body: bytes) -> None:
        self.bodies[entry] = body
        self._availability = None
        if self._last_body is not None and entry > self._last_body:
            self._last_body = entry

    def remove(self, start: int, stop: int) -> None:
        """Forgets every entry in [start, stop)."""
        self._availability = None
        if self.bodies:
            for e in [e for e in self.bodies if start <= e < stop]:
                del self.bodies[e]
            self._last_body = None
        i = bisect_right(self.stops, start)  # first run ending after start
        j = bisect_left(self.starts, stop)  # runs before j begin before stop
        if i >= j:
            return
        keep_s: list[int] = []
        keep_e: list[int] = []
        keep_f: list[BodyFactory] = []
        if self.starts[i] < start:
            keep_s.append(self.starts[i])
            keep_e.append(start)
            keep_f.append(self.factories[i])
        if self.stops[j - 1] > stop:
            keep_s.append(stop)
            keep_e.append(self.stops[j - 1])
            keep_f.append(self.factories[j - 1])
        self.starts[i:j] = keep_s
        self.stops[i:j] = keep_e
        self.factories[i:j] = keep_f

    def seed(self, runs: list[tuple[int, int]], factory: BodyFactory) -> None:
        """Adds sorted runs (replacing whatever they cover) without a loop per entry."""
        self._availability = None
        merged: list[tuple[int, int]] = []
        for start, stop in runs:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
            else:
                merged.append((start, stop))
        if not self.starts and not self.bodies:
            self.starts = [r[0] for r in merged]
            self.stops = [r[1] for r in merged]
            self.factories = [factory] * len(merged)
            return
        for start, stop in merged:
            if self.bodies or bisect_right(self.stops, start) < bisect_left(self.starts, stop):
                self.remove(start, stop)
        combined = sorted(
            [*zip(self.starts, self.stops, self.factories, strict=True)]
            + [(s, e, factory) for s, e in merged],
            key=lambda run: run[0],
        )
        self.starts = [r[0] for r in combined]
        self.stops = [r[1] for r in combined]
        self.factories = [r[2] for r in combined]


class _Peer(asyncio.Protocol):
    """One client connection to the emulator."""

    def __init__(self, emulator: BookieEmulator) -> None:
        self._emulator = emulator
        self._parser = FrameParser()
        self.transport: asyncio.Transport | None = None
        #: Between the START_TLS answer and the end of the handshake: nothing may be sent.
        self.upgrading = False
        #: The cipher suite negotiated, once this connection speaks TLS.
        self.tls_cipher: str | None = None
        #: The client certificate presented (as `SSLSocket.getpeercert()`), if any.
        self.client_cert: dict[str, Any] | None = None

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing() and not self.upgrading

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._emulator._peers.add(self)
        self._emulator.connections_accepted += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._emulator._peers.discard(self)

    def data_received(self, data: bytes) -> None:
        try:
            payloads = self._parser.feed(data)
        except BookieProtocolError:
            self.abort()
            return
        for i, payload in enumerate(payloads):
            if not self.open:
                return
            try:
                request = decode_request(payload)
            except BookieProtocolError:
                # A real bookie falls back to v2 on such a frame, fails to decode it, and closes.
                self.abort()
                return
            if int(request.header.operation) == Operation.START_TLS:
                if not self._emulator._start_tls(self, request):
                    continue
                if i + 1 < len(payloads) or self._parser.buffered:
                    self.abort()  # bytes after START_TLS, before its answer: not a TLS client
                return
            self._emulator._received(self, request)

    def upgrade(self, context: ssl.SSLContext) -> asyncio.Task[None]:
        """Turns this connection into a TLS server (reading stops until the handshake)."""
        assert self.transport is not None
        raw = self.transport
        raw.pause_reading()
        self.upgrading = True
        return asyncio.get_running_loop().create_task(self._upgrade(raw, context))

    async def _upgrade(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        emulator = self._emulator
        loop = asyncio.get_running_loop()
        try:
            upgraded = await loop.start_tls(
                raw,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=emulator.tls_handshake_timeout,
                ssl_shutdown_timeout=1.0,
            )
        except Exception as exc:  # whatever the handshake died of: the client sees it too
            emulator.tls_failures.append(repr(exc))
            raw.abort()
            return
        finally:
            self.upgrading = False
        if upgraded is None:
            emulator.tls_failures.append("connection lost during the handshake")
            return
        self.transport = upgraded
        self.tls_cipher = cipher_name(upgraded)
        self.client_cert = upgraded.get_extra_info("peercert") or None
        emulator.tls_handshakes += 1

    def send(self, response: pb.Response) -> bool:
        if not self.open:
            return False
        assert self.transport is not None
        try:
            frame = encode_message(response)
        except BookieProtocolError:
            self.abort()  # too long for a frame: the client would drop the connection anyway
            return False
        self.transport.write(frame)
        return True

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class BookieEmulator:
    """One emulated bookie. `await start()` binds, serves and registers in ZooKeeper.

    `zk` may be None for a bookie that does not register. The bookie id is
    `host:port` of the bound port (so port 0 picks a free port and the id
    follows); a restart binds the same port and keeps the id and all data.
    """

    def __init__(
        self,
        zk: ZkClient | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ledgers_root: str = "/ledgers",
        storage: Storage | str = Storage.SORTED,
        readonly: bool = False,
        total_disk_capacity: int = 100 * 1024**3,
        free_disk_space: int = 60 * 1024**3,
        tls: ssl.SSLContext | None = None,
        tls_required: bool = False,
        tls_handshake_timeout: float = 5.0,
    ) -> None:
        if tls_required and tls is None:
            raise ValueError("tls_required needs a server TLS context")
        self.zk = zk
        self.host = host
        self.port = port
        self.ledgers_root = ledgers_root.rstrip("/") or "/"
        self.storage = Storage(storage)
        self.readonly = readonly
        self.total_disk_capacity = total_disk_capacity
        self.free_disk_space = free_disk_space
        self.tls = tls
        self.tls_required = tls_required
        self.tls_handshake_timeout = tls_handshake_timeout
        self._upgrades: set[asyncio.Task[None]] = set()
        #: TLS handshakes completed; and why each failed one failed.
        self.tls_handshakes = 0
        self.tls_failures: list[str] = []
        self._ledgers: dict[int, _Ledger] = {}
        self._server: asyncio.Server | None = None
        self._peers: set[_Peer] = set()
        self._paused = False
        self._held: list[tuple[_Peer, pb.Request, bool]] = []
        self._held_tls: list[tuple[_Peer, pb.Request]] = []
        self._timers: dict[object, asyncio.TimerHandle] = {}
        self._latency: dict[Operation | None, Latency] = {}
        self._statuses: dict[Operation | None, Status] = {}
        self._count_waiters: list[tuple[int, Operation | None, asyncio.Future[None]]] = []
        # statistics
        self.received: Counter[Operation] = Counter()
        self.answered: Counter[Operation] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.connections_accepted = 0
        #: GET_LIST_OF_ENTRIES_OF_LEDGER requests received, per ledger id.
        self.list_requests: Counter[int] = Counter()

    # --- identity and lifecycle ------------------------------------------------------

    @property
    def bookie_id(self) -> str:
        if self.port == 0:
            raise RuntimeError("the bookie id is known once the emulator has bound its port")
        return f"{self.host}:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def open_connections(self) -> int:
        return len(self._peers)

    @property
    def tls_sessions(self) -> list[tuple[str, dict[str, Any] | None]]:
        """(cipher suite, client certificate or None) of each open connection speaking TLS."""
        return [(p.tls_cipher, p.client_cert) for p in self._peers if p.tls_cipher is not None]

    @property
    def paused(self) -> bool:
        return self._paused

    async def __aenter__(self) -> BookieEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Serves on host:port and registers (also used to restart after `crash`)."""
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Peer(self), self.host, self.port, reuse_address=True
        )
        self.port = int(server.sockets[0].getsockname()[1])
        self._server = server
        try:
            await self._register()
        except BaseException:
            await self._shut(abort=True, unregister=False)
            raise

    async def restart(self) -> None:
        await self.start()

    async def stop(self) -> None:
        """Closes the server and every connection, and unregisters."""
        await self._shut(abort=False, unregister=True)

    async def crash(self) -> None:
        """Like a killed bookie: connections reset at once, registration gone, data kept."""
        await self._shut(abort=True, unregister=True)

    async def _shut(self, *, abort: bool, unregister: bool) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for peer in list(self._peers):
            if peer.transport is not None:
                if abort:
                    peer.transport.abort()
                else:
                    peer.transport.close()
        for task in self._upgrades:
            task.cancel()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._held.clear()
        self._held_tls.clear()
        self.in_flight = 0
        if server is not None:
            await server.wait_closed()
        if unregister and self.zk is not None and self.port:
            await unregister_bookie(self.zk, self.ledgers_root, self.bookie_id)

    async def _register(self) -> None:
        if self.zk is not None:
            await register_bookie(
                self.zk,
                self.ledgers_root,
                self.bookie_id,
                self.host,
                self.port,
                readonly=self.readonly,
                tls=self.tls is not None,
            )

    # --- faults ----------------------------------------------------------------------

    async def set_readonly(self, readonly: bool = True) -> None:
        """Turns read-only (adds get EREADONLY) or back, moving the registration like a bookie."""
        self.readonly = readonly
        if self._server is not None:
            await self._register()

    async def tls_settled(self) -> None:
        """Returns once every TLS upgrade under way has succeeded or failed."""
        while self._upgrades:
            await asyncio.gather(*self._upgrades, return_exceptions=True)

    def pause(self) -> None:
        """Stops answering; connections stay open and requests are held until `resume`."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        held_tls, self._held_tls = self._held_tls, []
        for peer, request in held_tls:
            self._answer_start_tls(peer, request)
        held, self._held = self._held, []
        for peer, request, delayed in held:
            if delayed:
                self._answer(peer, request)
            else:
                self._schedule(peer, request)

    def set_latency(self, latency: Latency | None, op: Operation | None = None) -> None:
        """Delays answers to every request (or those of `op`) by a fixed or computed time."""
        if latency is None:
            self._latency.pop(op, None)
        else:
            self._latency[op] = latency

    def inject_status(self, status: Status | None, op: Operation | None = None) -> None:
        """Answers every request (or those of `op`) with `status` instead of handling it."""
        if status is None:
            self._statuses.pop(op, None)
        else:
            self._statuses[op] = Status(status)

    def clear_faults(self) -> None:
        """Removes latency and injected statuses, and resumes."""
        self._latency.clear()
        self._statuses.clear()
        self.resume()

    # --- data --------------------------------------------------------------------------

    def put_ledger(
        self,
        ledger_id: int,
        entries: Iterable[int | range] = (),
        *,
        body_factory: BodyFactory | None = None,
        password: bytes | None = None,
    ) -> None:
        """Stores entries without the wire: ints and step-1 ranges, bodies made on read.

        Creates the ledger if needed (an empty `entries` makes an empty ledger);
        `password` sets the master key later adds must present.
        """
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            ledger = self._ledgers[ledger_id] = _Ledger()
        if password is not None:
            ledger.master_key = master_key(password)
        runs = _as_runs(entries)
        if runs:
            ledger.seed(runs, body_factory or default_body)

    def load_seed_file(self, path: str | Path) -> int:
        """Seeds every ledger of a `write_seed_file` file (default bodies); returns how many."""
        count = 0
        for ledger_id, runs in read_seed_file(path):
            self.put_ledger(ledger_id, [range(start, stop) for start, stop in runs])
            count += 1
        return count

    def put_entry(self, ledger_id: int, entry_id: int, body: bytes) -> None:
        """Stores one body as given (as if it had been added)."""
        if entry_id < 0:
            raise ValueError(f"entry ids must be >= 0, got {entry_id}")
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            ledger = self._ledgers[ledger_id] = _Ledger()
        ledger.put(entry_id, body)

    def drop_entries(self, ledger_id: int, entries: Iterable[int | range]) -> None:
        """Loses these entries (the ledger itself stays)."""
        ledger = self._ledgers.get(ledger_id)
        if ledger is not None:
            for start, stop in _as_runs(entries):
                ledger.remove(start, stop)

    def drop_ledger(self, ledger_id: int) -> None:
        self._ledgers.pop(ledger_id, None)

    def ledger_ids(self) -> list[int]:
        return sorted(self._ledgers)

    def has_ledger(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        ledger = self._ledgers.get(ledger_id)
        return ledger is not None and ledger.has(entry_id)

    def entry_body(self, ledger_id: int, entry_id: int) -> bytes | None:
        ledger = self._ledgers.get(ledger_id)
        return None if ledger is None else ledger.body(ledger_id, entry_id)

    def availability(self, ledger_id: int) -> Availability | None:
        ledger = self._ledgers.get(ledger_id)
        return None if ledger is None else ledger.availability()

    # --- statistics ----------------------------------------------------------------------

    def reset_stats(self) -> None:
        self.received.clear()
        self.answered.clear()
        self.max_in_flight = self.in_flight
        self.connections_accepted = 0
        self.list_requests.clear()

    def stats(self) -> dict[str, Any]:
        """Every counter as plain JSON values (for a process that reports to another).

        `lists_per_ledger` maps "how many list requests a ledger got" to how
        many ledgers got that many: {"1": n} is one request per ledger listed.
        In flight means received and not yet answered: a request is answered
        as soon as it is read unless latency or a pause defers it, so without
        those the maximum stays near 1 however many the client has sent.
        """
        per_ledger = Counter(self.list_requests.values())
        return {
            "bookie_id": self.bookie_id if self.port else None,
            "ledgers": len(self._ledgers),
            "received": {op.name.lower(): n for op, n in sorted(self.received.items())},
            "answered": {op.name.lower(): n for op, n in sorted(self.answered.items())},
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "connections_accepted": self.connections_accepted,
            "list_requests": self.list_requests.total(),
            "ledgers_listed": len(self.list_requests),
            "lists_per_ledger": {str(k): v for k, v in sorted(per_ledger.items())},
        }

    def write_stats(self, path: str | Path) -> None:
        """`stats()` as JSON, replacing `path` at once (a reader never sees half a file)."""
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(self.stats()) + "\n")
        os.replace(tmp, path)

    def _count(self, op: Operation | None) -> int:
        return self.received.total() if op is None else self.received[op]

    async def wait_requests(self, count: int, op: Operation | None = None) -> None:
        """Returns once `count` requests (of `op`, or of any operation) have been received."""
        if self._count(op) >= count:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (count, op, fut)
        self._count_waiters.append(entry)
        try:
            await fut
        finally:
            if entry in self._count_waiters:
                self._count_waiters.remove(entry)

    # --- request path ----------------------------------------------------------------------

    def _start_tls(self, peer: _Peer, request: pb.Request) -> bool:
        """Answers START_TLS (held while paused); returns whether the connection upgrades."""
        self.received[Operation.START_TLS] += 1
        if self._paused:
            self._held_tls.append((peer, request))
            return False
        return self._answer_start_tls(peer, request)

    def _answer_start_tls(self, peer: _Peer, request: pb.Request) -> bool:
        """Answers START_TLS in clear and, if TLS is on, upgrades; returns whether it did."""
        op = Operation.START_TLS
        header = response_header(op, request.header.txnId)
        # A second START_TLS on a TLS connection is refused like one without TLS configured.
        upgrade = self.tls is not None and peer.tls_cipher is None
        reply = pb.Response(header=header, status=pb.StatusCode.ValueType(int(Status.EBADREQ)))
        if upgrade:
            reply.status = pb.EOK
            reply.startTLSResponse.SetInParent()
        if not peer.send(reply):
            return False
        self.answered[op] += 1
        if upgrade:
            assert self.tls is not None
            task = peer.upgrade(self.tls)
            self._upgrades.add(task)
            task.add_done_callback(self._upgrades.discard)
        return upgrade

    def _received(self, peer: _Peer, request: pb.Request) -> None:
        op = _operation(request.header.operation)
        self.received[op] += 1
        if op is Operation.GET_LIST_OF_ENTRIES_OF_LEDGER:
            self.list_requests[request.getListOfEntriesOfLedgerRequest.ledgerId] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self._count_waiters:
            for count, wanted, fut in self._count_waiters:
                if not fut.done() and self._count(wanted) >= count:
                    fut.set_result(None)
        if self._paused:
            self._held.append((peer, request, False))
        else:
            self._schedule(peer, request)

    def _schedule(self, peer: _Peer, request: pb.Request) -> None:
        latency = self._latency.get(_operation(request.header.operation), self._latency.get(None))
        delay = 0.0
        if latency is not None:
            delay = latency(request) if callable(latency) else latency
        if delay <= 0:
            self._answer(peer, request)
            return
        token = object()
        self._timers[token] = asyncio.get_running_loop().call_later(
            delay, self._delayed, token, peer, request
        )

    def _delayed(self, token: object, peer: _Peer, request: pb.Request) -> None:
        self._timers.pop(token, None)
        if self._paused:
            self._held.append((peer, request, True))
        else:
            self._answer(peer, request)

    def _answer(self, peer: _Peer, request: pb.Request) -> None:
        self.in_flight -= 1
        if not peer.open:
            return
        response = self._respond(peer, request)
        if response is not None and peer.send(response):
            self.answered[_operation(request.header.operation)] += 1

    def _respond(self, peer: _Peer, request: pb.Request) -> pb.Response | None:
        header = request.header
        op = _operation(header.operation)
        if self.tls_required and peer.tls_cipher is None:
            return _copied_header_reply(request, Status.EUA)  # the auth layer: not authenticated
        if op not in _HANDLED:
            return _copied_header_reply(request, Status.EBADREQ)
        injected = self._statuses.get(op, self._statuses.get(None))
        if injected is not None:
            return _status_reply(request, op, injected)
        if op is Operation.AUTH:
            reply = _copied_header_reply(request, Status.EOK)
            reply.authResponse.authPluginName = AUTH_DISABLED_PLUGIN
            reply.authResponse.payload = b""
            return reply
        if header.version != pb.VERSION_THREE:
            return _status_reply(request, op, Status.EBADVERSION)
        if not request.HasField(_REQUEST_FIELD[op]):  # type: ignore[arg-type]
            return _copied_header_reply(request, Status.EBADREQ)
        if op is Operation.READ_ENTRY:
            return self._read_entry(request)
        if op is Operation.ADD_ENTRY:
            return self._add_entry(request)
        if op is Operation.READ_LAC:
            return self._read_lac(request)
        if op is Operation.GET_BOOKIE_INFO:
            return self._bookie_info(request)
        if op is Operation.GET_LIST_OF_ENTRIES_OF_LEDGER:
            return self._list_entries(peer, request)
        if op is Operation.WRITE_LAC:
            return self._write_lac(request)
        return _status_reply(request, op, Status.EOK)  # FORCE_LEDGER: all is in memory

    def _read_entry(self, request: pb.Request) -> pb.Response:
        rr = request.readRequest
        ledger = self._ledgers.get(rr.ledgerId)
        if rr.HasField("flag") and rr.flag == pb.ReadRequest.FENCE_LEDGER:
            if not rr.HasField("masterKey"):
                return _status_reply(request, Operation.READ_ENTRY, Status.EUA)
            if ledger is None:
                ledger = self._ledgers[rr.ledgerId] = _Ledger(bytes(rr.masterKey))
            elif ledger.master_key is not None and ledger.master_key != rr.masterKey:
                return _status_reply(request, Operation.READ_ENTRY, Status.EUA)
            ledger.fenced = True
        if ledger is None:
            return _status_reply(request, Operation.READ_ENTRY, Status.ENOLEDGER)
        entry: int | None = rr.entryId
        if entry == LAST_ADD_CONFIRMED:
            entry = ledger.last_entry()
        body = None if entry is None else ledger.body(rr.ledgerId, entry)
        if body is None:
            return _status_reply(request, Operation.READ_ENTRY, Status.ENOENTRY)
        reply = _status_reply(request, Operation.READ_ENTRY, Status.EOK)
        reply.readResponse.body = body
        reply.readResponse.maxLAC = _max_lac(ledger, rr.ledgerId)
        return reply

    def _add_entry(self, request: pb.Request) -> pb.Response:
        ar = request.addRequest
        op = Operation.ADD_ENTRY
        if self.readonly and request.header.priority == 0:
            return _status_reply(request, op, Status.EREADONLY)
        if ar.ledgerId < 0 or ar.entryId < 0 or len(ar.body) < ENTRY_HEADER_SIZE:
            return _status_reply(request, op, Status.EBADREQ)
        head = decode_entry_header(ar.body)
        if (head.ledger_id, head.entry_id) != (ar.ledgerId, ar.entryId):
            return _status_reply(request, op, Status.EBADREQ)
        ledger = self._ledgers.get(ar.ledgerId)
        if ledger is None:
            ledger = self._ledgers[ar.ledgerId] = _Ledger(bytes(ar.masterKey))
        elif ledger.master_key is None:
            ledger.master_key = bytes(ar.masterKey)
        elif ledger.master_key != ar.masterKey:
            return _status_reply(request, op, Status.EUA)
        recovery = ar.HasField("flag") and ar.flag == pb.AddRequest.RECOVERY_ADD
        if ledger.fenced and not recovery:
            return _status_reply(request, op, Status.EFENCED)
        ledger.put(ar.entryId, bytes(ar.body))
        return _status_reply(request, op, Status.EOK)

    def _read_lac(self, request: pb.Request) -> pb.Response:
        ledger_id = request.readLacRequest.ledgerId
        ledger = self._ledgers.get(ledger_id)
        lac_body = last_body = None
        if ledger is not None:
            lac_body = ledger.lac_body
            last = ledger.last_entry()
            last_body = None if last is None else ledger.body(ledger_id, last)
        if lac_body is None and last_body is None:
            # The bookie's quirk: with neither blob the status becomes ENOENTRY, even for a
            # ledger it has never heard of.
            return _status_reply(request, Operation.READ_LAC, Status.ENOENTRY)
        reply = _status_reply(request, Operation.READ_LAC, Status.EOK)
        if lac_body is not None:
            reply.readLacResponse.lacBody = lac_body
        if last_body is not None:
            reply.readLacResponse.lastEntryBody = last_body
        return reply

    def _bookie_info(self, request: pb.Request) -> pb.Response:
        requested = request.getBookieInfoRequest.requested
        reply = _status_reply(request, Operation.GET_BOOKIE_INFO, Status.EOK)
        if requested & BookieInfoFlag.TOTAL_DISK_CAPACITY:
            reply.getBookieInfoResponse.totalDiskCapacity = self.total_disk_capacity
        if requested & BookieInfoFlag.FREE_DISK_SPACE:
            reply.getBookieInfoResponse.freeDiskSpace = self.free_disk_space
        return reply

    def _list_entries(self, peer: _Peer, request: pb.Request) -> pb.Response | None:
        ledger = self._ledgers.get(request.getListOfEntriesOfLedgerRequest.ledgerId)
        op = Operation.GET_LIST_OF_ENTRIES_OF_LEDGER
        if ledger is None:
            return _status_reply(request, op, Status.ENOLEDGER)
        if self.storage is Storage.DBLEDGER:
            return None  # UnsupportedOperationException dies in the read thread pool
        if self.storage is Storage.DBLEDGER_NO_WORKERS:
            peer.abort()  # ... or, on the I/O thread, closes the connection
            return None
        reply = _status_reply(request, op, Status.EOK)
        reply.getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger = (
            ledger.availability().encode()
        )
        return reply

    def _write_lac(self, request: pb.Request) -> pb.Response:
        wr = request.writeLacRequest
        op = Operation.WRITE_LAC
        if self.readonly:
            return _status_reply(request, op, Status.EREADONLY)
        ledger = self._ledgers.get(wr.ledgerId)
        if ledger is None:
            ledger = self._ledgers[wr.ledgerId] = _Ledger(bytes(wr.masterKey))
        elif ledger.master_key is not None and ledger.master_key != wr.masterKey:
            return _status_reply(request, op, Status.EUA)
        ledger.lac_body = bytes(wr.body)
        return _status_reply(request, op, Status.EOK)


def _operation(value: int) -> Operation:
    # Request parsing guarantees a known OperationType (unknown enum values fail it).
    return Operation(value)


def _max_lac(ledger: _Ledger, ledger_id: int) -> int:
    """The bookie's LAC for the ledger: the one its last entry carries (-1 if unreadable)."""
    last = ledger.last_entry()
    body = None if last is None else ledger.body(ledger_id, last)
    if body is None or len(body) < ENTRY_HEADER_SIZE:
        return -1
    return decode_entry_header(body).last_add_confirmed


def _copied_header_reply(request: pb.Request, status: Status) -> pb.Response:
    """An answer carrying the request's own header (EBADREQ, AUTH), as the bookie sends it."""
    reply = pb.Response(status=pb.StatusCode.ValueType(int(status)))
    reply.header.CopyFrom(request.header)
    return reply


def _status_reply(request: pb.Request, op: Operation, status: Status) -> pb.Response:
    """The standard answer for `op` with `status`, echoing the ids the request named."""
    code = pb.StatusCode.ValueType(int(status))
    reply = pb.Response(header=response_header(op, request.header.txnId), status=code)
    if op is Operation.READ_ENTRY:
        rr = request.readRequest
        reply.readResponse.CopyFrom(
            pb.ReadResponse(status=code, ledgerId=rr.ledgerId, entryId=rr.entryId)
        )
    elif op is Operation.ADD_ENTRY:
        ar = request.addRequest
        reply.addResponse.CopyFrom(
            pb.AddResponse(status=code, ledgerId=ar.ledgerId, entryId=ar.entryId)
        )
    elif op is Operation.READ_LAC:
        reply.readLacResponse.CopyFrom(
            pb.ReadLacResponse(status=code, ledgerId=request.readLacRequest.ledgerId)
        )
    elif op is Operation.GET_BOOKIE_INFO:
        reply.getBookieInfoResponse.CopyFrom(pb.GetBookieInfoResponse(status=code))
    elif op is Operation.GET_LIST_OF_ENTRIES_OF_LEDGER:
        reply.getListOfEntriesOfLedgerResponse.CopyFrom(
            pb.GetListOfEntriesOfLedgerResponse(
                status=code, ledgerId=request.getListOfEntriesOfLedgerRequest.ledgerId
            )
        )
    elif op is Operation.WRITE_LAC:
        reply.writeLacResponse.CopyFrom(
            pb.WriteLacResponse(status=code, ledgerId=request.writeLacRequest.ledgerId)
        )
    elif op is Operation.FORCE_LEDGER:
        reply.forceLedgerResponse.CopyFrom(
            pb.ForceLedgerResponse(status=code, ledgerId=request.forceLedgerRequest.ledgerId)
        )
    else:
        reply.header.CopyFrom(request.header)
    return reply


async def run_emulator(
    zk_hosts: str,
    host: str,
    port: int,
    ledgers_root: str,
    storage: str,
    readonly: bool,
    *,
    seed: str | Path | None = None,
    stats: str | Path | None = None,
    latency_ms: float = 0.0,
) -> None:
    """Runs one emulated bookie registered in ZooKeeper until cancelled.

    `seed` is a `write_seed_file` file loaded before the bookie registers (so
    once it is registered it holds everything). With `stats`, the counters
    are written there on SIGUSR1, reset and then written on SIGUSR2, and
    written when the bookie stops. `latency_ms` delays every answer.
    """
    zk = ZkClient(zk_hosts)
    await zk.start()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    try:
        emulator = BookieEmulator(
            zk, host=host, port=port, ledgers_root=ledgers_root, storage=storage, readonly=readonly
        )
        if seed is not None:
            emulator.load_seed_file(seed)
        if latency_ms > 0:
            emulator.set_latency(latency_ms / 1000.0)
        if stats is not None:
            out = stats

            def reset_and_write() -> None:
                emulator.reset_stats()
                emulator.write_stats(out)

            loop.add_signal_handler(signal.SIGUSR1, emulator.write_stats, out)
            loop.add_signal_handler(signal.SIGUSR2, reset_and_write)
            handled += [signal.SIGUSR1, signal.SIGUSR2]
        await emulator.start()
        try:
            await asyncio.Event().wait()
        finally:
            if stats is not None:
                emulator.write_stats(stats)
            await emulator.stop()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        await zk.close()
