"""How Pulsar names a topic's storage: managed ledger names, topics, namespaces, schema ids.

A persistent topic `persistent://tenant/ns/local` keeps its data in the managed
ledger `tenant/ns/persistent/local` (Pulsar's "persistence naming"), whose znode
is `/managed-ledgers/tenant/ns/persistent/local`. Namespaces created before
Pulsar 2.0 have three parts (`tenant/cluster/ns`), so their managed ledgers are
`tenant/cluster/ns/persistent/local`. The domain is the first component after
the namespace that is `persistent` (or `non-persistent`, which has no managed
ledger but may appear in names handed to us). A schema id is the topic's name
without the domain: `tenant/ns/local`.
"""

from __future__ import annotations

DOMAINS = ("persistent", "non-persistent")


def _split(name: str) -> tuple[str, str, str] | None:
    """(namespace, domain, local name) of a managed ledger name, if it has that shape."""
    parts = name.split("/")
    for i in range(2, min(len(parts) - 1, 4)):
        if parts[i] in DOMAINS:
            local = "/".join(parts[i + 1 :])
            if local:
                return "/".join(parts[:i]), parts[i], local
    return None


def topic_of_managed_ledger(name: str) -> str | None:
    """`tenant/ns/persistent/topic` -> `persistent://tenant/ns/topic` (None if not that shape).

    Two-part namespaces and pre-2.0 three-part ones (`tenant/cluster/ns`) alike.
    """
    split = _split(name)
    if split is None:
        return None
    namespace, domain, local = split
    return f"{domain}://{namespace}/{local}"


def namespace_of_managed_ledger(name: str) -> str | None:
    """`tenant/ns/persistent/topic` -> `tenant/ns` (None if not that shape)."""
    split = _split(name)
    return None if split is None else split[0]


def managed_ledger_of_topic(topic: str) -> str:
    """`persistent://tenant/ns/topic` -> `tenant/ns/persistent/topic`.

    Raises ValueError for a name that is not `<domain>://<namespace>/<local>`.
    """
    domain, sep, rest = topic.partition("://")
    if not sep or domain not in DOMAINS:
        raise ValueError(f"not a topic name: {topic!r}")
    parts = rest.split("/")
    if len(parts) < 3 or not all(parts):
        raise ValueError(f"not a topic name: {topic!r}")
    ns_parts = 3 if len(parts) >= 4 else 2
    namespace = "/".join(parts[:ns_parts])
    local = "/".join(parts[ns_parts:])
    return f"{namespace}/{domain}/{local}"


def schema_id_of_topic(topic: str) -> str:
    """`persistent://tenant/ns/topic` -> `tenant/ns/topic` (the znode under `/schemas`)."""
    domain, sep, rest = topic.partition("://")
    if not sep or domain not in DOMAINS or not rest:
        raise ValueError(f"not a topic name: {topic!r}")
    return rest


def namespace_of_schema_id(schema_id: str) -> str:
    """`tenant/ns/topic` -> `tenant/ns`; `tenant/cluster/ns/topic` -> `tenant/cluster/ns`."""
    return schema_id.rsplit("/", 1)[0]
