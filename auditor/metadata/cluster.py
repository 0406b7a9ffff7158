"""A cluster to connect to, and connecting: ZooKeeper session, ledgers root, ledger manager.

The CLI, the daemon and the scan's partitions all connect through here, so it
sits in the metadata layer, below every one of them (the flags that build a
`ClusterTarget` from a command line stay in `auditor.cli.cluster`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from auditor.errors import AuditorError
from auditor.metadata.layout import LayoutError, LedgerManager, parse_layout
from auditor.metadata.service_uri import MetadataDriver
from auditor.zk import NoNodeError, ZkClient, ZkSecurity


class NoClusterError(AuditorError):
    """There is no BookKeeper cluster at the given ledgers root."""


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    hosts: str
    root: str
    manager: LedgerManager | None  # None: read it from LAYOUT
    timeout: float
    #: Credentials and the ACL policy of what we create (travels to Spark partitions too).
    security: ZkSecurity = field(default_factory=ZkSecurity)
    #: Whose driver the cluster's Java nodes run (`metadata-store:` URIs: Pulsar's).
    driver: MetadataDriver = MetadataDriver.BOOKKEEPER


async def read_manager(zk: ZkClient, root: str) -> LedgerManager:
    try:
        data, _ = await zk.get(f"{root}/LAYOUT")
    except NoNodeError as exc:
        raise NoClusterError(
            f"no BookKeeper cluster at {root}: {root}/LAYOUT does not exist"
        ) from exc
    try:
        return parse_layout(data).manager
    except LayoutError as exc:
        raise LayoutError(f"{root}/LAYOUT: {exc}") from exc


@asynccontextmanager
async def connect(target: ClusterTarget) -> AsyncIterator[tuple[ZkClient, LedgerManager]]:
    zk = ZkClient(target.hosts, timeout=target.timeout, security=target.security)
    await zk.start()
    try:
        try:
            manager = target.manager or await read_manager(zk, target.root)
        except NoClusterError as exc:
            _, slash, chroot = target.hosts.partition("/")
            if not slash or not chroot:
                raise
            # The root is inside the chroot: say so, or the path shown looks absolute.
            raise NoClusterError(f"{exc} (under ZooKeeper chroot /{chroot})") from exc
        yield zk, manager
    finally:
        await zk.close()
