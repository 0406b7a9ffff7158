"""Which metadata driver a cluster's nodes use (stub: the URI parsing lands here)."""

from __future__ import annotations

import enum


class MetadataDriver(enum.StrEnum):
    """Whose metadata driver the cluster's Java nodes run, and so whose election they use.

    BOOKKEEPER: BookKeeper's own ZooKeeper driver (`zk://`, `zk+hierarchical://`, a
    bare `--zk`): votes under `<root>/underreplication/auditorelection`.
    PULSAR: Pulsar's driver (`metadata-store:zk:...`): one ephemeral key
    `<root>/underreplication/leader` holding the leader's bookie id as a JSON string.
    """

    BOOKKEEPER = "bookkeeper"
    PULSAR = "pulsar"
