"""An operator fixes topics, not ledger ids: a report that says "three ledgers of
persistent://shop/orders/payments are below ack quorum" is actionable where a list of ids
is not.

Who a ledger belongs to, read from the custom metadata Pulsar writes on every ledger.

Pulsar's brokers tag each ledger they create (`LedgerMetadataUtils`):
`application=pulsar`, a `component` (`managed-ledger`, `compacted-ledger`, `schema`) and
the owner's name under `pulsar/managed-ledger`, `pulsar/cursor`, `pulsar/compactedTopic`
or `pulsar/schemaId`. Brokers before 2.7 used `psr/managed-ledger`, `psr/cursor`,
`compactedTopic` and `schemaId`; both spellings are read.

A ledger without these keys has no owner (None), and reports carry nothing
extra for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Re-exported: callers took it from here before it moved to metadata/.
from auditor.metadata.pulsar.naming import topic_of_managed_ledger as topic_of_managed_ledger

APPLICATION = "application"
COMPONENT = "component"
_MANAGED_LEDGER = ("pulsar/managed-ledger", "psr/managed-ledger")
_CURSOR = ("pulsar/cursor", "psr/cursor")
_COMPACTED_TOPIC = ("pulsar/compactedTopic", "compactedTopic")
_SCHEMA_ID = ("pulsar/schemaId", "schemaId")


@dataclass(frozen=True, slots=True)
class Owner:
    """A ledger's owner; `key` is what reports group by (the topic when it is known)."""

    key: str
    application: str | None = None
    component: str | None = None
    managed_ledger: str | None = None
    topic: str | None = None
    cursor: str | None = None
    schema_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key}
        for name in ("application", "component", "managed_ledger", "topic", "cursor", "schema_id"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Owner:
        return cls(
            key=str(doc["key"]),
            application=doc.get("application"),
            component=doc.get("component"),
            managed_ledger=doc.get("managed_ledger"),
            topic=doc.get("topic"),
            cursor=doc.get("cursor"),
            schema_id=doc.get("schema_id"),
        )


def _text(value: bytes) -> str | None:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _first(custom: dict[str, str], keys: Iterable[str]) -> str | None:
    for k in keys:
        if custom.get(k):
            return custom[k]
    return None


def owner_of(custom_metadata: Iterable[tuple[str, bytes]]) -> Owner | None:
    """The owner named by a ledger's custom metadata, or None when it names none."""
    custom = {k: t for k, v in custom_metadata if (t := _text(v)) is not None}
    application = custom.get(APPLICATION)
    component = custom.get(COMPONENT)
    managed = _first(custom, _MANAGED_LEDGER)
    cursor = _first(custom, _CURSOR)
    compacted = _first(custom, _COMPACTED_TOPIC)
    schema = _first(custom, _SCHEMA_ID)
    topic: str | None = None
    if managed is not None:
        topic = topic_of_managed_ledger(managed)
    elif compacted is not None:
        topic = compacted
    key = topic or managed or (f"schema:{schema}" if schema is not None else None)
    if key is None:
        return None
    return Owner(key, application, component, managed, topic, cursor, schema)
