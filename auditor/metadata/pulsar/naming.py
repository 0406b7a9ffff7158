"""Pulsar's records name managed ledgers and schema ids, while operators think in topics and
namespaces; going from one to the other takes Pulsar's own naming rules, old namespaces and
URL-encoded names included.

How Pulsar names a topic's storage: managed ledger names, topics, namespaces, schema ids.

A persistent topic `persistent://tenant/ns/local` keeps its data in the managed
ledger `tenant/ns/persistent/local` (Pulsar's "persistence naming"), whose znode
is `/managed-ledgers/tenant/ns/persistent/local`. Namespaces created before
Pulsar 2.0 have three parts (`tenant/cluster/ns`), so their managed ledgers are
`tenant/cluster/ns/persistent/local`. The domain is the first component after
the namespace that is `persistent` (or `non-persistent`, which has no managed
ledger but may appear in names handed to us). A schema id is the topic's name
without the domain and the cluster, `tenant/ns/local`, shared by a partitioned
topic's partitions. Local names are stored URL-encoded.
"""

from __future__ import annotations

import urllib.parse

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

    Two-part namespaces and pre-2.0 three-part ones (`tenant/cluster/ns`) alike. The local
    name is decoded (`decode_local_name`), as Pulsar's `fromPersistenceNamingEncoding` does:
    a real broker's managed ledger `t/ns/persistent/orders%3Aeu` is the topic
    `persistent://t/ns/orders:eu`, the name its admin API, its clients and its own ledgers'
    `pulsar/compactedTopic` metadata use (seen against pulsar-broker 4.0.7; the encoded name
    is no topic Pulsar knows).
    """
    split = _split(name)
    if split is None:
        return None
    namespace, domain, local = split
    return f"{domain}://{namespace}/{decode_local_name(local)}"


def namespace_of_managed_ledger(name: str) -> str | None:
    """`tenant/ns/persistent/topic` -> `tenant/ns` (None if not that shape)."""
    split = _split(name)
    return None if split is None else split[0]


#: `-partition-<n>`: a partition of a partitioned topic (its own managed ledger, the
#: partitioned topic's schema).
PARTITION_SUFFIX = "-partition-"


def encode_local_name(local: str) -> str:
    """A topic's local name as Pulsar stores it in paths (`Codec.encode`: Java's
    URLEncoder, which keeps letters, digits and `.-*_` and writes a space as `+`)."""
    return urllib.parse.quote_plus(local, safe="*").replace("~", "%7E")


def decode_local_name(encoded: str) -> str:
    """The inverse of `encode_local_name` (`Codec.decode`: Java's URLDecoder, `+` is a
    space, `%XX` are UTF-8 bytes)."""
    return urllib.parse.unquote_plus(encoded)


def _topic_parts(topic: str) -> tuple[str, list[str], str]:
    """(domain, namespace parts, local name) of `<domain>://<namespace>/<local>`."""
    domain, sep, rest = topic.partition("://")
    parts = rest.split("/")
    if not sep or domain not in DOMAINS or len(parts) < 3 or not all(parts):
        raise ValueError(f"not a topic name: {topic!r}")
    ns_parts = 3 if len(parts) >= 4 else 2
    return domain, parts[:ns_parts], "/".join(parts[ns_parts:])


def managed_ledger_of_topic(topic: str) -> str:
    """`persistent://tenant/ns/topic` -> `tenant/ns/persistent/topic` (Pulsar's
    `getPersistenceNamingEncoding`; pre-2.0 `tenant/cluster/ns/persistent/topic`).

    Raises ValueError for a name that is not `<domain>://<namespace>/<local>`.
    """
    domain, namespace, local = _topic_parts(topic)
    return f"{'/'.join(namespace)}/{domain}/{encode_local_name(local)}"


def _partitioned(local: str) -> str:
    """The partitioned topic's local name of a partition's (`getPartitionedTopicName`)."""
    base, sep, index = local.rpartition(PARTITION_SUFFIX)
    if sep and index.isascii() and index.isdigit() and str(int(index)) == index:
        return base
    return local


def schema_id_of_topic(topic: str) -> str:
    """`persistent://tenant/ns/topic` -> `tenant/ns/topic`, the znode under `/schemas`
    (Pulsar's `getSchemaName`): no domain, no cluster (a pre-2.0 name loses it), and a
    partition's is its partitioned topic's."""
    _, namespace, local = _topic_parts(topic)
    return f"{namespace[0]}/{namespace[-1]}/{encode_local_name(_partitioned(local))}"


def namespace_of_topic(topic: str) -> str | None:
    """`persistent://tenant/ns/topic` -> `tenant/ns` (a pre-2.0 four-part name:
    `tenant/cluster/ns`); a name without its domain is read the same way. None if it has
    fewer than three parts."""
    _, sep, rest = topic.partition("://")
    parts = (rest if sep else topic).split("/")
    if len(parts) < 3:
        return None
    return "/".join(parts[:3] if len(parts) >= 4 else parts[:2])


def managed_ledger_of_named_topic(topic: str) -> str | None:
    """`managed_ledger_of_topic` for a name read from untrusted data (a ledger's custom
    metadata): None for one that is no topic name, never an exception."""
    try:
        return managed_ledger_of_topic(topic)
    except ValueError:
        return None


def topic_of_schema_id(schema_id: str) -> str | None:
    """`tenant/ns/orders%3Aeu` -> `persistent://tenant/ns/orders:eu`: the topic a schema's
    ledgers are counted under, its local name decoded (a real broker's schema ids are
    encoded, as its managed ledger names are). A schema id has no domain: the persistent
    topic is the one whose storage the schema sits beside (the broker's internal stats of
    that topic list its `schemaLedgers`). None for an id that is not `tenant/ns/local`."""
    parts = schema_id.split("/", 2)
    if len(parts) < 3 or not all(parts):
        return None
    return f"persistent://{parts[0]}/{parts[1]}/{decode_local_name(parts[2])}"


def namespace_of_schema_id(schema_id: str) -> str:
    """`tenant/ns/topic` -> `tenant/ns` (for a pre-2.0 topic, without its cluster)."""
    return schema_id.rsplit("/", 1)[0]
