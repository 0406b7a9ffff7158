"""A one-shot command runs with BookKeeper's defaults, one file and its `--set` flags, not
the daemon's layers of files, environment and BP-34 defaults, so its settings are read by a
loader of their own.

`load_config`: the one-shot commands' settings, from a TOML file and `--set` overrides.

`check`, `scan`, `explain`, `risk` and the other one-shot commands read the
`[bookkeeper]`, `[checks]` and `[scrub]` tables of the file the daemon also reads (the
daemon's own tables are allowed there and ignored), then apply `--set KEY=VALUE`.
They keep BookKeeper's defaults; the daemon's layers and its BP-34 defaults are
`auditor.daemon.config`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from auditor.bookie.tls import bookie_tls
from auditor.config.model import (
    BK_RULES,
    CHECKS_RULES,
    SCRUB_RULES,
    AuditorConfig,
    BookKeeperConfig,
    ChecksConfig,
    ScrubConfig,
)
from auditor.config.values import Setting, brief_repr, build_section, parse_override, read_toml
from auditor.errors import ConfigError

#: Tables a TOML config file may have; the one-shot commands read `bookkeeper`, `checks`
#: and `scrub`.
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
    "scrub",
)


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> AuditorConfig:
    """Reads a TOML file (optional) and applies `KEY=VALUE` overrides.

    A bare key means a BookKeeper key; `checks.KEY`, `scrub.KEY` and `bookkeeper.KEY`
    name the table explicitly.
    """
    data: dict[str, Any] = read_toml(path) if path is not None else {}
    for section, values in data.items():
        if section not in TOML_TABLES:
            raise ConfigError(f"unknown config table [{section}]")
        if not isinstance(values, dict):
            raise ConfigError(f"{section} must be a table, got {brief_repr(values)} (in {path})")
    bk = dict(data.pop("bookkeeper", {}))
    checks = dict(data.pop("checks", {}))
    scrub = dict(data.pop("scrub", {}))
    tables = {"bookkeeper": bk, "checks": checks, "scrub": scrub}
    for item in overrides:
        table, name, value = parse_override(item, tables)
        tables[table][name] = value
    config = AuditorConfig(
        bookkeeper=build_section(
            "bookkeeper", BookKeeperConfig(), {k: Setting(v) for k, v in bk.items()}, BK_RULES
        ),
        checks=build_section(
            "checks", ChecksConfig(), {k: Setting(v) for k, v in checks.items()}, CHECKS_RULES
        ),
        scrub=build_section(
            "scrub", ScrubConfig(), {k: Setting(v) for k, v in scrub.items()}, SCRUB_RULES
        ),
    )
    # Unusable bookie TLS settings fail here, naming the key, not at the first connection.
    bookie_tls(config.bookkeeper)
    return config
