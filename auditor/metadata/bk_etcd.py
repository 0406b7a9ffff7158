"""Everything above the store (the registry, LAYOUT reading, the election, the checks) names
ZooKeeper's paths, and BookKeeper's own etcd driver spells a few of them differently; one
view translates them, so that nothing there learns a second spelling.

BookKeeper's own etcd driver, seen as the ZooKeeper layout the rest of the product reads.

A cluster whose metadata service URI is `etcd://h1:2379/<scope>` keeps BookKeeper's
metadata in etcd as BookKeeper's `metadata-drivers/etcd` writes it. Most of its keys
are the paths ZooKeeper's layout would have (`<scope>/cookies/<bookieId>`), and its
ledgers are keys of their own form (`<scope>/ledgers/<UUID(0, id)>`, `LedgerManager.ETCD`
in `paths.py` and the walk), but a few names differ:

| ZooKeeper's layout (what our code names)   | BookKeeper's etcd key                |
|--------------------------------------------|--------------------------------------|
| `<scope>/LAYOUT`                           | `<scope>/layout`                     |
| `<scope>/INSTANCEID`                       | `<scope>/instanceid`                 |
| `<scope>/available` (children: + `readonly`) | `<scope>/bookies/writable`          |
| `<scope>/available/<bookieId>`             | `<scope>/bookies/writable/<bookieId>`|
| `<scope>/available/readonly`               | `<scope>/bookies/readonly`           |
| `<scope>/available/readonly/<bookieId>`    | `<scope>/bookies/readonly/<bookieId>`|

`BookKeeperEtcdView` is a `MetadataStore` that delegates to the etcd store and translates
those few paths on the way in (calls, watches) and on the way out (children, events,
range items, created paths). It is the one place that knows BookKeeper's etcd names;
every other key (ledger keys, cookies, our own keys) passes through unchanged.

BookKeeper registers a bookie with an empty value on the bookie's lease (its address
is then the id itself, as for a bookie older than 4.12 on ZooKeeper), and has no
under-replication manager on etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import Self

from auditor.store import (
    Event,
    Gap,
    MetadataStore,
    RangeItem,
    SessionState,
    Stat,
    StoreKind,
)

READONLY = "readonly"

# (ZooKeeper's name, BookKeeper's etcd name) below the scope, most specific first.
_RENAMES: tuple[tuple[str, str], ...] = (
    ("available/" + READONLY, "bookies/" + READONLY),
    ("available", "bookies/writable"),
    ("LAYOUT", "layout"),
    ("INSTANCEID", "instanceid"),
)
#: The scope's own children as the ZooKeeper layout names them.
_CHILD_RENAMES = {"layout": "LAYOUT", "instanceid": "INSTANCEID", "bookies": "available"}


class BookKeeperEtcdView:
    """`store` (etcd, BookKeeper's driver's keys under `scope`) as ZooKeeper's layout."""

    def __init__(self, store: MetadataStore, scope: str) -> None:
        self.store = store
        self.scope = scope.rstrip("/")
        self._pumps: dict[str, asyncio.Future[None]] = {}

    # --- the translation -----------------------------------------------------------
    def to_store(self, path: str) -> str:
        """The etcd key of a path of ZooKeeper's layout."""
        rel = self._rel(path)
        if rel is None:
            return path
        for zk_name, etcd_name in _RENAMES:
            if rel == zk_name or rel.startswith(zk_name + "/"):
                return f"{self.scope}/{etcd_name}{rel[len(zk_name) :]}"
        return path

    def from_store(self, key: str) -> str:
        """The path of ZooKeeper's layout of an etcd key."""
        rel = self._rel(key)
        if rel is None:
            return key
        if rel == "bookies":
            return f"{self.scope}/available"
        for zk_name, etcd_name in _RENAMES:
            if rel == etcd_name or rel.startswith(etcd_name + "/"):
                return f"{self.scope}/{zk_name}{rel[len(etcd_name) :]}"
        return key

    def _rel(self, path: str) -> str | None:
        prefix = self.scope + "/"
        return path[len(prefix) :] if path.startswith(prefix) else None

    def _children_of(self, path: str, names: list[str]) -> list[str]:
        if path.rstrip("/") == self.scope:
            return [_CHILD_RENAMES.get(n, n) for n in names]
        if path == f"{self.scope}/available" and READONLY not in names:
            # ZooKeeper's `available` holds `readonly`; etcd's writable bookies do not.
            return [*names, READONLY]
        return names

    def _event(self, item: Event | Gap) -> Event | Gap:
        if isinstance(item, Gap):
            return item
        return Event(item.type, self.from_store(item.path))

    # --- the port ------------------------------------------------------------------
    @property
    def timeout(self) -> float:
        return self.store.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self.store.timeout = value

    @property
    def kind(self) -> StoreKind:
        return self.store.kind

    @property
    def where(self) -> str:
        return self.store.where

    async def start(self) -> None:
        await self.store.start()

    async def close(self) -> None:
        pumps, self._pumps = list(self._pumps.values()), {}
        for pump in pumps:
            pump.cancel()
        for pump in pumps:
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        await self.store.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self.store.connected

    @property
    def state(self) -> str:
        return self.store.state

    @property
    def session(self) -> int | None:
        return self.store.session

    def states(self) -> AsyncGenerator[SessionState, None]:
        return self.store.states()

    def fenced(self, path: str, version: int) -> Self:
        return type(self)(self.store.fenced(self.to_store(path), version), self.scope)

    def guarded(self, path: str, version: int) -> Self:
        return type(self)(self.store.guarded(self.to_store(path), version), self.scope)

    async def get(self, path: str) -> tuple[bytes, Stat]:
        return await self.store.get(self.to_store(path))

    async def get_many(self, paths: Sequence[str]) -> Sequence[tuple[bytes, Stat] | None]:
        return await self.store.get_many([self.to_store(p) for p in paths])

    async def get_children(self, path: str) -> list[str]:
        return self._children_of(path, await self.store.get_children(self.to_store(path)))

    async def get_children_many(self, paths: Sequence[str]) -> Sequence[list[str] | None]:
        found = await self.store.get_children_many([self.to_store(p) for p in paths])
        return [
            None if names is None else self._children_of(path, names)
            for path, names in zip(paths, found, strict=True)
        ]

    async def exists(self, path: str) -> Stat | None:
        return await self.store.exists(self.to_store(path))

    async def sync(self, path: str) -> None:
        await self.store.sync(self.to_store(path))

    @property
    def ranged(self) -> bool:
        return self.store.ranged

    async def read_range(self, start: str, end: str, *, limit: int) -> tuple[list[RangeItem], bool]:
        """A range of etcd keys, in etcd's key order (the ledger keys pass through as they
        are); the items' paths are named as ZooKeeper's layout names them."""
        items, more = await self.store.read_range(start, end, limit=limit)
        return [RangeItem(self.from_store(i.path), i.data, i.stat) for i in items], more

    async def get_children_watched(self, path: str) -> tuple[list[str], asyncio.Event]:
        names, changed = await self.store.get_children_watched(self.to_store(path))
        return self._children_of(path, names), changed

    async def exists_watched(self, path: str) -> tuple[Stat | None, asyncio.Event]:
        return await self.store.exists_watched(self.to_store(path))

    async def get_watched(self, path: str) -> tuple[bytes, Stat, asyncio.Event]:
        return await self.store.get_watched(self.to_store(path))

    def _tree_key(self, path: str) -> str:
        # ZooKeeper's `available` holds `readonly`; in etcd both live under `bookies`.
        if path.rstrip("/") == f"{self.scope}/available":
            return f"{self.scope}/bookies"
        return self.to_store(path)

    async def watch_tree(self, path: str) -> asyncio.Queue[Event | Gap]:
        """The store's events under `path`, named as ZooKeeper's layout names them (a task
        copies them onto the queue returned, until `unwatch_tree`)."""
        key = self._tree_key(path)
        source = await self.store.watch_tree(key)
        out: asyncio.Queue[Event | Gap] = asyncio.Queue()

        async def pump() -> None:
            while True:
                out.put_nowait(self._event(await source.get()))

        old = self._pumps.pop(key, None)
        if old is not None:
            old.cancel()
        self._pumps[key] = asyncio.ensure_future(pump())
        return out

    async def unwatch_tree(self, path: str) -> None:
        key = self._tree_key(path)
        pump = self._pumps.pop(key, None)
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        await self.store.unwatch_tree(key)

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str:
        created = await self.store.create(
            self.to_store(path), data, ephemeral=ephemeral, sequence=sequence, makepath=makepath
        )
        return self.from_store(created)

    async def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        return await self.store.set(self.to_store(path), data, version)

    async def delete(self, path: str, version: int = -1) -> None:
        await self.store.delete(self.to_store(path), version)

    async def ensure_path(self, path: str) -> None:
        await self.store.ensure_path(self.to_store(path))

    async def create_many(self, items: list[tuple[str, bytes]]) -> None:
        await self.store.create_many([(self.to_store(p), d) for p, d in items])
