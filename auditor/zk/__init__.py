"""The only place that talks to kazoo: an asyncio facade with a timeout on every call.

The kazoo exceptions callers branch on are re-exported here unchanged, so no
other module imports kazoo.
"""

from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.protocol.states import EventType

from auditor.zk.client import (
    FencedOutError,
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
    "KazooState",
    "NoNodeError",
    "NodeExistsError",
    "NotEmptyError",
    "SaslOptions",
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
