"""The Pulsar audit needs every ledger Pulsar references, from a tree that is large, changes
while it is read, and may hold znodes that do not decode; none of that may stop the read or
be taken for a leak.

Reads which ledgers Pulsar references from its ZooKeeper tree (`PulsarRefs`).

Where Pulsar keeps them, under its metadata root (`root`, "" for a Pulsar whose
metadata store is ZooKeeper's root):

* `<root>/managed-ledgers/<tenant>/<ns>/persistent/<topic>`: a managed ledger
  (`ManagedLedgerInfo`); its children are its cursors (`ManagedCursorInfo`).
  Namespaces created before Pulsar 2.0 have a cluster:
  `<tenant>/<cluster>/<ns>/persistent/<topic>`. Under a tenant, a second-level
  znode whose child is `persistent` is a namespace; any other child makes the
  second level a cluster and the third a namespace (Pulsar's domain is the
  first `persistent` component after the namespace).
* `<root>/schemas/<tenant>/<ns>/<topic>` (`BookkeeperSchemaStorage`; the schema
  id is `TopicName.getSchemaName`: no domain, no cluster even for pre-2.0 topics,
  partitions share their topic's): a `SchemaLocator`. Intermediate znodes are
  empty; an empty znode at a locator's level is none (skipped).

Data is read in batches (`MetadataStore.get_many`: one multiRead per batch). A znode
deleted while we read (NoNode, on a listing or a read) is skipped: a topic
deleted meanwhile is no error. A znode whose bytes do not decode is a
`BadPulsarZnode` (path and reason) and the read goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from auditor.metadata.pulsar.formats import (
    PulsarFormatError,
    cursor_refs,
    managed_ledger_refs,
    schema_refs,
)
from auditor.metadata.pulsar.refs import BadPulsarZnode, PulsarRefs
from auditor.store import MetadataStore, NoNodeError

MANAGED_LEDGERS = "managed-ledgers"
SCHEMAS = "schemas"
PERSISTENT = "persistent"
#: Znodes read per batch (one multiRead each).
BATCH = 250
#: Listings in flight at once.
LISTINGS = 32

_T = TypeVar("_T")
_R = TypeVar("_R")


def managed_ledgers_root(root: str) -> str:
    return f"{root.rstrip('/')}/{MANAGED_LEDGERS}"


def schemas_root(root: str) -> str:
    return f"{root.rstrip('/')}/{SCHEMAS}"


async def _children(store: MetadataStore, path: str) -> list[str] | None:
    """Sorted children, or None when the znode is gone."""
    try:
        return sorted(await store.get_children(path))
    except NoNodeError:
        return None


async def _bounded(
    items: Sequence[_T], call: Callable[[_T], Awaitable[_R]], limit: int = LISTINGS
) -> list[_R]:
    slots = asyncio.Semaphore(limit)

    async def one(item: _T) -> _R:
        async with slots:
            return await call(item)

    return list(await asyncio.gather(*(one(i) for i in items)))


def _batches(items: Sequence[_T], size: int = BATCH) -> list[Sequence[_T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


@dataclass(frozen=True, slots=True)
class _ManagedLedger:
    name: str
    path: str


async def _managed_ledger_names(store: MetadataStore, root: str) -> list[_ManagedLedger]:
    """Every managed ledger znode under `<root>/managed-ledgers`, in name order."""
    base = managed_ledgers_root(root)
    tenants = await _children(store, base) or []

    async def level2(tenant: str) -> list[tuple[str, list[str]]]:
        names = await _children(store, f"{base}/{tenant}") or []

        async def level3(name: str) -> tuple[str, list[str]]:
            return f"{tenant}/{name}", await _children(store, f"{base}/{tenant}/{name}") or []

        return await _bounded(names, level3)

    # (tenant/x, children of it) for every second-level znode.
    seconds = [pair for group in await _bounded(tenants, level2) for pair in group]
    # Domain znodes: `t/ns/persistent` (2.0 and later) or `t/cluster/ns/persistent`.
    domains: list[str] = []
    v1_namespaces: list[str] = []
    for prefix, names in seconds:
        for name in names:
            if name == PERSISTENT:
                domains.append(f"{prefix}/{name}")
            else:
                v1_namespaces.append(f"{prefix}/{name}")

    async def v1(namespace: str) -> list[str]:
        names = await _children(store, f"{base}/{namespace}") or []
        return [f"{namespace}/{n}" for n in names if n == PERSISTENT]

    for group in await _bounded(v1_namespaces, v1):
        domains.extend(group)

    async def topics(domain: str) -> list[str]:
        return [f"{domain}/{t}" for t in await _children(store, f"{base}/{domain}") or []]

    names = sorted(n for group in await _bounded(domains, topics) for n in group)
    return [_ManagedLedger(n, f"{base}/{n}") for n in names]


async def _read_managed_ledgers(store: MetadataStore, mls: Sequence[_ManagedLedger]) -> PulsarRefs:
    out = PulsarRefs()
    for batch in _batches(mls):
        datas = await store.get_many([m.path for m in batch])
        cursor_lists = await _bounded(batch, lambda m: _children(store, m.path))
        cursors: list[tuple[_ManagedLedger, str, str]] = []
        for ml, got, names in zip(batch, datas, cursor_lists, strict=True):
            if got is None or names is None:
                continue  # deleted while we read
            out.managed_ledgers.add(ml.name)
            try:
                out.add_all(managed_ledger_refs(ml.name, ml.path, got[0]))
            except PulsarFormatError as exc:
                out.bad_znodes.append(BadPulsarZnode(ml.path, str(exc)))
            cursors.extend((ml, c, f"{ml.path}/{c}") for c in names)
        for cbatch in _batches(cursors):
            cdatas = await store.get_many([p for _, _, p in cbatch])
            for (ml, name, path), cgot in zip(cbatch, cdatas, strict=True):
                if cgot is None:
                    continue
                try:
                    read = cursor_refs(ml.name, name, path, cgot[0])
                except PulsarFormatError as exc:
                    out.bad_znodes.append(BadPulsarZnode(path, str(exc)))
                    continue
                out.cursors.append(read.record)
                out.add_all(read.refs)
                out.bad_znodes.extend(BadPulsarZnode(path, p) for p in read.problems)
    return out


async def _schema_ids(store: MetadataStore, root: str) -> list[str]:
    """Every znode three levels under `<root>/schemas` (tenant, namespace, topic)."""
    base = schemas_root(root)

    async def below(prefix: str) -> list[str]:
        path = f"{base}/{prefix}" if prefix else base
        return [f"{prefix}/{n}" if prefix else n for n in await _children(store, path) or []]

    level: list[str] = [""]
    for _ in range(3):
        level = [n for group in await _bounded(level, below) for n in group]
    return level


async def _read_schemas(
    store: MetadataStore, root: str, ids: Sequence[str], out: PulsarRefs
) -> None:
    base = schemas_root(root)
    for batch in _batches(ids):
        datas = await store.get_many([f"{base}/{i}" for i in batch])
        for schema_id, got in zip(batch, datas, strict=True):
            if got is None or not got[0]:
                continue  # deleted while we read, or no locator
            path = f"{base}/{schema_id}"
            out.schemas.add(schema_id)
            try:
                out.add_all(schema_refs(schema_id, path, got[0]))
            except PulsarFormatError as exc:
                out.bad_znodes.append(BadPulsarZnode(path, str(exc)))


#: What every Pulsar metadata root holds once a namespace exists (`/admin/policies`).
ADMIN = "admin"


async def read_pulsar_refs(store: MetadataStore, root: str = "") -> PulsarRefs:
    """Every ledger reference in Pulsar's tree under `root`: managed ledgers, their
    cursors, schemas. Bad znodes are named in `bad_znodes`; nothing read is dropped.

    A root with neither `managed-ledgers` nor `admin` under it is no Pulsar tree (a
    wrong `pulsar_root`, or the chroot named twice): it is a bad znode of its own, so
    that no ledger is called an orphan for want of references nobody could read."""
    ml_root = managed_ledgers_root(root)
    out = await _read_managed_ledgers(store, await _managed_ledger_names(store, root))
    await _read_schemas(store, root, await _schema_ids(store, root), out)
    if (
        await store.exists(ml_root) is None
        and await store.exists(f"{root.rstrip('/')}/{ADMIN}") is None
    ):
        out.bad_znodes.append(
            BadPulsarZnode(
                ml_root,
                f"no Pulsar metadata under {root or '/'}: neither {MANAGED_LEDGERS} nor "
                f"{ADMIN} exists (is checks.pulsar_root right? it is relative to a "
                "metadata-store URI's chroot)",
            )
        )
    return out


async def read_managed_ledger(store: MetadataStore, root: str, name: str) -> PulsarRefs:
    """One managed ledger (`tenant/ns/persistent/topic`) and its cursors, read again.
    A managed ledger that is gone gives empty refs (`name not in managed_ledgers`)."""
    ml = _ManagedLedger(name, f"{managed_ledgers_root(root)}/{name}")
    return await _read_managed_ledgers(store, [ml])


async def read_schema(store: MetadataStore, root: str, schema_id: str) -> PulsarRefs:
    """One schema locator (`tenant/ns/topic`), read again; gone: empty refs."""
    out = PulsarRefs()
    path = f"{schemas_root(root)}/{schema_id}"
    (got,) = await store.get_many([path])
    if got is None or not got[0]:
        return out
    out.schemas.add(schema_id)
    try:
        out.add_all(schema_refs(schema_id, path, got[0]))
    except PulsarFormatError as exc:
        out.bad_znodes.append(BadPulsarZnode(path, str(exc)))
    return out
