"""The daemon's configuration layers: what `bk_server.conf`, the TOML file, the environment
and `--set` each say, as raw settings that remember their origin.

Precedence, lowest first: `--bk-conf bk_server.conf` < the TOML file <
environment `BK_AUDITOR_<SECTION>_<KEY>` < `--set SECTION.KEY=VALUE`; `merge`
folds them in that order. Pulsar's images configure BookKeeper with
`PULSAR_PREFIX_<key>` and bare `<key>` variables applied to the config file;
they are read the same way, into the bk_server.conf layer (`pulsar_env`), so a
Pulsar Helm chart's ConfigMap configures the daemon as it is. A layer only
reads and names: coercion and rules are applied once, to the merged values
(`auditor.daemon.config.load`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
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


#: Pulsar's images set any key of the BookKeeper config file from `PULSAR_PREFIX_<key>`.
PULSAR_PREFIX = "PULSAR_PREFIX_"
#: What bk_server.conf names besides `[bookkeeper]`'s keys: the cluster, then the bookie.
CLUSTER_KEYS = ("metadataServiceUri", "zkServers", "zkLedgersRootPath")
IDENTITY_KEYS = (
    "bookieId",
    "advertisedAddress",
    "bookiePort",
    "listeningInterface",
    "allowLoopback",
    "useHostNameAsBookieID",
    "useShortHostName",
)
#: Commons Configuration's `getBoolean` spellings (BooleanUtils), for the identity's flags.
_TRUE = frozenset({"true", "on", "yes", "y", "t"})
_FALSE = frozenset({"false", "off", "no", "n", "f"})


def honoured_keys() -> frozenset[str]:
    """Every BookKeeper key the daemon reads from bk_server.conf."""
    return frozenset((*field_names(BookKeeperConfig), *CLUSTER_KEYS, *IDENTITY_KEYS))


@dataclass(frozen=True, slots=True)
class BookieHints:
    """What the BookKeeper configuration says about the bookie this daemon runs beside: the
    keys of upstream's `BookieImpl.getBookieAddress` (`auditor.daemon.config.identity`)."""

    bookie_id: str = ""
    advertised_address: str = ""
    port: int = DEFAULT_BOOKIE_PORT
    #: "" (unset) or "default": the address this host's name resolves to.
    listening_interface: str = ""
    allow_loopback: bool = False
    use_host_name: bool = False
    use_short_host_name: bool = False
    #: Where the configuration came from (the file, the environment), for messages.
    source: str = "bk_server.conf"
    #: key -> origin, for each of `IDENTITY_KEYS` that was set.
    origins: Mapping[str, str] = field(default_factory=dict)


def conf_file_keys(text: str) -> frozenset[str]:
    """The keys Pulsar's `apply-config-from-env.py` finds in a config file.

    Its rule, not Java's: every line with an `=`, the key before it, less one
    leading `#`, so that a commented-out `#bookieId=` counts as present.
    """
    keys: set[str] = set()
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = raw.strip()
        if "=" not in line:
            continue
        key = line.split("=", 1)[0]
        keys.add((key[1:] if key.startswith("#") else key).strip())
    return frozenset(keys)


def _as_written(env: Mapping[str, str], value: str) -> str:
    """The value the script writes (`${NAME}` is NAME's value), as Java then reads it."""
    if value.startswith("${") and value.endswith("}"):
        value = env.get(value[2:-1], "")
    for _, _, read in property_lines(f"k={value}"):
        return read
    return value


def pulsar_env(env: Mapping[str, str], keys: Collection[str]) -> dict[str, tuple[str, str]]:
    """What Pulsar's `apply-config-from-env.py` sets in a file naming `keys`: key -> (value,
    origin). A variable named as a key of the file, bare or after `PULSAR_PREFIX_`, replaces
    its value; then every `PULSAR_PREFIX_<key>` sets its key, present or not (so it wins)."""
    out: dict[str, tuple[str, str]] = {}
    for name in sorted(env):
        key = name.removeprefix(PULSAR_PREFIX)
        if key in keys:
            out[key] = (_as_written(env, env[name].strip()), f"environment {name}")
    for name in sorted(env):
        if name.startswith(PULSAR_PREFIX):
            key = name.removeprefix(PULSAR_PREFIX)
            out[key] = (_as_written(env, env[name]), f"environment {name}")
    return out


def _flag(props: Mapping[str, tuple[str, str]], key: str) -> bool:
    if key not in props:
        return False
    value, origin = props[key]
    if value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise ConfigError(f"{key} must be true or false, got {value!r} (from {origin})")


def bk_conf_layer(
    path: str | None, env: Mapping[str, str] | None = None
) -> tuple[Layer, BookieHints | None]:
    """The keys of BookKeeper's server config we honour, under our names; the rest is ignored.

    The config is the file `path` (`--bk-conf`) with Pulsar's variables of
    `env` applied as Pulsar's images apply them (`pulsar_env`). Without a file,
    `PULSAR_PREFIX_<key>` variables, and bare ones named as a key we honour
    (the Helm chart's ConfigMaps set `zkServers`, `useHostNameAsBookieID`...),
    form it alone. No file and no such variable: an empty layer and no hints.

    An empty value (`key=`) counts as unset, as templates are full of them.
    A repeated key keeps its last value.
    """
    props: dict[str, tuple[str, str]] = {}
    sources: list[str] = []
    keys = honoured_keys()
    if path is not None:
        p = Path(path)
        text = read_text(p, "--bk-conf")
        for lineno, key, value in property_lines(text):
            props[key] = (value, f"{p}:{lineno} {key}")
        keys = conf_file_keys(text)
        sources.append(str(p))
    applied = pulsar_env(env or {}, keys)
    if applied:
        props.update(applied)
        sources.append("the environment")
    if not sources:
        return empty_layer(), None
    props = {k: (v.strip(), o) for k, (v, o) in props.items() if v.strip()}
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
        listening_interface=props.get("listeningInterface", ("", ""))[0],
        allow_loopback=_flag(props, "allowLoopback"),
        use_host_name=_flag(props, "useHostNameAsBookieID"),
        use_short_host_name=_flag(props, "useShortHostName"),
        source=" with ".join(sources),
        origins={k: props[k][1] for k in IDENTITY_KEYS if k in props},
    )
    return layer, hints


def toml_layer(path: str) -> Layer:
    data = read_toml(path)
    layer = empty_layer()
    for table, values in data.items():
        if table == "zookeeper":  # Java's client properties: auditor.daemon.config.zookeeper
            continue
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
