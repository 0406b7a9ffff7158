"""Connecting the CLI to a cluster: ZooKeeper session, ledgers root, ledger manager."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from auditor.errors import AuditorError, ConfigError
from auditor.metadata.layout import (
    DEFAULT_LEDGERS_ROOT,
    LayoutError,
    LedgerManager,
    parse_layout,
    parse_metadata_service_uri,
)
from auditor.zk import NoNodeError, ZkClient


class NoClusterError(AuditorError):
    """There is no BookKeeper cluster at the given ledgers root."""


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    hosts: str
    root: str
    manager: LedgerManager | None  # None: read it from LAYOUT
    timeout: float


def target_from_args(
    zk: str | None, ledgers_root: str | None, uri: str | None, timeout: float
) -> ClusterTarget:
    if timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {timeout:g}")
    if uri:
        parsed = parse_metadata_service_uri(uri)
        return ClusterTarget(
            parsed.hosts, ledgers_root or parsed.ledgers_root, parsed.manager, timeout
        )
    if not zk:
        raise ConfigError("give --zk HOST:PORT[,HOST:PORT...] or --metadata-service-uri")
    root = (ledgers_root or DEFAULT_LEDGERS_ROOT).rstrip("/")
    if not root.startswith("/"):
        raise ConfigError(f"--ledgers-root must be an absolute path, got {ledgers_root!r}")
    return ClusterTarget(zk, root, None, timeout)


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
    zk = ZkClient(target.hosts, timeout=target.timeout)
    await zk.start()
    try:
        manager = target.manager or await read_manager(zk, target.root)
        yield zk, manager
    finally:
        await zk.close()
