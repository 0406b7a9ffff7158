"""Callers branch on what a store's call ran into (a node that is missing, already there,
at another version, not empty) and must not learn which store answered, so both adapters
raise one set of errors in place of their client libraries' own.

What a metadata store's calls raise, whichever store it is (`auditor.zk`, `auditor.etcd`).

`StoreUnavailableError` and its kinds are operator errors with a readable message and
the exit code of an unreachable service (3).
"""

from __future__ import annotations

from auditor.errors import AuditorError, ServiceUnavailableError


class StoreError(Exception):
    """A store refused one operation on one path (the path is the message)."""

    def __init__(self, path: str = "", *args: object) -> None:
        super().__init__(path, *args)
        self.path = path

    def __str__(self) -> str:
        return self.path


class NoNodeError(StoreError):
    """The node does not exist (or its parent does not, for a create)."""


class NodeExistsError(StoreError):
    """A create found the node already there."""


class BadVersionError(StoreError):
    """A conditional write found the node at another version than the one given."""


class NotEmptyError(StoreError):
    """A delete found children under the node."""


class StoreUnavailableError(ServiceUnavailableError):
    """The metadata store could not be reached, or our session with it is gone."""


class StoreTimeoutError(StoreUnavailableError):
    """A metadata-store call did not complete within its deadline."""


class StoreResponseError(StoreUnavailableError):
    """The store answered with a reply that does not parse."""


class WatchUnsupportedError(StoreUnavailableError):
    """The store does not offer the watch asked for (a ZooKeeper older than 3.6 has no
    persistent recursive watches): the caller falls back to reading."""


class FencedOutError(StoreUnavailableError):
    """A fenced write was refused: the fencing node (our vote, our leader key) is gone or
    changed.

    This is how a leader that lost its session, or its leadership, is kept from
    writing anything: the write and the check of its own node go to the store as one
    transaction, so either both happen or neither does.
    """


class NodeChangedError(StoreError):
    """A guarded write was refused: the guard node (say, a ledger's metadata the write was
    decided on) is gone or at another version than the one read.

    Not an outage and not lost leadership: the caller's premise is stale. It reads
    again and decides again.
    """


class StoreAuthError(AuditorError):
    """The store refused this session's credentials, or a node's ACL does not admit us.

    Waiting does not help, the configuration must change: the exit code of a
    configuration error.
    """

    exit_code = 2
