"""The Pulsar audit's pure core: missing, orphan and dangling-cursor ledgers, rollups, merges."""

from __future__ import annotations

import itertools
import pickle
from collections import Counter

import pytest

from auditor.checks.findings import CATEGORIES, Category, Check, DropCause
from auditor.checks.owners import Owner, owner_of
from auditor.checks.pulsar_audit import (
    DEFAULT_ORPHAN_GRACE_MS,
    UNKNOWN,
    Finding,
    LedgerFact,
    LedgerVerdicts,
    PulsarAudit,
    PulsarAuditor,
    Recheck,
    audit,
    confirm,
    delete_command,
    fact_of,
    owner_place,
)
from auditor.metadata.model import LedgerMetadata, LedgerState, Segment
from auditor.metadata.pulsar.naming import managed_ledger_of_named_topic, namespace_of_topic
from auditor.metadata.pulsar.refs import BadPulsarZnode, LedgerRef, PulsarRefs, RefKind

HOUR = 3600 * 1000
NOW = 1_700_000_000_000
OLD = NOW - DEFAULT_ORPHAN_GRACE_MS - HOUR

ML_A = "t/a/persistent/orders"
TOPIC_A = "persistent://t/a/orders"
ML_B = "t/b/persistent/logs"
TOPIC_B = "persistent://t/b/logs"


def _ref(
    ledger_id: int,
    kind: RefKind = RefKind.LEDGER,
    *,
    ml: str = ML_A,
    topic: str | None = TOPIC_A,
    ns: str = "t/a",
    cursor: str | None = None,
    offloaded: bool = False,
    size: int | None = None,
) -> LedgerRef:
    znode = f"/managed-ledgers/{ml}" + (f"/{cursor}" if cursor else "")
    return LedgerRef(ledger_id, kind, ml, topic, ns, znode, cursor, offloaded, None, size)


def _schema_ref(ledger_id: int) -> LedgerRef:
    return LedgerRef(ledger_id, RefKind.SCHEMA, "t/a/orders", None, "t/a", "/schemas/t/a/orders")


def _b(ledger_id: int, **kw: object) -> LedgerRef:
    return _ref(ledger_id, ml=ML_B, topic=TOPIC_B, ns="t/b", **kw)  # type: ignore[arg-type]


def _refs() -> PulsarRefs:
    refs = PulsarRefs()
    refs.add_all(
        [
            _ref(10),
            _ref(11, size=500),  # no metadata: missing
            _ref(12),  # every copy of entries 3..5 gone: missing
            _ref(13, offloaded=True, size=800),  # no metadata but offloaded: fine
            _ref(14, offloaded=True),  # entries gone but offloaded: fine
            _ref(20, RefKind.CURSOR, cursor="sub-1"),
            _ref(21, RefKind.CURSOR, cursor="sub-2"),  # no metadata: dangling cursor
            _schema_ref(30),
            _ref(31, RefKind.COMPACTED, cursor="__compaction"),
            _b(40),
            _b(41),
            _b(42, size=50),  # open: its size is Pulsar's
        ]
    )
    refs.managed_ledgers |= {ML_A, ML_B}
    refs.schemas.add("t/a/orders")
    return refs


def _owner(ml: str) -> Owner:
    owner = owner_of(
        [
            ("application", b"pulsar"),
            ("component", b"managed-ledger"),
            ("pulsar/managed-ledger", ml.encode()),
        ]
    )
    assert owner is not None
    return owner


def _facts() -> list[LedgerFact]:
    a = _owner(ML_A)
    return [
        LedgerFact(10, a, True, OLD, 1000),
        LedgerFact(12, a, True, OLD, 2000),
        LedgerFact(14, a, True, OLD, 900),
        LedgerFact(20, a, True, OLD, 10),
        LedgerFact(30, None, True, OLD, 20),
        LedgerFact(31, None, True, OLD, 30),
        LedgerFact(40, _owner(ML_B), True, OLD, 300),
        LedgerFact(41, _owner(ML_B), True, OLD, 700),
        LedgerFact(42, _owner(ML_B), True, NOW - HOUR, 0, closed=False),
        # unreferenced
        LedgerFact(100, a, True, OLD, 4096),  # orphan
        LedgerFact(101, None, True, OLD, 0, closed=False),  # orphan of no known owner, open
        LedgerFact(102, a, True, NOW - HOUR, 64),  # young: not yet
        LedgerFact(103, a, True, None, 64),  # no ctime: never an orphan, counted
        LedgerFact(104, None, False, OLD, 64),  # not Pulsar's
        LedgerFact(105, _owner(ML_B), True, OLD, 10),  # orphan of t/b
    ]


NO_REPLICA = {12: ((3, 5),), 14: ((0, 0),)}
MARKED = frozenset({40})
REPLICAS = frozenset({41})
UNPLACED = frozenset({41})
RISK = {("rack", "/r1"): [10, 40, 100], ("bookie", "b1:3181"): [41]}


def _audit(refs: PulsarRefs | None = None, facts: list[LedgerFact] | None = None) -> PulsarAudit:
    return audit(
        refs or _refs(),
        facts if facts is not None else _facts(),
        now_ms=NOW,
        no_replica=NO_REPLICA,
        marked=MARKED,
        replicas_violations=REPLICAS,
        unplaced=UNPLACED,
        risk=RISK,
    )


def _found(result: PulsarAudit) -> set[tuple[int, str]]:
    return {(f.ledger_id, str(f.category)) for f in result.findings}


def test_the_check_and_its_categories() -> None:
    assert str(Check.PULSAR) == "pulsar"
    assert CATEGORIES[Check.PULSAR] == (
        Category.MISSING,
        Category.ORPHAN,
        Category.DANGLING_CURSOR,
        Category.METADATA_INVALID,
    )
    assert [str(c) for c in (Category.MISSING, Category.ORPHAN, Category.DANGLING_CURSOR)] == [
        "missing",
        "orphan",
        "dangling_cursor",
    ]


def test_findings_of_one_pass() -> None:
    result = _audit()
    assert _found(result) == {
        (11, "missing"),
        (12, "missing"),
        (21, "dangling_cursor"),
        (100, "orphan"),
        (101, "orphan"),
        (105, "orphan"),
    }
    assert [v.ledger_id for v in result.violations()] == [11, 12, 21, 100, 101, 105]
    assert result.ledgers_seen == len(_facts())
    assert (result.young, result.unaged.count, result.unaged.ids) == (1, 1, [103])
    assert result.orphans_held.count == 0


def test_missing_without_metadata() -> None:
    (v,) = [v for v in _audit().violations() if v.ledger_id == 11]
    assert v.category is Category.MISSING and v.bookie is None
    assert v.detail == {
        "namespace": "t/a",
        "topic": TOPIC_A,
        "kind": "ledger",
        "znode": f"/managed-ledgers/{ML_A}",
        "reason": "no metadata",
        "size": 500,
        "references": [
            {"kind": "ledger", "owner": ML_A, "znode": f"/managed-ledgers/{ML_A}", "topic": TOPIC_A}
        ],
    }


def test_missing_with_entry_ranges() -> None:
    (v,) = [v for v in _audit().violations() if v.ledger_id == 12]
    assert v.detail["reason"] == "no replica"
    assert v.detail["entries"] == [[3, 5]]
    assert (v.detail["size"], v.detail["topic"], v.detail["namespace"]) == (2000, TOPIC_A, "t/a")


def test_offloaded_ledgers_are_never_missing() -> None:
    found = _found(_audit())
    assert not {lid for lid, _ in found} & {13, 14}


def test_cursor_schema_and_compacted_ledgers_are_referenced() -> None:
    refs = _refs()
    # Nothing but the cursor, schema and compacted ledgers exist, all old and Pulsar's.
    facts = [LedgerFact(i, None, True, OLD, 1) for i in (20, 30, 31)]
    result = audit(refs, facts, now_ms=NOW)
    assert not {lid for lid, c in _found(result) if c == "orphan"}
    assert {(lid, c) for lid, c in _found(result) if lid in (20, 30, 31)} == set()


def test_dangling_cursor_not_missing() -> None:
    (v,) = [v for v in _audit().violations() if v.ledger_id == 21]
    assert v.category is Category.DANGLING_CURSOR
    assert v.detail == {
        "namespace": "t/a",
        "topic": TOPIC_A,
        "kind": "cursor",
        "znode": f"/managed-ledgers/{ML_A}/sub-2",
        "cursor": "sub-2",
        "references": [
            {
                "kind": "cursor",
                "owner": ML_A,
                "znode": f"/managed-ledgers/{ML_A}/sub-2",
                "topic": TOPIC_A,
                "cursor": "sub-2",
            }
        ],
    }


def test_a_cursor_ledger_that_lost_entries_is_missing() -> None:
    refs = PulsarRefs()
    refs.add(_ref(20, RefKind.CURSOR, cursor="sub-1"))
    result = audit(refs, [LedgerFact(20, length=10)], now_ms=NOW, no_replica={20: ((0, 1),)})
    assert _found(result) == {(20, "missing")}


def test_a_ledger_listed_by_a_topic_and_a_cursor_is_missing_once() -> None:
    refs = PulsarRefs()
    refs.add_all([_ref(7), _ref(7, RefKind.CURSOR, cursor="c")])
    assert _found(audit(refs, [], now_ms=NOW)) == {(7, "missing")}


def test_orphans_with_sizes_and_commands() -> None:
    by_id = {v.ledger_id: v for v in _audit().violations() if v.category is Category.ORPHAN}
    assert by_id[100].detail == {
        "namespace": "t/a",
        "topic": TOPIC_A,
        "kind": "managed-ledger",
        "owner": _owner(ML_A).to_json(),
        "size": 4096,
        "size_known": True,
        "ctime": "2023-11-13T21:13:20Z",
        "command": "bookkeeper shell deleteledger -ledgerid 100 -force",
        "age_s": (DEFAULT_ORPHAN_GRACE_MS + HOUR) // 1000,
    }
    assert (by_id[101].detail["size"], by_id[101].detail["size_known"]) == (None, False)
    assert (by_id[101].detail["namespace"], by_id[101].detail["topic"]) == (UNKNOWN, UNKNOWN)
    assert (by_id[105].detail["namespace"], by_id[105].detail["size"]) == ("t/b", 10)
    assert delete_command(7) == "bookkeeper shell deleteledger -ledgerid 7 -force"


def test_grace_boundary() -> None:
    refs = PulsarRefs()
    facts = [
        LedgerFact(1, None, True, NOW - DEFAULT_ORPHAN_GRACE_MS, 1),  # exactly the grace: orphan
        LedgerFact(2, None, True, NOW - DEFAULT_ORPHAN_GRACE_MS + 1, 1),  # a ms younger
    ]
    result = audit(refs, facts, now_ms=NOW)
    assert (_found(result), result.young) == ({(1, "orphan")}, 1)
    zero = audit(refs, facts, now_ms=NOW, grace_ms=0)
    assert _found(zero) == {(1, "orphan"), (2, "orphan")}
    with pytest.raises(ValueError):
        PulsarAuditor(refs, now_ms=NOW, grace_ms=-1)


def test_rollups_per_namespace_and_topic() -> None:
    doc = _audit().to_json()
    ns = {row["namespace"]: row for row in doc["namespaces"]}
    assert ns["t/a"] == {
        "namespace": "t/a",
        "ledgers": 9,
        "bytes": 1000 + 500 + 2000 + 800 + 900 + 10 + 20 + 30,
        "unsized": 1,  # 21: no metadata, no size from Pulsar
        "under_replicated": 2,  # 12, 14
        "under_replicated_bytes": 2900,
        "unplaced": 0,
        "unplaced_bytes": 0,
        "missing": 2,
        "missing_bytes": 2500,
        "dangling_cursors": 1,
        "orphans": 1,
        "orphan_bytes": 4096,
    }
    assert ns["t/b"] == {
        "namespace": "t/b",
        "ledgers": 3,
        "bytes": 300 + 700 + 50,
        "unsized": 0,
        "under_replicated": 2,  # 40 marked, 41 a replicas violation
        "under_replicated_bytes": 1000,
        "unplaced": 1,
        "unplaced_bytes": 700,
        "missing": 0,
        "missing_bytes": 0,
        "dangling_cursors": 0,
        "orphans": 1,
        "orphan_bytes": 10,
    }
    assert ns[UNKNOWN]["orphans"] == 1 and ns[UNKNOWN]["ledgers"] == 0
    # Worst first: t/a lost data.
    assert [row["namespace"] for row in doc["namespaces"]] == ["t/a", "t/b", UNKNOWN]
    topics = {row["topic"]: row for row in doc["topics"]}
    # The schema's ledger counts under the topic it is the schema of (#29).
    assert set(topics) == {TOPIC_A, TOPIC_B, UNKNOWN}
    assert topics[TOPIC_A]["ledgers"] == 8 + 1
    assert doc["totals"]["missing"] == 2 and doc["totals"]["orphans"] == 3
    assert (doc["namespaces_total"], doc["topics_total"]) == (3, 3)
    assert doc["at_risk"] == [
        {
            "domain": "rack",
            "name": "/r1",
            "namespaces": 2,
            "ledgers": 2,
            "by_namespace": {"t/a": 1, "t/b": 1},
        },
        {
            "domain": "bookie",
            "name": "b1:3181",
            "namespaces": 1,
            "ledgers": 1,
            "by_namespace": {"t/b": 1},
        },
    ]
    assert doc["orphans_unaged"] == {"count": 1, "ledgers": [103]}


def test_rollup_is_bounded() -> None:
    refs = PulsarRefs()
    refs.add_all(_ref(i, ml=f"t/n{i}/persistent/x", topic=None, ns=f"t/n{i}") for i in range(5))
    doc = audit(refs, [LedgerFact(i, length=i) for i in range(5)], now_ms=NOW).to_json(top=2)
    assert doc["namespaces_total"] == 5
    assert [r["namespace"] for r in doc["namespaces"]] == ["t/n4", "t/n3"]  # most bytes first


def _partial(facts: list[LedgerFact], refs: PulsarRefs) -> PulsarAuditor:
    part = PulsarAuditor(refs, now_ms=NOW)
    for f in facts:
        i = f.ledger_id
        part.observe(
            f, LedgerVerdicts(NO_REPLICA.get(i, ()), i in MARKED, i in REPLICAS, i in UNPLACED)
        )
    return part


@pytest.mark.parametrize("cuts", [(5,), (1, 9), (3, 7, 12), (0, 15)])
def test_merge_of_partials_equals_one_pass(cuts: tuple[int, ...]) -> None:
    refs, facts = _refs(), _facts()
    bounds = [0, *cuts, len(facts)]
    parts = [_partial(facts[a:b], refs) for a, b in itertools.pairwise(bounds)]
    whole = parts[-1]
    for p in reversed(parts[:-1]):  # any order, as auditors or as shipped partials
        whole.merge(p.partial() if p.ledgers_seen % 2 else p)
    merged = whole.finish(RISK)
    one = _audit()
    assert merged.findings == one.findings
    assert merged.violations() == one.violations()
    assert merged.to_json() == one.to_json()


def test_risk_per_ledger_in_partitions_equals_the_map() -> None:
    refs, facts = _refs(), _facts()
    domains: dict[int, list[tuple[str, str]]] = {}
    for domain, ids in RISK.items():
        for i in ids:
            domains.setdefault(i, []).append(domain)
    part = PulsarAuditor(refs, now_ms=NOW)
    for f in facts:
        i = f.ledger_id
        part.observe(
            f,
            LedgerVerdicts(
                NO_REPLICA.get(i, ()),
                i in MARKED,
                i in REPLICAS,
                i in UNPLACED,
                tuple(domains.get(i, ())),
            ),
        )
    assert part.finish().to_json()["at_risk"] == _audit().to_json()["at_risk"]


# --- unreadable Pulsar metadata ------------------------------------------------------------


def test_orphans_are_held_when_their_references_may_be_unreadable() -> None:
    refs = _refs()
    refs.bad_znodes.append(BadPulsarZnode(f"/managed-ledgers/{ML_B}", "not a ManagedLedgerInfo"))
    gone = _owner("t/c/persistent/deleted")  # its topic was deleted: never read
    facts = [*_facts(), LedgerFact(106, gone, True, OLD, 1)]
    result = _audit(refs, facts)
    orphans = {lid for lid, c in _found(result) if c == "orphan"}
    # 100's managed ledger was read and no bad znode names it; 101 has no owner, 105's
    # managed ledger is the bad znode, 106's was not read at all.
    assert orphans == {100}
    assert (result.orphans_held.count, result.orphans_held.ids) == (3, [101, 105, 106])
    clean = _audit(_refs(), facts)
    assert {lid for lid, c in _found(clean) if c == "orphan"} == {100, 101, 105, 106}


@pytest.mark.parametrize(
    ("path", "held"),
    [
        (f"/managed-ledgers/{ML_A}/sub-1", True),  # one of its cursors
        ("/managed-ledgers/t/a", True),  # its namespace's listing
        ("/managed-ledgers/t/b/persistent/logs", False),  # another topic
        ("/managed-ledgers/t/ab", False),
    ],
)
def test_which_bad_znodes_hold_an_orphan(path: str, held: bool) -> None:
    refs = _refs()
    refs.bad_znodes.append(BadPulsarZnode(path, "bad"))
    result = audit(refs, [LedgerFact(100, _owner(ML_A), True, OLD, 1)], now_ms=NOW)
    assert (result.orphans_held.count == 1) is held
    assert ((100, "orphan") in _found(result)) is not held


# --- the re-check --------------------------------------------------------------------------


def test_confirm_drops_what_changed_and_keeps_the_rest() -> None:
    result = _audit()
    fresh = {
        11: Recheck(exists=False, refs=()),  # trimmed by Pulsar meanwhile
        12: Recheck(exists=True, refs=(_ref(12),)),  # still referenced: stays
        21: Recheck(exists=True, refs=(_ref(21, RefKind.CURSOR, cursor="sub-2"),)),
        100: Recheck(exists=True, refs=(_ref(100),)),  # just added to its managed ledger
        101: Recheck(exists=False),  # deleted
        # 105: no fresh look: kept as found
    }
    done = confirm(result, fresh)
    assert _found(done) == {(12, "missing"), (105, "orphan")}
    assert done.dropped == Counter(
        {
            str(DropCause.REFERENCES_CHANGED): 2,
            str(DropCause.METADATA_CHANGED): 1,
            str(DropCause.LEDGER_DELETED): 1,
        }
    )
    ns = {row["namespace"]: row for row in done.to_json()["namespaces"]}
    assert (ns["t/a"]["missing"], ns["t/a"]["dangling_cursors"], ns["t/a"]["orphans"]) == (1, 0, 0)
    assert ns["t/b"]["orphans"] == 1


def test_confirm_offloaded_meanwhile_and_metadata_gone_meanwhile() -> None:
    result = _audit()
    fresh = {
        11: Recheck(exists=False, refs=(_ref(11, offloaded=True),)),
        12: Recheck(exists=False, refs=(_ref(12),)),  # deleted, still listed: missing all
    }
    done = confirm(result, fresh)
    missing = {f.ledger_id: f for f in done.findings if f.category is Category.MISSING}
    assert set(missing) == {12}
    assert missing[12].no_metadata and missing[12].violation().detail["reason"] == "no metadata"
    assert done.dropped == Counter({str(DropCause.REFERENCES_CHANGED): 1})


def test_a_missing_ledger_now_only_in_a_cursor_is_a_dangling_cursor() -> None:
    refs = PulsarRefs()
    refs.add(_ref(7))
    result = audit(refs, [], now_ms=NOW)
    done = confirm(result, {7: Recheck(False, (_ref(7, RefKind.CURSOR, cursor="c"),))})
    assert _found(done) == {(7, "dangling_cursor")}


def test_what_to_read_again() -> None:
    result = _audit()
    by_id = {f.ledger_id: f for f in result.findings}
    assert by_id[11].reread() == (frozenset({ML_A}), frozenset())
    assert by_id[100].reread() == (frozenset({ML_A}), frozenset())
    assert by_id[101].reread() == (frozenset(), frozenset())
    compacted = Owner("persistent://t/a/x", topic="persistent://t/a/x")
    schema = Owner("schema:t/a/y", schema_id="t/a/y")
    assert Finding(1, Category.ORPHAN, owner=compacted).reread() == (
        frozenset({"t/a/persistent/x"}),
        frozenset(),
    )
    assert Finding(1, Category.ORPHAN, owner=schema).reread() == (frozenset(), frozenset({"t/a/y"}))


# --- facts and names ---------------------------------------------------------------------


def test_fact_of_metadata() -> None:
    md = LedgerMetadata(
        ledger_id=9,
        format_version=3,
        ensemble_size=2,
        write_quorum=2,
        ack_quorum=2,
        state=LedgerState.CLOSED,
        segments=(Segment(0, ("b:1", "a:1")), Segment(5, ("c:1", "a:1"))),
        last_entry_id=9,
        length=123,
        ctime=OLD,
        custom_metadata=(("application", b"pulsar"), ("component", b"managed-ledger")),
    )
    assert fact_of(md) == LedgerFact(9, None, True, OLD, 123, True, ("a:1", "b:1", "c:1"))
    opened = fact_of(
        LedgerMetadata(9, 3, 1, 1, 1, LedgerState.OPEN, (Segment(0, ("a:1",)),), ctime=-1)
    )
    assert (opened.pulsar, opened.ctime_ms, opened.closed, opened.size) == (
        False,
        None,
        False,
        None,
    )
    owned = fact_of(
        LedgerMetadata(
            9,
            3,
            1,
            1,
            1,
            LedgerState.CLOSED,
            (Segment(0, ("a:1",)),),
            custom_metadata=(("pulsar/managed-ledger", ML_A.encode()),),
        )
    )
    assert owned.pulsar and owned.owner is not None and owned.owner.topic == TOPIC_A


def test_names() -> None:
    assert namespace_of_topic(TOPIC_A) == "t/a"
    assert namespace_of_topic("persistent://t/cluster/ns/x") == "t/cluster/ns"
    assert namespace_of_topic("nonsense") is None
    assert managed_ledger_of_named_topic(TOPIC_A) == ML_A
    assert managed_ledger_of_named_topic("persistent://t/c/ns/x") == "t/c/ns/persistent/x"
    assert managed_ledger_of_named_topic("x") is None
    # One rule for every name: the audit encodes a local name as Pulsar does (#29).
    assert managed_ledger_of_named_topic("persistent://t/ns/orders:eu") == (
        "t/ns/persistent/orders%3Aeu"
    )
    assert owner_place(None) == (UNKNOWN, UNKNOWN)
    assert owner_place(_owner(ML_B)) == ("t/b", TOPIC_B)
    # A schema's row is its topic's, decoded as every name is.
    assert owner_place(Owner("schema:t/a/y%3Az", schema_id="t/a/y%3Az")) == (
        "t/a",
        "persistent://t/a/y:z",
    )
    assert owner_place(Owner("schema:odd", schema_id="odd")) == (UNKNOWN, "schema:odd")
    assert owner_place(Owner("persistent://t/a/x", topic="persistent://t/a/x")) == (
        "t/a",
        "persistent://t/a/x",
    )


def test_a_partial_survives_pickling() -> None:
    refs, facts = _refs(), _facts()
    first, second = _partial(facts[:6], refs), _partial(facts[6:], refs)
    driver = PulsarAuditor(refs, now_ms=NOW)
    driver.merge(pickle.loads(pickle.dumps(first.partial())))
    driver.merge(pickle.loads(pickle.dumps(second.partial())))
    assert driver.finish(RISK).to_json() == _audit().to_json()


def _custom(*pairs: tuple[str, str]) -> Owner:
    owner = owner_of([("application", b"pulsar"), *((k, v.encode()) for k, v in pairs)])
    assert owner is not None
    return owner


def test_compacted_and_schema_ledgers_of_living_owners_are_held_not_orphans() -> None:
    """Pulsar may name them where ZooKeeper does not show: the compaction cursor's
    properties in its cursor ledger, schema versions trimmed from the locator's index."""
    compacted = ("component", "compacted-ledger")
    facts = [
        # the compacted ledger of t/a/orders, which exists: held
        LedgerFact(110, _custom(compacted, ("pulsar/compactedTopic", TOPIC_A)), True, OLD, 5),
        # the compacted ledger of a deleted topic: an orphan like any other
        LedgerFact(
            111,
            _custom(compacted, ("pulsar/compactedTopic", "persistent://t/a/gone")),
            True,
            OLD,
            6,
        ),
        # a pre-2.7 broker's compacted ledger (no component), of t/b/logs: held
        LedgerFact(112, _custom(("compactedTopic", TOPIC_B)), True, OLD, 7),
        # a compacted topic's name that is none (untrusted custom metadata): held, no crash
        LedgerFact(113, _custom(compacted, ("pulsar/compactedTopic", "garbage")), True, OLD, 8),
        # a schema ledger of t/a/orders' schema, which exists, not in its index: held
        LedgerFact(
            114, _custom(("component", "schema"), ("pulsar/schemaId", "t/a/orders")), True, OLD, 9
        ),
        # a schema ledger of a deleted schema: an orphan
        LedgerFact(
            115, _custom(("component", "schema"), ("pulsar/schemaId", "t/a/gone")), True, OLD, 10
        ),
    ]
    result = audit(_refs(), facts, now_ms=NOW)
    assert {lid for lid, c in _found(result) if c == "orphan"} == {111, 115}
    assert (result.orphans_held.count, result.orphans_held.ids) == (4, [110, 112, 113, 114])
