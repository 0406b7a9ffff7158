"""Numbers of seconds on the command line: finite, positive and bounded, or one line and exit 2.

Before: `--timeout inf` (or `1e308`) overflowed in asyncio (exit 70, "internal error:
OverflowError") and `--timeout nan` printed "within nans".
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from auditor.cli.argtypes import MAX_TIMEOUT
from auditor.cli.main import main


@pytest.mark.parametrize("value", ["inf", "-inf", "1e308", "nan", "0", "-1", "86401", "ten"])
@pytest.mark.parametrize("command", [["ledgers", "--zk", "127.0.0.1:1"], ["status"]])
def test_a_timeout_that_is_no_bounded_number_of_seconds_is_refused(
    command: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, f"--timeout={value}"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(f"bk-auditor: error: bk-auditor {command[0]}: argument --timeout: ")
    assert repr(value) in line
    if value != "ten":
        assert f"above 0 and at most {MAX_TIMEOUT:g}" in line


def test_the_cli_leaves_no_core_dump_behind() -> None:
    """Every command (the daemon is `run`) sets its core limit, soft and hard, to 0 before
    anything else: its memory holds tokens and ZooKeeper passwords."""
    code = (
        "import resource\n"
        "from auditor.cli.main import main\n"
        "try:\n"
        "    main(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(resource.getrlimit(resource.RLIMIT_CORE))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.splitlines()[-1] == "(0, 0)", done.stderr
