"""The emulator's parts (connections, storage, handlers, the fault table) need one owner that
registers the bookie, puts each request through latency, pauses and faults in the order a
bookie would, and counts what clients did.

The emulated bookie: its lifecycle and registration, faults, data, counters, request path.

`BookieEmulator` ties the parts together: it serves `peer.Peer` connections,
keeps `storage.Ledger`s, consults its `faults.FaultTable`, and answers each
request through `handlers` (what a bookie does for it) once its latency has
passed or its pause ended. Requests are handled inline unless latency or a
pause defers them, so answers to delayed requests leave in whatever order
their delays end, the way a bookie's per-ledger thread pools reorder them.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from auditor.bookie.availability import Availability
from auditor.bookie.protocol import (
    AUTH_DISABLED_PLUGIN,
    Operation,
    Status,
    decode_entry_header,
    encode_entry_body,
    master_key,
    response_header,
)
from auditor.metadata.model import DigestType
from auditor.metadata.registry import register_bookie, unregister_bookie
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.store import MetadataStore
from auditor.testing.bookie.faults import FaultTable, Latency
from auditor.testing.bookie.handlers import (
    HANDLED,
    REQUEST_FIELD,
    SERVED_WITHOUT_MESSAGE,
    add_entry,
    bookie_info,
    list_entries,
    read_entry,
    read_lac,
    write_lac,
)
from auditor.testing.bookie.peer import Peer
from auditor.testing.bookie.replies import copied_header_reply, operation, status_reply
from auditor.testing.bookie.seedfile import read_seed_file
from auditor.testing.bookie.storage import (
    BodyFactory,
    Ledger,
    Storage,
    as_runs,
    default_body,
)

__all__ = ["BookieEmulator"]


class BookieEmulator:
    """One emulated bookie. `await start()` binds, serves and registers in ZooKeeper.

    `store` may be None for a bookie that does not register. The bookie id is
    `host:port` of the bound port (so port 0 picks a free port and the id
    follows); a restart binds the same port and keeps the id and all data.
    """

    def __init__(
        self,
        store: MetadataStore | None = None,
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
        self.store = store
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
        self._ledgers: dict[int, Ledger] = {}
        self._server: asyncio.Server | None = None
        self._peers: set[Peer] = set()
        self._paused = False
        self._held: list[tuple[Peer, pb.Request, bool]] = []
        self._held_tls: list[tuple[Peer, pb.Request]] = []
        self._timers: dict[object, asyncio.TimerHandle] = {}
        self._faults = FaultTable()
        #: Entries whose index entry survives but whose bytes cannot be read (per ledger):
        #: listed, and READ_ENTRY answers EIO (`make_unreadable`).
        self._unreadable: dict[int, set[int]] = {}
        self._count_waiters: list[tuple[int, Operation | None, asyncio.Future[None]]] = []
        # statistics
        self.received: Counter[Operation] = Counter()
        self.answered: Counter[Operation] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.connections_accepted = 0
        #: GET_LIST_OF_ENTRIES_OF_LEDGER requests received, per ledger id.
        self.list_requests: Counter[int] = Counter()
        #: ADD_ENTRY requests received, per ledger id: plain ones, and RECOVERY_ADDs
        #: (also per (ledger id, entry id), so a test can tell "each entry copied once").
        self.add_requests: Counter[int] = Counter()
        self.recovery_add_requests: Counter[int] = Counter()
        self.recovery_adds_per_entry: Counter[tuple[int, int]] = Counter()
        #: READ_ENTRY requests with FENCE_LEDGER received, per ledger id, and when the
        #: first of them arrived (`time.monotonic()`), so a test can tell when a ledger
        #: was fenced, not only that it was.
        self.fence_reads: Counter[int] = Counter()
        self.first_fence_read_at: dict[int, float] = {}
        #: Those reads by (ledger id, entry id, header priority): Java's client sends the
        #: fencing read of the last entry (-1) without priority and the recovery reads
        #: after it at 100, and a test can tell which the product sent.
        self.fence_reads_by_priority: Counter[tuple[int, int, int]] = Counter()
        #: Every READ_ENTRY request received, in order: (`time.monotonic()`, ledger id,
        #: entry id), so a test can tell exactly which entries were read, and when.
        self.entry_reads: list[tuple[float, int, int]] = []

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
            lambda: Peer(self), self.host, self.port, reuse_address=True
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
        if unregister and self.store is not None and self.port:
            await unregister_bookie(self.store, self.ledgers_root, self.bookie_id)

    async def _register(self) -> None:
        if self.store is not None:
            await register_bookie(
                self.store,
                self.ledgers_root,
                self.bookie_id,
                self.host,
                self.port,
                readonly=self.readonly,
                tls=self.tls is not None,
            )

    # --- connections (the peer.PeerHost side) ------------------------------------------

    def peer_opened(self, peer: Peer) -> None:
        self._peers.add(peer)
        self.connections_accepted += 1

    def peer_closed(self, peer: Peer) -> None:
        self._peers.discard(peer)

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
        self._faults.set_latency(latency, op)

    def inject_status(self, status: Status | None, op: Operation | None = None) -> None:
        """Answers every request (or those of `op`) with `status` instead of handling it."""
        self._faults.inject_status(status, op)

    def clear_faults(self) -> None:
        """Removes latency and injected statuses, and resumes."""
        self._faults.clear()
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
            ledger = self._ledgers[ledger_id] = Ledger()
        if password is not None:
            ledger.master_key = master_key(password)
        runs = as_runs(entries)
        if runs:
            ledger.seed(runs, body_factory or default_body)

    def load_seed_file(self, path: str | Path, body_factory: BodyFactory | None = None) -> int:
        """Seeds every ledger of a `write_seed_file` file (bodies from `body_factory`,
        default ones without it); returns how many."""
        count = 0
        for ledger_id, runs in read_seed_file(path):
            self.put_ledger(
                ledger_id, [range(start, stop) for start, stop in runs], body_factory=body_factory
            )
            count += 1
        return count

    def put_entry(self, ledger_id: int, entry_id: int, body: bytes) -> None:
        """Stores one body as given, whatever the ledger storage would keep (a test's way
        to plant a corrupt or foreign copy); the ledger's LAC is looked up anew."""
        if entry_id < 0:
            raise ValueError(f"entry ids must be >= 0, got {entry_id}")
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            ledger = self._ledgers[ledger_id] = Ledger()
        ledger.put(entry_id, body)
        ledger.memtable.discard(entry_id)
        ledger.lac, ledger.lac_tracked = None, False

    def flush(self) -> None:
        """What a bookie's periodic flush does to SortedLedgerStorage's memtable: entries
        added so far are flushed, so adding one of them again replaces it."""
        for ledger in self._ledgers.values():
            ledger.memtable.clear()

    def drop_entries(self, ledger_id: int, entries: Iterable[int | range]) -> None:
        """Loses these entries (the ledger itself stays)."""
        ledger = self._ledgers.get(ledger_id)
        if ledger is not None:
            for start, stop in as_runs(entries):
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

    def is_fenced(self, ledger_id: int) -> bool:
        """Whether the ledger is fenced here (a plain add of it gets EFENCED)."""
        ledger = self._ledgers.get(ledger_id)
        return ledger is not None and ledger.fenced

    def ledger_master_key(self, ledger_id: int) -> bytes | None:
        """The master key the ledger holds (set by its first add or `password`), if any."""
        ledger = self._ledgers.get(ledger_id)
        return None if ledger is None else ledger.master_key

    def availability(self, ledger_id: int) -> Availability | None:
        ledger = self._ledgers.get(ledger_id)
        return None if ledger is None else ledger.availability()

    # --- corruption (the deep scrub's faults) ---------------------------------------------

    def corrupt_entry(self, ledger_id: int, entry_id: int, *, at: int = -1) -> None:
        """Bit rot: flips the lowest bit of byte `at` of a stored entry (default its last,
        a payload byte when it has one). The entry stays listed and readable; its digest
        no longer matches. Raises KeyError when the bookie does not hold the entry."""
        ledger = self._ledgers.get(ledger_id)
        body = None if ledger is None else ledger.body(ledger_id, entry_id)
        if ledger is None or body is None:
            raise KeyError(f"{self.bookie_id} holds no entry {entry_id} of ledger {ledger_id}")
        i = at % len(body)
        ledger.put(entry_id, body[:i] + bytes([body[i] ^ 0x01]) + body[i + 1 :])

    def diverge_entry(
        self,
        ledger_id: int,
        entry_id: int,
        payload: bytes,
        *,
        digest_type: DigestType = DigestType.CRC32C,
        password: bytes = b"",
    ) -> None:
        """A copy that differs from the others yet passes its digest: the stored entry's
        header is kept and its payload replaced by `payload`, with a digest computed anew
        (`digest_type`, `password`: the ledger's). Raises KeyError when the bookie does
        not hold the entry."""
        ledger = self._ledgers.get(ledger_id)
        body = None if ledger is None else ledger.body(ledger_id, entry_id)
        if ledger is None or body is None:
            raise KeyError(f"{self.bookie_id} holds no entry {entry_id} of ledger {ledger_id}")
        h = decode_entry_header(body)
        ledger.put(
            entry_id,
            encode_entry_body(
                h.ledger_id,
                h.entry_id,
                h.last_add_confirmed,
                h.length,
                payload,
                digest_type,
                password,
            ),
        )

    def make_unreadable(self, ledger_id: int, entries: Iterable[int | range]) -> None:
        """The index keeps these entries but the entry log lost their bytes: they stay
        listed, and READ_ENTRY answers EIO (what a bookie answers when its storage throws
        on the read) until the entry is added again."""
        lost = self._unreadable.setdefault(ledger_id, set())
        for start, stop in as_runs(entries):
            lost.update(range(start, stop))

    def _unreadable_read(self, request: pb.Request) -> bool:
        rr = request.readRequest
        return rr.entryId in self._unreadable.get(rr.ledgerId, ())

    # --- statistics ----------------------------------------------------------------------

    def reset_stats(self) -> None:
        self.received.clear()
        self.answered.clear()
        self.max_in_flight = self.in_flight
        self.connections_accepted = 0
        self.list_requests.clear()
        self.add_requests.clear()
        self.recovery_add_requests.clear()
        self.recovery_adds_per_entry.clear()
        self.fence_reads.clear()
        self.first_fence_read_at.clear()
        self.fence_reads_by_priority.clear()
        self.entry_reads.clear()

    def stats(self) -> dict[str, Any]:
        """Every counter as plain JSON values (for a process that reports to another).

        `lists_per_ledger` maps "how many list requests a ledger got" to how
        many ledgers got that many: {"1": n} is one request per ledger listed.
        In flight means received and not yet answered: a request is answered
        as soon as it is read unless latency or a pause defers it, so without
        those the maximum stays near 1 however many the client has sent.
        `recovery_adds_repeated` counts the entries that got more than one
        RECOVERY_ADD (0 when every entry was copied here at most once).
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
            "adds": self.add_requests.total(),
            "recovery_adds": self.recovery_add_requests.total(),
            "recovery_adds_repeated": sum(
                1 for n in self.recovery_adds_per_entry.values() if n > 1
            ),
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

    def start_tls_requested(self, peer: Peer, request: pb.Request) -> bool:
        """Answers START_TLS (held while paused); returns whether the connection upgrades."""
        self.received[Operation.START_TLS] += 1
        if self._paused:
            self._held_tls.append((peer, request))
            return False
        return self._answer_start_tls(peer, request)

    def _answer_start_tls(self, peer: Peer, request: pb.Request) -> bool:
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

    def request_received(self, peer: Peer, request: pb.Request) -> None:
        op = operation(request.header.operation)
        self.received[op] += 1
        if op is Operation.GET_LIST_OF_ENTRIES_OF_LEDGER:
            self.list_requests[request.getListOfEntriesOfLedgerRequest.ledgerId] += 1
        elif op is Operation.ADD_ENTRY and request.HasField("addRequest"):
            ar = request.addRequest
            if ar.HasField("flag") and ar.flag == pb.AddRequest.RECOVERY_ADD:
                self.recovery_add_requests[ar.ledgerId] += 1
                self.recovery_adds_per_entry[ar.ledgerId, ar.entryId] += 1
            else:
                self.add_requests[ar.ledgerId] += 1
        elif op is Operation.READ_ENTRY and request.HasField("readRequest"):
            rr = request.readRequest
            self.entry_reads.append((time.monotonic(), rr.ledgerId, rr.entryId))
            if rr.HasField("flag") and rr.flag == pb.ReadRequest.FENCE_LEDGER:
                self.fence_reads[rr.ledgerId] += 1
                self.first_fence_read_at.setdefault(rr.ledgerId, time.monotonic())
                self.fence_reads_by_priority[rr.ledgerId, rr.entryId, request.header.priority] += 1
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

    def _schedule(self, peer: Peer, request: pb.Request) -> None:
        delay = self._faults.delay(operation(request.header.operation), request)
        if delay <= 0:
            self._answer(peer, request)
            return
        token = object()
        self._timers[token] = asyncio.get_running_loop().call_later(
            delay, self._delayed, token, peer, request
        )

    def _delayed(self, token: object, peer: Peer, request: pb.Request) -> None:
        self._timers.pop(token, None)
        if self._paused:
            self._held.append((peer, request, True))
        else:
            self._answer(peer, request)

    def _answer(self, peer: Peer, request: pb.Request) -> None:
        self.in_flight -= 1
        if not peer.open:
            return
        response = self._respond(peer, request)
        if response is not None and peer.send(response):
            self.answered[operation(request.header.operation)] += 1

    def _respond(self, peer: Peer, request: pb.Request) -> pb.Response | None:
        header = request.header
        op = operation(header.operation)
        if self.tls_required and peer.tls_cipher is None:
            return copied_header_reply(request, Status.EUA)  # the auth layer: not authenticated
        if op not in HANDLED:
            return copied_header_reply(request, Status.EBADREQ)
        injected = self._faults.status(op)
        if injected is not None:
            return status_reply(request, op, injected)
        if op is Operation.AUTH:
            reply = copied_header_reply(request, Status.EOK)
            reply.authResponse.authPluginName = AUTH_DISABLED_PLUGIN
            reply.authResponse.payload = b""
            return reply
        if header.version != pb.VERSION_THREE:
            return status_reply(request, op, Status.EBADVERSION)
        bare = not request.HasField(REQUEST_FIELD[op])  # type: ignore[arg-type]
        if bare and op not in SERVED_WITHOUT_MESSAGE:
            return copied_header_reply(request, Status.EBADREQ)
        if op is Operation.READ_ENTRY:
            if self._unreadable and self._unreadable_read(request):
                return status_reply(request, op, Status.EIO)
            return read_entry(self._ledgers, request)
        if op is Operation.ADD_ENTRY:
            reply = add_entry(self._ledgers, request, readonly=self.readonly, storage=self.storage)
            if self._unreadable and reply.status == int(Status.EOK):
                ar = request.addRequest
                self._unreadable.get(ar.ledgerId, set()).discard(ar.entryId)
            return reply
        if op is Operation.READ_LAC:
            return read_lac(self._ledgers, request, self.storage)
        if op is Operation.GET_BOOKIE_INFO:
            return bookie_info(
                request,
                total_disk_capacity=self.total_disk_capacity,
                free_disk_space=self.free_disk_space,
            )
        if op is Operation.GET_LIST_OF_ENTRIES_OF_LEDGER:
            return list_entries(self._ledgers, request, self.storage, peer.abort)
        if op is Operation.WRITE_LAC:
            return write_lac(self._ledgers, request, readonly=self.readonly, storage=self.storage)
        return status_reply(request, op, Status.EOK)  # FORCE_LEDGER: all is in memory
