"""A check that silently stops detecting looks exactly like a healthy cluster (no
violations), and metrics of run counts and durations cannot tell the two apart (BK#1578,
BK#3351, BK#4572); only known-bad inputs with known answers can.

The detector self-test: known-bad inputs through the analysis cores, answers compared.

The leader regularly feeds each check's pure analysis functions (the very ones its
driver calls) synthetic inputs with one known defect each, plus clean controls, and
compares every answer with the exact expected one: right category, right ledger, entries
and bookies, nothing else. The fixtures live in `auditor.selftest.cases` (whose
`run_selftest` runs them all); this module runs cases and shapes the result.

The cores are passed in as a `Cores` value, so a test can hand in a broken
one and watch exactly that check fail; the daemon always uses the defaults.
Everything is pure and runs in milliseconds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from auditor.bookie.results import EntryRead, Outcome
from auditor.checks.bookie_check import LedgerLoss, ledger_loss
from auditor.checks.grace import past_grace
from auditor.checks.ledger_check import (
    BadFragment,
    LedgerPlan,
    ReadFailure,
    classify_read,
    evaluate,
    plan_ledger,
)
from auditor.checks.placement import LedgerPlacement, PlacementPolicy, analyse_ledger
from auditor.checks.pulsar_audit import PulsarAudit, audit
from auditor.checks.replicas import BookieAnswer, ReplicasVerdict, analyse
from auditor.checks.scrub import LedgerScrub, scrub_ledger
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.serde import decode_ledger_metadata
from auditor.schedule.lost_bookie_delay import LostBookieDelay

#: The checks the self-test covers, in report order (`Check` values; metadata is the
#: decoder every check shares).
SELFTEST_CHECKS = (
    "replicas",
    "placement",
    "grace",
    "bookies",
    "ledgers",
    "metadata",
    "pulsar",
    "scrub",
)


@dataclass(frozen=True, slots=True)
class Cores:
    """The analysis functions under test; the defaults are the ones the checks use."""

    replicas: Callable[[LedgerMetadata, Mapping[str, BookieAnswer]], ReplicasVerdict] = analyse
    placement: Callable[[LedgerMetadata, PlacementPolicy, Mapping[str, str]], LedgerPlacement] = (
        analyse_ledger
    )
    grace: Callable[..., Any] = past_grace
    lost_bookies: Callable[[LedgerMetadata, Set[str], int], LedgerLoss | None] = ledger_loss
    delay: Callable[[], LostBookieDelay] = LostBookieDelay
    plan: Callable[[LedgerMetadata, int | None, frozenset[str], int, random.Random], LedgerPlan] = (
        plan_ledger
    )
    classify: Callable[[LedgerMetadata, int, Outcome[EntryRead]], str | None] = classify_read
    evaluate: Callable[[LedgerPlan, Mapping[int, Sequence[ReadFailure]]], list[BadFragment]] = (
        evaluate
    )
    decode: Callable[[bytes, int], LedgerMetadata] = decode_ledger_metadata
    #: The Pulsar audit's one pass (`pulsar_audit.audit`).
    pulsar: Callable[..., PulsarAudit] = audit
    #: The deep scrub's verdict on one ledger (`scrub.scrub_ledger`).
    scrub: Callable[..., LedgerScrub] = scrub_ledger


@dataclass(frozen=True, slots=True)
class Case:
    """One fixture: feed the cores, summarise the answer, compare with `expected`."""

    check: str
    name: str
    run: Callable[[Cores], object]
    expected: object


@dataclass(frozen=True, slots=True)
class FixtureFailure:
    fixture: str
    expected: str
    got: str

    def to_json(self) -> dict[str, str]:
        return {"fixture": self.fixture, "expected": self.expected, "got": self.got}


@dataclass(frozen=True, slots=True)
class SelfTestResult:
    """One check's outcome: how many fixtures ran and which gave a wrong answer."""

    check: str
    fixtures: int
    failures: tuple[FixtureFailure, ...] = ()
    #: For the canary: what it could not do at all (no bookie to ask, a write refused...).
    error: str | None = None
    seconds: float = 0.0
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures and self.error is None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "check": self.check,
            "ok": self.ok,
            "fixtures": self.fixtures,
            "failures": [f.to_json() for f in self.failures],
        }
        if self.error is not None:
            out["error"] = self.error
        if self.details:
            out["details"] = dict(self.details)
        return out

    def summary(self) -> str:
        """One line for the CLI and the error log."""
        if self.error is not None:
            return f"{self.check}: FAILED: {self.error}"
        if not self.failures:
            return f"{self.check}: ok ({self.fixtures} fixtures)"
        first = self.failures[0]
        more = f" (and {len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
        return (
            f"{self.check}: FAILED fixture {first.fixture}: expected {first.expected}, "
            f"got {first.got}{more}"
        )


def _attempt(case: Case, cores: Cores) -> object:
    try:
        return case.run(cores)
    except Exception as exc:  # a core that raises on a fixture has failed it, nothing more
        return f"raised {type(exc).__name__}: {exc}"


def run_cases(
    cases: Iterable[Case], cores: Cores, checks: Sequence[str] = SELFTEST_CHECKS
) -> list[SelfTestResult]:
    """Runs every case; one result per check in `checks`, in that order."""
    by_check: dict[str, list[Case]] = {c: [] for c in checks}
    for case in cases:
        by_check.setdefault(case.check, []).append(case)
    results: list[SelfTestResult] = []
    for check, mine in by_check.items():
        started = time.perf_counter()
        failures: list[FixtureFailure] = []
        for case in mine:
            got = _attempt(case, cores)
            if got != case.expected:
                failures.append(FixtureFailure(case.name, repr(case.expected), repr(got)))
        results.append(
            SelfTestResult(check, len(mine), tuple(failures), seconds=time.perf_counter() - started)
        )
    return results
