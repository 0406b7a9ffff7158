"""`metadataServiceUri`: BookKeeper's `zk://` and Pulsar's `metadata-store:` forms, as the
Java nodes read them, through the parser, the CLI's flags and the daemon's layers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from auditor.cli.cluster import target_from_args
from auditor.cli.main import main
from auditor.daemon.config import load_daemon_config
from auditor.errors import ConfigError
from auditor.metadata.layout import LedgerManager
from auditor.metadata.service_uri import (
    IGNORED_SHOWN,
    MetadataDriver,
    MetadataServiceUri,
    describe_ignored,
    parse_metadata_service_uri,
)
from auditor.store import StoreKind

BK = MetadataDriver.BOOKKEEPER
PULSAR = MetadataDriver.PULSAR
BK_ETCD = MetadataDriver.ETCD
ETCD = StoreKind.ETCD
ALL_PULSAR_KEYS = (
    "allowReadOnlyOperations=TRUE&batchingEnabled=false&batchingMaxDelayMillis=0"
    "&batchingMaxOperations=1000&batchingMaxSizeKb=128&configFilePath=%2Fetc%2Fstore.yaml"
    "&fsyncEnable=False&numSerDesThreads=2&sessionTimeoutMillis=%2B5000"
)


def pulsar(
    hosts: str, timeout: int | None = None, ignored: tuple[str, ...] = ()
) -> MetadataServiceUri:
    return MetadataServiceUri(hosts, "/ledgers", None, PULSAR, timeout, ignored)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        # Pulsar's docker-compose and Docker docs.
        ("metadata-store:zk:zookeeper:2181", pulsar("zookeeper:2181")),
        # Pulsar's metadata-store migration docs: the ledgers are at /ledgers/ledgers.
        ("metadata-store:zk:my-zk-1:2181/ledgers", pulsar("my-zk-1:2181/ledgers")),
        (
            "metadata-store:zk:zk1:2181,zk2:2181,zk3:2181/ledgers",
            pulsar("zk1:2181,zk2:2181,zk3:2181/ledgers"),
        ),
        ("metadata-store:zk:zk1:2181;zk2:2181/pulsar", pulsar("zk1:2181,zk2:2181/pulsar")),
        # Pulsar's Helm chart: the connect string, then the metadata prefix.
        (
            "metadata-store:zk:pulsar-zookeeper:2181/my-prefix",
            pulsar("pulsar-zookeeper:2181/my-prefix"),
        ),
        # No store prefix: Pulsar hands the rest to ZooKeeper as it stands.
        ("metadata-store:zookeeper:2181", pulsar("zookeeper:2181")),
        ("metadata-store:zk:h:2181/", pulsar("h:2181")),
        (" metadata-store:zk: h1:2181 ,, h2 ;/a/b ", pulsar("h1:2181,h2/a/b")),
        (
            "metadata-store:zk:[::1]:2181,10.0.0.1:2182/pulsar/c1",
            pulsar("[::1]:2181,10.0.0.1:2182/pulsar/c1"),
        ),
        (
            "metadata-store:zk:h:2181/pulsar?sessionTimeoutMillis=30000",
            pulsar("h:2181/pulsar", 30000),
        ),
        (
            f"metadata-store:zk:h:2181?{ALL_PULSAR_KEYS}",
            pulsar(
                "h:2181",
                5000,
                (
                    "allowReadOnlyOperations",
                    "batchingEnabled",
                    "batchingMaxDelayMillis",
                    "batchingMaxOperations",
                    "batchingMaxSizeKb",
                    "configFilePath",
                    "fsyncEnable",
                    "numSerDesThreads",
                ),
            ),
        ),
        # Unknown keys: named once each, decoded as Java's URLDecoder does.
        (
            "metadata-store:zk:h:2181?foo=1&&bar&foo=2&x%20y+z=v&=v&",
            pulsar("h:2181", None, ("foo", "bar", "x y z", "=v")),
        ),
        (
            "metadata-store:zk:h:2181?sessionTimeoutMillis=1&sessionTimeoutMillis=2",
            pulsar("h:2181", 2),
        ),
        ("metadata-store:zk:h:2181/c?", pulsar("h:2181/c")),
        # BookKeeper's own driver: the path is the ledgers root.
        (
            "zk+hierarchical://h1:2181;h2:2181/ledgers",
            MetadataServiceUri("h1:2181,h2:2181", "/ledgers", LedgerManager.HIERARCHICAL, BK),
        ),
        (
            "zk://zk:2181/pulsar/ledgers",
            MetadataServiceUri("zk:2181", "/pulsar/ledgers", None, BK),
        ),
        (
            "zk+longhierarchical://zk:2181",
            MetadataServiceUri("zk:2181", "/ledgers", LedgerManager.LONG_HIERARCHICAL, BK),
        ),
        ("zk+null://zk/", MetadataServiceUri("zk", "/ledgers", None, BK)),
        (
            "zk+flat://h:2181/a/b/?x=1&y#frag",
            MetadataServiceUri("h:2181", "/a/b", LedgerManager.FLAT, BK, None, ("x", "y")),
        ),
    ],
)
def test_accepted_forms(uri: str, expected: MetadataServiceUri) -> None:
    assert parse_metadata_service_uri(uri) == expected


def pulsar_etcd(
    endpoints: str,
    timeout: int | None = None,
    ignored: tuple[str, ...] = (),
    config: str | None = None,
) -> MetadataServiceUri:
    return MetadataServiceUri(endpoints, "/ledgers", None, PULSAR, timeout, ignored, ETCD, config)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        # Pulsar's docs: an endpoint without a scheme takes the previous one's.
        (
            "metadata-store:etcd:http://h1:2379,h2:2379",
            pulsar_etcd("http://h1:2379,http://h2:2379"),
        ),
        ("metadata-store:etcd:h1", pulsar_etcd("http://h1:2379")),
        (
            "metadata-store:etcd:https://e1:2379;https://e2:2380/",
            pulsar_etcd("https://e1:2379,https://e2:2380"),
        ),
        (
            "metadata-store:etcd:http://h:2379?sessionTimeoutMillis=6000&configFilePath=%2Fetc%2Fetcd.yaml&batchingEnabled=false",
            pulsar_etcd("http://h:2379", 6000, ("batchingEnabled",), "/etc/etcd.yaml"),
        ),
        # BookKeeper's own etcd driver: the path is the scope, each host an http endpoint.
        (
            "etcd://h1:2379;h2:2379/ledgers",
            MetadataServiceUri(
                "http://h1:2379,http://h2:2379",
                "/ledgers",
                LedgerManager.ETCD,
                BK_ETCD,
                None,
                (),
                ETCD,
            ),
        ),
        (
            "etcd://h:2379",
            MetadataServiceUri(
                "http://h:2379", "/ledgers", LedgerManager.ETCD, BK_ETCD, None, (), ETCD
            ),
        ),
        (
            "etcd://h:2379/bk/scope?x=1",
            MetadataServiceUri(
                "http://h:2379", "/bk/scope", LedgerManager.ETCD, BK_ETCD, None, ("x",), ETCD
            ),
        ),
    ],
)
def test_accepted_etcd_forms(uri: str, expected: MetadataServiceUri) -> None:
    parsed = parse_metadata_service_uri(uri)
    assert parsed == expected
    assert parsed.driver.marks is (expected.driver is not BK_ETCD)


NOT_ZK = "is not supported (bk-auditor speaks ZooKeeper and etcd only)"
FORMS = (
    "give zk[+MANAGER]://HOST:PORT[;HOST:PORT...]/LEDGERS_ROOT, etcd://HOST:PORT[;...]/SCOPE, "
    "metadata-store:zk:HOST:PORT[,...][/CHROOT] or metadata-store:etcd:http://HOST:PORT[,...]"
)


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("metadata-store:oxia://oxia:6648/bookkeeper", f"the Oxia metadata store {NOT_ZK}"),
        ("metadata-store:rocksdb:/data/store", f"the RocksDB metadata store {NOT_ZK}"),
        ("metadata-store:memory:local", f"the memory metadata store {NOT_ZK}"),
        (
            "metadata-store:etcd:http://h:2379/pulsar",
            "etcd endpoint 'http://h:2379/pulsar' has a path: Pulsar's etcd store has no "
            "chroot (its keys are the full paths)",
        ),
        (
            "metadata-store:etcd:ftp://h:2379",
            "etcd endpoint 'ftp://h:2379' is not http:// or https://",
        ),
        ("metadata-store:etcd:", "no etcd endpoint (give http://HOST:PORT[,HOST:PORT...])"),
        (
            "etcd+flat://h:2379/ledgers",
            "etcd:// takes no ledger manager type ('flat'): its ledger manager is the etcd "
            "driver's own",
        ),
        ("etcd:///ledgers", "no etcd host (give HOST:PORT[,HOST:PORT...])"),
        (
            "metadata-store:zk://h:2181/pulsar",
            "Pulsar does not accept 'zk://' (ZooKeeper would read '//...' as a chroot and "
            "find no host); write metadata-store:zk:HOST:PORT[,...][/CHROOT]",
        ),
        (
            "metadata-store:consul://h:8500",
            "unknown metadata store 'consul' (bk-auditor speaks ZooKeeper and etcd only: "
            "metadata-store:zk:HOST:PORT[,...][/CHROOT])",
        ),
        ("http://x/y", f"unsupported metadata service scheme 'http'; {FORMS}"),
        ("nonsense", f"not a metadata service URI; {FORMS}"),
        ("ZK://h:2181/ledgers", f"not a metadata service URI; {FORMS}"),
        (
            "zk+ms://h:2181/ledgers",
            "unsupported ledger manager type 'ms' "
            "(flat, legacyhierarchical, hierarchical, longhierarchical)",
        ),
    ],
)
def test_refused_stores_and_schemes(uri: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_metadata_service_uri(uri)
    assert str(caught.value) == f"metadataServiceUri '{uri}': {reason}"


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("batchingEnabled", "query parameter 'batchingEnabled' needs a value (key=value)"),
        ("a=1&sessionTimeoutMillis", "query parameter 'sessionTimeoutMillis' needs a value"),
        ("sessionTimeoutMillis=0", "'sessionTimeoutMillis' must be greater than 0, got '0'"),
        ("sessionTimeoutMillis=", "'sessionTimeoutMillis' must be an integer, got ''"),
        ("sessionTimeoutMillis=+", "'sessionTimeoutMillis' must be an integer, got ' '"),
        ("sessionTimeoutMillis=%2B", "'sessionTimeoutMillis' must be an integer, got '+'"),
        ("sessionTimeoutMillis=%201", "'sessionTimeoutMillis' must be an integer, got ' 1'"),
        ("sessionTimeoutMillis=1_000", "'sessionTimeoutMillis' must be an integer, got '1_000'"),
        (
            "sessionTimeoutMillis=2147483648",
            "'sessionTimeoutMillis' must be an integer, got '2147483648'",
        ),
        ("numSerDesThreads=-1", "'numSerDesThreads' must be greater than 0, got '-1'"),
        ("batchingMaxSizeKb=0", "'batchingMaxSizeKb' must be greater than 0, got '0'"),
        ("batchingMaxOperations=x", "'batchingMaxOperations' must be an integer, got 'x'"),
        ("batchingMaxDelayMillis=-1", "'batchingMaxDelayMillis' must be >= 0, got '-1'"),
        ("fsyncEnable=yes", "'fsyncEnable' must be true or false, got 'yes'"),
        ("allowReadOnlyOperations=1", "'allowReadOnlyOperations' must be true or false, got '1'"),
        ("%zz=1", "query parameter '%zz=1' has a broken %-escape"),
        ("sessionTimeoutMillis=5%", "query parameter 'sessionTimeoutMillis=5%' has a broken"),
    ],
)
def test_known_query_keys_are_validated_as_pulsar_does(query: str, reason: str) -> None:
    uri = f"metadata-store:zk:h:2181/c?{query}"
    with pytest.raises(ConfigError) as caught:
        parse_metadata_service_uri(uri)
    message = str(caught.value)
    assert message.startswith(f"metadataServiceUri '{uri}': ")
    assert reason in message


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("metadata-store:zk:", "no ZooKeeper host (give HOST:PORT[,HOST:PORT...])"),
        ("metadata-store:", "no ZooKeeper host (give HOST:PORT[,HOST:PORT...])"),
        ("metadata-store:zk: , ;/pulsar", "no ZooKeeper host (give HOST:PORT[,HOST:PORT...])"),
        ("zk://,", "no ZooKeeper host (give HOST:PORT[,HOST:PORT...])"),
        (
            "metadata-store:zk:h:99999",
            "ZooKeeper host 'h:99999' is not HOST[:PORT] with a port 1..65535",
        ),
        (
            "metadata-store:zk:h:0/c",
            "ZooKeeper host 'h:0' is not HOST[:PORT] with a port 1..65535",
        ),
        (
            "metadata-store:zk:h1:2181,h 2:2181",
            "ZooKeeper host 'h 2:2181' is not HOST[:PORT] with a port 1..65535",
        ),
        (
            "metadata-store:zk:h:port",
            "ZooKeeper host 'h:port' is not HOST[:PORT] with a port 1..65535",
        ),
        (
            "metadata-store:zk:::1:2181",
            "ZooKeeper host '::1:2181' is not HOST[:PORT] with a port 1..65535",
        ),
        (
            "zk://h:2181:2182/ledgers",
            "ZooKeeper host 'h:2181:2182' is not HOST[:PORT] with a port 1..65535",
        ),
        (
            "metadata-store:zk:h:2181/pulsar/",
            "chroot '/pulsar/' is not a ZooKeeper path: it ends with '/'",
        ),
        (
            "metadata-store:zk:h:2181//a",
            "chroot '//a' is not a ZooKeeper path: it has an empty name",
        ),
        (
            "metadata-store:zk:h:2181/a/../b",
            "chroot '/a/../b' is not a ZooKeeper path: it has a relative name ('.' or '..')",
        ),
        (
            "metadata-store:zk:h:2181/a\x01",
            "chroot '/a\\x01' is not a ZooKeeper path: it has a character ZooKeeper refuses",
        ),
        (
            "metadata-store:zk:h:2181/\U0001f600",
            "chroot '/\U0001f600' is not a ZooKeeper path: it has a character ZooKeeper refuses",
        ),
        (
            "zk://h:2181//ledgers",
            "ledgers root '//ledgers' is not a ZooKeeper path: it has an empty name",
        ),
    ],
)
def test_hosts_and_paths_are_checked(uri: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_metadata_service_uri(uri)
    assert str(caught.value) == f"metadataServiceUri {uri.strip()!r}: {reason}"


def test_an_empty_uri_and_an_over_long_one_are_one_bounded_line() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_metadata_service_uri("  ", label="--metadata-service-uri")
    assert str(caught.value) == f"--metadata-service-uri is empty: {FORMS}"
    long_uri = "metadata-store:oxia:" + "h" * 10_000
    with pytest.raises(ConfigError) as caught:
        parse_metadata_service_uri(long_uri)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 300
    assert message.endswith(f"(10020 characters): the Oxia metadata store {NOT_ZK}")


def test_ignored_names_make_one_bounded_line() -> None:
    assert describe_ignored(("batchingEnabled", "foo")) == (
        "ignoring metadataServiceUri parameters 'batchingEnabled', 'foo': "
        "they tune the Java client only"
    )
    names = tuple(f"k{i}" for i in range(IGNORED_SHOWN + 3))
    line = describe_ignored(names)
    assert line == (
        "ignoring metadataServiceUri parameters "
        + ", ".join(f"'k{i}'" for i in range(IGNORED_SHOWN))
        + " and 3 more: they tune the Java client only"
    )
    assert len(describe_ignored(("x" * 5000,))) < 200


# --- the CLI ---------------------------------------------------------------------------


def test_cli_target_of_a_metadata_store_uri(capsys: pytest.CaptureFixture[str]) -> None:
    target = target_from_args(
        None, None, "metadata-store:zk:zk1:2181;zk2:2181/pulsar?sessionTimeoutMillis=9", 5.0
    )
    assert (target.hosts, target.root, target.manager, target.driver) == (
        "zk1:2181,zk2:2181/pulsar",
        "/ledgers",
        None,
        PULSAR,
    )
    assert capsys.readouterr().err == ""  # nothing ignored, nothing said
    # --ledgers-root wins over the URI's root, as for BookKeeper's URIs (inside the chroot).
    target = target_from_args(
        "ignored:2181", "/bk/", "metadata-store:zk:zk1:2181/pulsar?batchingEnabled=true&x=1", 5.0
    )
    assert (target.hosts, target.root, target.driver) == ("zk1:2181/pulsar", "/bk", PULSAR)
    assert capsys.readouterr().err == (
        "bk-auditor: note: ignoring metadataServiceUri parameters 'batchingEnabled', 'x': "
        "they tune the Java client only\n"
    )
    target = target_from_args(None, None, "zk+flat://h:2181/bkroot", 5.0)
    assert (target.hosts, target.root, target.manager, target.driver) == (
        "h:2181",
        "/bkroot",
        LedgerManager.FLAT,
        BK,
    )
    assert target_from_args("h:2181", None, None, 5.0).driver is BK
    with pytest.raises(ConfigError, match=r"^--ledgers-root must be an absolute path, got 'x'$"):
        target_from_args(None, "x", "metadata-store:zk:h:2181", 5.0)


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("metadata-store:oxia://oxia:6648/bookkeeper", f"the Oxia metadata store {NOT_ZK}"),
        ("metadata-store:rocksdb:/data/store", f"the RocksDB metadata store {NOT_ZK}"),
        ("metadata-store:memory:local", f"the memory metadata store {NOT_ZK}"),
        ("metadata-store:etcd:http://h:2379/x", "etcd endpoint 'http://h:2379/x' has a path"),
        ("metadata-store:consul://h:8500", "unknown metadata store 'consul' (bk-auditor"),
        ("ftp://h/x", "unsupported metadata service scheme 'ftp'"),
        (
            "metadata-store:zk:h:2181?sessionTimeoutMillis=-5",
            "query parameter 'sessionTimeoutMillis' must be greater than 0, got '-5'",
        ),
    ],
)
@pytest.mark.parametrize("command", ["ledgers", "bookies", "check"])
def test_cli_refuses_with_one_line_and_exit_2(
    command: str, uri: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, "--metadata-service-uri", uri, "--timeout", "1"]
    if command == "check":
        argv[1:1] = ["all"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"bk-auditor: error: --metadata-service-uri '{uri}': {reason}")
    assert "Traceback" not in captured.err


def test_cli_subprocess_refusal_is_one_line_without_traceback() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "auditor",
            "ledgers",
            "--metadata-service-uri",
            "metadata-store:oxia://h:6648",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        "bk-auditor: error: --metadata-service-uri 'metadata-store:oxia://h:6648': "
        f"the Oxia metadata store {NOT_ZK}\n"
    )


# --- the daemon's layers ---------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_daemon_uri_from_toml(tmp_path: Path) -> None:
    toml = write(
        tmp_path,
        "auditor.toml",
        "[daemon]\n"
        'metadata_service_uri = "metadata-store:zk:zk1:2181;zk2:2181/pulsar'
        '?sessionTimeoutMillis=45000&batchingEnabled=false&foo=1"\n'
        "zk_session_timeout = 7.5\n",  # the same layer: the URI wins, as for zk
    )
    cfg = load_daemon_config(toml, env={}, hostname="h")
    assert (cfg.daemon.zk, cfg.daemon.ledgers_root) == ("zk1:2181,zk2:2181/pulsar", "/ledgers")
    assert cfg.metadata_driver is PULSAR
    assert cfg.ledger_manager is None
    assert cfg.daemon.zk_session_timeout == 45.0
    assert cfg.uri_ignored == ("batchingEnabled", "foo")
    assert cfg.origin("daemon.zk") == toml
    assert cfg.origin("daemon.zk_session_timeout") == toml


def test_daemon_uri_from_env_and_a_higher_session_timeout() -> None:
    env = {
        "BK_AUDITOR_DAEMON_METADATA_SERVICE_URI": "metadata-store:zk:zk-env:2181"
        "?sessionTimeoutMillis=20000",
    }
    cfg = load_daemon_config(None, ["daemon.zk_session_timeout=3"], env=env, hostname="h")
    assert (cfg.daemon.zk, cfg.daemon.ledgers_root) == ("zk-env:2181", "/ledgers")
    assert cfg.metadata_driver is PULSAR
    assert cfg.daemon.zk_session_timeout == 3.0  # --set ranks above the environment
    assert cfg.origin("daemon.zk_session_timeout") == "--set"
    cfg = load_daemon_config(None, ["zkTimeout=4000"], env=env, hostname="h")
    assert cfg.daemon.zk_session_timeout == 20.0  # the URI beats zkTimeout, as in Pulsar
    assert cfg.origin("daemon.zk_session_timeout") == (
        "environment BK_AUDITOR_DAEMON_METADATA_SERVICE_URI"
    )
    env["BK_AUDITOR_DAEMON_METADATA_SERVICE_URI"] = "metadata-store:zk:zk-env:2181"
    cfg = load_daemon_config(None, ["zkTimeout=4000"], env=env, hostname="h")
    assert cfg.daemon.zk_session_timeout == 4.0  # no sessionTimeoutMillis: zkTimeout
    assert cfg.uri_ignored == ()


def test_daemon_uri_from_bk_server_conf(tmp_path: Path) -> None:
    bk = write(
        tmp_path,
        "bk_server.conf",
        "zkServers=ignored:2181\n"
        "zkLedgersRootPath=/ignored\n"
        "zkTimeout=30000\n"
        "metadataServiceUri=metadata-store:zk:zk1:2181,zk2:2181/pulsar/c1\n"
        "bookieId=bookie-1\n",
    )
    cfg = load_daemon_config(None, env={}, bk_conf=bk, hostname="h")
    assert (cfg.daemon.zk, cfg.daemon.ledgers_root) == ("zk1:2181,zk2:2181/pulsar/c1", "/ledgers")
    assert cfg.metadata_driver is PULSAR
    assert cfg.daemon.zk_session_timeout == 30.0
    assert cfg.origin("daemon.zk") == f"{bk}:4 metadataServiceUri"
    # A higher layer's zk wins; the driver is still what the Java nodes run.
    cfg = load_daemon_config(None, ["daemon.zk=zk-set:2181"], env={}, bk_conf=bk, hostname="h")
    assert (cfg.daemon.zk, cfg.daemon.ledgers_root) == ("zk-set:2181", "/ledgers")
    assert cfg.metadata_driver is PULSAR


def test_daemon_refuses_another_store_naming_key_and_origin(tmp_path: Path) -> None:
    bk = write(tmp_path, "bk_server.conf", "metadataServiceUri=metadata-store:oxia://o:6648/bk\n")
    with pytest.raises(ConfigError) as caught:
        load_daemon_config(None, env={}, bk_conf=bk, hostname="h")
    assert str(caught.value) == (
        "daemon.metadata_service_uri: metadataServiceUri 'metadata-store:oxia://o:6648/bk': "
        f"the Oxia metadata store {NOT_ZK} (from {bk}:1 metadataServiceUri)"
    )


def test_a_driver_change_is_reported_on_reload() -> None:
    bk_cfg = load_daemon_config(None, ["daemon.metadata_service_uri=zk://h:2181"], env={})
    pulsar_cfg = load_daemon_config(
        None, ["daemon.metadata_service_uri=metadata-store:zk:h:2181"], env={}
    )
    assert (bk_cfg.metadata_driver, pulsar_cfg.metadata_driver) == (BK, PULSAR)
    assert bk_cfg.changed(pulsar_cfg) == ["daemon.metadata_service_uri"]
    again = load_daemon_config(
        None, ["daemon.metadata_service_uri=metadata-store:zk:h:2181?batchingEnabled=true"], env={}
    )
    assert again.uri_ignored == ("batchingEnabled",)
    assert pulsar_cfg.changed(again) == ["daemon.metadata_service_uri"]  # the text changed


def test_a_newline_in_an_etcd_endpoint_is_a_bad_host() -> None:
    """Found by the fuzzer: it was an AssertionError (a traceback) before."""
    with pytest.raises(ConfigError) as caught:
        parse_metadata_service_uri("metadata-store:etcd:0\n0")
    assert str(caught.value).endswith(": etcd host '0\\n0' is not HOST[:PORT] with a port 1..65535")
