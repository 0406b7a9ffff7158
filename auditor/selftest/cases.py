"""A check's core that stops detecting a defect is caught only by an input known to carry
exactly that defect, with its exact answer known in advance; these are those inputs, kept
apart from the harness that runs them.

The self-test's fixtures: one known defect per category of every check, and controls.

Each case builds a small synthetic input, calls the check's pure core through
`Cores`, and reduces the answer to a plain value (category, ledger, entries,
bookies) that must equal the expected one exactly. The fixtures are chosen
to exercise what a regression would most likely break: striping (E > W),
several segments, probes instead of listings, the grace boundary, the
lost-bookie delay's timer and cancellation, corrupt and mis-addressed entry
bodies, and every metadata format.

Bookie ids are synthetic (`selftest-*`) and no case does I/O.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace

from auditor.bookie.availability import Availability
from auditor.bookie.protocol import Status, encode_entry_body
from auditor.bookie.results import EntryRead, ErrorStatus, Ok, Outcome
from auditor.checks.bookie_check import loss_violations
from auditor.checks.findings import Category
from auditor.checks.ledger_check import ReadFailure, Verdict
from auditor.checks.placement import PlacementPolicy, PolicyKind
from auditor.checks.pulsar_audit import LedgerFact
from auditor.checks.replicas import (
    BookieAnswer,
    Listed,
    Probed,
    Unanswered,
    unanswered_registered,
)
from auditor.checks.scrub import ABSENT, Body, Copy, Failed, entry_write_sets
from auditor.metadata.model import DigestType, LedgerMetadata, LedgerState, Segment
from auditor.metadata.pulsar.refs import LedgerRef, PulsarRefs, RefKind
from auditor.metadata.serde import LedgerMetadataFormatError, encode_ledger_metadata
from auditor.schedule.lost_bookie_delay import (
    AuditReason,
    CancelPendingAudit,
    RunAuditNow,
    ScheduleAudit,
)
from auditor.selftest.harness import Case, Cores, SelfTestResult, run_cases

LEDGER = 4242


def _bookie(name: str) -> str:
    return f"selftest-{name}:3181"


def _md(
    segments: Sequence[tuple[int, Sequence[str]]],
    *,
    w: int,
    a: int,
    last: int,
    ledger_id: int = LEDGER,
    state: LedgerState = LedgerState.CLOSED,
    version: int = 3,
) -> LedgerMetadata:
    closed = state is LedgerState.CLOSED
    return LedgerMetadata(
        ledger_id=ledger_id,
        format_version=version,
        ensemble_size=len(segments[0][1]),
        write_quorum=w,
        ack_quorum=a,
        state=state,
        segments=tuple(Segment(first, tuple(b)) for first, b in segments),
        last_entry_id=last if closed else -1,
        length=(last + 1) * 10 if closed else 0,
        digest_type=None if version == 1 else DigestType.CRC32C,
        password=None if version == 1 else b"",
    )


# --- replicas ------------------------------------------------------------------------

R = [_bookie(f"r{i}") for i in range(5)]
#: E=4, W=3, A=2 over entries 0..11: bookie i holds e iff (i - e) mod 4 < 3.
REPLICAS_MD = _md([(0, R[:4])], w=3, a=2, last=11)
#: Two segments: entries 0..5 on r0..r3, 6..11 on r0, r1, r2, r4.
TWO_SEGMENTS_MD = _md([(0, R[:4]), (6, [R[0], R[1], R[2], R[4]])], w=3, a=2, last=11)


def _holdings(md: LedgerMetadata, lacking: dict[str, Sequence[int]]) -> dict[str, BookieAnswer]:
    """Every bookie lists its round-robin share of every segment, minus `lacking`."""
    held: dict[str, set[int]] = {}
    e, w = md.ensemble_size, md.write_quorum
    for seg in md.segment_ranges():
        for i, bookie in enumerate(seg.bookies):
            share = {x for x in range(seg.first, seg.last + 1) if (i - x) % e < w}
            held.setdefault(bookie, set()).update(share)
    return {
        b: Listed(Availability.from_entries(sorted(entries - set(lacking.get(b, ())))))
        for b, entries in held.items()
    }


def _verdict(cores: Cores, md: LedgerMetadata, answers: dict[str, BookieAnswer]) -> object:
    v = cores.replicas(md, answers)
    return (
        v.ledger_id,
        None if v.category is None else str(v.category),
        v.min_copies,
        v.worst_entries,
        tuple(v.bookies_missing_entries),
        tuple(sorted(v.unanswered)),
    )


def _replicas_case(
    name: str,
    md: LedgerMetadata,
    answers: Callable[[], dict[str, BookieAnswer]],
    expected: object,
) -> Case:
    return Case("replicas", name, lambda c: _verdict(c, md, answers()), expected)


def _unanswered_case(name: str, registered: frozenset[str], expected: object) -> Case:
    def run(cores: Cores) -> object:
        answers = _holdings(REPLICAS_MD, {})
        answers[R[3]] = Unanswered("timeout")
        v = cores.replicas(REPLICAS_MD, answers)
        cat = None if v.category is None else str(v.category)
        return cat, tuple(unanswered_registered(v, registered))

    return Case("replicas", name, run, expected)


def replicas_cases() -> list[Case]:
    md = REPLICAS_MD
    probed = {**_holdings(md, {}), R[1]: Probed({0: True, 11: False})}
    return [
        _replicas_case("clean", md, lambda: _holdings(md, {}), (LEDGER, None, 3, (), (), ())),
        _replicas_case(
            "below_write_quorum",
            md,
            lambda: _holdings(md, {R[0]: [6]}),
            (LEDGER, "below_write_quorum", 2, ((6, 6),), (R[0],), ()),
        ),
        _replicas_case(
            "below_ack_quorum",
            md,
            lambda: _holdings(md, {R[0]: [6], R[2]: [6]}),
            (LEDGER, "below_ack_quorum", 1, ((6, 6),), (R[0], R[2]), ()),
        ),
        _replicas_case(
            "no_replica",
            md,
            lambda: _holdings(md, {R[0]: [6, 7], R[1]: [7], R[2]: [6], R[3]: [6, 7]}),
            (LEDGER, "no_replica", 0, ((6, 7),), (R[0], R[1], R[2], R[3]), ()),
        ),
        _replicas_case(
            "below_write_quorum_probed",
            md,
            lambda: probed,
            (LEDGER, "below_write_quorum", 2, ((11, 11),), (R[1],), ()),
        ),
        _replicas_case(
            "below_write_quorum_second_segment",
            TWO_SEGMENTS_MD,
            lambda: _holdings(TWO_SEGMENTS_MD, {R[4]: [6]}),
            (LEDGER, "below_write_quorum", 2, ((6, 6),), (R[4],), ()),
        ),
        _replicas_case(
            "clean_two_segments",
            TWO_SEGMENTS_MD,
            lambda: _holdings(TWO_SEGMENTS_MD, {}),
            (LEDGER, None, 3, (), (), ()),
        ),
        _unanswered_case(
            "bookie_unavailable_registered",
            frozenset(R[:4]),
            (None, (R[3],)),
        ),
        _unanswered_case(
            "unanswered_unregistered_left_to_bookie_check", frozenset(R[:3]), (None, ())
        ),
    ]


# --- placement -----------------------------------------------------------------------

P = [_bookie(f"p{i}") for i in range(4)]


def _placement_case(
    name: str,
    policy: PlacementPolicy,
    segments: Sequence[tuple[int, Sequence[str]]],
    w: int,
    locations: dict[str, str],
    expected: object,
) -> Case:
    md = _md(segments, w=w, a=min(w, 2), last=19)

    def run(cores: Cores) -> object:
        found = cores.placement(md, policy, locations)
        cat = None if found.category is None else str(found.category)
        return (
            found.ledger_id,
            cat,
            tuple((s.first_entry_id, s.verdict.window_start) for s in found.segments),
        )

    return Case("placement", name, run, expected)


def placement_cases() -> list[Case]:
    rack = PlacementPolicy(PolicyKind.RACKAWARE, min_racks_per_write_quorum=2)
    enforce = replace(rack, enforce_min_racks_per_write_quorum=True)
    zone = PlacementPolicy(
        PolicyKind.ZONEAWARE, min_zones_per_write_quorum=2, desired_zones_per_write_quorum=3
    )
    region = PlacementPolicy(
        PolicyKind.REGIONAWARE,
        min_regions_for_durability=2,
        cluster_regions=frozenset({"east", "west"}),
    )
    three = [(0, P[:3])]
    spread = {P[0]: "/r1", P[1]: "/r2", P[2]: "/r3", P[3]: "/r1"}
    na, soft = "placement_not_adhering", "placement_softly_adhering"
    east_west = {P[0]: "/east/r1", P[1]: "/east/r2", P[2]: "/west/r1", P[3]: "/west/r2"}
    return [
        _placement_case("rackaware_clean", rack, three, 2, spread, (LEDGER, None, ())),
        _placement_case(
            "rackaware_one_rack_window",
            rack,
            three,
            2,
            {P[0]: "/r1", P[1]: "/r1", P[2]: "/r2"},
            (LEDGER, na, ((0, 0),)),
        ),
        _placement_case(
            "rackaware_bad_second_segment",
            rack,
            [(0, P[:3]), (10, [P[0], P[2], P[3]])],
            2,
            spread,
            (LEDGER, na, ((10, 2),)),
        ),
        _placement_case(
            "rackaware_enforced_default_rack",
            enforce,
            three,
            2,
            {P[0]: "/r1", P[1]: "/r2"},
            (LEDGER, na, ((0, 1),)),
        ),
        _placement_case(
            "zoneaware_clean",
            zone,
            three,
            3,
            {P[0]: "/z1/u1", P[1]: "/z2/u1", P[2]: "/z3/u1"},
            (LEDGER, None, ()),
        ),
        _placement_case(
            "zoneaware_soft",
            zone,
            three,
            3,
            {P[0]: "/z1/u1", P[1]: "/z1/u2", P[2]: "/z2/u1"},
            (LEDGER, soft, ((0, 0),)),
        ),
        _placement_case(
            "zoneaware_one_upgrade_domain",
            zone,
            three,
            3,
            {P[0]: "/z1/u1", P[1]: "/z1/u1", P[2]: "/z2/u1"},
            (LEDGER, na, ((0, 0),)),
        ),
        _placement_case(
            "regionaware_clean",
            region,
            [(0, [P[0], P[2], P[1], P[3]])],
            2,
            east_west,
            (LEDGER, None, ()),
        ),
        _placement_case(
            "regionaware_one_region_window",
            region,
            three,
            2,
            east_west,
            (LEDGER, na, ((0, 0),)),
        ),
    ]


# --- grace ---------------------------------------------------------------------------

NOW_MS = 1_700_000_000_000
GRACE_S = 3600


def _grace_case(name: str, ctime: int, grace: int, expected: object) -> Case:
    def run(cores: Cores) -> object:
        v = cores.grace(LEDGER, NOW_MS, ctime, grace, ("selftest-g0:3181",))
        if v is None:
            return None
        return v.ledger_id, str(v.category), v.detail["age_s"], tuple(v.detail["replicas"])

    return Case("grace", name, run, expected)


def grace_cases() -> list[Case]:
    return [
        _grace_case(
            "past_grace",
            NOW_MS - (GRACE_S + 1) * 1000,
            GRACE_S,
            (LEDGER, "underreplicated_past_grace_period", GRACE_S + 1, ("selftest-g0:3181",)),
        ),
        _grace_case("at_grace_boundary", NOW_MS - GRACE_S * 1000 - 999, GRACE_S, None),
        _grace_case("mark_without_ctime", -1, GRACE_S, None),
        _grace_case("grace_disabled", NOW_MS - 10 * GRACE_S * 1000, 0, None),
    ]


# --- bookies -------------------------------------------------------------------------

B = [_bookie(f"b{i}") for i in range(6)]


def _loss_case(name: str, md: LedgerMetadata, expected: object) -> Case:
    def run(cores: Cores) -> object:
        loss = cores.lost_bookies(md, frozenset(B[:3]), 7)
        if loss is None:
            return ()
        return tuple(
            (
                v.ledger_id,
                str(v.category),
                v.bookie,
                tuple(v.detail["segments"]),
                tuple(v.detail["missing_replicas"]),
                v.detail["ledger_state"],
            )
            for v in loss_violations(loss)
        )

    return Case("bookies", name, run, expected)


#: A lost-bookie delay scenario: events in, each event's decisions (or answer) out.
Script = Callable[[Cores], list[object]]


def _delay_case(name: str, script: Script, expected: list[object]) -> Case:
    return Case("bookies", name, script, expected)


def _delay_expires(cores: Cores) -> list[object]:
    d = cores.delay()
    # B[3] has been missing since long before this leader: past its delay, audited now.
    out: list[object] = [d.leader_started(B[:4], B[:3], 60, 0.0, {B[3]: -100.0})]
    out.append(d.on_bookies_changed(B[:2], 60, 10.0))
    out.append(d.should_skip_periodic_check())  # periodic checks wait for the audit
    out.append(d.on_timer(70.0, 1))
    return out


def _restart_at_election(cores: Cores) -> list[object]:
    """The restart rule: a bookie down for less than the delay at election is held."""
    d = cores.delay()
    out: list[object] = [d.leader_started(B[:4], B[:3], 60, 0.0, {B[3]: -20.0})]
    out.append(sorted(d.held_bookies))
    out.append(d.on_bookies_changed(B[:4], 60, 30.0))  # back within its delay
    out.append(d.on_timer(40.0, 1))
    return out


def _bookie_returns(cores: Cores) -> list[object]:
    d = cores.delay()
    out: list[object] = [d.leader_started(B[:3], B[:3], 60, 0.0)]
    out.append(d.on_bookies_changed(B[:2], 60, 10.0))
    out.append(d.on_bookies_changed(B[:3], 60, 20.0))
    out.append(d.on_timer(70.0, 1))
    return out


def _second_loss(cores: Cores) -> list[object]:
    d = cores.delay()
    out: list[object] = [d.leader_started(B[:3], B[:3], 60, 0.0)]
    out.append(d.on_bookies_changed(B[:2], 60, 10.0))
    out.append(d.on_bookies_changed(B[:1], 60, 20.0))
    return out


def _no_delay(cores: Cores) -> list[object]:
    d = cores.delay()
    out: list[object] = [d.leader_started(B[:3], B[:3], 0, 0.0)]
    out.append(d.on_bookies_changed(B[:2], 0, 10.0))
    return out


def bookies_cases() -> list[Case]:
    start = RunAuditNow(AuditReason.LEADER_STARTED, frozenset())
    return [
        _loss_case("all_available", _md([(0, B[:3])], w=2, a=2, last=9), ()),
        _loss_case(
            "lost_in_later_segment",
            _md([(0, B[:3]), (5, [B[0], B[3], B[2]])], w=2, a=2, last=9),
            ((LEDGER, "ledgers_on_lost_bookies", B[3], (5,), (B[3],), "closed"),),
        ),
        _loss_case(
            "open_ledger_two_lost",
            _md([(0, [B[4], B[5], B[0]])], w=2, a=2, last=-1, state=LedgerState.OPEN),
            (
                (LEDGER, "ledgers_on_lost_bookies", B[4], (0,), (B[4], B[5]), "open"),
                (LEDGER, "ledgers_on_lost_bookies", B[5], (0,), (B[4], B[5]), "open"),
            ),
        ),
        _delay_case(
            "delay_expires_then_audit",
            _delay_expires,
            [
                [RunAuditNow(AuditReason.LEADER_STARTED, frozenset({B[3]}))],
                [ScheduleAudit(70.0, 1)],
                True,
                [RunAuditNow(AuditReason.DELAY_EXPIRED, frozenset({B[2]}))],
            ],
        ),
        _delay_case(
            "restart_at_election_is_held",
            _restart_at_election,
            [[ScheduleAudit(40.0, 1)], [B[3]], [CancelPendingAudit()], []],
        ),
        _delay_case(
            "bookie_back_cancels_audit",
            _bookie_returns,
            [[start], [ScheduleAudit(70.0, 1)], [CancelPendingAudit()], []],
        ),
        _delay_case(
            "second_loss_audits_at_once",
            _second_loss,
            [
                [start],
                [ScheduleAudit(70.0, 1)],
                [
                    CancelPendingAudit(),
                    RunAuditNow(AuditReason.MULTIPLE_FAILURES, frozenset({B[1], B[2]})),
                ],
            ],
        ),
        _delay_case(
            "no_delay_audits_at_once",
            _no_delay,
            [[start], [RunAuditNow(AuditReason.NO_DELAY, frozenset({B[2]}))]],
        ),
    ]


# --- ledgers -------------------------------------------------------------------------

L = [_bookie(f"l{i}") for i in range(3)]
#: E=3, W=2 over entries 0..5: l0 holds 0, 2, 3, 5; l1 0, 1, 3, 4; l2 1, 2, 4, 5.
LEDGERS_MD = _md([(0, L)], w=2, a=2, last=5)


def _body(entry: int, *, as_entry: int | None = None, corrupt: bool = False) -> bytes:
    eid = entry if as_entry is None else as_entry
    body = encode_entry_body(LEDGER, eid, eid - 1, (eid + 1) * 10, b"selftest-%d" % eid)
    return body[:-1] + bytes([body[-1] ^ 0xFF]) if corrupt else body


Store = dict[str, dict[int, Outcome[EntryRead]]]


def _read(store: Store, bookie: str, entry: int) -> Outcome[EntryRead]:
    found = store.get(bookie, {}).get(entry)
    if found is not None:
        return found
    return Ok(EntryRead(LEDGER, entry, _body(entry), None))


def _fragments_case(name: str, available: Sequence[str], store: Store, expected: object) -> Case:
    """Plans every entry's read (100%), answers from `store` (default: the right body),
    stops a (fragment, bookie) pair at its first failure as the driver does."""

    def run(cores: Cores) -> object:
        md = LEDGERS_MD
        plan = cores.plan(md, None, frozenset(available), 100, random.Random(0))
        failures: dict[int, list[ReadFailure]] = {}
        for k, check in enumerate(plan.checks):
            if check.verdict is not Verdict.READ or check.entries is None:
                continue
            for entry in check.entries:
                reason = cores.classify(md, entry, _read(store, check.bookie, entry))
                if reason is not None:
                    failures[k] = [ReadFailure(entry, reason)]
                    break
        return tuple(
            (
                bf.fragment.segment,
                tuple(
                    (
                        b.index,
                        b.bookie,
                        b.unavailable,
                        tuple((f.entry_id, f.reason) for f in b.failures),
                    )
                    for b in bf.bad
                ),
            )
            for bf in cores.evaluate(plan, failures)
        )

    return Case("ledgers", name, run, expected)


def ledgers_cases() -> list[Case]:
    return [
        _fragments_case("clean", L, {}, ()),
        _fragments_case("unavailable_bookie", L[:2], {}, ((0, ((2, L[2], True, ()),)),)),
        _fragments_case(
            "missing_entry",
            L,
            {L[1]: {1: ErrorStatus(Status.ENOENTRY)}},
            ((0, ((1, L[1], False, ((1, "ENOENTRY"),)),)),),
        ),
        _fragments_case(
            "entry_of_another_id",
            L,
            {L[0]: {3: Ok(EntryRead(LEDGER, 3, _body(3, as_entry=4), None))}},
            ((0, ((0, L[0], False, ((3, f"body is ledger {LEDGER} entry 4"),)),)),),
        ),
        _fragments_case(
            "digest_mismatch",
            L,
            {L[2]: {2: Ok(EntryRead(LEDGER, 2, _body(2, corrupt=True), None))}},
            ((0, ((2, L[2], False, ((2, "digest mismatch"),)),)),),
        ),
    ]


# --- scrub ---------------------------------------------------------------------------

S = [_bookie(f"s{i}") for i in range(3)]
#: E=3, W=2 over entries 0..5: entry e on s(e mod 3) and s(e+1 mod 3); every bookie lists
#: what it holds.
SCRUB_MD = _md([(0, S)], w=2, a=2, last=5)


def _scrub_case(name: str, changes: dict[tuple[int, str], Copy], expected: object) -> Case:
    """Every copy sound but those in `changes` ((entry, bookie) -> what it returned)."""

    def run(cores: Cores) -> object:
        md = SCRUB_MD
        copies = {
            e: {b: changes.get((e, b), Body(_body(e))) for b in bookies}
            for e, bookies in entry_write_sets(md)
        }
        listings = {b: Availability.from_entries(range(6)) for b in S}
        verdict = cores.scrub(md, copies, DigestType.CRC32C, b"", listings)
        return tuple((c, b, n) for (c, b), n in verdict.bad_copies().items())

    return Case("scrub", name, run, expected)


def scrub_cases() -> list[Case]:
    other = encode_entry_body(LEDGER, 3, 2, 40, b"another payload")
    return [
        _scrub_case("clean", {}, ()),
        _scrub_case(
            "corrupt_copy", {(2, S[2]): Body(_body(2, corrupt=True))}, (("corrupt_copy", S[2], 1),)
        ),
        _scrub_case(
            "divergent_copies",
            {(3, S[0]): Body(other)},
            (("divergent_copies", S[0], 1), ("divergent_copies", S[1], 1)),
        ),
        _scrub_case(
            "unreadable_copy_eio", {(4, S[1]): Failed("EIO")}, (("unreadable_copy", S[1], 1),)
        ),
        _scrub_case("unreadable_copy_listed", {(0, S[0]): ABSENT}, (("unreadable_copy", S[0], 1),)),
    ]


# --- metadata ------------------------------------------------------------------------

_VALID = _md([(0, L), (3, [L[0], L[2], L[1]])], w=2, a=2, last=5)


def _shape(md: LedgerMetadata) -> object:
    return (
        md.ledger_id,
        md.ensemble_size,
        md.write_quorum,
        md.ack_quorum,
        md.state.name,
        md.last_entry_id,
        tuple((s.first_entry_id, s.bookies) for s in md.segments),
    )


def _decode_case(name: str, data: Callable[[], bytes], expected: object) -> Case:
    def run(cores: Cores) -> object:
        try:
            return _shape(cores.decode(data(), LEDGER))
        except LedgerMetadataFormatError:
            return str(Category.METADATA_INVALID)

    return Case("metadata", name, run, expected)


def _v2_with(old: bytes, new: bytes) -> bytes:
    data = encode_ledger_metadata(replace(_VALID, format_version=2))
    if old not in data:
        raise ValueError(f"{old!r} not in the v2 encoding")
    return data.replace(old, new, 1)


def metadata_cases() -> list[Case]:
    invalid = str(Category.METADATA_INVALID)
    v1 = replace(_VALID, format_version=1, digest_type=None, password=None)
    return [
        _decode_case("v3_valid", lambda: encode_ledger_metadata(_VALID), _shape(_VALID)),
        _decode_case(
            "v2_valid",
            lambda: encode_ledger_metadata(replace(_VALID, format_version=2)),
            _shape(_VALID),
        ),
        _decode_case("v1_valid", lambda: encode_ledger_metadata(v1), _shape(v1)),
        _decode_case("v3_garbage", lambda: b"BookieMetadataFormatVersion\t3\n\x07garbage", invalid),
        _decode_case("no_header", lambda: b"garbage", invalid),
        _decode_case(
            "unsupported_version", lambda: b"BookieMetadataFormatVersion\t9\nanything", invalid
        ),
        _decode_case("v3_truncated", lambda: encode_ledger_metadata(_VALID)[:-7], invalid),
        _decode_case(
            "v2_ack_above_write",
            lambda: _v2_with(b"ackQuorumSize: 2", b"ackQuorumSize: 3"),
            invalid,
        ),
        _decode_case(
            "v2_short_ensemble",
            lambda: _v2_with(b'  ensembleMember: "%s"\n' % L[2].encode(), b""),
            invalid,
        ),
        _decode_case(
            "v1_garbage", lambda: b"BookieMetadataFormatVersion\t1\nnot\tnumbers", invalid
        ),
    ]


# --- pulsar ----------------------------------------------------------------------------

_ML = "selftest/ns/persistent/topic"
_ORPHAN_GRACE_MS = 3600 * 1000
_OLD = NOW_MS - 2 * _ORPHAN_GRACE_MS


def _pulsar_ref(
    kind: RefKind = RefKind.LEDGER, *, cursor: str | None = None, offloaded: bool = False
) -> LedgerRef:
    znode = f"/managed-ledgers/{_ML}" + (f"/{cursor}" if cursor else "")
    topic = "persistent://selftest/ns/topic"
    return LedgerRef(LEDGER, kind, _ML, topic, "selftest/ns", znode, cursor, offloaded)


def _pulsar_case(
    name: str,
    refs: Sequence[LedgerRef],
    fact: LedgerFact | None,
    expected: object,
    no_replica: tuple[tuple[int, int], ...] = (),
) -> Case:
    def run(cores: Cores) -> object:
        pulsar = PulsarRefs()
        pulsar.add_all(refs)
        pulsar.managed_ledgers.add(_ML)
        result = cores.pulsar(
            pulsar,
            [] if fact is None else [fact],
            now_ms=NOW_MS,
            grace_ms=_ORPHAN_GRACE_MS,
            no_replica={LEDGER: no_replica} if no_replica else {},
        )
        return tuple(
            (
                v.ledger_id,
                str(v.category),
                v.detail.get("reason"),
                tuple(tuple(r) for r in v.detail.get("entries", ())),
            )
            for v in result.violations()
        )

    return Case("pulsar", name, run, expected)


def pulsar_cases() -> list[Case]:
    mine = LedgerFact(LEDGER, None, True, _OLD, 100)
    missing = str(Category.MISSING)
    return [
        _pulsar_case("referenced_ok", [_pulsar_ref()], mine, ()),
        _pulsar_case(
            "missing_no_metadata", [_pulsar_ref()], None, ((LEDGER, missing, "no metadata", ()),)
        ),
        _pulsar_case(
            "missing_entries",
            [_pulsar_ref()],
            mine,
            ((LEDGER, missing, "no replica", ((3, 5),)),),
            no_replica=((3, 5),),
        ),
        _pulsar_case("offloaded_not_missing", [_pulsar_ref(offloaded=True)], None, ()),
        _pulsar_case(
            "dangling_cursor",
            [_pulsar_ref(RefKind.CURSOR, cursor="sub")],
            None,
            ((LEDGER, str(Category.DANGLING_CURSOR), None, ()),),
        ),
        _pulsar_case(
            "cursor_ledger_referenced", [_pulsar_ref(RefKind.CURSOR, cursor="s")], mine, ()
        ),
        _pulsar_case("orphan", [], mine, ((LEDGER, str(Category.ORPHAN), None, ()),)),
        _pulsar_case("young_unreferenced", [], replace(mine, ctime_ms=NOW_MS - 1000), ()),
        _pulsar_case("unreferenced_without_ctime", [], replace(mine, ctime_ms=None), ()),
        _pulsar_case("not_pulsars", [], replace(mine, pulsar=False), ()),
    ]


def all_cases() -> list[Case]:
    return [
        *replicas_cases(),
        *placement_cases(),
        *grace_cases(),
        *bookies_cases(),
        *ledgers_cases(),
        *metadata_cases(),
        *pulsar_cases(),
        *scrub_cases(),
    ]


#: Which fixtures carry each violation category's defect (`check/fixture`); the rest are
#: controls. Every category of every check is here (a unit test holds it to that).
COVERAGE: dict[str, tuple[str, ...]] = {
    "no_replica": ("replicas/no_replica",),
    "below_ack_quorum": ("replicas/below_ack_quorum",),
    "below_write_quorum": (
        "replicas/below_write_quorum",
        "replicas/below_write_quorum_probed",
        "replicas/below_write_quorum_second_segment",
    ),
    "bookie_unavailable_registered": ("replicas/bookie_unavailable_registered",),
    "underreplicated_past_grace_period": ("grace/past_grace",),
    "placement_not_adhering": (
        "placement/rackaware_one_rack_window",
        "placement/rackaware_bad_second_segment",
        "placement/rackaware_enforced_default_rack",
        "placement/zoneaware_one_upgrade_domain",
        "placement/regionaware_one_region_window",
    ),
    "placement_softly_adhering": ("placement/zoneaware_soft",),
    "ledgers_on_lost_bookies": (
        "bookies/lost_in_later_segment",
        "bookies/open_ledger_two_lost",
        "bookies/delay_expires_then_audit",
        "bookies/second_loss_audits_at_once",
        "bookies/no_delay_audits_at_once",
    ),
    "unreadable_fragments": (
        "ledgers/unavailable_bookie",
        "ledgers/missing_entry",
        "ledgers/entry_of_another_id",
        "ledgers/digest_mismatch",
    ),
    "metadata_invalid": (
        "metadata/v3_garbage",
        "metadata/no_header",
        "metadata/unsupported_version",
        "metadata/v3_truncated",
        "metadata/v2_ack_above_write",
        "metadata/v2_short_ensemble",
        "metadata/v1_garbage",
    ),
    "missing": ("pulsar/missing_no_metadata", "pulsar/missing_entries"),
    "orphan": ("pulsar/orphan",),
    "dangling_cursor": ("pulsar/dangling_cursor",),
    "corrupt_copy": ("scrub/corrupt_copy",),
    "divergent_copies": ("scrub/divergent_copies",),
    "unreadable_copy": ("scrub/unreadable_copy_eio", "scrub/unreadable_copy_listed"),
}


def run_selftest(cores: Cores | None = None) -> list[SelfTestResult]:
    """Every check's fixtures through `cores` (default: the real ones)."""
    return run_cases(all_cases(), cores or Cores())
