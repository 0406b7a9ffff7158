"""The placement core (spec §7.2-§7.5) and the pure parts of rack resolution."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from auditor.checks.findings import Category, SkipReason
from auditor.checks.placement import (
    Adherence,
    PlacementPolicy,
    PolicyKind,
    analyse_ledger,
    policy_kind,
    skip_reason,
)
from auditor.config import load_config
from auditor.errors import ConfigError
from auditor.metadata.model import LedgerState
from auditor.testing.cluster import make_metadata
from auditor.topology.locations import (
    DEFAULT_RACK,
    DEFAULT_REGION_RACK,
    DEFAULT_ZONE_UPGRADE_DOMAIN,
    InvalidLocationError,
    normalize_location,
    region_of,
    topology_location,
)
from auditor.topology.racks import (
    RackSourceError,
    load_racks_file,
    parse_json_racks,
    parse_pulsar_racks,
    parse_script_output,
)

B = [f"b{i}" for i in range(8)]
RACK = PlacementPolicy(PolicyKind.RACKAWARE)


def racks(*pairs: tuple[str, str]) -> dict[str, str]:
    return dict(pairs)


# --- which policy -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy", PolicyKind.RACKAWARE),
        ("RackawareEnsemblePlacementPolicy", PolicyKind.RACKAWARE),
        ("org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy", PolicyKind.ZONEAWARE),
        ("org.apache.bookkeeper.client.RegionAwareEnsemblePlacementPolicy", PolicyKind.REGIONAWARE),
        (" org.apache.bookkeeper.client.DefaultEnsemblePlacementPolicy ", PolicyKind.DEFAULT),
    ],
)
def test_policy_kind_matches_class_name_suffix(name: str, kind: PolicyKind) -> None:
    assert policy_kind(name) is kind


@pytest.mark.parametrize(
    "name",
    [
        "org.example.MyPolicy",
        "TopologyAwareEnsemblePlacementPolicy",
        "xRackawareEnsemblePlacementPolicy",
    ],
)
def test_unknown_policy_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match="ensemblePlacementPolicy"):
        policy_kind(name)


def test_policy_from_config_takes_bookkeeper_knobs() -> None:
    cfg = load_config(
        None,
        [
            "ensemblePlacementPolicy=org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy",
            "minNumRacksPerWriteQuorum=4",
            "enforceMinNumRacksPerWriteQuorum=true",
            "minNumZonesPerWriteQuorum=3",
            "desiredNumZonesPerWriteQuorum=4",
            "reppMinimumRegionsForDurability=3",
        ],
    )
    p = PlacementPolicy.from_config(cfg.bookkeeper, cluster_regions=frozenset({"a"}))
    assert p == PlacementPolicy(
        PolicyKind.ZONEAWARE, 4, True, 3, 4, 3, cluster_regions=frozenset({"a"})
    )
    assert p.default_location == DEFAULT_ZONE_UPGRADE_DOMAIN
    assert RACK.default_location == DEFAULT_RACK
    assert PlacementPolicy(PolicyKind.REGIONAWARE).default_location == DEFAULT_REGION_RACK


# --- rack-aware -------------------------------------------------------------------


def test_rackaware_window_wrapping_around_the_ensemble_fails() -> None:
    """S8's ensemble: windows 0..2 span 3 racks, window {b3, b4, b0} only 2."""
    locs = racks(("b0", "/r1"), ("b1", "/r2"), ("b2", "/r3"), ("b3", "/r1"), ("b4", "/r2"))
    policy = PlacementPolicy(PolicyKind.RACKAWARE, min_racks_per_write_quorum=3)
    v = policy.check(B[:5], 3, locs)
    assert v.adherence is Adherence.FAIL
    assert v.window_start == 3
    assert v.window == ("b3", "b4", "b0")
    assert v.window_locations == ("/r1", "/r2", "/r1")
    assert v.reason == "write quorum spans 2 rack(s), needs 3"


def test_rackaware_needs_only_min_of_write_quorum_and_min_racks() -> None:
    locs = racks(("b0", "/r1"), ("b1", "/r2"), ("b2", "/r1"), ("b3", "/r2"))
    # W=2 needs min(2, 4) = 2 racks: alternating racks is enough.
    policy = PlacementPolicy(PolicyKind.RACKAWARE, min_racks_per_write_quorum=4)
    assert policy.check(B[:4], 2, locs).adherence is Adherence.MEETS_STRICT
    # W=3 needs 3 racks, and there are only 2.
    assert policy.check(B[:4], 3, locs).adherence is Adherence.FAIL


def test_rackaware_write_quorum_one_or_min_racks_one_always_passes() -> None:
    assert RACK.check(B[:3], 1, {}).adherence is Adherence.MEETS_STRICT
    one = PlacementPolicy(PolicyKind.RACKAWARE, min_racks_per_write_quorum=1)
    assert one.check(B[:3], 3, {}).adherence is Adherence.MEETS_STRICT


def test_rackaware_all_default_rack_fails_like_upstream() -> None:
    v = RACK.check(B[:3], 3, {})
    assert v.adherence is Adherence.FAIL
    assert v.window_locations == (DEFAULT_RACK,) * 3


def test_rackaware_unmapped_bookie_counts_as_the_default_rack() -> None:
    """A bookie without a mapping is in /default-rack, which is a rack of its own."""
    locs = racks(("b0", "/r1"))
    assert RACK.check(B[:2], 2, locs).adherence is Adherence.MEETS_STRICT


def test_rackaware_enforce_fails_on_default_rack() -> None:
    locs = racks(("b0", "/r1"), ("b1", "/r2"))
    enforce = PlacementPolicy(PolicyKind.RACKAWARE, enforce_min_racks_per_write_quorum=True)
    assert enforce.check(B[:2], 2, locs).adherence is Adherence.MEETS_STRICT
    v = enforce.check(B[:3], 2, locs)
    assert v.adherence is Adherence.FAIL
    assert "enforceMinNumRacksPerWriteQuorum" in (v.reason or "")
    # Even with W = 1, as upstream: the default-rack rule does not depend on W.
    assert enforce.check(["b2"], 1, locs).adherence is Adherence.FAIL


def test_empty_ensemble_fails_except_default_policy() -> None:
    for kind in (PolicyKind.RACKAWARE, PolicyKind.ZONEAWARE, PolicyKind.REGIONAWARE):
        assert PlacementPolicy(kind).check([], 2, {}).adherence is Adherence.FAIL
    assert PlacementPolicy(PolicyKind.DEFAULT).check([], 2, {}).adherence is Adherence.MEETS_STRICT


def test_default_policy_always_strict() -> None:
    p = PlacementPolicy(PolicyKind.DEFAULT)
    assert p.check(B[:3], 3, {}).adherence is Adherence.MEETS_STRICT


# --- zone-aware -------------------------------------------------------------------

ZONES = {f"b{i}": f"/zone{i % 3}/ud{i % 2}" for i in range(6)}
ZONE = PlacementPolicy(PolicyKind.ZONEAWARE)


def test_zoneaware_s14_layouts() -> None:
    assert ZONE.check(B[:6], 6, ZONES).adherence is Adherence.MEETS_STRICT
    whole = ZONE.check(B[:6], 5, ZONES)
    assert whole.adherence is Adherence.FAIL
    assert whole.window_start is None
    assert whole.reason == "ensemble size 6 is not a multiple of write quorum 5"
    soft = ZONE.check(["b0", "b1", "b3", "b4"], 4, ZONES)
    assert soft.adherence is Adherence.MEETS_SOFT
    assert soft.reason == "write quorum spans 2 zone(s), desired 3"


def test_zoneaware_write_quorum_not_above_min_zones_fails() -> None:
    v = ZONE.check(["b0", "b1"], 2, ZONES)
    assert v.adherence is Adherence.FAIL
    assert "minNumZonesPerWriteQuorum" in (v.reason or "")


def test_zoneaware_unresolved_location_fails() -> None:
    for bad in (None, "/zone0", "/zone0/ud0/extra", DEFAULT_ZONE_UPGRADE_DOMAIN):
        locs = dict(ZONES)
        if bad is None:
            del locs["b0"]
        else:
            locs["b0"] = bad
        v = ZONE.check(B[:3], 3, locs)
        assert v.adherence is Adherence.FAIL, bad
        assert "b0" in (v.reason or "")


def test_zoneaware_too_few_zones_fails() -> None:
    locs = {"b0": "/z0/u0", "b1": "/z0/u1", "b2": "/z0/u2"}
    v = ZONE.check(B[:3], 3, locs)
    assert v.adherence is Adherence.FAIL
    assert v.reason == "write quorum spans 1 zone(s), needs 2"


def test_zoneaware_upgrade_domain_rule() -> None:
    # Zone z0 holds two bookies of the quorum in one upgrade domain: FAIL, even
    # though the zone count alone would be soft.
    same_ud = {"b0": "/z0/u0", "b1": "/z0/u0", "b2": "/z1/u0"}
    v = ZONE.check(B[:3], 3, same_ud)
    assert v.adherence is Adherence.FAIL
    assert "z0" in (v.reason or "")
    two_ud = {"b0": "/z0/u0", "b1": "/z0/u1", "b2": "/z1/u0"}
    assert ZONE.check(B[:3], 3, two_ud).adherence is Adherence.MEETS_SOFT
    three = {"b0": "/z0/u0", "b1": "/z1/u0", "b2": "/z2/u0"}
    assert ZONE.check(B[:3], 3, three).adherence is Adherence.MEETS_STRICT


def test_zoneaware_desired_capped_by_write_quorum() -> None:
    locs = {"b0": "/z0/u0", "b1": "/z1/u0", "b2": "/z2/u0"}
    wide = PlacementPolicy(
        PolicyKind.ZONEAWARE, min_zones_per_write_quorum=2, desired_zones_per_write_quorum=5
    )
    assert wide.check(B[:3], 3, locs).adherence is Adherence.MEETS_STRICT


# --- region-aware (our own check) -------------------------------------------------


def regional(regions: set[str], min_regions_for_durability: int = 2) -> PlacementPolicy:
    return PlacementPolicy(
        PolicyKind.REGIONAWARE,
        min_regions_for_durability=min_regions_for_durability,
        cluster_regions=frozenset(regions),
    )


@pytest.mark.parametrize(
    ("location", "region"),
    [
        ("/east/rack1", "east"),
        ("/east", "east"),
        (DEFAULT_REGION_RACK, None),
        ("/default-region/r7", None),
        (DEFAULT_RACK, None),
        ("/", None),
    ],
)
def test_region_of(location: str, region: str | None) -> None:
    assert region_of(location) == region


def test_regionaware_quorum_in_one_region_fails_when_cluster_has_two() -> None:
    """Upstream always passes; with two regions in the cluster we require two per quorum."""
    locs = {"b0": "/east/r1", "b1": "/east/r2", "b2": "/west/r1"}
    v = regional({"east", "west"}).check(["b0", "b1"], 2, locs)
    assert v.adherence is Adherence.FAIL
    assert v.window_locations == ("/east/r1", "/east/r2")
    assert v.reason == "write quorum spans 1 known region(s), needs 2 (the cluster has 2)"
    assert regional({"east", "west"}).check(["b0", "b2"], 2, locs).adherence is (
        Adherence.MEETS_STRICT
    )


def test_regionaware_single_region_always_passes() -> None:
    locs = {"b0": "/east/r1", "b1": "/east/r1"}
    assert regional({"east"}).check(["b0", "b1"], 2, locs).adherence is Adherence.MEETS_STRICT
    assert regional(set()).check(["b0", "b1"], 2, {}).adherence is Adherence.MEETS_STRICT


def test_regionaware_required_is_min_of_w_min_regions_and_cluster_regions() -> None:
    locs = {"b0": "/a/r", "b1": "/b/r", "b2": "/a/r", "b3": "/c/r"}
    three = {"a", "b", "c"}
    # min(W=3, durability=2, 3 regions) = 2: a window {a, b, a} is fine.
    assert regional(three).check(B[:3], 3, locs).adherence is Adherence.MEETS_STRICT
    # With durability 3, the window {a, b, a} FAILs.
    assert regional(three, min_regions_for_durability=3).check(B[:3], 3, locs).adherence is (
        Adherence.FAIL
    )
    # W = 1 needs one region only.
    assert regional(three).check(["b0"], 1, locs).adherence is Adherence.MEETS_STRICT
    # durability 1 turns the check off.
    assert (
        regional(three, min_regions_for_durability=1).check(["b0", "b2"], 2, locs).adherence
        is Adherence.MEETS_STRICT
    )


def test_regionaware_unknown_region_adds_nothing() -> None:
    locs = {"b0": "/east/r1"}  # b1 has the default location: no known region
    v = regional({"east", "west"}).check(["b0", "b1"], 2, locs)
    assert v.adherence is Adherence.FAIL
    assert v.window_locations == ("/east/r1", DEFAULT_REGION_RACK)


@given(
    n=st.integers(1, 7),
    wq=st.integers(1, 7),
    shift=st.integers(0, 6),
    labels=st.lists(st.sampled_from(["/a/x", "/a/y", "/b/x", "/c/y"]), min_size=7, max_size=7),
    kind=st.sampled_from([PolicyKind.RACKAWARE, PolicyKind.ZONEAWARE, PolicyKind.REGIONAWARE]),
)
def test_adherence_does_not_depend_on_where_the_ensemble_starts(
    n: int, wq: int, shift: int, labels: list[str], kind: PolicyKind
) -> None:
    """Windows wrap around, so rotating an ensemble gives the same verdict."""
    wq = min(wq, n)
    ensemble = B[:n]
    locs = dict(zip(B, labels, strict=False))
    policy = PlacementPolicy(kind, cluster_regions=frozenset({"a", "b", "c"}))
    rotated = ensemble[shift % n :] + ensemble[: shift % n]
    assert policy.check(ensemble, wq, locs).adherence is policy.check(rotated, wq, locs).adherence


# --- ledger verdicts --------------------------------------------------------------

S13 = {f"b{i}": f"/r{i % 4 + 1}" for i in range(7)}  # b0 r1, b1 r2, b2 r3, b3 r4, b4 r1, ...


def test_ledger_with_several_failing_segments_lists_each_once() -> None:
    """S13: two segments span only 3 racks; the ledger is one violation listing both."""
    policy = PlacementPolicy(PolicyKind.RACKAWARE, min_racks_per_write_quorum=4)
    md = make_metadata(
        2,
        [
            (0, B[:5]),
            (20, ["b0", "b1", "b2", "b4", "b5"]),
            (40, ["b0", "b1", "b2", "b4", "b6"]),
        ],
        write_quorum=5,
        ack_quorum=2,
        last_entry_id=100,
    )
    found = analyse_ledger(md, policy, S13)
    assert found.adherence is Adherence.FAIL
    assert found.category is Category.PLACEMENT_NOT_ADHERING
    detail = found.detail()
    assert detail["policy"] == "RackawareEnsemblePlacementPolicy"
    assert (detail["write_quorum"], detail["ack_quorum"]) == (5, 2)
    assert [s["first_entry"] for s in detail["segments"]] == [20, 40]
    assert detail["segments"][0] == {
        "first_entry": 20,
        "ensemble": ["b0", "b1", "b2", "b4", "b5"],
        "adherence": "FAIL",
        "reason": "write quorum spans 3 rack(s), needs 4",
        "window": {
            "start": 0,
            "bookies": ["b0", "b1", "b2", "b4", "b5"],
            "locations": ["/r1", "/r2", "/r3", "/r1", "/r2"],
        },
    }


def test_ledger_adhering_in_every_segment_has_no_category() -> None:
    policy = PlacementPolicy(PolicyKind.RACKAWARE, min_racks_per_write_quorum=4)
    md = make_metadata(1, [(0, B[:5]), (20, B[1:6])], write_quorum=5, last_entry_id=100)
    found = analyse_ledger(md, policy, S13)
    assert found.adherence is Adherence.MEETS_STRICT
    assert found.category is None
    assert found.segments == ()


def test_soft_ledger_lists_soft_segments_and_fail_beats_soft() -> None:
    soft_seg = ["b0", "b1", "b3", "b4"]
    md = make_metadata(4, [(0, soft_seg), (10, B[:4])], write_quorum=4, last_entry_id=20)
    locs = dict(ZONES)
    found = analyse_ledger(md, ZONE, locs)
    # B[:4] = zones 0,1,2,0 with ud 0,1,0,1: 3 zones, strict; the first segment is soft.
    assert found.category is Category.PLACEMENT_SOFTLY_ADHERING
    assert [s.first_entry_id for s in found.segments] == [0]
    del locs["b2"]
    found = analyse_ledger(md, ZONE, locs)
    assert found.category is Category.PLACEMENT_NOT_ADHERING
    assert [s.first_entry_id for s in found.segments] == [10]


def test_only_closed_ledgers_are_judged() -> None:
    def md(state: LedgerState) -> object:
        return skip_reason(make_metadata(1, B[:3], state=state))

    assert md(LedgerState.OPEN) is SkipReason.OPEN
    assert md(LedgerState.IN_RECOVERY) is SkipReason.IN_RECOVERY
    assert md(LedgerState.CLOSED) is None
    # Empty closed ledgers are judged too, as upstream.
    assert skip_reason(make_metadata(1, B[:3], last_entry_id=-1)) is None


# --- rack sources: the pure parsing -----------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("/rack1", "/rack1"),
        ("rack1", "/rack1"),
        ("/region/rack/", "/region/rack"),
        (" region/rack// ", "/region/rack"),
        ("/", None),
        ("", None),
        ("   ", None),
    ],
)
def test_normalize_location(raw: str, normal: str | None) -> None:
    assert normalize_location(raw) == normal


def test_json_racks() -> None:
    text = '{"10.0.0.1:3181": "/r1", "bk-2": "r2/", "host3": "", "x": null, "y": "/", " h7": "/r7"}'
    assert parse_json_racks(text, "f") == {"10.0.0.1:3181": "/r1", "bk-2": "/r2", "h7": "/r7"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ('["/r1"]', "must be a JSON object"),
        ('{"b": 3}', "must be a string"),
        ('{"b": {"rack": "/r"}}', "must be a string"),
    ],
)
def test_json_racks_malformed(text: str, message: str) -> None:
    with pytest.raises(RackSourceError, match=message):
        parse_json_racks(text, "racks file f")


@pytest.mark.parametrize("name", ["racks.yaml", "racks.yml", "racks.Yml"])
def test_yaml_racks_files_are_refused(tmp_path: Path, name: str) -> None:
    """No YAML reader: a YAML racks file is one ConfigError line saying to use JSON."""
    path = tmp_path / name
    path.write_text("10.0.0.1:3181: /r1\n")
    with pytest.raises(ConfigError) as err:
        load_racks_file(path)
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        f"racks file {path} is YAML, which is not read: write the same mapping as a JSON "
        'object {"<bookie>": "</rack>"} in a .json file'
    )
    # The same mapping as JSON is read.
    as_json = tmp_path / "racks.json"
    as_json.write_text('{"10.0.0.1:3181": "/r1"}')
    assert dict(load_racks_file(as_json).by_key) == {"10.0.0.1:3181": "/r1"}


def test_pulsar_racks() -> None:
    data = b"""{
      "default": {
        "10.0.0.1:3181": {"rack": "/r1", "hostname": "bk1.example"},
        "10.0.0.2:3181": {"rack": "r2"},
        "10.0.0.3:3181": {"rack": "", "hostname": "bk3.example"},
        "10.0.0.4:3181": {"rack": "/"},
        "10.0.0.5:3181": {"rack": "/r5"},
        "10.0.0.5:3182": {"rack": "/r6"}
      },
      "other": {"custom-id": {"rack": "/r7/"}}
    }"""
    m = parse_pulsar_racks(data, "/bookies")
    assert m.name == "znode:/bookies"
    assert dict(m.by_key) == {
        "10.0.0.1:3181": "/r1",
        "10.0.0.2:3181": "/r2",
        "10.0.0.5:3181": "/r5",
        "10.0.0.5:3182": "/r6",
        "custom-id": "/r7",
    }
    # Host 10.0.0.5 has two bookies in different racks: the host alone says nothing.
    assert dict(m.by_host) == {"bk1.example": "/r1", "10.0.0.1": "/r1", "10.0.0.2": "/r2"}
    assert dict(parse_pulsar_racks(b"{}", "/bookies").by_key) == {}
    assert dict(parse_pulsar_racks(b"", "/bookies").by_key) == {}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{oops", "not valid JSON"),
        (b"[]", "JSON object of groups"),
        (b'{"default": []}', "group 'default'"),
        (b'{"default": {"b": "/r1"}}', "must be an object"),
        (b'{"default": {"b": {"rack": 1}}}', "rack of default/b"),
        (b'{"default": {"b": {"rack": "/r", "hostname": 2}}}', "hostname of default/b"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_pulsar_racks_malformed(data: bytes, message: str) -> None:
    with pytest.raises(RackSourceError, match=message):
        parse_pulsar_racks(data, "/bookies")


def test_script_output() -> None:
    assert parse_script_output("/r1 /r2/\n\t/r3\n", 3) == ["/r1", "/r2", "/r3"]
    assert parse_script_output("/r1\n", 2) is None
    assert parse_script_output("", 0) == []
    assert parse_script_output("/zone/ud /z2/ud2/\n", 2) == ["/zone/ud", "/z2/ud2"]


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("/r1", "/r1"),
        ("/r1/", "/r1"),
        ("/region/rack", "/region/rack"),
        ("/zone/ud/", "/zone/ud"),
        ("/default-rack", "/default-rack"),
    ],
)
def test_topology_location_accepts(raw: str, normal: str) -> None:
    assert topology_location(raw) == normal


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("", "does not start with /"),
        ("r1", "does not start with /"),
        ("rack-b/", "does not start with /"),
        ("/", "names the root, not a rack"),
        ("//", "has an empty level"),
        ("/a//b", "has an empty level"),
        ("//a", "has an empty level"),
        ("/a//", "has an empty level"),
    ],
)
def test_topology_location_refuses(raw: str, why: str) -> None:
    with pytest.raises(InvalidLocationError) as err:
        topology_location(raw)
    assert str(err.value) == why


@pytest.mark.parametrize(
    ("stdout", "count", "message"),
    [
        ("/r1\nrack-b\n", 2, "s line 2: location 'rack-b' does not start with /"),
        ("/r1 /\n", 2, "s line 1: location '/' names the root, not a rack"),
        ("\n\n/a//b\n", 1, "s line 3: location '/a//b' has an empty level"),
        # Checked whatever the count: a wrong count does not hide a bad location.
        ("/r1 r2 r3\n", 1, "s line 1: location 'r2' does not start with /"),
        (
            "/r1\n/region/r2\n",
            2,
            "s line 2: location '/region/r2' has 2 level(s) where its other locations have 1 "
            "(BookKeeper's topology keeps every bookie at one depth)",
        ),
        ("x" * 100, 1, "s line 1: location '" + "x" * 60 + "'... does not start with /"),
    ],
)
def test_script_output_refuses_what_the_topology_would(
    stdout: str, count: int, message: str
) -> None:
    with pytest.raises(RackSourceError) as err:
        parse_script_output(stdout, count, "s")
    assert str(err.value) == message


def test_script_output_keeps_the_depth_of_earlier_answers() -> None:
    assert parse_script_output("/a/b\n", 1, "s", depth=2) == ["/a/b"]
    with pytest.raises(
        RackSourceError, match="has 1 level\\(s\\) where its other locations have 2"
    ):
        parse_script_output("/a\n", 1, "s", depth=2)


def test_rack_source_errors_stop_the_check() -> None:
    assert RackSourceError("x").exit_code == 2
