"""A Pulsar `metadata-store:zk:` URI read against a real ZooKeeper: the path after the hosts
is a chroot, and the ledgers are at `<chroot>/ledgers`, as Pulsar's driver puts them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from auditor.cli.cluster import target_from_args
from auditor.metadata.cluster import NoClusterError, connect
from auditor.metadata.layout import LedgerManager
from auditor.metadata.service_uri import MetadataDriver
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.zkserver import ZooKeeperServer
from auditor.zk import ZkClient

pytestmark = pytest.mark.timeout(60)

E1 = ["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "auditor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_ledgers_under_a_chroot_through_a_metadata_store_uri(
    zk: ZkClient, zk_server: ZooKeeperServer
) -> None:
    # `zk` is rooted at a chroot of its own: the cluster lands at <chroot>/ledgers.
    w = ClusterWriter(zk)
    await w.init_cluster()
    await w.write_ledger(make_metadata(7, E1, last_entry_id=3, length=400))
    await w.write_ledger(make_metadata(9, E1, last_entry_id=0, length=1))
    chroot = zk.hosts[len(zk_server.hosts) :]
    assert chroot.startswith("/t-")
    host, port = zk_server.hosts.split(":")
    # Pulsar's ';' separator and a parameter of Pulsar's store client we do not use.
    uri = f"metadata-store:zk:{host}:{port};{host}:{port}{chroot}?batchingEnabled=false"

    proc = run("ledgers", "--metadata-service-uri", uri, "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["ledger_id"], r["path"]) for r in rows] == [
        (7, "/ledgers/00/0000/L0007"),
        (9, "/ledgers/00/0000/L0009"),
    ]
    note, *rest = proc.stderr.splitlines()
    assert note == (
        "bk-auditor: note: ignoring metadataServiceUri parameters 'batchingEnabled': "
        "they tune the Java client only"
    )
    assert "2 ledgers, 0 corrupt" in "\n".join(rest)


async def test_a_chroot_without_a_cluster_names_the_chroot(
    zk: ZkClient, zk_server: ZooKeeperServer
) -> None:
    chroot = zk.hosts[len(zk_server.hosts) :]
    proc = run("ledgers", "--metadata-service-uri", f"metadata-store:zk:{zk.hosts}")
    assert proc.returncode == 1
    assert proc.stderr == (
        "bk-auditor: error: no BookKeeper cluster at /ledgers: /ledgers/LAYOUT does not exist "
        f"(under ZooKeeper chroot {chroot})\n"
    )


async def test_connect_reads_layout_inside_the_chroot(
    zk: ZkClient, zk_server: ZooKeeperServer
) -> None:
    await ClusterWriter(zk, manager=LedgerManager.LONG_HIERARCHICAL).init_cluster()
    chroot = zk.hosts[len(zk_server.hosts) :]
    target = target_from_args(None, None, f"metadata-store:zk:{zk.hosts}", 10.0)
    assert (target.hosts, target.root, target.driver) == (
        zk.hosts,
        "/ledgers",
        MetadataDriver.PULSAR,
    )
    async with connect(target) as (client, manager):
        assert manager is LedgerManager.LONG_HIERARCHICAL
        assert (await client.get("/ledgers/LAYOUT"))[0] == (await zk.get("/ledgers/LAYOUT"))[0]
    async with ZkClient(zk_server.hosts, timeout=10.0) as root:
        assert await root.exists(f"{chroot}/ledgers/LAYOUT") is not None
    # --ledgers-root wins over the URI's root, and stays inside the chroot.
    elsewhere = target_from_args(None, "/other", f"metadata-store:zk:{zk.hosts}", 10.0)
    with pytest.raises(NoClusterError) as caught:
        async with connect(elsewhere):
            pass
    assert str(caught.value) == (
        "no BookKeeper cluster at /other: /other/LAYOUT does not exist "
        f"(under ZooKeeper chroot {chroot})"
    )


async def test_pulsars_driver_without_a_layout_is_the_hierarchical_manager(
    zk: ZkClient,
) -> None:
    """A cluster formatted through Pulsar's driver has no LAYOUT (seen on a real 4.0.7
    bookie, tests/interop): its ledger manager always uses the hybrid hierarchical paths.
    BookKeeper's own driver still needs LAYOUT, and a chroot without a registry is still
    no cluster."""
    pulsar = target_from_args(None, None, f"metadata-store:zk:{zk.hosts}", 10.0)
    bookkeeper = target_from_args(zk.hosts, None, None, 10.0)
    with pytest.raises(NoClusterError):
        async with connect(pulsar):
            pass
    await zk.ensure_path("/ledgers/available/readonly")
    async with connect(pulsar) as (_, manager):
        assert manager is LedgerManager.HIERARCHICAL
    with pytest.raises(NoClusterError):
        async with connect(bookkeeper):
            pass
