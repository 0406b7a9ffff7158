"""The driver reads a relative path against its own working directory, but a Spark task runs
in a directory Spark made for its executor: a trust store given as `secrets/ca.pem` is found
by the driver and by the in-process engine, and not found on any executor, whose tasks then
fail (exit 70 once Spark's retries are spent). So the Spark engine ships every file path of
a scan anchored at the driver's working directory: the same file, named absolutely.

What is anchored: the files the executors read themselves, which are the ZooKeeper TLS
stores (`ZkTls`), bookie TLS's PEM stores and password files, the rack sources
(`checks.racks_file`, and a script named by a path: a bare command name stays a command
found on PATH), and etcd's TLS files. Credentials are not among them: the driver reads
them and ships what they say.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from auditor.config import AuditorConfig
from auditor.metadata.cluster import ClusterTarget
from auditor.scan.partition import ScanSpec
from auditor.zk import ZkSecurity

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")

#: BookKeeper keys naming files the bookie client reads (the TLS stores and password files).
BOOKIE_FILES = (
    "tlsTrustStore",
    "tlsKeyStore",
    "tlsKeyStorePasswordPath",
    "tlsCertificatePath",
    "clientTrustStore",
    "clientKeyStore",
    "clientKeyStorePasswordPath",
    "networkTopologyScriptFileName",
)


def anchor(path: str, base: Path) -> str:
    """`path` made absolute against `base`; empty and absolute ones as they are."""
    if not path or os.path.isabs(path):
        return path
    return os.path.normpath(base / path)


def _script(path: str, base: Path) -> str:
    """A script setting: a path is anchored, a bare command name is left to PATH."""
    return anchor(path, base) if os.sep in path else path


def _changed(obj: D, values: dict[str, Any]) -> D:
    """`obj` with `values` set, or `obj` itself when nothing differs (no copy for nothing)."""
    differing = {k: v for k, v in values.items() if getattr(obj, k) != v}
    return replace(obj, **differing) if differing else obj


def anchored_config(config: AuditorConfig, base: Path) -> AuditorConfig:
    bk = config.bookkeeper
    files = {k: anchor(getattr(bk, k), base) for k in BOOKIE_FILES}
    files["networkTopologyScriptFileName"] = _script(bk.networkTopologyScriptFileName, base)
    checks = config.checks
    racks = {
        "racks_file": anchor(checks.racks_file, base),
        "racks_script": _script(checks.racks_script, base),
    }
    return _changed(config, {"bookkeeper": _changed(bk, files), "checks": _changed(checks, racks)})


def anchored_target(target: ClusterTarget, base: Path) -> ClusterTarget:
    security: ZkSecurity = target.security
    tls = security.tls
    if tls is not None:
        stores = {
            name: _changed(store, {"location": anchor(store.location, base)})
            for name in ("trust_store", "key_store")
            if (store := getattr(tls, name)) is not None
        }
        security = _changed(security, {"tls": _changed(tls, stores)})
    etcd = target.etcd
    if etcd is not None:
        etcd = _changed(
            etcd,
            {
                name: anchor(value, base)
                for name in ("ca_file", "cert_file", "key_file")
                if (value := getattr(etcd, name)) is not None
            },
        )
    return _changed(target, {"security": security, "etcd": etcd})


def anchored(spec: ScanSpec, base: Path | None = None) -> ScanSpec:
    """`spec` with every file path its partitions read made absolute against `base` (the
    process's working directory when not given)."""
    where = base if base is not None else Path.cwd()
    return _changed(
        spec,
        {
            "target": anchored_target(spec.target, where),
            "config": anchored_config(spec.config, where),
        },
    )
