"""Configuration: BookKeeper's own knobs under their own names, and ours.

Operators already have a `bk_server.conf`; the checks honour the same keys
with the same meaning and units, in the `[bookkeeper]` table of a TOML file
(`--set KEY=VALUE` overrides one). Knobs BookKeeper has no word for (retry of
unanswering bookies, probing, rack sources, concurrency) live in `[checks]`.
Every value is validated here, and a bad one is a `ConfigError` that names the
key (and where the value came from), so nothing downstream meets a nonsensical
setting.

The pieces the daemon's layered configuration is built from live here too:
`build_section` applies values that remember their origin, `parse_properties`
reads a Java properties file such as BookKeeper's `bk_server.conf`.
"""

from __future__ import annotations

import contextlib
import math
import re
import reprlib
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from auditor.bookie.tls import bookie_tls
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

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, dict[str, Any]]]:
        return _by_name(self)


def _by_name(obj: Any) -> tuple[Callable[..., Any], tuple[str, dict[str, Any]]]:
    """Pickles a settings dataclass by field name, not position (slots dataclasses pickle
    positionally): a Spark executor whose code orders the fields differently must not
    silently read one setting as another."""
    return _rebuild, (type(obj).__name__, {f.name: getattr(obj, f.name) for f in fields(obj)})


def _rebuild(kind: str, values: dict[str, Any]) -> Any:
    cls: Any = {"BookKeeperConfig": BookKeeperConfig, "ChecksConfig": ChecksConfig}[kind]
    unknown = sorted(set(values) - {f.name for f in fields(cls)})
    if unknown:
        raise ConfigError(
            f"this bookkeeper-auditor does not know the setting(s) {', '.join(unknown)}: "
            "run the same version on the Spark driver and its executors"
        )
    return cls(**values)


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
    "startTLSTimeoutSecs": (_pos, "a positive number of seconds"),
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
    #: Violations a report lists, at most (the first ones by ledger id); counts,
    #: totals and per-category samples stay exact. 0 lists them all.
    max_violations_listed: int = 10000

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, dict[str, Any]]]:
        return _by_name(self)


_CHECKS_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "retry_delay": (_nonneg, "seconds >= 0"),
    "retry_attempts": (_nonneg, "a count >= 0"),
    "bookie_max_in_flight": (_pos, "a positive count"),
    "ledger_concurrency": (_pos, "a positive count"),
    "list_capability_ttl": (_nonneg, "seconds >= 0"),
    "progress_interval": (_pos, "positive seconds"),
    "max_violations_listed": (_nonneg, "a count >= 0 (0: no limit)"),
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


_BRIEF = reprlib.Repr()
_BRIEF.maxlevel = 3


def brief_repr(value: Any) -> str:
    """`repr(value)` for an error message, cut short for tables and arrays.

    TOML dotted keys nest tables thousands deep without any recursion in the
    parser (`a.a.a...a = 1`), and `repr` of such a value raises RecursionError.
    """
    if isinstance(value, dict | list):
        return _BRIEF.repr(value)
    return repr(value)


def _coerce(name: str, value: Any, target: type) -> Any:
    if target is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ConfigError(f"{name} must be true or false, got {brief_repr(value)}")
    if target is int:
        if isinstance(value, bool):
            raise ConfigError(f"{name} must be an integer, got {brief_repr(value)}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{name} must be an integer, got {brief_repr(value)}")
    if target is float:
        if isinstance(value, bool):
            raise ConfigError(f"{name} must be a number, got {brief_repr(value)}")
        number: float | None = None
        if isinstance(value, int | float):
            number = float(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value.strip())
        # inf and nan are numbers to Python, never a sensible timeout or delay.
        if number is not None and math.isfinite(number):
            return number
        raise ConfigError(f"{name} must be a finite number, got {brief_repr(value)}")
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {brief_repr(value)}")
    return value


_TYPES = {"int": int, "float": float, "bool": bool, "str": str}

T = TypeVar("T")

#: A key's validation: a predicate on the coerced value and what it must be, in words.
Rules = Mapping[str, tuple[Callable[[Any], bool], str]]


@dataclass(frozen=True, slots=True)
class Setting:
    """A raw value and where it came from ("" when it does not matter)."""

    value: Any
    origin: str = ""


def _from(origin: str) -> str:
    return f" (from {origin})" if origin else ""


def normalize_key(name: str) -> str:
    """The spelling-blind form of a key: `zkTimeout`, `ZKTIMEOUT` and `zk_timeout` agree.

    Environment variables are upper case by convention, so they can only
    name BookKeeper's camelCase keys and our snake_case ones this way.
    """
    return name.replace("_", "").replace("-", "").lower()


def field_names(cls: Any) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def match_key(cls: Any, name: str) -> str | None:
    """The field of `cls` that `name` names, ignoring case and underscores."""
    wanted = normalize_key(name)
    for key in field_names(cls):
        if normalize_key(key) == wanted:
            return key
    return None


def build_section(section: str, base: T, values: Mapping[str, Setting], rules: Rules) -> T:
    """`base` with `values` applied: coerced to each field's type, then checked by `rules`.

    Any problem is a `ConfigError` naming `section.key` and the value's origin.
    """
    known = {f.name: _TYPES[str(f.type)] for f in fields(base)}  # type: ignore[arg-type]
    changes: dict[str, Any] = {}
    for key, setting in values.items():
        if key not in known:
            hint = match_key(base, key)
            did_you_mean = f" (did you mean {section}.{hint}?)" if hint else ""
            raise ConfigError(f"unknown key {section}.{key}{did_you_mean}{_from(setting.origin)}")
        try:
            v = _coerce(f"{section}.{key}", setting.value, known[key])
        except ConfigError as exc:
            raise ConfigError(f"{exc}{_from(setting.origin)}") from None
        rule = rules.get(key)
        if rule is not None and not rule[0](v):
            raise ConfigError(
                f"{section}.{key} must be {rule[1]}, got {setting.value!r}{_from(setting.origin)}"
            )
        changes[key] = v
    return replace(base, **changes)  # type: ignore[type-var]


def _apply(section: str, base: Any, values: Mapping[str, Any], rules: Rules) -> Any:
    return build_section(section, base, {k: Setting(v) for k, v in values.items()}, rules)


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        return tomllib.loads(p.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {p} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {p}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from exc
    except RecursionError:
        # tomllib recurses once per level of nested arrays and inline tables.
        raise ConfigError(f"config file {p} nests arrays or tables too deeply") from None


#: Tables a TOML config file may have; the daemon reads the last four.
TOML_TABLES = (
    "bookkeeper",
    "checks",
    "daemon",
    "api",
    "metrics",
    "logging",
    "scan",
    "selftest",
    "risk",
)


def parse_override(item: str, tables: Iterable[str]) -> tuple[str, str, str]:
    """`--set TABLE.KEY=VALUE` -> (table, key, value); a bare KEY is a BookKeeper key."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set takes KEY=VALUE, got {item!r}")
    table, dot, name = key.partition(".")
    if dot and table in tables:
        return table, name, value
    return "bookkeeper", key, value


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> AuditorConfig:
    """Reads a TOML file (optional) and applies `KEY=VALUE` overrides.

    A bare key means a BookKeeper key; `checks.KEY` and `bookkeeper.KEY` name
    the table explicitly.
    """
    data: dict[str, Any] = read_toml(path) if path is not None else {}
    for section, values in data.items():
        if section not in TOML_TABLES:
            raise ConfigError(f"unknown config table [{section}]")
        if not isinstance(values, dict):
            raise ConfigError(f"{section} must be a table, got {brief_repr(values)} (in {path})")
    bk = dict(data.pop("bookkeeper", {}))
    checks = dict(data.pop("checks", {}))
    for item in overrides:
        table, name, value = parse_override(item, ("bookkeeper", "checks"))
        (checks if table == "checks" else bk)[name] = value
    config = AuditorConfig(
        bookkeeper=_apply("bookkeeper", BookKeeperConfig(), bk, _BK_RULES),
        checks=_apply("checks", ChecksConfig(), checks, _CHECKS_RULES),
    )
    # Unusable bookie TLS settings fail here, naming the key, not at the first connection.
    bookie_tls(config.bookkeeper)
    return config


BK_RULES: Rules = _BK_RULES
CHECKS_RULES: Rules = _CHECKS_RULES


# --- Java properties (bk_server.conf) ------------------------------------------------

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_WS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _odd_backslashes(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, logical line): comments and blanks dropped, continuations joined.

    A line ending in an odd number of backslashes continues on the next one,
    whose leading whitespace is dropped; a comment line never continues.
    """
    lines = _LINE_BREAK.split(text)
    i = 0
    while i < len(lines):
        lineno = i + 1
        part = lines[i].lstrip(_WS)
        i += 1
        if not part or part[0] in "#!":
            continue
        # Only the newest part is examined: the joined line ends in it, and what came
        # before ends in an even run of backslashes once its continuation one is cut,
        # so the parity is the part's own. Re-examining the whole line was quadratic.
        parts = [part]
        while _odd_backslashes(parts[-1]):
            parts[-1] = parts[-1][:-1]
            if i >= len(lines):
                break
            parts.append(lines[i].lstrip(_WS))
            i += 1
        yield lineno, "".join(parts)


def _unescape(raw: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        c = raw[i]
        if c != "\\" or i + 1 >= len(raw):
            out.append(c)
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", raw[i + 2 : i + 6]):
            out.append(chr(int(raw[i + 2 : i + 6], 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _split_property(line: str) -> tuple[str, str]:
    """Key and raw value: the key ends at the first unescaped `=`, `:` or whitespace."""
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=:" or c in _WS:
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(_WS)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_WS)
    # Trailing whitespace is dropped (Commons Configuration trims values) unless escaped.
    trimmed = rest.rstrip(_WS)
    if trimmed != rest and _odd_backslashes(trimmed):
        trimmed = rest[: len(trimmed) + 1]
    return key, trimmed


def property_lines(text: str) -> Iterator[tuple[int, str, str]]:
    """(line number, key, value) for every property of a Java properties text, in order."""
    for lineno, line in _logical_lines(text):
        key, value = _split_property(line)
        yield lineno, _unescape(key), _unescape(value)


def parse_properties(text: str) -> dict[str, str]:
    """A Java properties text as a dict; a repeated key keeps its last value."""
    return {key: value for _, key, value in property_lines(text)}
