"""ZooKeeper over TLS: a real ZooKeeper serving its secureClientPort (Netty), Java stores made
with keytool, and our client configured with ZooKeeper's own client property names.

Two servers for the module: one that takes any TLS client (`ssl.clientAuth=none`)
and one that wants our certificate (`need`). Each test works under a chroot of
its own. What is checked: a good CA connects and reads, from PEM and from
PKCS12 stores and through the CLI; a wrong CA, a missing client certificate and
a plain port each fail in one line with exit 3 within the timeout; bad files and
passwords fail before connecting with exit 2.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor.daemon.config import load_daemon_config
from auditor.errors import ConfigError
from auditor.testing.cli import bk
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.zkserver import (
    STORE_PASSWORD,
    ServerTls,
    ZkTlsMaterial,
    ZooKeeperServer,
    make_tls_material,
)
from auditor.zk import (
    ZkClient,
    ZkSecurity,
    ZkTimeoutError,
    ZkTlsError,
    zk_tls_from_properties,
)
from auditor.zk.tls import ZkTls

TIMEOUT = 3.0
ROOT = "/ledgers"


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> ZkTlsMaterial:
    return make_tls_material(tmp_path_factory.mktemp("zk-tls"))


def _server(material: ZkTlsMaterial, client_auth: str) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tls=ServerTls(material, client_auth))
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="module")
def tls_server(material: ZkTlsMaterial) -> Iterator[ZooKeeperServer]:
    yield from _server(material, "none")


@pytest.fixture(scope="module")
def mtls_server(material: ZkTlsMaterial) -> Iterator[ZooKeeperServer]:
    yield from _server(material, "need")


def props(**values: str | Path) -> dict[str, tuple[str, str]]:
    """Java property names from keywords: ssl_trustStore_location -> zookeeper.ssl.trustStore..."""
    out = {"zookeeper.client.secure": ("true", "test")}
    for key, value in values.items():
        out["zookeeper." + key.replace("_", ".")] = (str(value), "test")
    return out


def tls_of(**values: str | Path) -> ZkTls:
    tls = zk_tls_from_properties(props(**values))
    assert tls is not None
    return tls


async def read_back(hosts: str, tls: ZkTls) -> bytes:
    """Writes a znode under a fresh chroot over TLS and reads it back."""
    path = f"/tls-{uuid.uuid4().hex[:12]}"
    async with ZkClient(hosts, timeout=TIMEOUT, security=ZkSecurity(tls=tls)) as zk:
        await zk.create(path, b"over tls")
        data, _ = await zk.get(path)
    return data


# --- the client ---------------------------------------------------------------------------


async def test_pem_trust_store_connects(
    tls_server: ZooKeeperServer, material: ZkTlsMaterial
) -> None:
    tls = tls_of(ssl_trustStore_location=material.ca.cert)
    assert await read_back(tls_server.secure_hosts, tls) == b"over tls"


async def test_pkcs12_trust_store_made_by_keytool_connects(
    tls_server: ZooKeeperServer, material: ZkTlsMaterial
) -> None:
    tls = tls_of(ssl_trustStore_location=material.trust_p12, ssl_trustStore_password=STORE_PASSWORD)
    assert tls.trust_store is not None and tls.trust_store.type == "PKCS12"
    assert await read_back(tls_server.secure_hosts, tls) == b"over tls"


async def test_the_session_survives_a_server_restart_over_tls(
    tls_server: ZooKeeperServer, material: ZkTlsMaterial
) -> None:
    """Each reconnect makes a new TLS connection (files read again) and resumes the session."""
    tls = tls_of(ssl_trustStore_location=material.ca.cert)
    path = f"/eph-{uuid.uuid4().hex[:12]}"
    zk = ZkClient(
        tls_server.secure_hosts, timeout=TIMEOUT, session_timeout=15.0, security=ZkSecurity(tls=tls)
    )
    await zk.start()
    try:
        before = zk.client_id
        await zk.create(path, b"mine", ephemeral=True)
        states = zk.states()
        tls_server.restart()
        async with asyncio.timeout(15):
            while str(await anext(states)) != "CONNECTED":
                pass
        assert zk.client_id == before
        assert (await zk.get(path))[0] == b"mine"
    finally:
        await zk.close()


async def test_wrong_ca_fails_in_one_line_within_the_timeout(
    tls_server: ZooKeeperServer, material: ZkTlsMaterial
) -> None:
    tls = tls_of(ssl_trustStore_location=material.other_ca.cert)
    started = time.monotonic()
    with pytest.raises(ZkTlsError) as caught:
        await ZkClient(
            tls_server.secure_hosts, timeout=TIMEOUT, security=ZkSecurity(tls=tls)
        ).start()
    assert time.monotonic() - started < TIMEOUT + 1.5
    assert caught.value.exit_code == 3
    assert str(caught.value) == (
        f"TLS handshake with ZooKeeper at {tls_server.secure_hosts} failed: certificate verify "
        "failed: self-signed certificate in certificate chain (is "
        "zookeeper.ssl.trustStore.location the CA that signed the server's certificate?)"
    )


async def test_the_connect_strings_host_name_is_verified(
    tls_server: ZooKeeperServer, material: ZkTlsMaterial
) -> None:
    # The certificate names localhost (and 127.0.0.1): by name works as by address does.
    tls = tls_of(ssl_trustStore_location=material.ca.cert)
    assert tls.hostname_verification and tls.ssl_context().check_hostname
    assert await read_back(f"localhost:{tls_server.secure_port}", tls) == b"over tls"
    off = tls_of(ssl_trustStore_location=material.ca.cert, ssl_hostnameVerification="false")
    assert not off.ssl_context().check_hostname


async def test_mutual_tls_with_pem_and_pkcs12_key_stores(
    mtls_server: ZooKeeperServer, material: ZkTlsMaterial
) -> None:
    pem = tls_of(
        ssl_trustStore_location=material.ca.cert, ssl_keyStore_location=material.client_pem
    )
    assert await read_back(mtls_server.secure_hosts, pem) == b"over tls"
    p12 = tls_of(
        ssl_trustStore_location=material.trust_p12,
        ssl_trustStore_password=STORE_PASSWORD,
        ssl_keyStore_location=material.client_p12,
        ssl_keyStore_password=STORE_PASSWORD,
    )
    assert await read_back(mtls_server.secure_hosts, p12) == b"over tls"


async def test_mutual_tls_without_our_certificate_fails_in_one_line(
    mtls_server: ZooKeeperServer, material: ZkTlsMaterial
) -> None:
    tls = tls_of(ssl_trustStore_location=material.ca.cert)
    started = time.monotonic()
    with pytest.raises(ZkTlsError) as caught:
        await ZkClient(
            mtls_server.secure_hosts, timeout=TIMEOUT, security=ZkSecurity(tls=tls)
        ).start()
    assert time.monotonic() - started < TIMEOUT + 1.5
    assert str(caught.value) == (
        f"TLS handshake with ZooKeeper at {mtls_server.secure_hosts} failed: the server refused "
        "the handshake (SSLV3_ALERT_BAD_CERTIFICATE); a server with ssl.clientAuth=need wants "
        "our certificate: zookeeper.ssl.keyStore.location"
    )


async def test_tls_to_the_plain_port_fails_in_one_line(
    tls_server: ZooKeeperServer, material: ZkTlsMaterial
) -> None:
    tls = tls_of(ssl_trustStore_location=material.ca.cert)
    with pytest.raises(ZkTlsError) as caught:
        await ZkClient(tls_server.hosts, timeout=TIMEOUT, security=ZkSecurity(tls=tls)).start()
    assert str(caught.value) == (
        f"TLS handshake with ZooKeeper at {tls_server.hosts} failed: the server closed the "
        "connection during the handshake (UNEXPECTED_EOF_WHILE_READING): is it the "
        "secureClientPort? Or a server with ssl.clientAuth=need wants our certificate: "
        "zookeeper.ssl.keyStore.location"
    )


async def test_an_unanswered_handshake_gives_up_within_the_timeout(
    material: ZkTlsMaterial,
) -> None:
    tls = tls_of(ssl_trustStore_location=material.ca.cert)
    with socket.socket() as silent:  # takes the connection, never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        hosts = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(ZkTimeoutError) as caught:
            await ZkClient(hosts, timeout=2.0, security=ZkSecurity(tls=tls)).start()
        assert time.monotonic() - started < 3.0
    assert str(caught.value) == (
        f"cannot connect to ZooKeeper at {hosts} within 2s: a server took the connection and "
        "did not answer"
    )


# --- bad files and passwords: exit 2 before any connection -----------------------------------


def test_jks_is_refused_with_the_keytool_command(material: ZkTlsMaterial) -> None:
    jks = material.trust_jks
    with pytest.raises(ConfigError) as caught:
        tls_of(ssl_trustStore_location=jks)
    assert str(caught.value) == (
        f"zookeeper.ssl.trustStore.location {jks} is a JKS store, which bk-auditor does not "
        f"read: make a PKCS12 copy with keytool -importkeystore -srckeystore {jks} "
        f"-srcstoretype JKS -destkeystore {jks.with_suffix('.p12')} -deststoretype PKCS12 and "
        "point zookeeper.ssl.trustStore.location at it (from test)"
    )


def test_wrong_pkcs12_password(material: ZkTlsMaterial) -> None:
    with pytest.raises(ConfigError) as caught:
        tls_of(ssl_keyStore_location=material.client_p12, ssl_keyStore_password="wrong")
    assert str(caught.value) == (
        f"zookeeper.ssl.keyStore.location {material.client_p12}: not a PKCS12 store, or the "
        "password is wrong (zookeeper.ssl.keyStore.password) (from test)"
    )


def test_missing_and_unreadable_files(material: ZkTlsMaterial, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(ConfigError) as caught:
        tls_of(ssl_trustStore_location=missing)
    assert str(caught.value) == (
        f"zookeeper.ssl.trustStore.location {missing}: no such file (from test)"
    )
    directory = tmp_path / "dir.pem"
    directory.mkdir()
    with pytest.raises(ConfigError) as caught:
        tls_of(ssl_trustStore_location=directory)
    assert str(caught.value) == (
        f"zookeeper.ssl.trustStore.location {directory}: not a regular file (from test)"
    )
    # A certificate without its key is no key store.
    with pytest.raises(ConfigError) as caught:
        tls_of(ssl_keyStore_location=material.client.cert)
    assert str(caught.value).startswith(
        f"zookeeper.ssl.keyStore.location {material.client.cert}: needs a private key and its "
        "certificate in one PEM file"
    )


# --- the CLI and the daemon's configuration ----------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("BK_AUDITOR_") and not k.endswith("_OPTS") and k != "JAVA_TOOL_OPTIONS"
    }
    env.update(extra)
    return env


async def test_cli_reads_over_tls_from_java_options(
    tls_server: ZooKeeperServer, material: ZkTlsMaterial
) -> None:
    chroot = f"/c-{uuid.uuid4().hex[:12]}"
    tls = tls_of(ssl_trustStore_location=material.ca.cert)
    async with ZkClient(
        tls_server.secure_hosts + chroot, timeout=TIMEOUT, security=ZkSecurity(tls=tls)
    ) as zk:
        writer = ClusterWriter(zk, ROOT)
        await writer.init_cluster()
        await writer.write_ledger(make_metadata(7, ["b1:3181", "b2:3181"]))
    # What a Pulsar pod's environment says to its JVMs.
    opts = (
        "-Xmx1g -Dzookeeper.clientCnxnSocket=org.apache.zookeeper.ClientCnxnSocketNetty "
        f"-Dzookeeper.client.secure=true -Dzookeeper.ssl.trustStore.location={material.ca.cert}"
    )
    rc, out, err = await bk(
        "ledgers", "--zk", tls_server.secure_hosts + chroot, "--timeout", str(TIMEOUT),
        env=_env(PULSAR_EXTRA_OPTS=opts), within=30,
    )  # fmt: skip
    assert (rc, err) == (
        0,
        "bk-auditor: note: ignored: zookeeper.clientCnxnSocket\n"
        "1 ledgers, 0 corrupt, 0 deleted during the walk\n",
    )
    assert out.split()[0] == "7"


async def test_cli_wrong_ca_exits_3_in_one_line(
    tls_server: ZooKeeperServer, material: ZkTlsMaterial, tmp_path: Path
) -> None:
    config = tmp_path / "zk-client.properties"
    config.write_text(
        "zookeeper.client.secure=true\n"
        f"zookeeper.ssl.trustStore.location={material.other_ca.cert}\n"
    )
    rc, out, err = await bk(
        "ledgers", "--zk", tls_server.secure_hosts, "--timeout", "2",
        "--zk-tls-config", str(config), env=_env(), within=30,
    )  # fmt: skip
    assert (rc, out) == (3, "")
    assert err == (
        f"bk-auditor: error: TLS handshake with ZooKeeper at {tls_server.secure_hosts} failed: "
        "certificate verify failed: self-signed certificate in certificate chain (is "
        "zookeeper.ssl.trustStore.location the CA that signed the server's certificate?)\n"
    )


async def test_cli_bad_trust_store_exits_2(tmp_path: Path) -> None:
    rc, out, err = await bk(
        "ledgers", "--zk", "127.0.0.1:9",
        env=_env(
            BK_AUDITOR_ZOOKEEPER_CLIENT_SECURE="true",
            BK_AUDITOR_ZOOKEEPER_SSL_TRUSTSTORE_LOCATION=str(tmp_path / "ca.pem"),
        ),
        within=30,
    )  # fmt: skip
    assert (rc, out) == (2, "")
    assert err == (
        f"bk-auditor: error: zookeeper.ssl.trustStore.location {tmp_path / 'ca.pem'}: no such "
        "file (from environment BK_AUDITOR_ZOOKEEPER_SSL_TRUSTSTORE_LOCATION)\n"
    )


def test_daemon_config_carries_tls_into_zk_security(
    material: ZkTlsMaterial, tmp_path: Path
) -> None:
    toml = tmp_path / "auditor.toml"
    toml.write_text(
        '[daemon]\nzk = "127.0.0.1:2281"\nidentity = "h:3181"\n\n'
        "[zookeeper]\nclient.secure = true\n"
        f'"ssl.trustStore.location" = "{material.trust_p12}"\n'
        f'ssl.trustStore.password = "{STORE_PASSWORD}"\n'
    )
    cfg = load_daemon_config(str(toml), env={}, hostname="h")
    tls = cfg.zk_security.tls
    assert tls is not None and tls.trust_store is not None
    assert (tls.trust_store.location, tls.trust_store.type) == (str(material.trust_p12), "PKCS12")
