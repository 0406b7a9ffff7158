"""`scan` and `snapshot` on bad input: one line, exit 2, nothing written.

An output directory that cannot be written is bad input too: under a regular
file, where nothing may be created, or on a disk that fills up mid-scan.
The tests run as whatever user runs them (often root, whom permission bits
do not stop), so "read-only" is a place no one can write: procfs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor.cli.main import main
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.zkserver import free_port
from auditor.zk import ZkClient


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
        (["--spark-conf", "memory=2g"], "--spark-conf: 'memory' is not a Spark setting"),
        (["--spark-conf", "spark.x"], "--spark-conf must be spark.KEY=VALUE, got 'spark.x'"),
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


@pytest.mark.parametrize("command", ["scan", "snapshot"])
def test_an_output_under_a_regular_file_is_refused_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "sub" / "out"
    # No ZooKeeper listens at port 1: the refusal comes first.
    assert main([command, "--zk", "127.0.0.1:1", "--out", str(out)]) == 2
    line = _one_error_line(capsys)
    assert line == (
        f"bk-auditor: error: --out {out} cannot be made: {tmp_path / 'file'} is not a directory"
    )
    assert (tmp_path / "file").read_text() == "x"


async def _two_ledgers(zk: ZkClient) -> None:
    cluster = ClusterWriter(zk)
    await cluster.init_cluster()
    for ledger_id in (1, 2):
        await cluster.write_ledger(make_metadata(ledger_id, ["10.0.0.1:3181", "10.0.0.2:3181"]))


@pytest.mark.parametrize(
    ("out", "reason"),
    [
        # procfs makes no directory and takes no new file, not even from root.
        ("/proc/bk-auditor-out", "No such file or directory (/proc/bk-auditor-out)"),
        ("/proc", "No such file or directory (/proc/.bk-auditor-probe-"),
    ],
)
async def test_an_unwritable_output_is_one_line_and_exit_2(
    zk: ZkClient, zk_hosts: str, capsys: pytest.CaptureFixture[str], out: str, reason: str
) -> None:
    await _two_ledgers(zk)
    for command in (["scan", "--checks", "metadata"], ["snapshot"]):
        args = [*command, "--zk", zk_hosts, "--out", out]
        assert await asyncio.to_thread(main, args) == 2
        line = _one_error_line(capsys)
        assert line.startswith(f"bk-auditor: error: --out {out} cannot be written: {reason}")


@contextlib.contextmanager
def _full_tmpfs(where: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs filled to the last byte (skips where mounting is not allowed)."""
    where.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
    try:
        # Unbuffered: the write that finds the disk full leaves nothing for close to flush.
        with (where / "filler").open("wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        yield where
    finally:
        # A pyarrow writer that failed to start keeps its file open until it is collected.
        gc.collect()
        subprocess.run(["umount", str(where)], check=True)


async def test_a_disk_that_fills_up_is_one_line_and_exit_2(
    zk: ZkClient, zk_hosts: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _two_ledgers(zk)
    with _full_tmpfs(tmp_path / "disk") as disk:
        out = disk / "out"
        args = ["scan", "--checks", "metadata", "--zk", zk_hosts, "--out", str(out)]
        assert await asyncio.to_thread(main, args) == 2
        # The scan had started (its progress is logged); it ends in one error line.
        err = capsys.readouterr().err.strip().splitlines()
        assert [x for x in err if x.startswith("bk-auditor: ")] == [err[-1]]
        assert err[-1].startswith(f"bk-auditor: error: --out {out} cannot be written: ")
        assert "No space left on device" in err[-1]
        assert "Traceback" not in "\n".join(err)
        # An interrupted scan: no summary.json.
        assert not (out / "summary.json").exists()
