"""Fuzzing the rack mapping parsers: JSON, Pulsar's znode, script output; YAML refused.

tests/unit/test_placement.py has examples of each format; nothing fuzzed them.
Every input goes through `tests.fuzz.targets.racks`, which runs the three
parsers (and the racks-file loader) on it and checks that every location they
return is in BookKeeper's normal form, and that the same bytes under a YAML
file name are refused unread. The round-trip tests write a mapping in each
format and read back exactly what the normalisation promises.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from auditor.errors import ConfigError
from auditor.topology.locations import normalize_location
from auditor.topology.racks import (
    load_racks_file,
    parse_json_racks,
    parse_pulsar_racks,
    parse_script_output,
)
from tests.fuzz.support import fuzz_settings, run
from tests.fuzz.targets import racks, scratch

pytestmark = pytest.mark.fuzz

TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
LOCATIONS = st.one_of(
    st.sampled_from(["/r1", "r2", "/zone/ud", "/r3/", "/", "", " /r4 ", "//", "~", "null"]), TEXT
)
KEYS = st.one_of(st.sampled_from(["10.0.0.1:3181", "bk-2", "host3", " spaced ", ""]), TEXT)

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), TEXT, LOCATIONS
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)


@fuzz_settings(300)
@given(
    st.one_of(
        st.dictionaries(KEYS, st.one_of(LOCATIONS, JSON_VALUES), max_size=5),
        JSON_VALUES,
    )
)
def test_json_documents(doc: Any) -> None:
    run(racks, json.dumps(doc).encode())


@st.composite
def pulsar_documents(draw: st.DrawFn) -> Any:
    """`{group: {bookie: {"rack": ..., "hostname": ...}}}`, any value sometimes off-type."""
    doc: dict[str, Any] = {}
    for group in draw(st.lists(KEYS, max_size=3)):
        bookies: dict[str, Any] = {}
        for bookie in draw(st.lists(KEYS, max_size=4)):
            info: dict[str, Any] = {}
            if draw(st.integers(0, 5)):
                info["rack"] = draw(st.one_of(LOCATIONS, LOCATIONS, JSON_VALUES))
            if draw(st.booleans()):
                info["hostname"] = draw(st.one_of(KEYS, JSON_VALUES))
            bookies[bookie] = info if draw(st.integers(0, 9)) else draw(JSON_VALUES)
        doc[group] = bookies if draw(st.integers(0, 9)) else draw(JSON_VALUES)
    return doc


@fuzz_settings(150)
@given(pulsar_documents(), st.sampled_from(["", " ", "\n"]))
def test_pulsar_documents(doc: Any, pad: str) -> None:
    run(racks, (pad + json.dumps(doc) + pad).encode())


_YAML_KEYS = st.one_of(
    KEYS,
    KEYS.map(json.dumps),
    KEYS.map(lambda k: "'" + k.replace("'", "''") + "'"),
    st.sampled_from(['"unterminated', "'x", "- item", "{a", "[b", "?", "a b", "#c", "-"]),
)
_YAML_VALUES = st.one_of(
    LOCATIONS,
    LOCATIONS.map(json.dumps),
    LOCATIONS.map(lambda v: "'" + v.replace("'", "''") + "'"),
    st.sampled_from(
        ['"/r" # c', "/r # c", "/r#c", "{a: 1}", "[1]", "|", "&a", "*a", "!t", '"\\q"']
    ),
)


@st.composite
def yaml_documents(draw: st.DrawFn) -> str:
    lines: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["mapping", "mapping", "mapping", "other"]))
        if kind == "mapping":
            indent = draw(st.sampled_from(["", "", " ", "\t"]))
            sep = draw(st.sampled_from([": ", ":", " : ", ":\t", ":  "]))
            lines.append(indent + draw(_YAML_KEYS) + sep + draw(_YAML_VALUES))
        else:
            lines.append(draw(st.sampled_from(["---", "...", "# c", "", "  ", "\u2028", "\x0c"])))
    return draw(st.sampled_from(["\n", "\r\n", "\r"])).join(lines)


def _refused_as_yaml(text: str, name: str) -> None:
    path = scratch() / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_racks_file(path)
    assert str(err.value) == (
        f"racks file {path} is YAML, which is not read: write the same mapping as a JSON "
        'object {"<bookie>": "</rack>"} in a .json file'
    )


@fuzz_settings(200)
@given(yaml_documents(), st.sampled_from(["racks.yaml", "racks.yml", "r.YAML"]))
def test_yaml_documents(text: str, name: str) -> None:
    """What the YAML reader used to take (or refuse) is now refused, unread, by its name."""
    run(racks, text.encode())
    _refused_as_yaml(text, name)


@fuzz_settings(200)
@given(st.lists(st.one_of(LOCATIONS, TEXT), max_size=6), st.sampled_from([" ", "\n", "\t", "\r\n"]))
def test_script_output(tokens: list[str], sep: str) -> None:
    run(racks, sep.join(tokens).encode())


@fuzz_settings(200)
@given(st.text(st.sampled_from(["/", " ", "\t", "\u2028", "a", "b"]), max_size=12))
def test_normalize_location_is_idempotent(raw: str) -> None:
    loc = normalize_location(raw)
    assert loc is None or (normalize_location(loc) == loc and loc.startswith("/"))


def test_location_ending_in_space_and_slash() -> None:
    """Found by atheris (fuzz_racks): `a: r1 /` read as the location '/r1 '."""
    assert parse_json_racks('{"a": "r1 /", "b": "r2/ /"}', "f") == {"a": "/r1", "b": "/r2"}


# --- round trips: a mapping written in each format reads back normalised ---------------------

_PLAIN_KEYS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,15}", fullmatch=True)
_PLAIN_LOCATIONS = st.from_regex(r"/?[a-z0-9][a-z0-9/._-]{0,10}", fullmatch=True)


def _expected(mapping: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, raw in mapping.items():
        loc = normalize_location(raw)
        if loc is not None:
            out[key] = loc
    return out


@fuzz_settings(150)
@given(st.dictionaries(KEYS, LOCATIONS, max_size=6))
def test_json_round_trip_and_quoted_yaml_refused(mapping: dict[str, str]) -> None:
    # Keys are stripped: no bookie id or host has spaces.
    expected = {k.strip(): v for k, v in _expected(mapping).items()}
    assert parse_json_racks(json.dumps(mapping), "f") == expected
    yaml_text = "".join(f"{json.dumps(k)}: {json.dumps(v)}\n" for k, v in mapping.items())
    _refused_as_yaml(yaml_text, "racks.yaml")


@fuzz_settings(150)
@given(st.dictionaries(_PLAIN_KEYS, _PLAIN_LOCATIONS, max_size=6))
def test_plain_yaml_refused_and_the_same_json_read(mapping: dict[str, str]) -> None:
    text = "---\n" + "".join(f"{k}: {v}  # rack of {k}\n" for k, v in mapping.items())
    _refused_as_yaml(text, "racks.yml")
    path = scratch() / "racks.json"
    path.write_text(json.dumps(mapping))
    assert dict(load_racks_file(path).by_key) == _expected(mapping)


_LEVEL = st.from_regex(r"[A-Za-z0-9._-]{1,8}", fullmatch=True)


@fuzz_settings(150)
@given(
    st.integers(1, 3).flatmap(
        lambda depth: st.lists(
            st.tuples(st.lists(_LEVEL, min_size=depth, max_size=depth), st.booleans()),
            max_size=6,
        )
    ),
    st.sampled_from([" ", "\n", "\t", "\r\n"]),
)
def test_script_output_round_trip(answers: list[tuple[list[str], bool]], sep: str) -> None:
    """Locations of one depth, some with BookKeeper's one trailing `/`, read back normalised."""
    printed = ["/" + "/".join(levels) + ("/" if slash else "") for levels, slash in answers]
    expected = ["/" + "/".join(levels) for levels, _ in answers]
    assert parse_script_output(sep.join(printed) + "\n", len(printed)) == expected


@fuzz_settings(150)
@given(st.dictionaries(KEYS, st.dictionaries(KEYS, LOCATIONS, max_size=3), max_size=3))
def test_pulsar_round_trip(groups: dict[str, dict[str, str]]) -> None:
    doc = {g: {b: {"rack": r} for b, r in bookies.items()} for g, bookies in groups.items()}
    expected: dict[str, str] = {}
    for bookies in groups.values():
        for bookie, loc in _expected(bookies).items():
            expected.setdefault(bookie, loc)
    assert dict(parse_pulsar_racks(json.dumps(doc).encode(), "/bookies").by_key) == expected
