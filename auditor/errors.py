"""An operator should get one readable line and a meaningful exit code for every failure that
is theirs to fix, and a traceback only for a bug; that takes one root for every error raised
on purpose.

The root of every error the auditor raises on purpose.

The CLI turns any `AuditorError` into one readable line and a non-zero exit;
anything else reaching the top is a bug. Modules subclass these near the code
that raises them, so a caller can catch exactly the failure it can handle.
"""

from __future__ import annotations

import reprlib


class AuditorError(Exception):
    """Base class: a failure with a message fit for an operator."""

    exit_code = 1


class ConfigError(AuditorError):
    """Bad configuration or command-line input."""

    exit_code = 2


class FormatError(AuditorError):
    """Bytes that do not decode as the format they claim to be."""


class NotFoundError(AuditorError):
    """The thing asked about (a ledger, say) does not exist."""

    exit_code = 2


class ServiceUnavailableError(AuditorError):
    """A service (ZooKeeper, a bookie) did not answer in time or refused."""

    exit_code = 3


#: How much of a user's input an error message quotes back (an argument or a request
#: may be megabytes; the message stays one readable line).
NAME_SHOWN = 64
_shown = reprlib.Repr()
_shown.maxstring = NAME_SHOWN


def shown_name(name: str) -> str:
    """`name` quoted for an error message, bounded to about `NAME_SHOWN` characters."""
    text = _shown.repr(name)
    return text if len(name) <= NAME_SHOWN else f"{text} ({len(name)} characters)"
