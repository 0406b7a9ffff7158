"""Tests that claim a command wrote nothing (a dry run, an audit that only reads) need an
exact comparison of the tree before and after.

A whole ZooKeeper subtree as a value, for tests that assert nothing was written.

Data, version and child version of every znode: any write (a create, a set, a delete
below it) changes one of them, so two equal dumps mean an untouched tree.
"""

from __future__ import annotations

from auditor.store import MetadataStore, NoNodeError

Dump = dict[str, tuple[bytes, int, int]]


async def dump_tree(store: MetadataStore, path: str = "/") -> Dump:
    """Every znode under `path` (itself included): data, version, child version."""
    out: Dump = {}
    try:
        data, stat = await store.get(path)
    except NoNodeError:
        return out
    # The child version is ZooKeeper's; a store without it (etcd) shows -1.
    out[path] = (data, int(stat.version), int(getattr(stat, "cversion", -1)))
    for child in sorted(await store.get_children(path)):
        out.update(await dump_tree(store, f"{path.rstrip('/')}/{child}"))
    return out
