"""Checks of the configuration that only the daemon's start-up can make, before it connects.

Why: a value the configuration loader accepts may still be one no client can use.
gRPC metadata carries printable ASCII only, so an API token with any other
character (or with surrounding blanks, which the server's comparison strips) is
accepted at start and then no client can ever send it: every mutating call fails
with a confusing error. Refused here, the operator gets one line at start instead.
"""

from __future__ import annotations

from auditor.errors import ConfigError

#: What a gRPC metadata value may hold: printable ASCII.
_PRINTABLE = range(0x20, 0x7F)


def token_problem(token: str) -> str | None:
    """Why `token` cannot travel in gRPC metadata, or None. Never quotes the token."""
    for i, ch in enumerate(token, 1):
        if ord(ch) not in _PRINTABLE:
            kind = "a non-ASCII" if ord(ch) > 0x7F else "a control"
            return f"character {i} is {kind} character (U+{ord(ch):04X})"
    if token != token.strip():
        return "it starts or ends with a blank"
    return None


def check_api_token(token: str, what: str = "api.token") -> None:
    """Raises a one-line ConfigError when `token` cannot be sent by any client."""
    problem = token_problem(token) if token else None
    if problem is not None:
        raise ConfigError(
            f"{what} must be printable ASCII without surrounding blanks (gRPC metadata "
            f"carries nothing else): {problem}"
        )
