"""`check`'s text table shows the Pulsar audit's findings in one line each (no crash)."""

from __future__ import annotations

from auditor.checks.owners import owner_of
from auditor.checks.pulsar_audit import LedgerFact, audit
from auditor.cli.check import _summary
from auditor.metadata.pulsar.refs import LedgerRef, PulsarRefs, RefKind

DAY_MS = 86_400_000
NOW = 10 * DAY_MS


def test_missing_and_orphan_lines() -> None:
    refs = PulsarRefs()
    refs.add(
        LedgerRef(7, RefKind.LEDGER, "t/ns/persistent/a", "persistent://t/ns/a", "t/ns", "/ml")
    )
    owner = owner_of(
        [("application", b"pulsar"), ("pulsar/managed-ledger", b"t/ns/persistent/gone")]
    )
    orphan = LedgerFact(9, owner=owner, pulsar=True, ctime_ms=NOW - 3 * DAY_MS, length=48)
    found = audit(refs, [orphan], now_ms=NOW).violations()
    assert [(v.ledger_id, str(v.category), _summary(v)) for v in found] == [
        (7, "missing", "persistent://t/ns/a: no metadata"),
        (9, "orphan", "persistent://t/ns/gone: unreferenced, 48 bytes, 259200s old"),
    ]
