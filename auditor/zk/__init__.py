"""The only place that talks to kazoo: an asyncio facade with a timeout on every call.

The kazoo exceptions callers branch on are re-exported here unchanged, so no
other module imports kazoo.
"""

from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from auditor.zk.client import (
    FencedOutError,
    ZkClient,
    ZkError,
    ZkStat,
    ZkTimeoutError,
    ZkUnavailableError,
)

__all__ = [
    "BadVersionError",
    "FencedOutError",
    "KazooState",
    "NoNodeError",
    "NodeExistsError",
    "NotEmptyError",
    "ZkClient",
    "ZkError",
    "ZkStat",
    "ZkTimeoutError",
    "ZkUnavailableError",
]
