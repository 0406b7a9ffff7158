"""The daemon's configuration layers: what `bk_server.conf`, the TOML file, the environment
and `--set` each say, as raw settings that remember their origin.

Precedence, lowest first: `--bk-conf bk_server.conf` < the TOML file <
environment `BK_AUDITOR_<SECTION>_<KEY>` < `--set SECTION.KEY=VALUE`; `merge`
folds them in that order. A layer only reads and names: coercion and rules
are applied once, to the merged values (`auditor.daemon.config.load`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from auditor.config import (
    BookKeeperConfig,
    Setting,
    brief_repr,
    field_names,
    match_key,
    parse_override,
    read_text,
    read_toml,
)
from auditor.config.properties import property_lines
from auditor.daemon.config.sections import SECTIONS
from auditor.errors import ConfigError

#: BookKeeper's default bookie port, for an identity derived from bk_server.conf.
DEFAULT_BOOKIE_PORT = 3181
ENV_PREFIX = "BK_AUDITOR_"
#: Variables of the admin CLI (`bk-auditor status` and friends) that look like ours.
CLIENT_ONLY_ENV = frozenset({"BK_AUDITOR_API_TARGET"})

#: section -> key -> setting, as one source gives them.
Layer = dict[str, dict[str, Setting]]


def empty_layer() -> Layer:
    return {name: {} for name in SECTIONS}


@dataclass(frozen=True, slots=True)
class BookieHints:
    """What bk_server.conf says about the bookie this daemon runs beside."""

    bookie_id: str = ""
    advertised_address: str = ""
    port: int = DEFAULT_BOOKIE_PORT


def bk_conf_layer(path: str) -> tuple[Layer, BookieHints]:
    """The keys of BookKeeper's server config we honour, under our names; the rest is ignored.

    An empty value (`key=`) counts as unset, as templates are full of them.
    A repeated key keeps its last value.
    """
    p = Path(path)
    text = read_text(p, "--bk-conf")
    props: dict[str, tuple[str, str]] = {}
    for lineno, key, value in property_lines(text):
        if value.strip():
            props[key] = (value.strip(), f"{p}:{lineno} {key}")
        else:
            props.pop(key, None)
    layer = empty_layer()
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
    hints = BookieHints(
        bookie_id=props.get("bookieId", ("", ""))[0],
        advertised_address=props.get("advertisedAddress", ("", ""))[0],
        port=port,
    )
    return layer, hints


def toml_layer(path: str) -> Layer:
    data = read_toml(path)
    layer = empty_layer()
    for table, values in data.items():
        if table not in SECTIONS:
            raise ConfigError(f"unknown config table [{table}] (in {path})")
        if not isinstance(values, dict):
            raise ConfigError(f"{table} must be a table, got {brief_repr(values)} (in {path})")
        for key, value in values.items():
            layer[table][key] = Setting(value, str(path))
    return layer


def env_layer(env: Mapping[str, str]) -> Layer:
    """`BK_AUDITOR_<SECTION>_<KEY>`, the key matched ignoring case and underscores.

    Variables whose second word is no section (BK_AUDITOR_DEBUG) and the admin
    CLI's BK_AUDITOR_API_TARGET are not configuration; a known section with an
    unknown key is an error, so a typo does not silently leave a default in
    place. (BK_AUDITOR_API_TOKEN means the same token to the CLI and the daemon.)
    """
    layer = empty_layer()
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


def set_layer(overrides: Sequence[str]) -> Layer:
    """`--set SECTION.KEY=VALUE`; a bare key is a BookKeeper key, as for `check`."""
    layer = empty_layer()
    for item in overrides:
        table, name, value = parse_override(item, SECTIONS)
        layer[table][name] = Setting(value, "--set")
    return layer


def merge(layers: Sequence[Layer]) -> tuple[Layer, dict[str, int], dict[str, str]]:
    """The layers folded, later over earlier; each key's layer index and origin."""
    merged = empty_layer()
    rank: dict[str, int] = {}
    origins: dict[str, str] = {}
    for i, layer in enumerate(layers):
        for section, values in layer.items():
            for key, setting in values.items():
                merged[section][key] = setting
                rank[f"{section}.{key}"] = i
                origins[f"{section}.{key}"] = setting.origin
    return merged, rank, origins
