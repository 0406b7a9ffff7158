"""The only place that talks to kazoo: an asyncio facade with a timeout on every call."""

from auditor.zk.client import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    ZkClient,
    ZkError,
    ZkStat,
    ZkTimeoutError,
    ZkUnavailableError,
)

__all__ = [
    "BadVersionError",
    "NoNodeError",
    "NodeExistsError",
    "NotEmptyError",
    "ZkClient",
    "ZkError",
    "ZkStat",
    "ZkTimeoutError",
    "ZkUnavailableError",
]
