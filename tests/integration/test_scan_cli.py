"""`scan` and `snapshot` on bad input: one line, exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.cli.main import main
from auditor.testing.zkserver import free_port


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("bk-auditor: error: ")
    return err[0]


def test_an_earlier_output_is_not_overwritten_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    code = main(["scan", "--zk", "127.0.0.1:1", "--out", str(out)])
    assert code == 2
    assert "already holds output (summary.json)" in _one_error_line(capsys)
    assert [p.name for p in out.iterdir()] == ["summary.json"]
    assert (out / "summary.json").read_text() == "{}"


def test_an_unreachable_zookeeper_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never"
    code = main(["scan", "--zk", f"127.0.0.1:{free_port()}", "--timeout", "1", "--out", str(out)])
    assert code == 2
    assert "ZooKeeper" in _one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checks", "replicas,bookies"], "unknown check 'bookies'"),
        (["--partitions", "-1"], "--partitions must be >= 0"),
        (["--spark-conf", "memory=2g"], "--spark-conf takes spark.KEY=VALUE"),
        (["--set", "checks.retry_attempts=-1"], "retry_attempts"),
    ],
)
def test_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "never"
    code = main(["scan", "--zk", "127.0.0.1:1", "--out", str(out), *args])
    assert code == 2
    assert message in _one_error_line(capsys)
    assert not out.exists()


def test_judging_something_that_is_not_a_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "snap").mkdir()
    out = tmp_path / "never"
    assert main(["scan", "--from-snapshot", str(tmp_path / "snap"), "--out", str(out)]) == 2
    assert "is not a complete snapshot" in _one_error_line(capsys)
    (tmp_path / "snap" / "ledgers").mkdir()
    (tmp_path / "snap" / "cluster.json").write_text(json.dumps({"format": 99}))
    assert main(["scan", "--from-snapshot", str(tmp_path / "snap"), "--out", str(out)]) == 2
    assert "unknown snapshot format 99" in _one_error_line(capsys)
    (tmp_path / "snap" / "cluster.json").write_text("{not json")
    assert main(["scan", "--from-snapshot", str(tmp_path / "snap"), "--out", str(out)]) == 2
    assert "not a snapshot's cluster.json" in _one_error_line(capsys)
    assert not out.exists()


def test_a_snapshot_cannot_mark_or_ask_bookies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never"
    snap = str(tmp_path)
    assert main(["scan", "--from-snapshot", snap, "--mark", "--out", str(out)]) == 2
    assert "--mark needs the live cluster" in _one_error_line(capsys)
    assert main(["scan", "--from-snapshot", snap, "--checks", "replicas", "--out", str(out)]) == 2
    assert "only be judged by the placement and metadata checks" in _one_error_line(capsys)
    assert not out.exists()


def test_the_spark_engine_without_pyspark_says_how_to_install_it(tmp_path: Path) -> None:
    out = tmp_path / "never"
    # A real interpreter in which `import pyspark` fails, as on a machine without the extra.
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "from auditor.cli.main import main\n"
        "sys.exit(main(['scan', '--engine', 'spark', '--zk', '127.0.0.1:1',"
        f" '--out', {str(out)!r}]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "bk-auditor: error: the Spark engine needs PySpark: pip install 'bookkeeper-auditor[spark]'"
    ]
    assert not out.exists()
