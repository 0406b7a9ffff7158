"""The CLI, the daemon and the Spark job report the same checks, and dashboards and scripts
read what they report, so a finding has one shape and one JSON form wherever it was made.

What a check finds, in one shape for the CLI, the daemon and the Spark job.

A check produces one `CheckReport`: how many ledgers it analysed and skipped
(and why), one `Violation` per (ledger, category) with the evidence an operator
needs to act on it, and what it marked. The JSON form is the `check --json`
contract documented in the README; every category of a check is present in
`counts`, zeros included, so dashboards never see a missing series.

A bad znode that is no ledger (a corrupt under-replication mark, a ledger
znode whose path spells an id beyond 2^63-1) has no ledger id to hang a
`Violation` on, yet it is a finding all the same: it is an `InvalidZnode` of
the report (path and reason), kept like violations are (every one counted,
the first `checks.max_violations_listed` listed), and it makes `check` exit 1.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from auditor.checks.owners import Owner
from auditor.checks.tally import ViolationLog

# Re-exported: a report is read with its violations and their categories.
from auditor.checks.violation import Category as Category
from auditor.checks.violation import Violation as Violation
from auditor.timefmt import iso as _iso


class Check(enum.StrEnum):
    BOOKIES = "bookies"
    LEDGERS = "ledgers"
    PLACEMENT = "placement"
    REPLICAS = "replicas"
    GRACE = "grace"
    #: Decoding every ledger's metadata, nothing else (scan and `check metadata`;
    #: the other checks report undecodable metadata too, so the daemon does not run it).
    METADATA = "metadata"
    #: Pulsar's references against BookKeeper's ledgers (`pulsar_audit.py`): off by
    #: default, so not in `ALL_CHECKS`; run on request (`pulsar-audit`).
    PULSAR = "pulsar"
    #: The deep scrub (`scrub.py`): every copy of every entry read and verified; costly,
    #: so not in `ALL_CHECKS`; run on request (`check scrub`).
    SCRUB = "scrub"


#: The order `check all` runs them in (and the daemon's checks): `metadata` is not among
#: them, since every one of these reports undecodable metadata on its own walk.
ALL_CHECKS = (Check.BOOKIES, Check.LEDGERS, Check.PLACEMENT, Check.REPLICAS, Check.GRACE)


CATEGORIES: dict[Check, tuple[Category, ...]] = {
    Check.REPLICAS: (
        Category.NO_REPLICA,
        Category.BELOW_ACK_QUORUM,
        Category.BELOW_WRITE_QUORUM,
        Category.BOOKIE_UNAVAILABLE_REGISTERED,
        Category.UNDERREPLICATED_PAST_GRACE_PERIOD,
        Category.METADATA_INVALID,
    ),
    Check.PLACEMENT: (
        Category.PLACEMENT_NOT_ADHERING,
        Category.PLACEMENT_SOFTLY_ADHERING,
        Category.METADATA_INVALID,
    ),
    Check.GRACE: (Category.UNDERREPLICATED_PAST_GRACE_PERIOD, Category.METADATA_INVALID),
    Check.BOOKIES: (Category.LEDGERS_ON_LOST_BOOKIES, Category.METADATA_INVALID),
    Check.LEDGERS: (Category.UNREADABLE_FRAGMENTS, Category.METADATA_INVALID),
    Check.METADATA: (Category.METADATA_INVALID,),
    Check.SCRUB: (
        Category.CORRUPT_COPY,
        Category.DIVERGENT_COPIES,
        Category.UNREADABLE_COPY,
        Category.METADATA_INVALID,
    ),
    Check.PULSAR: (
        Category.MISSING,
        Category.ORPHAN,
        Category.DANGLING_CURSOR,
        Category.METADATA_INVALID,
    ),
}


class SkipReason(enum.StrEnum):
    OPEN = "open"
    IN_RECOVERY = "in_recovery"
    EMPTY = "empty"
    UNDERREPLICATED = "underreplicated"
    DELETED = "deleted"
    BOOKIES_UNREGISTERED = "bookies_unregistered"
    METADATA_CHANGING = "metadata_changing"
    REPLICATION_DISABLED = "replication_disabled"
    NO_CTIME = "no_ctime"
    GRACE_PERIOD_DISABLED = "grace_period_disabled"


class DropCause(enum.StrEnum):
    """Why a would-be violation was not reported (false-alarm accounting).

    A ledger counts at most once per check run, under the cause that finally
    set its would-be violation aside, and only when nothing was reported for
    it in the end (a ledger judged again and still in violation is no drop).
    """

    #: The metadata was re-read before reporting and had a new znode version;
    #: judged again with it, the ledger was fine (or kept changing: skipped
    #: `metadata_changing`).
    METADATA_CHANGED = "metadata_changed"
    #: The ledger was deleted between the analysis and the report.
    LEDGER_DELETED = "ledger_deleted"
    #: A bookie that did not answer answered on a delayed re-check, and the ledger was fine.
    RETRY_SUCCEEDED = "retry_succeeded"
    #: The fresh look before reporting found an under-replication mark made
    #: during the run (within its grace period): re-replication has it in hand.
    MARKED_MEANWHILE = "marked_meanwhile"
    #: Bookie check: every lost bookie of the ledger registered again before the report.
    BOOKIE_RETURNED = "bookie_returned"
    #: Pulsar audit: a fresh read of Pulsar's metadata no longer supports the finding
    #: (the ledger was trimmed or offloaded, or an orphan was added to a managed ledger).
    REFERENCES_CHANGED = "references_changed"


#: The drop causes each check can produce (the metric's series exist for these).
DROP_CAUSES: dict[Check, tuple[DropCause, ...]] = {
    Check.REPLICAS: (
        DropCause.METADATA_CHANGED,
        DropCause.LEDGER_DELETED,
        DropCause.RETRY_SUCCEEDED,
        DropCause.MARKED_MEANWHILE,
    ),
    Check.LEDGERS: (DropCause.METADATA_CHANGED, DropCause.LEDGER_DELETED),
    Check.BOOKIES: (
        DropCause.BOOKIE_RETURNED,
        DropCause.METADATA_CHANGED,
        DropCause.LEDGER_DELETED,
    ),
    Check.PLACEMENT: (),
    Check.GRACE: (),
    Check.METADATA: (),
    Check.SCRUB: (
        DropCause.METADATA_CHANGED,
        DropCause.LEDGER_DELETED,
        DropCause.RETRY_SUCCEEDED,
        DropCause.MARKED_MEANWHILE,
    ),
    Check.PULSAR: (
        DropCause.REFERENCES_CHANGED,
        DropCause.LEDGER_DELETED,
        DropCause.METADATA_CHANGED,
    ),
}


@dataclass(slots=True)
class Coverage:
    """(ledger, bookie) pairs of the replicas check, by how they were verified."""

    listed: int = 0
    probed: int = 0
    unverified: int = 0

    def to_json(self) -> dict[str, int]:
        return {"listed": self.listed, "probed": self.probed, "unverified": self.unverified}


@dataclass(slots=True)
class ScrubCoverage:
    """What a deep scrub read: entries, copies verified (and their payload bytes), copies
    the bookie said it lacks (missing: the replicas check's finding), copies not verified
    (no answer after the re-checks)."""

    entries: int = 0
    copies_verified: int = 0
    bytes_verified: int = 0
    copies_absent: int = 0
    copies_unverified: int = 0

    def add(self, other: ScrubCoverage) -> None:
        self.entries += other.entries
        self.copies_verified += other.copies_verified
        self.bytes_verified += other.bytes_verified
        self.copies_absent += other.copies_absent
        self.copies_unverified += other.copies_unverified

    def to_json(self) -> dict[str, int]:
        return {
            "entries": self.entries,
            "copies_verified": self.copies_verified,
            "bytes_verified": self.bytes_verified,
            "copies_absent": self.copies_absent,
            "copies_unverified": self.copies_unverified,
        }


class Outcome(enum.StrEnum):
    """How one ledger came out of one check (a scan's per-ledger coverage)."""

    OK = "ok"
    VIOLATION = "violation"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class LedgerOutcome:
    check: Check
    ledger_id: int
    outcome: Outcome
    skip_reason: str | None = None
    #: Znode version of the metadata judged (-1 when not read, e.g. a mark only).
    metadata_version: int = -1
    #: Replicas check: ensemble bookies whose copies were listed, probed, or unverified.
    listed: int = 0
    probed: int = 0
    unverified: int = 0


@dataclass(frozen=True, slots=True)
class PendingMark:
    """A mark a check wants written, held back for a scan's driver to write once."""

    check: Check
    ledger_id: int
    missing: tuple[str, ...]


def _order(v: Violation) -> tuple[int, str, str]:
    return (v.ledger_id, str(v.category), v.bookie or "")


@dataclass(frozen=True, slots=True)
class InvalidZnode:
    """A znode a check read that names no valid ledger or mark: where it is and what is wrong."""

    path: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


class InvalidZnodeLog:
    """A report's invalid znodes: every one counted, the first `limit` (by path) listed.

    `limit` 0 lists them all; None until the report gives it its violations' limit
    (`checks.max_violations_listed`), so both are bounded by the one setting.
    """

    __slots__ = ("_kept", "_sorted", "limit", "total")

    def __init__(self, items: Iterable[InvalidZnode] = (), *, limit: int | None = None) -> None:
        self.limit = limit
        #: Invalid znodes found, listed or not.
        self.total = 0
        self._kept: list[InvalidZnode] = []
        self._sorted = True
        for z in items:
            self.append(z)

    def append(self, z: InvalidZnode) -> None:
        self.total += 1
        self._kept.append(z)
        self._sorted = False
        if self.limit and len(self._kept) >= 2 * self.limit:
            self.listed()

    def count_unlisted(self, n: int) -> None:
        """Counts `n` more that cannot be listed (a walk keeps only its first ones)."""
        self.total += max(n, 0)

    def merge(self, other: InvalidZnodeLog) -> None:
        """Adds another part's (partitions name disjoint znodes); this log's limit holds."""
        self.total += other.total
        self._kept.extend(other.listed())
        self._sorted = False

    def listed(self) -> list[InvalidZnode]:
        """The first `limit` by path (all when unlimited)."""
        if not self._sorted:
            self._kept.sort(key=lambda z: z.path)
            if self.limit:
                del self._kept[self.limit :]
            self._sorted = True
        return self._kept

    @property
    def truncated(self) -> bool:
        return self.total > len(self.listed())

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "listed": [z.to_json() for z in self.listed()]}

    @classmethod
    def from_json(cls, doc: Any) -> InvalidZnodeLog:
        """The report document's `invalid_znodes` (absent in documents older than it: none)."""
        if doc is None:
            return cls(limit=0)
        listed = [InvalidZnode(str(z["path"]), str(z["reason"])) for z in doc["listed"]]
        log = cls(listed, limit=len(listed) if int(doc["total"]) > len(listed) else 0)
        log.count_unlisted(int(doc["total"]) - len(listed))
        return log

    def __iter__(self) -> Iterator[InvalidZnode]:
        return iter(self.listed())

    def __len__(self) -> int:
        """Listed ones; `total` counts them all."""
        return len(self.listed())

    def __bool__(self) -> bool:
        return self.total > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, InvalidZnodeLog):
            return self.total == other.total and self.listed() == other.listed()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"InvalidZnodeLog(total={self.total}, listed={self.listed()!r})"


@dataclass
class CheckReport:
    check: Check
    started_at: float
    finished_at: float = 0.0
    ledgers_checked: int = 0
    ledgers_skipped: Counter[str] = field(default_factory=Counter)
    #: Every violation counted; the first `checks.max_violations_listed` listed.
    violations: ViolationLog = field(default_factory=ViolationLog)
    marked_underreplicated: list[int] = field(default_factory=list)
    lost_bookies: list[str] = field(default_factory=list)
    coverage: Coverage | None = None
    #: Would-be violations not reported, by `DropCause` (ledgers).
    dropped: Counter[str] = field(default_factory=Counter)
    #: Pulsar owners of flagged ledgers (see `owners.py`); reports group violations by them.
    owners: dict[int, Owner] = field(default_factory=dict)
    #: Bad znodes that name no ledger (corrupt marks, ledger paths beyond 2^63-1): every
    #: one counted, as many listed as violations are.
    invalid_znodes: InvalidZnodeLog = field(default_factory=InvalidZnodeLog)
    #: The deep scrub's reads (`Check.SCRUB` only).
    scrub: ScrubCoverage | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.violations, ViolationLog):
            # A plain list (documents, tests): listed in full.
            self.violations = ViolationLog(self.violations)
        if not isinstance(self.invalid_znodes, InvalidZnodeLog):
            self.invalid_znodes = InvalidZnodeLog(self.invalid_znodes, limit=0)
        if self.invalid_znodes.limit is None:
            self.invalid_znodes.limit = self.violations.limit

    def merge(self, other: CheckReport) -> None:
        """Adds a partial report of the same check (another partition or retry stage)."""
        if other.check is not self.check:
            raise ValueError(f"cannot merge a {other.check} report into a {self.check} report")
        self.started_at = min(self.started_at, other.started_at)
        self.finished_at = max(self.finished_at, other.finished_at)
        self.ledgers_checked += other.ledgers_checked
        self.ledgers_skipped.update(other.ledgers_skipped)
        self.violations.merge(other.violations)
        self.invalid_znodes.merge(other.invalid_znodes)
        self.dropped.update(other.dropped)
        self.marked_underreplicated.extend(other.marked_underreplicated)
        self.lost_bookies.extend(b for b in other.lost_bookies if b not in self.lost_bookies)
        if other.coverage is not None:
            mine = self.coverage if self.coverage is not None else Coverage()
            mine.listed += other.coverage.listed
            mine.probed += other.coverage.probed
            mine.unverified += other.coverage.unverified
            self.coverage = mine
        self.owners.update(other.owners)
        if other.scrub is not None:
            if self.scrub is None:
                self.scrub = ScrubCoverage()
            self.scrub.add(other.scrub)

    def counts(self) -> dict[str, int]:
        """Ledgers per category (a ledger counts once per category)."""
        return {c: self.violations.ledgers(c) for c in self._categories()}

    def _categories(self) -> list[str]:
        """The check's categories, then any other one that was found."""
        names = [str(c) for c in CATEGORIES[self.check]]
        return names + [c for c in self.violations.categories() if c not in names]

    def samples(self) -> dict[str, list[int]]:
        """Up to 100 smallest ledger ids per category, listed in full or not."""
        return {c: self.violations.samples(c) for c in self._categories()}

    @property
    def false_alarm_share(self) -> float:
        """Dropped / (dropped + reported), both in ledgers; 0.0 when nothing was flagged.

        Reported is the sum of `counts` (a ledger in two categories weighs two);
        dropped is the sum of `dropped` (a ledger at most once).
        """
        dropped = sum(self.dropped.values())
        flagged = dropped + sum(self.counts().values())
        return round(dropped / flagged, 6) if flagged else 0.0

    @property
    def has_violations(self) -> bool:
        return bool(self.violations)

    @property
    def has_findings(self) -> bool:
        """Violations or invalid znodes: what makes `check` exit 1."""
        return bool(self.violations) or bool(self.invalid_znodes)

    def _violation_json(self, v: Violation) -> dict[str, Any]:
        doc = v.to_json()
        owner = self.owners.get(v.ledger_id)
        if owner is not None:
            doc["owner"] = owner.to_json()
        return doc

    def by_owner(self) -> dict[str, dict[str, int]]:
        """Owner key -> category -> ledgers, for ledgers whose owner is known (sorted keys)."""
        seen: dict[str, dict[str, set[int]]] = {}
        for v in self.violations:
            owner = self.owners.get(v.ledger_id)
            if owner is not None:
                seen.setdefault(owner.key, {}).setdefault(str(v.category), set()).add(v.ledger_id)
        return {
            key: {cat: len(ids) for cat, ids in sorted(cats.items())}
            for key, cats in sorted(seen.items())
        }

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "check": str(self.check),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "ledgers_checked": self.ledgers_checked,
            "ledgers_skipped": {k: n for k, n in sorted(self.ledgers_skipped.items()) if n},
            "counts": self.counts(),
            "violations": [
                self._violation_json(v)
                for v in sorted(self.violations, key=lambda v: (v.ledger_id, v.category))
            ],
            "marked_underreplicated": sorted(set(self.marked_underreplicated)),
            "violations_total": self.violations.total,
            "violations_truncated": self.violations.truncated,
            "samples": self.samples(),
            "would_be_violations_dropped": {k: n for k, n in sorted(self.dropped.items()) if n},
            "false_alarm_share": self.false_alarm_share,
            "invalid_znodes": self.invalid_znodes.to_json(),
        }
        if self.owners:
            out["by_owner"] = self.by_owner()
        if self.check is Check.BOOKIES:
            out["lost_bookies"] = sorted(self.lost_bookies)
        if self.check is Check.REPLICAS:
            out["coverage"] = (self.coverage or Coverage()).to_json()
        if self.check is Check.SCRUB:
            out["scrub"] = (self.scrub or ScrubCoverage()).to_json()
        return out


def metadata_invalid(
    ledger_id: int, path: str, version: int, reason: str, **extra: Any
) -> Violation:
    """`metadata_invalid`, the same evidence in every check: where, which version, why."""
    return Violation(
        ledger_id,
        Category.METADATA_INVALID,
        None,
        {"reason": reason, "path": path, "metadata_version": version, **extra},
    )
