"""ZooKeeper's Java client properties (TLS) from every place a deployment already keeps them.

A Pulsar or BookKeeper node that reaches ZooKeeper over TLS says so in Java
system properties: `-Dzookeeper.client.secure=true -Dzookeeper.ssl...` in
`PULSAR_EXTRA_OPTS` (Pulsar's scripts and Helm chart), `BOOKIE_EXTRA_OPTS`
(BookKeeper's scripts) or `JAVA_TOOL_OPTIONS` (read by every JVM), sometimes
in a `zookeeper.client.config` file. An auditor beside such a node reads the
same settings, under the same names, so one change serves both; its own
configuration can say the same, or override it:

precedence, lowest first: `--bk-conf` lines with the full names < the Java
option variables (in the order above: a later `-D` wins, as on a JVM's
command line) < the TOML table `[zookeeper]` (names without `zookeeper.`,
quoted or as dotted keys) < environment `BK_AUDITOR_ZOOKEEPER_<NAME>` (matched
ignoring case, dots and underscores) < `--set zookeeper.NAME=VALUE`. A
`zookeeper.client.config` file fills in what none of those set.

Our own places (the table, `BK_AUDITOR_ZOOKEEPER_*`, `--set`) refuse a name
ZooKeeper's client does not have, so a typo cannot quietly leave TLS off;
the shared Java places carry many other `zookeeper.*` properties and only the
known ones are taken from them (matched exactly, as Java does).

`auditor.zk.tls` turns the merged properties into a `ZkTls`; the one-shot
commands use the same readers (`cli_zk_tls`).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from auditor.config import brief_repr, read_text, read_toml
from auditor.config.properties import property_lines
from auditor.errors import ConfigError
from auditor.zk.tls import CLIENT_CONFIG, PROPERTIES, Prop, ZkTls, zk_tls_from_properties

TABLE = "zookeeper"
ENV_PREFIX = "BK_AUDITOR_ZOOKEEPER_"
#: The variables whose `-D` options a JVM of the deployment gets, lowest precedence first.
JAVA_OPTION_VARIABLES = ("JAVA_TOOL_OPTIONS", "BOOKIE_EXTRA_OPTS", "PULSAR_EXTRA_OPTS")
_PREFIX = "zookeeper."

Props = dict[str, Prop]


def _blind(name: str) -> str:
    return name.replace(".", "").replace("_", "").replace("-", "").lower()


_BY_BLIND = {_blind(p[len(_PREFIX) :]): p for p in PROPERTIES}


def own_name(name: str, origin: str) -> str:
    """The Java name a key of our own configuration stands for; ConfigError when none.

    `name` may carry the `zookeeper.` prefix or not; case, dots and underscores
    do not matter (`ssl.trustStore.location`, `SSL_TRUSTSTORE_LOCATION`).
    """
    bare = name.strip()
    if bare.lower().startswith(_PREFIX):
        bare = bare[len(_PREFIX) :]
    known = _BY_BLIND.get(_blind(bare))
    if known is None:
        raise ConfigError(
            f"unknown ZooKeeper client property {brief_repr(name)} (from {origin}); known: "
            + ", ".join(p[len(_PREFIX) :] for p in PROPERTIES)
        )
    return known


def _text(value: Any, name: str, origin: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int):
        return str(value)
    raise ConfigError(f"{name} must be a string or a boolean, got {brief_repr(value)} ({origin})")


def table_props(path: str) -> Props:
    """The `[zookeeper]` table of the TOML file at `path`; dotted keys are flattened."""
    data = read_toml(path)
    table = data.get(TABLE)
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ConfigError(f"{TABLE} must be a table, got {brief_repr(table)} (in {path})")
    out: Props = {}

    def walk(prefix: str, values: Mapping[str, Any]) -> None:
        for key, value in values.items():
            dotted = f"{prefix}.{key}" if prefix else key
            if isinstance(value, dict):
                walk(dotted, value)
                continue
            origin = f"{path} [{TABLE}] {dotted}"
            name = own_name(dotted, origin)
            out[name] = (_text(value, name, origin), origin)

    walk("", table)
    return out


def env_props(env: Mapping[str, str]) -> Props:
    """`BK_AUDITOR_ZOOKEEPER_<NAME>`: `BK_AUDITOR_ZOOKEEPER_SSL_TRUSTSTORE_LOCATION` and so on."""
    out: Props = {}
    seen: dict[str, str] = {}
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        origin = f"environment {var}"
        name = own_name(var[len(ENV_PREFIX) :], origin)
        if name in seen:
            raise ConfigError(f"environment variables {seen[name]} and {var} both set {name}")
        seen[name] = var
        out[name] = (env[var], origin)
    return out


def is_override(item: str) -> bool:
    """Whether a `--set` item is ours (`zookeeper.NAME=VALUE`)."""
    return item.partition("=")[0].strip().lower().startswith(_PREFIX)


def set_props(overrides: Sequence[str]) -> Props:
    out: Props = {}
    for item in overrides:
        if not is_override(item):
            continue
        key, _, value = item.partition("=")
        name = own_name(key, "--set")
        out[name] = (value, "--set")
    return out


def java_option_props(env: Mapping[str, str]) -> Props:
    """The known `-Dzookeeper...=VALUE` options of the Java option variables."""
    out: Props = {}
    for var in JAVA_OPTION_VARIABLES:
        text = env.get(var, "")
        if not text.strip():
            continue
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise ConfigError(f"environment {var} does not parse as options: {exc}") from None
        for word in words:
            name, eq, value = word[2:].partition("=")
            if word.startswith("-D") and eq and name in PROPERTIES:
                out[name] = (value, f"environment {var} -D{name}")
    return out


def properties_file_props(path: str, what: str) -> Props:
    """The known full names in a Java properties file (bk_server.conf, a ZooKeeper client
    config); other keys are the file's business."""
    text = read_text(path, what)
    out: Props = {}
    for lineno, key, value in property_lines(text):
        if key in PROPERTIES:
            out[key] = (value.strip(), f"{path}:{lineno} {key}")
    return out


def with_client_config(props: Props) -> Props:
    """`props` with what their `zookeeper.client.config` file sets and they do not."""
    if CLIENT_CONFIG not in props or not props[CLIENT_CONFIG][0].strip():
        return props
    path, origin = props[CLIENT_CONFIG]
    try:
        extra = properties_file_props(path.strip(), "ZooKeeper client config")
    except ConfigError as exc:
        raise ConfigError(f"{CLIENT_CONFIG}: {exc} (from {origin})") from None
    extra.pop(CLIENT_CONFIG, None)
    return {**extra, **props}


def resolve_zk_tls(
    path: str | None,
    overrides: Sequence[str],
    env: Mapping[str, str],
    bk_conf: str | None,
) -> ZkTls | None:
    """The daemon's ZooKeeper TLS from every layer (see the module's docstring)."""
    props: Props = {}
    if bk_conf is not None:
        props.update(properties_file_props(bk_conf, "--bk-conf"))
    props.update(java_option_props(env))
    if path is not None:
        props.update(table_props(path))
    props.update(env_props(env))
    props.update(set_props(overrides))
    return zk_tls_from_properties(with_client_config(props))


def cli_zk_tls(tls_config: str | None, env: Mapping[str, str] = os.environ) -> ZkTls | None:
    """A one-shot command's ZooKeeper TLS: the Java option variables < BK_AUDITOR_ZOOKEEPER_*
    < `--zk-tls-config FILE` (a ZooKeeper client config file: full names)."""
    props = java_option_props(env)
    props.update(env_props(env))
    if tls_config:
        if not Path(tls_config).is_file():
            raise ConfigError(f"--zk-tls-config {tls_config}: no such file")
        props.update(properties_file_props(tls_config, "--zk-tls-config"))
    return zk_tls_from_properties(with_client_config(props))
