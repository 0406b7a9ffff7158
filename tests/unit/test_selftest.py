"""The detector self-test: every fixture passes on the real cores, a broken core is caught.

Each broken core below is a plausible regression of one check (an off-by-one
at the grace boundary, a segment forgotten, a digest not verified...), handed
in through `Cores`; the self-test must fail for exactly that check and
exactly the fixtures that carry the defect, and pass for every other check.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Set
from dataclasses import replace
from typing import Any

import pytest

from auditor.bookie.results import EntryRead, Ok, Outcome
from auditor.checks.bookie_check import LedgerLoss, ledger_loss
from auditor.checks.findings import CATEGORIES, Category
from auditor.checks.grace import past_grace
from auditor.checks.ledger_check import classify_read
from auditor.checks.placement import LedgerPlacement, PlacementPolicy, analyse_ledger
from auditor.checks.pulsar_audit import PulsarAudit
from auditor.checks.pulsar_audit import audit as pulsar_audit
from auditor.checks.replicas import BookieAnswer, ReplicasVerdict, analyse
from auditor.checks.scrub import LedgerScrub, scrub_ledger
from auditor.cli.main import main
from auditor.daemon.config import SelfTestSection, load_daemon_config
from auditor.daemon.metrics import Metrics
from auditor.errors import ConfigError
from auditor.metadata.model import DigestType, LedgerMetadata
from auditor.metadata.pulsar.refs import PulsarRefs
from auditor.metadata.registry import BookieSet
from auditor.metadata.serde import LedgerMetadataFormatError, decode_ledger_metadata
from auditor.schedule.lost_bookie_delay import LostBookieDelay
from auditor.selftest.canary import (
    CORRUPT_ID,
    NO_REPLICA_ID,
    ONE_RACK_ID,
    SPREAD_ID,
    CanaryLayout,
    validate_canary_root,
)
from auditor.selftest.cases import COVERAGE, all_cases, run_selftest
from auditor.selftest.harness import (
    SELFTEST_CHECKS,
    Cores,
    FixtureFailure,
    SelfTestResult,
)

FIXTURES = {
    "replicas": 9,
    "placement": 9,
    "grace": 4,
    "bookies": 8,
    "ledgers": 5,
    "metadata": 10,
    "pulsar": 10,
    "scrub": 5,
}


def _failed(results: list[SelfTestResult]) -> dict[str, list[str]]:
    return {r.check: [f.fixture for f in r.failures] for r in results if not r.ok}


def test_every_fixture_is_detected_by_the_current_cores() -> None:
    results = run_selftest()
    assert [r.check for r in results] == list(SELFTEST_CHECKS)
    assert {r.check: r.fixtures for r in results} == FIXTURES
    assert _failed(results) == {}
    assert all(r.ok and r.error is None for r in results)


def test_every_category_of_every_check_has_a_defect_fixture() -> None:
    every = {str(c) for cats in CATEGORIES.values() for c in cats}
    assert set(COVERAGE) == every == {str(c) for c in Category}
    names = {f"{c.check}/{c.name}" for c in all_cases()}
    assert len(names) == len(all_cases())  # fixture names are unique
    for category, fixtures in COVERAGE.items():
        assert fixtures and set(fixtures) <= names, category


# --- broken cores: exactly that check fails ---------------------------------------------


def _ack_quorum_forgotten(
    md: LedgerMetadata, answers: Mapping[str, BookieAnswer]
) -> ReplicasVerdict:
    v = analyse(md, answers)
    if v.category is Category.BELOW_ACK_QUORUM:
        return replace(v, category=Category.BELOW_WRITE_QUORUM)
    return v


def _first_segment_only(
    md: LedgerMetadata, policy: PlacementPolicy, locations: Mapping[str, str]
) -> LedgerPlacement:
    return analyse_ledger(replace(md, segments=md.segments[:1]), policy, locations)


def _grace_inclusive(
    ledger_id: int, now_ms: int, ctime: int, grace_s: int, replicas: Any = ()
) -> Any:
    """`>=` where BookKeeper's rule is `>`: a mark exactly at the grace period is flagged."""
    at_boundary = grace_s > 0 and ctime >= 0 and (now_ms - ctime) // 1000 == grace_s
    return past_grace(ledger_id, now_ms + (1000 if at_boundary else 0), ctime, grace_s, replicas)


def _loss_first_segment(md: LedgerMetadata, available: Set[str], version: int) -> LedgerLoss | None:
    return ledger_loss(replace(md, segments=md.segments[:1]), available, version)


class _NeverCancels(LostBookieDelay):
    """A returning bookie no longer cancels the pending audit."""

    def _cancel(self, out: list[Any]) -> None:
        return None


def _no_digest_check(md: LedgerMetadata, entry_id: int, outcome: Outcome[EntryRead]) -> str | None:
    return None if isinstance(outcome, Ok) else classify_read(md, entry_id, outcome)


_LAST_GOOD = decode_ledger_metadata(
    b"BookieMetadataFormatVersion\t1\n2\n3\n60\n0\ta:1\tb:1\tc:1\n5\tCLOSED", 4242
)


def _lenient_decoder(data: bytes, ledger_id: int) -> LedgerMetadata:
    """Swallows decoding errors (a fallback value instead): nothing is ever invalid."""
    try:
        return decode_ledger_metadata(data, ledger_id)
    except LedgerMetadataFormatError:
        return _LAST_GOOD


def _digest_ignored(md: Any, copies: Any, digest: Any, *args: Any) -> LedgerScrub:
    """A scrub that never checks digests (compares payloads only)."""
    return scrub_ledger(md, copies, DigestType.DUMMY, *args)


def _offload_forgotten(refs: PulsarRefs, facts: Any, **kw: Any) -> PulsarAudit:
    """Offloaded ledgers judged like any other: their BookKeeper copy counts as data."""
    forgetful = PulsarRefs()
    forgetful.add_all(replace(r, offloaded=False) for rs in refs.refs.values() for r in rs)
    forgetful.managed_ledgers |= refs.managed_ledgers
    return pulsar_audit(forgetful, facts, **kw)


def _raises(md: LedgerMetadata, answers: Mapping[str, BookieAnswer]) -> ReplicasVerdict:
    raise RuntimeError("core crashed")


@pytest.mark.parametrize(
    ("cores", "check", "fixtures"),
    [
        (Cores(replicas=_ack_quorum_forgotten), "replicas", ["below_ack_quorum"]),
        (Cores(placement=_first_segment_only), "placement", ["rackaware_bad_second_segment"]),
        (Cores(grace=_grace_inclusive), "grace", ["at_grace_boundary"]),
        (Cores(lost_bookies=_loss_first_segment), "bookies", ["lost_in_later_segment"]),
        (
            Cores(delay=_NeverCancels),
            "bookies",
            [
                "restart_at_election_is_held",
                "bookie_back_cancels_audit",
                "second_loss_audits_at_once",
            ],
        ),
        (Cores(classify=_no_digest_check), "ledgers", ["entry_of_another_id", "digest_mismatch"]),
        (
            Cores(decode=_lenient_decoder),
            "metadata",
            [
                "v3_garbage",
                "no_header",
                "unsupported_version",
                "v3_truncated",
                "v2_ack_above_write",
                "v2_short_ensemble",
                "v1_garbage",
            ],
        ),
        (Cores(pulsar=_offload_forgotten), "pulsar", ["offloaded_not_missing"]),
        (Cores(scrub=_digest_ignored), "scrub", ["corrupt_copy"]),
    ],
    ids=[
        "replicas",
        "placement",
        "grace",
        "bookie-selection",
        "bookie-delay",
        "ledgers",
        "metadata",
        "pulsar",
        "scrub",
    ],
)
def test_a_broken_core_fails_exactly_its_check(
    cores: Cores, check: str, fixtures: list[str]
) -> None:
    results = run_selftest(cores)
    assert _failed(results) == {check: fixtures}
    assert {r.check: r.fixtures for r in results} == FIXTURES


def test_a_core_that_raises_fails_every_fixture_it_meets_with_the_error() -> None:
    results = run_selftest(Cores(replicas=_raises))
    failed = next(r for r in results if r.check == "replicas")
    assert len(failed.failures) == 9
    assert {f.got for f in failed.failures} == {"'raised RuntimeError: core crashed'"}
    assert _failed(results).keys() == {"replicas"}


def test_result_json_and_summary() -> None:
    failure = FixtureFailure("below_ack_quorum", "'a'", "'b'")
    result = SelfTestResult("replicas", 9, (failure, failure))
    assert result.to_json() == {
        "check": "replicas",
        "ok": False,
        "fixtures": 9,
        "failures": [{"fixture": "below_ack_quorum", "expected": "'a'", "got": "'b'"}] * 2,
    }
    assert result.summary() == (
        "replicas: FAILED fixture below_ack_quorum: expected 'a', got 'b' (and 1 more)"
    )
    broken = SelfTestResult("canary_replicas", 0, error="no registered bookie")
    assert not broken.ok
    assert broken.summary() == "canary_replicas: FAILED: no registered bookie"
    assert SelfTestResult("grace", 4).summary() == "grace: ok (4 fixtures)"


# --- the CLI -------------------------------------------------------------------------------


def test_cli_selftest_json_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["selftest", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "ok": True,
        "checks": [
            {"check": c, "ok": True, "fixtures": n, "failures": []} for c, n in FIXTURES.items()
        ],
    }


def test_cli_selftest_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["selftest"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{c}: ok ({n} fixtures)" for c, n in FIXTURES.items()
    ]


def test_cli_selftest_bad_flag_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["selftest", "--nope"]) == 2
    err = capsys.readouterr().err
    assert err == "bk-auditor: error: bk-auditor: unrecognized arguments: --nope\n"


# --- config, metrics, canary layout ---------------------------------------------------------

BASE = ["daemon.zk=zk:2181", "daemon.identity=me:1"]


def test_selftest_config_defaults_and_overrides() -> None:
    assert load_daemon_config(None, BASE, env={}).selftest == SelfTestSection(
        enabled=True, interval=3600.0, canary=False, canary_root="/bk-auditor-canary/ledgers"
    )
    cfg = load_daemon_config(
        None,
        [*BASE, "selftest.interval=60", "selftest.canary=true", "selftest.canary_root=/c/l/"],
        env={"BK_AUDITOR_SELFTEST_ENABLED": "false"},
    )
    assert cfg.selftest == SelfTestSection(
        enabled=False, interval=60.0, canary=True, canary_root="/c/l"
    )
    assert cfg.origin("selftest.enabled") == "environment BK_AUDITOR_SELFTEST_ENABLED"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("selftest.interval=0", "selftest.interval must be positive seconds, got '0' (from --set)"),
        (
            "selftest.canary_root=relative",
            "selftest.canary_root must be an absolute znode path, got 'relative' (from --set)",
        ),
    ],
)
def test_bad_selftest_values_are_refused(setting: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_daemon_config(None, [*BASE, setting], env={})
    assert str(exc.value) == message


@pytest.mark.parametrize("root", ["/ledgers", "/ledgers/canary", "/bk"])
def test_canary_root_must_not_overlap_the_ledgers_root(root: str) -> None:
    ledgers = "/bk/ledgers" if root == "/bk" else "/ledgers"
    with pytest.raises(ConfigError) as exc:
        load_daemon_config(
            None,
            [
                *BASE,
                f"daemon.ledgers_root={ledgers}",
                "selftest.canary=true",
                f"selftest.canary_root={root}",
            ],
            env={},
        )
    assert str(exc.value) == (
        f"selftest.canary_root {root} overlaps the ledgers root {ledgers}; "
        "the canary needs a root of its own"
    )
    # Without the canary the root is not used, so it is not held against the config.
    load_daemon_config(None, [*BASE, f"selftest.canary_root={root}"], env={})


def test_canary_root_checks() -> None:
    validate_canary_root("/ledgers-canary", "/ledgers")  # a sibling sharing a prefix is fine
    with pytest.raises(ConfigError) as exc:
        validate_canary_root("/", "/ledgers")
    assert str(exc.value) == "selftest.canary_root must be an absolute znode path, got '/'"


def test_canary_expectations_follow_the_registered_bookies() -> None:
    three = CanaryLayout.for_cluster(
        "/c/ledgers/", BookieSet(frozenset({"d:1", "a:1", "c:1"}), frozenset({"b:1"}))
    )
    assert three.root == "/c/ledgers"
    assert three.bookies == ("a:1", "b:1", "c:1")
    assert three.expected("canary_replicas") == {
        NO_REPLICA_ID: ("no_replica",),
        CORRUPT_ID: ("metadata_invalid",),
    }
    assert three.expected("canary_placement") == {
        NO_REPLICA_ID: (),
        ONE_RACK_ID: ("placement_not_adhering",),
        SPREAD_ID: (),
        CORRUPT_ID: ("metadata_invalid",),
    }
    racks = json.loads(three.racks())["bk-auditor-canary"]
    assert {b: racks[b]["rack"] for b in three.bookies} == {
        "a:1": "/canary-rack-real-0",
        "b:1": "/canary-rack-real-1",
        "c:1": "/canary-rack-real-2",
    }
    none = CanaryLayout.for_cluster("/c/ledgers", BookieSet(frozenset(), frozenset()))
    assert set(none.ledgers()) == {ONE_RACK_ID, SPREAD_ID, CORRUPT_ID}
    assert none.expected("canary_replicas") == {CORRUPT_ID: ("metadata_invalid",)}
    decoded = decode_ledger_metadata(three.ledgers()[NO_REPLICA_ID], NO_REPLICA_ID)
    assert (decoded.ensemble_size, decoded.write_quorum, decoded.last_entry_id) == (3, 2, 9)
    assert decoded.segments[0].bookies == three.bookies


def test_selftest_metrics() -> None:
    metrics = Metrics()
    results = [
        SelfTestResult("replicas", 9),
        SelfTestResult("grace", 4, (FixtureFailure("x", "1", "2"),)),
    ]
    metrics.state.selftest_done(results, 1234.5)

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert sample("bookkeeper_auditor_selftest_success", check="replicas") == 1
    assert sample("bookkeeper_auditor_selftest_success", check="grace") == 0
    assert sample("bookkeeper_auditor_selftest_success", check="ledgers") is None
    assert sample("bookkeeper_auditor_selftest_last_run_timestamp_seconds") == 1234.5
