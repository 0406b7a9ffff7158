"""An operator looking at a flagged ledger asks the same questions every time, and the
answers must never disagree with the checks, so they come from the checks' own analysis
cores, fed with one ledger's inputs.

Why one ledger is (or is not) flagged: every input and every check's verdict, in one document.

The questions: which bookies should hold what, which racks they sit in, what each bookie
actually holds, how many copies each entry range has against the quorums,
whether the ledger is marked, and what each check concluded from that. This
module answers them from values the driver gathered (metadata, bookie
answers, rack locations, the registry, the mark, the ledger check's reads)
by calling the checks' own analysis cores, so an explanation can never
disagree with the checks about the same inputs.

Two differences from a check run, both deliberate and stated in the output:
a bookie that does not answer is asked once (a run re-checks it after
`checks.retry_delay` before reporting `bookie_unavailable_registered`), and
nothing is ever marked.

Copies are computed on ranges (`replicas.segment_shortfall`), never per entry, and
what is listed is capped (`LIMIT` ranges per list, with totals beside), so a
ledger of millions of entries explains in one page.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from auditor.bookie.availability import Availability, expected_count
from auditor.checks.bookie_check import ledger_loss, loss_violations
from auditor.checks.findings import Category, Check, SkipReason, Violation, metadata_invalid
from auditor.checks.grace import past_grace
from auditor.checks.owners import owner_of
from auditor.checks.placement import PlacementPolicy, analyse_ledger
from auditor.checks.placement import skip_reason as placement_skip
from auditor.checks.replicas import (
    BookieAnswer,
    Listed,
    Probed,
    Unanswered,
    Unverified,
    analyse,
    segment_shortfall,
    verdict_violations,
)
from auditor.checks.replicas import skip_reason as replicas_skip
from auditor.metadata.model import LedgerMetadata, SegmentRange
from auditor.metadata.registry import BookieSet
from auditor.metadata.schedule import stores_entry
from auditor.metadata.underreplication import CorruptMark, UnderreplicatedLedger

#: Ranges listed at most per list (copies of a segment, a bookie's holdings or gaps).
LIMIT = 100

#: The order checks appear in (the order `check all` runs them).
CHECK_ORDER = (Check.REPLICAS, Check.PLACEMENT, Check.GRACE, Check.BOOKIES, Check.LEDGERS)


#: A ledger's under-replication mark as read: valid, corrupt (it still marks the ledger), none.
Mark = UnderreplicatedLedger | CorruptMark | None


@dataclass(frozen=True, slots=True)
class LedgerCheckResult:
    """What the ledger check's reads found: its violation, or None when every read passed.

    With replication disabled the ledger check reads nothing (and marks nothing), so
    explain does not read either: the verdict says it would be skipped.
    """

    violation: Violation | None
    replication_enabled: bool = True


@dataclass(frozen=True, slots=True)
class ExplainInputs:
    md: LedgerMetadata
    path: str
    znode_version: int
    #: One answer per bookie that must hold entries (what the replicas check asks).
    answers: Mapping[str, BookieAnswer]
    #: Bookie -> known location; a bookie absent here gets the policy's default.
    locations: Mapping[str, str]
    #: Bookie -> the rack source that placed it.
    rack_sources: Mapping[str, str]
    policy: PlacementPolicy
    registered: BookieSet
    mark: Mark
    grace_period_s: int
    now_ms: int
    ledgers: LedgerCheckResult
    #: Why the rack sources could not be read (no bookie located; placement not judged).
    racks_unreadable: str | None = None


#: The grace check's outcome for a corrupt mark: named in its report's invalid znodes.
INVALID_ZNODE = "invalid_znode"
#: A check that could not judge the ledger (the placement check without its rack sources),
#: as `check all` reports that check failed while the others run.
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class CheckVerdict:
    """One check's conclusion about the ledger: ok, violation(s), or skipped with why."""

    check: Check
    outcome: str  # "ok" | "violation" | "skipped" | INVALID_ZNODE | FAILED
    reason: str
    violations: tuple[Violation, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "reason": self.reason,
            "violations": [v.to_json() for v in self.violations],
        }


def _ok(check: Check, reason: str) -> CheckVerdict:
    return CheckVerdict(check, "ok", reason)


def _skipped(check: Check, why: SkipReason, reason: str) -> CheckVerdict:
    return CheckVerdict(check, "skipped", f"{why}: {reason}")


def _found(check: Check, reason: str, violations: list[Violation]) -> CheckVerdict:
    return CheckVerdict(check, "violation", reason, tuple(violations))


# --- metadata and owner -----------------------------------------------------------------


def _custom_value(value: bytes) -> str:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + value.hex()
    return text if text.isprintable() else "hex:" + value.hex()


def metadata_json(md: LedgerMetadata, path: str, znode_version: int) -> dict[str, Any]:
    return {
        "path": path,
        "znode_version": znode_version,
        **md.summary_json(),
        "custom_metadata": {k: _custom_value(v) for k, v in sorted(md.custom_metadata)},
    }


# --- copies on ranges --------------------------------------------------------------------


def _status(copies: int, md: LedgerMetadata) -> str:
    if copies >= md.write_quorum:
        return "ok"
    if copies <= 0:
        return str(Category.NO_REPLICA)
    if copies < md.ack_quorum:
        return str(Category.BELOW_ACK_QUORUM)
    return str(Category.BELOW_WRITE_QUORUM)


def _copy_ranges(
    md: LedgerMetadata, seg: SegmentRange, answers: Mapping[str, BookieAnswer]
) -> Iterator[tuple[int, int, int]]:
    """The segment partitioned into maximal `(first, last, copies)` ranges, ascending.

    The short ranges are the replicas check's own count (`segment_shortfall`):
    optimistic where nothing is known, as in a check run.
    """
    position = seg.first
    for first, last, copies in segment_shortfall(md, seg, answers):
        if first > position:
            yield (position, first - 1, md.write_quorum)
        yield (first, last, copies)
        position = last + 1
    if position <= seg.last:
        yield (position, seg.last, md.write_quorum)


def copies_json(
    md: LedgerMetadata, seg: SegmentRange, answers: Mapping[str, BookieAnswer]
) -> dict[str, Any]:
    ranges: list[dict[str, Any]] = []
    by_copies: dict[int, int] = {}
    total = 0
    lowest = md.write_quorum
    for first, last, copies in _copy_ranges(md, seg, answers):
        total += 1
        by_copies[copies] = by_copies.get(copies, 0) + last - first + 1
        lowest = min(lowest, copies)
        if len(ranges) < LIMIT:
            ranges.append(
                {"entries": [first, last], "copies": copies, "status": _status(copies, md)}
            )
    return {
        "min_copies": lowest,
        "status": _status(lowest, md),
        "ranges": ranges,
        "ranges_total": total,
        "entries_by_copies": {str(c): n for c, n in sorted(by_copies.items())},
    }


# --- bookies -------------------------------------------------------------------------------


def _clipped_runs(av: Availability, first: int, last: int) -> tuple[list[list[int]], bool]:
    """Up to LIMIT runs of `av` inside [first, last]; and whether more were left out."""
    out: list[list[int]] = []
    for start, length in av.iter_runs():
        end = start + length - 1
        if end < first:
            continue
        if start > last:
            break
        if len(out) == LIMIT:
            return out, True
        out.append([max(start, first), min(end, last)])
    return out, False


def _registration(bookie: str, registered: BookieSet) -> str:
    if bookie in registered.writable:
        return "writable"
    if bookie in registered.readonly:
        return "readonly"
    return "down"


def bookie_json(
    md: LedgerMetadata, seg: SegmentRange, index: int, bookie: str, inputs: ExplainInputs
) -> dict[str, Any]:
    e, w = md.ensemble_size, md.write_quorum
    expected = 0 if seg.empty else expected_count(seg.first, seg.last, e, w, index)
    out: dict[str, Any] = {
        "index": index,
        "bookie": bookie,
        "rack": inputs.locations.get(bookie, inputs.policy.default_location),
        "rack_source": inputs.rack_sources.get(bookie),
        "registration": _registration(bookie, inputs.registered),
        "expected_entries": expected,
    }
    answer = inputs.answers.get(bookie) if expected else None
    if answer is None:
        out["answer"] = "not_asked"
        out["reason"] = (
            "holds no entry of this segment"
            if expected == 0 and not seg.empty
            else "segment has no entries to check (ledger not closed)"
            if seg.empty
            else "not asked"
        )
        return out
    if isinstance(answer, Listed):
        av = answer.availability
        missing = av.missing(seg.first, seg.last, e, w, index)
        held, more = _clipped_runs(av, seg.first, seg.last)
        out |= {
            "answer": "listed",
            "held_ranges": held,
            "held_ranges_truncated": more,
            "missing_entries": missing.count,
            "missing_ranges": [list(r) for r in missing.ranges(LIMIT)],
        }
    elif isinstance(answer, Probed):
        mine = sorted(
            (entry, present)
            for entry, present in answer.entries.items()
            if seg.first <= entry <= seg.last and stores_entry(index, entry, e, w)
        )
        out |= {
            "answer": "probed",
            "probed_present": [x for x, present in mine if present],
            "probed_absent": [x for x, present in mine if not present],
        }
    elif isinstance(answer, Unanswered):
        out |= {"answer": "unanswered", "reason": answer.reason}
    else:
        assert isinstance(answer, Unverified)
        out |= {"answer": "unverified", "reason": answer.reason}
    return out


def write_sets_json(md: LedgerMetadata, seg: SegmentRange, inputs: ExplainInputs) -> Any:
    """The E write quorums of the segment: entry e goes to the one starting at e mod E."""
    default = inputs.policy.default_location
    out = []
    for start in range(len(seg.bookies)):
        members = [seg.bookies[(start + k) % len(seg.bookies)] for k in range(md.write_quorum)]
        racks = [inputs.locations.get(b, default) for b in members]
        out.append(
            {
                "start": start,
                "bookies": members,
                "racks": racks,
                "distinct_racks": len(set(racks)),
            }
        )
    return out


def segments_json(inputs: ExplainInputs) -> list[dict[str, Any]]:
    md = inputs.md
    out: list[dict[str, Any]] = []
    for seg in md.segment_ranges():
        doc: dict[str, Any] = {
            "first_entry": seg.first,
            "last_entry": seg.last,
            "ensemble": list(seg.bookies),
            "write_sets": write_sets_json(md, seg, inputs),
            "bookies": [bookie_json(md, seg, i, b, inputs) for i, b in enumerate(seg.bookies)],
            "copies": None if seg.empty else copies_json(md, seg, inputs.answers),
        }
        out.append(doc)
    return out


# --- the checks' verdicts ----------------------------------------------------------------------


def replicas_verdict(inputs: ExplainInputs) -> CheckVerdict:
    """The replicas check's judgement (its driver's, minus the retries and the writes)."""
    md, c = inputs.md, Check.REPLICAS
    skip = replicas_skip(md)
    if skip is SkipReason.EMPTY:
        return _skipped(c, skip, "the ledger was closed without entries")
    if skip is not None:
        return _skipped(c, skip, "only closed ledgers are judged")
    mark = inputs.mark
    if isinstance(mark, CorruptMark):
        return _skipped(
            c,
            SkipReason.UNDERREPLICATED,
            f"marked under-replicated by a corrupt mark ({mark}): re-replication owns it",
        )
    if mark is not None:
        late = past_grace(
            md.ledger_id, inputs.now_ms, mark.ctime, inputs.grace_period_s, mark.replicas
        )
        if late is not None:
            return _found(c, "marked under-replicated for longer than the grace period", [late])
        return _skipped(
            c, SkipReason.UNDERREPLICATED, "marked under-replicated: re-replication owns it"
        )
    verdict = analyse(md, inputs.answers)
    available = inputs.registered.available
    # Asked once: a run asks a silent bookie again before reporting it.
    found = verdict_violations(md, verdict, inputs.znode_version, available, 1)
    reasons: list[str] = []
    if verdict.category is not None:
        reasons.append(
            f"some entries have {verdict.min_copies} of {md.write_quorum} copies "
            f"(ack quorum {md.ack_quorum})"
        )
    for bookie in sorted(verdict.unanswered):
        if bookie not in available:
            reasons.append(f"{bookie} did not answer and is not registered (the bookie check's)")
            continue
        reasons.append(
            f"{bookie} is registered but did not answer (asked once; a check run asks again "
            "after checks.retry_delay before reporting)"
        )
    if not found:
        reasons.insert(0, f"every entry has its {md.write_quorum} copies where they are known")
        return _ok(c, "; ".join(reasons))
    return _found(c, "; ".join(reasons), found)


def placement_verdict(inputs: ExplainInputs) -> CheckVerdict:
    md, c = inputs.md, Check.PLACEMENT
    skip = placement_skip(md)
    if skip is not None:
        return _skipped(c, skip, "only closed ledgers are judged")
    if inputs.racks_unreadable is not None:
        return CheckVerdict(
            c, FAILED, f"not judged: the rack sources cannot be read ({inputs.racks_unreadable})"
        )
    found = analyse_ledger(md, inputs.policy, inputs.locations)
    category = found.category
    if category is None:
        return _ok(c, f"every segment adheres strictly to {inputs.policy.kind.value}")
    first = found.segments[0].verdict.reason or found.adherence.name
    detail = found.detail() | {"metadata_version": inputs.znode_version}
    return _found(
        c,
        f"{len(found.segments)} segment(s) {found.adherence.name}: {first}",
        [Violation(md.ledger_id, category, None, detail)],
    )


def grace_verdict(ledger_id: int, mark: Mark, grace: int, now_ms: int) -> CheckVerdict:
    """The grace check needs only the mark (it judges marks, metadata or not); a corrupt
    one cannot be aged: the check names it as an invalid znode of its report."""
    c = Check.GRACE
    if mark is None:
        return _ok(c, "not marked under-replicated")
    if isinstance(mark, CorruptMark):
        return CheckVerdict(
            c, INVALID_ZNODE, f"the mark is corrupt ({mark}): named as an invalid znode"
        )
    if grace <= 0:
        return _skipped(
            c,
            SkipReason.GRACE_PERIOD_DISABLED,
            "underreplicatedLedgerRecoveryGracePeriod is 0",
        )
    if mark.ctime < 0:
        return _skipped(c, SkipReason.NO_CTIME, "the mark carries no creation time")
    late = past_grace(ledger_id, now_ms, mark.ctime, grace, mark.replicas)
    age = (now_ms - mark.ctime) // 1000
    if late is None:
        return _ok(c, f"marked {age}s ago, within the grace period of {grace}s")
    return _found(c, f"marked {age}s ago, past the grace period of {grace}s", [late])


def bookies_verdict(inputs: ExplainInputs) -> CheckVerdict:
    c = Check.BOOKIES
    loss = ledger_loss(inputs.md, inputs.registered.available, inputs.znode_version)
    if loss is None:
        return _ok(c, "every bookie of every ensemble is registered")
    return _found(
        c,
        f"ensemble bookies neither writable nor read-only: {', '.join(loss.bookies)}",
        loss_violations(loss),
    )


def ledgers_verdict(inputs: ExplainInputs) -> CheckVerdict:
    c = Check.LEDGERS
    if not inputs.ledgers.replication_enabled:
        return _skipped(
            c, SkipReason.REPLICATION_DISABLED, "the ledger check reads nothing until it is enabled"
        )
    v = inputs.ledgers.violation
    if v is None:
        return _ok(c, "every sampled read of every fragment succeeded")
    if v.category is Category.METADATA_INVALID:
        return _found(c, str(v.detail.get("reason", "metadata invalid")), [v])
    bad = ", ".join(v.detail.get("bad_bookies", []))
    return _found(c, f"fragments unreadable from: {bad}", [v])


def verdicts(inputs: ExplainInputs) -> dict[Check, CheckVerdict]:
    return {
        Check.REPLICAS: replicas_verdict(inputs),
        Check.PLACEMENT: placement_verdict(inputs),
        Check.GRACE: grace_verdict(
            inputs.md.ledger_id, inputs.mark, inputs.grace_period_s, inputs.now_ms
        ),
        Check.BOOKIES: bookies_verdict(inputs),
        Check.LEDGERS: ledgers_verdict(inputs),
    }


# --- the document --------------------------------------------------------------------------------


def mark_json(mark: Mark) -> dict[str, Any] | None:
    if mark is None:
        return None
    if isinstance(mark, CorruptMark):
        return {"corrupt": mark.reason, "path": mark.path}
    return {"missing_replicas": list(mark.replicas), "ctime": mark.ctime}


def explain(inputs: ExplainInputs) -> dict[str, Any]:
    """The explanation document (the `explain --json` contract documented in the README)."""
    md = inputs.md
    owner = owner_of(md.custom_metadata)
    found = verdicts(inputs)
    return {
        "ledger_id": md.ledger_id,
        "metadata": metadata_json(md, inputs.path, inputs.znode_version),
        "owner": owner.to_json() if owner is not None else None,
        "placement_policy": inputs.policy.kind.value,
        "segments": segments_json(inputs),
        "underreplication_mark": mark_json(inputs.mark),
        "categories": sorted({str(v.category) for f in found.values() for v in f.violations}),
        "checks": {str(c): found[c].to_json() for c in CHECK_ORDER},
    }


def document_text(doc: dict[str, Any]) -> str:
    """The one serialisation of a document, so `explain --json` and the API's print the same."""
    return json.dumps(doc, sort_keys=False)


def explain_invalid(
    ledger_id: int,
    path: str,
    znode_version: int,
    reason: str,
    mark: Mark,
    grace_period_s: int,
    now_ms: int,
) -> dict[str, Any]:
    """The document for metadata that does not decode: the checks that read it say so."""
    v = metadata_invalid(ledger_id, path, znode_version, reason)
    verdict = _found(Check.REPLICAS, reason, [v]).to_json()
    checks = {str(c): verdict for c in CHECK_ORDER}
    grace = grace_verdict(ledger_id, mark, grace_period_s, now_ms)
    checks[str(Check.GRACE)] = grace.to_json()
    categories = {str(Category.METADATA_INVALID)} | {str(x.category) for x in grace.violations}
    return {
        "ledger_id": ledger_id,
        "metadata": {"path": path, "znode_version": znode_version, "error": reason},
        "owner": None,
        "placement_policy": None,
        "segments": [],
        "underreplication_mark": mark_json(mark),
        "categories": sorted(categories),
        "checks": checks,
    }
