"""The fuzz targets: one function per parser family, shared by hypothesis and atheris.

Each target takes arbitrary bytes and feeds them to the entry points of one
family of parsers. A parser may return a value or raise its module's typed
error (an `AuditorError`); the target swallows exactly that error and nothing
else, so any other exception escapes and is the crash the fuzzer reports.
When a value comes back, the target also checks what must hold for it: that
re-encoding it gives bytes that decode to the same value. That is how a parser
that accepts too much, or an encoder that cannot write what was read, shows up.

The same functions run under `make test` (tests/fuzz/test_*.py, with
hypothesis) and under atheris for long runs (fuzz/*.py), so a crash found by
either is reproduced by calling the target with the input.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import dataclasses
import functools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from google.protobuf.message import Message

from auditor.bookie.availability import Availability, AvailabilityFormatError
from auditor.bookie.protocol import (
    BookieProtocolError,
    FrameParser,
    Status,
    decode_entry_body,
    decode_request,
    decode_response,
    effective_status,
    verify_entry_body,
)
from auditor.bookie.results import LacRead
from auditor.config import AuditorConfig, load_config
from auditor.config.properties import parse_properties
from auditor.daemon.config import DaemonConfig, load_daemon_config
from auditor.daemon.config.identity import StaticHost
from auditor.errors import ConfigError
from auditor.metadata.etcd_config import read_etcd_config
from auditor.metadata.layout import LayoutError, parse_layout
from auditor.metadata.model import DigestType, LedgerMetadata
from auditor.metadata.records import (
    CheckKind,
    Cookie,
    RecordFormatError,
    decode_auditor_vote,
    decode_bookie_service_info,
    decode_check_ctime,
    decode_cookie,
    decode_lock_data,
    decode_rereplication_layout,
    decode_underreplicated_ledger,
    encode_auditor_vote,
    encode_bookie_service_info,
    encode_check_ctime,
    encode_cookie,
    encode_lock_data,
    encode_rereplication_layout,
    encode_underreplicated_ledger,
)
from auditor.metadata.serde import (
    FORMAT_VERSION_1,
    LedgerMetadataFormatError,
    decode_ledger_metadata,
    encode_ledger_metadata,
    read_format_version,
)
from auditor.metadata.service_uri import parse_metadata_service_uri
from auditor.metadata.textformat import (
    EscapeStyle,
    TextFormatError,
    escape_bytes,
    from_text,
    to_text,
    unescape_bytes,
)
from auditor.proto.data_formats_pb2 import (
    BookieServiceInfoFormat,
    CookieFormat,
    LedgerMetadataFormat,
    UnderreplicatedLedgerFormat,
)
from auditor.store import StoreKind
from auditor.topology.locations import location_depth, normalize_location, topology_location
from auditor.topology.racks import (
    RackSourceError,
    load_racks_file,
    parse_json_racks,
    parse_pulsar_racks,
    parse_script_output,
)
from tests.vectors import load

__all__ = [
    "LEDGER_ID",
    "TARGETS",
    "availability",
    "config",
    "config_layers",
    "frames",
    "layout",
    "ledger_metadata",
    "racks",
    "records",
    "seeds",
    "text_format",
]

#: The ledger id every metadata decode is asked for; errors must name it.
LEDGER_ID = 59


# --- ledger metadata (v1, v2, v3) and TextFormat --------------------------------------


def _as_rewritten(md: LedgerMetadata) -> LedgerMetadata:
    """What `md` reads back as after Java's serializer rewrote it (see encode_ledger_metadata).

    v2/v3 write a missing password as empty bytes with digest CRC32, and v2
    never writes the cToken.
    """
    if md.format_version == FORMAT_VERSION_1:
        return md
    if md.password is None:
        md = dataclasses.replace(md, password=b"", digest_type=DigestType.CRC32)
    if md.format_version == 2:
        md = dataclasses.replace(md, ctoken=None)
    return md


def ledger_metadata(data: bytes) -> None:
    """decode_ledger_metadata, and read_format_version, on any bytes."""
    try:
        version, offset = read_format_version(data, LEDGER_ID)
    except LedgerMetadataFormatError as e:
        assert e.ledger_id == LEDGER_ID
    else:
        assert 0 < offset <= len(data)
        assert -(2**31) <= version < 2**31
    try:
        md = decode_ledger_metadata(data, LEDGER_ID)
    except LedgerMetadataFormatError as e:
        assert e.ledger_id == LEDGER_ID
        return
    assert md.ledger_id == LEDGER_ID
    assert md.format_version in (1, 2, 3)
    # Whatever decodes can be written back in its own format, and reads back the same.
    rewritten = encode_ledger_metadata(md)
    assert decode_ledger_metadata(rewritten, LEDGER_ID) == _as_rewritten(md)


_TEXT_TYPES: tuple[type[Message], ...] = (
    LedgerMetadataFormat,
    CookieFormat,
    BookieServiceInfoFormat,  # a map field
    UnderreplicatedLedgerFormat,
)


def text_format(data: bytes) -> None:
    """from_text into several message types, and unescape_bytes, on any bytes."""
    for msg_type in _TEXT_TYPES:
        try:
            msg = from_text(data, msg_type)
        except TextFormatError:
            continue
        for style in EscapeStyle:
            assert from_text(to_text(msg, style=style), msg_type) == msg
    try:
        raw = unescape_bytes(data)
    except TextFormatError:
        return
    for style in EscapeStyle:
        assert unescape_bytes(escape_bytes(raw, style)) == raw


# --- ZooKeeper records and LAYOUT -----------------------------------------------------


def _cookie_as_rewritten(cookie: Cookie) -> Cookie:
    # Java's Cookie.toString writes every TextFormat cookie under layout 5.
    if cookie.layout_version >= 4:
        return dataclasses.replace(cookie, layout_version=5)
    return cookie


def records(data: bytes) -> None:
    """Every record decoder of auditor.metadata.records on the same bytes."""
    try:
        cookie = decode_cookie(data)
    except RecordFormatError:
        pass
    else:
        again = decode_cookie(encode_cookie(cookie))
        assert again == _cookie_as_rewritten(cookie)
    try:
        info = decode_bookie_service_info(data)
    except RecordFormatError:
        pass
    else:
        assert decode_bookie_service_info(encode_bookie_service_info(info)) == info
    try:
        mark = decode_underreplicated_ledger(data)
    except RecordFormatError:
        pass
    else:
        assert decode_underreplicated_ledger(encode_underreplicated_ledger(mark)) == mark
    try:
        rere = decode_rereplication_layout(data)
    except RecordFormatError:
        pass
    else:
        assert decode_rereplication_layout(encode_rereplication_layout(rere)) == rere
    for decode, encode in (
        (decode_auditor_vote, encode_auditor_vote),
        (decode_lock_data, encode_lock_data),
    ):
        try:
            bookie = decode(data)
        except RecordFormatError:
            continue
        if bookie is not None:
            assert decode(encode(bookie)) == bookie
    for kind in CheckKind:
        try:
            ctime = decode_check_ctime(kind, data)
        except RecordFormatError:
            continue
        assert decode_check_ctime(kind, encode_check_ctime(kind, ctime)) == ctime


def layout(data: bytes) -> None:
    """parse_layout on the bytes, parse_metadata_service_uri on their text."""
    try:
        parsed = parse_layout(data)
    except LayoutError:
        pass
    else:
        assert parse_layout(parsed.encode()) == parsed
    text = data.decode("utf-8", "replace")
    try:
        uri = parse_metadata_service_uri(text)
    except ConfigError:
        return
    assert uri.ledgers_root.startswith("/")
    if uri.store is StoreKind.ETCD:
        # etcd endpoints: full URLs, no path (etcd has no chroot), none empty.
        for endpoint in uri.hosts.split(","):
            scheme, sep, rest = endpoint.partition("://")
            assert scheme in ("http", "https") and sep and rest and "/" not in rest
        return
    connect = uri.hosts.partition("/")[0]  # a metadata-store: chroot may hold ',' too
    assert connect and ";" not in connect and connect == connect.strip(",")


# --- bookie wire: frames, responses, availability, entry bodies ----------------------


def availability(data: bytes) -> None:
    """Availability.decode; what decodes re-encodes to its header and groups."""
    try:
        avail = Availability.decode(data)
    except AvailabilityFormatError:
        return
    n = avail.group_count
    assert avail.encode() == data[:8] + bytes(56) + data[64 : 64 + 24 * n]
    assert Availability.decode(avail.encode()) == avail
    assert avail.total >= 0


def _check_response(payload: bytes) -> None:
    try:
        resp = decode_response(payload)
    except BookieProtocolError:
        return
    assert isinstance(effective_status(resp), Status)
    if resp.HasField("getListOfEntriesOfLedgerResponse"):
        listing = resp.getListOfEntriesOfLedgerResponse
        if listing.HasField("availabilityOfEntriesOfLedger"):
            availability(listing.availabilityOfEntriesOfLedger)
    if resp.HasField("readLacResponse"):
        lac = resp.readLacResponse
        read = LacRead(
            lac.ledgerId,
            lac.lacBody if lac.HasField("lacBody") else None,
            lac.lastEntryBody if lac.HasField("lastEntryBody") else None,
        )
        assert read.explicit_lac is None or -(2**63) <= read.explicit_lac < 2**63
        assert read.last_entry is None or read.last_entry.ledger_id < 2**63
    if resp.HasField("readResponse") and resp.readResponse.HasField("body"):
        for digest in DigestType:
            try:
                decode_entry_body(resp.readResponse.body, digest)
                verify_entry_body(resp.readResponse.body, digest, b"pw")
            except BookieProtocolError:
                pass


def frames(data: bytes) -> None:
    """A byte stream through FrameParser in chunks, every payload through the decoders.

    The first byte picks the chunk size, so one input also covers how the
    stream is cut; the rest is the stream itself.
    """
    step = (data[0] if data else 0) + 1
    stream = data[1:]
    parser = FrameParser()
    payloads: list[bytes] = []
    try:
        for i in range(0, len(stream), step):
            payloads += parser.feed(stream[i : i + step])
    except BookieProtocolError:
        pass
    assert parser.buffered <= len(stream)
    for payload in [*payloads, stream]:
        _check_response(payload)
        with contextlib.suppress(BookieProtocolError):
            decode_request(payload)


# --- rack mappings ----------------------------------------------------------------------


def _assert_locations(locations: dict[str, str]) -> None:
    for loc in locations.values():
        assert normalize_location(loc) == loc, loc


def racks(data: bytes) -> None:
    """The three rack parsers (JSON, Pulsar znode, script output) on the same input.

    And the racks-file loader: the text as a JSON file is read or refused with
    its typed error; under a YAML name it is refused, unread, with a ConfigError.
    """
    text = data.decode("utf-8", "replace")
    with contextlib.suppress(RackSourceError):
        _assert_locations(parse_json_racks(text, "fuzz"))
    try:
        znode = parse_pulsar_racks(data, "/bookies")
    except RackSourceError:
        pass
    else:
        _assert_locations(dict(znode.by_key))
        _assert_locations(dict(znode.by_host))
    tokens = len(text.split())
    try:
        answers = parse_script_output(text, tokens)
    except RackSourceError:
        pass  # a location BookKeeper's topology would not take, or two depths
    else:
        # Every token was taken: each as the topology holds it, all of one depth.
        assert answers is not None and len(answers) == tokens
        assert all(topology_location(a) == a == normalize_location(a) for a in answers)
        assert len({location_depth(a) for a in answers}) <= 1
        assert parse_script_output(text, tokens + 1) is None
    path = scratch() / "racks.json"
    path.write_bytes(data)
    try:
        mapping = load_racks_file(path)
    except (ConfigError, RackSourceError):
        pass
    else:
        _assert_locations(dict(mapping.by_key))
    yaml_path = scratch() / "racks.yaml"
    yaml_path.write_bytes(data)
    try:
        load_racks_file(yaml_path)
    except ConfigError as exc:
        assert "is YAML, which is not read" in str(exc), exc
    else:
        raise AssertionError("a YAML racks file was read")


# --- configuration ----------------------------------------------------------------------

_ZK = {"BK_AUDITOR_DAEMON_ZK": "zk1:2181"}


@functools.cache
def scratch() -> Path:
    """A private directory for the files the config and racks targets write."""
    path = Path(tempfile.mkdtemp(prefix="bk-auditor-fuzz-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def _config_call(call: Callable[[], object]) -> None:
    try:
        result = call()
    except ConfigError:
        return
    assert isinstance(result, AuditorConfig | DaemonConfig)


def config_layers(toml: bytes, bk_conf: bytes, overrides: list[str], env: dict[str, str]) -> None:
    """Every config loader on these layers, alone and together; only ConfigError may escape."""
    toml_path = scratch() / "auditor.toml"
    toml_path.write_bytes(toml)
    conf_path = scratch() / "bk_server.conf"
    conf_path.write_bytes(bk_conf)
    props = parse_properties(bk_conf.decode("utf-8", "replace"))
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in props.items())
    host = "fuzz-host"
    facts = StaticHost(name=host)  # BookKeeper's identity rule never asks the real resolver
    _config_call(lambda: load_config(toml_path))
    _config_call(lambda: load_config(None, overrides))
    _config_call(lambda: load_config(toml_path, overrides))
    _config_call(lambda: load_daemon_config(str(toml_path), env=_ZK, hostname=host))
    _config_call(
        lambda: load_daemon_config(None, env={}, bk_conf=str(conf_path), hostname=host, host=facts)
    )
    _config_call(lambda: load_daemon_config(None, overrides, env=_ZK, hostname=host))
    _config_call(lambda: load_daemon_config(None, env={**_ZK, **env}, hostname=host, host=facts))
    _config_call(
        lambda: load_daemon_config(
            str(toml_path), overrides, env=env, bk_conf=str(conf_path), hostname=host, host=facts
        )
    )


def config(data: bytes) -> None:
    """The same bytes as a TOML file, a bk_server.conf, --set items and environment, and as
    Pulsar's etcd configuration file."""
    lines = [line for line in data.decode("utf-8", "replace").splitlines() if "\0" not in line]
    env = {f"BK_AUDITOR_{k}": v for k, _, v in (line.partition("=") for line in lines)}
    config_layers(data, data, lines, env)
    etcd_config(data)


def etcd_config(data: bytes) -> None:
    """read_etcd_config on the bytes as a file: options or a ConfigError, nothing else."""
    path = scratch() / "etcd.yaml"
    path.write_bytes(data)
    try:
        options = read_etcd_config(str(path))
    except ConfigError:
        return
    assert options.authority is None or 0 < len(options.authority) <= 260


def seeds(name: str) -> list[bytes]:
    """Valid inputs of a target, from the golden vectors: where a long fuzzing run starts."""
    metadata = load("ledger-metadata.json")
    ledgers = [base64.b64decode(v["base64"]) for v in metadata["vectors"]]
    by_target: dict[str, list[bytes]] = {
        "metadata": ledgers,
        "textformat": [d.split(b"\n", 1)[1] for d in ledgers if d.startswith(b"Bookie")][1:3],
        "records": [
            b'5\nbookieHost: "bk1:3181"\njournalDir: "1\\t/j"\nledgerDirs: "1\\t/l"\n',
            b"3\nbk1:3181\n1\t/j\n1\t/l\n",
            b'replica: "192.0.2.1:3181"\nctime: 1700000000000\n',
            b'type: "BASIC"\nversion: 1\n',
            b"\x08\x80\xd0\x95\xff\xbc\x31",
        ],
        "layout": [
            b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1",
            b"zk+hierarchical://h1:2181;h2:2181/ledgers",
        ],
        "availability": [
            Availability.from_entries(case["entries"]).encode()
            for case in load("availability.json")["encode"]
        ],
        "frames": [b"\x07" + bytes.fromhex(f["hex"]) for f in load("frames.json")["frames"]],
        "racks": [
            b'{"10.0.0.1:3181": "/r1", "bk-2": "r2/"}',
            b"---\n10.0.0.1:3181: /r1\n\"bk-2\": 'r2'  # quoted\n",
            b'{"default": {"10.0.0.1:3181": {"rack": "/r1", "hostname": "bk1"}}}',
            b"/r1 /r2\n/r3",
        ],
        "config": [
            b"[bookkeeper]\nzkTimeout = 5000\n[checks]\nretry_delay = 1.5\n"
            b'[daemon]\nzk = "h:2181"\n',
            b"metadataServiceUri=zk+hierarchical://h1:2181;h2:2181/ledgers\nbookiePort=3181\n",
            b"auditorPeriodicCheckInterval=60\ndaemon.engine=asyncio\nAPI_PORT=0\n",
        ],
    }
    return by_target[name]


#: Target name -> function, for the harnesses' target switch.
TARGETS: dict[str, Callable[[bytes], None]] = {
    "metadata": ledger_metadata,
    "textformat": text_format,
    "records": records,
    "layout": layout,
    "availability": availability,
    "frames": frames,
    "racks": racks,
    "config": config,
}
