"""`bk-auditor`: argument parsing, and the one place errors become exit codes.

Every failure an operator can cause or meet (bad flags, an unreachable
metadata store, corrupt znodes) is an `AuditorError` and is printed as one line on
stderr with a non-zero exit; a traceback would only be noise to them, so it is
shown only with BK_AUDITOR_DEBUG=1.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import os
import re
import resource
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from auditor.cli import (
    admin,
    api_commands,
    autorecovery_status,
    check,
    decommission,
    demo,
    docs,
    explain,
    inspect,
    pulsar_audit,
    recover,
    risk,
    run,
    scan,
    selftest,
)
from auditor.cli.options import Command
from auditor.errors import AuditorError, ConfigError, shown_name

EXIT_INTERNAL = 70

#: The distribution whose metadata holds the version (pyproject.toml's `version`).
DISTRIBUTION = "bookkeeper-auditor"


def package_version() -> str:
    """The installed version: pyproject.toml's `version`, the one source of truth."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


#: A quoted token in argparse's message ('...'), which can be a whole argument.
_QUOTED = re.compile(r"'([^']*)'")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse quotes the offending argument whole: bound it (an argument can be
        # megabytes), so the error stays one readable line.
        bounded = _QUOTED.sub(lambda m: shown_name(m.group(1)), message)
        raise ConfigError(f"{self.prog}: {bounded}")


#: What adds each module's commands, in the order `--help`, completion and the manual page
#: list them (`docs` last: it walks the finished parser). See `cli/options.py`.
ADD_PARSERS: tuple[Callable[[Any], None], ...] = (
    inspect.add_parsers,
    check.add_parsers,
    scan.add_parsers,
    demo.add_parsers,
    run.add_parsers,
    admin.add_parsers,
    api_commands.add_parsers,
    explain.add_parsers,
    risk.add_parsers,
    pulsar_audit.add_parsers,
    selftest.add_parsers,
    recover.add_parsers,
    decommission.add_parsers,
    autorecovery_status.add_parsers,
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bk-auditor", description="Audits an Apache BookKeeper cluster.")
    version = package_version()
    parser.add_argument("--version", action="version", version=f"bk-auditor {version}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add_parsers in ADD_PARSERS:
        add_parsers(sub)
    docs.add_parsers(sub, parser, version)
    return parser


async def _run(args: argparse.Namespace) -> int:
    """Runs what the parsed command is bound to (`options.bind`)."""
    command: Command = args.command_run
    if args.command_findings:
        return await _failing_is_2(command(args))
    return await command(args)


def _configure_logging() -> None:
    """Our own messages to stderr; kazoo's reconnect chatter only when debugging.

    kazoo logs every refused connection attempt as a warning, which would bury
    the one line that says what went wrong.
    """
    debug = bool(os.environ.get("BK_AUDITOR_DEBUG"))
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="bk-auditor: %(levelname)s: %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("kazoo").setLevel(logging.DEBUG if debug else logging.CRITICAL + 1)


async def _failing_is_2(run: Awaitable[int]) -> int:
    """For the commands whose exit 1 is a finding (`check`: violations; `explain`: a check
    flags the ledger; `scan`; `risk`/`what-if`: at risk), any failure to run is exit 2."""
    from auditor.logs import configure_logging

    configure_logging()
    try:
        return await run
    except AuditorError as exc:
        print(f"bk-auditor: error: {exc}", file=sys.stderr)
        return 2


def no_core_dumps() -> None:
    """No core file from this process: its memory holds the API token and ZooKeeper's
    password (a SIGABRT left a 142 MB core with both). The hard limit too, so nothing in
    the process raises it again; the unit file and the image say the same."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv: Sequence[str] | None = None) -> int:
    no_core_dumps()
    _configure_logging()
    try:
        args = build_parser().parse_args(argv)
        return asyncio.run(_run(args))
    except AuditorError as exc:
        print(f"bk-auditor: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: still one line, unless asked for more
        if os.environ.get("BK_AUDITOR_DEBUG"):
            traceback.print_exc()
        print(f"bk-auditor: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
