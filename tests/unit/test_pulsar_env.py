"""Pulsar's environment variables: `PULSAR_PREFIX_<key>` and bare `<key>`, applied to the
BookKeeper config as Pulsar's `apply-config-from-env.py` applies them, and the Helm chart's
default autorecovery ConfigMap end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.checks.findings import Check
from auditor.config import BookKeeperConfig
from auditor.daemon.config import load_daemon_config
from auditor.daemon.config.identity import StaticHost
from auditor.daemon.config.layers import bk_conf_layer, conf_file_keys, pulsar_env
from auditor.errors import ConfigError
from auditor.metadata.layout import LedgerManager

HOST = StaticHost(name="ar-0", ip="10.244.3.9")


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "bookkeeper.conf"
    p.write_text(text)
    return str(p)


def test_the_keys_the_script_finds_in_a_file() -> None:
    text = (
        "bookiePort=3181\n"
        "# listeningInterface=eth0\n"
        "#bookieId=\n"
        "##twice=1\n"
        "zkServers: zk:2181\n"  # no '=': not a key to the script
        "  spaced = 1 \r\n"
        "# a comment without an equals sign\n"
    )
    assert conf_file_keys(text) == {
        "bookiePort",
        "listeningInterface",
        "bookieId",
        "#twice",
        "spaced",
    }


def test_prefix_sets_any_key_bare_only_keys_present_and_prefix_wins() -> None:
    env = {
        "zkServers": "bare:2181",
        "PULSAR_PREFIX_zkServers": "prefixed:2181",
        "bookiePort": " 3182 ",  # a bare value is stripped, as the script strips it
        "notAKey": "x",
        "PULSAR_PREFIX_newKey": "n",
        "PULSAR_PREFIX_fromOther": "${OTHER}",
        "OTHER": "other-value",
        "PULSAR_PREFIX_escaped": "a\\tb",
        "PATH": "/usr/bin",
    }
    assert pulsar_env(env, {"zkServers", "bookiePort"}) == {
        "zkServers": ("prefixed:2181", "environment PULSAR_PREFIX_zkServers"),
        "bookiePort": ("3182", "environment bookiePort"),
        "newKey": ("n", "environment PULSAR_PREFIX_newKey"),
        "fromOther": ("other-value", "environment PULSAR_PREFIX_fromOther"),
        "escaped": ("a\tb", "environment PULSAR_PREFIX_escaped"),
    }


def test_with_a_file_bare_variables_replace_its_keys_commented_ones_included(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        "zkServers=localhost:2181\n"
        "zkLedgersRootPath=/ledgers\n"
        "# bookieId=\n"
        "auditorPeriodicBookieCheckInterval=86400\n",
    )
    env = {
        "zkServers": "zk-1:2181,zk-2:2181",
        "bookieId": "bookie-3",  # commented out in the file: the script uncomments it
        "lostBookieRecoveryDelay": "60",  # not in the file: a bare variable does nothing
        "PULSAR_PREFIX_auditorReplicasCheckInterval": "600",  # not in the file: added
        "BOOKIE_MEM": "-Xmx128m",
    }
    cfg = load_daemon_config(None, env=env, bk_conf=path, host=HOST)
    assert (cfg.daemon.zk, cfg.daemon.ledgers_root) == ("zk-1:2181,zk-2:2181", "/ledgers")
    assert cfg.daemon.identity == "bookie-3"
    assert cfg.bookkeeper.lostBookieRecoveryDelay == 0
    assert cfg.interval(Check.REPLICAS) == 600
    assert cfg.interval(Check.BOOKIES) == 86400
    assert cfg.origin("daemon.zk") == "environment zkServers"
    assert cfg.origin("daemon.ledgers_root") == f"{path}:2 zkLedgersRootPath"
    assert cfg.origin("daemon.identity") == "environment bookieId"
    assert cfg.origin("bookkeeper.auditorReplicasCheckInterval") == (
        "environment PULSAR_PREFIX_auditorReplicasCheckInterval"
    )
    assert cfg.files == (path,)


def test_a_configuration_given_only_as_pulsar_prefix_variables() -> None:
    env = {
        "PULSAR_PREFIX_zkServers": "zk-a:2181, zk-b:2181",
        "PULSAR_PREFIX_zkLedgersRootPath": "/pulsar/ledgers/",
        "PULSAR_PREFIX_ensemblePlacementPolicy": (
            "org.apache.bookkeeper.client.RegionAwareEnsemblePlacementPolicy"
        ),
        "PULSAR_PREFIX_auditorPeriodicCheckInterval": "0",
        "PULSAR_PREFIX_auditorPeriodicBookieCheckInterval": "1800",
        "PULSAR_PREFIX_lostBookieRecoveryDelay": "120",
        "PULSAR_PREFIX_zkTimeout": "20000",
        "PULSAR_PREFIX_bookiePort": "3185",
        "PULSAR_PREFIX_useHostNameAsBookieID": "true",
        "PULSAR_PREFIX_useShortHostName": "true",
        "PULSAR_PREFIX_httpServerEnabled": "true",  # a BookKeeper key we do not read
    }
    host = StaticHost(
        ip="10.244.3.9",
        reverse={"10.244.3.9": "ar-0.ar.pulsar.svc.cluster.local"},
        names={"ar-0": "10.244.3.9"},
    )
    cfg = load_daemon_config(None, env=env, host=host)
    assert (cfg.daemon.zk, cfg.daemon.ledgers_root) == ("zk-a:2181,zk-b:2181", "/pulsar/ledgers")
    assert cfg.daemon.zk_session_timeout == 20.0
    assert cfg.daemon.identity == "ar-0:3185"
    assert cfg.bookkeeper == BookKeeperConfig(
        zkTimeout=20000,
        ensemblePlacementPolicy="org.apache.bookkeeper.client.RegionAwareEnsemblePlacementPolicy",
        auditorPeriodicCheckInterval=0,
        auditorPeriodicBookieCheckInterval=1800,
        lostBookieRecoveryDelay=120,
        # The daemon's BP-34 defaults, no layer setting them.
        auditorPeriodicPlacementPolicyCheckInterval=86400,
        auditorReplicasCheckInterval=86400,
    )
    assert cfg.origin("daemon.zk") == "environment PULSAR_PREFIX_zkServers"
    assert cfg.origin("bookkeeper.lostBookieRecoveryDelay") == (
        "environment PULSAR_PREFIX_lostBookieRecoveryDelay"
    )
    assert cfg.files == ()


def test_without_a_file_bare_variables_count_only_for_keys_we_read() -> None:
    env = {
        "zkServers": "zk-a:2181",
        "lostBookieRecoveryDelay": "30",
        "journalDirectories": "/data/journal",  # a bookie's key, not ours
        "BOOKIE_MEM": "-Xms64m -Xmx128m",
        "HOSTNAME": "ar-0",
    }
    layer, hints = bk_conf_layer(None, env)
    assert {s: dict(v) for s, v in layer.items() if v} == {
        "bookkeeper": {"lostBookieRecoveryDelay": layer["bookkeeper"]["lostBookieRecoveryDelay"]},
        "daemon": {"zk": layer["daemon"]["zk"]},
    }
    assert layer["daemon"]["zk"].value == "zk-a:2181"
    assert layer["daemon"]["zk"].origin == "environment zkServers"
    assert hints is not None and hints.source == "the environment"
    # Nothing BookKeeper's: no layer, and the identity stays <hostname>:<api.port>.
    layer, hints = bk_conf_layer(None, {"BOOKIE_MEM": "-Xmx1g", "PATH": "/bin"})
    assert hints is None and not any(layer.values())
    cfg = load_daemon_config(None, env={"BK_AUDITOR_DAEMON_ZK": "zk:2181"}, host=HOST)
    assert cfg.daemon.identity == "ar-0:9876"


def test_our_environment_ranks_above_pulsars(tmp_path: Path) -> None:
    env = {
        "PULSAR_PREFIX_zkServers": "zk-pulsar:2181",
        "PULSAR_PREFIX_lostBookieRecoveryDelay": "60",
        "BK_AUDITOR_BOOKKEEPER_LOSTBOOKIERECOVERYDELAY": "90",
        "BK_AUDITOR_DAEMON_ZK": "zk-ours:2181",
    }
    cfg = load_daemon_config(None, env=env, host=HOST)
    assert (cfg.daemon.zk, cfg.bookkeeper.lostBookieRecoveryDelay) == ("zk-ours:2181", 90)
    assert cfg.origin("daemon.zk") == "environment BK_AUDITOR_DAEMON_ZK"


def test_bad_values_from_variables_name_the_variable() -> None:
    with pytest.raises(ConfigError) as err:
        load_daemon_config(None, env={"PULSAR_PREFIX_bookiePort": "http"}, host=HOST)
    assert str(err.value) == (
        "bookiePort must be a port 1..65535, got 'http' (from environment PULSAR_PREFIX_bookiePort)"
    )
    env = {"zkServers": "zk:2181", "zkTimeout": "soon"}
    with pytest.raises(ConfigError, match=r"\(from environment zkTimeout\)$"):
        load_daemon_config(None, env=env, host=HOST)


#: What the Pulsar Helm chart (4.x) puts into the autorecovery pod's environment by default
#: (release "pulsar": `pulsar.bookkeeper.config.common` and `autorecovery.configData`).
HELM_AUTORECOVERY_CONFIGMAP = {
    "zkServers": "",
    "zkLedgersRootPath": "",
    "metadataServiceUri": "zk+hierarchical://pulsar-zookeeper:2181/ledgers",
    "zkTimeout": "30000",
    "httpServerEnabled": "true",
    "httpServerPort": "8000",
    "useHostNameAsBookieID": "true",
    "BOOKIE_MEM": "-Xms64m -Xmx128m\n",
    "PULSAR_PREFIX_useV2WireProtocol": "true",
}


def test_the_helm_charts_autorecovery_configmap_as_it_is() -> None:
    pod = "pulsar-autorecovery-0.pulsar-autorecovery.pulsar.svc.cluster.local"
    host = StaticHost(
        name="pulsar-autorecovery-0",
        ip="10.244.2.15",
        reverse={"10.244.2.15": pod},
        names={pod: "10.244.2.15"},
    )
    env = {**HELM_AUTORECOVERY_CONFIGMAP, "HOSTNAME": "pulsar-autorecovery-0"}
    cfg = load_daemon_config(None, env=env, host=host)
    assert (cfg.daemon.zk, cfg.daemon.ledgers_root) == ("pulsar-zookeeper:2181", "/ledgers")
    assert cfg.ledger_manager is LedgerManager.HIERARCHICAL
    assert cfg.daemon.zk_session_timeout == 30.0
    # What the chart's Java AutoRecovery votes with: the pod's canonical name, bookiePort.
    assert cfg.daemon.identity == f"{pod}:3181"
    assert cfg.bookkeeper.ensemblePlacementPolicy == (
        "org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy"
    )
    assert cfg.bookkeeper.zkTimeout == 30000
    assert cfg.origin("daemon.zk") == "environment metadataServiceUri"
    assert cfg.origin("daemon.identity") == (
        "the canonical host name of 10.244.2.15, the IP of the default interface (this host's "
        "name resolved) (useHostNameAsBookieID from environment useHostNameAsBookieID; "
        "BookKeeper's rule; the environment sets neither bookieId nor advertisedAddress); "
        "bookiePort 3181, BookKeeper's default"
    )
    assert cfg.files == ()
