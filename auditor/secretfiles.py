"""Files that hold secrets (the API token, ZooKeeper credentials) must be private.

A token or password file every user can read gives it to every user of the host. As SSH
refuses a private key that others can read, every command and the daemon refuse such a
file, with the one line that says how to fix it. Group permissions are left alone: a
service's secrets are commonly `root:<service group> 0640` (or a Kubernetes Secret mounted
with an `fsGroup`).
"""

from __future__ import annotations

import stat
from pathlib import Path

from auditor.errors import ConfigError

#: Permission bits for "every other user": read, write, execute.
OTHERS = stat.S_IRWXO


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
