"""A write quorum kept in one rack is lost with that rack; the check, `explain`, what-if and
the worker's choice of targets must judge an ensemble by one rule, and upstream's misjudges
ensembles with a bookie down and never judges regions.

Placement-policy adherence of ledger ensembles: the pure core of the placement check.

The rules are BookKeeper's `isEnsembleAdheringToPlacementPolicy` for the
rack-aware, zone-aware and default policies (spec §7.2-§7.5), applied to every
segment of every closed ledger, with two deliberate differences:

* **Racks of down bookies.** Upstream only knows the racks of registered
  writable bookies, so a down bookie adds no rack to a write quorum and a
  perfectly placed ledger looks "not adhering" while one of its bookies is
  away. Here every bookie id of an ensemble is looked up in the rack sources,
  registered or not; a bookie the sources do not know gets the policy's
  default location (`/default-rack`, or the zone-aware and region-aware
  defaults).
* **Region-aware is a real check.** Upstream's region-aware policy always says
  "strict". Here, when the cluster has at least two known regions, every write
  quorum window must span at least ``min(W, reppMinimumRegionsForDurability,
  regions in the cluster)`` distinct known regions, else the ensemble FAILs. A
  bookie's region is the first component of its `/region/rack` location; the
  default location (`/default-region/...`) has no known region and adds none.
  A cluster with a single known region (or none) always passes, since no
  placement could do better there.

Everything here is pure: metadata and bookie locations in, verdicts out.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from auditor.checks.findings import Category, SkipReason
from auditor.config import BookKeeperConfig
from auditor.errors import ConfigError
from auditor.metadata.model import LedgerMetadata, LedgerState
from auditor.topology.locations import (
    DEFAULT_RACK,
    DEFAULT_REGION_RACK,
    DEFAULT_ZONE_UPGRADE_DOMAIN,
    region_of,
    zone_and_domain,
)


class Adherence(enum.IntEnum):
    """BookKeeper's `PlacementPolicyAdherence`, with its numeric values (worse is lower)."""

    FAIL = 1
    MEETS_SOFT = 3
    MEETS_STRICT = 5


class PolicyKind(enum.StrEnum):
    """The placement policies we can judge, named by their Java class' simple name."""

    RACKAWARE = "RackawareEnsemblePlacementPolicy"
    ZONEAWARE = "ZoneawareEnsemblePlacementPolicy"
    REGIONAWARE = "RegionAwareEnsemblePlacementPolicy"
    DEFAULT = "DefaultEnsemblePlacementPolicy"


def policy_kind(class_name: str) -> PolicyKind:
    """The policy named by `ensemblePlacementPolicy`, matched on the class' simple name.

    Matching the suffix accepts both the fully qualified upstream names and
    bare ones; a policy we cannot judge is a configuration error rather than a
    silent "everything adheres".
    """
    name = class_name.strip()
    for kind in PolicyKind:
        if name == kind.value or name.endswith("." + kind.value):
            return kind
    known = ", ".join(k.value for k in PolicyKind)
    raise ConfigError(
        f"bookkeeper.ensemblePlacementPolicy {class_name!r} is not supported; "
        f"the placement check knows {known}"
    )


@dataclass(frozen=True, slots=True)
class EnsembleVerdict:
    """How one ensemble fares, and the write-quorum window that decided it.

    `window_start` is the ensemble index of the window's first bookie; it is
    None when the verdict is about the ensemble as a whole (for example the
    zone-aware rule that E must be a multiple of W), or when it is strict.
    """

    adherence: Adherence
    reason: str | None = None
    window_start: int | None = None
    window: tuple[str, ...] = ()
    window_locations: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"adherence": self.adherence.name, "reason": self.reason}
        if self.window_start is not None:
            out["window"] = {
                "start": self.window_start,
                "bookies": list(self.window),
                "locations": list(self.window_locations),
            }
        return out


_STRICT = EnsembleVerdict(Adherence.MEETS_STRICT)

_Locate = Callable[[str], str]


def _windows(ensemble: Sequence[str], write_quorum: int) -> list[tuple[int, tuple[str, ...]]]:
    """The E write-quorum windows, wrapping around the ensemble."""
    size = len(ensemble)
    return [(i, tuple(ensemble[(i + j) % size] for j in range(write_quorum))) for i in range(size)]


@dataclass(frozen=True, slots=True)
class PlacementPolicy:
    """One policy with its knobs, able to judge an ensemble given bookie locations.

    `cluster_regions` (region-aware only) are the known regions of the
    cluster's bookies; the driver computes them once per run.
    """

    kind: PolicyKind = PolicyKind.RACKAWARE
    min_racks_per_write_quorum: int = 2
    enforce_min_racks_per_write_quorum: bool = False
    min_zones_per_write_quorum: int = 2
    desired_zones_per_write_quorum: int = 3
    min_regions_for_durability: int = 2
    cluster_regions: frozenset[str] = frozenset()

    @classmethod
    def from_config(
        cls, bk: BookKeeperConfig, *, cluster_regions: frozenset[str] = frozenset()
    ) -> PlacementPolicy:
        return cls(
            kind=policy_kind(bk.ensemblePlacementPolicy),
            min_racks_per_write_quorum=bk.minNumRacksPerWriteQuorum,
            enforce_min_racks_per_write_quorum=bk.enforceMinNumRacksPerWriteQuorum,
            min_zones_per_write_quorum=bk.minNumZonesPerWriteQuorum,
            desired_zones_per_write_quorum=bk.desiredNumZonesPerWriteQuorum,
            min_regions_for_durability=bk.reppMinimumRegionsForDurability,
            cluster_regions=cluster_regions,
        )

    @property
    def default_location(self) -> str:
        """Where a bookie no rack source knows is placed, as upstream's resolver does."""
        if self.kind is PolicyKind.ZONEAWARE:
            return DEFAULT_ZONE_UPGRADE_DOMAIN
        if self.kind is PolicyKind.REGIONAWARE:
            return DEFAULT_REGION_RACK
        return DEFAULT_RACK

    def check(
        self, ensemble: Sequence[str], write_quorum: int, locations: Mapping[str, str]
    ) -> EnsembleVerdict:
        """The adherence of one ensemble; `locations` maps bookie ids to network locations."""
        if self.kind is PolicyKind.DEFAULT:
            return _STRICT
        if not ensemble:
            return EnsembleVerdict(Adherence.FAIL, "empty ensemble")
        default = self.default_location

        def loc(bookie: str) -> str:
            return locations.get(bookie) or default

        if self.kind is PolicyKind.RACKAWARE:
            return self._rackaware(ensemble, write_quorum, loc)
        if self.kind is PolicyKind.ZONEAWARE:
            return self._zoneaware(ensemble, write_quorum, loc)
        return self._regionaware(ensemble, write_quorum, loc)

    def _rackaware(self, ensemble: Sequence[str], wq: int, loc: _Locate) -> EnsembleVerdict:
        required = min(wq, self.min_racks_per_write_quorum)
        for start, window in _windows(ensemble, wq):
            locs = tuple(loc(b) for b in window)
            racks = set(locs)
            if len(racks) < required:
                return EnsembleVerdict(
                    Adherence.FAIL,
                    f"write quorum spans {len(racks)} rack(s), needs {required}",
                    start,
                    window,
                    locs,
                )
            if self.enforce_min_racks_per_write_quorum and DEFAULT_RACK in racks:
                return EnsembleVerdict(
                    Adherence.FAIL,
                    f"write quorum has a bookie in {DEFAULT_RACK} and "
                    "enforceMinNumRacksPerWriteQuorum is set",
                    start,
                    window,
                    locs,
                )
        return _STRICT

    def _zoneaware(self, ensemble: Sequence[str], wq: int, loc: _Locate) -> EnsembleVerdict:
        size = len(ensemble)
        if wq <= 0 or size % wq != 0:
            return EnsembleVerdict(
                Adherence.FAIL, f"ensemble size {size} is not a multiple of write quorum {wq}"
            )
        if wq <= self.min_zones_per_write_quorum:
            return EnsembleVerdict(
                Adherence.FAIL,
                f"write quorum {wq} is not above minNumZonesPerWriteQuorum "
                f"{self.min_zones_per_write_quorum}",
            )
        desired = min(wq, self.desired_zones_per_write_quorum)
        soft: EnsembleVerdict | None = None
        for start, window in _windows(ensemble, wq):
            locs = tuple(loc(b) for b in window)
            resolved = [zone_and_domain(x) for x in locs]
            unresolved = [b for b, r in zip(window, resolved, strict=True) if r is None]
            if unresolved:
                return EnsembleVerdict(
                    Adherence.FAIL,
                    f"bookie(s) without a /zone/upgradedomain location: {', '.join(unresolved)}",
                    start,
                    window,
                    locs,
                )
            members: dict[str, int] = {}
            domains: dict[str, set[str]] = {}
            for r in resolved:
                assert r is not None
                members[r[0]] = members.get(r[0], 0) + 1
                domains.setdefault(r[0], set()).add(r[1])
            if len(members) < self.min_zones_per_write_quorum:
                return EnsembleVerdict(
                    Adherence.FAIL,
                    f"write quorum spans {len(members)} zone(s), needs "
                    f"{self.min_zones_per_write_quorum}",
                    start,
                    window,
                    locs,
                )
            crowded = sorted(z for z, n in members.items() if n > 1 and len(domains[z]) < 2)
            if crowded:
                return EnsembleVerdict(
                    Adherence.FAIL,
                    f"zone(s) {', '.join(crowded)} hold several bookies of the write quorum "
                    "in a single upgrade domain",
                    start,
                    window,
                    locs,
                )
            if len(members) < desired and soft is None:
                soft = EnsembleVerdict(
                    Adherence.MEETS_SOFT,
                    f"write quorum spans {len(members)} zone(s), desired {desired}",
                    start,
                    window,
                    locs,
                )
        return soft or _STRICT

    def _regionaware(self, ensemble: Sequence[str], wq: int, loc: _Locate) -> EnsembleVerdict:
        regions_in_cluster = len(self.cluster_regions)
        required = min(wq, self.min_regions_for_durability, regions_in_cluster)
        if regions_in_cluster < 2 or required < 2:
            return _STRICT
        for start, window in _windows(ensemble, wq):
            locs = tuple(loc(b) for b in window)
            regions = {r for r in (region_of(x) for x in locs) if r is not None}
            if len(regions) < required:
                return EnsembleVerdict(
                    Adherence.FAIL,
                    f"write quorum spans {len(regions)} known region(s), needs {required} "
                    f"(the cluster has {regions_in_cluster})",
                    start,
                    window,
                    locs,
                )
        return _STRICT


def skip_reason(md: LedgerMetadata) -> SkipReason | None:
    """Why the placement check leaves a ledger alone: only closed ledgers are judged.

    An open ledger's last ensemble may still change (and upstream skips them
    too); closed ledgers are judged even when empty, as upstream does.
    """
    if md.state is LedgerState.OPEN:
        return SkipReason.OPEN
    if md.state is LedgerState.IN_RECOVERY:
        return SkipReason.IN_RECOVERY
    return None


@dataclass(frozen=True, slots=True)
class SegmentVerdict:
    first_entry_id: int
    ensemble: tuple[str, ...]
    verdict: EnsembleVerdict

    def to_json(self) -> dict[str, Any]:
        return {"first_entry": self.first_entry_id, "ensemble": list(self.ensemble)} | (
            self.verdict.to_json()
        )


@dataclass(frozen=True, slots=True)
class LedgerPlacement:
    """A ledger's verdict: the worst segment decides; `segments` are those that decided it."""

    ledger_id: int
    policy: PolicyKind
    adherence: Adherence
    write_quorum: int
    ack_quorum: int
    segments: tuple[SegmentVerdict, ...]

    @property
    def category(self) -> Category | None:
        if self.adherence is Adherence.FAIL:
            return Category.PLACEMENT_NOT_ADHERING
        if self.adherence is Adherence.MEETS_SOFT:
            return Category.PLACEMENT_SOFTLY_ADHERING
        return None

    def detail(self) -> dict[str, Any]:
        return {
            "policy": self.policy.value,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "segments": [s.to_json() for s in self.segments],
        }


def analyse_ledger(
    md: LedgerMetadata, policy: PlacementPolicy, locations: Mapping[str, str]
) -> LedgerPlacement:
    """Judges every segment's ensemble with the ledger's write quorum.

    The ledger is as bad as its worst segment. For a FAIL, every failing
    segment is listed (an operator fixes them all at once); for a soft verdict,
    every soft segment.
    """
    verdicts = [
        SegmentVerdict(
            seg.first_entry_id, seg.bookies, policy.check(seg.bookies, md.write_quorum, locations)
        )
        for seg in md.segments
    ]
    worst = min((v.verdict.adherence for v in verdicts), default=Adherence.MEETS_STRICT)
    deciding = tuple(v for v in verdicts if v.verdict.adherence is worst)
    return LedgerPlacement(
        md.ledger_id,
        policy.kind,
        worst,
        md.write_quorum,
        md.ack_quorum,
        deciding if worst is not Adherence.MEETS_STRICT else (),
    )
