"""`load_daemon_config`: the layers merged, every value validated, the rest derived.

Two rules make the daemon differ from a plain merge:

* BP-34's placement and replicas checks are on by default in the daemon
  (upstream ships them off). Only a key that no layer sets gets our interval;
  a 0 written anywhere, `bk_server.conf` included, still disables the check.
  The one-shot `check` command keeps BookKeeper's defaults (`load_config`).
* BookKeeper's `metadataServiceUri` beats `zkServers`/`zkLedgersRootPath`, as
  in BookKeeper; across layers the higher layer wins, and within one layer the
  URI wins. A Pulsar `metadata-store:` URI's `sessionTimeoutMillis` sets
  `daemon.zk_session_timeout` by the same rule (and beats `zkTimeout`, as in
  Pulsar); its driver and ledger manager hold whichever layer gives `zk`.

It is pure apart from reading the named files, so the daemon calls it again
on SIGHUP and compares with `DaemonConfig.changed`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from auditor.bookie.tls import bookie_tls
from auditor.checks.placement import policy_kind
from auditor.config import (
    AuditorConfig,
    BookKeeperConfig,
    Setting,
    build_section,
    field_names,
    unknown_key,
)
from auditor.daemon.config import zookeeper
from auditor.daemon.config.credentials import resolve_api, resolve_zk_security
from auditor.daemon.config.identity import HostFacts, resolve_identity
from auditor.daemon.config.layers import (
    Layer,
    bk_conf_layer,
    env_layer,
    merge,
    set_layer,
    toml_layer,
)
from auditor.daemon.config.resolved import DaemonConfig
from auditor.daemon.config.sections import (
    RULES,
    SCAN_RULES,
    SECTIONS,
    ApiConfig,
    DaemonSection,
    LoggingConfig,
    MetricsConfig,
    ScanSection,
    SelfTestSection,
)
from auditor.errors import ConfigError
from auditor.metadata.etcd_config import EtcdOptions, read_etcd_config
from auditor.metadata.service_uri import (
    MetadataDriver,
    MetadataServiceUri,
    check_connect_string,
    parse_metadata_service_uri,
)
from auditor.scan.options import parse_spark_conf
from auditor.store import StoreKind

#: Our intervals for the BP-34 checks when no layer sets them (seconds).
DAEMON_PLACEMENT_INTERVAL = 86400
DAEMON_REPLICAS_INTERVAL = 86400
_BP34_DEFAULTS = {
    "auditorPeriodicPlacementPolicyCheckInterval": DAEMON_PLACEMENT_INTERVAL,
    "auditorReplicasCheckInterval": DAEMON_REPLICAS_INTERVAL,
}

_SPARK_CONF_FORM = (
    "a table of spark.KEY = VALUE, or 'spark.KEY=VALUE;spark.KEY=VALUE' from --set or the "
    "environment"
)


@dataclass(frozen=True, slots=True)
class _ScanScalars:
    """`[scan]` less `spark_conf`, which `build_section`'s scalar coercion cannot hold."""

    master: str = ""
    partitions: int = 0


def _build_scan(values: Mapping[str, Setting]) -> ScanSection:
    for key, setting in values.items():
        if key not in field_names(ScanSection):
            raise unknown_key("scan", ScanSection, key, setting.origin)
    scalars = {k: v for k, v in values.items() if k != "spark_conf"}
    built = build_section("scan", _ScanScalars(), scalars, SCAN_RULES)
    conf: dict[str, str] = {}
    if "spark_conf" in values:
        setting = values["spark_conf"]
        conf = parse_spark_conf(
            setting.value, label="scan.spark_conf", form=_SPARK_CONF_FORM, origin=setting.origin
        )
    return ScanSection(master=built.master.strip(), partitions=built.partitions, spark_conf=conf)


def _require_engine(daemon: DaemonSection, origins: Mapping[str, str]) -> None:
    """Without PySpark a Spark daemon fails at start (a reload is refused), not at a check."""
    if daemon.engine != "spark":
        return
    from auditor.scan.engine import EngineOptions, EngineUnavailableError, require

    try:
        require(EngineOptions("spark"), parquet=False)
    except EngineUnavailableError as exc:
        where = origins.get("daemon.engine", "default")
        raise ConfigError(f"daemon.engine = 'spark' (from {where}): {exc}") from None


def _etcd_options(uri: MetadataServiceUri | None, origins: dict[str, str]) -> EtcdOptions | None:
    """Pulsar's etcd configuration file named by the URI's `configFilePath`, read."""
    if uri is None or uri.etcd_config is None:
        return None
    try:
        return read_etcd_config(uri.etcd_config)
    except ConfigError as exc:
        where = origins.get("daemon.metadata_service_uri", "default")
        raise ConfigError(f"daemon.metadata_service_uri: {exc} (from {where})") from None


def _resolve_cluster(
    daemon: DaemonSection, rank: Mapping[str, int], origins: dict[str, str]
) -> tuple[dict[str, Any], MetadataServiceUri | None]:
    """`zk`, `ledgers_root` (and a session timeout) from a metadata service URI where it
    ranks high enough; the parsed URI, if any."""
    changes: dict[str, Any] = {"zk": daemon.zk, "ledgers_root": daemon.ledgers_root}
    uri: MetadataServiceUri | None = None
    from_uri = False  # the URI's hosts, already checked by its parser
    if daemon.metadata_service_uri:
        where = origins["daemon.metadata_service_uri"]
        try:
            uri = parse_metadata_service_uri(daemon.metadata_service_uri)
        except ConfigError as exc:
            raise ConfigError(f"daemon.metadata_service_uri: {exc} (from {where})") from None
        uri_rank = rank["daemon.metadata_service_uri"]
        # The higher layer wins; within one layer the URI does, as in BookKeeper.
        if uri_rank >= rank.get("daemon.zk", -1):
            changes["zk"] = uri.hosts
            origins["daemon.zk"] = where
            from_uri = True
        if uri_rank >= rank.get("daemon.ledgers_root", -1):
            changes["ledgers_root"] = uri.ledgers_root
            origins["daemon.ledgers_root"] = where
        timeout_ms = uri.session_timeout_ms
        if timeout_ms is not None and uri_rank >= rank.get("daemon.zk_session_timeout", -1):
            changes["zk_session_timeout"] = timeout_ms / 1000.0
            origins["daemon.zk_session_timeout"] = where
    changes["zk"] = ",".join(h.strip() for h in str(changes["zk"]).split(",") if h.strip())
    if not changes["zk"]:
        raise ConfigError(
            "daemon.zk is not set: set daemon.zk or daemon.metadata_service_uri "
            "(BK_AUDITOR_DAEMON_ZK, or metadataServiceUri / zkServers in --bk-conf)"
        )
    if not from_uri:
        try:
            changes["zk"] = check_connect_string(changes["zk"], "daemon.zk")
        except ConfigError as exc:
            where = origins.get("daemon.zk", "default")
            raise ConfigError(f"{exc} (from {where})") from None
    changes["ledgers_root"] = str(changes["ledgers_root"]).rstrip("/") or "/"
    return changes, uri


def load_daemon_config(
    path: str | None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] = os.environ,
    bk_conf: str | None = None,
    *,
    hostname: str | None = None,
    host: HostFacts | None = None,
) -> DaemonConfig:
    """Merges the layers, validates every value, and fills in what is derived.

    Derived values: `daemon.zk_session_timeout` from a `metadata-store:` URI's
    `sessionTimeoutMillis`, else `bookkeeper.zkTimeout`; `daemon.zk`/`ledgers_root`,
    the ledger manager and the driver from a metadata service URI; `daemon.identity`
    by BookKeeper's rule when there is BookKeeper configuration (`--bk-conf`, or
    Pulsar's `PULSAR_PREFIX_` variables: what a Java AutoRecovery there would vote
    with; `host` answers its look-ups), else `<hostname>:<api.port>`.
    """
    layers: list[Layer] = []
    files: list[str] = []
    # bk_server.conf with Pulsar's variables, or those variables alone (None: neither).
    bk_layer, hints = bk_conf_layer(bk_conf, env)
    layers.append(bk_layer)
    if bk_conf is not None:
        files.append(str(bk_conf))
    if path is not None:
        layers.append(toml_layer(path))
        files.append(str(path))
    layers.append(env_layer(env))
    layers.append(set_layer([o for o in overrides if not zookeeper.is_override(o)]))
    merged, rank, origins = merge(layers)

    bk_values = merged["bookkeeper"]
    for key, default in _BP34_DEFAULTS.items():
        if key not in bk_values:
            bk_values[key] = Setting(default, "daemon default: BP-34 checks on")
            origins[f"bookkeeper.{key}"] = bk_values[key].origin

    built = {
        name: build_section(name, SECTIONS[name](), merged[name], RULES[name])
        for name in SECTIONS
        if name != "scan"
    }
    scan = _build_scan(merged["scan"])
    bk: BookKeeperConfig = built["bookkeeper"]
    api: ApiConfig = resolve_api(built["api"], origins)
    metrics: MetricsConfig = built["metrics"]
    log_cfg: LoggingConfig = built["logging"]
    log_cfg = LoggingConfig(format=log_cfg.format.lower(), level=log_cfg.level.lower())

    daemon: DaemonSection = built["daemon"]
    changes, uri = _resolve_cluster(daemon, rank, origins)
    if "zk_session_timeout" not in changes and "zk_session_timeout" not in merged["daemon"]:
        changes["zk_session_timeout"] = bk.zkTimeout / 1000.0
        origins["daemon.zk_session_timeout"] = origins.get("bookkeeper.zkTimeout", "default")
    explicit = daemon.identity if "identity" in merged["daemon"] else None
    changes["identity"] = resolve_identity(explicit, origins, hints, api.port, hostname, host)
    daemon = replace(daemon, **changes)
    _require_engine(daemon, origins)
    zk_security = resolve_zk_security(daemon, bk, origins)
    zk_tls = zookeeper.resolve_zk_tls(path, overrides, env, bk_conf)
    if zk_tls is not None:
        zk_security = replace(zk_security, tls=zk_tls)
    try:
        bookie_tls(bk)  # unusable TLS files refuse the start (or the reload), naming the key
    except ConfigError as exc:
        where = origins.get("bookkeeper.tlsProviderFactoryClass", "default")
        raise ConfigError(f"{exc} (bookie TLS on: tlsProviderFactoryClass from {where})") from None

    selftest: SelfTestSection = built["selftest"]
    selftest = replace(selftest, canary_root=selftest.canary_root.rstrip("/"))
    if selftest.canary:
        from auditor.selftest.canary import validate_canary_root

        validate_canary_root(selftest.canary_root, daemon.ledgers_root)

    if metrics.enabled and metrics.port and metrics.port == api.port:
        raise ConfigError(
            f"metrics.port {metrics.port} is also api.port; give the metrics their own port"
        )
    if bk.auditorPeriodicPlacementPolicyCheckInterval > 0:
        # Fail at start-up, not at the first placement run a day later.
        try:
            policy_kind(bk.ensemblePlacementPolicy)
        except ConfigError as exc:
            where = origins.get("bookkeeper.ensemblePlacementPolicy", "default")
            raise ConfigError(f"{exc} (from {where})") from None

    return DaemonConfig(
        auditor=AuditorConfig(bookkeeper=bk, checks=built["checks"], scrub=built["scrub"]),
        daemon=daemon,
        api=api,
        metrics=metrics,
        logging=log_cfg,
        scan=scan,
        selftest=selftest,
        risk=built["risk"],
        worker=built["worker"],
        pulsar=built["pulsar"],
        ledger_manager=uri.manager if uri is not None else None,
        metadata_driver=uri.driver if uri is not None else MetadataDriver.BOOKKEEPER,
        metadata_store=uri.store if uri is not None else StoreKind.ZOOKEEPER,
        etcd=_etcd_options(uri, origins),
        uri_ignored=uri.ignored if uri is not None else (),
        origins=origins,
        files=tuple(files),
        zk_security=zk_security,
    )
