"""Pulsar's etcd configuration file (`configFilePath`): what is read, what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.cli.cluster import target_from_args
from auditor.errors import ConfigError, shown_name
from auditor.metadata.etcd_config import EtcdOptions, read_etcd_config
from auditor.store import StoreKind


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "etcd.yaml"
    path.write_text(text)
    return str(path)


def test_the_keys_pulsar_reads(tmp_path: Path) -> None:
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("x")
    path = write(
        tmp_path,
        f"useTls: true\ntlsProvider: OpenSSL\ntlsTrustCertsFilePath: {tmp_path}/ca.pem\n"
        f"tlsCertificateFilePath: {tmp_path}/client.pem\ntlsKeyFilePath: {tmp_path}/client.key\n"
        "authority: etcd.example\nsomethingElse: 1\n",
    )
    assert read_etcd_config(path) == EtcdOptions(
        use_tls=True,
        ca_file=f"{tmp_path}/ca.pem",
        cert_file=f"{tmp_path}/client.pem",
        key_file=f"{tmp_path}/client.key",
        authority="etcd.example",
        ignored=("tlsProvider", "'somethingElse'"),
    )
    assert read_etcd_config(write(tmp_path, "")) == EtcdOptions()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("useTls: [1", "not YAML at line 1"),
        ("- a\n- b\n", "not a mapping of keys to values"),
        ("useTls: yes please\n", "useTls must be true or false, got 'yes please'"),
        ("authority: 3\n", "authority must be a non-empty string"),
        ("tlsTrustCertsFilePath: /nonexistent/ca.pem\n", "'/nonexistent/ca.pem' is not a readable"),
        ("tlsKeyFilePath: /k\n", "takes both tlsCertificateFilePath and tlsKeyFilePath"),
        # Hostile files: one line each, never a traceback.
        ("[" * 100_000, "nested too deeply to be a configuration file"),
        ("{" * 5_000, "nested too deeply to be a configuration file"),
        ("authority: " + "a" * 300, "authority is longer than a host name and port"),
        ("#" * (1 << 20) + "\n", "larger than 1048576 bytes: not a configuration file"),
        ("\x00", "not YAML"),
    ],
)
def test_a_bad_file_is_one_line(tmp_path: Path, text: str, reason: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        read_etcd_config(path)
    message = str(caught.value)
    assert message.startswith(f"etcd configuration file {shown_name(path)} (configFilePath): ")
    assert reason in message
    assert "\n" not in message


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read it: FileNotFoundError$"):
        read_etcd_config(str(tmp_path / "none.yaml"))


def test_the_uri_carries_it_to_the_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "authority: etcd.example\ntlsProvider: JDK\n")
    target = target_from_args(
        None, None, f"metadata-store:etcd:http://h:2379?configFilePath={path}", 5.0
    )
    assert (target.store, target.hosts, target.etcd) == (
        StoreKind.ETCD,
        "http://h:2379",
        EtcdOptions(authority="etcd.example", ignored=("tlsProvider",)),
    )
    assert capsys.readouterr().err == (
        "bk-auditor: note: ignoring etcd configuration keys tlsProvider\n"
    )
    # On ZooKeeper the same parameter tunes nothing of ours: named as ignored, not read.
    target = target_from_args(None, None, "metadata-store:zk:h:2181?configFilePath=/x", 5.0)
    assert target.etcd is None
    assert "'configFilePath'" in capsys.readouterr().err
