"""A pooled asyncio client for the bookie operations the auditor needs.

Checks fan out to every bookie of every ensemble, so the client is built so
that a check can neither hurt a bookie nor be misled by one:

* One connection per bookie, opened lazily, shared by every request to that
  bookie (a bookie multiplexes them), and re-opened on the next request after
  it drops. A failed connect starts an exponential backoff during which calls
  fail at once instead of each paying a connect timeout.
* A cap on requests in flight per bookie (a semaphore), so however many
  ledgers a check walks, a bookie never sees more than `max_in_flight`
  requests from us. Time spent waiting for a slot does not count against a
  request's timeout; the timeout starts when the request is sent.
* Every call returns an outcome (`auditor.bookie.results`) rather than
  raising, keeping "the bookie answered ENOLEDGER" apart from "the bookie did
  not answer".
* DbLedgerStorage bookies never answer a list request for a ledger they hold
  (the request dies inside the bookie). While a bookie's ability to list is
  unknown, only one list request at a time goes to it (the probe); the others
  wait for the probe's verdict. An EOK proves it can list; a timeout, while a
  GET_BOOKIE_INFO sent beside the probe is answered, proves it cannot, and
  from then on (until the verdict expires) every list request to it returns
  `CannotList` at once without touching the network. So learning costs one
  timeout per bookie, and a silent bookie is never reported as one missing
  entries. A bookie that answers neither is stalled, not unable to list: the
  probe's timeout is returned as such and nothing is learnt, so a passing
  stall does not downgrade the bookie to first/last-entry probing. ENOLEDGER
  proves nothing: the bookie checks that a ledger exists before it tries (and,
  on DbLedgerStorage, fails) to list it.
  Without read worker threads a DbLedgerStorage bookie closes the connection
  instead of staying silent, so repeated disconnects on list probes also mean
  "cannot list".

With `tls` (`auditor.bookie.tls`) every connection is upgraded before its
first request, and a failed upgrade counts as a failed connect (backoff
included). A bookie that requires TLS answers every request of a connection
in clear with a bodiless EUA; that is reported as `UNAUTHORIZED` with what to
configure, never as an answer about the ledger.

Addresses come from a resolver callable (in production: ZooKeeper
registration via `auditor.metadata.registry.resolve_bookie`), asked each time
a connection is opened so a bookie that moved is found again.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Final, TypeVar

from auditor.backoff import Backoff
from auditor.bookie.availability import Availability
from auditor.bookie.connection import BookieConnection, CallFailed
from auditor.bookie.protocol import (
    MAX_FRAME_SIZE,
    Status,
    add_entry_frame,
    add_entry_request,
    effective_status,
    get_bookie_info_request,
    get_list_of_entries_request,
    is_auth_refusal,
    list_request_frame,
    master_key,
    read_entry_frame,
    read_entry_request,
    read_lac_request,
)
from auditor.bookie.results import (
    BookieInfo,
    CannotList,
    EntryRead,
    ErrorStatus,
    LacRead,
    ListCapability,
    ListOutcome,
    NoAnswer,
    Ok,
    Outcome,
    RawListOutcome,
    Unanswered,
)
from auditor.bookie.tls import TLS_CONTEXT_FACTORY, BookieTls
from auditor.errors import FormatError
from auditor.proto import bookkeeper_protocol_pb2 as pb

__all__ = ["BookieClient", "Resolver", "decode_listing"]

T = TypeVar("T")


#: Maps a bookie id to (host, port), or None when the bookie has no known address.
Resolver = Callable[[str], Awaitable[tuple[str, int] | None]]

_CLOSED: Final = NoAnswer(Unanswered.CLOSED, "bookie client closed")
_LIST_OP: Final = int(pb.GET_LIST_OF_ENTRIES_OF_LEDGER)
#: The status of a request that went well, as the wire has it.
_EOK: Final = int(Status.EOK)
#: Operation names as the observer is told them (`OperationType.Name`, lower case),
#: looked up once per operation rather than once per answer.
_OPERATION_NAMES: dict[int, str] = {}
_READ_OP: Final = int(pb.READ_ENTRY)
_ADD_OP: Final = int(pb.ADD_ENTRY)


class _Slots:
    """The per-bookie in-flight cap: a semaphore that can also be taken without waiting.

    `asyncio.Semaphore` has no synchronous acquire, and the replicas check's hot
    path (`BookieClient.start_list`) sends from plain code, without a task per
    request. Waiters are served first come, first served; `try_take` never
    overtakes one.
    """

    __slots__ = ("_waiters", "free")

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_take(self) -> bool:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        if self.try_take():
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.give()  # handed a slot just as we were cancelled: pass it on
            raise

    def give(self) -> None:
        """Returns a slot: straight to the first live waiter, if any."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1


class ListBatch:
    """The outcomes of a batch of list requests (`BookieClient.start_lists_raw`), each
    delivered by its answer's callback, with one wait for them all.

    Requests whose answers nobody waits for any more (the batch given up: `cancel`)
    are left to their answers or time-outs, which return their slots; those sent in
    tasks are cancelled."""

    __slots__ = ("_done", "_error", "_left", "_tasks", "outcomes")

    def __init__(self) -> None:
        #: Per (bookie, ledger): the raw outcome, or, where a task asked, the decoded one.
        self.outcomes: dict[tuple[str, int], RawListOutcome | ListOutcome] = {}
        self._left = 0
        self._done: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Future[ListOutcome]] = []
        #: A task that raised (a bug: the request path returns its failures): raised by
        #: `wait` once the rest are in, as awaiting that task would have raised it.
        self._error: BaseException | None = None

    def expect(self) -> None:
        self._left += 1

    def deliver(self, key: tuple[str, int], outcome: RawListOutcome | ListOutcome) -> None:
        self.outcomes[key] = outcome
        self._settled()

    def _settled(self) -> None:
        self._left -= 1
        if not self._left and self._done is not None and not self._done.done():
            self._done.set_result(None)

    def track(self, key: tuple[str, int], task: asyncio.Future[ListOutcome]) -> None:
        """A request sent in a task: its outcome delivered when it ends (cancelled: never,
        as the batch is then given up)."""
        self._tasks.append(task)

        def ended(done: asyncio.Future[ListOutcome]) -> None:
            if done.cancelled():
                return
            error = done.exception()
            if error is None:
                self.deliver(key, done.result())
                return
            self._error = self._error or error
            self._settled()

        task.add_done_callback(ended)

    async def wait(self) -> None:
        """Until every expected outcome is in."""
        if self._left:
            self._done = asyncio.get_running_loop().create_future()
            await self._done
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        for task in self._tasks:
            if not task.done():
                task.cancel()


class _Bookie:
    """Everything the pool keeps per bookie."""

    __slots__ = (
        "bookie_id",
        "conn",
        "connecting",
        "connections_opened",
        "failures",
        "in_flight",
        "last_failure",
        "list_cap",
        "list_cap_until",
        "list_disconnects",
        "probe",
        "retry_at",
        "slots",
        "stalled",
        "unmatched",
        "waiting",
    )

    def __init__(self, bookie_id: str, max_in_flight: int) -> None:
        self.bookie_id = bookie_id
        self.slots = _Slots(max_in_flight)
        self.waiting = 0
        self.in_flight = 0
        self.conn: BookieConnection | None = None
        self.connecting: asyncio.Task[BookieConnection | NoAnswer] | None = None
        self.connections_opened = 0
        self.failures = 0
        self.retry_at = 0.0
        self.last_failure: NoAnswer | None = None
        self.list_cap = ListCapability.UNKNOWN
        self.list_cap_until = 0.0
        self.list_disconnects = 0
        self.probe: asyncio.Event | None = None
        #: A probe that found the bookie answering nothing (not even bookie info),
        #: with its answer: the requests that waited on that probe share it.
        self.stalled: tuple[asyncio.Event, NoAnswer] | None = None
        #: Unmatched responses seen on connections already replaced.
        self.unmatched = 0

    def replace_connection(self, conn: BookieConnection | None) -> None:
        if self.conn is not None:
            self.unmatched += self.conn.unmatched_responses
        self.conn = conn


class BookieClient:
    """Talks to many bookies; one instance per auditor process is enough.

    `request_timeout` bounds each request from the moment it is sent;
    `list_timeout` (default: `request_timeout`) is used for list requests and
    is what learning that a bookie cannot list costs. `connect_timeout` bounds
    address resolution and the TCP connect each. After a failed connect the
    bookie is not retried for `backoff_initial` seconds, doubling per further
    failure up to `backoff_max`. A list-capability verdict is remembered for
    `list_capability_ttl` seconds. With `tls`, connections speak TLS.
    """

    def __init__(
        self,
        resolver: Resolver,
        *,
        request_timeout: float = 5.0,
        list_timeout: float | None = None,
        connect_timeout: float = 2.0,
        max_in_flight: int = 64,
        backoff_initial: float = 0.1,
        backoff_max: float = 10.0,
        list_capability_ttl: float = 600.0,
        list_disconnects_before_cannot_list: int = 2,
        max_frame_size: int = MAX_FRAME_SIZE,
        tls: BookieTls | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        for name, value in (
            ("request_timeout", request_timeout),
            ("connect_timeout", connect_timeout),
            ("list_timeout", request_timeout if list_timeout is None else list_timeout),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        self._resolver = resolver
        self.request_timeout = request_timeout
        self.list_timeout = request_timeout if list_timeout is None else list_timeout
        self.connect_timeout = connect_timeout
        self.max_in_flight = max_in_flight
        #: No new connection to a bookie for this long after failed connects in a row.
        self.backoff = Backoff(initial=backoff_initial, maximum=backoff_max)
        self.list_capability_ttl = list_capability_ttl
        self.list_disconnects_before_cannot_list = max(1, list_disconnects_before_cannot_list)
        self.max_frame_size = max_frame_size
        self.tls = tls
        self._bookies: dict[str, _Bookie] = {}
        # txnIds are unique across the client, starting at 1 like the Java client's counter.
        self._txn = itertools.count(1)
        self._closed = False
        #: Tasks of reads and adds that wait for a slot or a connection (`_start_later`).
        self._starting: set[asyncio.Task[None]] = set()
        #: Called with (operation, status) after every request, e.g. to count them.
        self.observer: Callable[[str, str], None] | None = None

    async def __aenter__(self) -> BookieClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- introspection ----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def list_capability(self, bookie_id: str) -> ListCapability:
        b = self._bookies.get(bookie_id)
        return ListCapability.UNKNOWN if b is None else self._capability(b)

    def forget_list_capability(self, bookie_id: str | None = None) -> None:
        """Drops remembered list verdicts (of one bookie, or of all)."""
        targets = self._bookies.values() if bookie_id is None else [self._bookies.get(bookie_id)]
        for b in targets:
            if b is not None:
                b.list_cap = ListCapability.UNKNOWN
                b.list_disconnects = 0

    def in_flight(self, bookie_id: str) -> int:
        """Requests to this bookie currently sent and unanswered (or being connected for)."""
        b = self._bookies.get(bookie_id)
        return 0 if b is None else b.in_flight

    def is_connected(self, bookie_id: str) -> bool:
        b = self._bookies.get(bookie_id)
        return b is not None and b.conn is not None and b.conn.is_open

    def unmatched_responses(self, bookie_id: str) -> int:
        """Responses that matched no pending request (mostly late ones after a timeout)."""
        b = self._bookies.get(bookie_id)
        if b is None:
            return 0
        return b.unmatched + (0 if b.conn is None else b.conn.unmatched_responses)

    def connections_opened(self, bookie_id: str) -> int:
        b = self._bookies.get(bookie_id)
        return 0 if b is None else b.connections_opened

    def tls_cipher(self, bookie_id: str) -> str | None:
        """The cipher suite of the open connection to the bookie; None if in clear or none."""
        b = self._bookies.get(bookie_id)
        return None if b is None or b.conn is None or not b.conn.is_open else b.conn.tls_cipher

    # --- operations -----------------------------------------------------------------------

    async def read_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool = False,
        password: bytes = b"",
        high_priority: bool = False,
        request_timeout: float | None = None,
    ) -> Outcome[EntryRead]:
        """Reads one entry as stored; entry_id -1 asks for the last one.

        Never fencing unless `fence`: then the read carries FENCE_LEDGER and the master
        key derived from `password` (ledger recovery's fencing and recovery reads only).
        `high_priority`: recovery's reads past the LAC, as Java sends them
        (`read_entry_request`).
        """
        key = master_key(password) if fence else None
        request = read_entry_request(
            0, ledger_id, entry_id, fence_key=key, high_priority=high_priority
        )
        resp = await self._exchange(bookie_id, request, request_timeout)
        if isinstance(resp, NoAnswer | ErrorStatus):
            return resp
        r = resp.readResponse
        if not resp.HasField("readResponse") or not r.HasField("body"):
            return _bad(bookie_id, "EOK read response without an entry body")
        return Ok(
            EntryRead(
                r.ledgerId, r.entryId, bytes(r.body), r.maxLAC if r.HasField("maxLAC") else None
            )
        )

    async def read_lac(
        self, bookie_id: str, ledger_id: int, *, request_timeout: float | None = None
    ) -> Outcome[LacRead]:
        """READ_LAC. A bookie answers ENOENTRY, not ENOLEDGER, for a ledger it does not have."""
        resp = await self._exchange(bookie_id, read_lac_request(0, ledger_id), request_timeout)
        if isinstance(resp, NoAnswer | ErrorStatus):
            return resp
        if not resp.HasField("readLacResponse"):
            return _bad(bookie_id, "EOK READ_LAC response without its body")
        r = resp.readLacResponse
        return Ok(
            LacRead(
                r.ledgerId,
                bytes(r.lacBody) if r.HasField("lacBody") else None,
                bytes(r.lastEntryBody) if r.HasField("lastEntryBody") else None,
            )
        )

    async def get_bookie_info(
        self, bookie_id: str, requested: int = 3, *, request_timeout: float | None = None
    ) -> Outcome[BookieInfo]:
        """Disk figures; `requested` is a `BookieInfoFlag` mask (3 = both)."""
        resp = await self._exchange(
            bookie_id, get_bookie_info_request(0, requested), request_timeout
        )
        if isinstance(resp, NoAnswer | ErrorStatus):
            return resp
        r = resp.getBookieInfoResponse
        return Ok(
            BookieInfo(
                r.totalDiskCapacity if r.HasField("totalDiskCapacity") else None,
                r.freeDiskSpace if r.HasField("freeDiskSpace") else None,
            )
        )

    async def add_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        body: bytes,
        *,
        password: bytes = b"",
        recovery: bool = False,
        high_priority: bool = False,
        request_timeout: float | None = None,
    ) -> Outcome[int]:
        """Stores one entry body (see `encode_entry_body`); Ok carries the entry id.

        The master key is derived from `password`. With `recovery` the add carries the
        RECOVERY_ADD flag: the replication worker's copies (the body as read from
        another replica, unchanged) and ledger recovery's re-adds; plain adds are for
        test clusters, the auditor never writes as a ledger's writer. `high_priority`:
        ledger recovery's re-adds, which a read-only member of the ensemble must take
        (`add_entry_request`). Like every call
        it waits for a slot under the bookie's in-flight cap, then `request_timeout`
        (default: the client's) from the moment it is sent.
        """
        key = master_key(password)
        resp = await self._exchange(
            bookie_id,
            add_entry_request(
                0, ledger_id, entry_id, key, body, recovery=recovery, high_priority=high_priority
            ),
            request_timeout,
        )
        if isinstance(resp, NoAnswer | ErrorStatus):
            return resp
        if not resp.HasField("addResponse"):
            return _bad(bookie_id, "EOK add response without its body")
        return Ok(resp.addResponse.entryId)

    def start_read_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        then: Callable[[Outcome[bytes]], None],
        *,
        request_timeout: float | None = None,
    ) -> None:
        """A plain READ_ENTRY (no fencing, no priority) whose outcome goes to `then`: Ok
        with the entry's body as stored, or why there is none (the outcomes of
        `read_entry`).

        The replication worker reads every entry it copies; a coroutine and a future per
        read cost more than the read. Where the bookie's connection is open and a slot
        under its cap is free, the request goes out here, encoded by hand, and `then` is
        called from the answer's callback (or the connection's time-out sweep); otherwise
        a task waits for the slot or the connection first. Same cap, timeout and
        observer as `read_entry`, a txnId of the same counter; `then` is never called
        before this returns, and must not raise.
        """
        txn_id = next(self._txn)
        self._start(
            bookie_id,
            (txn_id, _READ_OP),
            read_entry_frame(txn_id, ledger_id, entry_id),
            self.request_timeout if request_timeout is None else request_timeout,
            _read_body,
            then,
        )

    def start_add_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        body: bytes,
        key: bytes,
        then: Callable[[Outcome[int]], None],
        *,
        recovery: bool = False,
        request_timeout: float | None = None,
    ) -> None:
        """An ADD_ENTRY (no priority) of `body` under the master key `key` (`master_key`
        of the password), its outcome to `then` as `add_entry` would return it; sent as
        `start_read_entry` sends. The body is not copied into a message: it goes to the
        connection as it is, between the request's hand-encoded fields."""
        txn_id = next(self._txn)
        self._start(
            bookie_id,
            (txn_id, _ADD_OP),
            add_entry_frame(txn_id, ledger_id, entry_id, key, body, recovery=recovery),
            self.request_timeout if request_timeout is None else request_timeout,
            _added,
            then,
        )

    def _start(
        self,
        bookie_id: str,
        key: tuple[int, int],
        frame: bytes | tuple[bytes, ...],
        request_timeout: float,
        outcome: Callable[[str, pb.Response | NoAnswer | ErrorStatus], Outcome[T]],
        then: Callable[[Outcome[T]], None],
    ) -> None:
        """Sends a request (its `key`, txnId and operation, and its `frame`) now if
        nothing has to wait, else from a task once its slot and connection are there;
        its outcome to `then`."""
        b = self._bookies.get(bookie_id)
        if b is not None and not self._closed:
            conn = b.conn
            if conn is not None and conn.is_open and b.slots.try_take():
                b.in_flight += 1
                conn.send_frame_then(
                    key,
                    frame,
                    request_timeout,
                    partial(self._entry_answered, key[1], outcome, then, b),
                )
                return
        task = asyncio.ensure_future(
            self._start_later(bookie_id, key, frame, request_timeout, outcome, then)
        )
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def _start_later(
        self,
        bookie_id: str,
        key: tuple[int, int],
        frame: bytes | tuple[bytes, ...],
        request_timeout: float,
        outcome: Callable[[str, pb.Response | NoAnswer | ErrorStatus], Outcome[T]],
        then: Callable[[Outcome[T]], None],
    ) -> None:
        """`_start` for a request that waits: for a slot (time spent here does not count
        against its timeout) and for its connection, as `_exchange_once` waits."""
        op = key[1]
        if self._closed:
            self._observe(op, _CLOSED)
            then(_CLOSED)
            return
        b = self._bookie(bookie_id)
        b.waiting += 1
        try:
            await b.slots.take()
        finally:
            b.waiting -= 1
        b.in_flight += 1
        answered = partial(self._entry_answered, key[1], outcome, then, b)
        if self._closed:
            answered(CallFailed(Unanswered.CLOSED, _CLOSED.detail))
            return
        try:
            conn = await self._connection(b)
        except BaseException:
            b.in_flight -= 1
            b.slots.give()
            raise
        if isinstance(conn, NoAnswer):
            b.in_flight -= 1
            b.slots.give()
            self._observe(op, conn)
            then(outcome(b.bookie_id, conn))
            return
        try:
            conn.send_frame_then(key, frame, request_timeout, answered)
        except CallFailed as exc:
            answered(exc)

    def _entry_answered(
        self,
        op: int,
        outcome: Callable[[str, pb.Response | NoAnswer | ErrorStatus], Outcome[T]],
        then: Callable[[Outcome[T]], None],
        b: _Bookie,
        response: pb.Response | CallFailed,
    ) -> None:
        """A read's or an add's answer (from `_start`): the bookie's slot back, the
        observer told, `outcome` of the answer to `then`."""
        b.in_flight -= 1
        b.slots.give()
        answered: pb.Response | NoAnswer | ErrorStatus
        if (
            isinstance(response, CallFailed)
            or response.status
            or (response.readResponse if op == _READ_OP else response.addResponse).status
        ):
            answered = self._answered(b, response)
        else:
            # EOK at the top and inside (or no inner body): `_answered`'s outcome without
            # its general lookups (no authentication refusal is EOK).
            answered = response
            b.failures = 0
        self._observe(op, answered)
        then(outcome(b.bookie_id, answered))

    async def get_list_of_entries(
        self, bookie_id: str, ledger_id: int, *, request_timeout: float | None = None
    ) -> ListOutcome:
        """Which entries of the ledger the bookie holds.

        `ErrorStatus(ENOLEDGER)` means the bookie answered that it has no such
        ledger; `CannotList` means it is known not to answer this request.
        """
        request = get_list_of_entries_request(0, ledger_id)
        if self._closed:
            return _CLOSED
        b = self._bookie(bookie_id)
        while True:
            cap = self._capability(b)
            if cap is ListCapability.CANNOT_LIST:
                return CannotList(bookie_id, b.list_cap_until)
            if cap is ListCapability.CAN_LIST:
                return await self._list(b, request, request_timeout)
            if b.probe is None:
                break
            waited = b.probe
            await waited.wait()
            if self._closed:
                return _CLOSED
            if b.stalled is not None and b.stalled[0] is waited:
                return b.stalled[1]
        probe = b.probe = asyncio.Event()
        # Beside the probe, a request every bookie answers: a list request that
        # times out while this one is answered is a bookie that cannot list; if
        # both go unanswered the bookie is stalled (a GC pause, a dead disk), which
        # proves nothing about listing and must not turn off full verification.
        alive = asyncio.ensure_future(
            self.get_bookie_info(bookie_id, 0, request_timeout=request_timeout)
        )
        try:
            outcome = await self._list(b, request, request_timeout)
            if (
                isinstance(outcome, NoAnswer)
                and outcome.reason is Unanswered.TIMEOUT
                and isinstance(await alive, NoAnswer)
            ):
                # The requests that waited on this probe get its answer without a
                # timeout each; a later request probes again.
                b.stalled = (probe, outcome)
                return outcome
            self._learn(b, outcome)
            if b.list_cap is ListCapability.CANNOT_LIST and isinstance(outcome, NoAnswer):
                return CannotList(bookie_id, b.list_cap_until)
            return outcome
        finally:
            alive.cancel()
            if b.probe is probe:
                b.probe = None
            probe.set()

    # --- list capability -----------------------------------------------------------------

    def _capability(self, b: _Bookie) -> ListCapability:
        if (
            b.list_cap is not ListCapability.UNKNOWN
            and asyncio.get_running_loop().time() >= b.list_cap_until
        ):
            b.list_cap = ListCapability.UNKNOWN
            b.list_disconnects = 0
        return b.list_cap

    def _set_capability(self, b: _Bookie, cap: ListCapability) -> None:
        b.list_cap = cap
        b.list_cap_until = asyncio.get_running_loop().time() + self.list_capability_ttl

    def _learn(self, b: _Bookie, outcome: ListOutcome) -> None:
        if isinstance(outcome, Ok):
            b.list_disconnects = 0
            self._set_capability(b, ListCapability.CAN_LIST)
        elif isinstance(outcome, NoAnswer):
            if outcome.reason is Unanswered.TIMEOUT:
                self._set_capability(b, ListCapability.CANNOT_LIST)
            elif outcome.reason is Unanswered.DISCONNECTED:
                b.list_disconnects += 1
                if b.list_disconnects >= self.list_disconnects_before_cannot_list:
                    self._set_capability(b, ListCapability.CANNOT_LIST)

    async def _list(
        self, b: _Bookie, request: pb.Request, request_timeout: float | None
    ) -> ListOutcome:
        resp = await self._exchange(
            b.bookie_id,
            request,
            self.list_timeout if request_timeout is None else request_timeout,
        )
        return _listing(request.getListOfEntriesOfLedgerRequest.ledgerId, b.bookie_id, resp)

    def start_list(self, bookie_id: str, ledger_id: int) -> asyncio.Future[ListOutcome]:
        """`get_list_of_entries` as a future, sent at once where nothing has to wait.

        The replicas check asks every ensemble bookie of every ledger; a task per
        request (and the coroutines under it) cost more than the request. When the
        bookie is known to list, its connection is open and a slot under its cap is
        free, the request goes out here and a callback turns the answer into the
        outcome: same cap, timeout, txnId, observer and outcome as
        `get_list_of_entries`. Otherwise (unknown capability, connecting, backing
        off, cap full) it is `get_list_of_entries` in a task.
        """
        out: asyncio.Future[ListOutcome] = asyncio.get_running_loop().create_future()
        outcome = partial(_listing, ledger_id)
        deliver = partial(_set_if_pending, out)
        if self._send_list(bookie_id, ledger_id, partial(self._list_answered, deliver, outcome)):
            return out
        return asyncio.ensure_future(self.get_list_of_entries(bookie_id, ledger_id))

    def _send_list(
        self,
        bookie_id: str,
        ledger_id: int,
        answered: Callable[[_Bookie, pb.Response | CallFailed], None],
    ) -> bool:
        """Sends a list request now if nothing has to wait (see `start_list`), its answer
        (or failure) to `answered`, which returns the slot; False if not sent."""
        b = self._bookies.get(bookie_id)
        conn = None if b is None else b.conn
        if (
            self._closed
            or b is None
            or conn is None
            or not conn.is_open
            or b.list_cap is not ListCapability.CAN_LIST
            # expired: `_capability` forgets it there
            or asyncio.get_running_loop().time() >= b.list_cap_until
            or not b.slots.try_take()
        ):
            return False
        b.in_flight += 1
        txn_id = next(self._txn)
        # A caller that gives up on its future leaves the request to its answer or its
        # timeout, which return the slot.
        conn.send_frame_then(
            (txn_id, _LIST_OP),
            list_request_frame(txn_id, ledger_id),
            self.list_timeout,
            partial(answered, b),
        )
        return True

    def _list_answered(
        self,
        deliver: Callable[[T], None],
        outcome: Callable[[str, pb.Response | NoAnswer | ErrorStatus], T],
        b: _Bookie,
        response: pb.Response | CallFailed,
    ) -> None:
        """A list request's answer (from `_send_list`, `start_lists_raw`): the bookie's slot
        back, the observer told, and `outcome` of the answer to `deliver`."""
        b.in_flight -= 1
        b.slots.give()
        answered: pb.Response | NoAnswer | ErrorStatus
        if (
            type(response) is pb.Response
            and response.status == _EOK
            and response.getListOfEntriesOfLedgerResponse.status == _EOK
        ):
            # The common answer, told apart by two fields (`_answered` gives it the same
            # outcome after four more look-ups of the message).
            b.failures = 0
            answered = response
        else:
            answered = self._answered(b, response)
        self._observe(_LIST_OP, answered)
        deliver(outcome(b.bookie_id, answered))

    def start_lists_raw(self, batch: ListBatch, bookie_id: str, ledger_ids: Iterable[int]) -> None:
        """`start_list` for many ledgers of one bookie, the outcomes into `batch` (keyed
        `(bookie_id, ledger_id)`) instead of a future each; the outcome of an answer on
        this hot path is the availability's wire form (`Ok(bytes)`, not decoded: the
        replicas check decides the common case from the bytes, and `decode_listing` gives
        the decoded outcome otherwise); where a task asked, it is decoded.

        The replicas check asks every ensemble bookie of a batch of ledgers at once; a
        future a request (its callback, its wake-up, its `result`) and the per-request
        checks of `_send_list` cost as much as sending. Here the bookie's state is
        checked once, and each answer's callback writes its outcome into `batch`, whose
        one `wait` ends when the last is in. What cannot go out now (as in `_send_list`)
        is `get_list_of_entries` in a task, whose outcome goes into `batch` the same way.
        """
        b = self._bookies.get(bookie_id)
        conn = None if b is None else b.conn
        sendable = (
            b is not None
            and conn is not None
            and not self._closed
            and conn.is_open
            and b.list_cap is ListCapability.CAN_LIST
            and asyncio.get_running_loop().time() < b.list_cap_until
        )
        timeout = self.list_timeout
        answered = self._list_answered
        for ledger_id in ledger_ids:
            key = (bookie_id, ledger_id)
            batch.expect()
            if sendable and b is not None and conn is not None and b.slots.try_take():
                b.in_flight += 1
                txn_id = next(self._txn)
                conn.send_frame_then(
                    (txn_id, _LIST_OP),
                    list_request_frame(txn_id, ledger_id),
                    timeout,
                    partial(answered, partial(batch.deliver, key), _raw_listing, b),
                )
                continue
            sendable = False  # the cap is full: the rest wait their turn in tasks
            task = asyncio.ensure_future(self.get_list_of_entries(bookie_id, ledger_id))
            batch.track(key, task)

    # --- the request path ------------------------------------------------------------------

    def _bookie(self, bookie_id: str) -> _Bookie:
        b = self._bookies.get(bookie_id)
        if b is None:
            b = self._bookies[bookie_id] = _Bookie(bookie_id, self.max_in_flight)
        return b

    async def _exchange(
        self, bookie_id: str, request: pb.Request, request_timeout: float | None
    ) -> pb.Response | NoAnswer | ErrorStatus:
        """One request/response, reported to `observer` (metrics) when one is set."""
        out = await self._exchange_once(bookie_id, request, request_timeout)
        self._observe(request.header.operation, out)
        return out

    async def _exchange_once(
        self, bookie_id: str, request: pb.Request, request_timeout: float | None
    ) -> pb.Response | NoAnswer | ErrorStatus:
        """One request/response under the bookie's in-flight cap; never raises for I/O.

        `request` gets a fresh txnId just before it is sent (so a retried request
        object never reuses one).
        """
        if self._closed:
            return _CLOSED
        b = self._bookie(bookie_id)
        b.waiting += 1
        try:
            await b.slots.take()
        finally:
            b.waiting -= 1
        b.in_flight += 1
        try:
            if self._closed:
                return _CLOSED
            conn = await self._connection(b)
            if isinstance(conn, NoAnswer):
                return conn
            try:
                limit = self.request_timeout if request_timeout is None else request_timeout
                request.header.txnId = next(self._txn)
                return self._answered(b, await conn.call(request, limit))
            except CallFailed as exc:
                return self._answered(b, exc)
        finally:
            b.in_flight -= 1
            b.slots.give()

    def _answered(
        self, b: _Bookie, resp: pb.Response | CallFailed
    ) -> pb.Response | NoAnswer | ErrorStatus:
        """What a request came to: the response, its error status, or why there was none."""
        if isinstance(resp, CallFailed):
            if resp.reason is Unanswered.TLS_FAILED:
                self._back_off(b, NoAnswer(resp.reason, resp.detail))
            return NoAnswer(resp.reason, resp.detail)
        b.failures = 0
        if is_auth_refusal(resp):
            return NoAnswer(Unanswered.UNAUTHORIZED, self._refusal(b.bookie_id))
        status = effective_status(resp)
        return resp if status is Status.EOK else ErrorStatus(status)

    def _observe(self, operation: int, out: pb.Response | NoAnswer | ErrorStatus) -> None:
        """Reports one request's outcome to `observer` (metrics), if one is set."""
        if self.observer is None:
            return
        op = _OPERATION_NAMES.get(operation)
        if op is None:
            op = _OPERATION_NAMES[operation] = pb.OperationType.Name(operation).lower()  # type: ignore[arg-type]
        if isinstance(out, NoAnswer):
            status = out.reason.value.replace(" ", "_")
        elif isinstance(out, ErrorStatus):
            status = out.status.name.lower()
        else:
            status = "ok"
        self.observer(op, status)

    def _refusal(self, bookie_id: str) -> str:
        if self.tls is None:
            return (
                f"{bookie_id} refused the request as unauthenticated (EUA): it requires TLS "
                f"(or another authentication); set bookkeeper.tlsProviderFactoryClass="
                f"{TLS_CONTEXT_FACTORY} and bookkeeper.tlsTrustStore"
            )
        return (
            f"{bookie_id} refused the request as unauthenticated (EUA) even over TLS: it does "
            "not accept our client certificate (tlsClientAuthentication, tlsCertificatePath, "
            "tlsKeyStore)"
        )

    def _back_off(self, b: _Bookie, failure: NoAnswer) -> None:
        """No new connection to `b` for a while: each would fail the same way."""
        b.failures += 1
        b.last_failure = failure
        b.retry_at = asyncio.get_running_loop().time() + self.backoff.draw(b.failures)

    async def _connection(self, b: _Bookie) -> BookieConnection | NoAnswer:
        if b.conn is not None and b.conn.is_open:
            return b.conn
        task = b.connecting
        if task is None:
            loop = asyncio.get_running_loop()
            wait = b.retry_at - loop.time()
            if wait > 0 and b.last_failure is not None:
                last = b.last_failure
                return NoAnswer(last.reason, f"{last.detail} (next attempt in {wait:.2f}s)")
            task = b.connecting = asyncio.create_task(
                self._connect(b), name=f"bookie-connect {b.bookie_id}"
            )
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._closed and task.cancelled() and (current is None or not current.cancelling()):
                return _CLOSED
            raise

    async def _connect(self, b: _Bookie) -> BookieConnection | NoAnswer:
        try:
            failure: NoAnswer
            try:
                async with asyncio.timeout(self.connect_timeout):
                    address = await self._resolver(b.bookie_id)
            except TimeoutError:
                address = None
                failure = NoAnswer(
                    Unanswered.NOT_RESOLVED,
                    f"resolving {b.bookie_id} took longer than {self.connect_timeout:g}s",
                )
            except Exception as exc:  # whatever the resolver raises: no address
                address = None
                failure = NoAnswer(
                    Unanswered.NOT_RESOLVED, f"resolving {b.bookie_id} failed: {exc!r}"
                )
            else:
                failure = NoAnswer(Unanswered.NOT_RESOLVED, f"no address known for {b.bookie_id}")
            if address is not None:
                host, port = address
                try:
                    conn = await BookieConnection.open(
                        b.bookie_id,
                        host,
                        port,
                        connect_timeout=self.connect_timeout,
                        max_frame_size=self.max_frame_size,
                        tls=self.tls,
                        txn_id=next(self._txn),
                    )
                except CallFailed as exc:  # the TLS upgrade
                    failure = NoAnswer(exc.reason, exc.detail)
                except TimeoutError:
                    failure = NoAnswer(
                        Unanswered.UNREACHABLE,
                        f"connecting to {b.bookie_id} at {host}:{port} took longer than "
                        f"{self.connect_timeout:g}s",
                    )
                except OSError as exc:
                    failure = NoAnswer(
                        Unanswered.UNREACHABLE,
                        f"cannot connect to {b.bookie_id} at {host}:{port}: {exc.strerror or exc}",
                    )
                else:
                    if self._closed:
                        conn.close()
                        return _CLOSED
                    b.replace_connection(conn)
                    b.connections_opened += 1
                    if self.tls is None:
                        # Over TLS the first answer proves the session (a bookie that
                        # wants a client certificate closes it after the handshake).
                        b.failures = 0
                    b.retry_at = 0.0
                    b.last_failure = None
                    return conn
            self._back_off(b, failure)
            return failure
        finally:
            b.connecting = None

    # --- shutdown --------------------------------------------------------------------------

    async def close(self) -> None:
        """Fails everything pending or queued at once and closes every connection."""
        self._closed = True
        tasks: list[asyncio.Task[BookieConnection | NoAnswer]] = []
        conns: list[BookieConnection] = []
        for b in self._bookies.values():
            if b.connecting is not None:
                b.connecting.cancel()
                tasks.append(b.connecting)
            if b.conn is not None:
                b.conn.close(Unanswered.CLOSED, "bookie client closed")
                conns.append(b.conn)
                b.replace_connection(None)
            for _ in range(b.waiting):
                b.slots.give()
            if b.probe is not None:
                b.probe.set()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for conn in conns:
            await conn.wait_closed()


def _read_body(bookie_id: str, resp: pb.Response | NoAnswer | ErrorStatus) -> Outcome[bytes]:
    """A plain read's outcome: the entry's body as stored, or why there is none."""
    if isinstance(resp, NoAnswer | ErrorStatus):
        return resp
    r = resp.readResponse
    if not resp.HasField("readResponse") or not r.HasField("body"):
        return _bad(bookie_id, "EOK read response without an entry body")
    return Ok(r.body)


def _added(bookie_id: str, resp: pb.Response | NoAnswer | ErrorStatus) -> Outcome[int]:
    """An add's outcome: the entry id the bookie acknowledged, or why there is none."""
    if isinstance(resp, NoAnswer | ErrorStatus):
        return resp
    if not resp.HasField("addResponse"):
        return _bad(bookie_id, "EOK add response without its body")
    return Ok(resp.addResponse.entryId)


def _set_if_pending(out: asyncio.Future[T], value: T) -> None:
    """`value` into `out`, unless its caller gave up on it (cancelled it)."""
    if not out.done():
        out.set_result(value)


def _listing(
    ledger_id: int, bookie_id: str, resp: pb.Response | NoAnswer | ErrorStatus
) -> ListOutcome:
    """A list request's outcome: the decoded availability, or why there is none."""
    raw = _raw_listing(bookie_id, resp)
    return decode_listing(bookie_id, ledger_id, raw.value) if isinstance(raw, Ok) else raw


def _raw_listing(bookie_id: str, resp: pb.Response | NoAnswer | ErrorStatus) -> RawListOutcome:
    """A list request's outcome with the availability's wire form, not decoded yet."""
    if isinstance(resp, NoAnswer | ErrorStatus):
        return resp
    r = resp.getListOfEntriesOfLedgerResponse
    if not resp.HasField("getListOfEntriesOfLedgerResponse") or not r.HasField(
        "availabilityOfEntriesOfLedger"
    ):
        return _bad(bookie_id, "EOK list response without an availability")
    return Ok(r.availabilityOfEntriesOfLedger)


def decode_listing(bookie_id: str, ledger_id: int, data: bytes) -> Ok[Availability] | NoAnswer:
    """An availability's wire form, as a list request's outcome: decoded, or a protocol
    error naming why not (what `get_list_of_entries` returns for the same answer)."""
    try:
        return Ok(Availability.decode(data))
    except (FormatError, ValueError) as exc:
        return _bad(bookie_id, f"undecodable availability for ledger {ledger_id}: {exc}")


def _bad(bookie_id: str, detail: str) -> NoAnswer:
    return NoAnswer(Unanswered.PROTOCOL_ERROR, f"{bookie_id}: {detail}")
