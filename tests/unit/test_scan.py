"""The scan's pure parts: range splitting, work chunks, report merging, snapshot rows."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from auditor.checks.findings import Category, Check, CheckReport, Coverage, Violation
from auditor.cli.scan import parse_checks, parse_spark_conf
from auditor.config import AuditorConfig
from auditor.errors import ConfigError
from auditor.metadata.cluster import ClusterTarget
from auditor.metadata.ledger_tree import IdRange
from auditor.metadata.model import LedgerMetadata, LedgerState
from auditor.metadata.paths import LONG_MAX
from auditor.metadata.serde import LedgerMetadataFormatError
from auditor.metadata.walk import LedgerRecord
from auditor.scan.engine import chunks
from auditor.scan.partition import ScanSpec
from auditor.scan.ranges import Bucket, split
from auditor.scan.snapshot import LEDGER_COLUMNS, ledger_row, record_from_row, snapshot_checks
from auditor.testing.cluster import make_metadata

A, B, C, D = "10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181", "bookie-4"


def _leaves(*ids: int) -> list[Bucket]:
    return [Bucket(i, i + 1, "", "", None) for i in ids]


def test_split_tiles_the_id_space_in_equal_bucket_counts() -> None:
    found = _leaves(*range(10, 110, 10))  # ten ledgers
    assert split(found, 1) == [IdRange(0, LONG_MAX + 1)]
    assert split(found, 2) == [IdRange(0, 60), IdRange(60, LONG_MAX + 1)]
    assert split(found, 3) == [IdRange(0, 40), IdRange(40, 70), IdRange(70, LONG_MAX + 1)]
    # Never more ranges than buckets; no buckets at all is one range.
    assert len(split(found, 50)) == 10
    assert split([], 4) == [IdRange(0, LONG_MAX + 1)]
    with pytest.raises(ValueError):
        split(found, 0)


def test_id_range_prefixes() -> None:
    r = IdRange(20_000, 30_006)
    assert 20_000 in r and 30_005 in r and 30_006 not in r
    # Directory "0000/0002" of the legacy tree holds ids 20000..29999.
    assert r.contains_prefix("000002", 4)
    assert r.contains_prefix("000003", 4)  # 30000..39999 overlaps up to 30005
    assert not r.contains_prefix("000001", 4)
    assert not r.contains_prefix("000004", 4)


def test_chunks_are_contiguous_and_never_empty() -> None:
    assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4, 5]]
    assert chunks([1, 2], 5) == [[1], [2]]
    assert chunks([], 3) == [[]]


def test_the_bookie_cap_is_shared_by_concurrent_partitions() -> None:
    spec = ScanSpec(ClusterTarget("h:1", "/ledgers", None, 5.0), AuditorConfig(), ())
    assert spec.config.checks.bookie_max_in_flight == 64
    assert spec.with_bookie_cap(4).config.checks.bookie_max_in_flight == 16
    assert spec.with_bookie_cap(3).config.checks.bookie_max_in_flight == 21
    assert spec.with_bookie_cap(1000).config.checks.bookie_max_in_flight == 1


def test_partial_reports_merge_into_one() -> None:
    a = CheckReport(Check.REPLICAS, started_at=10.0, finished_at=20.0, coverage=Coverage(3, 1, 0))
    a.ledgers_checked = 5
    a.ledgers_skipped = Counter({"open": 2})
    a.violations.append(Violation(7, Category.NO_REPLICA, None, {}))
    b = CheckReport(Check.REPLICAS, started_at=5.0, finished_at=30.0, coverage=Coverage(1, 0, 2))
    b.ledgers_checked = 4
    b.ledgers_skipped = Counter({"open": 1, "empty": 1})
    b.violations.append(Violation(9, Category.BELOW_ACK_QUORUM, None, {}))
    a.merge(b)
    assert (a.started_at, a.finished_at, a.ledgers_checked) == (5.0, 30.0, 9)
    assert a.ledgers_skipped == Counter({"open": 3, "empty": 1})
    assert a.coverage == Coverage(4, 1, 2)
    assert a.counts()["no_replica"] == 1 and a.counts()["below_ack_quorum"] == 1
    with pytest.raises(ValueError):
        a.merge(CheckReport(Check.PLACEMENT, started_at=0.0))


def test_parse_checks_and_spark_conf() -> None:
    assert parse_checks("metadata, replicas") == (Check.REPLICAS, Check.METADATA)
    with pytest.raises(ConfigError, match="unknown check 'bookies'"):
        parse_checks("replicas,bookies")
    with pytest.raises(ConfigError):
        parse_checks(" , ")
    assert parse_spark_conf(["spark.executor.memory=2g", "spark.x=a=b"]) == {
        "spark.executor.memory": "2g",
        "spark.x": "a=b",
    }
    with pytest.raises(ConfigError, match=r"spark\.KEY=VALUE"):
        parse_spark_conf(["executor.memory=2g"])
    with pytest.raises(ConfigError):
        parse_spark_conf(["spark.executor.memory"])
    assert snapshot_checks([Check.PLACEMENT]) == (Check.PLACEMENT,)
    with pytest.raises(ConfigError, match="placement and metadata"):
        snapshot_checks([Check.PLACEMENT, Check.REPLICAS])


@pytest.mark.parametrize(
    "md",
    [
        make_metadata(
            42,
            [(0, [A, B, C]), (100, [A, D, C]), (250, [D, B, C])],
            write_quorum=2,
            ack_quorum=2,
            last_entry_id=400,
            length=12345,
            ctime=1_700_000_000_000,
            ctoken=99,
            custom_metadata=[("application", b"pulsar"), ("bin", b"\x00\xff")],
        ),
        make_metadata(43, [A, B, C], state=LedgerState.OPEN),
        make_metadata(44, [A, B], format_version=2),
    ],
)
def test_snapshot_rows_round_trip(md: LedgerMetadata) -> None:
    rec = LedgerRecord(md.ledger_id, f"/ledgers/x/L{md.ledger_id}", md, 3)
    row = ledger_row(rec)
    assert len(row) == len(LEDGER_COLUMNS)
    back = record_from_row(dict(zip([c[0] for c in LEDGER_COLUMNS], row, strict=True)))
    # Everything but the password (not stored: a snapshot is a file that travels).
    assert back == replace(rec, metadata=replace(md, password=None))


def test_an_undecodable_ledger_keeps_its_reason() -> None:
    err = LedgerMetadataFormatError(7, "not a LedgerMetadataFormat message")
    rec = LedgerRecord(7, "/ledgers/00/0000/L0007", None, 2, err)
    row = dict(zip([c[0] for c in LEDGER_COLUMNS], ledger_row(rec), strict=True))
    assert row["error"] == "not a LedgerMetadataFormat message" and row["state"] is None
    back = record_from_row(row)
    assert back.metadata is None and back.znode_version == 2
    assert back.error is not None and back.error.reason == err.reason


def test_a_failed_spark_job_is_one_line() -> None:
    from auditor.scan.spark import _first_line

    worker_failure = RuntimeError(
        "An error occurred while calling o123.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
        "Traceback (most recent call last):\n"
        '  File "/opt/spark/python/pyspark/worker.py", line 1, in main\n'
        "ModuleNotFoundError: No module named 'auditor'\n"
        "\tat org.apache.spark.api.python.BasePythonRunner...\n"
    )
    assert _first_line(worker_failure) == "ModuleNotFoundError: No module named 'auditor'"
    assert _first_line(RuntimeError("")) == "RuntimeError"
