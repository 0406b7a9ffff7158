"""A what-if may be asked of the live cluster or of a snapshot, and a fresh snapshot must
answer exactly as the live cluster does, so both are reduced to one view before one judging
loop runs on it.

The what-if driver, on the live cluster or on a snapshot; it writes nothing.

The view is a `ClusterView` (who is available, who is known, where each bookie
is, ledger records in id order); it feeds `risk --from-snapshot` too.

A new rack map (`--racks FILE`, the format of `checks.racks_file`) overlays
today's locations: bookies it names move, the others stay where the
configured rack sources put them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from auditor.analysis.whatif import (
    DecommissionTally,
    PlacementTally,
    decommission_effect,
    placement_change,
)
from auditor.checks.context import CheckContext
from auditor.checks.placement import PlacementPolicy, PolicyKind, policy_kind, skip_reason
from auditor.checks.placement_run import Locate, placement_policy
from auditor.config import AuditorConfig
from auditor.errors import AuditorError, ConfigError
from auditor.metadata.registry import all_known_bookies, resolve_bookie
from auditor.metadata.walk import LedgerRecord
from auditor.timefmt import iso
from auditor.topology.racks import AddressOf, StaticMapping, load_racks_file, open_rack_resolver


@dataclass(frozen=True, slots=True)
class WhatIfRequest:
    """The change to predict; at least one part is set."""

    racks_file: Path | None = None
    min_racks: int | None = None
    decommission: tuple[str, ...] = ()

    @property
    def placement(self) -> bool:
        return self.racks_file is not None or self.min_racks is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "racks_file": str(self.racks_file) if self.racks_file is not None else None,
            "min_racks": self.min_racks,
            "decommission": list(self.decommission),
        }


@dataclass
class ClusterView:
    """What a prediction needs from a cluster, live or snapshot."""

    source: str
    available: frozenset[str]
    known: frozenset[str]
    locate: Locate
    address_of: AddressOf
    records: Callable[[], AsyncIterator[LedgerRecord]]
    #: Ledgers deleted while the walk ran (live only), reported as skipped.
    deleted: Callable[[], int] = lambda: 0


@dataclass
class WhatIfReport:
    request: WhatIfRequest
    source: str
    started_at: float
    finished_at: float = 0.0
    ledgers_checked: int = 0
    metadata_invalid: int = 0
    #: Ledgers the placement prediction leaves alone (open, in recovery), by reason.
    placement_skipped: Counter[str] = field(default_factory=Counter)
    policy: str = ""
    moved: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    placement: PlacementTally | None = None
    decommission: DecommissionTally | None = None

    @property
    def has_effect(self) -> bool:
        """Whether the change would make anything worse (exit status 1)."""
        return bool(
            (self.placement is not None and self.placement.worse)
            or (self.decommission is not None and self.decommission.has_effect)
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "report": "what-if",
            "source": self.source,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "changes": self.request.to_json(),
            "ledgers_checked": self.ledgers_checked,
            "metadata_invalid": self.metadata_invalid,
            "placement": None,
            "decommission": None,
        }
        if self.placement is not None:
            out["placement"] = {
                "policy": self.policy,
                "skipped": {k: n for k, n in sorted(self.placement_skipped.items()) if n},
                "moved_bookies": {
                    b: {"from": old, "to": new} for b, (old, new) in sorted(self.moved.items())
                },
                **self.placement.to_json(),
            }
        if self.decommission is not None:
            out["decommission"] = self.decommission.to_json()
        return out


# --- the change ---------------------------------------------------------------------


def load_new_racks(path: Path) -> StaticMapping:
    """`--racks FILE`, with errors that name the flag rather than `checks.racks_file`."""
    if not path.is_file():
        raise ConfigError(f"--racks {path}: no such file")
    try:
        return load_racks_file(path)
    except AuditorError as exc:
        raise ConfigError(f"--racks {path}: {exc}") from None


def check_decommission(bookies: Iterable[str], known: frozenset[str]) -> None:
    unknown = [b for b in bookies if b not in known]
    if unknown:
        raise ConfigError(
            f"--decommission: unknown bookie {unknown[0]!r} (neither registered nor "
            "holding a cookie)"
        )


def _overlay(view: ClusterView, mapping: StaticMapping | None) -> Locate:
    if mapping is None:
        return view.locate
    #: The new map's answer per bookie (None: not in it), asked once per run: a bookie
    #: the map names by host costs a ZooKeeper read, and the walk asks per ledger.
    placed: dict[str, str | None] = {}

    async def locate(bookies: Iterable[str]) -> dict[str, str]:
        wanted = list(bookies)
        found = await view.locate(wanted)
        new = [b for b in dict.fromkeys(wanted) if b not in placed]
        if new:
            located = await mapping.locate(new, view.address_of)
            placed.update((b, located.get(b)) for b in new)
        for b in wanted:
            loc = placed[b]
            if loc is not None:
                found[b] = loc
        return found

    return locate


async def _policy(
    config: AuditorConfig, view: ClusterView, locate: Locate, min_racks: int | None
) -> PlacementPolicy:
    bk = config.bookkeeper
    if min_racks is not None:
        kind = policy_kind(bk.ensemblePlacementPolicy)
        if kind is not PolicyKind.RACKAWARE:
            raise ConfigError(
                f"--min-racks applies to {PolicyKind.RACKAWARE.value}; the configured "
                f"policy is {kind.value}"
            )
        bk = replace(bk, minNumRacksPerWriteQuorum=min_racks)
    return placement_policy(bk, view.known, await locate(sorted(view.known)))


async def predict(view: ClusterView, config: AuditorConfig, request: WhatIfRequest) -> WhatIfReport:
    """Validates the request against the view, then judges every ledger once."""
    if request.min_racks is not None and request.min_racks < 0:
        raise ConfigError(f"--min-racks must be >= 0, got {request.min_racks}")
    check_decommission(request.decommission, view.known)
    mapping = load_new_racks(request.racks_file) if request.racks_file is not None else None
    report = WhatIfReport(request, view.source, started_at=time.time())
    today: PlacementPolicy | None = None
    after: PlacementPolicy | None = None
    locate_after = _overlay(view, mapping)
    if request.placement:
        policy_kind(config.bookkeeper.ensemblePlacementPolicy)  # refuses unknown policies
        today = await _policy(config, view, view.locate, None)
        after = await _policy(config, view, locate_after, request.min_racks)
        report.policy = today.kind.value
        report.placement = PlacementTally()
    available_after = view.available - set(request.decommission)
    if request.decommission:
        report.decommission = DecommissionTally(request.decommission)
    seen: set[str] = set()
    async for rec in view.records():
        md = rec.metadata
        if md is None:
            report.metadata_invalid += 1
            continue
        report.ledgers_checked += 1
        if report.decommission is not None:
            effect = decommission_effect(md, view.available, available_after, rec.znode_version)
            report.decommission.add(rec.ledger_id, effect)
        if report.placement is None or today is None or after is None:
            continue
        skip = skip_reason(md)
        if skip is not None:
            report.placement_skipped[str(skip)] += 1
            continue
        bookies = md.bookies()
        seen |= bookies
        before_cat, after_cat = placement_change(
            md, today, await view.locate(bookies), after, await locate_after(bookies)
        )
        report.placement.add(rec.ledger_id, before_cat, after_cat)
    if mapping is not None:
        every = sorted(seen | view.known)
        old, new = await view.locate(every), await locate_after(every)
        report.moved = {b: (old.get(b), new.get(b)) for b in every if old.get(b) != new.get(b)}
    deleted = view.deleted()
    if deleted:
        report.placement_skipped["deleted"] += deleted
    report.finished_at = time.time()
    return report


# --- the two sources ------------------------------------------------------------------


async def live_view(ctx: CheckContext) -> ClusterView:
    """The cluster of `ctx`: registry and cookies now, locations from the rack sources."""
    resolver = await open_rack_resolver(ctx.store, ctx.root, ctx.config, log=ctx.log)
    available = (await ctx.registered()).available
    known = available | await all_known_bookies(ctx.store, ctx.root)
    await resolver.locations(sorted(known))
    walker = ctx.walker()

    async def address_of(bookie: str) -> tuple[str, int] | None:
        return await resolve_bookie(ctx.store, ctx.root, bookie)

    def records() -> AsyncIterator[LedgerRecord]:
        return walker.ledgers(concurrency=ctx.config.checks.walk_window)

    return ClusterView(
        source="live",
        available=frozenset(available),
        known=frozenset(known),
        locate=resolver.locations,
        address_of=address_of,
        records=records,
        deleted=lambda: walker.stats.deleted_during_walk,
    )
