"""The CLI's flags for a cluster: `--zk`, `--metadata-service-uri`, `--ledgers-root`, credentials.

`--metadata-service-uri` takes what a Java node's `metadataServiceUri` says
(`auditor.metadata.service_uri`): BookKeeper's `zk+hierarchical://...` or Pulsar's
`metadata-store:zk:...`, whose driver decides the election the cluster runs.
`--ledgers-root`, when given, wins over the URI's root (for a `metadata-store:`
URI, whose root is always `/ledgers` under its chroot, it is a path under that
chroot too): a flag typed for this run says more than a copied config line.
Query parameters of a `metadata-store:` URI that mean nothing to us are named in
one note on stderr, so that a copied URI is not silently half-read.

Without `--zk` or `--metadata-service-uri`, the address comes from the environment
variable BK_AUDITOR_ZK (a connect string, or a metadata service URI), else from
`--bk-conf bk_server.conf`: its `metadataServiceUri`, else `zkServers` (with
`zkLedgersRootPath`), read exactly as the daemon reads it (`bk_conf_layer`, Pulsar's
`PULSAR_PREFIX_` variables applied). None of them: one line, exit 2.

Credentials for a ZooKeeper that requires them come from `--zk-auth-file FILE`
or the environment variable BK_AUDITOR_ZK_AUTH, never from a flag's value:
command lines are visible to every user of the machine (`ps`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditor.daemon.config.layers import bk_conf_layer
from auditor.daemon.config.zookeeper import cli_zk_tls
from auditor.errors import ConfigError
from auditor.metadata.cluster import ClusterTarget
from auditor.metadata.etcd_config import read_etcd_config
from auditor.metadata.layout import DEFAULT_LEDGERS_ROOT
from auditor.metadata.service_uri import (
    check_connect_string,
    describe_ignored,
    parse_metadata_service_uri,
)
from auditor.zk import ZkCredentials, ZkSecurity
from auditor.zk.security import parse_zk_auth, read_zk_auth_file

if TYPE_CHECKING:
    from auditor.config import AuditorConfig

ZK_AUTH_ENV = "BK_AUDITOR_ZK_AUTH"
#: The cluster's address when no flag gives it: a connect string or a metadata service URI.
ZK_ENV = "BK_AUDITOR_ZK"
NO_ADDRESS = (
    f"give --zk HOST:PORT[,HOST:PORT...] or --metadata-service-uri, set {ZK_ENV}, "
    "or give --bk-conf bk_server.conf"
)
CLI_HINT = (
    f"give credentials with --zk-auth-file FILE or {ZK_AUTH_ENV}, "
    "e.g. digest:USER:PASSWORD or sasl:GSSAPI"
)


def security_from_args(
    auth_file: str | None,
    enable_security: bool,
    env: Mapping[str, str] = os.environ,
    tls_config: str | None = None,
) -> ZkSecurity:
    """`--zk-auth-file` over BK_AUDITOR_ZK_AUTH; with `zkEnableSecurity` one is required.

    TLS from ZooKeeper's Java client properties: `-D` options in PULSAR_EXTRA_OPTS (and
    the like) < BK_AUDITOR_ZOOKEEPER_* < `--zk-tls-config FILE` (`cli_zk_tls`).
    """
    tls = cli_zk_tls(tls_config, env)
    if tls is not None and tls.ignored:
        print(f"bk-auditor: note: ignored: {', '.join(tls.ignored)}", file=sys.stderr)
    creds = ZkCredentials()
    if auth_file:
        creds = read_zk_auth_file(auth_file, f"--zk-auth-file {auth_file}")
    elif env.get(ZK_AUTH_ENV, "").strip():
        creds = parse_zk_auth(env[ZK_AUTH_ENV], f"environment {ZK_AUTH_ENV}")
    return ZkSecurity(creds, enable_security, hint=CLI_HINT, tls=tls)


def target_from_args(
    zk: str | None,
    ledgers_root: str | None,
    uri: str | None,
    timeout: float,
    security: ZkSecurity | None = None,
    uri_label: str = "--metadata-service-uri",
) -> ClusterTarget:
    if timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {timeout:g}")
    sec = security or ZkSecurity(hint=CLI_HINT)
    if uri:
        parsed = parse_metadata_service_uri(uri, label=uri_label)
        root = _root(ledgers_root) if ledgers_root else parsed.ledgers_root
        if parsed.ignored:
            print(f"bk-auditor: note: {describe_ignored(parsed.ignored)}", file=sys.stderr)
        etcd = read_etcd_config(parsed.etcd_config) if parsed.etcd_config else None
        if etcd is not None and etcd.ignored:
            print(
                f"bk-auditor: note: ignoring etcd configuration keys {', '.join(etcd.ignored)}",
                file=sys.stderr,
            )
        return ClusterTarget(
            parsed.hosts, root, parsed.manager, timeout, sec, parsed.driver, parsed.store, etcd
        )
    if not zk:
        raise ConfigError(NO_ADDRESS)
    zk = check_connect_string(zk, "--zk")
    return ClusterTarget(zk, _root(ledgers_root or DEFAULT_LEDGERS_ROOT), None, timeout, sec)


@dataclass(frozen=True)
class Address:
    """Where the cluster is, as the flags, BK_AUDITOR_ZK or bk_server.conf give it."""

    zk: str | None = None
    uri: str | None = None
    #: What the URI is called in messages.
    uri_label: str = "--metadata-service-uri"
    #: A ledgers root from bk_server.conf's `zkLedgersRootPath` (`--ledgers-root` wins).
    ledgers_root: str | None = None
    #: bk_server.conf's `zkEnableSecurity`.
    enable_security: bool = False


def _is_uri(text: str) -> bool:
    return "://" in text or text.startswith("metadata-store:")


def address_of(
    zk: str | None, uri: str | None, bk_conf: str | None, env: Mapping[str, str] = os.environ
) -> Address:
    """`--zk`/`--metadata-service-uri` > BK_AUDITOR_ZK > `--bk-conf`; none: ConfigError."""
    if zk or uri:
        return Address(zk, uri)
    from_env = env.get(ZK_ENV, "").strip()
    if from_env:
        if _is_uri(from_env):
            return Address(uri=from_env, uri_label=f"environment {ZK_ENV}")
        return Address(zk=from_env)
    if not bk_conf:
        raise ConfigError(NO_ADDRESS)
    layer, _ = bk_conf_layer(bk_conf, env)
    daemon, bk = layer["daemon"], layer["bookkeeper"]
    secure = bk.get("zkEnableSecurity")
    enable_security = secure is not None and str(secure.value).strip().lower() == "true"
    if "metadata_service_uri" in daemon:
        setting = daemon["metadata_service_uri"]
        return Address(
            uri=str(setting.value), uri_label=setting.origin, enable_security=enable_security
        )
    if "zk" not in daemon:
        raise ConfigError(f"--bk-conf {bk_conf} names neither metadataServiceUri nor zkServers")
    root = daemon.get("ledgers_root")
    return Address(
        zk=str(daemon["zk"].value),
        ledgers_root=None if root is None else str(root.value),
        enable_security=enable_security,
    )


def _root(ledgers_root: str) -> str:
    root = ledgers_root.rstrip("/")
    if not root.startswith("/"):
        raise ConfigError(f"--ledgers-root must be an absolute path, got {ledgers_root!r}")
    return root


def target_of_args(args: argparse.Namespace, config: AuditorConfig | None = None) -> ClusterTarget:
    """The cluster, with credentials; `--config`'s (or `--bk-conf`'s) zkEnableSecurity counts
    as the flag does."""
    address = address_of(args.zk, args.metadata_service_uri, getattr(args, "bk_conf", None))
    secure = (
        args.zk_enable_security
        or address.enable_security
        or (config is not None and config.bookkeeper.zkEnableSecurity)
    )
    security = security_from_args(args.zk_auth_file, secure, tls_config=args.zk_tls_config)
    target = target_from_args(
        address.zk,
        args.ledgers_root or address.ledgers_root,
        address.uri,
        args.timeout,
        security,
        address.uri_label,
    )
    refuse_writes_without_marks(target, args)
    return target


#: Commands that exist to change what BookKeeper's under-replication manager keeps.
_MARKING_COMMANDS = ("recover", "decommission")


def refuse_writes_without_marks(target: ClusterTarget, args: argparse.Namespace) -> None:
    """Refuses `--mark`, `recover` and `decommission` on a driver with no under-replication
    manager (BookKeeper's etcd driver): nothing there would ever act on a mark, and
    BookKeeper's own tools refuse the same (apache/bookkeeper#3441)."""
    if target.marks:
        return
    command = getattr(args, "command", None)
    what = "--mark" if getattr(args, "mark", False) else command
    if what == "--mark" or command in _MARKING_COMMANDS:
        raise ConfigError(
            f"{what}: BookKeeper's etcd driver (etcd://) has no under-replication manager "
            "(apache/bookkeeper#3441): there is nothing to mark and no worker to act on it; "
            "the checks report only"
        )
