"""The daemon's tables beyond the checks' own: `[daemon]`, `[api]`, `[metrics]`, `[logging]`,
`[scan]`, `[selftest]`, `[risk]`, `[worker]` and `[pulsar]`, each with its defaults and the
rules of its keys.

`SECTIONS` names every table a layer may set, the checks' two included, and
`RULES` their validations; the loader (`auditor.daemon.config.load`) builds
each table through `auditor.config.build_section`, so a bad value is refused
naming `section.key` and where it came from.
"""

from __future__ import annotations

import logging as stdlib_logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from auditor.config import (
    BK_RULES,
    CHECKS_RULES,
    SCRUB_RULES,
    TOML_TABLES,
    BookKeeperConfig,
    ChecksConfig,
    Rules,
    ScrubConfig,
)
from auditor.metadata.layout import DEFAULT_LEDGERS_ROOT
from auditor.scan.options import ENGINES

DEFAULT_API_PORT = 9876
DEFAULT_METRICS_PORT = 9877
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


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
    #: Followers keep the metadata index too (from their first ZooKeeper session on),
    #: so that a new leader's first check reads a loaded, current index instead of
    #: waiting for a full read; false: only the leader holds one (it loads when
    #: elected). Memory: the index's size on every daemon. A change takes a restart.
    standby_index: bool = True
    #: Seconds SIGTERM may take to hand over leadership and stop.
    shutdown_timeout: float = 10.0
    #: Where the placement and replicas checks run: on the leader's loop, or a Spark job.
    engine: str = "asyncio"
    #: Seconds a daemon waits before voting again after its leader work failed; it
    #: doubles (with jitter) with each failure in a row, up to `leader_backoff_max`.
    leader_backoff_initial: float = 1.0
    leader_backoff_max: float = 120.0


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
    #: The read-only HTTP views (`auditor.api.http`), protected and TLS'd as the API's
    #: reads are; -1: off, 0: any free port.
    http_port: int = -1
    #: Open connections the HTTP views keep at once. Idle ones (waiting for a request)
    #: never crowd out a request: the oldest idle one is closed to make room.
    http_max_connections: int = 256
    #: Seconds a connection may wait for (or take to send) a whole request head.
    http_header_timeout: float = 5.0

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


@dataclass(frozen=True, slots=True)
class PulsarSection:
    """The leader's periodic Pulsar audit (`auditor.checks.pulsar_audit`); where Pulsar's
    tree is and the orphans' grace are `checks.pulsar_*`."""

    #: Seconds between audits (the first right after a new leader's first round); 0: off.
    #: Off by default: each audit reads Pulsar's whole tree from ZooKeeper.
    interval: float = 0.0
    #: Namespaces published per series in the `pulsar_*` metrics (the worst first; the
    #: rest summed under `namespace="other"`).
    top: int = 20


@dataclass(frozen=True, slots=True)
class WorkerSection:
    """The replication worker every daemon runs (BookKeeper's keys are in `[bookkeeper]`)."""

    #: Every daemon runs one, as every Java AutoRecovery process does.
    enabled: bool = True
    #: Ledgers one worker repairs at once (Java: one).
    ledgers_in_parallel: int = 1
    #: What the worker's locks name as their holder (Java: the host's canonical name);
    #: empty: this host's fully qualified name.
    lock_holder: str = ""
    #: Seconds before a ledger found unrecoverable (an entry with no readable copy) is
    #: tried again; its mark stays for an operator meanwhile.
    unrecoverable_retry: float = 3600.0


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
    "worker": WorkerSection,
    "pulsar": PulsarSection,
    "scrub": ScrubConfig,
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
    "leader_backoff_initial": (lambda v: v > 0, "positive seconds"),
    "leader_backoff_max": (lambda v: v > 0, "positive seconds"),
    "engine": (lambda v: v in ENGINES, " or ".join(repr(e) for e in ENGINES)),
    "ledgers_root": (lambda v: v.startswith("/"), "an absolute znode path"),
}
_METRICS_RULES: Rules = {
    "host": (_nonempty, "a host name or address"),
    "port": (_port, "a port 0..65535 (0: any free port)"),
}
_API_RULES: Rules = {
    **_METRICS_RULES,
    "http_port": (lambda v: v == -1 or _port(v), "a port 0..65535 (0: any free port), -1: off"),
    "http_max_connections": (lambda v: 1 <= v <= 65536, "a count 1..65536"),
    "http_header_timeout": (
        lambda v: math.isfinite(v) and 0 < v <= 300,
        "seconds above 0 and at most 300",
    ),
}
_LOGGING_RULES: Rules = {
    "format": (lambda v: v.lower() in LOG_FORMATS, " | ".join(LOG_FORMATS)),
    "level": (lambda v: v.lower() in LOG_LEVELS, " | ".join(LOG_LEVELS)),
}
SCAN_RULES: Rules = {
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
_PULSAR_RULES: Rules = {
    "interval": (lambda v: v >= 0, "seconds >= 0 (0: off)"),
    "top": (lambda v: v >= 1, "a count >= 1"),
}
_WORKER_RULES: Rules = {
    "ledgers_in_parallel": (lambda v: v >= 1, "a count >= 1"),
    "unrecoverable_retry": (lambda v: v > 0, "positive seconds"),
}
RULES: dict[str, Rules] = {
    "bookkeeper": BK_RULES,
    "checks": CHECKS_RULES,
    "daemon": _DAEMON_RULES,
    "api": _API_RULES,
    "metrics": _METRICS_RULES,
    "logging": _LOGGING_RULES,
    "scan": SCAN_RULES,
    "selftest": _SELFTEST_RULES,
    "risk": _RISK_RULES,
    "worker": _WORKER_RULES,
    "pulsar": _PULSAR_RULES,
    "scrub": SCRUB_RULES,
}
