"""ZooKeeper's Java client TLS properties: every place and spelling they are accepted in gives
the same `ZkTls`; precedence between places; what is refused, and how."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from auditor.cli.cluster import security_from_args
from auditor.daemon.config import load_daemon_config
from auditor.daemon.config.zookeeper import cli_zk_tls
from auditor.errors import ConfigError
from auditor.testing.pki import Issued, issue, new_ca
from auditor.zk.tls import StoreFile, ZkTls, zk_tls_from_properties


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Issued, Path]:
    """A CA certificate, and a client key store (key and certificate in one PEM file)."""
    d = tmp_path_factory.mktemp("pki")
    ca = new_ca(d, "ca")
    client = issue(d, "client", ca, "bk-auditor")
    store = d / "client-store.pem"
    store.write_bytes(client.key.read_bytes() + client.cert.read_bytes())
    return ca, store


def expected(ca: Path, store: Path) -> ZkTls:
    return ZkTls(
        trust_store=StoreFile(str(ca), "PEM"),
        key_store=StoreFile(str(store), "PEM"),
        hostname_verification=False,
        minimum_version=ssl.TLSVersion.TLSv1_2,
        maximum_version=ssl.TLSVersion.TLSv1_3,
    )


def same(tls: ZkTls | None, want: ZkTls) -> None:
    """Equal but for where each value came from (labels and origins differ by place)."""
    assert tls is not None
    for store, wanted in ((tls.trust_store, want.trust_store), (tls.key_store, want.key_store)):
        assert store is not None and wanted is not None
        assert (store.location, store.type, store.password) == (
            wanted.location,
            wanted.type,
            wanted.password,
        )
    assert (tls.hostname_verification, tls.minimum_version, tls.maximum_version) == (
        want.hostname_verification,
        want.minimum_version,
        want.maximum_version,
    )


def daemon_tls(tmp_path: Path, toml: str = "", **kw: object) -> ZkTls | None:
    path = tmp_path / "auditor.toml"
    path.write_text('[daemon]\nzk = "127.0.0.1:2281"\nidentity = "h:3181"\n' + toml)
    cfg = load_daemon_config(str(path), hostname="h", **kw)  # type: ignore[arg-type]
    return cfg.zk_security.tls


def java_lines(ca: Path, store: Path, prefix: str = "zookeeper.") -> list[str]:
    return [
        f"{prefix}client.secure=true",
        f"{prefix}ssl.trustStore.location={ca}",
        f"{prefix}ssl.keyStore.location={store}",
        f"{prefix}ssl.hostnameVerification=false",
        f"{prefix}ssl.enabledProtocols=TLSv1.2,TLSv1.3",
    ]


def test_every_place_and_spelling_gives_the_same_tls(
    pki: tuple[Issued, Path], tmp_path: Path
) -> None:
    ca, store = pki[0].cert, pki[1]
    want = expected(ca, store)
    lines = java_lines(ca, store)

    # [zookeeper] with quoted keys, dotted keys, and the zookeeper. prefix.
    quoted = "".join(
        f'"{k.removeprefix("zookeeper.")}" = "{v}"\n' for k, v in (x.split("=") for x in lines)
    )
    same(daemon_tls(tmp_path, "[zookeeper]\n" + quoted, env={}), want)
    dotted = (
        "[zookeeper]\nclient.secure = true\nssl.hostnameVerification = false\n"
        f'ssl.trustStore.location = "{ca}"\nssl.keyStore = {{ location = "{store}" }}\n'
        'ssl.enabledProtocols = "TLSv1.2,TLSv1.3"\n'
    )
    same(daemon_tls(tmp_path, dotted, env={}), want)
    prefixed = "[zookeeper]\n" + "".join(
        f'"{k}" = "{v}"\n' for k, v in (x.split("=") for x in lines)
    )
    same(daemon_tls(tmp_path, prefixed, env={}), want)

    # The environment, upper case and underscores.
    env = {
        "BK_AUDITOR_ZOOKEEPER_" + k.removeprefix("zookeeper.").replace(".", "_").upper(): v
        for k, v in (x.split("=") for x in lines)
    }
    assert "BK_AUDITOR_ZOOKEEPER_SSL_TRUSTSTORE_LOCATION" in env
    same(daemon_tls(tmp_path, env=env), want)
    same(cli_zk_tls(None, env), want)

    # --set, with and without the prefix's case.
    same(daemon_tls(tmp_path, env={}, overrides=lines), want)

    # bk_server.conf lines with the full names, among BookKeeper's own keys.
    conf = tmp_path / "bk_server.conf"
    conf.write_text("zkServers=zk1:2181\n" + "\n".join(lines) + "\n")
    same(daemon_tls(tmp_path, env={}, bk_conf=str(conf)), want)

    # -D options in each Java option variable, amid other options.
    opts = "-Xmx1g " + " ".join(f"-D{x}" for x in lines) + " -Dzookeeper.sasl.client=false"
    for var in ("PULSAR_EXTRA_OPTS", "BOOKIE_EXTRA_OPTS", "JAVA_TOOL_OPTIONS"):
        same(daemon_tls(tmp_path, env={var: opts}), want)
        same(cli_zk_tls(None, {var: opts}), want)

    # A ZooKeeper client config file: named by zookeeper.client.config, or --zk-tls-config.
    client_config = tmp_path / "zk-client.properties"
    client_config.write_text("\n".join(lines) + "\n")
    same(cli_zk_tls(str(client_config), {}), want)
    same(
        daemon_tls(
            tmp_path, env={"PULSAR_EXTRA_OPTS": f"-Dzookeeper.client.config={client_config}"}
        ),
        want,
    )
    security = security_from_args(None, False, {}, tls_config=str(client_config))
    same(security.tls, want)


def test_precedence_between_places(pki: tuple[Issued, Path], tmp_path: Path) -> None:
    ca = pki[0].cert
    other = tmp_path / "other.pem"
    other.write_bytes(ca.read_bytes())
    conf = tmp_path / "bk_server.conf"
    conf.write_text(f"zookeeper.client.secure=true\nzookeeper.ssl.trustStore.location={ca}\n")

    def trust(**kw: object) -> str:
        tls = daemon_tls(tmp_path, kw.pop("toml", ""), bk_conf=str(conf), **kw)  # type: ignore[arg-type]
        assert tls is not None and tls.trust_store is not None
        return tls.trust_store.location

    opts = {"PULSAR_EXTRA_OPTS": f"-Dzookeeper.ssl.trustStore.location={other}"}
    table = f'[zookeeper]\n"ssl.trustStore.location" = "{ca}"\n'
    env = {**opts, "BK_AUDITOR_ZOOKEEPER_SSL_TRUSTSTORE_LOCATION": str(other)}
    assert trust(env={}) == str(ca)  # bk_server.conf alone
    assert trust(env=opts) == str(other)  # -D over bk_server.conf
    assert trust(env=opts, toml=table) == str(ca)  # [zookeeper] over -D
    assert trust(env=env, toml=table) == str(other)  # environment over [zookeeper]
    set_ca = [f"zookeeper.ssl.trustStore.location={ca}"]
    assert trust(env=env, toml=table, overrides=set_ca) == str(ca)  # --set over all
    # A later -D wins, as on a JVM's command line.
    later = {"JAVA_TOOL_OPTIONS": f"-Dzookeeper.ssl.trustStore.location={ca}", **opts}
    assert trust(env=later) == str(other)


def test_secure_unset_or_false_means_plain(pki: tuple[Issued, Path], tmp_path: Path) -> None:
    ca = pki[0].cert
    assert daemon_tls(tmp_path, env={}) is None
    assert cli_zk_tls(None, {"BK_AUDITOR_ZOOKEEPER_SSL_TRUSTSTORE_LOCATION": str(ca)}) is None
    env = {"PULSAR_EXTRA_OPTS": "-Dzookeeper.client.secure=false"}
    assert daemon_tls(tmp_path, env=env) is None


def test_defaults_are_javas(pki: tuple[Issued, Path]) -> None:
    tls = zk_tls_from_properties({"zookeeper.client.secure": ("true", "t")})
    assert tls == ZkTls()  # the system's CAs, hostname verification on, any TLS version
    assert tls.ssl_context().check_hostname
    ca = str(pki[0].cert)
    for value, versions in (
        ("TLSv1.2", (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2)),
        ("TLSv1.3", (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_3)),
        ("TLS", (None, None)),
    ):
        t = zk_tls_from_properties(
            {
                "zookeeper.client.secure": ("true", "t"),
                "zookeeper.ssl.trustStore.location": (ca, "t"),
                "zookeeper.ssl.protocol": (value, "t"),
            }
        )
        assert t is not None and (t.minimum_version, t.maximum_version) == versions


def test_ignored_properties_are_named(pki: tuple[Issued, Path]) -> None:
    tls = cli_zk_tls(
        None,
        {
            "PULSAR_EXTRA_OPTS": "-Dzookeeper.client.secure=true "
            "-Dzookeeper.clientCnxnSocket=org.apache.zookeeper.ClientCnxnSocketNetty "
            "-Dzookeeper.ssl.ciphersuites=TLS_AES_128_GCM_SHA256"
        },
    )
    assert tls is not None
    assert tls.ignored == ("zookeeper.clientCnxnSocket", "zookeeper.ssl.ciphersuites")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"BK_AUDITOR_ZOOKEEPER_SSL_TRUSTSTORE_LOCATIN": "x"},
            "unknown ZooKeeper client property 'SSL_TRUSTSTORE_LOCATIN' (from environment "
            "BK_AUDITOR_ZOOKEEPER_SSL_TRUSTSTORE_LOCATIN); known: ",
        ),
        (
            {"BK_AUDITOR_ZOOKEEPER_CLIENT_SECURE": "maybe"},
            "zookeeper.client.secure must be true or false, got 'maybe' (from environment "
            "BK_AUDITOR_ZOOKEEPER_CLIENT_SECURE)",
        ),
        (
            {"PULSAR_EXTRA_OPTS": "-Dzookeeper.client.secure=true -Dzookeeper.ssl.crl=true"},
            "zookeeper.ssl.crl=true cannot be honoured: Python's TLS does not fetch revocation "
            "lists or OCSP answers; unset it for bk-auditor (from environment PULSAR_EXTRA_OPTS "
            "-Dzookeeper.ssl.crl)",
        ),
        (
            {
                "BK_AUDITOR_ZOOKEEPER_CLIENT_SECURE": "true",
                "BK_AUDITOR_ZOOKEEPER_SSL_OCSP": "true",
            },
            "zookeeper.ssl.ocsp=true cannot be honoured: Python's TLS does not fetch revocation "
            "lists or OCSP answers; unset it for bk-auditor (from environment "
            "BK_AUDITOR_ZOOKEEPER_SSL_OCSP)",
        ),
        (
            {
                "BK_AUDITOR_ZOOKEEPER_CLIENT_SECURE": "true",
                "BK_AUDITOR_ZOOKEEPER_SSL_CONTEXT_SUPPLIER_CLASS": "com.example.Ctx",
            },
            "zookeeper.ssl.context.supplier.class names a Java class, which bk-auditor cannot "
            "run: give the stores with zookeeper.ssl.trustStore.* and zookeeper.ssl.keyStore.* "
            "instead (from environment BK_AUDITOR_ZOOKEEPER_SSL_CONTEXT_SUPPLIER_CLASS)",
        ),
        (
            {
                "BK_AUDITOR_ZOOKEEPER_CLIENT_SECURE": "true",
                "BK_AUDITOR_ZOOKEEPER_SSL_PROTOCOL": "SSLv3",
            },
            "zookeeper.ssl.protocol takes TLSv1, TLSv1.1, TLSv1.2, TLSv1.3, got 'SSLv3' (from "
            "environment BK_AUDITOR_ZOOKEEPER_SSL_PROTOCOL)",
        ),
        (
            {
                "BK_AUDITOR_ZOOKEEPER_CLIENT_SECURE": "true",
                "BK_AUDITOR_ZOOKEEPER_SSL_TRUSTSTORE_LOCATION": "/etc/zk/ca.crt",
            },
            "zookeeper.ssl.trustStore.location /etc/zk/ca.crt: cannot tell the store's type from "
            "its file name (.pem, .p12, .pfx, .jks): set zookeeper.ssl.trustStore.type (from "
            "environment BK_AUDITOR_ZOOKEEPER_SSL_TRUSTSTORE_LOCATION)",
        ),
        (
            {
                "BK_AUDITOR_ZOOKEEPER_CLIENT_SECURE": "true",
                "BK_AUDITOR_ZOOKEEPER_SSL_KEYSTORE_LOCATION": "/k.bcfks",
                "BK_AUDITOR_ZOOKEEPER_SSL_KEYSTORE_TYPE": "bcfks",
            },
            "zookeeper.ssl.keyStore.location /k.bcfks is a BCFKS store, which bk-auditor does "
            "not read: make a PKCS12 copy with keytool -importkeystore -srckeystore /k.bcfks "
            "-srcstoretype BCFKS -destkeystore /k.p12 -deststoretype PKCS12 and point "
            "zookeeper.ssl.keyStore.location at it (from environment "
            "BK_AUDITOR_ZOOKEEPER_SSL_KEYSTORE_LOCATION)",
        ),
        (
            {
                "BK_AUDITOR_ZOOKEEPER_CLIENT_SECURE": "true",
                "BK_AUDITOR_ZOOKEEPER_SSL_KEYSTORE_LOCATION": "/k.p12",
                "BK_AUDITOR_ZOOKEEPER_SSL_KEYSTORE_PASSWORDPATH": "/no/such/password",
            },
            "zookeeper.ssl.keyStore.passwordPath /no/such/password: no such file (from "
            "environment BK_AUDITOR_ZOOKEEPER_SSL_KEYSTORE_PASSWORDPATH)",
        ),
        (
            {
                "BK_AUDITOR_ZOOKEEPER_CLIENT_SECURE": "true",
                "BK_AUDITOR_ZOOKEEPER_SSL_ENABLEDPROTOCOLS": "TLSv1.1,TLSv1.3",
            },
            "zookeeper.ssl.enabledProtocols must be consecutive versions (OpenSSL takes a "
            "range), got 'TLSv1.1,TLSv1.3' (from environment "
            "BK_AUDITOR_ZOOKEEPER_SSL_ENABLEDPROTOCOLS)",
        ),
        (
            {"PULSAR_EXTRA_OPTS": "-Dzookeeper.client.secure='true"},
            "environment PULSAR_EXTRA_OPTS does not parse as options: No closing quotation",
        ),
    ],
)
def test_refusals_are_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        cli_zk_tls(None, env)
    if message.endswith("known: "):
        assert str(caught.value).startswith(message)
    else:
        assert str(caught.value) == message


def test_unknown_key_in_our_table_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        daemon_tls(tmp_path, '[zookeeper]\nssl.trustStore.locaton = "/x.pem"\n', env={})
    assert str(caught.value).startswith(
        "unknown ZooKeeper client property 'ssl.trustStore.locaton' (from "
        f"{tmp_path / 'auditor.toml'} [zookeeper] ssl.trustStore.locaton); known: client.secure, "
    )
    with pytest.raises(ConfigError) as caught:
        daemon_tls(tmp_path, env={}, overrides=["zookeeper.ssl.trustStore=x"])
    assert str(caught.value).startswith(
        "unknown ZooKeeper client property 'zookeeper.ssl.trustStore' (from --set); known: "
    )


def test_password_path_wins_over_password(pki: tuple[Issued, Path], tmp_path: Path) -> None:
    key = tmp_path / "enc.key"
    key_store = tmp_path / "enc-store.pem"
    from auditor.testing.pki import _openssl

    _openssl("pkey", "-in", pki[0].key, "-out", key, "-aes256", "-passout", "pass:s3cret")
    key_store.write_bytes(key.read_bytes() + pki[0].cert.read_bytes())
    password_file = tmp_path / "password"
    password_file.write_text("s3cret\n")
    base = {
        "zookeeper.client.secure": ("true", "t"),
        "zookeeper.ssl.keyStore.location": (str(key_store), "t"),
        "zookeeper.ssl.keyStore.password": ("wrong", "t"),
    }
    with pytest.raises(ConfigError) as caught:
        zk_tls_from_properties(base)
    assert str(caught.value) == (
        f"zookeeper.ssl.keyStore.location {key_store}: needs a private key and its certificate "
        "in one PEM file, the key unencrypted or encrypted with zookeeper.ssl.keyStore.password "
        "(from t)"
    )
    tls = zk_tls_from_properties(
        {**base, "zookeeper.ssl.keyStore.passwordPath": (str(password_file), "t")}
    )
    assert tls is not None and tls.key_store is not None
    assert tls.key_store.password == "s3cret"
    assert "s3cret" not in repr(tls)
