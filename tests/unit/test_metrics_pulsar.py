"""The Pulsar audit's series: per namespace, the `[pulsar] top` worst and the rest as "other"."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from auditor.checks.pulsar_audit import LedgerFact, audit
from auditor.daemon.metrics import Metrics
from auditor.daemon.state import DaemonState
from auditor.daemon.tallies import OTHER_NAMESPACE, PULSAR_BYTE_STATES, PULSAR_STATES
from auditor.metadata.pulsar.refs import LedgerRef, PulsarRefs, RefKind

NOW = 10_000_000_000


def _refs(per_namespace: dict[str, list[int]]) -> PulsarRefs:
    refs = PulsarRefs()
    for ns, ids in per_namespace.items():
        owner = f"{ns}/persistent/t"
        for lid in ids:
            refs.add(
                LedgerRef(
                    lid,
                    RefKind.LEDGER,
                    owner,
                    f"persistent://{ns}/t",
                    ns,
                    f"/managed-ledgers/{owner}",
                )
            )
    return refs


def _series(metrics: Metrics, name: str) -> dict[tuple[str, str], float]:
    text = metrics.exposition().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"bookkeeper_auditor_{name}":
                out[s.labels["pulsar_namespace"], s.labels["state"]] = s.value
    return out


def test_the_worst_namespaces_and_the_rest_as_other() -> None:
    # Five namespaces of 10 ledgers (100 bytes each); t/lost misses 2, t/gap misses 1,
    # the other three are whole. top=2: t/lost and t/gap, then "other" sums three.
    per_ns = {f"t/n{i}": list(range(100 * i, 100 * i + 10)) for i in range(3)}
    per_ns["t/lost"] = list(range(500, 510))
    per_ns["t/gap"] = list(range(600, 610))
    refs = _refs(per_ns)
    gone = {500, 501, 600}
    facts = [
        LedgerFact(lid, ctime_ms=0, length=100)
        for ids in per_ns.values()
        for lid in ids
        if lid not in gone
    ]
    result = audit(refs, facts, now_ms=NOW)
    assert {f.ledger_id for f in result.findings} == gone

    state = DaemonState(identity="a:1")
    state.lead(0.0)
    state.pulsar_done(result, top=2)
    metrics = Metrics(state)
    ledgers = _series(metrics, "pulsar_ledgers")
    size = _series(metrics, "pulsar_bytes")
    assert {ns for ns, _ in ledgers} == {"t/lost", "t/gap", OTHER_NAMESPACE}
    assert {st for _, st in ledgers} == set(PULSAR_STATES)
    assert {st for _, st in size} == set(PULSAR_BYTE_STATES)
    assert ledgers["t/lost", "missing"] == 2
    assert ledgers["t/gap", "missing"] == 1
    assert ledgers[OTHER_NAMESPACE, "missing"] == 0
    assert ledgers[OTHER_NAMESPACE, "referenced"] == 30
    assert size[OTHER_NAMESPACE, "referenced"] == 3000
    assert ledgers["t/lost", "referenced"] == 10
    # Nothing is lost in the sums: every namespace's ledgers are in some row.
    assert sum(n for (_, st), n in ledgers.items() if st == "referenced") == 50
    assert _gauge(metrics, "pulsar_last_run_timestamp_seconds") > 0

    # A wide cluster stays bounded: top + 1 namespaces whatever their number.
    wide = _refs({f"t/w{i}": [10_000 + i] for i in range(200)})
    state.pulsar_done(audit(wide, [], now_ms=NOW), top=2)
    assert len({ns for ns, _ in _series(metrics, "pulsar_ledgers")}) == 3

    # A node that steps down drops the leader's rows.
    state.stepped_down()
    assert _series(metrics, "pulsar_ledgers") == {}


def test_scheduled_audit_has_its_check_series_at_zero() -> None:
    state = DaemonState(identity="a:1")
    metrics = Metrics(state)
    text = metrics.exposition().decode()
    assert 'check="pulsar"' not in text
    state.pulsar_scheduled(3600)
    text = metrics.exposition().decode()
    assert 'bookkeeper_auditor_violations_total{category="orphan",check="pulsar"} 0.0' in text
    assert 'bookkeeper_auditor_check_interval_seconds{check="pulsar"} 3600.0' in text
    state.pulsar_scheduled(0)
    assert 'bookkeeper_auditor_check_interval_seconds{check="pulsar"}' not in (
        metrics.exposition().decode()
    )


def test_no_audit_no_rows() -> None:
    metrics = Metrics(DaemonState(identity="a:1"))
    assert _series(metrics, "pulsar_ledgers") == {}
    assert _gauge(metrics, "pulsar_last_run_timestamp_seconds") == 0


def _gauge(metrics: Metrics, name: str) -> float:
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            if s.name == f"bookkeeper_auditor_{name}":
                return float(s.value)
    raise AssertionError(f"no {name}")
