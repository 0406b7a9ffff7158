"""Fixtures of the interop suite: real BookKeeper clusters on the session's ZooKeeper.

Each cluster has a ledgers root of its own (`/<name>/ledgers`, made by BookieShell's
`metaformat`), its own bookies and temporary directories, so tests share the ZooKeeper
server and the compiled Java programs, never a cluster's state, unless a module asks for
the module-wide cluster on purpose.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from auditor.testing.zkserver import ZooKeeperServer
from tests.interop.realbk import RealCluster, compile_programs, jars, temp_dir


@pytest.fixture(scope="session")
def interop_classes() -> Iterator[Path]:
    """tests/interop/java/*.java compiled once against the pinned jars."""
    jars()
    out = temp_dir("bk-interop-classes-")
    try:
        yield compile_programs(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


MakeCluster = Callable[..., RealCluster]


def _factory(zk_server: ZooKeeperServer, classes: Path) -> Iterator[MakeCluster]:
    made: list[RealCluster] = []
    workdir = temp_dir("bk-interop-")

    def make(*storages: str, driver: str = "bookkeeper", **settings: object) -> RealCluster:
        name = f"bk-{uuid.uuid4().hex[:10]}"
        cluster = RealCluster(zk_server.hosts, classes, workdir / name, name, driver)
        made.append(cluster)
        cluster.add_bookies(*storages, **settings)
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def real_cluster(zk_server: ZooKeeperServer, interop_classes: Path) -> Iterator[MakeCluster]:
    """Makes real clusters for one test: `real_cluster("sorted", "db", ...)`, one bookie
    of each ledger storage named (`driver="pulsar"`: on Pulsar's metadata driver); all
    stopped at the test's end."""
    yield from _factory(zk_server, interop_classes)


@pytest.fixture(scope="module")
def module_cluster_factory(
    zk_server: ZooKeeperServer, interop_classes: Path
) -> Iterator[MakeCluster]:
    """As `real_cluster`, for clusters a whole module shares (read-only scenarios)."""
    yield from _factory(zk_server, interop_classes)
