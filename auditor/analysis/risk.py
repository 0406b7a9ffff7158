"""An operator deciding what to repair first needs to know which one more loss would make
which ledgers worse than they are today; the answer is worked out here without I/O, so the
daemon, the CLI, `risk --from-snapshot` and the Pulsar audit all get the same one.

Which single bookie, rack or region loss would hurt which ledgers: the pure risk core.

For a closed ledger, an entry is hurt by a loss when its copies that survive
fall below the ack quorum (`below_ack_quorum`) or to zero (`no_copy`). The
question is asked for one more loss *given today's state*: bookies that are
already lost (neither writable nor read-only) count as gone before any domain
fails, because that is what an operator deciding what to repair first needs.
A domain is charged with a ledger only when its loss makes some entry worse
than it is today; an entry already below its ack quorum is the replicas and
bookie checks' business, and is counted separately (`already`).

Entries are never visited one by one. Round robin gives entry `e` the write
set `ensemble[(e + i) % E]` for `i < W`, so a segment has at most E distinct
write sets (fewer when it holds fewer than E entries), and the work per ledger
is segments x E x W whatever the number of entries.

Failure domains come from a bookie's network location (`racks.py`): the rack
domain is the whole location (`/rack`, `/region/rack`, or a zone-aware
`/zone/upgradedomain`), the region domain its first component when the
location has at least two (the region of `/region/rack`, the zone of
`/zone/upgradedomain`). A bookie no rack source knows (a policy default
location) belongs to no rack or region: "unknown" is not a place that can
fail as one, so such bookies only count as bookie domains.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterator, Set
from dataclasses import dataclass, field
from typing import Any

from auditor.metadata.model import LedgerMetadata
from auditor.timefmt import iso
from auditor.topology.locations import (
    DEFAULT_RACK,
    DEFAULT_REGION,
    DEFAULT_REGION_RACK,
    DEFAULT_ZONE_UPGRADE_DOMAIN,
)

#: Ledger ids kept per domain and severity (and per "already" severity): enough to act
#: on, and memory stays flat however many ledgers share the fate.
SAMPLE = 100

_DEFAULT_LOCATIONS = frozenset({DEFAULT_RACK, DEFAULT_REGION_RACK, DEFAULT_ZONE_UPGRADE_DOMAIN})


class Severity(enum.IntEnum):
    """How badly an entry is off after a loss; higher is worse."""

    OK = 0
    BELOW_ACK_QUORUM = 1
    NO_COPY = 2

    @property
    def label(self) -> str:
        return self.name.lower()


#: The severities a report lists, worst last.
SEVERITIES = (Severity.BELOW_ACK_QUORUM, Severity.NO_COPY)


class Domain(enum.StrEnum):
    BOOKIE = "bookie"
    RACK = "rack"
    REGION = "region"


DOMAINS = (Domain.BOOKIE, Domain.RACK, Domain.REGION)

DomainKey = tuple[Domain, str]


@dataclass(frozen=True, slots=True)
class Place:
    """The failure domains a bookie belongs to besides itself (None: unknown)."""

    rack: str | None
    region: str | None


UNKNOWN_PLACE = Place(None, None)


def place_of(location: str | None) -> Place:
    """The rack and region of a network location (see the module docstring)."""
    if not location or location in _DEFAULT_LOCATIONS:
        return UNKNOWN_PLACE
    parts = [p for p in location.split("/") if p]
    region = parts[0] if len(parts) >= 2 and "/" + parts[0] != DEFAULT_REGION else None
    return Place(location, region)


def severity(copies: int, ack_quorum: int) -> Severity:
    if copies <= 0:
        return Severity.NO_COPY
    if copies < ack_quorum:
        return Severity.BELOW_ACK_QUORUM
    return Severity.OK


def write_sets(md: LedgerMetadata) -> Iterator[tuple[str, ...]]:
    """The distinct write sets of every entry the ledger holds, segment by segment.

    A write set appears once per segment that uses it (duplicates across
    segments do no harm: the caller takes maxima).
    """
    for seg in md.segment_ranges():
        if seg.empty or not seg.bookies:
            continue
        size = len(seg.bookies)
        wq = max(1, min(md.write_quorum, size))
        count = seg.last - seg.first + 1
        residues = range(size) if count >= size else {(seg.first + k) % size for k in range(count)}
        yield from dict.fromkeys(
            tuple(seg.bookies[(r + i) % size] for i in range(wq)) for r in sorted(residues)
        )


def worst_severity(md: LedgerMetadata, gone: Callable[[str], bool]) -> Severity:
    """The worst entry of the ledger when the bookies `gone` says are gone are gone."""
    worst = Severity.OK
    for ws in write_sets(md):
        left = sum(1 for b in ws if not gone(b))
        worst = max(worst, severity(left, md.ack_quorum))
        if worst is Severity.NO_COPY:
            break
    return worst


@dataclass(frozen=True, slots=True)
class LedgerRisk:
    """One ledger: its state today and the domains whose loss would make it worse."""

    ledger_id: int
    already: Severity
    #: (domain, name) -> the severity that domain's loss would bring, only if worse.
    domains: tuple[tuple[DomainKey, Severity], ...]

    @property
    def worst(self) -> Severity:
        return max((s for _, s in self.domains), default=Severity.OK)


def domain_keys(bookie: str, place: Place) -> tuple[DomainKey, ...]:
    """The domains whose loss takes `bookie` with it."""
    keys: list[DomainKey] = [(Domain.BOOKIE, bookie)]
    if place.rack is not None:
        keys.append((Domain.RACK, place.rack))
    if place.region is not None:
        keys.append((Domain.REGION, place.region))
    return tuple(keys)


#: Severities by their int value, without the enum call in the hot loop.
_SEVERITY = (Severity.OK, Severity.BELOW_ACK_QUORUM, Severity.NO_COPY)

WriteSets = tuple[tuple[str, ...], ...]
ShapeRisk = tuple[Severity, tuple[tuple[DomainKey, Severity], ...]]


def shape_risk(
    sets: WriteSets,
    ack_quorum: int,
    keys_of: Callable[[str], tuple[DomainKey, ...]],
    available: Set[str],
) -> ShapeRisk:
    """Today's severity and the domains that would make it worse, for these write sets.

    Ledgers with the same write sets and ack quorum share the answer (the
    driver memoises it). `keys_of` gives a bookie's `domain_keys`. Severities
    are plain ints in the loop: this runs for every closed ledger on every report.
    """
    already = 0
    worst: dict[DomainKey, int] = {}
    for ws in sets:
        alive = [b for b in ws if b in available]
        left = len(alive)
        before = 2 if left <= 0 else (1 if left < ack_quorum else 0)
        already = max(already, before)
        if before == 2:
            continue
        hits: dict[DomainKey, int] = {}
        for b in alive:
            for key in keys_of(b):
                hits[key] = hits.get(key, 0) + 1
        for key, n in hits.items():
            rest = left - n
            after = 2 if rest <= 0 else (1 if rest < ack_quorum else 0)
            if after > before and after > worst.get(key, 0):
                worst[key] = after
    return _SEVERITY[already], tuple((k, _SEVERITY[v]) for k, v in worst.items())


def ledger_risk(
    md: LedgerMetadata,
    keys_of: Callable[[str], tuple[DomainKey, ...]],
    available: Set[str],
) -> LedgerRisk:
    """The risk of one closed ledger; bookies not in `available` are already gone."""
    already, domains = shape_risk(tuple(write_sets(md)), md.ack_quorum, keys_of, available)
    return LedgerRisk(md.ledger_id, already, domains)


# --- aggregation --------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    """Ledgers per severity, with the first SAMPLE ids of each (in the order added)."""

    counts: dict[Severity, int] = field(default_factory=lambda: dict.fromkeys(SEVERITIES, 0))
    samples: dict[Severity, list[int]] = field(default_factory=lambda: {s: [] for s in SEVERITIES})

    def add(self, ledger_id: int, sev: Severity) -> None:
        if sev is Severity.OK:
            return
        self.counts[sev] += 1
        if len(self.samples[sev]) < SAMPLE:
            self.samples[sev].append(ledger_id)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_json(self) -> dict[str, Any]:
        return {
            s.label: {"count": self.counts[s], "ledgers": list(self.samples[s])} for s in SEVERITIES
        }


@dataclass
class RiskReport:
    """Everything a risk run found; memory follows bookies and racks, not ledgers."""

    started_at: float
    finished_at: float = 0.0
    ledgers_checked: int = 0
    ledgers_skipped: Counter[str] = field(default_factory=Counter)
    metadata_invalid: int = 0
    #: Bookies counted as already lost (named by some ensemble, not available).
    lost_bookies: list[str] = field(default_factory=list)
    #: Bookies with no known location: they count as bookie domains only.
    unlocated_bookies: list[str] = field(default_factory=list)
    #: Ledgers below their ack quorum or with no copy today, before any further loss.
    already: Tally = field(default_factory=Tally)
    #: Ledgers some single loss would hurt, at the worst severity any would bring.
    at_risk: Tally = field(default_factory=Tally)
    domains: dict[DomainKey, Tally] = field(default_factory=dict)
    #: Why the rack sources could not be read: every bookie counts as unlocated (its own
    #: domain only), so rack losses are not judged; the run says so and exits non-zero.
    racks_unreadable: str | None = None

    def add(self, lr: LedgerRisk) -> None:
        self.ledgers_checked += 1
        self.already.add(lr.ledger_id, lr.already)
        self.at_risk.add(lr.ledger_id, lr.worst)
        for key, sev in lr.domains:
            tally = self.domains.get(key)
            if tally is None:
                tally = self.domains[key] = Tally()
            tally.add(lr.ledger_id, sev)

    def top(self, domain: Domain, n: int) -> list[tuple[str, Tally]]:
        """The `n` domains of a kind whose loss hurts the most ledgers (then the most
        ledgers left with no copy, then by name)."""
        found = [(name, t) for (d, name), t in self.domains.items() if d is domain]
        found.sort(key=lambda x: (-x[1].total, -x[1].counts[Severity.NO_COPY], x[0]))
        return found[:n]

    def domains_at_risk(self) -> dict[str, int]:
        counts = Counter(d for d, _ in self.domains)
        return {str(d): counts[d] for d in DOMAINS}

    @property
    def has_risk(self) -> bool:
        return bool(self.domains)

    def to_json(self, top: int) -> dict[str, Any]:
        return {
            "report": "risk",
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "ledgers_checked": self.ledgers_checked,
            "ledgers_skipped": {k: n for k, n in sorted(self.ledgers_skipped.items()) if n},
            "metadata_invalid": self.metadata_invalid,
            "lost_bookies": sorted(self.lost_bookies),
            "unlocated_bookies": sorted(self.unlocated_bookies),
            "racks_unreadable": self.racks_unreadable,
            "already": self.already.to_json(),
            "at_risk": self.at_risk.to_json(),
            "domains_at_risk": self.domains_at_risk(),
            "top": {
                str(d): [
                    {"name": name, "ledgers": t.total, **t.to_json()}
                    for name, t in self.top(d, top)
                ]
                for d in DOMAINS
            },
        }
