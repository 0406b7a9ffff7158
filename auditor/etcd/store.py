"""On etcd, Pulsar keeps the tree ZooKeeper would hold in flat keys, and what Pulsar writes
we must read and the other way round; the rest of the product needs that tree with
ZooKeeper's versions, children, ephemerals and sessions, as on ZooKeeper.

`EtcdStore`: the metadata-store port on etcd v3, keys laid out as Pulsar lays them out.

Why aetcd: it is the maintained asyncio etcd v3 client, built on grpc.aio with the same
grpcio and protobuf as the rest of the product (python-etcd3 is synchronous and
unmaintained). Its high-level `Client` takes one host, has no TLS, no count-only or
limited ranges and no nested transactions, so this adapter uses aetcd's generated
etcd v3 API (`aetcd.rpc`: the KV, Lease, Watch and Auth stubs and their messages) on
a grpc.aio channel of its own: one HTTP/2 connection carries every call and stream.

The tree, exactly as Pulsar's `EtcdMetadataStore` stores it (what Pulsar writes, we
read; what we write, Pulsar reads):
* a node is the key of its full path (UTF-8), its data the value; no key for parents.
  `prefix` (default "") goes before every key and is stripped from every key read: a
  ZooKeeper chroot's equivalent, which the tests use to keep apart;
* the version we show is etcd's per-key `version` - 1 (0 for a new key, as ZooKeeper);
  a create is a put if the key's create_revision is 0; a write or delete at a version
  compares etcd's version with version + 1;
* children are the first path segments of the keys under `path/` ("/" is its own
  prefix), so a "directory" that only has keys below it is a child too. ZooKeeper's
  callers expect such a parent to exist, so `exists`, `get` and `get_children` of a
  path without a key but with keys below answer as for an empty node at version 0
  (`DIRECTORY`), and deleting it is refused as not empty; `get_many` reads keys only;
* ephemeral nodes are put with our lease (TTL = `session_timeout` s, kept alive every
  TTL/3); `session` and `Stat.ephemeralOwner` are lease ids;
* a sequential create puts the parent's key with empty data, unconditionally (as Pulsar
  does: its data is lost) and names the node path + the parent key's previous etcd
  version (0 when it had none), without padding.

Semantics that differ from ZooKeeper, on purpose: a create never needs its parent
(`makepath` changes nothing); `sync` does nothing (etcd reads are linearizable); a
set of a path without a key is NoNodeError even where `exists` shows a directory.

Sessions: CONNECTED once a lease is granted; SUSPENDED when a keep-alive or a call
fails for connection reasons (the lease may still be alive); LOST when etcd says the
lease is gone (a keep-alive answers TTL 0) or no keep-alive succeeded for TTL seconds,
after which a new lease is granted (the old one revoked as soon as etcd answers, so
its ephemeral keys surely go) and CONNECTED follows, with a new `session`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

import grpc
from aetcd import rpc

from auditor.store import (
    BadVersionError,
    Event,
    EventType,
    FencedOutError,
    Gap,
    NodeChangedError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RangeItem,
    SessionState,
    StoreAuthError,
    StoreKind,
    StoreTimeoutError,
    StoreUnavailableError,
)

#: etcd 3.4's default `--max-txn-ops`: the most compares, or success or failure ops, of one txn.
MAX_TXN_OPS = 128
#: How often a session that is not CONNECTED tries again (keep-alive, a new lease).
RETRY_INTERVAL = 0.25
#: gRPC's reconnect backoff is 1 s growing to 120 s by default: a restarted etcd would
#: be seen late. Bounded here (not `min_reconnect_backoff_ms`: it is also the shortest
#: time a connection attempt gets, 20 s by default; our deadlines bound it anyway); and
#: replies as large as etcd sends (a big directory).
_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", -1),
)
_CONNECTION_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN}
)

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class EtcdStat:
    """A key's metadata as the port's `Stat`: `version` is etcd's version - 1;
    `ephemeralOwner` the key's lease (0: persistent); no times, no child count."""

    version: int
    ctime: int = 0
    mtime: int = 0
    ephemeralOwner: int = 0
    numChildren: int = 0
    mod_revision: int = 0
    create_revision: int = 0


#: The stat of a path that has no key of its own but keys below it.
DIRECTORY = EtcdStat(version=0)


def _stat(kv: Any) -> EtcdStat:
    return EtcdStat(
        version=int(kv.version) - 1,
        ephemeralOwner=int(kv.lease),
        mod_revision=int(kv.mod_revision),
        create_revision=int(kv.create_revision),
    )


def prefix_end(key: bytes) -> bytes:
    """The range end that covers every key starting with `key` (etcd's convention:
    the last byte below 0xff plus one; b"\\0", all keys, when there is none)."""
    end = bytearray(key)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One etcd endpoint: `url` as messages show it, `target` host:port for gRPC."""

    url: str
    target: str
    tls: bool


def parse_endpoints(endpoints: str | Sequence[str]) -> list[Endpoint]:
    """`http://host:port`, `https://host:port` or `host:port` (port 2379 if none), as a
    list or comma-separated (Pulsar's `etcd:http://a:2379,http://b:2379` too)."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    found: list[Endpoint] = []
    for item in items:
        raw = item.strip()
        text = raw.removeprefix("etcd:")
        scheme, sep, rest = text.partition("://")
        if not sep:
            scheme, rest = "http", text
        scheme = scheme.lower()
        rest = rest.rstrip("/")
        if scheme not in ("http", "https") or not rest or "/" in rest or "@" in rest:
            raise ValueError(
                f"etcd endpoint {raw!r}: give http://host:port, https://host:port or host:port"
            )
        if not rest.rsplit("]", 1)[-1].count(":"):
            rest += ":2379"
        found.append(Endpoint(url=f"{scheme}://{rest}", target=rest, tls=scheme == "https"))
    if not found:
        raise ValueError("no etcd endpoint given")
    if len({e.tls for e in found}) > 1:
        raise ValueError("etcd endpoints mix http and https: give one scheme for all")
    return found


# --- request building -------------------------------------------------------------


def _cmp(key: bytes, target: Any, result: Any, **value: Any) -> Any:
    return rpc.Compare(key=key, target=target, result=result, **value)


def _absent(key: bytes) -> Any:
    return _cmp(key, rpc.Compare.CREATE, rpc.Compare.EQUAL, create_revision=0)


def _present(key: bytes) -> Any:
    return _cmp(key, rpc.Compare.CREATE, rpc.Compare.GREATER, create_revision=0)


def _at_version(key: bytes, version: int) -> Any:
    """etcd's version of `key` is `version` + 1 (we show version - 1)."""
    return _cmp(key, rpc.Compare.VERSION, rpc.Compare.EQUAL, version=version + 1)


def _none_below(below: bytes) -> Any:
    """No key starts with `below` (a range compare: true on an empty range)."""
    return rpc.Compare(
        key=below,
        range_end=prefix_end(below),
        target=rpc.Compare.CREATE,
        result=rpc.Compare.EQUAL,
        create_revision=0,
    )


def _range(key: bytes, **options: Any) -> Any:
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key, **options))


def _count_below(below: bytes) -> Any:
    return _range(below, range_end=prefix_end(below), count_only=True)


def _put(key: bytes, value: bytes, **options: Any) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, **options))


class _Session:
    """What a store and its fenced views share: the channel, the lease, the watches."""

    def __init__(self, endpoints: list[Endpoint]) -> None:
        self.endpoints = endpoints
        self.index = 0
        self.channel: Any = None
        self.kv: Any = None
        self.lease_stub: Any = None
        self.watch_stub: Any = None
        self.auth_stub: Any = None
        self.metadata: tuple[tuple[str, str], ...] | None = None
        self.lease: int | None = None
        self.ttl = 1
        self.alive_at = 0.0
        #: Leases given up as lost, revoked once etcd answers (their ephemerals go then).
        self.stale: list[int] = []
        self.state: SessionState | None = None
        self.listeners: list[asyncio.Queue[SessionState]] = []
        self.wake = asyncio.Event()
        self.supervisor: asyncio.Task[None] | None = None
        self.watches: set[asyncio.Task[None]] = set()
        self.trees: dict[str, tuple[asyncio.Task[None], asyncio.Queue[Event | Gap]]] = {}
        self.closed = False

    @property
    def endpoint(self) -> Endpoint:
        return self.endpoints[self.index]


class EtcdStore:
    """One session (lease) with an etcd cluster, used from asyncio.

    `endpoints`: one or more `http://host:port` (`https://` for TLS, `host:port`); the
    first that answers is used, the next on unavailability. `prefix` goes before every
    key. `timeout` bounds every call and `start()`; `session_timeout` is the lease's TTL
    in seconds (at least 1). `username`/`password`: etcd authentication. `ca_file`
    (default: the system's CAs), `cert_file` and `key_file` (a client certificate): TLS,
    for https endpoints. `authority`: the name the servers' certificates are checked
    against (and sent as the request's authority) instead of the endpoint's host, as
    jetcd's `authority` (Pulsar's etcd configuration file) does.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        prefix: str = "",
        timeout: float = 10.0,
        session_timeout: float = 30.0,
        username: str | None = None,
        password: str | None = None,
        ca_file: str | Path | None = None,
        cert_file: str | Path | None = None,
        key_file: str | Path | None = None,
        authority: str | None = None,
    ) -> None:
        self._s = _Session(parse_endpoints(endpoints))
        if prefix.endswith("/"):
            raise ValueError(f"etcd key prefix {prefix!r} must not end with /")
        if (username is None) != (password is None):
            raise ValueError("etcd authentication takes both a username and a password")
        if (cert_file is None) != (key_file is None):
            raise ValueError("an etcd client certificate takes both cert_file and key_file")
        tls = self._s.endpoints[0].tls
        if not tls and (ca_file or cert_file):
            raise ValueError("etcd TLS files given for http:// endpoints: use https://")
        self.prefix = prefix
        self._prefix = prefix.encode()
        self.timeout = timeout
        self._ttl = max(1, round(session_timeout))
        self._username = username
        self._password = password
        self._credentials: Any = None
        if tls:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=Path(ca_file).read_bytes() if ca_file else None,
                private_key=Path(key_file).read_bytes() if key_file else None,
                certificate_chain=Path(cert_file).read_bytes() if cert_file else None,
            )
        self._channel_options: tuple[tuple[str, int | str], ...] = _CHANNEL_OPTIONS
        if authority:
            self._channel_options += (
                ("grpc.default_authority", authority),
                ("grpc.ssl_target_name_override", authority),
            )
        #: (path, version) every write of this view must find unchanged.
        self._fence: tuple[str, int] | None = None
        #: (path, version) pairs the writes of this view also need unchanged (`guarded`).
        self._guards: tuple[tuple[str, int], ...] = ()

    # --- identity ----------------------------------------------------------------

    @property
    def kind(self) -> StoreKind:
        return StoreKind.ETCD

    @property
    def where(self) -> str:
        return ",".join(e.url for e in self._s.endpoints)

    @property
    def ranged(self) -> bool:
        return True

    @property
    def connected(self) -> bool:
        return self._s.state is SessionState.CONNECTED

    @property
    def state(self) -> str:
        return str(self._s.state or SessionState.LOST)

    @property
    def session(self) -> int | None:
        return self._s.lease

    @property
    def ttl(self) -> int:
        """The lease's TTL as etcd granted it (it may raise a small one)."""
        return self._s.ttl

    def fenced(self, path: str, version: int) -> Self:
        """A view of this session whose writes happen only while `path` is at `version`,
        checked in the same transaction as each write."""
        view = copy.copy(self)
        view._fence = (path, version)
        return view

    def guarded(self, path: str, version: int) -> Self:
        """A view whose writes also need `path` at `version` (NodeChangedError otherwise),
        compared in the same transaction as the write and any fence."""
        view = copy.copy(self)
        view._guards = (*self._guards, (path, version))
        return view

    # --- keys --------------------------------------------------------------------

    def _key(self, path: str) -> bytes:
        return self._prefix + path.encode()

    def _below(self, path: str) -> bytes:
        return self._key(path if path.endswith("/") else path + "/")

    def _path(self, key: bytes) -> str:
        return key[len(self._prefix) :].decode(errors="replace")

    # --- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Connects to the first endpoint that answers and takes a lease, all within
        `timeout`; StoreUnavailableError (StoreTimeoutError) otherwise."""
        s = self._s
        if s.closed:
            raise StoreUnavailableError("this etcd session was closed; make a new one")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        count = len(s.endpoints)
        failures: list[BaseException] = []
        for i in range(count):
            share = (deadline - loop.time()) / (count - i)
            s.index = i
            self._open_channel()
            try:
                async with asyncio.timeout(max(share, 0.001)):
                    await self._authenticate(share)
                    await self._grant(share)
                break
            except grpc.aio.AioRpcError as exc:
                await self._close_channel()
                if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                    failures.append(TimeoutError(exc.details()))
                    continue
                if exc.code() in (
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.INVALID_ARGUMENT,
                ):
                    raise StoreAuthError(
                        f"etcd at {s.endpoint.url} refused this session: {exc.details()}"
                    ) from exc
                failures.append(exc)
            except (TimeoutError, OSError) as exc:
                await self._close_channel()
                failures.append(exc)
        else:
            within = f"cannot connect to etcd at {self.where} within {self.timeout:g}s"
            if all(isinstance(f, TimeoutError) for f in failures):
                raise StoreTimeoutError(within) from failures[-1]
            raise StoreUnavailableError(within) from failures[-1]
        self._set(SessionState.CONNECTED)
        s.supervisor = asyncio.create_task(self._supervise(), name="etcd-session")

    async def close(self) -> None:
        """Revokes our lease (our ephemeral keys go at once, as Pulsar's close does) and
        closes the connection, within `timeout`."""
        s = self._s
        if s.closed:
            return
        s.closed = True
        tasks = [t for t in (s.supervisor, *s.watches, *(t for t, _ in s.trees.values())) if t]
        s.trees.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        lease, s.lease = s.lease, None
        if lease is not None and s.channel is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.timeout):
                    await s.lease_stub.LeaseRevoke(
                        rpc.LeaseRevokeRequest(ID=lease),
                        timeout=self.timeout,
                        metadata=s.metadata,
                    )
        await self._close_channel()
        self._set(SessionState.LOST)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _open_channel(self) -> None:
        s = self._s
        target = s.endpoint.target
        if self._credentials is not None:
            channel = grpc.aio.secure_channel(
                target, self._credentials, options=self._channel_options
            )
        else:
            channel = grpc.aio.insecure_channel(target, options=self._channel_options)
        s.channel = channel
        s.kv = rpc.KVStub(channel)
        s.lease_stub = rpc.LeaseStub(channel)
        s.watch_stub = rpc.WatchStub(channel)
        s.auth_stub = rpc.AuthStub(channel)
        s.metadata = None

    async def _close_channel(self) -> None:
        s = self._s
        channel, s.channel = s.channel, None
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.close(grace=None)

    async def _authenticate(self, limit: float) -> None:
        if self._username is None:
            return
        s = self._s
        reply = await s.auth_stub.Authenticate(
            rpc.AuthenticateRequest(name=self._username, password=self._password),
            timeout=limit,
        )
        s.metadata = (("token", str(reply.token)),)

    async def _grant(self, limit: float) -> None:
        s = self._s
        reply = await s.lease_stub.LeaseGrant(
            rpc.LeaseGrantRequest(TTL=self._ttl), timeout=limit, metadata=s.metadata
        )
        if reply.error:
            raise StoreUnavailableError(f"etcd at {s.endpoint.url} refused a lease: {reply.error}")
        s.lease = int(reply.ID)
        s.ttl = max(1, int(reply.TTL))
        s.alive_at = time.monotonic()

    # --- the session: keep-alive, loss, fail-over ------------------------------------

    def _set(self, state: SessionState) -> None:
        s = self._s
        if s.state is state:
            return
        s.state = state
        for q in list(s.listeners):
            q.put_nowait(state)

    def states(self) -> AsyncGenerator[SessionState, None]:
        """Every session-state change (CONNECTED, SUSPENDED, LOST) from this call on.

        The subscription starts here, not at the first `anext`, so no change between
        this call and the first read is missed.
        """
        q: asyncio.Queue[SessionState] = asyncio.Queue()
        listeners = self._s.listeners
        listeners.append(q)

        async def stream() -> AsyncGenerator[SessionState, None]:
            try:
                while True:
                    yield await q.get()
            finally:
                with contextlib.suppress(ValueError):
                    listeners.remove(q)

        return stream()

    def _suspect(self) -> None:
        """A call failed for connection reasons: SUSPENDED, and a keep-alive at once."""
        s = self._s
        if s.closed:
            return
        if s.state is SessionState.CONNECTED:
            self._set(SessionState.SUSPENDED)
        s.wake.set()

    async def _supervise(self) -> None:
        s = self._s
        while not s.closed:
            connected = s.state is SessionState.CONNECTED
            interval = max(s.ttl / 3, 0.1) if connected else RETRY_INTERVAL
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await s.wake.wait()
            s.wake.clear()
            try:
                await self._beat()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop outlives any one beat
                s.wake.clear()

    async def _beat(self) -> None:
        """One keep-alive (or, without a lease, one attempt at a new one)."""
        s = self._s
        limit = min(self.timeout, max(s.ttl / 3, 1.0))
        try:
            async with asyncio.timeout(limit):
                if s.lease is None:
                    await self._revoke_stale(limit)
                    await self._grant(limit)
                    self._set(SessionState.CONNECTED)
                    return
                ttl = await self._keep_alive(s.lease, limit)
        except (grpc.aio.AioRpcError, TimeoutError, OSError) as exc:
            if (
                isinstance(exc, grpc.aio.AioRpcError)
                and exc.code() == grpc.StatusCode.UNAUTHENTICATED
            ):
                with contextlib.suppress(Exception):
                    await self._authenticate(limit)
            if s.state is SessionState.CONNECTED:
                self._set(SessionState.SUSPENDED)
            if s.lease is not None and time.monotonic() - s.alive_at >= s.ttl:
                self._lose()
            await self._fail_over()
            return
        if ttl <= 0:
            self._lose()
            s.wake.set()  # a new lease at once
            return
        s.alive_at = time.monotonic()
        self._set(SessionState.CONNECTED)

    async def _keep_alive(self, lease: int, limit: float) -> int:
        s = self._s
        call = s.lease_stub.LeaseKeepAlive(
            iter([rpc.LeaseKeepAliveRequest(ID=lease)]), timeout=limit, metadata=s.metadata
        )
        try:
            async for reply in call:
                return int(reply.TTL)
        finally:
            call.cancel()
        raise OSError("etcd closed the keep-alive stream without an answer")

    async def _revoke_stale(self, limit: float) -> None:
        s = self._s
        while s.stale:
            try:
                await s.lease_stub.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=s.stale[0]), timeout=limit, metadata=s.metadata
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
            s.stale.pop(0)

    def _lose(self) -> None:
        """The lease is gone: LOST, and every watch ends (its events may be missed)."""
        s = self._s
        if s.lease is not None:
            s.stale.append(s.lease)
        s.lease = None
        self._set(SessionState.LOST)
        for task in list(s.watches):
            task.cancel()
        for path, (task, queue) in list(s.trees.items()):
            del s.trees[path]
            task.cancel()
            queue.put_nowait(Gap(str(SessionState.LOST)))

    async def _fail_over(self) -> None:
        """With more than one endpoint, the next one gets the next attempt."""
        s = self._s
        if len(s.endpoints) < 2 or s.closed:
            return
        old = s.channel
        s.index = (s.index + 1) % len(s.endpoints)
        self._open_channel()
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close(grace=None)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.timeout):
                await self._authenticate(self.timeout)

    # --- the bridge --------------------------------------------------------------

    async def _call(self, what: str, path: str, call: Callable[[_Session], Awaitable[_T]]) -> _T:
        """`call`'s outcome within `timeout`, gRPC's failures raised as the port's errors
        (an expired auth token renewed once)."""
        s = self._s
        if s.channel is None:
            raise StoreUnavailableError(
                f"etcd {what} {path}: no connection to etcd at {self.where}"
                + (" (closed)" if s.closed else " (not started)")
            )
        try:
            async with asyncio.timeout(self.timeout):
                try:
                    return await call(s)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAUTHENTICATED or self._username is None:
                        raise
                    await self._authenticate(self.timeout)
                    return await call(s)
        except TimeoutError as exc:
            self._suspect()
            raise StoreTimeoutError(
                f"etcd {what} {path} did not complete within {self.timeout:g}s "
                f"(etcd at {s.endpoint.url})"
            ) from exc
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc, what, path) from exc

    def _error(self, exc: grpc.aio.AioRpcError, what: str, path: str) -> Exception:
        s = self._s
        code, details = exc.code(), exc.details() or ""
        at = s.endpoint.url
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            self._suspect()
            return StoreTimeoutError(
                f"etcd {what} {path} did not complete within {self.timeout:g}s (etcd at {at})"
            )
        # etcd 3.4 answers a request without credentials where they are required with
        # INVALID_ARGUMENT "user name is empty".
        auth = code is grpc.StatusCode.INVALID_ARGUMENT and (
            "user name" in details or "auth" in details
        )
        if auth or code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            who = (
                f"as {self._username}"
                if self._username
                else "unauthenticated: give a username and password"
            )
            return StoreAuthError(f"etcd at {at} refused {what} {path} ({who}): {details}")
        if code is grpc.StatusCode.NOT_FOUND and "lease" in details:
            s.wake.set()  # the keep-alive finds the lease gone: LOST, then a new one
            return StoreUnavailableError(
                f"etcd {what} {path} failed: our session (lease) is gone ({details})"
            )
        if code in _CONNECTION_CODES:
            self._suspect()
            return StoreUnavailableError(f"cannot reach etcd at {at}: {what} {path} failed")
        return StoreUnavailableError(f"etcd {what} {path} failed: {code.name}: {details}")

    async def _kv(self, what: str, path: str, method: str, request: Any) -> Any:
        async def call(s: _Session) -> Any:
            return await getattr(s.kv, method)(request, timeout=self.timeout, metadata=s.metadata)

        return await self._call(what, path, call)

    async def _txn(
        self, what: str, path: str, success: list[Any], compare: Sequence[Any] = ()
    ) -> Any:
        return await self._kv(
            what, path, "Txn", rpc.TxnRequest(compare=list(compare), success=success)
        )

    async def _write(
        self,
        what: str,
        path: str,
        compare: list[Any],
        success: list[Any],
        failure: list[Any],
    ) -> Any:
        """One write transaction, fenced and guarded as this view is; on a failed fence
        FencedOutError, on a failed guard NodeChangedError (their keys are read in the
        failure branch, after the write's own reads)."""
        checks = ([] if self._fence is None else [self._fence]) + list(self._guards)
        for check_path, check_version in checks:
            check_key = self._key(check_path)
            compare = [*compare, _at_version(check_key, check_version)]
            failure = [*failure, _range(check_key, keys_only=True)]
        reply = await self._kv(
            f"fenced {what}" if checks else what,
            path,
            "Txn",
            rpc.TxnRequest(compare=compare, success=success, failure=failure),
        )
        if checks and not reply.succeeded:
            seen = reply.responses[len(reply.responses) - len(checks) :]
            for i, ((check_path, check_version), got) in enumerate(zip(checks, seen, strict=True)):
                kvs = got.response_range.kvs
                if kvs and int(kvs[0].version) == check_version + 1:
                    continue
                if self._fence is not None and i == 0:
                    raise FencedOutError(
                        f"refused to {what} {path}: {check_path} is gone or changed "
                        "(leadership lost)"
                    )
                raise NodeChangedError(check_path)
        return reply

    # --- reads -------------------------------------------------------------------

    async def _read(self, path: str, keys_only: bool) -> tuple[bytes, EtcdStat | None, int]:
        """A node's value and stat (a directory's: an empty node; None: no node) and the
        read's revision."""
        reply = await self._txn(
            "get",
            path,
            [_range(self._key(path), keys_only=keys_only), _count_below(self._below(path))],
        )
        revision = int(reply.header.revision)
        kvs = reply.responses[0].response_range.kvs
        if kvs:
            return bytes(kvs[0].value), _stat(kvs[0]), revision
        if reply.responses[1].response_range.count:
            return b"", DIRECTORY, revision
        return b"", None, revision

    async def get(self, path: str) -> tuple[bytes, EtcdStat]:
        data, stat, _ = await self._read(path, keys_only=False)
        if stat is None:
            raise NoNodeError(path)
        return data, stat

    async def exists(self, path: str) -> EtcdStat | None:
        return (await self._read(path, keys_only=True))[1]

    async def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, EtcdStat] | None]:
        """The keys' values and stats in the order of `paths`, None for a missing key
        (keys only: no directory answers here). One transaction per `MAX_TXN_OPS` paths,
        sent together; one `timeout` for all."""
        if not paths:
            return []
        where = paths[0] if len(paths) == 1 else f"{paths[0]} (and {len(paths) - 1} more)"
        chunks = [paths[i : i + MAX_TXN_OPS] for i in range(0, len(paths), MAX_TXN_OPS)]

        async def call(s: _Session) -> list[Any]:
            return list(
                await asyncio.gather(
                    *(
                        s.kv.Txn(
                            rpc.TxnRequest(success=[_range(self._key(p)) for p in chunk]),
                            timeout=self.timeout,
                            metadata=s.metadata,
                        )
                        for chunk in chunks
                    )
                )
            )

        replies = await self._call("get", where, call)
        found: list[tuple[bytes, EtcdStat] | None] = []
        for reply in replies:
            for response in reply.responses:
                kvs = response.response_range.kvs
                found.append((bytes(kvs[0].value), _stat(kvs[0])) if kvs else None)
        return found

    async def _children(self, path: str) -> tuple[list[str], int]:
        below = self._below(path)
        reply = await self._txn(
            "get_children",
            path,
            [
                _range(
                    below,
                    range_end=prefix_end(below),
                    keys_only=True,
                ),
                _range(self._key(path), count_only=True),
            ],
        )
        kvs = reply.responses[0].response_range.kvs
        if not kvs and not reply.responses[1].response_range.count:
            raise NoNodeError(path)
        names = {bytes(kv.key)[len(below) :].split(b"/", 1)[0] for kv in kvs}
        names.discard(b"")
        return sorted(n.decode(errors="replace") for n in names), int(reply.header.revision)

    async def get_children(self, path: str) -> list[str]:
        """The first segments of the keys below `path`, sorted; NoNodeError when there
        are none and `path` has no key either (as ZooKeeper for a missing node)."""
        return (await self._children(path))[0]

    async def get_children_many(self, paths: Sequence[str]) -> list[list[str] | None]:
        """Each path's children as `get_children` lists them (None for a missing node),
        the requests sent together."""

        async def one(path: str) -> list[str] | None:
            try:
                return (await self._children(path))[0]
            except NoNodeError:
                return None

        return list(await asyncio.gather(*(one(p) for p in paths)))

    async def sync(self, path: str) -> None:
        """Nothing: etcd's reads are linearizable already."""

    async def read_range(self, start: str, end: str, *, limit: int) -> tuple[list[RangeItem], bool]:
        """Nodes whose paths sort in [start, end) ("" : no end), in path order, at most
        `limit`, in one range request; and whether more follow."""
        range_end = self._key(end) if end else prefix_end(self._prefix)
        reply = await self._kv(
            "read_range",
            start,
            "Range",
            rpc.RangeRequest(
                key=self._key(start),
                range_end=range_end,
                limit=limit,
                # No sort asked for: etcd returns a range in key order anyway, and etcd
                # 3.4 asked to sort reads the whole rest of the range, sorts it and only
                # then applies the limit (every page costs the rest of the walk).
            ),
        )
        items = [
            RangeItem(path=self._path(bytes(kv.key)), data=bytes(kv.value), stat=_stat(kv))
            for kv in reply.kvs
        ]
        return items, bool(reply.more)

    # --- watches -----------------------------------------------------------------

    def _tree_range(self, path: str) -> tuple[bytes, bytes]:
        """The keys of `path` and below (and a few beside, filtered out by `_in_tree`)."""
        return self._key(path), prefix_end(self._below(path))

    def _in_tree(self, path: str, key: bytes) -> bool:
        return key == self._key(path) or key.startswith(self._below(path))

    def _watch_once(
        self, path: str, revision: int, relevant: Callable[[Any], bool]
    ) -> asyncio.Event:
        """An event set by the first relevant change of `path`'s tree after `revision`,
        or when the watch breaks (connection or session lost: the caller reads again)."""
        s = self._s
        changed = asyncio.Event()
        key, end = self._tree_range(path)
        request = rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(
                key=key, range_end=end, start_revision=revision + 1
            )
        )

        async def run() -> None:
            try:
                call = s.watch_stub.Watch(metadata=s.metadata)
                try:
                    await call.write(request)
                    while True:
                        reply = await call.read()
                        if reply is grpc.aio.EOF or reply.canceled:
                            return
                        for event in reply.events:
                            if self._in_tree(path, bytes(event.kv.key)) and relevant(event):
                                return
                finally:
                    call.cancel()
            except grpc.aio.AioRpcError:
                self._suspect()
            except Exception:  # a closed channel: the caller's next read says so
                pass
            finally:
                changed.set()

        task = asyncio.create_task(run(), name=f"etcd-watch {path}")
        s.watches.add(task)
        task.add_done_callback(s.watches.discard)
        return changed

    def _node_change(self, path: str) -> Callable[[Any], bool]:
        """The node's own key changed, or a key below came or went (a directory's
        existence may have changed)."""
        key = self._key(path)
        return lambda e: bytes(e.kv.key) == key or _created_or_deleted(e)

    async def get_children_watched(self, path: str) -> tuple[list[str], asyncio.Event]:
        """Children plus an event set once when a key below `path` (or its own) is
        created or deleted after the read."""
        children, revision = await self._children(path)
        return children, self._watch_once(path, revision, _created_or_deleted)

    async def exists_watched(self, path: str) -> tuple[EtcdStat | None, asyncio.Event]:
        """Whether the node exists, plus an event set when its key is created, changed or
        deleted (or a key below it comes or goes) after the read."""
        _, stat, revision = await self._read(path, keys_only=True)
        return stat, self._watch_once(path, revision, self._node_change(path))

    async def get_watched(self, path: str) -> tuple[bytes, EtcdStat, asyncio.Event]:
        """A node's data, plus an event set when it next changes or goes away."""
        data, stat, revision = await self._read(path, keys_only=False)
        if stat is None:
            raise NoNodeError(path)
        return data, stat, self._watch_once(path, revision, self._node_change(path))

    async def watch_tree(self, path: str) -> asyncio.Queue[Event | Gap]:
        """Every create, change and delete of `path` and the keys below it from now on,
        in etcd's order, as a queue; `Gap` when the watch breaks (connection or session
        lost: events may be missed; watch again and re-read). Returns once etcd has
        the watch in place."""
        s = self._s
        key, end = self._tree_range(path)
        queue: asyncio.Queue[Event | Gap] = asyncio.Queue()
        request = rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=key, range_end=end))
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self.unwatch_tree(path)

        async def run() -> None:
            state = SessionState.SUSPENDED
            try:
                call = s.watch_stub.Watch(metadata=s.metadata)
                try:
                    await call.write(request)
                    while True:
                        reply = await call.read()
                        if reply is grpc.aio.EOF or reply.canceled:
                            break
                        if reply.created and not ready.done():
                            ready.set_result(None)
                        for event in reply.events:
                            k = bytes(event.kv.key)
                            if self._in_tree(path, k):
                                queue.put_nowait(Event(_event_type(event), self._path(k)))
                finally:
                    call.cancel()
            except grpc.aio.AioRpcError as exc:
                if not ready.done():
                    ready.set_exception(exc)
                    return
                self._suspect()
            if s.lease is None:
                state = SessionState.LOST
            if not ready.done():
                ready.set_exception(OSError("etcd ended the watch before it was in place"))
                return
            if s.trees.get(path, (None,))[0] is asyncio.current_task():
                del s.trees[path]
            queue.put_nowait(Gap(str(state)))

        task = asyncio.create_task(run(), name=f"etcd-watch-tree {path}")

        async def created(_s: _Session) -> None:
            await asyncio.shield(ready)

        try:
            await self._call("watch", path, created)
        except OSError as exc:
            task.cancel()
            raise StoreUnavailableError(f"etcd watch {path} failed: {exc}") from exc
        except BaseException:
            task.cancel()
            raise
        s.trees[path] = (task, queue)
        return queue

    async def unwatch_tree(self, path: str) -> None:
        task, _ = self._s.trees.pop(path, (None, None))
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- writes ------------------------------------------------------------------

    def _our_lease(self, path: str) -> int:
        lease = self._s.lease
        if lease is None:
            raise StoreUnavailableError(
                f"cannot create ephemeral {path}: no etcd session (our lease is lost and "
                "not renewed yet)"
            )
        return lease

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str:
        """Puts `path` if it has no key (NodeExistsError otherwise); ephemeral on our
        lease. No parent is needed (`makepath` changes nothing). Sequential: Pulsar's
        naming, path + the parent key's previous version (the parent key is put empty)."""
        del makepath  # etcd keeps no parents
        if sequence:
            parent = path.rsplit("/", 1)[0] or "/"
            reply = await self._write(
                "create", path, [], [_put(self._key(parent), b"", prev_kv=True)], []
            )
            path += str(int(reply.responses[0].response_put.prev_kv.version))
        lease = self._our_lease(path) if ephemeral else 0
        key = self._key(path)
        reply = await self._write(
            "create", path, [_absent(key)], [_put(key, data, lease=lease)], []
        )
        if not reply.succeeded:
            raise NodeExistsError(path)
        return path

    async def set(self, path: str, data: bytes, version: int = -1) -> EtcdStat:
        """Puts new data in an existing key (its lease kept), at `version` if >= 0."""
        key = self._key(path)
        reply = await self._write(
            "set",
            path,
            [_at_version(key, version) if version >= 0 else _present(key)],
            [_put(key, data, prev_kv=True, ignore_lease=True)],
            [_range(key, keys_only=True)],
        )
        if not reply.succeeded:
            if not reply.responses[0].response_range.kvs:
                raise NoNodeError(path)
            raise BadVersionError(path)
        prev = reply.responses[0].response_put.prev_kv
        return EtcdStat(
            version=int(prev.version),
            ephemeralOwner=int(prev.lease),
            mod_revision=int(reply.header.revision),
            create_revision=int(prev.create_revision),
        )

    async def delete(self, path: str, version: int = -1) -> None:
        """Deletes the key: NoNodeError if missing, BadVersionError at another version,
        NotEmptyError with keys below (checked in the same transaction)."""
        key, below = self._key(path), self._below(path)
        compare = [_present(key), _none_below(below)]
        if version >= 0:
            compare.append(_at_version(key, version))
        reply = await self._write(
            "delete",
            path,
            compare,
            [rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))],
            [_range(key, keys_only=True), _count_below(below)],
        )
        if reply.succeeded:
            return
        kvs = reply.responses[0].response_range.kvs
        if not kvs:
            if reply.responses[1].response_range.count:
                raise NotEmptyError(path)
            raise NoNodeError(path)
        if version >= 0 and int(kvs[0].version) != version + 1:
            raise BadVersionError(path)
        raise NotEmptyError(path)

    async def ensure_path(self, path: str) -> None:
        """Puts an empty key at every level of `path` that has none (never fenced)."""
        parts = [p for p in path.split("/") if p]
        levels = ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
        for i in range(0, len(levels), MAX_TXN_OPS):
            nested = [
                rpc.RequestOp(
                    request_txn=rpc.TxnRequest(
                        compare=[_absent(self._key(p))], success=[_put(self._key(p), b"")]
                    )
                )
                for p in levels[i : i + MAX_TXN_OPS]
            ]
            await self._txn("ensure_path", path, nested)

    async def create_many(self, items: list[tuple[str, bytes]]) -> None:
        """Creates many persistent keys, all or nothing per transaction of
        `MAX_TXN_OPS` (NodeExistsError naming the first that exists)."""
        seen: set[str] = set()
        for path, _ in items:
            if path in seen:
                raise NodeExistsError(path)
            seen.add(path)
        for i in range(0, len(items), MAX_TXN_OPS):
            chunk = items[i : i + MAX_TXN_OPS]
            keys = [self._key(p) for p, _ in chunk]
            reply = await self._write(
                "multi-create",
                chunk[0][0],
                [_absent(k) for k in keys],
                [_put(k, data) for k, (_, data) in zip(keys, chunk, strict=True)],
                [_range(k, count_only=True) for k in keys],
            )
            if not reply.succeeded:
                for (path, _), response in zip(chunk, reply.responses, strict=False):
                    if response.response_range.count:
                        raise NodeExistsError(path)
                raise NodeExistsError(chunk[0][0])


def _created_or_deleted(event: Any) -> bool:
    return bool(event.type == rpc.Event.DELETE or int(event.kv.version) == 1)


def _event_type(event: Any) -> EventType:
    if event.type == rpc.Event.DELETE:
        return EventType.DELETED
    return EventType.CREATED if int(event.kv.version) == 1 else EventType.CHANGED
