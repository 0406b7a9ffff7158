"""Configuration: layers and precedence, bk_server.conf, BP-34 defaults, errors naming keys."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from auditor.checks.findings import Check
from auditor.config import (
    BookKeeperConfig,
    ChecksConfig,
    field_names,
    load_config,
    normalize_key,
)
from auditor.config.properties import parse_properties
from auditor.daemon.config import (
    DAEMON_PLACEMENT_INTERVAL,
    DAEMON_REPLICAS_INTERVAL,
    DEFAULT_API_PORT,
    ApiConfig,
    DaemonSection,
    LoggingConfig,
    MetricsConfig,
    ScanSection,
    load_daemon_config,
    validate_identity,
)
from auditor.daemon.config.identity import StaticHost
from auditor.errors import ConfigError
from auditor.logs import configure_logging, get_logger
from auditor.metadata.layout import LedgerManager
from auditor.metadata.model import DigestType

ZK = {"BK_AUDITOR_DAEMON_ZK": "zk1:2181"}
#: The machine's resolver is no part of these tests (BookKeeper's identity rule asks it).
HOST = StaticHost(name="bk-host", ip="10.1.2.3")


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# --- Java properties --------------------------------------------------------------


def test_properties_separators_comments_and_whitespace() -> None:
    text = (
        "# a comment\n"
        "! another comment\n"
        "\n"
        "   zkTimeout = 5000   \n"
        "bookiePort: 3182\n"
        "advertisedAddress    bk-1.example\n"
        "\tminNumRacksPerWriteQuorum=3\n"
        "empty=\n"
        "key==value\n"
        "spaced\\ key=v\n"
        "tab=a\\tb\\u0041\n"
        "trailing=x\\ \n"
    )
    assert parse_properties(text) == {
        "zkTimeout": "5000",
        "bookiePort": "3182",
        "advertisedAddress": "bk-1.example",
        "minNumRacksPerWriteQuorum": "3",
        "empty": "",
        "key": "=value",
        "spaced key": "v",
        "tab": "a\tbA",
        "trailing": "x ",
    }


def test_properties_continuation_lines() -> None:
    text = (
        "zkServers=zk1:2181,\\\n"
        "          zk2:2181,\\\r\n"
        "    zk3:2181\n"
        "# a comment ending in a backslash does not continue \\\n"
        "next=1\n"
        "even=a\\\\\n"
        "after=2\n"
        "last=end\\"
    )
    assert parse_properties(text) == {
        "zkServers": "zk1:2181,zk2:2181,zk3:2181",
        "next": "1",
        "even": "a\\",
        "after": "2",
        "last": "end",
    }


def test_properties_repeated_key_keeps_the_last() -> None:
    assert parse_properties("a=1\na=2\n") == {"a": "2"}


# --- layers -----------------------------------------------------------------------


def test_defaults_need_only_zookeeper() -> None:
    cfg = load_daemon_config(None, env=ZK, hostname="node-1")
    assert cfg.daemon == DaemonSection(
        identity=f"node-1:{DEFAULT_API_PORT}", zk="zk1:2181", zk_session_timeout=10.0
    )
    assert cfg.api == ApiConfig()
    assert cfg.metrics == MetricsConfig()
    assert cfg.logging == LoggingConfig(format="auto", level="info")
    assert cfg.checks == ChecksConfig()
    assert cfg.ledger_manager is None
    # BookKeeper's defaults except the BP-34 checks, which the daemon turns on.
    assert cfg.bookkeeper == BookKeeperConfig(
        auditorPeriodicPlacementPolicyCheckInterval=DAEMON_PLACEMENT_INTERVAL,
        auditorReplicasCheckInterval=DAEMON_REPLICAS_INTERVAL,
    )
    assert cfg.origin("daemon.zk") == "environment BK_AUDITOR_DAEMON_ZK"
    assert cfg.origin("api.port") == "default"


def test_zookeeper_is_required() -> None:
    with pytest.raises(ConfigError, match=r"^daemon\.zk is not set"):
        load_daemon_config(None, env={})


def test_precedence_defaults_bkconf_toml_env_set(tmp_path: Path) -> None:
    bk = write(
        tmp_path,
        "bk_server.conf",
        "zkServers=zk-bk:2181\n"
        "zkTimeout=1000\n"
        "auditorLedgerVerificationPercentage=10\n"
        "minNumRacksPerWriteQuorum=3\n"
        "lostBookieRecoveryDelay=60\n",
    )
    toml = write(
        tmp_path,
        "auditor.toml",
        "[bookkeeper]\n"
        "zkTimeout = 2000\n"
        "auditorLedgerVerificationPercentage = 20\n"
        "minNumRacksPerWriteQuorum = 4\n"
        "[checks]\nretry_delay = 1.5\nretry_attempts = 5\n"
        "[api]\nport = 7000\n"
        "[daemon]\njitter = 0.2\n",
    )
    env = {
        "BK_AUDITOR_BOOKKEEPER_ZKTIMEOUT": "3000",
        "BK_AUDITOR_BOOKKEEPER_MIN_NUM_RACKS_PER_WRITE_QUORUM": "5",
        "BK_AUDITOR_CHECKS_RETRY_DELAY": "2.5",
        "BK_AUDITOR_API_PORT": "7001",
        "BK_AUDITOR_DEBUG": "1",  # not configuration
        "BK_AUDITOR_API_TARGET": "h:1",  # the admin CLI's
        "PATH": "/usr/bin",
    }
    cfg = load_daemon_config(
        toml,
        ["minNumRacksPerWriteQuorum=6", "checks.retry_delay=3.5", "daemon.jitter=0.3"],
        env=env,
        bk_conf=bk,
        hostname="h",
        host=HOST,
    )
    bkc = cfg.bookkeeper
    assert bkc.lostBookieRecoveryDelay == 60  # bk_server.conf only
    assert bkc.auditorLedgerVerificationPercentage == 20  # TOML over bk_server.conf
    assert bkc.zkTimeout == 3000  # environment over TOML
    assert bkc.minNumRacksPerWriteQuorum == 6  # --set over everything
    assert cfg.checks.retry_attempts == 5
    assert cfg.checks.retry_delay == 3.5
    assert cfg.api.port == 7001
    assert cfg.daemon.jitter == 0.3
    assert cfg.daemon.zk == "zk-bk:2181"
    assert cfg.daemon.zk_session_timeout == 3.0  # follows zkTimeout
    assert cfg.origin("bookkeeper.lostBookieRecoveryDelay") == f"{bk}:5 lostBookieRecoveryDelay"
    assert cfg.origin("bookkeeper.auditorLedgerVerificationPercentage") == toml
    assert cfg.origin("bookkeeper.zkTimeout") == "environment BK_AUDITOR_BOOKKEEPER_ZKTIMEOUT"
    assert cfg.origin("bookkeeper.minNumRacksPerWriteQuorum") == "--set"
    assert cfg.files == (bk, toml)


def test_explicit_session_timeout_beats_zk_timeout() -> None:
    cfg = load_daemon_config(
        None, ["zkTimeout=4000", "daemon.zk_session_timeout=7.5"], env=ZK, hostname="h"
    )
    assert (cfg.bookkeeper.zkTimeout, cfg.daemon.zk_session_timeout) == (4000, 7.5)


def test_env_keys_match_ignoring_case_and_underscores() -> None:
    env = {
        **ZK,
        "BK_AUDITOR_BOOKKEEPER_ENFORCEMINNUMRACKSPERWRITEQUORUM": "true",
        "BK_AUDITOR_CHECKS_PROBEUNLISTABLE": "false",
        "BK_AUDITOR_API_TLS_CERT": "",
        "BK_AUDITOR_LOGGING_FORMAT": "JSON",
        "BK_AUDITOR_LOGGING_LEVEL": "Debug",
        "BK_AUDITOR_METRICS_ENABLED": "false",
    }
    cfg = load_daemon_config(None, env=env, hostname="h")
    assert cfg.bookkeeper.enforceMinNumRacksPerWriteQuorum is True
    assert cfg.checks.probe_unlistable is False
    assert cfg.logging == LoggingConfig(format="json", level="debug")
    assert cfg.logging.level_no == 10
    assert cfg.metrics.enabled is False


def test_env_spellings_never_collide_within_a_section() -> None:
    for cls in (
        BookKeeperConfig,
        ChecksConfig,
        DaemonSection,
        ApiConfig,
        MetricsConfig,
        ScanSection,
    ):
        names = [normalize_key(n) for n in field_names(cls)]
        assert len(names) == len(set(names)), cls


def test_env_unknown_key_and_duplicates_are_errors() -> None:
    with pytest.raises(ConfigError, match="BK_AUDITOR_API_PROT names no key of \\[api\\]"):
        load_daemon_config(None, env={**ZK, "BK_AUDITOR_API_PROT": "1"})
    with pytest.raises(ConfigError, match=r"both set bookkeeper\.zkTimeout"):
        load_daemon_config(
            None,
            env={
                **ZK,
                "BK_AUDITOR_BOOKKEEPER_ZKTIMEOUT": "1",
                "BK_AUDITOR_BOOKKEEPER_ZK_TIMEOUT": "2",
            },
        )


# --- bk_server.conf ---------------------------------------------------------------


def test_bk_conf_honours_bookkeeper_keys_and_ignores_the_rest(tmp_path: Path) -> None:
    bk = write(
        tmp_path,
        "bk_server.conf",
        "journalDirectories=/data/journal\n"  # one of hundreds we do not need
        "ledgerStorageClass=org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage\n"
        "metadataServiceUri=zk+hierarchical://zk1:2181;zk2:2181/pulsar/ledgers\n"
        "zkServers=ignored:2181\n"
        "zkLedgersRootPath=/ignored\n"
        "zkTimeout=30000\n"
        "auditorPeriodicCheckInterval=0\n"
        "auditorPeriodicBookieCheckInterval=3600\n"
        "auditorPeriodicPlacementPolicyCheckInterval=7200\n"
        "auditorReplicasCheckInterval=1800\n"
        "auditorLedgerVerificationPercentage=5\n"
        "lostBookieRecoveryDelay=120\n"
        "underreplicatedLedgerRecoveryGracePeriod=3600\n"
        "repairedPlacementPolicyNotAdheringBookieEnabled=TRUE\n"
        "ensemblePlacementPolicy=org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy\n"
        "minNumRacksPerWriteQuorum=3\n"
        "enforceMinNumRacksPerWriteQuorum=true\n"
        "auditorMaxNumberOfConcurrentOpenLedgerOperations=50\n"
        "networkTopologyScriptFileName=/etc/bookkeeper/topology.sh\n"
        "bookieId=\n",  # empty: unset
    )
    cfg = load_daemon_config(None, env={}, bk_conf=bk, hostname="bk-host", host=HOST)
    assert cfg.daemon.zk == "zk1:2181,zk2:2181"
    assert cfg.daemon.ledgers_root == "/pulsar/ledgers"
    assert cfg.ledger_manager is LedgerManager.HIERARCHICAL
    assert cfg.daemon.zk_session_timeout == 30.0
    assert cfg.bookkeeper == BookKeeperConfig(
        zkTimeout=30000,
        auditorPeriodicCheckInterval=0,
        auditorPeriodicBookieCheckInterval=3600,
        auditorPeriodicPlacementPolicyCheckInterval=7200,
        auditorReplicasCheckInterval=1800,
        auditorLedgerVerificationPercentage=5,
        lostBookieRecoveryDelay=120,
        underreplicatedLedgerRecoveryGracePeriod=3600,
        repairedPlacementPolicyNotAdheringBookieEnabled=True,
        ensemblePlacementPolicy="org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy",
        minNumRacksPerWriteQuorum=3,
        enforceMinNumRacksPerWriteQuorum=True,
        auditorMaxNumberOfConcurrentOpenLedgerOperations=50,
        networkTopologyScriptFileName="/etc/bookkeeper/topology.sh",
    )
    assert cfg.interval(Check.LEDGERS) == 0
    assert cfg.interval(Check.BOOKIES) == 3600
    assert cfg.interval(Check.PLACEMENT) == 7200
    assert cfg.interval(Check.GRACE) == 7200
    assert cfg.interval(Check.REPLICAS) == 1800
    # Beside a bookie without bookieId: what a Java AutoRecovery there would vote with,
    # the IP of the default interface (BookKeeper's rule), not the host name.
    assert cfg.daemon.identity == "10.1.2.3:3181"


def test_bk_conf_zk_servers_and_root_without_uri(tmp_path: Path) -> None:
    bk = write(
        tmp_path,
        "bk_server.conf",
        "zkServers=zk1:2181, zk2:2181 ,zk3:2181\nzkLedgersRootPath=/bk/ledgers/\n",
    )
    cfg = load_daemon_config(None, env={}, bk_conf=bk, hostname="h", host=HOST)
    assert cfg.daemon.zk == "zk1:2181,zk2:2181,zk3:2181"
    assert cfg.daemon.ledgers_root == "/bk/ledgers"
    assert cfg.ledger_manager is None


def test_uri_of_a_higher_layer_beats_zk_servers_and_the_reverse(tmp_path: Path) -> None:
    bk = write(tmp_path, "bk_server.conf", "zkServers=zk-bk:2181\nzkLedgersRootPath=/bkroot\n")
    cfg = load_daemon_config(
        None,
        env={"BK_AUDITOR_DAEMON_METADATA_SERVICE_URI": "zk+flat://zk-env:2181/envroot"},
        bk_conf=bk,
        host=HOST,
    )
    assert (cfg.daemon.zk, cfg.daemon.ledgers_root) == ("zk-env:2181", "/envroot")
    assert cfg.ledger_manager is LedgerManager.FLAT
    bk2 = write(tmp_path, "bk2.conf", "metadataServiceUri=zk://zk-bk:2181/bkroot\n")
    cfg = load_daemon_config(None, ["daemon.zk=zk-set:2181"], env={}, bk_conf=bk2, host=HOST)
    assert (cfg.daemon.zk, cfg.daemon.ledgers_root) == ("zk-set:2181", "/bkroot")
    assert cfg.origin("daemon.zk") == "--set"


def test_identity_from_bookie_id_or_advertised_address(tmp_path: Path) -> None:
    bk = write(tmp_path, "a.conf", "zkServers=zk:2181\nbookieId=bookie-7\nbookiePort=3182\n")
    assert load_daemon_config(None, env={}, bk_conf=bk).daemon.identity == "bookie-7"
    bk = write(
        tmp_path, "b.conf", "zkServers=zk:2181\nadvertisedAddress=10.0.0.7\nbookiePort=4181\n"
    )
    cfg = load_daemon_config(None, env={}, bk_conf=bk, hostname="ignored", host=HOST)
    assert cfg.daemon.identity == "10.0.0.7:4181"
    cfg = load_daemon_config(None, ["daemon.identity=auditor-a"], env={}, bk_conf=bk)
    assert cfg.daemon.identity == "auditor-a"
    cfg = load_daemon_config(None, ["api.port=9000"], env=ZK, hostname="pod-x")
    assert cfg.daemon.identity == "pod-x:9000"


@pytest.mark.parametrize(
    "identity", ["test", "1.2.3.4:1234", "this.is.an.hostname:1234", "a_b@c[d]", "x;y<z>?^"]
)
def test_identity_accepted_like_bookkeeper(identity: str) -> None:
    assert validate_identity(identity) == identity
    cfg = load_daemon_config(None, [f"daemon.identity={identity}"], env=ZK)
    assert cfg.daemon.identity == identity


@pytest.mark.parametrize("identity", ["non valid", "non$valid", "readonly", "ReadOnly", "", "a/b"])
def test_identity_rejected_like_bookkeeper(identity: str) -> None:
    with pytest.raises(ConfigError, match=r"daemon\.identity.*\(from --set\)"):
        load_daemon_config(None, [f"daemon.identity={identity}"], env=ZK)


def test_derived_identity_is_validated_too() -> None:
    with pytest.raises(ConfigError, match="derived from the host name"):
        load_daemon_config(None, env=ZK, hostname="bad host")


# --- BP-34 on by default ----------------------------------------------------------


def test_bp34_checks_on_by_default_only_in_the_daemon() -> None:
    one_shot = load_config(None)
    assert one_shot.bookkeeper.auditorPeriodicPlacementPolicyCheckInterval == 0
    assert one_shot.bookkeeper.auditorReplicasCheckInterval == 0
    cfg = load_daemon_config(None, env=ZK)
    assert cfg.interval(Check.PLACEMENT) == DAEMON_PLACEMENT_INTERVAL
    assert cfg.interval(Check.REPLICAS) == DAEMON_REPLICAS_INTERVAL
    assert cfg.interval(Check.GRACE) == 0  # no grace period configured
    assert cfg.origin("bookkeeper.auditorReplicasCheckInterval").startswith("daemon default")


@pytest.mark.parametrize("layer", ["bk_conf", "toml", "env", "set"])
def test_an_explicit_zero_from_any_layer_disables(tmp_path: Path, layer: str) -> None:
    keys = ("auditorPeriodicPlacementPolicyCheckInterval", "auditorReplicasCheckInterval")
    bk = toml = None
    env = dict(ZK)
    overrides: list[str] = []
    if layer == "bk_conf":
        bk = write(tmp_path, "bk.conf", "".join(f"{k}=0\n" for k in keys))
    elif layer == "toml":
        toml = write(tmp_path, "a.toml", "[bookkeeper]\n" + "".join(f"{k} = 0\n" for k in keys))
    elif layer == "env":
        env |= {f"BK_AUDITOR_BOOKKEEPER_{k.upper()}": "0" for k in keys}
    else:
        overrides = [f"{k}=0" for k in keys]
    cfg = load_daemon_config(toml, overrides, env=env, bk_conf=bk, host=HOST)
    assert cfg.interval(Check.PLACEMENT) == 0
    assert cfg.interval(Check.REPLICAS) == 0


def test_unknown_policy_is_an_error_only_while_placement_runs() -> None:
    policy = "ensemblePlacementPolicy=org.example.MyPolicy"
    with pytest.raises(ConfigError, match=r"ensemblePlacementPolicy.*\(from --set\)"):
        load_daemon_config(None, [policy], env=ZK)
    cfg = load_daemon_config(
        None, [policy, "auditorPeriodicPlacementPolicyCheckInterval=0"], env=ZK
    )
    assert cfg.bookkeeper.ensemblePlacementPolicy == "org.example.MyPolicy"


# --- invalid values name their key ------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("zkTimeout=abc", r"bookkeeper\.zkTimeout must be an integer, got 'abc' \(from --set\)"),
        ("zkTimeout=0", r"bookkeeper\.zkTimeout must be a positive number of milliseconds"),
        ("auditorLedgerVerificationPercentage=101", r"auditorLedgerVerificationPercentage"),
        ("auditorMaxNumberOfConcurrentOpenLedgerOperations=0", r"ConcurrentOpenLedgerOperations"),
        ("lostBookieRecoveryDelay=-1", r"bookkeeper\.lostBookieRecoveryDelay must be seconds"),
        ("enforceMinNumRacksPerWriteQuorum=yes", r"enforceMinNumRacksPerWriteQuorum must be true"),
        ("zktimeout=1", r"unknown key bookkeeper\.zktimeout \(did you mean bookkeeper\.zkTimeout"),
        ("checks.retry_delay=-1", r"checks\.retry_delay must be seconds >= 0"),
        ("daemon.jitter=1", r"daemon\.jitter must be a fraction"),
        ("daemon.jitter=x", r"daemon\.jitter must be a finite number"),
        ("daemon.zk_session_timeout=inf", r"daemon\.zk_session_timeout must be a finite number"),
        ("checks.retry_delay=nan", r"checks\.retry_delay must be a finite number"),
        ("daemon.shutdown_timeout=0", r"daemon\.shutdown_timeout must be positive"),
        ("daemon.zk_session_timeout=0", r"daemon\.zk_session_timeout must be positive"),
        ("daemon.engine=trio", r"daemon\.engine must be 'asyncio' or 'spark', got 'trio'"),
        ("scan.partitions=-1", r"scan\.partitions must be a count >= 0 .*\(from --set\)"),
        ("scan.partitions=many", r"scan\.partitions must be an integer, got 'many'"),
        ("scan.sparkConf=x", r"unknown key scan\.sparkConf \(did you mean scan\.spark_conf\?\)"),
        ("scan.spark_conf=executor.memory=2g", r"scan\.spark_conf: 'executor\.memory' is not a"),
        ("scan.spark_conf=spark.a=1;spark.b", r"scan\.spark_conf must be a table .* 'spark\.b'"),
        ("scan.spark_conf=spark.=1", r"scan\.spark_conf: 'spark\.' is not a Spark setting"),
        ("daemon.ledgers_root=ledgers", r"daemon\.ledgers_root must be an absolute znode path"),
        ("daemon.metadata_service_uri=http://x/y", r"daemon\.metadata_service_uri: .*scheme"),
        ("daemon.nope=1", r"unknown key daemon\.nope"),
        ("api.port=70000", r"api\.port must be a port"),
        ("api.host= ", r"api\.host must be a host"),
        ("api.tls_cert=/nonexistent/cert.pem", r"api\.tls_cert: no such file"),
        ("metrics.port=-1", r"metrics\.port must be a port"),
        ("metrics.enabled=maybe", r"metrics\.enabled must be true or false"),
        (f"metrics.port={DEFAULT_API_PORT}", r"metrics\.port 9876 is also api\.port"),
        ("logging.format=xml", r"logging\.format must be auto \| json \| console"),
        ("logging.level=loud", r"logging\.level must be debug"),
        ("novalue", r"--set takes KEY=VALUE"),
    ],
)
def test_invalid_values_name_their_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_daemon_config(None, [override], env=ZK)


# --- scan: the Spark job of daemon.engine = "spark" -------------------------------


def test_scan_defaults_and_asyncio_engine() -> None:
    cfg = load_daemon_config(None, env=ZK, hostname="h")
    assert cfg.daemon.engine == "asyncio"
    assert cfg.scan == ScanSection(master="", partitions=0, spark_conf={})
    assert cfg.describe()["scan"] == {"master": "", "partitions": 0, "spark_conf": {}}


def test_scan_from_toml_table_nested_or_quoted(tmp_path: Path) -> None:
    toml = write(
        tmp_path,
        "a.toml",
        "[daemon]\nengine = 'spark'\n"
        "[scan]\nmaster = ' spark://m:7077 '\npartitions = 16\n"
        "[scan.spark_conf]\n"
        "'spark.executor.memory' = '2g'\n"
        "spark.executor.cores = 2\n"  # unquoted: TOML nests it; read back as one key
        "spark.dynamicAllocation.enabled = true\n"
        "'spark.memory.fraction' = 0.5\n",
    )
    cfg = load_daemon_config(toml, env=ZK, hostname="h")
    assert cfg.daemon.engine == "spark"
    assert cfg.scan == ScanSection(
        master="spark://m:7077",
        partitions=16,
        spark_conf={
            "spark.executor.memory": "2g",
            "spark.executor.cores": "2",
            "spark.dynamicAllocation.enabled": "true",
            "spark.memory.fraction": "0.5",
        },
    )
    assert cfg.origin("scan.spark_conf") == toml
    assert cfg.origin("daemon.engine") == toml


def test_scan_from_env_and_set_in_text_form() -> None:
    env = {
        **ZK,
        "BK_AUDITOR_DAEMON_ENGINE": "spark",
        "BK_AUDITOR_SCAN_MASTER": "local[2]",
        "BK_AUDITOR_SCAN_SPARK_CONF": "spark.executor.memory=1g; spark.jars=a.jar,b.jar;",
    }
    cfg = load_daemon_config(None, env=env, hostname="h")
    assert cfg.scan.master == "local[2]"
    assert cfg.scan.spark_conf == {"spark.executor.memory": "1g", "spark.jars": "a.jar,b.jar"}
    assert cfg.origin("scan.spark_conf") == "environment BK_AUDITOR_SCAN_SPARK_CONF"
    # --set replaces the whole table; a value may itself hold '='.
    cfg = load_daemon_config(
        None,
        ["scan.spark_conf=spark.driver.extraJavaOptions=-Da=b -Dc=d", "scan.partitions=4"],
        env=env,
        hostname="h",
    )
    assert cfg.scan.spark_conf == {"spark.driver.extraJavaOptions": "-Da=b -Dc=d"}
    assert cfg.scan.partitions == 4
    assert cfg.origin("scan.spark_conf") == "--set"
    assert load_daemon_config(None, ["scan.spark_conf="], env=env).scan.spark_conf == {}


def test_scan_bad_spark_conf_names_key_and_origin(tmp_path: Path) -> None:
    toml = write(tmp_path, "a.toml", "[scan]\nspark_conf = 3\n")
    with pytest.raises(
        ConfigError, match=rf"^scan\.spark_conf must be a table .*got 3 \(from {toml}\)"
    ):
        load_daemon_config(toml, env=ZK)
    toml = write(tmp_path, "b.toml", "[scan.spark_conf]\nexecutor.memory = '2g'\n")
    with pytest.raises(
        ConfigError,
        match=rf"^scan\.spark_conf: 'executor\.memory' is not a Spark .*\(from {toml}\)",
    ):
        load_daemon_config(toml, env=ZK)
    toml = write(tmp_path, "c.toml", "[scan.spark_conf]\n'spark.jars' = ['a.jar']\n")
    with pytest.raises(ConfigError, match=r"^scan\.spark_conf: spark\.jars must be a string"):
        load_daemon_config(toml, env=ZK)
    with pytest.raises(ConfigError, match=r"\(from environment BK_AUDITOR_SCAN_PARTITIONS\)"):
        load_daemon_config(None, env={**ZK, "BK_AUDITOR_SCAN_PARTITIONS": "-2"})


def test_cli_and_daemon_share_one_spark_conf_rule(tmp_path: Path) -> None:
    """`--spark-conf` and `scan.spark_conf` accept and refuse the same settings, alike."""
    from auditor.cli.scan import parse_spark_conf as cli_spark_conf

    good = ["spark.executor.memory=2g", "spark.driver.extraJavaOptions= -Da=b=c "]
    expected = {"spark.executor.memory": "2g", "spark.driver.extraJavaOptions": "-Da=b=c"}
    assert cli_spark_conf(good) == expected
    cfg = load_daemon_config(None, [f"scan.spark_conf={';'.join(good)}"], env=ZK)
    assert cfg.scan.spark_conf == expected
    for bad in ("executor.memory=2g", "spark.=1", "spark.a b=1"):
        key = repr(bad.partition("=")[0])
        with pytest.raises(ConfigError) as cli:
            cli_spark_conf([bad])
        with pytest.raises(ConfigError) as daemon:
            load_daemon_config(None, [f"scan.spark_conf={bad}"], env=ZK)
        reason = f"{key} is not a Spark setting (spark.KEY=VALUE)"
        assert str(cli.value) == f"--spark-conf: {reason}"
        assert str(daemon.value) == f"scan.spark_conf: {reason} (from --set)"


def test_cli_and_daemon_know_the_same_engines() -> None:
    from auditor.cli.main import build_parser
    from auditor.scan.options import ENGINES

    for engine in ENGINES:
        args = build_parser().parse_args(["scan", "--engine", engine, "--out", "o"])
        assert args.engine == engine
        if engine != "spark":  # the daemon refuses Spark without PySpark, at start
            cfg = load_daemon_config(None, [f"daemon.engine={engine}"], env=ZK)
            assert cfg.daemon.engine == engine
    with pytest.raises(ConfigError, match="invalid choice: 'trio'"):
        build_parser().parse_args(["scan", "--engine", "trio", "--out", "o"])


def test_scan_secrets_masked_in_describe() -> None:
    cfg = load_daemon_config(
        None,
        ["scan.spark_conf=spark.hadoop.fs.s3a.access.key=AK;spark.hadoop.fs.s3a.secret.key=SK;"
         "spark.executor.memory=2g"],
        env=ZK,
    )  # fmt: skip
    assert cfg.describe()["scan"]["spark_conf"] == {
        "spark.hadoop.fs.s3a.access.key": "***",
        "spark.hadoop.fs.s3a.secret.key": "***",
        "spark.executor.memory": "2g",
    }


def test_scan_changes_are_reported_on_reload(tmp_path: Path) -> None:
    toml = write(tmp_path, "a.toml", "[scan]\nmaster = 'local[2]'\n")
    first = load_daemon_config(toml, env=ZK, hostname="h")
    Path(toml).write_text("[scan]\nmaster = 'local[2]'\nspark_conf = 'spark.a=1'\n")
    second = load_daemon_config(toml, env=ZK, hostname="h")
    assert first.changed(second) == ["scan.spark_conf"]


def test_spark_engine_without_pyspark_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A None entry makes `import pyspark` fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, "pyspark", None)
    with pytest.raises(
        ConfigError,
        match=r"^daemon\.engine = 'spark' \(from --set\): the Spark engine needs PySpark: "
        r"pip install 'bookkeeper-auditor\[spark\]'$",
    ):
        load_daemon_config(None, ["daemon.engine=spark"], env=ZK)
    # The asyncio engine does not need it.
    assert load_daemon_config(None, env=ZK).daemon.engine == "asyncio"


def test_run_without_pyspark_exits_2_before_connecting() -> None:
    # `bk-auditor run` in a process of its own where PySpark cannot be imported.
    code = (
        "import sys; sys.modules['pyspark'] = None; from auditor.cli.main import main; "
        "sys.exit(main(['run', '--zk', '127.0.0.1:1']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("BK_AUDITOR_")},
            "BK_AUDITOR_DAEMON_ENGINE": "spark",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        "bk-auditor: error: daemon.engine = 'spark' (from environment BK_AUDITOR_DAEMON_ENGINE): "
        "the Spark engine needs PySpark: pip install 'bookkeeper-auditor[spark]'\n"
    )


def test_bad_values_from_files_and_env_name_key_and_origin(tmp_path: Path) -> None:
    bk = write(tmp_path, "bk.conf", "zkServers=zk:2181\n\nzkTimeout=ten\n")
    with pytest.raises(ConfigError, match=rf"bookkeeper\.zkTimeout .* \(from {bk}:3 zkTimeout\)"):
        load_daemon_config(None, env={}, bk_conf=bk, host=HOST)
    bk = write(tmp_path, "bk2.conf", "zkServers=zk:2181\nbookiePort=http\n")
    with pytest.raises(ConfigError, match=r"^bookiePort must be a port"):
        load_daemon_config(None, env={}, bk_conf=bk, host=HOST)
    toml = write(tmp_path, "a.toml", "[api]\nport = 'x'\n")
    with pytest.raises(
        ConfigError, match=rf"api\.port must be an integer, got 'x' \(from {toml}\)"
    ):
        load_daemon_config(toml, env=ZK)
    with pytest.raises(ConfigError, match=r"\(from environment BK_AUDITOR_METRICS_PORT\)"):
        load_daemon_config(None, env={**ZK, "BK_AUDITOR_METRICS_PORT": "many"})
    toml = write(tmp_path, "b.toml", "[web]\nport = 1\n")
    with pytest.raises(ConfigError, match=r"unknown config table \[web\]"):
        load_daemon_config(toml, env=ZK)
    toml = write(tmp_path, "c.toml", "[api\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_daemon_config(toml, env=ZK)
    # tomllib refuses an integer of more than 4300 digits with a bare ValueError.
    toml = write(tmp_path, "d.toml", "[api]\nport = " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match="is not valid TOML: Exceeds the limit"):
        load_daemon_config(toml, env=ZK)
    with pytest.raises(ConfigError, match="does not exist"):
        load_daemon_config(None, env=ZK, bk_conf=str(tmp_path / "missing.conf"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_daemon_config(str(tmp_path / "missing.toml"), env=ZK)


# --- api: TLS and tokens ----------------------------------------------------------


def test_tls_and_token_file(tmp_path: Path) -> None:
    cert = write(tmp_path, "cert.pem", "c")
    key = write(tmp_path, "key.pem", "k")
    ca = write(tmp_path, "ca.pem", "a")
    token = write(tmp_path, "token", "  s3cret\n")
    Path(token).chmod(0o644)
    with pytest.raises(
        ConfigError, match=r"api\.token_file .* is open to every user \(mode 0644\)"
    ):
        load_daemon_config(None, [f"api.token_file={token}"], env=ZK)
    Path(token).chmod(0o640)
    cfg = load_daemon_config(
        None,
        [
            f"api.tls_cert={cert}",
            f"api.tls_key={key}",
            f"api.tls_client_ca={ca}",
            f"api.token_file={token}",
        ],
        env=ZK,
    )
    assert cfg.api.mtls and cfg.api.tls
    assert cfg.api.token == "s3cret"
    assert "s3cret" not in repr(cfg)
    assert cfg.describe()["api"]["token"] == "***"
    with pytest.raises(ConfigError, match=r"api\.tls_cert and api\.tls_key must be set together"):
        load_daemon_config(None, [f"api.tls_cert={cert}"], env=ZK)
    with pytest.raises(ConfigError, match=r"api\.tls_client_ca needs api\.tls_cert"):
        load_daemon_config(None, [f"api.tls_client_ca={ca}"], env=ZK)
    with pytest.raises(ConfigError, match=r"api\.token and api\.token_file are both set"):
        load_daemon_config(None, [f"api.token_file={token}", "api.token=x"], env=ZK)
    empty = write(tmp_path, "empty", "\n")
    Path(empty).chmod(0o600)
    with pytest.raises(ConfigError, match=r"api\.token_file .* is empty"):
        load_daemon_config(None, [f"api.token_file={empty}"], env=ZK)


# --- reload -----------------------------------------------------------------------


def test_reload_is_pure_and_reports_what_changed(tmp_path: Path) -> None:
    toml = write(tmp_path, "a.toml", "[bookkeeper]\nauditorReplicasCheckInterval = 600\n")
    first = load_daemon_config(toml, env=ZK, hostname="h")
    assert load_daemon_config(toml, env=ZK, hostname="h") == first
    Path(toml).write_text(
        "[bookkeeper]\nauditorReplicasCheckInterval = 1200\n[logging]\nlevel = 'debug'\n"
    )
    second = load_daemon_config(toml, env=ZK, hostname="h")
    assert first.changed(second) == ["bookkeeper.auditorReplicasCheckInterval", "logging.level"]


def test_one_shot_config_still_accepts_daemon_tables(tmp_path: Path) -> None:
    toml = write(tmp_path, "a.toml", "[daemon]\nzk = 'x:1'\n[bookkeeper]\nzkTimeout = 500\n")
    assert load_config(toml).bookkeeper.zkTimeout == 500


# --- logging ----------------------------------------------------------------------


@pytest.fixture
def restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # The CLI, run in-process by other tests, quiets kazoo's logger; start from neutral.
    kazoo = logging.getLogger("kazoo")
    kazoo_level = kazoo.level
    kazoo.setLevel(logging.NOTSET)
    try:
        yield
    finally:
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(level)
        kazoo.setLevel(kazoo_level)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.usefixtures("restore_logging")
def test_logging_auto_is_json_unless_a_tty() -> None:
    out = io.StringIO()
    assert configure_logging("auto", level="info", stream=out, capture_stdlib=True) == "json"
    get_logger().info("check run", check="replicas", violations=2)
    get_logger().debug("hidden")
    logging.getLogger("kazoo.client").warning("Connection dropped: %s", "socket closed")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(x["event"], x["level"]) for x in lines] == [
        ("check run", "info"),
        ("Connection dropped: socket closed", "warning"),
    ]
    assert lines[0]["check"] == "replicas" and lines[0]["timestamp"].endswith("Z")
    assert lines[1]["logger"] == "kazoo.client"
    tty = _Tty()
    assert configure_logging("auto", stream=tty) == "console"
    get_logger().warning("leadership acquired", identity="a:1")
    assert "leadership acquired" in tty.getvalue() and not tty.getvalue().startswith("{")


@pytest.mark.usefixtures("restore_logging")
def test_logging_keeps_the_json_lines_flag() -> None:
    out = io.StringIO()
    assert configure_logging(json_lines=True, stream=out) == "json"
    get_logger().info("x")
    assert json.loads(out.getvalue())["event"] == "x"
    assert configure_logging(stream=out) == "console"
    with pytest.raises(ValueError, match="xml"):
        configure_logging("xml", stream=out)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="loud"):
        configure_logging("json", level="loud", stream=out)


def test_settings_travel_by_name_to_spark_executors() -> None:
    import pickle

    from auditor.config import AuditorConfig
    from auditor.config.model import _rebuild

    cfg = load_config(None, ["readEntryTimeout=7", "checks.retry_delay=0.5"])
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert isinstance(cfg, AuditorConfig)
    # An executor whose code lacks a setting refuses, instead of shifting values.
    with pytest.raises(ConfigError, match="does not know the setting"):
        _rebuild("BookKeeperConfig", {"readEntryTimeout": 7, "noSuchKnob": 1})
    # A missing one (older driver) takes its default.
    assert _rebuild("ChecksConfig", {"retry_delay": 0.5}).retry_attempts == 2


def test_the_admins_digest_type_and_password_read_as_bookkeeper_reads_them(
    tmp_path: Path,
) -> None:
    """`digestType` and `passwd` (what upstream's admin opens a ledger with when its
    metadata holds no password), from bk_server.conf or ours, with BookKeeper's defaults;
    the password never shown."""
    default = load_daemon_config(None, env=ZK, hostname="h", host=HOST).bookkeeper
    assert (default.digestType, default.passwd) == ("CRC32", "")
    assert (default.recovery_digest_type, default.recovery_password) == (DigestType.CRC32, b"")
    bk = write(tmp_path, "bk_server.conf", "digestType=MAC\npasswd=pw-9f3 \u00e9\n")
    cfg = load_daemon_config(None, env=ZK, bk_conf=bk, hostname="h", host=HOST)
    assert cfg.bookkeeper.recovery_digest_type is DigestType.HMAC
    # Trimmed as Commons Configuration trims; UTF-8, as Java's getBytes(UTF_8).
    assert cfg.bookkeeper.recovery_password == "pw-9f3 \u00e9".encode()
    assert cfg.origin("bookkeeper.passwd") == f"{bk}:2 passwd"
    assert "pw-9f3" not in repr(cfg) and "pw-9f3" not in repr(cfg.bookkeeper)
    assert cfg.describe()["bookkeeper"]["passwd"] == "***"
    assert cfg.describe()["bookkeeper"]["digestType"] == "MAC"
    one_shot = load_config(None, ["digestType=CRC32C", "passwd=x"]).bookkeeper
    assert (one_shot.recovery_digest_type, one_shot.recovery_password) == (DigestType.CRC32C, b"x")
    # Java's DigestType.valueOf: exactly these four spellings.
    with pytest.raises(ConfigError, match=r"bookkeeper\.digestType must be one of CRC32, CRC32C, "
                       r"MAC, DUMMY, got 'crc32'"):  # fmt: skip
        load_config(None, ["digestType=crc32"])


def test_scrub_section_from_toml_set_and_the_daemon_with_its_rules(tmp_path: Path) -> None:
    import pickle

    from auditor.config import ScrubConfig

    assert load_config(None).scrub == ScrubConfig(
        bytes_per_second=8 * 1024 * 1024, interval=604800.0
    )
    toml = write(tmp_path, "s.toml", "[scrub]\nbytes_per_second = 1000\ninterval = 60\n")
    cfg = load_config(toml, ["scrub.interval=30"])
    assert cfg.scrub == ScrubConfig(bytes_per_second=1000.0, interval=30.0)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    daemon = load_daemon_config(toml, env=ZK, hostname="node-1")
    assert daemon.auditor.scrub == ScrubConfig(bytes_per_second=1000.0, interval=60.0)
    assert daemon.origin("scrub.interval").startswith(f"{toml}")
    for override, message in (
        (
            "scrub.bytes_per_second=-1",
            "scrub.bytes_per_second must be bytes per second >= 0 (0: no budget), got '-1'",
        ),
        ("scrub.interval=0", "scrub.interval must be positive seconds, got '0'"),
        ("scrub.no_such=1", "unknown key scrub.no_such"),
    ):
        with pytest.raises(ConfigError) as err:
            load_config(None, [override])
        assert str(err.value) == message
