"""The daemon's configuration: four layers over the checks' own, each value remembering its origin.

Precedence, lowest first: built-in defaults < `--bk-conf bk_server.conf` <
the TOML file < environment `BK_AUDITOR_<SECTION>_<KEY>` < `--set
SECTION.KEY=VALUE`. The bookie's own `bk_server.conf` can therefore be the
whole configuration of a daemon running beside it, and a container can be
configured by environment alone.

Two rules make the daemon differ from a plain merge:

* BP-34's placement and replicas checks are on by default in the daemon
  (upstream ships them off). Only a key that no layer sets gets our interval;
  a 0 written anywhere, `bk_server.conf` included, still disables the check.
  The one-shot `check` command keeps BookKeeper's defaults (`load_config`).
* BookKeeper's `metadataServiceUri` beats `zkServers`/`zkLedgersRootPath`, as
  in BookKeeper; across layers the higher layer wins, and within one layer the
  URI wins.

`load_daemon_config` is pure apart from reading the named files, so the daemon
calls it again on SIGHUP and compares with `DaemonConfig.changed`.

`[scan]` configures the Spark job the leader runs its placement and replicas
checks through when `daemon.engine = "spark"` (`auditor.daemon.scan_driver`);
PySpark must then be importable, which is checked here, at start and on reload.
"""

from __future__ import annotations

import logging as stdlib_logging
import os
import re
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from auditor.bookie.tls import bookie_tls
from auditor.checks.findings import Check
from auditor.checks.placement import policy_kind
from auditor.config import (
    BK_RULES,
    CHECKS_RULES,
    TOML_TABLES,
    AuditorConfig,
    BookKeeperConfig,
    ChecksConfig,
    Rules,
    Setting,
    brief_repr,
    build_section,
    field_names,
    match_key,
    parse_override,
    property_lines,
    read_toml,
)
from auditor.errors import ConfigError
from auditor.metadata.layout import DEFAULT_LEDGERS_ROOT, LedgerManager, parse_metadata_service_uri
from auditor.zk.security import ZkCredentials, ZkSecurity, parse_zk_auth, read_zk_auth_file

DEFAULT_API_PORT = 9876
DEFAULT_METRICS_PORT = 9877
#: BookKeeper's default bookie port, for an identity derived from bk_server.conf.
DEFAULT_BOOKIE_PORT = 3181
#: Our intervals for the BP-34 checks when no layer sets them (seconds).
DAEMON_PLACEMENT_INTERVAL = 86400
DAEMON_REPLICAS_INTERVAL = 86400
_BP34_DEFAULTS = {
    "auditorPeriodicPlacementPolicyCheckInterval": DAEMON_PLACEMENT_INTERVAL,
    "auditorReplicasCheckInterval": DAEMON_REPLICAS_INTERVAL,
}

ENV_PREFIX = "BK_AUDITOR_"
#: Variables of the admin CLI (`bk-auditor status` and friends) that look like ours.
CLIENT_ONLY_ENV = frozenset({"BK_AUDITOR_API_TARGET"})
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
ENGINES = ("asyncio", "spark")

#: Spark's own default `spark.redaction.regex`: settings whose values the logs must not show.
SPARK_SECRET = re.compile(r"(?i)secret|password|token|access[.]key")
#: A Spark setting's key, as `--spark-conf` and Spark's own `--conf` take it.
SPARK_KEY = re.compile(r"spark\.\S+")

#: BookKeeper's BookieId rule (`[a-zA-Z0-9:-_.\-]+`, where `:-_` is a range), and not "readonly".
BOOKIE_ID = re.compile(r"[a-zA-Z0-9:-_.\-]+")


@dataclass(frozen=True, slots=True)
class DaemonSection:
    #: The id written into the election vote; BookKeeper's `whoisauditor` prints it.
    identity: str = ""
    #: ZooKeeper connect string (kazoo form: `h1:2181,h2:2181[/chroot]`).
    zk: str = ""
    #: BookKeeper's `metadataServiceUri`; when set it supplies `zk` and `ledgers_root`.
    metadata_service_uri: str = ""
    ledgers_root: str = DEFAULT_LEDGERS_ROOT
    #: Seconds; defaults to `bookkeeper.zkTimeout`.
    zk_session_timeout: float = 10.0
    #: ZooKeeper credentials (`digest:USER:PASSWORD`, `sasl:GSSAPI[:...]`), or a file of them.
    zk_auth: str = field(default="", repr=False)
    zk_auth_file: str = ""
    #: Each scheduled run moves by up to this fraction of its interval.
    jitter: float = 0.1
    #: Keep every ledger's metadata in memory on the leader, current through a
    #: persistent watch, so checks after the first read no ledger from ZooKeeper.
    metadata_index: bool = True
    #: Seconds SIGTERM may take to hand over leadership and stop.
    shutdown_timeout: float = 10.0
    #: Where the placement and replicas checks run: on the leader's loop, or a Spark job.
    engine: str = "asyncio"


@dataclass(frozen=True, slots=True)
class ApiConfig:
    host: str = "0.0.0.0"
    port: int = DEFAULT_API_PORT
    tls_cert: str = ""
    tls_key: str = ""
    #: With a client CA, clients must present a certificate it signed (mTLS).
    tls_client_ca: str = ""
    #: Bearer token for mutating calls; after loading it also holds `token_file`'s content.
    token: str = field(default="", repr=False)
    token_file: str = ""
    #: Reads (status, reports, violations, marks) need the token or a client
    #: certificate too; health checks and reflection never do.
    protect_reads: bool = False

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def mtls(self) -> bool:
        return bool(self.tls_cert and self.tls_client_ca)


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    enabled: bool = True
    host: str = "0.0.0.0"
    port: int = DEFAULT_METRICS_PORT


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    #: "auto": console on a TTY, JSON lines otherwise.
    format: str = "auto"
    level: str = "info"

    @property
    def level_no(self) -> int:
        return int(getattr(stdlib_logging, self.level.upper()))


@dataclass(frozen=True, slots=True)
class ScanSection:
    """The Spark job of `daemon.engine = "spark"` (unused with the asyncio engine)."""

    #: Spark master URL; empty: `local[*]` (or what `spark-submit` gave).
    master: str = ""
    #: Id ranges per check run; 0: the engine's default (two per Spark core).
    partitions: int = 0
    #: Extra Spark settings, `spark.*` keys only. A higher layer replaces the whole table.
    spark_conf: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SelfTestSection:
    """The leader's detector self-test (`auditor.selftest.harness`) and end-to-end canary."""

    enabled: bool = True
    #: Seconds between self-tests; one also runs when a node becomes the leader.
    interval: float = 3600.0
    #: Keep synthetic defective ledgers under `canary_root` and run the real replicas
    #: and placement drivers over them (writes to ZooKeeper; a few bookie requests).
    canary: bool = False
    canary_root: str = "/bk-auditor-canary/ledgers"

    @property
    def period(self) -> float:
        """Seconds between self-tests the leader runs; 0 when they are off."""
        return self.interval if self.enabled else 0.0


@dataclass(frozen=True, slots=True)
class RiskSection:
    """The leader's periodic risk report (`auditor.analysis.risk`)."""

    #: Seconds between risk reports (the first when a node becomes the leader); 0: off.
    interval: float = 3600.0
    #: Domains per kind (bookie, rack, region) published in `ledgers_at_risk`.
    top: int = 10


SECTIONS: dict[str, type] = {
    "bookkeeper": BookKeeperConfig,
    "checks": ChecksConfig,
    "daemon": DaemonSection,
    "api": ApiConfig,
    "metrics": MetricsConfig,
    "logging": LoggingConfig,
    "scan": ScanSection,
    "selftest": SelfTestSection,
    "risk": RiskSection,
}
# The one-shot commands read the shared tables of the same file; `[scan]` is the daemon's.
assert set(TOML_TABLES) <= set(SECTIONS)


def _port(v: int) -> bool:
    return 0 <= v <= 65535


def _nonempty(v: str) -> bool:
    return bool(v.strip())


_DAEMON_RULES: Rules = {
    "zk_session_timeout": (lambda v: v > 0, "positive seconds"),
    "jitter": (lambda v: 0 <= v < 1, "a fraction 0 <= jitter < 1"),
    "shutdown_timeout": (lambda v: v > 0, "positive seconds"),
    "engine": (lambda v: v in ENGINES, " or ".join(repr(e) for e in ENGINES)),
    "ledgers_root": (lambda v: v.startswith("/"), "an absolute znode path"),
}
_API_RULES: Rules = {
    "host": (_nonempty, "a host name or address"),
    "port": (_port, "a port 0..65535 (0: any free port)"),
}
_METRICS_RULES: Rules = _API_RULES
_LOGGING_RULES: Rules = {
    "format": (lambda v: v.lower() in LOG_FORMATS, " | ".join(LOG_FORMATS)),
    "level": (lambda v: v.lower() in LOG_LEVELS, " | ".join(LOG_LEVELS)),
}
_SCAN_RULES: Rules = {
    "partitions": (lambda v: v >= 0, "a count >= 0 (0: the engine's default)"),
}
_SELFTEST_RULES: Rules = {
    "interval": (lambda v: v > 0, "positive seconds"),
    "canary_root": (lambda v: v.startswith("/") and v.rstrip("/") != "", "an absolute znode path"),
}
_RISK_RULES: Rules = {
    "interval": (lambda v: v >= 0, "seconds >= 0 (0: off)"),
    "top": (lambda v: v >= 1, "a count >= 1"),
}
_RULES: dict[str, Rules] = {
    "bookkeeper": BK_RULES,
    "checks": CHECKS_RULES,
    "daemon": _DAEMON_RULES,
    "api": _API_RULES,
    "metrics": _METRICS_RULES,
    "logging": _LOGGING_RULES,
    "scan": _SCAN_RULES,
    "selftest": _SELFTEST_RULES,
    "risk": _RISK_RULES,
}


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    auditor: AuditorConfig = field(default_factory=AuditorConfig)
    daemon: DaemonSection = field(default_factory=DaemonSection)
    api: ApiConfig = field(default_factory=ApiConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    scan: ScanSection = field(default_factory=ScanSection)
    selftest: SelfTestSection = field(default_factory=SelfTestSection)
    risk: RiskSection = field(default_factory=RiskSection)
    #: From `metadataServiceUri` (`zk+hierarchical://...`); None: read the LAYOUT znode.
    ledger_manager: LedgerManager | None = None
    #: "section.key" -> where its value came from, for every key some layer set.
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)
    #: The files read, lowest precedence first.
    files: tuple[str, ...] = field(default=(), compare=False)
    #: From `daemon.zk_auth[_file]` and `bookkeeper.zkEnableSecurity` (those keys compare).
    zk_security: ZkSecurity = field(default_factory=ZkSecurity, compare=False, repr=False)

    @property
    def bookkeeper(self) -> BookKeeperConfig:
        return self.auditor.bookkeeper

    @property
    def checks(self) -> ChecksConfig:
        return self.auditor.checks

    def interval(self, check: Check) -> int:
        """The configured period of `check` in seconds, with BookKeeper's meaning of 0.

        bookies: 0 means once when a leader starts; ledgers, placement and
        replicas: <= 0 means never; grace runs with placement (as upstream) and
        only while `underreplicatedLedgerRecoveryGracePeriod` > 0.
        """
        bk = self.bookkeeper
        if check is Check.BOOKIES:
            return bk.auditorPeriodicBookieCheckInterval
        if check is Check.LEDGERS:
            return max(bk.auditorPeriodicCheckInterval, 0)
        if check is Check.PLACEMENT:
            return max(bk.auditorPeriodicPlacementPolicyCheckInterval, 0)
        if check is Check.REPLICAS:
            return max(bk.auditorReplicasCheckInterval, 0)
        if bk.underreplicatedLedgerRecoveryGracePeriod <= 0:
            return 0
        return max(bk.auditorPeriodicPlacementPolicyCheckInterval, 0)

    def origin(self, key: str) -> str:
        """Where "section.key" came from: a file (and line), a variable, --set, or "default"."""
        return self.origins.get(key, "default")

    def _sections(self) -> dict[str, Any]:
        return {
            "bookkeeper": self.auditor.bookkeeper,
            "checks": self.auditor.checks,
            "daemon": self.daemon,
            "api": self.api,
            "metrics": self.metrics,
            "logging": self.logging,
            "scan": self.scan,
            "selftest": self.selftest,
            "risk": self.risk,
        }

    def changed(self, other: DaemonConfig) -> list[str]:
        """The "section.key"s whose values differ: what a SIGHUP reload changes."""
        out: list[str] = []
        mine, theirs = self._sections(), other._sections()
        for name, section in mine.items():
            for f in fields(section):
                if getattr(section, f.name) != getattr(theirs[name], f.name):
                    out.append(f"{name}.{f.name}")
        if self.ledger_manager != other.ledger_manager:
            out.append("daemon.metadata_service_uri")
        return sorted(set(out))

    def describe(self) -> dict[str, dict[str, Any]]:
        """Every value by section, secrets masked: for the startup and reload log lines."""
        out: dict[str, dict[str, Any]] = {}
        for name, section in self._sections().items():
            values = {f.name: getattr(section, f.name) for f in fields(section)}
            if name == "api" and values["token"]:
                values["token"] = "***"
            if name == "daemon" and values["zk_auth"]:
                values["zk_auth"] = "***"
            if name == "scan":
                values["spark_conf"] = {
                    k: "***" if SPARK_SECRET.search(k) else v
                    for k, v in values["spark_conf"].items()
                }
            out[name] = values
        return out


# --- layers -----------------------------------------------------------------------

_Layer = dict[str, dict[str, Setting]]


def _empty_layer() -> _Layer:
    return {name: {} for name in SECTIONS}


@dataclass(frozen=True, slots=True)
class _BookieHints:
    """What bk_server.conf says about the bookie this daemon runs beside."""

    bookie_id: str = ""
    advertised_address: str = ""
    port: int = DEFAULT_BOOKIE_PORT


def _bk_conf_layer(path: str) -> tuple[_Layer, _BookieHints]:
    """The keys of BookKeeper's server config we honour, under our names; the rest is ignored.

    An empty value (`key=`) counts as unset, as templates are full of them.
    A repeated key keeps its last value.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError as exc:
        raise ConfigError(f"--bk-conf {p} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read --bk-conf {p}: {exc}") from exc
    props: dict[str, tuple[str, str]] = {}
    for lineno, key, value in property_lines(text):
        if value.strip():
            props[key] = (value.strip(), f"{p}:{lineno} {key}")
        else:
            props.pop(key, None)
    layer = _empty_layer()
    bk_keys = set(field_names(BookKeeperConfig))
    for key, (value, origin) in props.items():
        if key in bk_keys:
            layer["bookkeeper"][key] = Setting(value, origin)
    daemon = layer["daemon"]
    if "metadataServiceUri" in props:
        value, origin = props["metadataServiceUri"]
        daemon["metadata_service_uri"] = Setting(value, origin)
    else:
        if "zkServers" in props:
            value, origin = props["zkServers"]
            # Commons Configuration reads a comma list; put it back together.
            daemon["zk"] = Setting(",".join(h.strip() for h in value.split(",")), origin)
        if "zkLedgersRootPath" in props:
            daemon["ledgers_root"] = Setting(*props["zkLedgersRootPath"])
    port = DEFAULT_BOOKIE_PORT
    if "bookiePort" in props:
        value, origin = props["bookiePort"]
        try:
            port = int(value)
        except ValueError:
            port = -1
        if not 0 < port < 65536:
            raise ConfigError(f"bookiePort must be a port 1..65535, got {value!r} (from {origin})")
    hints = _BookieHints(
        bookie_id=props.get("bookieId", ("", ""))[0],
        advertised_address=props.get("advertisedAddress", ("", ""))[0],
        port=port,
    )
    return layer, hints


def _toml_layer(path: str) -> _Layer:
    data = read_toml(path)
    layer = _empty_layer()
    for table, values in data.items():
        if table not in SECTIONS:
            raise ConfigError(f"unknown config table [{table}] (in {path})")
        if not isinstance(values, dict):
            raise ConfigError(f"{table} must be a table, got {brief_repr(values)} (in {path})")
        for key, value in values.items():
            layer[table][key] = Setting(value, str(path))
    return layer


def _env_layer(env: Mapping[str, str]) -> _Layer:
    """`BK_AUDITOR_<SECTION>_<KEY>`, the key matched ignoring case and underscores.

    Variables whose second word is no section (BK_AUDITOR_DEBUG) and the admin
    CLI's BK_AUDITOR_API_TARGET are not configuration; a known section with an
    unknown key is an error, so a typo does not silently leave a default in
    place. (BK_AUDITOR_API_TOKEN means the same token to the CLI and the daemon.)
    """
    layer = _empty_layer()
    seen: dict[tuple[str, str], str] = {}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in CLIENT_ONLY_ENV:
            continue
        section, _, key = name[len(ENV_PREFIX) :].partition("_")
        section = section.lower()
        if section not in SECTIONS or not key:
            continue
        target = match_key(SECTIONS[section], key)
        if target is None:
            raise ConfigError(f"environment variable {name} names no key of [{section}]")
        if (section, target) in seen:
            raise ConfigError(
                f"environment variables {seen[section, target]} and {name} "
                f"both set {section}.{target}"
            )
        seen[section, target] = name
        layer[section][target] = Setting(env[name], f"environment {name}")
    return layer


def _set_layer(overrides: Sequence[str]) -> _Layer:
    """`--set SECTION.KEY=VALUE`; a bare key is a BookKeeper key, as for `check`."""
    layer = _empty_layer()
    for item in overrides:
        table, name, value = parse_override(item, SECTIONS)
        layer[table][name] = Setting(value, "--set")
    return layer


# --- resolution -------------------------------------------------------------------


def _check_file(key: str, path: str, origin: str) -> None:
    if path and not Path(path).is_file():
        raise ConfigError(f"{key}: no such file {path}" + (f" (from {origin})" if origin else ""))


def _resolve_api(api: ApiConfig, origins: Mapping[str, str]) -> ApiConfig:
    def at(key: str) -> str:
        return origins.get(f"api.{key}", "")

    for key in ("tls_cert", "tls_key", "tls_client_ca"):
        _check_file(f"api.{key}", getattr(api, key), at(key))
    if bool(api.tls_cert) != bool(api.tls_key):
        raise ConfigError("api.tls_cert and api.tls_key must be set together")
    if api.tls_client_ca and not api.tls_cert:
        raise ConfigError("api.tls_client_ca needs api.tls_cert and api.tls_key (mTLS is TLS)")
    if api.protect_reads and not (api.token or api.token_file or api.tls_client_ca):
        raise ConfigError(
            "api.protect_reads needs a credential to check: api.token, api.token_file "
            "or api.tls_client_ca"
        )
    if not api.token_file:
        return api
    if api.token:
        raise ConfigError("api.token and api.token_file are both set; set one")
    _check_file("api.token_file", api.token_file, at("token_file"))
    try:
        token = Path(api.token_file).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"api.token_file {api.token_file} cannot be read: {exc}") from exc
    if not token:
        raise ConfigError(f"api.token_file {api.token_file} is empty")
    return replace(api, token=token)


_SPARK_CONF_FORM = (
    "a table of spark.KEY = VALUE, or 'spark.KEY=VALUE;spark.KEY=VALUE' from --set or the "
    "environment"
)


def _flatten(table: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """TOML reads an unquoted `spark.executor.memory = "2g"` as nested tables; undo that.

    Iterative, in the tables' order: dotted keys nest without limit.
    """
    stack: list[Iterator[tuple[str, Any]]] = [iter(table.items())]
    prefixes = [""]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
            prefixes.pop()
            continue
        name = prefixes[-1] + item[0]
        if isinstance(item[1], dict):
            stack.append(iter(item[1].items()))
            prefixes.append(f"{name}.")
        else:
            yield name, item[1]


def _spark_value(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return None


def parse_spark_conf(setting: Setting) -> dict[str, str]:
    """`scan.spark_conf` from a TOML table or from text, every key a `spark.*` one.

    In text (`--set`, environment) settings are separated by `;`, since values
    such as `spark.jars` hold commas; each is split at its first `=`.
    """
    where = f" (from {setting.origin})" if setting.origin else ""
    pairs: list[tuple[str, Any]]
    if isinstance(setting.value, dict):
        pairs = list(_flatten(setting.value))
    elif isinstance(setting.value, str):
        pairs = []
        for item in setting.value.split(";"):
            if not item.strip():
                continue
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(
                    f"scan.spark_conf must be {_SPARK_CONF_FORM}, got {item.strip()!r}{where}"
                )
            pairs.append((key.strip(), value.strip()))
    else:
        raise ConfigError(
            f"scan.spark_conf must be {_SPARK_CONF_FORM}, got {brief_repr(setting.value)}{where}"
        )
    conf: dict[str, str] = {}
    for key, value in pairs:
        if not SPARK_KEY.fullmatch(key):
            raise ConfigError(f"scan.spark_conf: {key!r} is not a Spark setting (spark.KEY){where}")
        text = _spark_value(value)
        if text is None:
            raise ConfigError(
                f"scan.spark_conf: {key} must be a string, number or boolean, "
                f"got {brief_repr(value)}{where}"
            )
        conf[key] = text
    return conf


@dataclass(frozen=True, slots=True)
class _ScanScalars:
    """`[scan]` less `spark_conf`, which `build_section`'s scalar coercion cannot hold."""

    master: str = ""
    partitions: int = 0


def _build_scan(values: Mapping[str, Setting]) -> ScanSection:
    for key, setting in values.items():
        if key not in field_names(ScanSection):
            hint = match_key(ScanSection, key)
            did_you_mean = f" (did you mean scan.{hint}?)" if hint else ""
            where = f" (from {setting.origin})" if setting.origin else ""
            raise ConfigError(f"unknown key scan.{key}{did_you_mean}{where}")
    scalars = {k: v for k, v in values.items() if k != "spark_conf"}
    built = build_section("scan", _ScanScalars(), scalars, _SCAN_RULES)
    conf = parse_spark_conf(values["spark_conf"]) if "spark_conf" in values else {}
    return ScanSection(master=built.master.strip(), partitions=built.partitions, spark_conf=conf)


DAEMON_ZK_HINT = (
    "set daemon.zk_auth_file to a file holding them, or daemon.zk_auth "
    "(BK_AUDITOR_DAEMON_ZK_AUTH), e.g. digest:USER:PASSWORD or sasl:GSSAPI"
)


def _resolve_zk_security(
    daemon: DaemonSection, bk: BookKeeperConfig, origins: Mapping[str, str]
) -> ZkSecurity:
    """The daemon's ZooKeeper credentials and ACL policy, refused at start when unusable."""
    creds = ZkCredentials()
    if daemon.zk_auth and daemon.zk_auth_file:
        raise ConfigError("daemon.zk_auth and daemon.zk_auth_file are both set; set one")
    if daemon.zk_auth_file:
        where = origins.get("daemon.zk_auth_file", "")
        _check_file("daemon.zk_auth_file", daemon.zk_auth_file, where)
        creds = read_zk_auth_file(daemon.zk_auth_file, f"daemon.zk_auth_file {daemon.zk_auth_file}")
    elif daemon.zk_auth.strip():
        where = origins.get("daemon.zk_auth", "")
        creds = parse_zk_auth(
            daemon.zk_auth, "daemon.zk_auth" + (f" from {where}" if where else "")
        )
    try:
        return ZkSecurity(creds, bk.zkEnableSecurity, hint=DAEMON_ZK_HINT)
    except ConfigError as exc:
        where = origins.get("bookkeeper.zkEnableSecurity", "default")
        raise ConfigError(f"{exc} (zkEnableSecurity from {where})") from None


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


def validate_identity(identity: str, origin: str = "") -> str:
    """BookKeeper accepts this as a BookieId (the vote's `bookieId`), or ConfigError."""
    where = f" (from {origin})" if origin else ""
    if not BOOKIE_ID.fullmatch(identity):
        raise ConfigError(
            f"daemon.identity {identity!r} is not a valid BookKeeper bookie id "
            f"(letters, digits and .-:;<=>?@[]^_ only){where}"
        )
    if identity.lower() == "readonly":
        raise ConfigError(f"daemon.identity cannot be 'readonly' (BookKeeper reserves it){where}")
    return identity


def _merge(layers: Sequence[_Layer]) -> tuple[_Layer, dict[str, int], dict[str, str]]:
    """The layers folded, later over earlier; each key's layer index and origin."""
    merged = _empty_layer()
    rank: dict[str, int] = {}
    origins: dict[str, str] = {}
    for i, layer in enumerate(layers):
        for section, values in layer.items():
            for key, setting in values.items():
                merged[section][key] = setting
                rank[f"{section}.{key}"] = i
                origins[f"{section}.{key}"] = setting.origin
    return merged, rank, origins


def _resolve_cluster(
    daemon: DaemonSection, rank: Mapping[str, int], origins: dict[str, str]
) -> tuple[dict[str, Any], LedgerManager | None]:
    """`zk` and `ledgers_root`, from a metadata service URI where it ranks high enough."""
    changes: dict[str, Any] = {"zk": daemon.zk, "ledgers_root": daemon.ledgers_root}
    manager: LedgerManager | None = None
    if daemon.metadata_service_uri:
        where = origins["daemon.metadata_service_uri"]
        try:
            uri = parse_metadata_service_uri(daemon.metadata_service_uri)
        except ConfigError as exc:
            raise ConfigError(f"daemon.metadata_service_uri: {exc} (from {where})") from None
        manager = uri.manager
        uri_rank = rank["daemon.metadata_service_uri"]
        # The higher layer wins; within one layer the URI does, as in BookKeeper.
        if uri_rank >= rank.get("daemon.zk", -1):
            changes["zk"] = uri.hosts
            origins["daemon.zk"] = where
        if uri_rank >= rank.get("daemon.ledgers_root", -1):
            changes["ledgers_root"] = uri.ledgers_root
            origins["daemon.ledgers_root"] = where
    changes["zk"] = ",".join(h.strip() for h in str(changes["zk"]).split(",") if h.strip())
    if not changes["zk"]:
        raise ConfigError(
            "daemon.zk is not set: set daemon.zk or daemon.metadata_service_uri "
            "(BK_AUDITOR_DAEMON_ZK, or metadataServiceUri / zkServers in --bk-conf)"
        )
    changes["ledgers_root"] = str(changes["ledgers_root"]).rstrip("/") or "/"
    return changes, manager


def _resolve_identity(
    daemon: DaemonSection,
    explicit: bool,
    origins: dict[str, str],
    hints: _BookieHints | None,
    bk_conf: str | None,
    api_port: int,
    hostname: str | None,
) -> str:
    if explicit:
        identity, origin = daemon.identity, origins["daemon.identity"]
    elif hints is not None and hints.bookie_id:
        identity, origin = hints.bookie_id, f"bookieId in {bk_conf}"
    elif hints is not None:
        host = hints.advertised_address or hostname or socket.gethostname()
        identity, origin = f"{host}:{hints.port}", f"advertisedAddress/bookiePort in {bk_conf}"
    else:
        identity = f"{hostname or socket.gethostname()}:{api_port}"
        origin = "derived from the host name and api.port"
    origins["daemon.identity"] = origin
    return validate_identity(identity, origin)


def load_daemon_config(
    path: str | None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] = os.environ,
    bk_conf: str | None = None,
    *,
    hostname: str | None = None,
) -> DaemonConfig:
    """Merges the layers, validates every value, and fills in what is derived.

    Derived values: `daemon.zk_session_timeout` from `bookkeeper.zkTimeout`;
    `daemon.zk`/`ledgers_root` from a metadata service URI; `daemon.identity`
    from bk_server.conf's `bookieId`, else `advertisedAddress` (or this host's
    name) with `bookiePort` (what a Java AutoRecovery beside that bookie would
    vote with), else `<hostname>:<api.port>`.
    """
    layers: list[_Layer] = []
    files: list[str] = []
    hints: _BookieHints | None = None
    if bk_conf is not None:
        bk_layer, hints = _bk_conf_layer(bk_conf)
        layers.append(bk_layer)
        files.append(str(bk_conf))
    if path is not None:
        layers.append(_toml_layer(path))
        files.append(str(path))
    layers.append(_env_layer(env))
    layers.append(_set_layer(overrides))
    merged, rank, origins = _merge(layers)

    bk_values = merged["bookkeeper"]
    for key, default in _BP34_DEFAULTS.items():
        if key not in bk_values:
            bk_values[key] = Setting(default, "daemon default: BP-34 checks on")
            origins[f"bookkeeper.{key}"] = bk_values[key].origin

    built = {
        name: build_section(name, SECTIONS[name](), merged[name], _RULES[name])
        for name in SECTIONS
        if name != "scan"
    }
    scan = _build_scan(merged["scan"])
    bk: BookKeeperConfig = built["bookkeeper"]
    api: ApiConfig = _resolve_api(built["api"], origins)
    metrics: MetricsConfig = built["metrics"]
    log_cfg: LoggingConfig = built["logging"]
    log_cfg = LoggingConfig(format=log_cfg.format.lower(), level=log_cfg.level.lower())

    daemon: DaemonSection = built["daemon"]
    changes, manager = _resolve_cluster(daemon, rank, origins)
    if "zk_session_timeout" not in merged["daemon"]:
        changes["zk_session_timeout"] = bk.zkTimeout / 1000.0
        origins["daemon.zk_session_timeout"] = origins.get("bookkeeper.zkTimeout", "default")
    changes["identity"] = _resolve_identity(
        daemon, "identity" in merged["daemon"], origins, hints, bk_conf, api.port, hostname
    )
    daemon = replace(daemon, **changes)
    _require_engine(daemon, origins)
    zk_security = _resolve_zk_security(daemon, bk, origins)
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
        auditor=AuditorConfig(bookkeeper=bk, checks=built["checks"]),
        daemon=daemon,
        api=api,
        metrics=metrics,
        logging=log_cfg,
        scan=scan,
        selftest=selftest,
        risk=built["risk"],
        ledger_manager=manager,
        origins=origins,
        files=tuple(files),
        zk_security=zk_security,
    )
