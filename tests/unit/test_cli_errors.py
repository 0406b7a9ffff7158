"""Command-line mistakes are one readable line: an over-long argument is not echoed back."""

from __future__ import annotations

import pytest

from auditor.cli.main import main


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["check", "x" * 5000], "invalid choice: 'xxxxxxxxxxxx"),
        (["explain", "9" * 5000], "invalid int value: '999999999999"),
    ],
)
def test_an_over_long_argument_is_quoted_bounded(
    argv: list[str], shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err[:500]
    assert lines[0].startswith("bk-auditor: error: ")
    assert shown in lines[0] and "(5000 characters)" in lines[0]
    assert len(lines[0]) < 300


def test_a_short_argument_is_quoted_whole(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "nosuch"]) == 2
    assert "invalid choice: 'nosuch' (choose from" in capsys.readouterr().err
