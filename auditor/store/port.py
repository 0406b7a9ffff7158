"""BookKeeper's metadata is one tree of named nodes with data and versions, whichever store
holds it, so the product is written once against that tree; `MetadataStore` says what it
needs from a store, and which semantics every adapter must keep for it.

The metadata-store port. The tree is held by ZooKeeper natively, by etcd as Pulsar's
`EtcdMetadataStore` lays that tree out in keys, or by etcd as BookKeeper's own etcd driver
does. Everything above the
adapters (metadata formats, checks, the index, the daemon, the worker, the CLI, the
Spark scan) is written against `MetadataStore` and does not know which store it talks
to. The adapters are `auditor.zk.ZkClient` (the only code that imports kazoo) and
`auditor.etcd.EtcdStore` (the only code that imports the etcd client).

Semantics every adapter keeps, because callers rely on them:
* paths are absolute, `/`-separated; versions start at 0 for a new node and grow by one
  per write; a write or delete given `version` >= 0 happens only at that version
  (`BadVersionError` otherwise); -1 means any version;
* ephemeral nodes belong to the process's session (ZooKeeper's session, etcd's lease)
  and `Stat.ephemeralOwner` names it (`session` is ours), 0 for a persistent node;
* `fenced(path, version)` gives a view whose writes happen only while `path` is at
  `version`, checked in the same transaction as the write (`FencedOutError`: our vote
  or leader key, so leadership is lost); `guarded(path, version)` the same for a node a
  decision was read from (`NodeChangedError`: read again and decide again). Views
  stack: a guarded view of a fenced one checks both, and a failed fence is reported
  before a failed guard;
* `states()` reports CONNECTED, SUSPENDED (calls may fail, the session may come back)
  and LOST (the session and its ephemeral nodes are gone; a new one follows);
* every call has a deadline (`timeout`) and raises `StoreUnavailableError` (or its
  `StoreTimeoutError`) instead of waiting longer.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Protocol, Self, runtime_checkable


class SessionState(enum.StrEnum):
    """The session's state changes, as ZooKeeper names them (kazoo's `KazooState`)."""

    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"
    LOST = "LOST"


class EventType(enum.StrEnum):
    """What happened to a watched node (the values are kazoo's `EventType`'s)."""

    CREATED = "CREATED"
    DELETED = "DELETED"
    CHANGED = "CHANGED"
    CHILD = "CHILD"
    NONE = "NONE"


class StoreKind(enum.StrEnum):
    """Which store an adapter talks to, for the few decisions that depend on it (which
    election BookKeeper's driver runs, what a status line names)."""

    ZOOKEEPER = "zookeeper"
    ETCD = "etcd"

    @property
    def label(self) -> str:
        """The store's name as messages write it ("ZooKeeper", "etcd")."""
        return "ZooKeeper" if self is StoreKind.ZOOKEEPER else "etcd"


class Stat(Protocol):
    """A node's metadata: kazoo's `ZnodeStat` is one, the etcd adapter's `EtcdStat` another.

    `ctime` and `mtime` are milliseconds since the epoch, 0 where the store keeps no
    times (etcd); `numChildren` is what the adapter knows of them (etcd: 0, children
    are keys found by prefix, not counted on every read).
    """

    @property
    def version(self) -> int: ...
    @property
    def ctime(self) -> int: ...
    @property
    def mtime(self) -> int: ...
    @property
    def ephemeralOwner(self) -> int: ...
    @property
    def numChildren(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Event:
    """A change under a watched root: `type` is created, deleted or changed; `path`
    is as the caller names paths (relative to a chroot or key prefix)."""

    type: EventType
    path: str


@dataclass(frozen=True, slots=True)
class Gap:
    """The watch is gone (connection or session lost); events may have been missed:
    re-add it once connected and re-read what is derived from the tree."""

    state: str


@dataclass(frozen=True, slots=True)
class RangeItem:
    """One node of a range read: its path, data and stat."""

    path: str
    data: bytes
    stat: Stat


@runtime_checkable
class MetadataStore(Protocol):
    """One session with a metadata store, used from asyncio (see the module docstring)."""

    #: The deadline of every call, in seconds.
    timeout: float

    @property
    def kind(self) -> StoreKind: ...

    @property
    def where(self) -> str:
        """The store's address as the operator gave it, for messages."""
        ...

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def __aenter__(self) -> Self: ...
    async def __aexit__(self, *exc: object) -> None: ...

    @property
    def connected(self) -> bool: ...

    @property
    def state(self) -> str: ...

    @property
    def session(self) -> int | None:
        """Our session's id as `Stat.ephemeralOwner` shows it; None while there is none.
        A new value means a new session (and none of the old one's ephemerals or watches)."""
        ...

    def states(self) -> AsyncGenerator[SessionState, None]:
        """Every session-state change from this call on."""
        ...

    def fenced(self, path: str, version: int) -> Self: ...
    def guarded(self, path: str, version: int) -> Self: ...

    # --- reads -------------------------------------------------------------------
    async def get(self, path: str) -> tuple[bytes, Stat]: ...
    async def get_many(self, paths: Sequence[str]) -> Sequence[tuple[bytes, Stat] | None]: ...
    async def get_children(self, path: str) -> list[str]: ...
    async def get_children_many(self, paths: Sequence[str]) -> Sequence[list[str] | None]:
        """Several nodes' children, in the order of `paths`; None for a node that does not
        exist (as `get_many` for data: ZooKeeper's one multiRead, not a request each)."""
        ...

    async def exists(self, path: str) -> Stat | None: ...
    async def sync(self, path: str) -> None: ...

    @property
    def ranged(self) -> bool:
        """Whether `read_range` is served by the store in few requests (etcd) rather than
        not at all (ZooKeeper, whose reads go by children and `get_many`)."""
        ...

    async def read_range(self, start: str, end: str, *, limit: int) -> tuple[list[RangeItem], bool]:
        """Nodes whose paths sort in [start, end), in path order, at most `limit`; and
        whether more follow. Only where `ranged`."""
        ...

    # --- watches -----------------------------------------------------------------
    async def get_children_watched(self, path: str) -> tuple[list[str], asyncio.Event]: ...
    async def exists_watched(self, path: str) -> tuple[Stat | None, asyncio.Event]: ...
    async def get_watched(self, path: str) -> tuple[bytes, Stat, asyncio.Event]: ...
    async def watch_tree(self, path: str) -> asyncio.Queue[Event | Gap]: ...
    async def unwatch_tree(self, path: str) -> None: ...

    # --- writes ------------------------------------------------------------------
    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str: ...

    async def set(self, path: str, data: bytes, version: int = -1) -> Stat: ...
    async def delete(self, path: str, version: int = -1) -> None: ...
    async def ensure_path(self, path: str) -> None: ...
    async def create_many(self, items: list[tuple[str, bytes]]) -> None: ...
