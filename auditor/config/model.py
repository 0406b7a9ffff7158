"""Every loader (the one-shot commands' file, the daemon's layers, a Spark executor's
pickle) must agree on what each setting is and which values it may take, so the sections
and each key's rule are written down once.

The settings the checks read: BookKeeper's keys under BookKeeper's names, and ours.

Operators already have a `bk_server.conf`; the checks honour the same keys
with the same meaning, units and defaults (`BookKeeperConfig`). Knobs
BookKeeper has no word for (retry of unanswering bookies, probing, rack
sources, concurrency) are ours (`ChecksConfig`). Each key's rule sits beside
its section, so every loader validates a key the same way.

Both sections travel to Spark executors by pickle, by field name rather than
position, so a driver and an executor of different versions refuse to run
instead of reading one setting as another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from auditor.config.values import Rules
from auditor.errors import ConfigError
from auditor.metadata.model import DigestType

#: BookKeeper's default placement policy (its `ensemblePlacementPolicy` default).
RACKAWARE = "org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy"
#: `digestType` as BookKeeper spells it (the client API's `DigestType.valueOf`, case
#: and all), and the digest each names.
DIGEST_TYPES = {
    "CRC32": DigestType.CRC32,
    "CRC32C": DigestType.CRC32C,
    "MAC": DigestType.HMAC,
    "DUMMY": DigestType.DUMMY,
}


def _nonneg(v: float) -> bool:
    return v >= 0


def _pos(v: float) -> bool:
    return v > 0


def _pct(v: float) -> bool:
    return 0 <= v <= 100


def _any(v: float) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class BookKeeperConfig:
    """BookKeeper's keys (names as in bk_server.conf), with BookKeeper's defaults and units."""

    zkTimeout: int = 10000  # ms
    #: Create znodes with creator-only ACLs (needs ZooKeeper credentials), as BookKeeper does.
    zkEnableSecurity: bool = False
    readEntryTimeout: int = 5  # s, the client's per-read timeout
    lostBookieRecoveryDelay: int = 0  # s
    underreplicatedLedgerRecoveryGracePeriod: int = 0  # s; 0 = off
    auditorLedgerVerificationPercentage: int = 0  # %
    auditorMaxNumberOfConcurrentOpenLedgerOperations: int = 500
    auditorAcquireConcurrentOpenLedgerOperationsTimeOutMSec: int = 120000  # ms
    inFlightReadEntryNumInLedgerChecker: int = -1  # <= 0: unlimited
    storeSystemTimeAsLedgerUnderreplicatedMarkTime: bool = True
    repairedPlacementPolicyNotAdheringBookieEnabled: bool = False
    ensemblePlacementPolicy: str = RACKAWARE
    minNumRacksPerWriteQuorum: int = 2
    enforceMinNumRacksPerWriteQuorum: bool = False
    minNumZonesPerWriteQuorum: int = 2
    desiredNumZonesPerWriteQuorum: int = 3
    reppMinimumRegionsForDurability: int = 2
    networkTopologyScriptFileName: str = ""
    networkTopologyScriptNumberArgs: int = 100
    auditorPeriodicBookieCheckInterval: int = 86400  # s
    auditorPeriodicCheckInterval: int = 604800  # s
    auditorPeriodicPlacementPolicyCheckInterval: int = 0  # s
    auditorReplicasCheckInterval: int = 0  # s
    # The replication worker's keys (BookKeeper's ReplicationWorker and its replicator).
    rereplicationEntryBatchSize: int = 10  # entries in flight per copy; <= 0: 1
    openLedgerRereplicationGracePeriod: int = 30000  # ms
    lockReleaseOfFailedLedgerGracePeriod: int = 300000  # ms
    rwRereplicateBackoffMs: int = 5000  # ms
    zkReplicationTaskRateLimit: float = 0.0  # ledgers taken per second; <= 0: no limit
    replicationRateByBytes: int = -1  # bytes/s read for copies; <= 0: no limit
    # What upstream's admin (`getBookieRecoveryDigestType`, `getBookieRecoveryPasswd`)
    # opens a ledger with when its metadata names no password (metadata format 1, or
    # written without one): the worker reads and copies such ledgers with these, and a
    # target that never saw the ledger gets the master key of `passwd`. Ledgers whose
    # metadata has them always use their own. `passwd` is a secret: never shown.
    digestType: str = "CRC32"
    passwd: str = field(default="", repr=False)
    # Bookie TLS (`auditor.bookie.tls`): on when tlsProviderFactoryClass is set; PEM only.
    tlsProviderFactoryClass: str = ""
    tlsClientAuthentication: bool = False
    tlsHostnameVerificationEnabled: bool = False
    startTLSTimeoutSecs: int = 10  # s
    tlsTrustStoreType: str = "JKS"
    tlsTrustStore: str = ""
    tlsKeyStoreType: str = "JKS"
    tlsKeyStore: str = ""
    tlsKeyStorePasswordPath: str = ""
    tlsCertificatePath: str = ""
    #: Comma-separated TLS versions (`TLSv1.2,TLSv1.3`); empty: OpenSSL's defaults.
    tlsEnabledProtocols: str = ""
    # BookKeeper's deprecated client-only spellings; when set they win over the tls* keys.
    clientTrustStoreType: str = ""
    clientTrustStore: str = ""
    clientKeyStoreType: str = ""
    clientKeyStore: str = ""
    clientKeyStorePasswordPath: str = ""

    @property
    def recovery_digest_type(self) -> DigestType:
        """`digestType` as a digest: for ledgers whose metadata names none."""
        return DIGEST_TYPES[self.digestType]

    @property
    def recovery_password(self) -> bytes:
        """`passwd` as bytes (UTF-8, as Java's `getBytes(UTF_8)`): for ledgers whose
        metadata holds no password."""
        return self.passwd.encode()

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, dict[str, Any]]]:
        return _by_name(self)


BK_RULES: Rules = {
    "zkTimeout": (_pos, "a positive number of milliseconds"),
    "readEntryTimeout": (_pos, "a positive number of seconds"),
    "lostBookieRecoveryDelay": (_nonneg, "seconds >= 0"),
    "underreplicatedLedgerRecoveryGracePeriod": (_nonneg, "seconds >= 0"),
    "auditorLedgerVerificationPercentage": (_pct, "a percentage 0..100"),
    "auditorMaxNumberOfConcurrentOpenLedgerOperations": (_pos, "a positive count"),
    "auditorAcquireConcurrentOpenLedgerOperationsTimeOutMSec": (_nonneg, "milliseconds >= 0"),
    "minNumRacksPerWriteQuorum": (_nonneg, "a count >= 0"),
    "minNumZonesPerWriteQuorum": (_nonneg, "a count >= 0"),
    "desiredNumZonesPerWriteQuorum": (_nonneg, "a count >= 0"),
    "reppMinimumRegionsForDurability": (_nonneg, "a count >= 0"),
    "networkTopologyScriptNumberArgs": (_pos, "a positive count"),
    "auditorPeriodicBookieCheckInterval": (_nonneg, "seconds >= 0"),
    "auditorPeriodicCheckInterval": (_any, "seconds"),
    "auditorPeriodicPlacementPolicyCheckInterval": (_any, "seconds"),
    "auditorReplicasCheckInterval": (_any, "seconds"),
    "startTLSTimeoutSecs": (_pos, "a positive number of seconds"),
    "openLedgerRereplicationGracePeriod": (_nonneg, "milliseconds >= 0"),
    "lockReleaseOfFailedLedgerGracePeriod": (_nonneg, "milliseconds >= 0"),
    "rwRereplicateBackoffMs": (_nonneg, "milliseconds >= 0"),
    "digestType": (lambda v: v in DIGEST_TYPES, "one of " + ", ".join(DIGEST_TYPES)),
}


@dataclass(frozen=True, slots=True)
class ChecksConfig:
    """Our own knobs for the checks."""

    #: Seconds before a ledger whose bookie did not answer is checked again (BP-34's delay).
    retry_delay: float = 10.0
    #: How many delayed re-checks each (ledger, bookie) that fell silent gets before it is
    #: `bookie_unavailable_registered` (a ledger is re-checked at most twice this often:
    #: `checks/replicas_retry.py`).
    retry_attempts: int = 2
    #: Probe bookies that cannot list entries (DbLedgerStorage) by reading instead.
    probe_unlistable: bool = True
    #: Requests in flight per bookie, at most.
    bookie_max_in_flight: int = 64
    #: Ledgers analysed concurrently.
    ledger_concurrency: int = 100
    #: Ledger znodes a walk reads ahead, at least (ZooKeeper multiRead batches of up to
    #: 250): batches make reads cheap, so they are not cut down to `ledger_concurrency`.
    walk_read_ahead: int = 1000
    #: Seconds a bookie's "cannot list entries" verdict is remembered.
    list_capability_ttl: float = 600.0
    #: Rack sources, in order of precedence: a JSON mapping file, a script, Pulsar's znode.
    racks_file: str = ""
    racks_script: str = ""
    racks_znode: str = "/bookies"
    #: Seconds between progress log lines on long runs.
    progress_interval: float = 30.0
    #: Violations a report lists, at most (the first ones by ledger id); counts,
    #: totals and per-category samples stay exact. 0 lists them all.
    max_violations_listed: int = 10000
    #: Violations logged one line each, at most, per run and category; the rest are
    #: counted in one summary line at the end of the run (reports keep every one).
    #: 0 logs none one by one; -1 logs every one.
    violation_log_limit: int = 100
    #: Pulsar audit (`pulsar-audit`): the ZooKeeper connect string of Pulsar's metadata
    #: store when it is not the cluster's ("": the same ZooKeeper), and the root of
    #: Pulsar's tree in it ("": ZooKeeper's root, where `managed-ledgers` usually is).
    pulsar_metadata_zk: str = ""
    pulsar_root: str = ""
    #: Seconds an unreferenced ledger Pulsar created must be old to be an orphan (24 h).
    pulsar_orphan_grace: float = 86400.0

    @property
    def walk_window(self) -> int:
        """Reads in flight of a check's walk of ZooKeeper (and of the index's load)."""
        return max(self.walk_read_ahead, self.ledger_concurrency)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, dict[str, Any]]]:
        return _by_name(self)


CHECKS_RULES: Rules = {
    "retry_delay": (_nonneg, "seconds >= 0"),
    "retry_attempts": (_nonneg, "a count >= 0"),
    "bookie_max_in_flight": (_pos, "a positive count"),
    "ledger_concurrency": (_pos, "a positive count"),
    "walk_read_ahead": (_pos, "a positive count"),
    "list_capability_ttl": (_nonneg, "seconds >= 0"),
    "progress_interval": (_pos, "positive seconds"),
    "max_violations_listed": (_nonneg, "a count >= 0 (0: no limit)"),
    "violation_log_limit": (lambda v: v >= -1, "a count >= 0, or -1 (no limit)"),
    "pulsar_root": (
        lambda v: v == "" or (v.startswith("/") and not v.endswith("/")),
        '"" or an absolute path without a trailing /',
    ),
    "pulsar_orphan_grace": (_nonneg, "seconds >= 0"),
}


@dataclass(frozen=True, slots=True)
class ScrubConfig:
    """The deep scrub (`check scrub`): every copy of every entry read, so it is paced."""

    #: Bytes read per second from each bookie, at most (a token bucket of one second's
    #: worth: `checks/scrub_pace.py`); 0: no budget. 8 MiB/s reads a 1 TiB bookie in 36 h.
    bytes_per_second: float = 8 * 1024 * 1024
    #: Seconds the daemon's scrub takes to go round the whole cluster (seven days).
    interval: float = 7 * 86400.0
    #: Whether the daemon's leader scrubs continuously, a cycle every `interval`
    #: (`daemon/scrub_cycle.py`). Off by default: its first cycle reads every byte of the
    #: cluster, which an operator turns on knowingly; `check scrub` ignores it.
    continuous: bool = False

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, dict[str, Any]]]:
        return _by_name(self)


SCRUB_RULES: Rules = {
    "bytes_per_second": (_nonneg, "bytes per second >= 0 (0: no budget)"),
    "interval": (_pos, "positive seconds"),
}


@dataclass(frozen=True, slots=True)
class AuditorConfig:
    bookkeeper: BookKeeperConfig = field(default_factory=BookKeeperConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    scrub: ScrubConfig = field(default_factory=ScrubConfig)

    @property
    def read_timeout(self) -> float:
        return float(self.bookkeeper.readEntryTimeout)

    @property
    def zk_timeout(self) -> float:
        return self.bookkeeper.zkTimeout / 1000.0


def _by_name(obj: Any) -> tuple[Callable[..., Any], tuple[str, dict[str, Any]]]:
    """Pickles a settings dataclass by field name, not position (slots dataclasses pickle
    positionally): a Spark executor whose code orders the fields differently must not
    silently read one setting as another."""
    return _rebuild, (type(obj).__name__, {f.name: getattr(obj, f.name) for f in fields(obj)})


def _rebuild(kind: str, values: dict[str, Any]) -> Any:
    cls: Any = {
        "BookKeeperConfig": BookKeeperConfig,
        "ChecksConfig": ChecksConfig,
        "ScrubConfig": ScrubConfig,
    }[kind]
    unknown = sorted(set(values) - {f.name for f in fields(cls)})
    if unknown:
        raise ConfigError(
            f"this bookkeeper-auditor does not know the setting(s) {', '.join(unknown)}: "
            "run the same version on the Spark driver and its executors"
        )
    return cls(**values)
