"""A setting may come from a TOML file, `bk_server.conf`, the environment or `--set`, and
an operator with a bad value must be told which one holds it; every loader must also turn
the same text into the same value, or refuse it the same way.

Settings that remember where they came from, and how a table of them becomes a dataclass.

Every configuration source (a TOML file, `bk_server.conf`, the environment,
`--set`) yields raw values: strings, or TOML's numbers, booleans and tables.
`build_section` turns them into one frozen dataclass: each value coerced to
its field's type, checked by the section's rules, and any problem a
`ConfigError` that names `section.key` and the value's origin. The one-shot
commands (`auditor.config.load`) and the daemon's layers
(`auditor.daemon.config`) both build their sections here, so a key means the
same, and fails the same way, wherever it is written.
"""

from __future__ import annotations

import contextlib
import math
import re
import reprlib
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from auditor.errors import ConfigError

T = TypeVar("T")

#: A key's validation: a predicate on the coerced value and what it must be, in words.
Rules = Mapping[str, tuple[Callable[[Any], bool], str]]


@dataclass(frozen=True, slots=True)
class Setting:
    """A raw value and where it came from ("" when it does not matter)."""

    value: Any
    origin: str = ""


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
    if len(value) > MAX_SETTING_CHARS:
        raise ConfigError(
            f"{name} is {len(value)} characters long; a setting holds at most {MAX_SETTING_CHARS}"
        )
    bad = _CONTROL.search(value)
    if bad is not None:
        # Not repeated: the value may be a secret (api.token).
        raise ConfigError(f"{name} holds a control character ({bad.group()!r} at {bad.start()})")
    return value


_TYPES = {"int": int, "float": float, "bool": bool, "str": str}

#: The longest string setting: a path's limit on Linux (PATH_MAX). Names, addresses,
#: paths and tokens are all far shorter; a longer value is a mistake (a file pasted into
#: a variable), and would be repeated in messages and logs.
MAX_SETTING_CHARS = 4096
#: C0 controls and DEL: no setting holds one, and in a log line or a terminal they mislead.
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def from_origin(origin: str) -> str:
    """` (from ORIGIN)` for the end of an error message; "" when the origin is unknown."""
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


def unknown_key(section: str, cls: Any, key: str, origin: str) -> ConfigError:
    """The error for a key `cls` does not have, with the field it probably meant."""
    hint = match_key(cls, key)
    did_you_mean = f" (did you mean {section}.{hint}?)" if hint else ""
    return ConfigError(f"unknown key {section}.{key}{did_you_mean}{from_origin(origin)}")


def build_section(section: str, base: T, values: Mapping[str, Setting], rules: Rules) -> T:
    """`base` with `values` applied: coerced to each field's type, then checked by `rules`.

    Any problem is a `ConfigError` naming `section.key` and the value's origin.
    """
    known = {f.name: _TYPES[str(f.type)] for f in fields(base)}  # type: ignore[arg-type]
    changes: dict[str, Any] = {}
    for key, setting in values.items():
        if key not in known:
            raise unknown_key(section, base, key, setting.origin)
        try:
            v = _coerce(f"{section}.{key}", setting.value, known[key])
        except ConfigError as exc:
            raise ConfigError(f"{exc}{from_origin(setting.origin)}") from None
        rule = rules.get(key)
        if rule is not None and not rule[0](v):
            raise ConfigError(
                f"{section}.{key} must be {rule[1]}, got {setting.value!r}"
                f"{from_origin(setting.origin)}"
            )
        changes[key] = v
    return replace(base, **changes)  # type: ignore[type-var]


def read_text(path: str | Path, what: str) -> str:
    """The text of a configuration file, or a ConfigError calling it `what`."""
    p = Path(path)
    try:
        return p.read_text()
    except FileNotFoundError as exc:
        raise ConfigError(f"{what} {p} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {p}: {exc}") from exc


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    text = read_text(p, "config file")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from exc
    except ValueError as exc:
        # tomllib lets int() refuse an integer of more than 4300 digits (CVE-2020-10735's
        # limit) as a bare ValueError, not a TOMLDecodeError.
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
    except RecursionError:
        # tomllib recurses once per level of nested arrays and inline tables.
        raise ConfigError(f"config file {p} nests arrays or tables too deeply") from None


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
