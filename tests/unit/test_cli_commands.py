"""Every command of `bk-auditor` is registered the one way: bound to what runs it."""

from __future__ import annotations

import inspect

from auditor.cli.docs import _subparsers
from auditor.cli.main import build_parser


def test_every_command_is_bound_to_a_coroutine() -> None:
    commands = _subparsers(build_parser()).choices
    assert commands, "no commands registered"
    for name, parser in commands.items():
        run = parser.get_default("command_run")
        assert run is not None, f"{name} is not bound (cli/options.py: bind)"
        assert inspect.iscoroutinefunction(run), f"{name} runs {run!r}, not a coroutine"
        assert parser.get_default("command_findings") in (True, False), name


def test_the_commands_whose_exit_1_is_a_finding() -> None:
    commands = _subparsers(build_parser()).choices
    findings = {name for name, p in commands.items() if p.get_default("command_findings")}
    assert findings == {"check", "scan", "snapshot", "explain", "risk", "what-if", "pulsar-audit"}
