"""Everything above the adapters is written against the metadata-store port, not kazoo, so
that etcd can stand in for ZooKeeper; this package, the port's ZooKeeper adapter, is the only
place that talks to kazoo.

`ZkClient` is an asyncio facade with a timeout on every call; it raises the port's
errors (`auditor.store`), re-exported here with the ZooKeeper-only ones (credentials,
TLS) so that code that is about ZooKeeper itself has one place to import from.
"""

from auditor.store import (
    BadVersionError,
    EventType,
    FencedOutError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionState,
)
from auditor.zk.client import (
    ZkAuthError,
    ZkClient,
    ZkError,
    ZkResponseError,
    ZkStat,
    ZkTimeoutError,
    ZkTlsError,
    ZkUnavailableError,
)
from auditor.zk.security import (
    SaslOptions,
    ZkCredentials,
    ZkSecurity,
    parse_zk_auth,
    read_zk_auth_file,
)
from auditor.zk.tls import ZkTls, zk_tls_from_properties

__all__ = [
    "BadVersionError",
    "EventType",
    "FencedOutError",
    "NoNodeError",
    "NodeExistsError",
    "NotEmptyError",
    "SaslOptions",
    "SessionState",
    "ZkAuthError",
    "ZkClient",
    "ZkCredentials",
    "ZkError",
    "ZkResponseError",
    "ZkSecurity",
    "ZkStat",
    "ZkTimeoutError",
    "ZkTls",
    "ZkTlsError",
    "ZkUnavailableError",
    "parse_zk_auth",
    "read_zk_auth_file",
    "zk_tls_from_properties",
]
