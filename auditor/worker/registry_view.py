"""A worker plans every ledger, and verifies it, against the registered bookies: read from
the metadata store each time, that was two listings per plan, four per small ledger, more
requests than the ledger's own metadata takes. The registry changes when a bookie starts,
stops or turns read-only, seconds or hours apart, so the worker keeps it, as Java's
worker keeps its registration client's watched view of it.

`RegistryView` answers from the last listing until a watch on either listing fires, the
metadata store session changes (a new session has none of the old one's watches), or
`MAX_AGE` seconds pass (a bound on staleness whatever a watch does), then lists again.
A registry a moment stale costs no safety: a bookie gone since is not asked (its list
request, or a copy to it, fails: unknown, the ledger is tried later), and a bookie
registered since is only a candidate the next listing brings.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from auditor.metadata.registry import READONLY, BookieSet
from auditor.store import MetadataStore, NoNodeError

#: Seconds a listing is used at most, watched or not.
MAX_AGE = 1.0


class RegistryView:
    """The registered bookies under `root`, listed again only when they may have changed."""

    def __init__(
        self, store: MetadataStore, root: str, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.root = root.rstrip("/")
        self.clock = clock
        self._value: BookieSet | None = None
        self._changed: list[asyncio.Event] = []
        self._session: int | None = None
        self._read_at = 0.0

    def _watched(self) -> bool:
        """Whether the watches of the last listing are still set, in this session."""
        return (
            bool(self._changed)
            and self._session is not None
            and self._session == self.store.session
            and not any(ev.is_set() for ev in self._changed)
        )

    async def read(self) -> BookieSet:
        """The registered bookies: the last listing while it is current, else a new one.

        Watches are set again only once one has fired (or with a new session): a listing
        redone for its age alone keeps the watches it has, so none pile up in the client
        while the registry stays as it is."""
        watched = self._watched()
        if watched and self._value is not None and self.clock() - self._read_at < MAX_AGE:
            return self._value
        session, started = self.store.session, self.clock()
        paths = (f"{self.root}/available", f"{self.root}/available/{READONLY}")
        if watched:
            writable, readonly = await asyncio.gather(*(self._plain(p) for p in paths))
            changed = self._changed
        else:
            (writable, w_changed), (readonly, r_changed) = await asyncio.gather(
                *(self._list(p) for p in paths)
            )
            changed = [ev for ev in (w_changed, r_changed) if ev is not None]
            if len(changed) < len(paths):
                changed = []  # a listing without a watch (no such node): nothing kept
        value = BookieSet(frozenset(b for b in writable if b != READONLY), frozenset(readonly))
        self._changed = changed
        self._value = value if changed else None
        self._session, self._read_at = session, started
        return value

    async def _list(self, path: str) -> tuple[list[str], asyncio.Event | None]:
        try:
            children, changed = await self.store.get_children_watched(path)
        except NoNodeError:
            return [], None
        return children, changed

    async def _plain(self, path: str) -> list[str]:
        try:
            return await self.store.get_children(path)
        except NoNodeError:
            return []
