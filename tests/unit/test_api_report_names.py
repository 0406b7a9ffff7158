"""Which check names the API's report reads take: the defaults, and what the daemon schedules."""

from __future__ import annotations

import pytest

from auditor.api.convert import UnknownNameError, parse_check, parse_report_check
from auditor.checks.findings import ALL_CHECKS, Check


def test_default_checks_always_and_pulsar_only_when_scheduled() -> None:
    for c in ALL_CHECKS:
        assert parse_report_check(str(c), []) is c
    assert parse_report_check("pulsar", [*ALL_CHECKS, Check.PULSAR]) is Check.PULSAR
    with pytest.raises(UnknownNameError, match="unknown check 'pulsar'"):
        parse_report_check("pulsar", ALL_CHECKS)
    with pytest.raises(UnknownNameError, match="unknown check 'nope'"):
        parse_report_check("nope", [Check.PULSAR])
    # a trigger still takes the default checks only
    with pytest.raises(UnknownNameError):
        parse_check("pulsar", allow_all=True)
