"""Shared fixtures: one real ZooKeeper server per test session, a fresh chroot per test;
one real etcd per test session, a fresh key prefix per test.

Under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`) each worker is a session of
its own: its own ZooKeeper and etcd (started by the first test that asks), on free ports,
in temporary directories of their own. The interop suite (tests/interop: real bookies,
Java AutoRecovery, a Pulsar broker, all JVMs) runs on one worker, first (the scheduler
below).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any

import grpc
import pytest
import structlog
from structlog.testing import capture_logs

from auditor.etcd import EtcdStore
from auditor.store import MetadataStore
from auditor.testing.etcdserver import EtcdServer
from auditor.testing.zkserver import ZooKeeperServer
from auditor.zk import ZkClient


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` (`make test`): tests/interop as one unit of work, the rest one unit
    per test (see tests/xdist_groups.py). Any other `--dist` is xdist's own."""
    if config.getoption("dist") != "loadgroup":
        return None
    from tests.xdist_groups import InteropOnOneWorker

    return InteropOnOneWorker(config, log)


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def zk_hosts(zk_server: ZooKeeperServer) -> str:
    """A connect string rooted at a chroot of its own, so tests share a server, not state."""
    return f"{zk_server.hosts}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def zk(zk_server: ZooKeeperServer, zk_hosts: str) -> AsyncIterator[ZkClient]:
    chroot = zk_hosts[len(zk_server.hosts) :]
    async with ZkClient(zk_server.hosts, timeout=10.0) as root:
        await root.ensure_path(chroot)
    client = ZkClient(zk_hosts, timeout=10.0, session_timeout=10.0)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    server = EtcdServer()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
async def etcd(etcd_server: EtcdServer) -> AsyncIterator[EtcdStore]:
    """A session on the shared etcd whose keys all start with a prefix of its own (the
    etcd adapter's chroot), so tests share a server, not state."""
    store = EtcdStore(
        [etcd_server.endpoint],
        prefix=f"/t-{uuid.uuid4().hex[:12]}",
        timeout=10.0,
        session_timeout=10.0,
    )
    await store.start()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture(params=["zookeeper", "etcd"], ids=["zookeeper", "etcd"])
def store(request: pytest.FixtureRequest) -> MetadataStore:
    """The metadata store a scenario runs on, once per store: the `zk` fixture's client
    (ZooKeeper, a chroot of its own) or the `etcd` fixture's store (etcd, a key prefix of
    its own, the tree kept as Pulsar's EtcdMetadataStore keeps it). Only the one asked for
    is set up (and torn down with the test)."""
    fixture = "zk" if request.param == "zookeeper" else "etcd"
    value: MetadataStore = request.getfixturevalue(fixture)
    return value


@pytest.fixture
async def grpc_held() -> AsyncIterator[None]:
    """gRPC's process-wide parts, up for the whole test: a leak count must not see them come
    and go.

    The asyncio poller (a thread and a socket pair) stays once made; the core's poller (an
    epoll and an eventfd) lives while any gRPC object does and is torn down, on gRPC's own
    thread and some time later, when the last one goes: without a server held open across
    the test, a leak count at its end sometimes still saw that pair (+2 descriptors, seen
    under load) and sometimes not.
    """
    held = grpc.aio.server()
    port = held.add_insecure_port("127.0.0.1:0")
    await held.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 10)
        yield
    finally:
        await held.stop(None)


@pytest.fixture
def info_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Log events at info level and up, whatever an earlier test configured."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(**saved)
