"""The daemon's identity: the id its election vote carries, and `whoisauditor` prints.

It must be a valid BookKeeper bookie id, by the one rule the ledger metadata
uses too (`auditor.metadata.serde.is_valid_bookie_id`), or the Java tools
that read the vote would fail on it. When no layer sets it, it is derived as
a Java AutoRecovery beside the same bookie would vote: bk_server.conf's
`bookieId`, else `advertisedAddress` (or this host's name) with `bookiePort`;
without bk_server.conf, `<hostname>:<api.port>`.
"""

from __future__ import annotations

import socket

from auditor.config import from_origin
from auditor.daemon.config.layers import BookieHints
from auditor.errors import ConfigError
from auditor.metadata.registry import READONLY
from auditor.metadata.serde import is_valid_bookie_id


def validate_identity(identity: str, origin: str = "") -> str:
    """BookKeeper accepts this as a BookieId (the vote's `bookieId`), or ConfigError."""
    where = from_origin(origin)
    if is_valid_bookie_id(identity):
        return identity
    if identity.lower() == READONLY:
        raise ConfigError(f"daemon.identity cannot be 'readonly' (BookKeeper reserves it){where}")
    raise ConfigError(
        f"daemon.identity {identity!r} is not a valid BookKeeper bookie id "
        f"(letters, digits and .-:;<=>?@[]^_ only){where}"
    )


def resolve_identity(
    identity: str | None,
    origins: dict[str, str],
    hints: BookieHints | None,
    bk_conf: str | None,
    api_port: int,
    hostname: str | None,
) -> str:
    """`identity` when a layer set it, else the derived one; validated, its origin recorded."""
    if identity is not None:
        origin = origins["daemon.identity"]
    elif hints is not None and hints.bookie_id:
        identity, origin = hints.bookie_id, f"bookieId in {bk_conf}"
    elif hints is not None:
        host = hints.advertised_address or hostname or socket.gethostname()
        identity, origin = f"{host}:{hints.port}", f"advertisedAddress/bookiePort in {bk_conf}"
    else:
        identity = f"{hostname or socket.gethostname()}:{api_port}"
        origin = "derived from the host name and api.port"
    origins["daemon.identity"] = origin
    return validate_identity(identity, origin)
