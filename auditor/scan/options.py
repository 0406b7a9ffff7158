"""The command line and the daemon's `[scan]` table both choose an engine and its Spark
settings, and must accept and refuse the same ones in the same words, without loading the
checks' drivers to do it.

What a user chooses for a scan engine: its name, and the Spark settings handed to it.

Both the command line (`--engine`, repeated `--spark-conf spark.KEY=VALUE`)
and the daemon's `[scan]` table (`daemon.engine`, `scan.spark_conf` as a TOML
table, or `spark.KEY=VALUE;...` text from `--set` and the environment) take
them; they are named and checked once, here. Kept apart from
`auditor.scan.engine`, which loads the checks' drivers, so that parsing a
command line does not.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from auditor.config.values import brief_repr, from_origin
from auditor.errors import ConfigError

#: The scan engines: in process, and Spark.
ENGINES = ("asyncio", "spark")

#: A Spark setting's key, as `--spark-conf` and Spark's own `--conf` take it.
SPARK_KEY = re.compile(r"spark\.\S+")
#: Spark's own default `spark.redaction.regex`: settings whose values the logs must not show.
SPARK_SECRET = re.compile(r"(?i)secret|password|token|access[.]key")


def redact_spark_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """`conf` with the values of secret-looking keys masked, for logs."""
    return {k: "***" if SPARK_SECRET.search(k) else v for k, v in conf.items()}


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


def _split(items: Sequence[str], label: str, form: str, where: str) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"{label} must be {form}, got {item.strip()!r}{where}")
        pairs.append((key.strip(), text.strip()))
    return pairs


def _checked(pairs: Sequence[tuple[str, Any]], label: str, where: str) -> dict[str, str]:
    conf: dict[str, str] = {}
    for key, raw in pairs:
        if not SPARK_KEY.fullmatch(key):
            raise ConfigError(f"{label}: {key!r} is not a Spark setting (spark.KEY=VALUE){where}")
        setting = _spark_value(raw)
        if setting is None:
            raise ConfigError(
                f"{label}: {key} must be a string, number or boolean, got {brief_repr(raw)}{where}"
            )
        conf[key] = setting
    return conf


def spark_settings(items: Sequence[str], *, label: str, form: str) -> dict[str, str]:
    """Settings given one by one (repeated `--spark-conf spark.KEY=VALUE`), split at the first `=`.

    Errors start with `label` and say `form`, what was expected.
    """
    return _checked(_split(items, label, form, ""), label, "")


def parse_spark_conf(value: Any, *, label: str, form: str, origin: str = "") -> dict[str, str]:
    """Settings from a TOML table, or from text (`--set`, the environment).

    In text settings are separated by `;`, since values such as `spark.jars`
    hold commas; each is split at its first `=`. Anything else is refused,
    naming `form` and `origin`.
    """
    where = from_origin(origin)
    if isinstance(value, dict):
        return _checked(list(_flatten(value)), label, where)
    if isinstance(value, str):
        items = [item for item in value.split(";") if item.strip()]
        return _checked(_split(items, label, form, where), label, where)
    raise ConfigError(f"{label} must be {form}, got {brief_repr(value)}{where}")
