"""A scan's output directory that cannot be written is the operator's input, not a bug.

The integration tests (tests/integration/test_scan_cli.py) drive the real
command into a regular file, procfs and a full tmpfs; here the mapping from
an `OSError` to the one-line `OutputError` is pinned case by case, including
a full disk on machines where no tmpfs can be mounted.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from auditor.errors import AuditorError
from auditor.scan.output import (
    SCAN_OUTPUT,
    OutputError,
    check_out_dir,
    output_error,
    prepare_out_dir,
    writing_to,
)

OUT = Path("/data/scan-out")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_full_disk_is_the_outputs_fault_whatever_it_names(code: int) -> None:
    # pyarrow's errors carry the errno but no file name.
    exc = OSError(code, f"Error writing bytes to file. Detail: [errno {code}] {os.strerror(code)}")
    mapped = output_error(OUT, exc)
    assert isinstance(mapped, OutputError)
    assert str(mapped) == f"--out {OUT} cannot be written: {exc.strerror}"
    assert mapped.exit_code == 2
    named = OSError(code, os.strerror(code), str(OUT / "summary.json.tmp"))
    assert str(output_error(OUT, named)) == (
        f"--out {OUT} cannot be written: {os.strerror(code)} ({OUT}/summary.json.tmp)"
    )


@pytest.mark.parametrize(
    "code", [errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.ENOENT, errno.EIO]
)
def test_a_refusal_is_the_outputs_only_when_it_names_a_path_inside_it(code: int) -> None:
    inside = OSError(code, os.strerror(code), str(OUT / "coverage" / "part-00000.parquet"))
    assert str(output_error(OUT, inside)) == (
        f"--out {OUT} cannot be written: {os.strerror(code)} ({OUT}/coverage/part-00000.parquet)"
    )
    assert output_error(OUT, OSError(code, os.strerror(code), str(OUT))) is not None
    # As pyarrow says it: the path in the message only.
    arrow = OSError(code, f"Failed to open local file '{OUT}/violations/part-00000.parquet'")
    assert output_error(OUT, arrow) is not None
    # A snapshot being read, a racks file, a sibling directory: not the output.
    for other in ("/data/snapshot/ledgers", "/data/scan-out2/x", "/etc/racks.yaml"):
        assert output_error(OUT, OSError(code, os.strerror(code), other)) is None
    assert output_error(OUT, OSError(code, os.strerror(code))) is None


def test_network_and_other_errors_pass_through() -> None:
    assert output_error(OUT, ConnectionRefusedError(errno.ECONNREFUSED, "refused")) is None
    assert output_error(OUT, TimeoutError()) is None
    assert output_error(OUT, OSError(errno.EBADF, "bad fd", str(OUT / "x"))) is None
    with pytest.raises(ConnectionResetError), writing_to(OUT):
        raise ConnectionResetError(errno.ECONNRESET, "reset")
    with pytest.raises(OutputError, match="No space left on device") as caught, writing_to(OUT):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert isinstance(caught.value.__cause__, OSError)
    assert issubclass(OutputError, AuditorError)


def test_an_output_under_a_file_is_refused_without_writing(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match=rf"cannot be made: {tmp_path / 'f'} is not a directory"):
        check_out_dir(tmp_path / "f" / "a" / "b", SCAN_OUTPUT, overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_prepare_proves_the_directory_writable_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "a" / "out"
    prepare_out_dir(out, SCAN_OUTPUT, overwrite=False)
    assert list(out.iterdir()) == []
    with pytest.raises(OutputError, match=r"^--out /proc cannot be written: "):
        prepare_out_dir(Path("/proc"), SCAN_OUTPUT, overwrite=False)
