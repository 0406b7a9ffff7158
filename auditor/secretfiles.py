"""A secret file every user can read gives the secret to every user of the host, and an API
token no client can send fails every protected call with a confusing error; the daemon, its
API servers and the CLI refuse both, by the same rules.

Secrets: files that hold them (the API token, ZooKeeper credentials) must be private,
and the API token must be one that every client can send.

As SSH refuses a private key that others can read, every command and the daemon refuse such a
file, with the one line that says how to fix it. Group permissions are left alone: a
service's secrets are commonly `root:<service group> 0640` (or a Kubernetes Secret mounted
with an `fsGroup`).

The token travels as `authorization: Bearer TOKEN`, a gRPC metadata value (printable
ASCII only, and a header list gRPC bounds at 8 KiB by default) and an HTTP header (our
views read at most 16 KiB of head). A token outside that shape would be accepted and then
no client could ever send it: every protected call would fail with a confusing error.
The daemon's configuration, its API servers and the CLI refuse it by one rule
(`check_api_token`), and read a token file the same way (`read_token_file`).
"""

from __future__ import annotations

import stat
from pathlib import Path

from auditor.errors import ConfigError

#: Permission bits for "every other user": read, write, execute.
OTHERS = stat.S_IRWXO
#: The longest API token: far above a signed JWT's few hundred characters, and with
#: `Bearer ` well inside gRPC's default 8 KiB of metadata.
MAX_TOKEN_CHARS = 4096
#: What a gRPC metadata value may hold: printable ASCII.
_PRINTABLE = range(0x20, 0x7F)


def refuse_if_public(path: str | Path, what: str) -> None:
    """ConfigError when `path` (a secret: `what`) is readable or writable by every user.
    What is no regular file, or cannot be stat'ed, is left to the read that follows and its
    own error."""
    try:
        mode = Path(path).stat().st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) and mode & OTHERS:
        raise ConfigError(
            f"{what} {path} is open to every user (mode {stat.S_IMODE(mode):04o}): "
            f"chmod o-rwx {path} (600 or 640), as SSH refuses a private key others can read"
        )


def token_problem(token: str) -> str | None:
    """Why `token` cannot travel in gRPC metadata, or None. Never quotes the token."""
    if len(token) > MAX_TOKEN_CHARS:
        return f"it is longer than {MAX_TOKEN_CHARS} characters"
    for i, ch in enumerate(token, 1):
        if ord(ch) not in _PRINTABLE:
            kind = "a non-ASCII" if ord(ch) > 0x7F else "a control"
            return f"character {i} is {kind} character (U+{ord(ch):04X})"
    if token != token.strip():
        return "it starts or ends with a blank"
    return None


def check_api_token(token: str, what: str = "api.token") -> str:
    """`token`, or a one-line ConfigError when no client can send it (an empty token is
    no token: mutations are simply off)."""
    problem = token_problem(token) if token else None
    if problem is not None:
        raise ConfigError(
            f"{what} must be printable ASCII without surrounding blanks, at most "
            f"{MAX_TOKEN_CHARS} characters (what gRPC metadata carries): {problem}"
        )
    return token


def read_token_file(path: str | Path, what: str) -> str:
    """The token in `path` (one line; whitespace around it is not part of it: a token has
    none), checked: the file private, readable, not empty, the token by `check_token`. The
    daemon's `api.token_file` and the CLI's `--token-file` both read this way, so one file
    serves both."""
    refuse_if_public(path, what)
    try:
        with Path(path).open("rb") as f:
            # Enough to see it is too long, not a whole file named by mistake.
            raw = f.read(4 * MAX_TOKEN_CHARS)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    line = raw.strip()
    if not line:
        raise ConfigError(f"{what} {path} is empty")
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} holds bytes that are not ASCII") from None
    return check_api_token(text, f"the token in {what} {path}")
