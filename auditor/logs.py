"""People read the auditor's logs on a terminal and collectors parse them, while stdout
carries command output that scripts parse; one set-up decides where every line goes and in
which form.

Structured logs (structlog) to stderr: key=value for people, JSON lines for collectors.

Stdout belongs to command output (`--json` prints exactly one object there),
so every log line goes to stderr. The daemon logs JSON lines unless a person
is watching (stderr is a TTY): journald, Docker and Kubernetes all collect
stderr, and their pipelines parse JSON without a custom grok pattern.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO, cast

import structlog

LogFormat = Literal["json", "console", "auto"]


def resolve_format(format: str, stream: TextIO | None = None) -> Literal["json", "console"]:
    """ "auto" becomes console on a TTY and JSON otherwise."""
    if format == "json":
        return "json"
    if format == "console":
        return "console"
    if format != "auto":
        raise ValueError(f"log format must be json, console or auto, got {format!r}")
    out = stream if stream is not None else sys.stderr
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):  # closed or not a real file
        tty = False
    return "console" if tty else "json"


class _CurrentStderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was configured.

    A command run in-process (tests, the demo) may configure logging while
    stderr is a temporary capture that is closed later; loggers bound then
    would fail on every line after it. Writing through this follows stderr.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _level(level: int | str) -> int:
    if isinstance(level, int):
        return level
    value = logging.getLevelName(level.upper())
    if not isinstance(value, int):
        raise ValueError(f"unknown log level {level!r}")
    return value


def configure_logging(
    format: LogFormat | None = None,
    *,
    json_lines: bool | None = None,
    level: int | str = logging.INFO,
    stream: TextIO | None = None,
    capture_stdlib: bool = False,
) -> Literal["json", "console"]:
    """Sets up structlog; returns the format chosen.

    `format` is "json", "console" or "auto". The older `json_lines=True/False`
    still works; with neither, the one-shot commands keep console lines. With
    `capture_stdlib`, records of standard-library loggers (kazoo, grpc) are
    rendered the same way, so a JSON stream stays pure JSON.
    """
    if format is None:
        format = "json" if json_lines else "console"
    chosen = resolve_format(format, stream if stream is not None else sys.stderr)
    out = stream if stream is not None else cast(TextIO, _CurrentStderr())
    lvl = _level(level)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    if chosen == "json":
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False, sort_keys=False)
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    if capture_stdlib:
        handler = logging.StreamHandler(out)
        handler.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
                processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            )
        )
        root = logging.getLogger()
        for old in list(root.handlers):
            root.removeHandler(old)
        root.addHandler(handler)
        root.setLevel(lvl)
    return chosen


def get_logger(name: str = "auditor") -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger
