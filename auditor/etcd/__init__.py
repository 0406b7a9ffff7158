"""The etcd adapter of the metadata-store port: the only place that talks to etcd.

`EtcdStore` keeps the tree as Apache Pulsar's `EtcdMetadataStore` lays it out in etcd
keys (see `store.py`), behind the same `auditor.store.MetadataStore` port as
`auditor.zk.ZkClient`, and raises the port's errors.
"""

from auditor.etcd.store import EtcdStat, EtcdStore, parse_endpoints

__all__ = ["EtcdStat", "EtcdStore", "parse_endpoints"]
