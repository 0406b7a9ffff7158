"""Configuration: BookKeeper's own knobs under their own names, and ours.

Operators already have a `bk_server.conf`; the checks honour the same keys
with the same meaning and units, in the `[bookkeeper]` table of a TOML file
(`--set KEY=VALUE` overrides one). Knobs BookKeeper has no word for (retry of
unanswering bookies, probing, rack sources, concurrency) live in `[checks]`.
Every value is validated here, and a bad one is a `ConfigError` that names the
key, so nothing downstream meets a nonsensical setting.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from auditor.errors import ConfigError

RACKAWARE = "org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy"
ZONEAWARE = "org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy"
REGIONAWARE = "org.apache.bookkeeper.client.RegionAwareEnsemblePlacementPolicy"
DEFAULT_POLICY = "org.apache.bookkeeper.client.DefaultEnsemblePlacementPolicy"


def _nonneg(v: float) -> bool:
    return v >= 0


def _pos(v: float) -> bool:
    return v > 0


def _pct(v: float) -> bool:
    return 0 <= v <= 100


@dataclass(frozen=True, slots=True)
class BookKeeperConfig:
    """BookKeeper's keys (names as in bk_server.conf), with BookKeeper's defaults and units."""

    zkTimeout: int = 10000  # ms
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


_BK_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
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
    "auditorPeriodicCheckInterval": (lambda v: True, "seconds"),
    "auditorPeriodicPlacementPolicyCheckInterval": (lambda v: True, "seconds"),
    "auditorReplicasCheckInterval": (lambda v: True, "seconds"),
}


@dataclass(frozen=True, slots=True)
class ChecksConfig:
    """Our own knobs for the checks."""

    #: Seconds before a ledger whose bookie did not answer is checked again (BP-34's delay).
    retry_delay: float = 10.0
    #: How many times such a ledger is checked again before `bookie_unavailable_registered`.
    retry_attempts: int = 2
    #: Probe bookies that cannot list entries (DbLedgerStorage) by reading instead.
    probe_unlistable: bool = True
    #: Requests in flight per bookie, at most.
    bookie_max_in_flight: int = 64
    #: Ledgers analysed concurrently.
    ledger_concurrency: int = 100
    #: Seconds a bookie's "cannot list entries" verdict is remembered.
    list_capability_ttl: float = 600.0
    #: Rack sources, in order of precedence: a YAML/JSON mapping file, a script, Pulsar's znode.
    racks_file: str = ""
    racks_script: str = ""
    racks_znode: str = "/bookies"
    #: Seconds between progress log lines on long runs.
    progress_interval: float = 30.0


_CHECKS_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "retry_delay": (_nonneg, "seconds >= 0"),
    "retry_attempts": (_nonneg, "a count >= 0"),
    "bookie_max_in_flight": (_pos, "a positive count"),
    "ledger_concurrency": (_pos, "a positive count"),
    "list_capability_ttl": (_nonneg, "seconds >= 0"),
    "progress_interval": (_pos, "positive seconds"),
}


@dataclass(frozen=True, slots=True)
class AuditorConfig:
    bookkeeper: BookKeeperConfig = field(default_factory=BookKeeperConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)

    @property
    def read_timeout(self) -> float:
        return float(self.bookkeeper.readEntryTimeout)

    @property
    def zk_timeout(self) -> float:
        return self.bookkeeper.zkTimeout / 1000.0


def _coerce(section: str, key: str, value: Any, target: type) -> Any:
    name = f"{section}.{key}"
    if target is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if target is int:
        if isinstance(value, bool):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if target is float:
        if isinstance(value, bool):
            raise ConfigError(f"{name} must be a number, got {value!r}")
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return value


_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def _apply(section: str, base: Any, values: Mapping[str, Any], rules: Mapping[str, Any]) -> Any:
    known = {f.name: _TYPES[str(f.type)] for f in fields(base)}
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown key {section}.{key}")
        v = _coerce(section, key, value, known[key])
        rule = rules.get(key)
        if rule is not None and not rule[0](v):
            raise ConfigError(f"{section}.{key} must be {rule[1]}, got {value!r}")
        changes[key] = v
    return replace(base, **changes)


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> AuditorConfig:
    """Reads a TOML file (optional) and applies `KEY=VALUE` overrides.

    A bare key means a BookKeeper key; `checks.KEY` and `bookkeeper.KEY` name
    the table explicitly.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {p} does not exist") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {p}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p} is not valid TOML: {exc}") from exc
    bk = dict(data.pop("bookkeeper", {}) or {})
    checks = dict(data.pop("checks", {}) or {})
    for section in data:
        if section not in ("daemon", "api", "metrics", "logging"):  # the daemon's own tables
            raise ConfigError(f"unknown config table [{section}]")
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set takes KEY=VALUE, got {item!r}")
        table, dot, name = key.partition(".")
        if dot and table == "checks":
            checks[name] = value
        elif dot and table == "bookkeeper":
            bk[name] = value
        else:
            bk[key] = value
    return AuditorConfig(
        bookkeeper=_apply("bookkeeper", BookKeeperConfig(), bk, _BK_RULES),
        checks=_apply("checks", ChecksConfig(), checks, _CHECKS_RULES),
    )
