"""A Spark task runs in a working directory of its own, so the paths a scan ships must be
the driver's files named absolutely; what must stay as given stays (absolute paths, empty
settings, a script named by a bare command, credentials)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from auditor.checks.findings import Check
from auditor.config import AuditorConfig
from auditor.metadata.cluster import ClusterTarget
from auditor.metadata.etcd_config import EtcdOptions
from auditor.scan.anchor import anchored
from auditor.scan.partition import ScanSpec
from auditor.zk import ZkSecurity, parse_zk_auth
from auditor.zk.tls import StoreFile, ZkTls

BASE = Path("/opt/scan")


def _spec(**bookkeeper: Any) -> ScanSpec:
    tls = ZkTls(StoreFile("secrets/ca.pem", "PEM"), StoreFile("/etc/zk/client.pem", "PEM"))
    security = ZkSecurity(parse_zk_auth("digest:alice:secret"), tls=tls)
    target = ClusterTarget(
        "zk:2181", "/ledgers", None, 10.0, security, etcd=EtcdOptions(True, "ca.pem", None, None)
    )
    config = AuditorConfig()
    config = replace(
        config,
        bookkeeper=replace(config.bookkeeper, **bookkeeper),
        checks=replace(config.checks, racks_file="racks.json", racks_script="topology.sh"),
    )
    return ScanSpec(target, config, (Check.REPLICAS,))


def test_relative_paths_are_anchored_at_the_driver_s_directory() -> None:
    spec = anchored(
        _spec(
            tlsTrustStore="secrets/../secrets/bookie-ca.pem",
            tlsKeyStore="secrets/auditor.key",
            tlsCertificatePath="/etc/bk/auditor.pem",
            clientKeyStorePasswordPath="pw",
            networkTopologyScriptFileName="bin/topology.sh",
        ),
        BASE,
    )
    bk = spec.config.bookkeeper
    assert (bk.tlsTrustStore, bk.tlsKeyStore, bk.tlsCertificatePath) == (
        "/opt/scan/secrets/bookie-ca.pem",
        "/opt/scan/secrets/auditor.key",
        "/etc/bk/auditor.pem",
    )
    assert bk.clientKeyStorePasswordPath == "/opt/scan/pw"
    assert bk.tlsKeyStorePasswordPath == ""  # unset stays unset
    assert bk.networkTopologyScriptFileName == "/opt/scan/bin/topology.sh"
    assert spec.config.checks.racks_file == "/opt/scan/racks.json"
    assert spec.config.checks.racks_script == "topology.sh"  # a command, found on PATH
    tls = spec.target.security.tls
    assert tls is not None and tls.trust_store is not None and tls.key_store is not None
    assert tls.trust_store.location == "/opt/scan/secrets/ca.pem"
    assert tls.key_store.location == "/etc/zk/client.pem"
    assert spec.target.etcd == EtcdOptions(True, "/opt/scan/ca.pem", None, None)
    # Everything else travels as it was.
    original = _spec()
    assert spec.target.security.credentials == original.target.security.credentials
    assert spec.checks == original.checks


def test_a_spec_without_relative_paths_is_shipped_as_it_is() -> None:
    spec = replace(_spec(), target=ClusterTarget("zk:2181", "/ledgers", None, 10.0))
    spec = replace(
        spec, config=replace(spec.config, checks=replace(spec.config.checks, racks_file=""))
    )
    assert anchored(spec, BASE) is spec
