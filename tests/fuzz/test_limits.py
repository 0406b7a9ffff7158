"""Crafted inputs at the limits: huge length fields, deep nesting, megabyte-sized text.

Random inputs almost never claim a length of 2^31 or nest a thousand levels
deep, so these cases are written out. Each parser must refuse a length field
before allocating what it claims (tracemalloc peak below ALLOCATION_LIMIT
for inputs of a few KB), must turn nesting into its typed error rather than a
RecursionError, and must stay linear on large inputs (a CPU-time bound far
above what linear work takes, far below what quadratic work takes).
"""

from __future__ import annotations

import contextlib
import functools
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from auditor.bookie.availability import Availability, AvailabilityFormatError
from auditor.bookie.protocol import (
    MAX_FRAME_SIZE,
    BookieProtocolError,
    FrameParser,
    decode_frame,
    decode_response,
)
from auditor.config import load_config
from auditor.config.properties import parse_properties
from auditor.daemon.config import load_daemon_config
from auditor.errors import AuditorError, ConfigError
from auditor.metadata.layout import LayoutError, parse_layout
from auditor.metadata.records import (
    CheckKind,
    RecordFormatError,
    decode_bookie_service_info,
    decode_check_ctime,
    decode_cookie,
)
from auditor.metadata.serde import HEADER_PREFIX, LedgerMetadataFormatError, decode_ledger_metadata
from auditor.metadata.service_uri import parse_metadata_service_uri
from auditor.metadata.textformat import TextFormatError, from_text
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.proto.data_formats_pb2 import LedgerMetadataFormat
from auditor.topology.racks import (
    RackSourceError,
    load_racks_file,
    parse_json_racks,
    parse_pulsar_racks,
    parse_script_output,
)
from tests.fuzz.support import ALLOCATION_LIMIT, cpu_limit, peak_allocation, varint

pytestmark = pytest.mark.fuzz

#: What a few KB of padding after a length field looks like.
PAD = bytes(range(256)) * 16


def _raises(error: type[BaseException], call: Callable[[], object]) -> None:
    with cpu_limit(), pytest.raises(error):
        call()


def _bounded(error: type[BaseException], call: Callable[[], object]) -> None:
    """`call` raises `error`, and allocates far less than any length field it read claims."""
    _raises(error, call)
    assert peak_allocation(call) < ALLOCATION_LIMIT


# --- length fields ----------------------------------------------------------------------

FRAME_LENGTHS = [MAX_FRAME_SIZE + 1, 2**31 - 1, 2**31, 2**32 - 1]


@pytest.mark.parametrize("length", FRAME_LENGTHS)
def test_frame_length_beyond_the_limit_allocates_nothing(length: int) -> None:
    frame = struct.pack(">I", length) + PAD
    _bounded(BookieProtocolError, lambda: FrameParser().feed(frame))
    _bounded(BookieProtocolError, lambda: decode_frame(frame))


def test_frame_announced_at_the_limit_is_not_preallocated() -> None:
    parser = FrameParser()
    frame_start = struct.pack(">I", MAX_FRAME_SIZE) + PAD
    assert peak_allocation(lambda: parser.feed(frame_start)) < ALLOCATION_LIMIT
    assert parser.buffered == len(frame_start)


@pytest.mark.parametrize("count", [2**31 - 1, 2**24, len(PAD) // 24 + 1])
def test_availability_group_count_beyond_the_data(count: int) -> None:
    data = struct.pack(">ii", 0, count) + bytes(56) + PAD
    _bounded(AvailabilityFormatError, lambda: Availability.decode(data))


def test_availability_inside_a_response_claiming_2_31_groups() -> None:
    resp = pb.Response(status=pb.EOK)
    resp.header.version = pb.VERSION_THREE
    resp.header.operation = pb.GET_LIST_OF_ENTRIES_OF_LEDGER
    resp.header.txnId = 1
    listing = resp.getListOfEntriesOfLedgerResponse
    listing.status = pb.EOK
    listing.ledgerId = 7
    listing.availabilityOfEntriesOfLedger = struct.pack(">ii", 0, 2**31 - 1) + bytes(56) + PAD
    decoded = decode_response(resp.SerializeToString())
    body = decoded.getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger
    _bounded(AvailabilityFormatError, lambda: Availability.decode(body))


@pytest.mark.parametrize("length", [2**31 - 1, 2**31, 2**32 - 1, 2**28, len(PAD) + 1])
def test_v3_metadata_length_varint(length: int) -> None:
    data = HEADER_PREFIX + b"3\n" + varint(length) + PAD
    _bounded(LedgerMetadataFormatError, lambda: decode_ledger_metadata(data, 1))


def test_v3_metadata_length_varint_of_eleven_bytes() -> None:
    data = HEADER_PREFIX + b"3\n" + b"\xff" * 10 + b"\x01" + PAD
    _bounded(LedgerMetadataFormatError, lambda: decode_ledger_metadata(data, 1))


# An embedded field (tag, wire type 2) whose length claims 2^31 - 1 bytes.
_HUGE_FIELD = b"\xff\xff\xff\xff\x07" + PAD


def test_v3_metadata_inner_field_length() -> None:
    body = b"\x32" + _HUGE_FIELD  # segment (6)
    data = HEADER_PREFIX + b"3\n" + varint(len(body)) + body
    _bounded(LedgerMetadataFormatError, lambda: decode_ledger_metadata(data, 1))


def test_binary_records_inner_field_length() -> None:
    _bounded(RecordFormatError, lambda: decode_bookie_service_info(b"\x32" + _HUGE_FIELD))
    _bounded(RecordFormatError, lambda: decode_bookie_service_info(b"\x3a" + _HUGE_FIELD))
    for kind in CheckKind:
        _bounded(
            RecordFormatError, functools.partial(decode_check_ctime, kind, b"\x0a" + _HUGE_FIELD)
        )


def test_response_inner_field_length() -> None:
    _bounded(BookieProtocolError, lambda: decode_response(b"\xe2\x06" + _HUGE_FIELD))


# --- nesting ----------------------------------------------------------------------------

DEEP = 100_000


@pytest.mark.parametrize("opening", [b"segment {", b"unknown {", b"unknown <", b"x: [{"])
def test_text_format_nesting(opening: bytes) -> None:
    _raises(TextFormatError, lambda: from_text(opening * DEEP, LedgerMetadataFormat))
    data = HEADER_PREFIX + b"2\n" + opening * DEEP
    _raises(LedgerMetadataFormatError, lambda: decode_ledger_metadata(data, 1))


def test_binary_group_nesting() -> None:
    groups = b"\x0b" * DEEP  # start-group of field 1, never closed
    data = HEADER_PREFIX + b"3\n" + varint(len(groups)) + groups
    _raises(LedgerMetadataFormatError, lambda: decode_ledger_metadata(data, 1))
    _raises(RecordFormatError, lambda: decode_bookie_service_info(groups))
    _raises(BookieProtocolError, lambda: decode_response(groups))


@pytest.mark.parametrize("text", ["[" * DEEP, '{"a":' * DEEP, "1" * 5000, "-" + "9" * 4400])
def test_json_racks_nesting_and_huge_numbers(text: str, tmp_path: Path) -> None:
    _raises(RackSourceError, lambda: parse_json_racks(text, "f"))
    _raises(RackSourceError, lambda: parse_pulsar_racks(text.encode(), "/bookies"))
    path = tmp_path / "racks.json"
    path.write_text(text)
    _raises(RackSourceError, lambda: load_racks_file(path))


def _toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "auditor.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "text",
    [
        "a = " + "[" * DEEP,
        "a = " + "[" * 2000 + "]" * 2000,
        "a = " + "{b = " * 2000 + "1" + "}" * 2000,
        "bookkeeper.zkTimeout" + ".a" * 2000 + " = 1",
        "[checks]\nretry_delay" + ".a" * 2000 + " = 1",
        "bookkeeper = 1",
        "checks = 'ab'",
        "bookkeeper = ['ab', 'cd']",
    ],
    ids=lambda t: t[:24],
)
def test_toml_nesting_and_non_tables(text: str, tmp_path: Path) -> None:
    path = _toml(tmp_path, text)
    _raises(ConfigError, lambda: load_config(path))
    _raises(ConfigError, lambda: load_daemon_config(path, env={}, hostname="h"))


@pytest.mark.parametrize(
    "text",
    [
        "[scan]\nspark_conf = [{a" + ".a" * 2000 + " = 1}]",
        "[scan]\nspark_conf = {spark.a = [{a" + ".a" * 2000 + " = 1}]}",
        "[api]\nport = [{a" + ".a" * 2000 + " = 1}]",
        "api = [{a" + ".a" * 2000 + " = 1}]",
    ],
    ids=lambda t: t[:24],
)
def test_toml_nesting_in_daemon_tables(text: str, tmp_path: Path) -> None:
    path = _toml(tmp_path, f'{text}\n[daemon]\nzk = "h:2181"\n')
    _raises(ConfigError, lambda: load_daemon_config(path, env={}, hostname="h"))


def test_toml_deep_spark_conf_is_flattened(tmp_path: Path) -> None:
    key = "spark" + ".a" * 2000
    path = _toml(tmp_path, f'[daemon]\nzk = "h:2181"\n[scan]\nspark_conf.{key} = "x"\n')
    with cpu_limit():
        assert dict(load_daemon_config(path, env={}, hostname="h").scan.spark_conf) == {key: "x"}


# --- size: linear work on megabyte inputs ------------------------------------------------


def _cpu_seconds(call: Callable[[], object]) -> float:
    start = time.process_time()
    with cpu_limit(30.0), contextlib.suppress(AuditorError):
        call()
    return time.process_time() - start


#: CPU seconds for a megabyte: linear parsers take a small fraction of this.
MEGABYTE_BOUND = 3.0


def test_properties_continuation_lines_are_linear() -> None:
    text = "key = " + "continued value of thirty ch\\\n" * 40_000  # 1.2 MB, one property
    assert _cpu_seconds(lambda: parse_properties(text)) < MEGABYTE_BOUND
    value = parse_properties(text)["key"]
    assert value == "continued value of thirty ch" * 40_000


def test_properties_continuation_semantics_kept() -> None:
    # The parity of a line's trailing backslashes decides, whatever the earlier lines held.
    text = "a=1\\\\\\\n  \\\\\nb=x\\\n\\\\\\\n  y\nc=\\\\\n"
    assert parse_properties(text) == {"a": "1\\\\", "b": "x\\y", "c": "\\"}


@pytest.mark.parametrize(
    "text",
    [
        "a" + ":a" * 500_000,
        "a: " + " " * 1_000_000 + "x",
        "a" + " :" * 500_000 + "\0",
        '"' + '\\"' * 500_000,
        "a: '" + "''" * 500_000 + " #",
        "-a" + " -" * 500_000,
        "k: /r\n" * 100_000,
    ],
    ids=lambda t: repr(t[:8]),
)
def test_yaml_racks_are_refused_unread(text: str, tmp_path: Path) -> None:
    """The megabyte YAML inputs the old reader had to stay linear on: refused by name, unread."""
    path = tmp_path / "racks.yaml"
    path.write_text(text)
    assert _cpu_seconds(lambda: load_racks_file(path)) < MEGABYTE_BOUND
    assert peak_allocation(lambda: load_racks_file(path)) < ALLOCATION_LIMIT
    _raises(ConfigError, lambda: load_racks_file(path))


@pytest.mark.parametrize(
    "text",
    [
        "/r " * 340_000,
        "/" + "a/" * 500_000,
        "/a" + "//" * 500_000,
        "/a\n" * 300_000 + "/b/c\n",
        "\n" * 1_000_000 + "x",
    ],
    ids=lambda t: repr(t[:8]),
)
def test_script_output_is_linear(text: str) -> None:
    """A megabyte of script output (the cap) is checked in linear time, valid or not."""
    assert _cpu_seconds(lambda: parse_script_output(text, 1)) < MEGABYTE_BOUND


def test_text_format_is_linear() -> None:
    many_fields = b"unknownField: 1 " * 60_000
    assert _cpu_seconds(lambda: from_text(many_fields, LedgerMetadataFormat)) < MEGABYTE_BOUND
    members = b"segment { ensembleMember: " + b'"192.0.2.1:3181" ' * 60_000 + b"}"
    assert _cpu_seconds(lambda: from_text(members, LedgerMetadataFormat)) < MEGABYTE_BOUND


@pytest.mark.parametrize(
    "call",
    [
        lambda: parse_layout(b"0" * 1_000_000 + b"2\nflat:1"),
        lambda: parse_layout(b"2\nflat:" + b"1" * 1_000_000),
        lambda: parse_metadata_service_uri("zk://" + "h" * 1_000_000 + "/x"),
        lambda: parse_metadata_service_uri("z" * 1_000_000),
        lambda: decode_cookie(b"5\n" + b"bookieHost: 'x' " * 30_000),
        lambda: decode_cookie(b"3\n" + b"x" * 1_000_000 + b"\nj\nl\n"),
    ],
)
def test_other_parsers_are_linear(call: Callable[[], object]) -> None:
    assert _cpu_seconds(call) < MEGABYTE_BOUND


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ("\u00b2\nflat:1", LayoutError),
        ("2\nflat:\u0663", LayoutError),
        ("0" * 4400 + "2\nflat:1", None),
        ("2\nflat:" + "9" * 11, LayoutError),
    ],
)
def test_layout_numbers(data: str, error: type[Exception] | None) -> None:
    if error is None:
        assert parse_layout(data.encode()).layout_version == 2
    else:
        _raises(error, lambda: parse_layout(data.encode()))
