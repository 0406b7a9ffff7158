"""Pulsar and BookKeeper can keep their metadata in etcd instead of ZooKeeper, and the rest
of the product should not care which; this package, the port's etcd adapter, is the only
place that talks to etcd.

`EtcdStore` keeps the tree as Apache Pulsar's `EtcdMetadataStore` lays it out in etcd
keys (see `store.py`), behind the same `auditor.store.MetadataStore` port as
`auditor.zk.ZkClient`, and raises the port's errors.
"""

from auditor.etcd.store import EtcdStat, EtcdStore, parse_endpoints

__all__ = ["EtcdStat", "EtcdStore", "parse_endpoints"]
