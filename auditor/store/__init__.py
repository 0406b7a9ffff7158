"""Code above the adapters must not know which store answers, so it imports the store's
interface and errors from this package only, never from `auditor.zk` or `auditor.etcd`.

The metadata-store port (`port.py`) and the errors every adapter raises (`errors.py`);
`open_store` lives in `auditor.metadata.cluster`, which knows the adapters.
"""

from auditor.store.errors import (
    BadVersionError,
    FencedOutError,
    NodeChangedError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    StoreAuthError,
    StoreError,
    StoreResponseError,
    StoreTimeoutError,
    StoreUnavailableError,
    WatchUnsupportedError,
)
from auditor.store.port import (
    Event,
    EventType,
    Gap,
    MetadataStore,
    RangeItem,
    SessionState,
    Stat,
    StoreKind,
)

__all__ = [
    "BadVersionError",
    "Event",
    "EventType",
    "FencedOutError",
    "Gap",
    "MetadataStore",
    "NoNodeError",
    "NodeChangedError",
    "NodeExistsError",
    "NotEmptyError",
    "RangeItem",
    "SessionState",
    "Stat",
    "StoreAuthError",
    "StoreError",
    "StoreKind",
    "StoreResponseError",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "WatchUnsupportedError",
]
