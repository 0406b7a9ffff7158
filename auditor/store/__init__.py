"""The metadata-store port (`port.py`) and the errors every adapter raises (`errors.py`).

Code above the adapters imports the store from here only; `open_store` lives in
`auditor.metadata.cluster`, which knows the adapters.
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
