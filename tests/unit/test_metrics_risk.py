"""`ledgers_at_risk`: the top domains of the last risk report only, gone on step-down."""

from __future__ import annotations

from auditor.analysis.risk import RiskReport, domain_keys, ledger_risk, place_of
from auditor.daemon.metrics import Metrics
from auditor.testing.cluster import make_metadata

B = [f"b{i}:3181" for i in range(4)]
SERIES = "bookkeeper_auditor_ledgers_at_risk"


def report(racks: dict[str, str], *ensembles: list[str]) -> RiskReport:
    r = RiskReport(started_at=10.0, finished_at=12.0)
    for lid, ensemble in enumerate(ensembles, 1):
        md = make_metadata(lid, ensemble, write_quorum=2, last_entry_id=9)
        r.add(ledger_risk(md, lambda b: domain_keys(b, place_of(racks.get(b))), set(B)))
    return r


def samples(m: Metrics) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["domain"], s.labels["name"], s.labels["severity"]): s.value
        for family in m.registry.collect()
        if family.name == SERIES
        for s in family.samples
    }


def test_top_domains_replace_the_previous_report_and_go_on_step_down() -> None:
    m = Metrics()
    assert samples(m) == {}
    m.state.lead(m.state.tallies.clock())
    # Ledger 1 on b0,b1,b2 (b0 and b1 in rack a), ledger 2 on b0,b2,b3.
    first = report({B[0]: "/a", B[1]: "/a", B[2]: "/b"}, [B[0], B[1], B[2]], [B[0], B[2], B[3]])
    m.state.tallies.record_risk(first, top=1)
    assert samples(m) == {
        ("bookie", B[0], "below_ack_quorum"): 2.0,
        ("bookie", B[0], "no_copy"): 0.0,
        ("rack", "/a", "below_ack_quorum"): 1.0,
        ("rack", "/a", "no_copy"): 1.0,
    }
    assert m.registry.get_sample_value("bookkeeper_auditor_risk_last_run_timestamp_seconds") == 12
    # Racks unknown now: only bookies remain, and /a is gone from the series.
    m.state.tallies.record_risk(report({}, [B[1], B[2], B[3]]), top=5)
    assert samples(m) == {
        (d, b, s): v
        for b in B[1:]
        for d, s, v in (("bookie", "below_ack_quorum", 1.0), ("bookie", "no_copy", 0.0))
    }
    m.state.stepped_down()
    assert samples(m) == {}
