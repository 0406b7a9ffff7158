"""A whole ZooKeeper subtree as a value, for tests that assert nothing was written.

Data, version and child version of every znode: any write (a create, a set, a delete
below it) changes one of them, so two equal dumps mean an untouched tree.
"""

from __future__ import annotations

from auditor.zk import NoNodeError, ZkClient

Dump = dict[str, tuple[bytes, int, int]]


async def dump_tree(zk: ZkClient, path: str = "/") -> Dump:
    """Every znode under `path` (itself included): data, version, child version."""
    out: Dump = {}
    try:
        data, stat = await zk.get(path)
    except NoNodeError:
        return out
    out[path] = (data, int(stat.version), int(stat.cversion))
    for child in sorted(await zk.get_children(path)):
        out.update(await dump_tree(zk, f"{path.rstrip('/')}/{child}"))
    return out
