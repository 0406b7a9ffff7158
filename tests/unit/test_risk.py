"""The pure risk core: write sets per segment, severities, domains, the tally."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from auditor.analysis.risk import (
    SAMPLE,
    Domain,
    DomainKey,
    LedgerRisk,
    Place,
    RiskReport,
    Severity,
    domain_keys,
    ledger_risk,
    place_of,
    worst_severity,
    write_sets,
)
from auditor.metadata.model import LedgerMetadata, LedgerState
from auditor.testing.cluster import Ensembles, make_metadata

B = [f"b{i}:3181" for i in range(6)]
BELOW, NONE = Severity.BELOW_ACK_QUORUM, Severity.NO_COPY


def md(
    ensembles: Ensembles,
    w: int,
    a: int,
    last: int = 9,
    state: LedgerState = LedgerState.CLOSED,
    lid: int = 1,
) -> LedgerMetadata:
    return make_metadata(
        lid, ensembles, write_quorum=w, ack_quorum=a, last_entry_id=last, state=state
    )


def risk(
    ensembles: Ensembles,
    w: int,
    a: int,
    locations: Mapping[str, str],
    *,
    available: Sequence[str] = B,
    last: int = 9,
) -> LedgerRisk:
    return ledger_risk(md(ensembles, w, a, last), keys_of(locations), set(available))


def keys_of(locations: Mapping[str, str]) -> Callable[[str], tuple[DomainKey, ...]]:
    keys = {b: domain_keys(b, place_of(locations.get(b))) for b in B}
    return keys.__getitem__


def test_place_of_locations() -> None:
    assert place_of("/r1") == Place("/r1", None)
    assert place_of("/east/r1") == Place("/east/r1", "east")
    assert place_of("/z1/ud2") == Place("/z1/ud2", "z1")
    assert place_of("/default-region/r1") == Place("/default-region/r1", None)
    for unknown in (None, "", "/default-rack", "/default-region/default-rack"):
        assert place_of(unknown) == Place(None, None)
    assert place_of("/default-zone/default-upgradedomain") == Place(None, None)


def test_write_sets_are_at_most_e_per_segment_and_follow_the_entries() -> None:
    e3 = [B[0], B[1], B[2]]
    assert list(write_sets(md(e3, 2, 2))) == [(B[0], B[1]), (B[1], B[2]), (B[2], B[0])]
    # One entry (id 0): only its write set; two entries starting at 4: residues 1 and 2.
    assert list(write_sets(md(e3, 2, 2, last=0))) == [(B[0], B[1])]
    two = md([(0, e3), (4, [B[3], B[4], B[5]])], 2, 2, last=5)
    assert list(write_sets(two)) == [
        (B[0], B[1]),
        (B[1], B[2]),
        (B[2], B[0]),
        (B[4], B[5]),
        (B[5], B[3]),
    ]
    # A closed empty ledger, and an open one, hold nothing countable in their last segment.
    assert list(write_sets(md(e3, 2, 2, last=-1))) == []
    assert list(write_sets(md(e3, 2, 2, state=LedgerState.OPEN))) == []


def test_e3_w2_a2_a_rack_holding_a_whole_write_set_leaves_no_copy() -> None:
    racks = {B[0]: "/r1", B[1]: "/r1", B[2]: "/r2"}
    r = risk([B[0], B[1], B[2]], 2, 2, racks)
    assert r.already is Severity.OK
    assert dict(r.domains) == {
        (Domain.BOOKIE, B[0]): BELOW,
        (Domain.BOOKIE, B[1]): BELOW,
        (Domain.BOOKIE, B[2]): BELOW,
        (Domain.RACK, "/r1"): NONE,
        (Domain.RACK, "/r2"): BELOW,
    }
    assert r.worst is NONE


def test_e3_w3_a3_any_single_loss_is_below_ack_quorum() -> None:
    racks = {B[0]: "/r1", B[1]: "/r2", B[2]: "/r3"}
    r = risk([B[0], B[1], B[2]], 3, 3, racks)
    assert dict(r.domains) == {
        (Domain.BOOKIE, B[0]): BELOW,
        (Domain.BOOKIE, B[1]): BELOW,
        (Domain.BOOKIE, B[2]): BELOW,
        (Domain.RACK, "/r1"): BELOW,
        (Domain.RACK, "/r2"): BELOW,
        (Domain.RACK, "/r3"): BELOW,
    }
    # All three in one rack: that rack takes every copy.
    same = risk([B[0], B[1], B[2]], 3, 3, dict.fromkeys(B[:3], "/r1"))
    assert dict(same.domains)[Domain.RACK, "/r1"] is NONE


def test_e3_w3_a2_tolerates_one_bookie_but_not_a_rack_with_two() -> None:
    racks = {B[0]: "/r1", B[1]: "/r1", B[2]: "/r2"}
    r = risk([B[0], B[1], B[2]], 3, 2, racks)
    assert dict(r.domains) == {(Domain.RACK, "/r1"): BELOW}


def test_multiple_segments_each_bookie_charged_where_it_holds_entries() -> None:
    racks = {B[0]: "/r1", B[1]: "/r2", B[2]: "/r3", B[3]: "/r3", B[4]: "/r1"}
    # Entries 0-4 on b0,b1,b2; entries 5-9 on b0,b3,b4 (b3 and b4 share nothing but rack r1/r3).
    r = risk([(0, [B[0], B[1], B[2]]), (5, [B[0], B[3], B[4]])], 2, 2, racks)
    d = dict(r.domains)
    assert {k for k in d if k[0] is Domain.BOOKIE} == {(Domain.BOOKIE, b) for b in B[:5]}
    # Write set (b4, b0) of segment 2 is all in /r1; (b2, b0) of segment 1 is not.
    assert d[Domain.RACK, "/r1"] is NONE
    assert d[Domain.RACK, "/r3"] is BELOW
    # A segment shorter than its ensemble: entry 5 (residue 2) alone uses write set
    # (b4, b0), which rack r1 wipes out; b3 then holds nothing.
    short = risk([(0, [B[0], B[1], B[2]]), (5, [B[0], B[3], B[4]])], 2, 2, racks, last=5)
    assert dict(short.domains)[Domain.RACK, "/r1"] is NONE
    assert (Domain.BOOKIE, B[3]) not in dict(short.domains)


def test_region_domain() -> None:
    racks = {B[0]: "/east/r1", B[1]: "/east/r2", B[2]: "/west/r3"}
    r = risk([B[0], B[1], B[2]], 3, 2, racks)
    assert dict(r.domains) == {(Domain.REGION, "east"): BELOW}
    r2 = risk([B[0], B[1], B[2]], 2, 2, racks)
    d = dict(r2.domains)
    assert d[Domain.REGION, "east"] is NONE
    assert d[Domain.REGION, "west"] is BELOW
    assert d[Domain.RACK, "/east/r1"] is BELOW


def test_already_lost_bookies_count_as_gone() -> None:
    racks = {B[0]: "/r1", B[1]: "/r2", B[2]: "/r3"}
    available = [B[0], B[2]]
    r = risk([B[0], B[1], B[2]], 2, 2, racks, available=available)
    assert r.already is BELOW
    # b0 and b2 each take the last copy of a write set that already lost b1; (b2, b0)
    # drops to one copy only.
    assert dict(r.domains) == {
        (Domain.BOOKIE, B[0]): NONE,
        (Domain.BOOKIE, B[2]): NONE,
        (Domain.RACK, "/r1"): NONE,
        (Domain.RACK, "/r3"): NONE,
    }
    gone = {B[1]}
    assert worst_severity(md([B[0], B[1], B[2]], 2, 2), gone.__contains__) is BELOW


def test_unlocated_bookies_are_only_bookie_domains() -> None:
    r = risk([B[0], B[1], B[2]], 2, 2, {})
    assert {k[0] for k, _ in r.domains} == {Domain.BOOKIE}


def test_report_top_order_samples_and_json() -> None:
    report = RiskReport(started_at=0.0, finished_at=1.0)
    racks = {B[0]: "/r1", B[1]: "/r1", B[2]: "/r2", B[3]: "/r2"}
    for lid in range(1, SAMPLE + 3):
        report.add(ledger_risk(md([B[0], B[1], B[2]], 2, 2, lid=lid), keys_of(racks), set(B)))
    report.add(ledger_risk(md([B[2], B[3], B[4]], 2, 2, lid=500), keys_of(racks), set(B)))
    assert [name for name, _ in report.top(Domain.RACK, 5)] == ["/r2", "/r1"]
    doc = report.to_json(top=2)
    n = SAMPLE + 2
    assert doc["top"]["rack"] == [
        {
            "name": "/r2",
            "ledgers": n + 1,
            "below_ack_quorum": {"count": n, "ledgers": list(range(1, SAMPLE + 1))},
            "no_copy": {"count": 1, "ledgers": [500]},
        },
        {
            "name": "/r1",
            "ledgers": n,
            "below_ack_quorum": {"count": 0, "ledgers": []},
            "no_copy": {"count": n, "ledgers": list(range(1, SAMPLE + 1))},
        },
    ]
    assert [row["name"] for row in doc["top"]["bookie"]] == [B[2], B[0]]
    assert doc["domains_at_risk"] == {"bookie": 5, "rack": 2, "region": 0}
    assert doc["at_risk"]["no_copy"]["count"] == n + 1
    assert doc["already"] == {
        "below_ack_quorum": {"count": 0, "ledgers": []},
        "no_copy": {"count": 0, "ledgers": []},
    }
    assert doc["started_at"] == "1970-01-01T00:00:00Z"
