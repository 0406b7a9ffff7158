"""`DaemonConfig`: the daemon's whole configuration once every layer is merged and checked.

Besides the tables' values it keeps where each one came from (for the
startup log and `status`), the files read, and what was derived: the ledger
manager of a metadata service URI and the ZooKeeper credentials. `changed`
compares two of them for a SIGHUP reload; `describe` lists every value with
the secrets masked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from auditor.checks.findings import Check
from auditor.config import AuditorConfig, BookKeeperConfig, ChecksConfig
from auditor.daemon.config.sections import (
    ApiConfig,
    DaemonSection,
    LoggingConfig,
    MetricsConfig,
    PulsarSection,
    RiskSection,
    ScanSection,
    SelfTestSection,
    WorkerSection,
)
from auditor.metadata.etcd_config import EtcdOptions
from auditor.metadata.layout import LedgerManager
from auditor.metadata.service_uri import MetadataDriver
from auditor.scan.options import redact_spark_conf
from auditor.store import StoreKind
from auditor.zk.security import ZkSecurity


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
    worker: WorkerSection = field(default_factory=WorkerSection)
    pulsar: PulsarSection = field(default_factory=PulsarSection)
    #: From `metadataServiceUri` (`zk+hierarchical://...`); None: read the LAYOUT znode.
    ledger_manager: LedgerManager | None = None
    #: Whose driver the Java nodes run, from the URI (`metadata-store:`: Pulsar's).
    metadata_driver: MetadataDriver = MetadataDriver.BOOKKEEPER
    #: Which store holds the metadata, from the URI (`etcd://`, `metadata-store:etcd:`).
    metadata_store: StoreKind = StoreKind.ZOOKEEPER
    #: etcd's TLS and authority, from Pulsar's etcd configuration file (`configFilePath`).
    etcd: EtcdOptions | None = field(default=None, compare=False)
    #: The URI's query parameters that mean nothing to us, for one startup log line.
    uri_ignored: tuple[str, ...] = field(default=(), compare=False)
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
            "worker": self.worker,
            "pulsar": self.pulsar,
            "scrub": self.auditor.scrub,
        }

    def changed(self, other: DaemonConfig) -> list[str]:
        """The "section.key"s whose values differ: what a SIGHUP reload changes."""
        out: list[str] = []
        mine, theirs = self._sections(), other._sections()
        for name, section in mine.items():
            for f in fields(section):
                if getattr(section, f.name) != getattr(theirs[name], f.name):
                    out.append(f"{name}.{f.name}")
        if (self.ledger_manager, self.metadata_driver, self.metadata_store) != (
            other.ledger_manager,
            other.metadata_driver,
            other.metadata_store,
        ):
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
            if name == "bookkeeper" and values["passwd"]:
                values["passwd"] = "***"
            if name == "scan":
                values["spark_conf"] = redact_spark_conf(values["spark_conf"])
            out[name] = values
        return out
