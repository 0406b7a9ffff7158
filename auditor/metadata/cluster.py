"""The CLI, the daemon and the scan's partitions all connect to a cluster, and must reach the
same store, ledgers root and ledger manager for the same target; connecting therefore sits
in the metadata layer, below every one of them.

A cluster to connect to, and connecting: the metadata store, ledgers root, ledger manager.

The flags that build a `ClusterTarget` from a command line stay in
`auditor.cli.cluster`. This is also the one place that picks the metadata-store
adapter (`open_store`): ZooKeeper, etcd as Pulsar keeps its tree there, or etcd as
BookKeeper's own driver keys it (seen through `BookKeeperEtcdView`, so that everything
above names ZooKeeper's paths).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from auditor.errors import AuditorError, ConfigError
from auditor.metadata.bk_etcd import BookKeeperEtcdView
from auditor.metadata.etcd_config import EtcdOptions
from auditor.metadata.layout import LayoutError, LedgerManager, parse_layout
from auditor.metadata.service_uri import MetadataDriver
from auditor.store import MetadataStore, NoNodeError, StoreKind
from auditor.zk import ZkClient, ZkSecurity

if TYPE_CHECKING:
    from auditor.etcd import EtcdStore


class NoClusterError(AuditorError):
    """There is no BookKeeper cluster at the given ledgers root."""


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    #: A ZooKeeper connect string, or (store ETCD) the etcd endpoints joined by ','.
    hosts: str
    root: str
    manager: LedgerManager | None  # None: read it from LAYOUT
    timeout: float
    #: Credentials and the ACL policy of what we create (travels to Spark partitions too).
    security: ZkSecurity = field(default_factory=ZkSecurity)
    #: Whose driver the cluster's Java nodes run (`metadata-store:` URIs: Pulsar's).
    driver: MetadataDriver = MetadataDriver.BOOKKEEPER
    #: Which store holds the metadata.
    store: StoreKind = StoreKind.ZOOKEEPER
    #: etcd's TLS and authority (Pulsar's etcd configuration file), when given.
    etcd: EtcdOptions | None = None

    @property
    def marks(self) -> bool:
        """Whether the cluster's driver has an under-replication manager (marks, workers)."""
        return self.driver.marks


def open_store(
    hosts: str,
    *,
    store: StoreKind = StoreKind.ZOOKEEPER,
    driver: MetadataDriver = MetadataDriver.BOOKKEEPER,
    root: str = "/ledgers",
    timeout: float = 10.0,
    session_timeout: float = 30.0,
    security: ZkSecurity | None = None,
    etcd: EtcdOptions | None = None,
) -> MetadataStore:
    """A client of the cluster's metadata store, not yet started.

    On BookKeeper's own etcd driver the client is seen through `BookKeeperEtcdView`
    (its keys for the layout, the instance id and the registry are named differently).
    """
    if store is StoreKind.ETCD:
        client = _etcd_store(hosts, etcd or EtcdOptions(), timeout, session_timeout)
        if driver is MetadataDriver.ETCD:
            return BookKeeperEtcdView(client, root)
        return client
    return ZkClient(hosts, timeout=timeout, session_timeout=session_timeout, security=security)


def open_zookeeper_beside(store: MetadataStore, hosts: str, timeout: float) -> MetadataStore:
    """A client of another ZooKeeper (`hosts`: Pulsar's own metadata kept apart from the
    cluster's), with the cluster's credentials when the cluster is on ZooKeeper too."""
    security = store.security if isinstance(store, ZkClient) else None
    return open_store(hosts, timeout=timeout, security=security)


def _etcd_store(
    hosts: str, options: EtcdOptions, timeout: float, session_timeout: float
) -> EtcdStore:
    """An etcd client of `hosts`; TLS where an endpoint is https:// or `useTls` says so (as
    jetcd with an SSL context), the TLS files read then. The etcd client (and gRPC under
    it) is imported here, when a store is etcd: a ZooKeeper command does not pay for it."""
    from auditor.etcd import EtcdStore

    endpoints = hosts.split(",")
    if options.use_tls:
        endpoints = [e.replace("http://", "https://", 1) for e in endpoints]
    tls = any(e.startswith("https://") for e in endpoints)
    try:
        return EtcdStore(
            endpoints,
            timeout=timeout,
            session_timeout=session_timeout,
            ca_file=options.ca_file if tls else None,
            cert_file=options.cert_file if tls else None,
            key_file=options.key_file if tls else None,
            authority=options.authority,
        )
    except (ValueError, OSError) as exc:
        raise ConfigError(f"etcd at {hosts}: {exc}") from None


def target_store(target: ClusterTarget) -> MetadataStore:
    """`open_store` for a `ClusterTarget`."""
    return open_store(
        target.hosts,
        store=target.store,
        driver=target.driver,
        root=target.root,
        timeout=target.timeout,
        security=target.security,
        etcd=target.etcd,
    )


async def read_manager(
    store: MetadataStore, root: str, driver: MetadataDriver = MetadataDriver.BOOKKEEPER
) -> LedgerManager:
    """The ledger manager whose paths the cluster's ledgers are at.

    BookKeeper's drivers name it in `<root>/LAYOUT`. Pulsar's driver does not read LAYOUT
    for its paths: its `PulsarLedgerManager` always keeps ledgers at the hybrid
    hierarchical paths (legacy hierarchical below 2**31, long hierarchical above), and a
    cluster formatted through it (`metaformat`, or Pulsar's own set-up) has no LAYOUT at
    all, as a real 4.0.7 bookie on `metadata-store:zk:` shows. So on Pulsar's driver a
    missing LAYOUT is the hierarchical manager, not a missing cluster; the registry
    (`<root>/available`) still tells a cluster from an empty path. A LAYOUT that is there
    (a cluster made by BookKeeper's own driver before it moved to Pulsar's, whose default
    was the hierarchical manager too) is read as on any cluster.
    """
    try:
        data, _ = await store.get(f"{root}/LAYOUT")
    except NoNodeError as exc:
        if driver is MetadataDriver.PULSAR and await store.exists(f"{root}/available"):
            return LedgerManager.HIERARCHICAL
        raise NoClusterError(
            f"no BookKeeper cluster at {root}: {root}/LAYOUT does not exist"
        ) from exc
    try:
        return parse_layout(data).manager
    except LayoutError as exc:
        raise LayoutError(f"{root}/LAYOUT: {exc}") from exc


@asynccontextmanager
async def connect(target: ClusterTarget) -> AsyncIterator[tuple[MetadataStore, LedgerManager]]:
    store = target_store(target)
    await store.start()
    try:
        try:
            manager = target.manager or await read_manager(store, target.root, target.driver)
        except NoClusterError as exc:
            _, slash, chroot = target.hosts.partition("/")
            if target.store is not StoreKind.ZOOKEEPER or not slash or not chroot:
                raise
            # The root is inside the chroot: say so, or the path shown looks absolute.
            raise NoClusterError(f"{exc} (under ZooKeeper chroot /{chroot})") from exc
        yield store, manager
    finally:
        await store.close()
