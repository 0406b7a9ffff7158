"""Ranking the queue must not cost a read per marked ledger at every take, so what the
ranking needs is kept as the queue reads it, and ranked again from what is kept when the
registry or the racks change.

The take order by risk, driven: what the ranking (`worker/risk.py`) needs, gathered.

`RiskOrder` is the replication queue's `TakeOrder`. The queue hands it each mark and its
ledger's metadata as it reads them (once, and again only when the watch says the mark
changed or the ledger's lock was released); this keeps, per marked ledger, the ledger's
shape (its distinct write sets, shared between ledgers with the same ensembles), the
mark's missing bookies and when it was made, and the rank computed from them. Before a
ranking it reads the registry (two listings; at most every `REGISTRY_REFRESH` seconds)
and, every `RACKS_REFRESH` seconds, the rack sources; when either changed, every mark is
ranked again from what is kept, without reading a ledger.

A rack source that cannot be read (a script that fails, a racks file that no longer
parses) leaves the order without racks (logged once per cause): the order then ranks by
copies and age alone, and the take goes on. The repair itself still needs the racks and
says so for its ledger.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from auditor.checks.context import CheckContext
from auditor.errors import ConfigError
from auditor.metadata.replication import MarkRead
from auditor.metadata.serde import LedgerMetadataFormatError, decode_ledger_metadata
from auditor.topology.racks import RackResolver, open_rack_resolver
from auditor.topology.sources import RackSourceError
from auditor.worker.repair import RACKS_REFRESH
from auditor.worker.risk import LedgerShape, Risk, rank, shape_of

#: The registry is read again at most this often (s): takes come one after another while
#: workers are busy, and a bookie lost a second ago changes an order, not a repair.
REGISTRY_REFRESH = 1.0
#: Where a ledger the order never learnt sorts: after every ranked one.
UNRANKED = (math.inf, math.inf, math.inf)


@dataclass(frozen=True, slots=True)
class _Entry:
    """What is kept of one marked ledger between rankings."""

    shape: LedgerShape | None
    missing: frozenset[str]
    marked_at: float


class RiskOrder:
    """Ranks a queue's marks by risk; `risks` is the ranking, read by `status` and metrics."""

    def __init__(
        self,
        ctx: CheckContext,
        *,
        log: Any,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self.log = log
        self.clock = clock
        #: Ledger id -> its rank, for every ledger the queue told us is marked.
        self.risks: dict[int, Risk] = {}
        self._entries: dict[int, _Entry] = {}
        self._shapes: dict[LedgerShape, LedgerShape] = {}
        self._available: frozenset[str] | None = None
        self._registry_read: float | None = None
        #: Every mark to be ranked again (the registry or the racks changed).
        self._rerank = False
        self._resolver: RackResolver | None = None
        self._opened: float | None = None
        #: Bookie -> rack of every bookie located so far; None without a rack source.
        self._locations: dict[str, str] | None = None
        self._located: set[str] = set()
        self._rack_problem: str | None = None

    # --- TakeOrder ---------------------------------------------------------------------

    def ledger_path(self, ledger_id: int) -> str:
        return self.ctx.ledger_path(ledger_id)

    async def prepare(self) -> bool:
        now = self.clock()
        if self._registry_read is None or now - self._registry_read >= REGISTRY_REFRESH:
            available = (await self.ctx.registered()).available
            self._registry_read = now
            if available != self._available:
                self._available, self._rerank = available, True
        if self._opened is None or now - self._opened >= RACKS_REFRESH:
            if await self._open_racks():
                self._rerank = True
            self._opened = now
        if not self._rerank:
            return False
        for lid in self._entries:
            self._rank(lid)
        self._rerank = False
        return True

    async def learn(self, reads: Sequence[MarkRead]) -> bool:
        for r in reads:
            shape = None
            if r.metadata is not None:
                try:
                    md = decode_ledger_metadata(r.metadata, r.ledger_id, r.metadata_ctime)
                except LedgerMetadataFormatError:
                    pass  # ranked unknown: no worker can repair it either
                else:
                    found = shape_of(md)
                    shape = self._shapes.setdefault(found, found)
            self._entries[r.ledger_id] = _Entry(shape, frozenset(r.missing), r.marked_at)
        new = {b for r in reads if (s := self._entries[r.ledger_id].shape) for b in s.bookies()}
        if await self._locate(new - self._located):
            for lid in self._entries:  # a rack source failed: every rank without racks
                self._rank(lid)
            return True
        for r in reads:
            self._rank(r.ledger_id)
        return False

    def forget(self, ledger_ids: Iterable[int]) -> None:
        for lid in ledger_ids:
            self._entries.pop(lid, None)
            self.risks.pop(lid, None)
        if len(self._shapes) > 2 * len(self._entries) + 64:
            # Shapes only forgotten ledgers had: kept no longer.
            kept = {e.shape for e in self._entries.values() if e.shape is not None}
            self._shapes = {s: s for s in kept}

    def key(self, ledger_id: int) -> tuple[float, ...]:
        r = self.risks.get(ledger_id)
        return UNRANKED if r is None else r.key

    # --- ranking ---------------------------------------------------------------------------

    def _rank(self, lid: int) -> None:
        e = self._entries[lid]
        self.risks[lid] = rank(
            e.shape,
            e.missing,
            e.marked_at,
            available=self._available,
            locations=self._locations,
        )

    async def _open_racks(self) -> bool:
        """Reads the rack sources again and locates every bookie known; whether a rack
        changed. A store that does not answer raises, and nothing is changed."""
        before = self._locations
        try:
            resolver = await open_rack_resolver(
                self.ctx.store, self.ctx.root, self.ctx.config, log=self.log
            )
            found = await resolver.locations(sorted(self._located)) if resolver.sources else {}
        except (ConfigError, RackSourceError) as exc:
            self._no_racks(str(exc))
            return before is not None
        if not resolver.sources:
            self._resolver, self._locations = None, None
            return before is not None
        self._resolver, self._locations = resolver, dict(found)
        self._rack_problem = None
        return self._locations != before

    async def _locate(self, bookies: set[str]) -> bool:
        """Locates bookies not located yet; True when the rack source failed (and the order
        is left without racks)."""
        if self._resolver is None or self._locations is None or not bookies:
            self._located |= bookies
            return False
        try:
            found = await self._resolver.locations(sorted(bookies))
        except RackSourceError as exc:
            self._no_racks(str(exc))
            return True
        self._locations.update(found)
        self._located |= bookies
        self._rack_problem = None
        return False

    def _no_racks(self, why: str) -> None:
        self._resolver, self._locations = None, None
        if why != self._rack_problem:
            self.log.warning("take order without racks: a rack source cannot be read", error=why)
        self._rack_problem = why
