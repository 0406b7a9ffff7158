"""Connecting the CLI to a cluster: ZooKeeper session, ledgers root, ledger manager.

Credentials for a ZooKeeper that requires them come from `--zk-auth-file FILE`
or the environment variable BK_AUDITOR_ZK_AUTH, never from a flag's value:
command lines are visible to every user of the machine (`ps`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from auditor.errors import AuditorError, ConfigError
from auditor.metadata.layout import (
    DEFAULT_LEDGERS_ROOT,
    LayoutError,
    LedgerManager,
    parse_layout,
    parse_metadata_service_uri,
)
from auditor.zk import NoNodeError, ZkClient, ZkCredentials, ZkSecurity
from auditor.zk.security import parse_zk_auth, read_zk_auth_file

ZK_AUTH_ENV = "BK_AUDITOR_ZK_AUTH"
CLI_HINT = (
    f"give credentials with --zk-auth-file FILE or {ZK_AUTH_ENV}, "
    "e.g. digest:USER:PASSWORD or sasl:GSSAPI"
)


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


def security_from_args(
    auth_file: str | None, enable_security: bool, env: Mapping[str, str] = os.environ
) -> ZkSecurity:
    """`--zk-auth-file` over BK_AUDITOR_ZK_AUTH; with `zkEnableSecurity` one is required."""
    creds = ZkCredentials()
    if auth_file:
        creds = read_zk_auth_file(auth_file, f"--zk-auth-file {auth_file}")
    elif env.get(ZK_AUTH_ENV, "").strip():
        creds = parse_zk_auth(env[ZK_AUTH_ENV], f"environment {ZK_AUTH_ENV}")
    return ZkSecurity(creds, enable_security, hint=CLI_HINT)


def target_from_args(
    zk: str | None,
    ledgers_root: str | None,
    uri: str | None,
    timeout: float,
    security: ZkSecurity | None = None,
) -> ClusterTarget:
    if timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {timeout:g}")
    sec = security or ZkSecurity(hint=CLI_HINT)
    if uri:
        parsed = parse_metadata_service_uri(uri)
        return ClusterTarget(
            parsed.hosts, ledgers_root or parsed.ledgers_root, parsed.manager, timeout, sec
        )
    if not zk:
        raise ConfigError("give --zk HOST:PORT[,HOST:PORT...] or --metadata-service-uri")
    root = (ledgers_root or DEFAULT_LEDGERS_ROOT).rstrip("/")
    if not root.startswith("/"):
        raise ConfigError(f"--ledgers-root must be an absolute path, got {ledgers_root!r}")
    return ClusterTarget(zk, root, None, timeout, sec)


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
        manager = target.manager or await read_manager(zk, target.root)
        yield zk, manager
    finally:
        await zk.close()
