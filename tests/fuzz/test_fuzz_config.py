"""Fuzzing the configuration loaders: TOML, bk_server.conf, --set and the environment.

tests/unit/test_config.py checks each rule with chosen values. Here the
layers are generated: TOML documents with known and unknown tables and keys
holding values of every TOML type (deep dotted keys included), Java
properties files with escapes and continuation lines, --set items and
BK_AUDITOR_* variables. Every combination goes through
`tests.fuzz.targets.config_layers`, where `load_config` and
`load_daemon_config` may only return a config or raise ConfigError.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from auditor.config import BookKeeperConfig
from auditor.config.properties import parse_properties
from auditor.daemon.config import SECTIONS
from tests.fuzz.support import MUTATIONS, cpu_limit, fuzz_settings, mutate, run
from tests.fuzz.targets import config, config_layers, etcd_config

pytestmark = pytest.mark.fuzz

TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=10)
TABLES = st.one_of(st.sampled_from([*SECTIONS, "nope"]), TEXT)


def _keys(section: str) -> st.SearchStrategy[str]:
    names = [f.name for f in fields(SECTIONS[section])] if section in SECTIONS else []
    return st.one_of(
        st.sampled_from(names or ["x"]), st.sampled_from(names or ["x"]).map(str.upper), TEXT
    )


_STRINGS = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "zk1:2181",
            "zk+hierarchical://h1:2181;h2:2181/ledgers",
            "zk+bogus://h/",
            "/ledgers",
            "ledgers",
            "spark",
            "asyncio",
            "json",
            "DEBUG",
            "true",
            " 12 ",
            "1e3",
            "inf",
            "nan",
            "-1",
            "9" * 5000,
            "spark.a=1;spark.b=2",
            "spark.x",
            "org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy",
            "/nonexistent/file",
            "bk-1:3181",
            "readonly",
        ]
    ),
)
_SCALARS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 1, -1, 100, 65535, 65536]),
    st.floats(),
    st.booleans(),
    _STRINGS,
)


def toml_value(value: Any) -> str:
    """`value` as TOML (strings as basic strings, floats in TOML's spelling)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=2),
    max_leaves=5,
)


@st.composite
def toml_documents(draw: st.DrawFn) -> bytes:
    lines: list[str] = []
    for table in draw(st.lists(TABLES, max_size=4, unique=True)):
        lines.append(f"[{json.dumps(table)}]")
        for key in draw(st.lists(_keys(table), max_size=4, unique=True)):
            value = draw(st.one_of(_SCALARS, _SCALARS, _VALUES))
            depth = draw(st.sampled_from([0, 0, 0, 1, 3]))
            dotted = json.dumps(key) + ".a" * depth
            lines.append(f"{dotted} = {toml_value(value)}")
    if draw(st.booleans()):
        lines.insert(0, f"{draw(TABLES)!r} = {toml_value(draw(_SCALARS))}")
    return "\n".join(lines).encode()


_BK_CONF_KEYS = st.one_of(
    st.sampled_from([f.name for f in fields(BookKeeperConfig)]),
    st.sampled_from(
        [
            "metadataServiceUri",
            "zkServers",
            "zkLedgersRootPath",
            "bookiePort",
            "bookieId",
            "advertisedAddress",
        ]
    ),
    TEXT,
)
_BK_CONF_VALUES = st.one_of(
    _STRINGS,
    st.sampled_from(["", "3181", "0", "70000", "x", "\\u0041", "\\", "a\\\n  b", "h1 , h2"]),
)


@st.composite
def properties_files(draw: st.DrawFn) -> bytes:
    lines: list[str] = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["property", "property", "property", "other"]))
        if kind == "property":
            sep = draw(st.sampled_from(["=", " = ", ":", " ", "\t", "\\="]))
            lines.append(draw(_BK_CONF_KEYS) + sep + draw(_BK_CONF_VALUES))
        else:
            lines.append(draw(st.sampled_from(["# c", "! c", "", "   ", "\\", "key\\", " \\u12"])))
    return draw(st.sampled_from(["\n", "\r\n", "\r"])).join(lines).encode()


@st.composite
def overrides(draw: st.DrawFn) -> list[str]:
    items: list[str] = []
    for _ in range(draw(st.integers(0, 4))):
        section = draw(st.sampled_from([*SECTIONS, ""]))
        key = draw(_keys(section or "bookkeeper"))
        prefix = f"{section}." if section else ""
        items.append(f"{prefix}{key}{draw(st.sampled_from(['=', '', ' = ']))}{draw(_STRINGS)}")
    return items


@st.composite
def environments(draw: st.DrawFn) -> dict[str, str]:
    env: dict[str, str] = {}
    for _ in range(draw(st.integers(0, 4))):
        section = draw(st.sampled_from([*SECTIONS, "api_target", "debug"]))
        key = draw(_keys(section)).upper()
        env[f"BK_AUDITOR_{section.upper()}_{key}"] = draw(_STRINGS)
    return env


@fuzz_settings(200)
@given(toml_documents(), properties_files(), overrides(), environments())
def test_generated_layers(
    toml: bytes, bk_conf: bytes, items: list[str], env: dict[str, str]
) -> None:
    with cpu_limit():
        config_layers(toml, bk_conf, items, env)


@fuzz_settings(150)
@given(st.one_of(toml_documents(), properties_files()), MUTATIONS)
def test_mutated_files(data: bytes, mutations: list[Any]) -> None:
    """Byte edits of generated files, fed as every layer at once."""
    run(config, mutate(data, mutations, b'[daemon]\nzk = "h:1"\n'))


_PROPERTY_PIECES = st.one_of(
    st.sampled_from(["=", ":", " ", "\t", "\f", "\\", "\\\n", "\\\r\n", "\n", "\r", "#", "!"]),
    st.sampled_from(["\\u0041", "\\u00", "\\t", "\\n", "\\=", "\\\\", "key", "value"]),
    TEXT,
)


@fuzz_settings(200)
@given(st.lists(_PROPERTY_PIECES, max_size=20))
def test_properties_text(pieces: list[str]) -> None:
    """parse_properties accepts any text (Java's Properties.load never fails on syntax)."""
    text = "".join(pieces)
    with cpu_limit():
        props = parse_properties(text)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in props.items())


_YAML_PIECES = st.sampled_from(
    [
        "useTls: true\n",
        "useTls: 1\n",
        "authority: etcd.test\n",
        "authority:\n",
        "tlsTrustCertsFilePath: /nonexistent\n",
        "tlsKeyFilePath: /k\n",
        "tlsProvider: OpenSSL\n",
        "- a\n",
        "? [1]\n: 2\n",
        "a: &x [*x]\n",
        "!!binary x\n",
        "[[[[",
        "{",
        "\t",
        ":",
    ]
)


@fuzz_settings(200)
@given(st.lists(_YAML_PIECES | st.text(max_size=20), max_size=12), MUTATIONS)
def test_etcd_configuration_files(pieces: list[str], mutations: list[Any]) -> None:
    data = "".join(pieces).encode()
    run(etcd_config, data)
    run(etcd_config, mutate(data, mutations))
