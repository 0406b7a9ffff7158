"""Pulsar may reference ledgers BookKeeper has lost, and leave behind ledgers it no longer
references; neither side's own checks can see that, only the join of Pulsar's references
with BookKeeper's ledgers can.

The Pulsar audit's pure core: Pulsar's references joined with BookKeeper's ledgers.

No I/O: the driver (`pulsar_audit_run.py`), the CLI's `pulsar-audit`, the
daemon and the Spark scan hand in what they read, as plain values, and get
findings back. Three categories:

* `missing`: a ledger Pulsar references (a managed ledger's data ledger, a
  schema or compacted ledger, a cursor's ledger) that is not offloaded and
  either has no BookKeeper metadata or has entries of which every copy is gone
  (the replicas check's `no_replica` ranges): data loss for that topic.
  A ledger whose data is in tiered storage (some reference says `offloaded`)
  is never missing: its BookKeeper copy may go.
* `dangling_cursor`: a ledger only cursors reference, with no metadata: the
  cursor's stored positions are gone (a cursor ledger that exists but lost
  entries is `missing`, like any other ledger).
* `orphan`: a ledger Pulsar created (`application=pulsar` or Pulsar's owner
  keys in its custom metadata, see `owners.py`) that nothing in Pulsar's
  metadata references, older than the grace period. Reported with the
  `bookkeeper shell deleteledger` command that would delete it; the auditor
  never deletes anything.

Decisions (documented in the README and the runbook):

* **Grace period.** `DEFAULT_ORPHAN_GRACE_MS`, 24 hours: Pulsar adds a ledger
  to a managed ledger's list right after creating it, and deletes trimmed
  ledgers after removing them from the list (offloaded ones only after
  `managedLedgerOffloadDeletionLagMs`, 4 hours by default); a day is well past
  every window in which a healthy broker holds an unlisted ledger.
* **Ledgers without a creation time** (`ctime` neither in the metadata nor from
  the znode): never reported as orphans, since nothing says they are not a
  second old and the finding comes with a delete command. They are counted
  (`unaged`, with sample ids) in the rollups so that such a leak is not invisible.
* **Open ledgers' size.** BookKeeper writes `length` only when a ledger closes,
  so an open (or in-recovery) ledger's size is unknown: a referenced one is
  counted with the size Pulsar recorded for it (`LedgerInfo.size`) if any, an
  orphan with none; either way the ledger is counted as `unsized` in the
  rollups and its detail says `size_known: false`.
* **Pulsar metadata that could not be read.** When the read named bad znodes
  (`PulsarRefs.bad_znodes`), an orphan whose owner's references might be in
  them (its managed ledger or schema was not read, or a bad znode's path names
  it) is held back (`orphans_held`), not reported: a reference we could not
  read is no proof of a leak. So is a compacted ledger of a topic that still
  exists, or a schema ledger of a schema that still exists: Pulsar may name it
  where ZooKeeper does not show (the compaction cursor's properties kept in its
  cursor ledger, schema versions trimmed from the locator's index). A compacted
  ledger of a deleted topic is reported as any orphan.

Streaming: `PulsarAuditor` sees ledgers one at a time (a scan partition sees
an id range), keeps mergeable partial results (orphans and entry losses of the
ledgers it saw, the referenced ids it saw, the rollups' counters), and
`finish` on the driver adds what only the whole can tell: referenced ids no
partition saw are `missing` or `dangling_cursor`. Findings are candidates until
`confirm` has looked again (BP-34 style): a ledger Pulsar trimmed between the
reads is not missing, a ledger just added to a managed ledger is not an orphan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field, fields, replace
from typing import Any

from auditor.checks.findings import Category, DropCause, Violation
from auditor.checks.owners import APPLICATION, Owner, owner_of
from auditor.metadata.model import LedgerMetadata, LedgerState
from auditor.metadata.pulsar.naming import (
    managed_ledger_of_named_topic,
    namespace_of_managed_ledger,
    namespace_of_schema_id,
    namespace_of_topic,
    topic_of_schema_id,
)
from auditor.metadata.pulsar.refs import LedgerRef, PulsarRefs, RefKind
from auditor.timefmt import iso

#: A ledger Pulsar created but references nowhere is an orphan once this old (ms).
DEFAULT_ORPHAN_GRACE_MS = 24 * 3600 * 1000
#: What Pulsar writes under `application` on the ledgers it creates.
PULSAR_APPLICATION = "pulsar"
#: Rows a rollup lists per table, and sample ids kept per list.
ROLLUP_ROWS = 100
SAMPLE = 100
#: Namespace and topic of ledgers whose owner is not known.
UNKNOWN = "(unknown)"

_REF_ORDER = {kind: i for i, kind in enumerate(RefKind)}


def delete_command(ledger_id: int) -> str:
    """BookKeeper's shell command that deletes a ledger (`BookieShell`'s `DeleteLedgerCmd`)."""
    return f"bookkeeper shell deleteledger -ledgerid {ledger_id} -force"


# --- inputs ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LedgerFact:
    """What the audit needs of one ledger that exists in BookKeeper."""

    ledger_id: int
    #: The owner its custom metadata names (`owners.owner_of`), if any.
    owner: Owner | None = None
    #: Pulsar created it: `application=pulsar`, or Pulsar's owner keys.
    pulsar: bool = False
    #: Creation time (ms): the metadata's, else the znode's; None when neither is known.
    ctime_ms: int | None = None
    #: BookKeeper's `length` (bytes); meaningful only for a closed ledger.
    length: int = 0
    closed: bool = True
    bookies: tuple[str, ...] = ()

    @property
    def size(self) -> int | None:
        """Bytes, when known (closed ledgers)."""
        return self.length if self.closed else None


def created_by_pulsar(custom_metadata: Iterable[tuple[str, bytes]], owner: Owner | None) -> bool:
    if owner is not None:
        return True
    return any(k == APPLICATION and v == PULSAR_APPLICATION.encode() for k, v in custom_metadata)


def fact_of(md: LedgerMetadata) -> LedgerFact:
    """The fact of a decoded ledger (`md.ctime` already falls back to the znode's ctime)."""
    owner = owner_of(md.custom_metadata)
    bookies = sorted({b for seg in md.segments for b in seg.bookies})
    return LedgerFact(
        md.ledger_id,
        owner,
        created_by_pulsar(md.custom_metadata, owner),
        md.ctime if md.ctime >= 0 else None,
        md.length,
        md.state is LedgerState.CLOSED,
        tuple(bookies),
    )


#: A failure domain as the risk report names it: (`bookie` | `rack` | `region`, name).
DomainName = tuple[str, str]


@dataclass(frozen=True, slots=True)
class LedgerVerdicts:
    """What the other checks (and the risk core) said of one ledger; all optional."""

    #: The replicas check's `no_replica` ranges (inclusive): entries with no copy left.
    no_replica: tuple[tuple[int, int], ...] = ()
    #: An under-replication mark exists.
    marked: bool = False
    #: The replicas check reported it (any durability category).
    replicas_violation: bool = False
    #: The placement check reported it (`placement_not_adhering` or softly).
    unplaced: bool = False
    #: The failure domains whose single loss would hurt it (`analysis.risk.LedgerRisk`).
    domains: tuple[DomainName, ...] = ()


# --- names (every rule of them is `metadata.pulsar.naming`'s) ------------------------------


def owner_place(owner: Owner | None) -> tuple[str, str]:
    """(namespace, topic) an orphan is counted under: its owner's, else `UNKNOWN`."""
    if owner is None:
        return UNKNOWN, UNKNOWN
    ns: str | None = None
    if owner.managed_ledger is not None:
        ns = namespace_of_managed_ledger(owner.managed_ledger)
    if ns is None and owner.topic is not None:
        ns = namespace_of_topic(owner.topic)
    if ns is None and owner.schema_id is not None and owner.schema_id.count("/") >= 2:
        ns = namespace_of_schema_id(owner.schema_id)
    topic = owner.topic or owner.managed_ledger
    if topic is None and owner.schema_id is not None:
        topic = topic_of_schema_id(owner.schema_id)
    return ns or UNKNOWN, topic or owner.key


def ref_topic(ref: LedgerRef) -> str:
    """The topic row a reference counts in: its topic; a schema's, the topic it is the
    schema of (`topic_of_schema_id`), else its owner as written."""
    if ref.topic is not None:
        return ref.topic
    if ref.kind is RefKind.SCHEMA:
        return topic_of_schema_id(ref.owner) or ref.owner
    return ref.owner


def _sorted_refs(refs: Iterable[LedgerRef]) -> list[LedgerRef]:
    return sorted(refs, key=lambda r: (_REF_ORDER[r.kind], r.owner, r.cursor or "", r.znode))


def _segments(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


def _names(path: str, name: str) -> bool:
    """Whether `path` is `name`'s znode, one below it, or one of its ancestors (a listing)."""
    p, n = _segments(path), _segments(name)
    if not n:
        return False
    for i in range(len(p)):
        tail = p[i:]
        if tail[: len(n)] == n or (len(tail) < len(n) and n[: len(tail)] == tail):
            return True
    return False


# --- findings ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
    """A candidate violation: `confirm` turns it into a reported one or drops it."""

    ledger_id: int
    category: Category
    #: missing / dangling_cursor: the references to it (sorted).
    refs: tuple[LedgerRef, ...] = ()
    #: missing: entries with no copy; empty when the ledger has no metadata at all.
    entries: tuple[tuple[int, int], ...] = ()
    #: orphan: the owner its custom metadata names.
    owner: Owner | None = None
    size: int | None = None
    ctime_ms: int | None = None

    @property
    def no_metadata(self) -> bool:
        return self.category is not Category.ORPHAN and not self.entries

    def places(self) -> tuple[set[str], set[str]]:
        """(namespaces, topics) the finding counts in."""
        if self.category is Category.ORPHAN:
            ns, topic = owner_place(self.owner)
            return {ns}, {topic}
        return {r.namespace for r in self.refs}, {ref_topic(r) for r in self.refs}

    def reread(self) -> tuple[frozenset[str], frozenset[str]]:
        """(managed ledgers, schema ids) whose references `confirm` needs read again."""
        mls: set[str] = set()
        schemas: set[str] = set()
        if self.category is Category.ORPHAN:
            o = self.owner
            if o is not None:
                if o.managed_ledger is not None:
                    mls.add(o.managed_ledger)
                if (
                    o.topic is not None
                    and (ml := managed_ledger_of_named_topic(o.topic)) is not None
                ):
                    mls.add(ml)
                if o.schema_id is not None:
                    schemas.add(o.schema_id)
        for r in self.refs:
            (schemas if r.kind is RefKind.SCHEMA else mls).add(r.owner)
        return frozenset(mls), frozenset(schemas)

    def violation(self, now_ms: int | None = None) -> Violation:
        return Violation(self.ledger_id, self.category, None, self.detail(now_ms))

    def detail(self, now_ms: int | None = None) -> dict[str, Any]:
        if self.category is Category.ORPHAN:
            ns, topic = owner_place(self.owner)
            out: dict[str, Any] = {
                "namespace": ns,
                "topic": topic,
                "kind": (self.owner.component if self.owner is not None else None),
                "owner": self.owner.to_json() if self.owner is not None else None,
                "size": self.size,
                "size_known": self.size is not None,
                "ctime": iso(self.ctime_ms / 1000) if self.ctime_ms is not None else None,
                "command": delete_command(self.ledger_id),
            }
            if now_ms is not None and self.ctime_ms is not None:
                out["age_s"] = max(0, now_ms - self.ctime_ms) // 1000
            return out
        first = self.refs[0]
        out = {
            "namespace": first.namespace,
            "topic": ref_topic(first),
            "kind": str(first.kind),
            "znode": first.znode,
        }
        if first.cursor is not None:
            out["cursor"] = first.cursor
        if self.category is Category.MISSING:
            if self.entries:
                out["reason"] = "no replica"
                out["entries"] = [list(r) for r in self.entries]
            else:
                out["reason"] = "no metadata"
            out["size"] = self.size
        out["references"] = [_ref_json(r) for r in self.refs]
        return out


def _ref_json(r: LedgerRef) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": str(r.kind), "owner": r.owner, "znode": r.znode}
    if r.topic is not None:
        out["topic"] = r.topic
    if r.cursor is not None:
        out["cursor"] = r.cursor
    return out


def _pulsar_size(refs: Iterable[LedgerRef]) -> int | None:
    return max((r.size for r in refs if r.size is not None), default=None)


def losses(
    ledger_id: int,
    refs: Iterable[LedgerRef],
    fact: LedgerFact | None,
    no_replica: tuple[tuple[int, int], ...],
) -> list[Finding]:
    """`missing` / `dangling_cursor` of one referenced ledger (`fact` None: no metadata)."""
    refs = _sorted_refs(refs)
    if not refs or any(r.offloaded for r in refs):
        return []
    if fact is not None:
        if not no_replica:
            return []
        return [Finding(ledger_id, Category.MISSING, tuple(refs), no_replica, size=fact.size)]
    cursors = [r for r in refs if r.kind is RefKind.CURSOR]
    others = [r for r in refs if r.kind is not RefKind.CURSOR]
    found: list[Finding] = []
    if others:
        found.append(Finding(ledger_id, Category.MISSING, tuple(refs), size=_pulsar_size(others)))
    elif cursors:
        found.append(Finding(ledger_id, Category.DANGLING_CURSOR, tuple(cursors)))
    return found


# --- rollups ----------------------------------------------------------------------------


@dataclass(slots=True)
class Counts:
    """One row of a rollup: ledgers and bytes by what is wrong with them."""

    ledgers: int = 0
    bytes: int = 0
    #: Ledgers counted without a known size (open; no size from Pulsar either).
    unsized: int = 0
    under_replicated: int = 0
    under_replicated_bytes: int = 0
    unplaced: int = 0
    unplaced_bytes: int = 0
    missing: int = 0
    missing_bytes: int = 0
    dangling_cursors: int = 0
    orphans: int = 0
    orphan_bytes: int = 0

    def merge(self, other: Counts) -> None:
        for name in _COUNT_FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_json(self) -> dict[str, int]:
        return {name: int(getattr(self, name)) for name in _COUNT_FIELDS}

    def weight(self) -> tuple[int, ...]:
        """Worst first: data lost, then at risk, then leaked, then size."""
        return (
            -self.missing,
            -self.dangling_cursors,
            -self.under_replicated,
            -self.unplaced,
            -self.orphans,
            -self.bytes,
        )


_COUNT_FIELDS = tuple(f.name for f in fields(Counts))


@dataclass(slots=True)
class Sample:
    count: int = 0
    ids: list[int] = field(default_factory=list)

    def add(self, ledger_id: int) -> None:
        self.count += 1
        self.ids.append(ledger_id)
        if len(self.ids) > 2 * SAMPLE:
            self._trim()

    def _trim(self) -> None:
        self.ids = sorted(set(self.ids))[:SAMPLE]

    def merge(self, other: Sample) -> None:
        self.count += other.count
        self.ids.extend(other.ids)
        self._trim()

    def to_json(self) -> dict[str, Any]:
        self._trim()
        return {"count": self.count, "ledgers": list(self.ids)}


@dataclass(slots=True)
class Rollup:
    """Per-topic and per-namespace tables, and which namespaces one loss would hurt."""

    topics: dict[str, Counts] = field(default_factory=dict)
    namespaces: dict[str, Counts] = field(default_factory=dict)
    #: (domain kind, name) -> namespace -> ledgers of it that domain's loss would hurt.
    at_risk: dict[DomainName, Counter[str]] = field(default_factory=dict)

    def rows(self, namespaces: Iterable[str], topics: Iterable[str]) -> list[Counts]:
        out = [self.namespaces.setdefault(ns, Counts()) for ns in sorted(set(namespaces))]
        out += [self.topics.setdefault(t, Counts()) for t in sorted(set(topics))]
        return out

    def merge(self, other: Rollup) -> None:
        for mine, theirs in ((self.topics, other.topics), (self.namespaces, other.namespaces)):
            for key, counts in theirs.items():
                mine.setdefault(key, Counts()).merge(counts)
        for domain, by_ns in other.at_risk.items():
            self.at_risk.setdefault(domain, Counter()).update(by_ns)

    def total(self) -> Counts:
        out = Counts()
        for c in self.namespaces.values():
            out.merge(c)
        return out

    def to_json(self, top: int = ROLLUP_ROWS) -> dict[str, Any]:
        """The worst `top` rows of each table (see `Counts.weight`), then by name."""

        def table(rows: dict[str, Counts], key: str) -> list[dict[str, Any]]:
            ordered = sorted(rows.items(), key=lambda kv: (kv[1].weight(), kv[0]))[:top]
            return [{key: name, **c.to_json()} for name, c in ordered]

        risk = sorted(
            self.at_risk.items(), key=lambda kv: (-len(kv[1]), -sum(kv[1].values()), kv[0])
        )[:top]
        return {
            "namespaces_total": len(self.namespaces),
            "topics_total": len(self.topics),
            "namespaces": table(self.namespaces, "namespace"),
            "topics": table(self.topics, "topic"),
            "at_risk": [
                {
                    "domain": kind,
                    "name": name,
                    "namespaces": len(by_ns),
                    "ledgers": sum(by_ns.values()),
                    "by_namespace": dict(
                        sorted(by_ns.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
                    ),
                }
                for (kind, name), by_ns in risk
            ],
        }


# --- the auditor ------------------------------------------------------------------------


@dataclass(slots=True)
class PulsarAudit:
    """What a whole run found: candidates (until `confirm`), rollups and counters."""

    findings: list[Finding]
    rollup: Rollup
    #: Ledgers observed (existing ones), referenced or not.
    ledgers_seen: int = 0
    #: Unreferenced Pulsar ledgers without a creation time: never orphans (see the module doc).
    unaged: Sample = field(default_factory=Sample)
    #: Unreferenced Pulsar ledgers whose references may be in unreadable znodes.
    orphans_held: Sample = field(default_factory=Sample)
    #: Unreferenced Pulsar ledgers younger than the grace period.
    young: int = 0
    #: Would-be findings `confirm` dropped, by `DropCause`.
    dropped: Counter[str] = field(default_factory=Counter)
    now_ms: int = 0

    def counted_rollup(self) -> Rollup:
        """The rollup with the findings' counts added (call after `confirm`)."""
        out = Rollup()
        out.merge(self.rollup)
        for f in self.findings:
            namespaces, topics = f.places()
            size = f.size or 0
            for c in out.rows(namespaces, topics):
                if f.category is Category.ORPHAN:
                    c.orphans += 1
                    c.orphan_bytes += size
                elif f.category is Category.MISSING:
                    c.missing += 1
                    c.missing_bytes += size
                else:
                    c.dangling_cursors += 1
        return out

    def violations(self) -> list[Violation]:
        """The findings as violations, by ledger id and category."""
        ordered = sorted(self.findings, key=lambda f: (f.ledger_id, str(f.category)))
        return [f.violation(self.now_ms) for f in ordered]

    def to_json(self, top: int = ROLLUP_ROWS) -> dict[str, Any]:
        rollup = self.counted_rollup()
        return {
            "ledgers_seen": self.ledgers_seen,
            "totals": rollup.total().to_json(),
            "orphans_unaged": self.unaged.to_json(),
            "orphans_held": self.orphans_held.to_json(),
            "unreferenced_young": self.young,
            **rollup.to_json(top),
        }


@dataclass(slots=True)
class PulsarPartial:
    """A partition's partial result without the refs (small to ship back from a worker)."""

    seen: set[int]
    findings: list[Finding]
    rollup: Rollup
    ledgers_seen: int
    unaged: Sample
    held: Sample
    young: int


#: The `component` Pulsar's brokers give a topic's compacted ledger (`LedgerMetadataUtils`).
COMPACTED_LEDGER = "compacted-ledger"


class PulsarAuditor:
    """Accumulates per-ledger facts against Pulsar's references; partial results merge.

    One instance per partition (each with the same `refs`), merged on the driver
    in any order, then `finish` once. Every existing ledger must be observed,
    even one whose metadata could not be decoded (`LedgerFact(id)`): a
    referenced ledger never observed is reported missing.
    """

    def __init__(
        self,
        refs: PulsarRefs,
        *,
        now_ms: int,
        grace_ms: int = DEFAULT_ORPHAN_GRACE_MS,
    ) -> None:
        if grace_ms < 0:
            raise ValueError(f"orphan grace period must be >= 0 ms, got {grace_ms}")
        self.refs = refs
        self.now_ms = now_ms
        self.grace_ms = grace_ms
        self.seen: set[int] = set()
        self.findings: list[Finding] = []
        self.rollup = Rollup()
        self.ledgers_seen = 0
        self.unaged = Sample()
        self.held = Sample()
        self.young = 0
        self._bad = [b.path for b in refs.bad_znodes]

    # --- per ledger -----------------------------------------------------------------

    def observe(self, fact: LedgerFact, state: LedgerVerdicts | None = None) -> None:
        st = state or _CLEAN
        self.ledgers_seen += 1
        refs = self.refs.references(fact.ledger_id)
        if refs:
            self.seen.add(fact.ledger_id)
            self._count_referenced(fact, refs, st)
            self.findings.extend(losses(fact.ledger_id, refs, fact, st.no_replica))
        elif fact.pulsar:
            self._unreferenced(fact)

    def _count_referenced(
        self, fact: LedgerFact, refs: list[LedgerRef], st: LedgerVerdicts
    ) -> None:
        size = fact.size if fact.size is not None else _pulsar_size(refs)
        n = size or 0
        under = st.marked or st.replicas_violation or bool(st.no_replica)
        for c in self.rollup.rows((r.namespace for r in refs), (ref_topic(r) for r in refs)):
            c.ledgers += 1
            c.bytes += n
            c.unsized += size is None
            if under:
                c.under_replicated += 1
                c.under_replicated_bytes += n
            if st.unplaced:
                c.unplaced += 1
                c.unplaced_bytes += n
        if st.domains:
            namespaces = {r.namespace for r in refs}
            for domain in st.domains:
                self.rollup.at_risk.setdefault(domain, Counter()).update(namespaces)

    def _unreferenced(self, fact: LedgerFact) -> None:
        if fact.ctime_ms is None:
            self.unaged.add(fact.ledger_id)
        elif self.now_ms - fact.ctime_ms < self.grace_ms:
            self.young += 1
        elif self._maybe_unread(fact.owner) or self._maybe_referenced_unseen(fact.owner):
            self.held.add(fact.ledger_id)
        else:
            self.findings.append(
                Finding(
                    fact.ledger_id,
                    Category.ORPHAN,
                    owner=fact.owner,
                    size=fact.size,
                    ctime_ms=fact.ctime_ms,
                )
            )

    def _maybe_unread(self, owner: Owner | None) -> bool:
        """Whether this owner's references may be in a znode that could not be read."""
        if not self._bad:
            return False
        if owner is None:
            return True
        names: list[str] = []
        if owner.managed_ledger is not None:
            names.append(owner.managed_ledger)
        if (
            owner.topic is not None
            and (ml := managed_ledger_of_named_topic(owner.topic)) is not None
        ):
            names.append(ml)
        known = any(n in self.refs.managed_ledgers for n in names)
        if owner.schema_id is not None:
            names.append(owner.schema_id)
            known = known or owner.schema_id in self.refs.schemas
        if not known:
            return True
        return any(_names(path, n) for path in self._bad for n in names)

    def _maybe_referenced_unseen(self, owner: Owner | None) -> bool:
        """A compacted ledger of a topic that still exists, or a schema ledger of a schema
        that still exists: Pulsar may reference it where ZooKeeper does not show it (the
        `__compaction` cursor's properties kept in its cursor ledger; schema versions
        trimmed from the locator's index), so its absence from the refs proves no leak."""
        if owner is None:
            return False
        if owner.schema_id is not None:
            return owner.schema_id in self.refs.schemas
        compacted = owner.component == COMPACTED_LEDGER or (
            owner.managed_ledger is None and owner.topic is not None
        )
        if compacted and owner.topic is not None:
            ml = managed_ledger_of_named_topic(owner.topic)
            return ml is None or ml in self.refs.managed_ledgers
        return False

    # --- whole ----------------------------------------------------------------------

    def partial(self) -> PulsarPartial:
        """What a partition sends back to be merged: everything but the (large) refs."""
        return PulsarPartial(
            self.seen,
            self.findings,
            self.rollup,
            self.ledgers_seen,
            self.unaged,
            self.held,
            self.young,
        )

    def merge(self, other: PulsarAuditor | PulsarPartial) -> None:
        """Adds another partition's partial result (disjoint ledgers, the same refs)."""
        self.seen |= other.seen
        self.findings.extend(other.findings)
        self.rollup.merge(other.rollup)
        self.ledgers_seen += other.ledgers_seen
        self.unaged.merge(other.unaged)
        self.held.merge(other.held)
        self.young += other.young

    def finish(self, risk: Mapping[DomainName, Iterable[int]] | None = None) -> PulsarAudit:
        """Referenced ledgers never observed, the risk join, and the result."""
        findings = list(self.findings)
        rollup = Rollup()
        rollup.merge(self.rollup)
        for ledger_id, refs in self.refs.refs.items():
            if ledger_id in self.seen:
                continue
            lost = losses(ledger_id, refs, None, ())
            findings.extend(lost)
            size = _pulsar_size(refs)
            for c in rollup.rows((r.namespace for r in refs), (ref_topic(r) for r in refs)):
                c.ledgers += 1
                c.bytes += size or 0
                c.unsized += size is None
        for domain, ids in (risk or {}).items():
            by_ns: Counter[str] = Counter()
            for ledger_id in ids:
                by_ns.update({r.namespace for r in self.refs.references(ledger_id)})
            if by_ns:
                rollup.at_risk.setdefault(domain, Counter()).update(by_ns)
        findings.sort(key=lambda f: (f.ledger_id, str(f.category)))
        return PulsarAudit(
            findings,
            rollup,
            self.ledgers_seen,
            self.unaged,
            self.held,
            self.young,
            now_ms=self.now_ms,
        )


_CLEAN = LedgerVerdicts()


def audit(
    refs: PulsarRefs,
    facts: Iterable[LedgerFact],
    *,
    now_ms: int,
    grace_ms: int = DEFAULT_ORPHAN_GRACE_MS,
    no_replica: Mapping[int, tuple[tuple[int, int], ...]] | None = None,
    marked: Set[int] = frozenset(),
    replicas_violations: Set[int] = frozenset(),
    unplaced: Set[int] = frozenset(),
    risk: Mapping[DomainName, Iterable[int]] | None = None,
) -> PulsarAudit:
    """One pass over every existing ledger's fact (the CLI and the tests)."""
    gaps = no_replica or {}
    auditor = PulsarAuditor(refs, now_ms=now_ms, grace_ms=grace_ms)
    for fact in facts:
        i = fact.ledger_id
        auditor.observe(
            fact,
            LedgerVerdicts(gaps.get(i, ()), i in marked, i in replicas_violations, i in unplaced),
        )
    return auditor.finish(risk)


# --- the re-check -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Recheck:
    """A fresh look at one candidate: does its ledger exist, what references it now.

    `refs` are the references to this ledger in a fresh read of the candidate's
    owners (`Finding.reread`): the managed ledgers, cursors and schemas it named.
    """

    exists: bool
    refs: tuple[LedgerRef, ...] = ()


def recheck(finding: Finding, fresh: Recheck) -> tuple[Finding | None, DropCause | None]:
    """The candidate as it stands now, or None with why it was dropped."""
    if finding.category is Category.ORPHAN:
        if not fresh.exists:
            return None, DropCause.LEDGER_DELETED
        if fresh.refs:
            return None, DropCause.REFERENCES_CHANGED
        return finding, None
    refs = _sorted_refs(fresh.refs)
    if not refs or any(r.offloaded for r in refs):
        # Trimmed (or deleted with its topic) or offloaded meanwhile: no data lost.
        return None, DropCause.REFERENCES_CHANGED
    if finding.no_metadata:
        if fresh.exists:
            return None, DropCause.METADATA_CHANGED
        now = losses(finding.ledger_id, refs, None, ())
        if not now:
            return None, DropCause.REFERENCES_CHANGED
        return now[0], None
    if not fresh.exists:
        # Its metadata is gone too now, and Pulsar still lists it: missing all the same.
        return losses(finding.ledger_id, refs, None, ())[0], None
    return replace(finding, refs=tuple(refs)), None


def confirm(audit_result: PulsarAudit, fresh: Mapping[int, Recheck]) -> PulsarAudit:
    """The result with every candidate looked at again; one without a fresh look is kept."""
    kept: list[Finding] = []
    dropped: Counter[str] = Counter(audit_result.dropped)
    by_ledger: dict[int, set[DropCause]] = {}
    for f in audit_result.findings:
        look = fresh.get(f.ledger_id)
        if look is None:
            kept.append(f)
            continue
        now, cause = recheck(f, look)
        if now is not None:
            kept.append(now)
        elif cause is not None:
            by_ledger.setdefault(f.ledger_id, set()).add(cause)
    reported = {f.ledger_id for f in kept}
    for ledger_id, causes in by_ledger.items():
        if ledger_id not in reported:
            dropped[str(min(causes))] += 1
    # Unique per (ledger, category): a re-check can turn an entry loss into a metadata loss.
    unique = {(f.ledger_id, f.category): f for f in kept}
    return replace(
        audit_result,
        findings=sorted(unique.values(), key=lambda f: (f.ledger_id, str(f.category))),
        dropped=dropped,
    )
