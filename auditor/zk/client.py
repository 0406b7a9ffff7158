"""kazoo's calls finish on kazoo's own threads and can wait until a session expires, while
everything above runs on one asyncio loop and needs a deadline on every call; this facade is
the one place that crosses over, and the one that turns kazoo's errors into the port's.

An asyncio facade over one kazoo client. kazoo has no asyncio handler, so we keep its
threading handler and bridge at the edges: every `*_async` call's result is handed
to the event loop with `call_soon_threadsafe`, and every call is wrapped in a timeout because kazoo
queues requests while the connection is SUSPENDED (a call made then can block
until the session expires). One kazoo connection carries all calls, so many
reads can be in flight without holding a thread each.

This is the ZooKeeper adapter of the metadata-store port (`auditor.store`): the
kazoo exceptions callers branch on (no node, node exists, bad version, not empty)
are raised as the port's (`auditor.store.errors`), session states as its
`SessionState`; connection-level failures become `ZkUnavailableError` and a missed
deadline `ZkTimeoutError` (the port's `StoreUnavailableError` and
`StoreTimeoutError`), operator errors with a readable message. Refusals (a server that requires
authentication, rejected credentials, a node whose ACL does not admit us)
become `ZkAuthError`, which says how credentials are given.

Many reads at once (`get_many`, the walk's hot path) go as ZooKeeper 3.6+
`multiRead` requests (`multiread.py`): one request, one reply and one hop to
the event loop for a whole batch. A server older than 3.6 answers the first
one UNIMPLEMENTED and closes the connection (kazoo reconnects, the session
lives on); the client then remembers that and reads each batch as pipelined
`getData`s settled together, still with one hop to the loop per batch.

Credentials and the ACL of created znodes come from one `ZkSecurity`; the ACL
is kazoo's `default_acl`, so every create (plain, with parents, in a multi-op,
and inside kazoo's Lock recipe that casts election votes) gets it without the
callers knowing.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import socket
import ssl
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Self, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    AuthFailedError,
    ConnectionClosedError,
    ConnectionDropped,
    ConnectionLoss,
    NoAuthError,
    OperationTimeoutError,
    RolledBackError,
    SASLException,
    SessionClosedRequireSaslError,
    SessionExpiredError,
    UnimplementedError,
    ZookeeperError,
)
from kazoo.exceptions import (
    BadVersionError as KazooBadVersion,
)
from kazoo.exceptions import (
    NodeExistsError as KazooNodeExists,
)
from kazoo.exceptions import (
    NoNodeError as KazooNoNode,
)
from kazoo.exceptions import (
    NotEmptyError as KazooNotEmpty,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import Connect
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry

from auditor.store import (
    BadVersionError,
    Event,
    FencedOutError,
    Gap,
    NodeChangedError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RangeItem,
    SessionState,
    StoreAuthError,
    StoreError,
    StoreKind,
    StoreResponseError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from auditor.zk.multiread import (
    GET_CHILDREN,
    GET_DATA,
    MalformedMultiReadError,
    MultiRead,
    batches,
    chrooted,
    submit,
)
from auditor.zk.persistent import PersistentWatches
from auditor.zk.security import ZkSecurity
from auditor.zk.tls import TlsFailure, TlsHandler

ZkStat = ZnodeStat
ZkError = ZookeeperError


_CONNECTION_ERRORS = (
    ConnectionLoss,
    ConnectionClosedError,
    SessionExpiredError,
    OperationTimeoutError,
    KazooTimeoutError,
)
_AUTH_ERRORS = (SessionClosedRequireSaslError, AuthFailedError, NoAuthError)


#: kazoo's refusals of one operation, and the port's errors they are raised as.
_STORE_ERRORS: dict[type[BaseException], type[StoreError]] = {
    KazooNoNode: NoNodeError,
    KazooNodeExists: NodeExistsError,
    KazooBadVersion: BadVersionError,
    KazooNotEmpty: NotEmptyError,
}


_STORE_ERROR_TYPES = tuple(_STORE_ERRORS)


def _store_error(exc: BaseException, path: str) -> BaseException:
    """`exc` as the port raises it: kazoo's refusal of one operation becomes the port's."""
    kind = _STORE_ERRORS.get(type(exc))
    if kind is None:
        return exc
    error = kind(path)
    error.__cause__ = exc
    return error


class ZkUnavailableError(StoreUnavailableError):
    """ZooKeeper could not be reached, or the session is gone."""


class ZkTimeoutError(ZkUnavailableError, StoreTimeoutError):
    """A ZooKeeper call did not complete within its deadline."""


class ZkAuthError(StoreAuthError):
    """ZooKeeper refused this session: it needs authentication, rejected the credentials,
    or a node's ACL does not admit our identity.

    Not a `ZkUnavailableError`: waiting does not help, the configuration must
    change, hence the exit code of a configuration error.
    """


class ZkTlsError(ZkUnavailableError):
    """No TLS connection to ZooKeeper could be made: the handshake failed (an untrusted
    certificate, a refused client certificate, no TLS on that port)."""


class ZkResponseError(ZkUnavailableError, StoreResponseError):
    """ZooKeeper answered with a reply that does not parse (a batch of reads fails, the
    connection goes on)."""


class _MultiReadSupport:
    """Whether the server takes `multiRead`: None until the first one is answered.

    Shared by a client and its fenced views. While unknown, one batch at a time
    goes as multiRead, so that an old server's refusal (which also closes the
    connection) fails no other batch of ours.
    """

    def __init__(self, supported: bool | None) -> None:
        self.supported = supported
        self.probe = asyncio.Lock()


_T = TypeVar("_T")


def _end_session_on_sasl_refusal(kazoo: KazooClient) -> None:
    """Makes a refused SASL exchange end the session as AUTH_FAILED.

    kazoo 2.11 handles only AuthFailedError there; a server that answers a bad
    password with "session closed, SASL required" (or a pure-sasl library
    error) kills kazoo's connection thread, leaving a session that is neither
    connected nor lost (python-zk/kazoo#594, fixed after 2.11). As
    AuthFailedError kazoo stops cleanly and our calls say the credentials were
    rejected. kazoo is pinned, so wrapping this one private method is safe.
    """
    connection = kazoo._connection
    authenticate = connection._authenticate_with_sasl

    def refusal_ends_session(host: str, timeout: float) -> None:
        try:
            authenticate(host, timeout)
        except (SessionClosedRequireSaslError, SASLException) as exc:
            raise AuthFailedError(f"SASL authentication refused: {type(exc).__name__}") from exc

    connection._authenticate_with_sasl = refusal_ends_session


#: The share of the session timeout a reconnect waits for the server's answer to its
#: handshake before it gives up on that connection and tries again.
HANDSHAKE_SHARE = 1 / 3
#: How often a handshake waiting for its answer looks whether the client is stopping.
HANDSHAKE_POLL = 0.05


class _Handshake:
    """What the connection thread saw of its handshakes, for the error a failed start gives."""

    def __init__(self) -> None:
        #: A server took the connection and left a handshake read unanswered.
        self.unanswered = False
        #: TLS failures, of the handshake or (TLS 1.3: a refused client certificate)
        #: of the first read after it.
        self.tls = TlsFailure()


def _bound_handshake(kazoo: KazooClient, limit: float, seen: _Handshake) -> None:
    """Makes a reconnect give up on an unanswered handshake after `limit` seconds, and
    any handshake give up at once when the client is stopped.

    kazoo waits for the answer to its connect request for the whole session
    timeout (divided by the number of hosts), as the Java client does. A
    ZooKeeper server that is still starting can take such a connection and
    leave the request unanswered (seen with 3.8 restarted under a test: one
    reconnect in a few dozen); a client on a single host then sits it out
    until its session has expired on the server, which came back in a
    second. Bounded, the attempt fails, kazoo's retry opens a new connection,
    and the session is resumed with time to spare.

    And stopping a client whose handshake (connect, then each credential) is
    unanswered waited for that read to time out: a server that accepts TCP and
    never answers kept a command with `--timeout 3` for 10 s. While
    handshaking, a read first waits for data in short slices and gives up as
    soon as the client is stopped, so a stop (and so a failed start) takes no
    longer than a slice. kazoo is pinned, so wrapping these two private methods
    is safe (as for SASL refusals above).
    """
    connection = kazoo._connection
    invoke = connection._invoke
    read = connection._read
    handshaking = threading.local()

    def bounded(timeout: float, request: Any, xid: int | None = None) -> Any:
        if isinstance(request, Connect):
            timeout = min(timeout, limit)
        handshaking.active = True
        try:
            return invoke(timeout, request, xid)
        finally:
            handshaking.active = False

    def interruptible(length: int, timeout: float) -> Any:
        if getattr(handshaking, "active", False):
            _await_answer(kazoo, timeout, seen)
        try:
            return read(length, timeout)
        except ConnectionDropped as exc:
            if isinstance(exc.__context__, ssl.SSLError):
                seen.tls.record(seen.tls.address or kazoo.hosts[0][0], exc.__context__)
            raise

    connection._invoke = bounded
    connection._read = interruptible


def _await_answer(kazoo: KazooClient, timeout: float, seen: _Handshake) -> None:
    """Returns once the connection's socket has data to read; raises kazoo's timeout when
    `timeout` passes first, ConnectionDropped when the client is stopped meanwhile."""
    connection = kazoo._connection
    sock = connection._socket
    deadline = time.monotonic() + timeout
    while True:
        if kazoo._stopped.is_set():
            seen.unanswered = True
            raise ConnectionDropped("client stopped while waiting for the server's answer")
        if getattr(sock, "pending", None) is not None and sock.pending() > 0:
            return  # TLS: already decrypted, a select would not see it
        left = deadline - time.monotonic()
        if left <= 0:
            seen.unanswered = True
            raise connection.handler.timeout_exception("socket time-out during read")
        if connection.handler.select([sock], [], [], min(left, HANDSHAKE_POLL))[0]:
            return


class ZkClient:
    """One ZooKeeper session, used from asyncio.

    `hosts` is a kazoo connect string (`h1:2181,h2:2181/chroot`). `timeout` bounds
    every call and the initial connect; `session_timeout` is what we ask the
    server for. `security` holds the credentials sent on every (re)connect and
    the ACL every znode this session creates gets (default: none, open ACLs).
    `multi_read` says whether `get_many` uses multiRead: None finds out from the
    server, False never does (servers older than 3.6; tests of the fallback).
    """

    def __init__(
        self,
        hosts: str,
        *,
        timeout: float = 10.0,
        session_timeout: float = 30.0,
        read_only: bool = False,
        client_id: tuple[int, bytes] | None = None,
        security: ZkSecurity | None = None,
        multi_read: bool | None = None,
    ) -> None:
        self.hosts = hosts
        self._multi_read = _MultiReadSupport(multi_read)
        self.timeout = timeout
        self.security = security or ZkSecurity()
        self._handshake = _Handshake()
        tls = self.security.tls
        limit = session_timeout * HANDSHAKE_SHARE
        handler = None if tls is None else TlsHandler(tls, self._handshake.tls, limit)
        # Fail fast while connecting (as Patroni does) instead of retrying forever
        # inside kazoo: our own deadlines decide how long to wait.
        self._kazoo = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.2, max_delay=2.0),
            read_only=read_only,
            client_id=client_id,
            auth_data=self.security.auth_data,
            sasl_options=self.security.sasl_options(),
            default_acl=self.security.default_acl,
            # kazoo's own TLS trusts the system's CAs besides ours and reads only PEM
            # files; the handler builds our context (auditor.zk.tls).
            use_ssl=tls is not None,
            handler=handler,
        )
        if handler is not None:
            handler.stopping = self._kazoo._stopped.is_set
        _bound_handshake(self._kazoo, limit, self._handshake)
        if self.security.credentials.sasl is not None:
            _end_session_on_sasl_refusal(self._kazoo)
        self._listeners: list[asyncio.Queue[SessionState]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        try:
            self._creation_loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._creation_loop = None
        self._kazoo.add_listener(self._on_state)
        #: (path, version) every write of this view must find unchanged.
        self._fence: tuple[str, int] | None = None
        #: (path, version) pairs the writes of this view also need unchanged (`guarded`).
        self._guards: tuple[tuple[str, int], ...] = ()
        self._persistent: PersistentWatches | None = None

    def fenced(self, path: str, version: int) -> Self:
        """A view of this session whose writes only happen while `path` is at `version`.

        Reads are unaffected. Creates with makepath create missing parents
        unfenced first (empty persistent parents are harmless), then the node
        itself fenced.
        """
        view = copy.copy(self)
        view._fence = (path, version)
        return view

    def guarded(self, path: str, version: int) -> Self:
        """A view whose writes also need `path` at `version` (NodeChangedError otherwise),
        checked in the same multi as the write and any fence."""
        view = copy.copy(self)
        view._guards = (*self._guards, (path, version))
        return view

    # --- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Connects within `timeout`, everything included: a server that takes the TCP
        connection and never answers fails it as one that refuses it does."""
        self._loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.timeout
        try:
            if not await asyncio.to_thread(self._open, self.timeout):
                raise KazooTimeoutError("Connection time-out")
            if self._kazoo.chroot:
                # As kazoo's own start does (but within the deadline): with a chroot
                # a refusal of our credentials surfaces here, not at the first call.
                left = max(deadline - time.monotonic(), 0.001)
                await self._settled(lambda: self._kazoo.exists_async("/"), left)
        except _AUTH_ERRORS as exc:
            await asyncio.to_thread(self._stop_quietly)
            raise self._auth_error(exc, "connect", "/") from exc
        except (TimeoutError, KazooTimeoutError, *_CONNECTION_ERRORS) as exc:
            await asyncio.to_thread(self._stop_quietly)
            within = f"cannot connect to ZooKeeper at {self.hosts} within {self.timeout:g}s"
            tls = self._handshake.tls
            if tls.message:
                raise ZkTlsError(
                    f"TLS handshake with ZooKeeper at {tls.address} failed: {tls.message}"
                ) from exc
            if self._handshake.unanswered or tls.unanswered:
                raise ZkTimeoutError(
                    f"{within}: a server took the connection and did not answer"
                ) from exc
            raise ZkUnavailableError(within) from exc

    def _open(self, timeout: float) -> bool:
        """kazoo's start without its unbounded chroot read: whether it connected in time."""
        self._kazoo.start_async().wait(timeout)
        return bool(self._kazoo.connected)

    def _auth_error(self, exc: BaseException, what: str, path: str) -> ZkAuthError:
        creds = self.security.credentials
        if isinstance(exc, SessionClosedRequireSaslError):
            # The server decides before looking at the request: naming it would mislead.
            lacking = "" if not creds else f" (it did not accept {creds.describe()})"
            return ZkAuthError(
                f"ZooKeeper at {self.hosts} requires authentication and closed this "
                f"session{lacking}: {self.security.hint}"
            )
        if isinstance(exc, AuthFailedError):
            return ZkAuthError(
                f"ZooKeeper at {self.hosts} rejected this session's credentials "
                f"({creds.describe()})"
            )
        who = f"as {creds.describe()}" if creds else f"unauthenticated; {self.security.hint}"
        return ZkAuthError(
            f"ZooKeeper denied {what} {path}: its ACL does not admit this session ({who})"
        )

    async def close(self) -> None:
        """Ends the session within `timeout` (plus a moment): when the server does not
        answer the close, the connection is dropped instead of waited out (kazoo would
        wait for its ping to go unanswered, 20 s with a 30 s session)."""
        stopping = asyncio.ensure_future(asyncio.to_thread(self._stop_quietly))
        try:
            await asyncio.wait_for(asyncio.shield(stopping), self.timeout)
        except TimeoutError:
            self._drop_connection()
            await stopping

    def _drop_connection(self) -> None:
        """Shuts the connection's socket: kazoo's thread wakes, sees EOF, and (stopped) ends."""
        sock = self._kazoo._connection._socket
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _stop_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self._kazoo.stop()
        with contextlib.suppress(Exception):
            self._kazoo.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def kazoo(self) -> KazooClient:
        """The raw client, for kazoo recipes (Election) that have no async form."""
        return self._kazoo

    @property
    def kind(self) -> StoreKind:
        return StoreKind.ZOOKEEPER

    @property
    def where(self) -> str:
        return f"ZooKeeper at {self.hosts}"

    @property
    def session(self) -> int | None:
        """Our session id, as the `ephemeralOwner` of the nodes it creates shows it."""
        cid = self._kazoo.client_id
        return None if cid is None else int(cid[0])

    @property
    def ranged(self) -> bool:
        """ZooKeeper has no range reads: the walk goes by children and `get_many`."""
        return False

    async def read_range(self, start: str, end: str, *, limit: int) -> tuple[list[RangeItem], bool]:
        raise NotImplementedError("ZooKeeper has no range reads (see `ranged`)")

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        cid = self._kazoo.client_id
        return None if cid is None else (int(cid[0]), bytes(cid[1]))

    @property
    def multi_read(self) -> bool | None:
        """Whether `get_many` sends multiRead (None: not known until the first batch)."""
        return self._multi_read.supported

    @multi_read.setter
    def multi_read(self, value: bool | None) -> None:
        self._multi_read.supported = value

    @property
    def state(self) -> str:
        return str(self._kazoo.state)

    @property
    def connected(self) -> bool:
        return bool(self._kazoo.connected)

    # --- connection state as an async stream ---------------------------------

    def _on_state(self, state: KazooState) -> None:
        # Runs on kazoo's thread and must not block.
        loop = self._loop or self._creation_loop
        if loop is None or loop.is_closed():
            return
        ours = SessionState(str(state))
        for q in list(self._listeners):
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(q.put_nowait, ours)

    def states(self) -> AsyncGenerator[SessionState, None]:
        """Every connection-state change (CONNECTED, SUSPENDED, LOST) from this call on.

        The subscription starts here, not at the first `anext`, so no change
        between this call and the first read is missed.
        """
        q: asyncio.Queue[SessionState] = asyncio.Queue()
        self._listeners.append(q)

        async def stream() -> AsyncGenerator[SessionState, None]:
            try:
                while True:
                    yield await q.get()
            finally:
                with contextlib.suppress(ValueError):
                    self._listeners.remove(q)

        return stream()

    # --- the bridge ------------------------------------------------------------

    async def _call(self, what: str, path: str, start: Callable[[], Any]) -> Any:
        return await self._mapped(what, path, self._settled(start, self.timeout))

    async def _mapped(self, what: str, path: str, pending: Awaitable[_T]) -> _T:
        """`pending`'s outcome, kazoo's failures raised as our errors (as `_call` does)."""
        try:
            return await pending
        except TimeoutError as exc:
            raise ZkTimeoutError(
                f"ZooKeeper {what} {path} did not complete within {self.timeout:g}s"
            ) from exc
        except _AUTH_ERRORS as exc:
            raise self._auth_error(exc, what, path) from exc
        except _CONNECTION_ERRORS as exc:
            raise ZkUnavailableError(
                f"ZooKeeper {what} {path} failed: {type(exc).__name__}"
            ) from exc
        except _STORE_ERROR_TYPES as exc:
            raise _store_error(exc, path) from exc

    async def _settled(self, start: Callable[[], Any], limit: float) -> Any:
        """The outcome of one kazoo async call, as kazoo raises it; TimeoutError after
        `limit` seconds."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def settle(ar: Any) -> None:
            if fut.cancelled():
                return
            try:
                fut.set_result(ar.get_nowait())
            except BaseException as exc:  # handed to the awaiting task
                fut.set_exception(exc)

        def on_done(ar: Any) -> None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(settle, ar)

        start().rawlink(on_done)
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
        # cancellation that arrives as the call completes, and a cancelled
        # task (a deposed leader's) would then run on.
        async with asyncio.timeout(limit):
            return await fut

    async def _settled_all(self, results: Sequence[Any], limit: float) -> list[Any]:
        """The outcomes of several kazoo async results (each its value or its exception),
        handed to the loop together, when the last completes: one countdown on kazoo's
        side and one future here, however many there are. TimeoutError after `limit`."""
        if not results:
            return []
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[Any]] = loop.create_future()
        outcomes: list[Any] = [None] * len(results)
        left = [len(results)]
        lock = threading.Lock()

        def settle() -> None:
            if not fut.cancelled():
                fut.set_result(outcomes)

        def on_done(i: int, ar: Any) -> None:
            try:
                outcomes[i] = ar.get_nowait()
            except BaseException as exc:  # handed to the awaiting task
                outcomes[i] = exc
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                with contextlib.suppress(RuntimeError):  # loop already closed
                    loop.call_soon_threadsafe(settle)

        for i, ar in enumerate(results):
            ar.rawlink(partial(on_done, i))
        async with asyncio.timeout(limit):
            return await fut

    def _raise_outcome(self, outcome: BaseException, what: str, path: str) -> None:
        """A failed op of a multi, raised as a lone call of it would have been."""
        if isinstance(outcome, _AUTH_ERRORS):
            raise self._auth_error(outcome, what, path) from outcome
        raise _store_error(outcome, path)

    async def get(self, path: str) -> tuple[bytes, ZnodeStat]:
        data, stat = await self._call("get", path, lambda: self._kazoo.get_async(path))
        return bytes(data or b""), stat

    async def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, ZnodeStat] | None]:
        """Many nodes' data and stats, in the order of `paths`; None for a node that does
        not exist. Any other failure of any read fails the whole batch, raised as `get`
        raises it (ZkAuthError naming the path a node's ACL refused). One multiRead (more
        beyond `multiread.MAX_OPS`), one future and one `timeout` for the batch, everything
        included (waiting for the first batch to find out whether the server takes
        multiRead, and an old server's refusal followed by the batch read the old way)."""
        return await self._many(GET_DATA, "get", paths)

    async def get_children_many(self, paths: Sequence[str]) -> list[list[str] | None]:
        """Many nodes' children, in the order of `paths`; None for a node that does not
        exist. As `get_many`: getChildren ops in one multiRead, one future, one timeout."""
        return await self._many(GET_CHILDREN, "get_children", paths)

    async def _many(self, op: int, what: str, paths: Sequence[str]) -> list[Any]:
        if not paths:
            return []
        where = paths[0] if len(paths) == 1 else f"{paths[0]} (and {len(paths) - 1} more)"

        async def within() -> list[Any]:
            async with asyncio.timeout(self.timeout):
                return await self._read_many(op, what, paths)

        return await self._mapped(what, where, within())

    async def _read_many(self, op: int, what: str, paths: Sequence[str]) -> list[Any]:
        support = self._multi_read
        if support.supported is None:
            async with support.probe:
                if support.supported is None:
                    return await self._read_many_probing(op, what, paths)
        if support.supported is False:
            return await self._read_pipelined(op, what, paths)
        try:
            return await self._read_multi(op, what, paths)
        except UnimplementedError:
            # A server that took multiRead before: another (older) one of the ensemble.
            support.supported = False
            return await self._read_after_refusal(op, what, paths)

    async def _read_many_probing(self, op: int, what: str, paths: Sequence[str]) -> list[Any]:
        support = self._multi_read
        try:
            found = await self._read_multi(op, what, paths)
        except UnimplementedError:
            support.supported = False
            return await self._read_after_refusal(op, what, paths)
        support.supported = True
        return found

    async def _read_after_refusal(self, op: int, what: str, paths: Sequence[str]) -> list[Any]:
        """The batch an old server refused, read again the old way. That server also
        closes the connection after its refusal; reads that went out on it before kazoo
        saw the close fail with ConnectionLoss, so they are sent once more."""
        try:
            return await self._read_pipelined(op, what, paths)
        except ConnectionLoss:
            return await self._read_pipelined(op, what, paths)

    async def _read_multi(self, op: int, what: str, paths: Sequence[str]) -> list[Any]:
        chroot = self._kazoo.chroot
        ops = [(op, chrooted(chroot, p)) for p in paths]
        pending = [submit(self._kazoo, MultiRead(batch)) for batch in batches(ops)]
        replies = await self._settled_all(pending, self.timeout)
        wanted = tuple if op == GET_DATA else list
        found: list[Any] = []
        for reply in replies:
            if isinstance(reply, MalformedMultiReadError):
                raise ZkResponseError(
                    f"ZooKeeper answered a multiRead of {len(paths)} reads badly: {reply}"
                ) from reply
            if isinstance(reply, BaseException):
                raise reply
            for result in reply:
                i = len(found)
                if isinstance(result, wanted):
                    found.append(result)
                elif isinstance(result, KazooNoNode):
                    found.append(None)
                elif isinstance(result, BaseException):
                    self._raise_outcome(result, what, paths[i])
                else:  # another op's result: deserialize checks types, never here
                    raise ZkResponseError(f"ZooKeeper answered {what} {paths[i]} with {result!r}")
        return found

    async def _read_pipelined(self, op: int, what: str, paths: Sequence[str]) -> list[Any]:
        """The reads as single requests, all sent at once, settled together."""
        start = self._kazoo.get_async if op == GET_DATA else self._kazoo.get_children_async
        outcomes = await self._settled_all([start(p) for p in paths], self.timeout)
        found: list[Any] = []
        for path, outcome in zip(paths, outcomes, strict=True):
            if isinstance(outcome, KazooNoNode):
                found.append(None)
            elif isinstance(outcome, BaseException):
                self._raise_outcome(outcome, what, path)
            elif op == GET_DATA:
                data, stat = outcome
                found.append((bytes(data or b""), stat))
            else:
                found.append(list(outcome))
        return found

    async def get_children(self, path: str) -> list[str]:
        return list(
            await self._call("get_children", path, lambda: self._kazoo.get_children_async(path))
        )

    async def get_children_watched(self, path: str) -> tuple[list[str], asyncio.Event]:
        """Children plus an event set once when they (or the node) next change.

        A one-shot ZooKeeper watch, surfaced as an asyncio.Event so a watcher
        loop can await the change instead of polling.
        """
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def on_watch(_event: Any) -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(changed.set)

        children = await self._call(
            "get_children", path, lambda: self._kazoo.get_children_async(path, watch=on_watch)
        )
        return list(children), changed

    def _watch_event(self) -> tuple[asyncio.Event, Callable[[Any], None]]:
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def on_watch(_event: Any) -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(changed.set)

        return changed, on_watch

    async def exists_watched(self, path: str) -> tuple[ZnodeStat | None, asyncio.Event]:
        """Whether a node exists, plus an event set when it is created, changed or deleted."""
        changed, on_watch = self._watch_event()
        stat = await self._call(
            "exists", path, lambda: self._kazoo.exists_async(path, watch=on_watch)
        )
        return stat, changed

    async def get_watched(self, path: str) -> tuple[bytes, ZnodeStat, asyncio.Event]:
        """A node's data, plus an event set when it next changes or goes away."""
        changed, on_watch = self._watch_event()
        data, stat = await self._call(
            "get", path, lambda: self._kazoo.get_async(path, watch=on_watch)
        )
        return bytes(data or b""), stat, changed

    async def watch_tree(self, path: str) -> asyncio.Queue[Event | Gap]:
        """A persistent recursive watch on `path`: every create, data change and delete
        at or below it, in server order, as a queue; `Gap` when the watch is lost
        (connection or session loss; re-add it and re-read, events were missed)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event | Gap] = asyncio.Queue()

        def listener(item: Event | Gap) -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, item)

        if self._persistent is None:
            self._persistent = PersistentWatches(self._kazoo)
        pw = self._persistent
        await self._call("addWatch", path, lambda: pw.add_async(path, listener))
        return queue

    async def unwatch_tree(self, path: str) -> None:
        if self._persistent is not None:
            pw = self._persistent
            await self._call("removeWatches", path, lambda: pw.remove_async(path))

    async def get_acls(self, path: str) -> tuple[list[Any], ZnodeStat]:
        """A node's ACL (kazoo `ACL`s: `perms`, `id.scheme`, `id.id`) and its stat."""
        acls, stat = await self._call("get_acls", path, lambda: self._kazoo.get_acls_async(path))
        return list(acls), stat

    async def exists(self, path: str) -> ZnodeStat | None:
        stat: ZnodeStat | None = await self._call(
            "exists", path, lambda: self._kazoo.exists_async(path)
        )
        return stat

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str:
        if self._fence is not None or self._guards:
            if makepath:
                parent = path.rsplit("/", 1)[0]
                if parent:
                    await self.ensure_path(parent)
            results = await self._fenced(
                "create",
                path,
                lambda tx: tx.create(path, data, ephemeral=ephemeral, sequence=sequence),
            )
            return str(results[0])
        created: str = await self._call(
            "create",
            path,
            lambda: self._kazoo.create_async(
                path, data, ephemeral=ephemeral, sequence=sequence, makepath=makepath
            ),
        )
        return created

    async def _fenced(self, what: str, path: str, op: Callable[[Any], None]) -> list[Any]:
        """One multi: the fence's check, the guards' checks, then the write; returns the
        results of the write on, as if it had been sent alone."""
        checks = ([] if self._fence is None else [self._fence]) + list(self._guards)

        def start() -> Any:
            tx = self._kazoo.transaction()
            for check_path, check_version in checks:
                tx.check(check_path, check_version)
            op(tx)
            return tx.commit_async()

        results: list[Any] = list(await self._call(f"fenced {what}", path, start))
        # In a failed multi the ops that did not fail report RolledBackError.
        for i, (check_path, _) in enumerate(checks):
            failed = results[i]
            if not isinstance(failed, BaseException) or isinstance(failed, RolledBackError):
                continue
            if self._fence is not None and i == 0:
                raise FencedOutError(
                    f"refused to {what} {path}: {check_path} is gone or changed (leadership lost)"
                )
            raise NodeChangedError(check_path)
        outcome = results[len(checks)]
        if isinstance(outcome, BaseException):
            self._raise_outcome(outcome, what, path)
        return results[len(checks) :]

    async def ensure_path(self, path: str) -> None:
        await self._call("ensure_path", path, lambda: self._kazoo.ensure_path_async(path))

    async def set(self, path: str, data: bytes, version: int = -1) -> ZnodeStat:
        if self._fence is not None or self._guards:
            await self._fenced("set", path, lambda tx: tx.set_data(path, data, version))
            stat_after = await self.exists(path)
            if stat_after is None:
                raise NoNodeError(path)
            return stat_after
        stat: ZnodeStat = await self._call(
            "set", path, lambda: self._kazoo.set_async(path, data, version)
        )
        return stat

    async def delete(self, path: str, version: int = -1) -> None:
        if self._fence is not None or self._guards:
            await self._fenced("delete", path, lambda tx: tx.delete(path, version))
            return
        await self._call("delete", path, lambda: self._kazoo.delete_async(path, version))

    async def sync(self, path: str) -> None:
        await self._call("sync", path, lambda: self._kazoo.sync_async(path))

    async def create_many(self, items: list[tuple[str, bytes]]) -> None:
        """Creates many persistent znodes in one multi-op (all or nothing).

        Used by the cluster writer to lay out large test clusters quickly; parents
        must exist or be earlier in `items`.
        """

        def start() -> Any:
            tx = self._kazoo.transaction()
            for path, data in items:
                tx.create(path, data)
            return tx.commit_async()

        results = await self._call("multi-create", items[0][0] if items else "", start)
        for (path, _), r in zip(items, results, strict=False):
            if isinstance(r, _AUTH_ERRORS):
                self._raise_outcome(r, "create", path)
        for (path, _), r in zip(items, results, strict=False):
            if isinstance(r, BaseException):
                raise _store_error(r, path)
