"""Tests and the demo run against a real ZooKeeper, never a fake, TLS-only ones included,
and need one that starts in moments on a port nobody else uses.

A throwaway standalone ZooKeeper server from Debian's `zookeeper` package.

This starts `QuorumPeerMain` on a free loopback port with its own data directory, waits
until it answers `ruok`/`srvr`, and removes everything on stop. The jar's manifest
Class-Path pulls in its dependencies, so the class path is just the config directory and
`zookeeper.jar` (what Debian's own `environment` file sets).

With `tls`, the server also serves a `secureClientPort` through its Netty
connection factory, from Java key and trust stores (`make_tls_material` makes
them with openssl and the JDK's keytool). Debian's zookeeper 3.8.0 cannot do
that as packaged: its jar's Class-Path lists netty-handler but not
netty-codec, which netty's SslHandler extends, so every TLS connection dies
with NoClassDefFoundError. The jar is there (libnetty-java, a dependency of
the package), so TLS mode adds `/usr/share/java/netty-codec.jar` to the class
path; nothing more needs installing.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from auditor.errors import ServiceUnavailableError
from auditor.testing.pki import Issued, issue, new_ca
from auditor.testing.serverprocess import ServerProcess

ZK_JAR = Path(os.environ.get("BK_AUDITOR_ZK_JAR", "/usr/share/java/zookeeper.jar"))
ZK_CONF_DIR = Path("/etc/zookeeper/conf")
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
#: Missing from Debian's zookeeper.jar Class-Path, needed by Netty's TLS (see above).
NETTY_CODEC_JAR = Path("/usr/share/java/netty-codec.jar")
#: The password of every store `make_tls_material` writes.
STORE_PASSWORD = "changeit"
#: Generous for a JVM start on a loaded machine, but never a hung fixture.
_TOOL_TIMEOUT = 60.0
_AUTH_PROVIDERS = {
    "digest": "org.apache.zookeeper.server.auth.DigestAuthenticationProvider",
    "sasl": "org.apache.zookeeper.server.auth.SASLAuthenticationProvider",
}


class ZooKeeperServerError(ServiceUnavailableError):
    """The throwaway ZooKeeper could not be started."""


#: Where `free_port` looks first: from here up to the start of the kernel's ephemeral range.
LOWEST_PORT = 10000


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A loopback port nothing listens on now, for a server a test starts next.

    Why not `bind(0)`: the kernel picks that port from its ephemeral range, the range it
    also hands to every outgoing connection, and between our check and the server's bind
    one of the suite's thousands of connections (on another xdist worker, say) can take
    it. A port below the ephemeral range is never handed out that way; only another
    explicit bind can take it. Where the machine leaves no room below it, `bind(0)`.
    """
    top = _ephemeral_start() - 1
    if top - LOWEST_PORT >= 1000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randint(LOWEST_PORT, top)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue  # in use (or in TIME_WAIT): another
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def four_letter(port: int, word: str, timeout: float = 1.0) -> str:
    """Sends a ZooKeeper four-letter command; '' when the server does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while True:
                b = s.recv(4096)
                if not b:
                    break
                chunks.append(b)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True, slots=True)
class ZkTlsMaterial:
    """Everything a TLS ZooKeeper test needs, all in one directory.

    PEM (openssl): `ca` signs the server's and the client's certificates;
    `other_ca` signs nothing of theirs (the wrong CA); `client_pem` is the
    client's key and certificate in one file, the form of a PEM key store.
    Java stores (password `STORE_PASSWORD`): the server's key store (PKCS12)
    and trust store (JKS, by keytool), and for our client a PKCS12 key store, a
    PKCS12 trust store and a JKS trust store (by keytool).
    """

    directory: Path
    ca: Issued
    other_ca: Issued
    server: Issued
    client: Issued
    client_pem: Path
    server_keystore: Path
    server_truststore: Path
    client_p12: Path
    trust_p12: Path
    trust_jks: Path


def _tool(*args: str | Path) -> None:
    try:
        subprocess.run(
            [str(a) for a in args], check=True, capture_output=True, timeout=_TOOL_TIMEOUT
        )
    except subprocess.CalledProcessError as exc:
        raise ZooKeeperServerError(
            f"{args[0]} failed: {exc.stderr.decode(errors='replace').strip()[:300]}"
        ) from None


def _keytool_trust(store: Path, kind: str, cert: Path) -> None:
    _tool(
        "keytool", "-importcert", "-noprompt", "-alias", "ca", "-file", cert,
        "-keystore", store, "-storetype", kind, "-storepass", STORE_PASSWORD,
    )  # fmt: skip


def make_tls_material(directory: Path) -> ZkTlsMaterial:
    """A CA, a server certificate for 127.0.0.1 and localhost, a client certificate, an
    unrelated CA, and the Java stores made of them (a few seconds: keytool is a JVM)."""
    if shutil.which("keytool") is None:
        raise ZooKeeperServerError("no keytool on PATH: install a Java runtime (make does this)")
    directory.mkdir(parents=True, exist_ok=True)
    ca = new_ca(directory, "zk-ca")
    other_ca = new_ca(directory, "zk-other-ca")
    server = issue(directory, "zk-server", ca, "localhost", ["IP:127.0.0.1", "DNS:localhost"])
    client = issue(directory, "zk-client", ca, "bk-auditor")
    client_pem = directory / "zk-client-keystore.pem"
    client_pem.write_bytes(client.key.read_bytes() + client.cert.read_bytes())
    client_pem.chmod(0o600)
    stores = {
        "server_keystore": (server, directory / "zk-server-keystore.p12"),
        "client_p12": (client, directory / "zk-client-keystore.p12"),
    }
    for issued, store in stores.values():
        _tool(
            "openssl", "pkcs12", "-export", "-in", issued.cert, "-inkey", issued.key,
            "-certfile", ca.cert, "-out", store, "-passout", f"pass:{STORE_PASSWORD}",
        )  # fmt: skip
    server_truststore = directory / "zk-server-truststore.jks"
    trust_p12, trust_jks = directory / "zk-truststore.p12", directory / "zk-truststore.jks"
    _keytool_trust(server_truststore, "JKS", ca.cert)
    _keytool_trust(trust_p12, "PKCS12", ca.cert)
    _keytool_trust(trust_jks, "JKS", ca.cert)
    return ZkTlsMaterial(
        directory=directory,
        ca=ca,
        other_ca=other_ca,
        server=server,
        client=client,
        client_pem=client_pem,
        server_keystore=stores["server_keystore"][1],
        server_truststore=server_truststore,
        client_p12=stores["client_p12"][1],
        trust_p12=trust_p12,
        trust_jks=trust_jks,
    )


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A `secureClientPort` from `material`; `client_auth` is ZooKeeper's ssl.clientAuth
    (need: only clients with a certificate the CA signed; none: any TLS client)."""

    material: ZkTlsMaterial
    client_auth: str = "none"


class ZooKeeperServer(ServerProcess):
    """One standalone server; `start()` blocks until it serves (or raises)."""

    def __init__(
        self,
        base_dir: Path | None = None,
        port: int | None = None,
        *,
        require_auth: Sequence[str] = (),
        super_password: str = "",
        sasl_users: Mapping[str, str] | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        """`require_auth`: the schemes ("digest", "sasl") of which every session must have
        authenticated with one before any request (ZooKeeper 3.7+'s `enforce.auth`), as a
        secured BookKeeper's ZooKeeper would. `super_password`: the digest user `super`
        with it bypasses every ACL (an admin). `sasl_users`: user -> password for SASL
        DIGEST-MD5 (a JAAS `Server` section with ZooKeeper's DigestLoginModule). `tls`:
        also serve TLS on `secure_port` (the plain port stays, for readiness and 4lw).
        """
        unknown = set(require_auth) - set(_AUTH_PROVIDERS)
        if unknown:
            raise ValueError(f"require_auth takes {sorted(_AUTH_PROVIDERS)}, got {sorted(unknown)}")
        super().__init__(
            base_dir or Path(tempfile.mkdtemp(prefix="bk-auditor-zk-")), base_dir is None
        )
        self.port = port or free_port()
        self.require_auth = tuple(require_auth)
        self.super_password = super_password
        self.sasl_users = dict(sasl_users or {})
        self.tls = tls
        self.secure_port = free_port() if tls is not None else 0

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def secure_hosts(self) -> str:
        """The TLS connect string (with `tls`)."""
        return f"127.0.0.1:{self.secure_port}"

    def _tls_lines(self) -> list[str]:
        if self.tls is None:
            return []
        m = self.tls.material
        return [
            f"secureClientPort={self.secure_port}",
            "secureClientPortAddress=127.0.0.1",
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"ssl.keyStore.location={m.server_keystore}",
            f"ssl.keyStore.password={STORE_PASSWORD}",
            "ssl.keyStore.type=PKCS12",
            f"ssl.trustStore.location={m.server_truststore}",
            f"ssl.trustStore.password={STORE_PASSWORD}",
            "ssl.trustStore.type=JKS",
            f"ssl.clientAuth={self.tls.client_auth}",
        ]

    def _write_config(self) -> Path:
        data = self.base_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.base_dir / "zoo.cfg"
        cfg.write_text(
            "\n".join(
                [
                    "tickTime=500",
                    f"dataDir={data}",
                    f"clientPort={self.port}",
                    "clientPortAddress=127.0.0.1",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,srvr,mntr,cons",
                    "minSessionTimeout=1000",
                    "maxSessionTimeout=60000",
                    "maxClientCnxns=0",
                    # Large multi-ops from the cluster writer stay well below this.
                    "jute.maxbuffer=8388608",
                    *self._auth_lines(),
                    *self._tls_lines(),
                    "",
                ]
            )
        )
        return cfg

    def _auth_lines(self) -> list[str]:
        schemes = sorted({*self.require_auth, *(["sasl"] if self.sasl_users else [])})
        lines = [f"authProvider.{i}={_AUTH_PROVIDERS[s]}" for i, s in enumerate(schemes, 1)]
        if self.require_auth:
            lines += ["enforce.auth.enabled=true", f"enforce.auth.schemes={','.join(schemes)}"]
        return lines

    def _jvm_options(self) -> list[str]:
        options: list[str] = []
        if self.super_password:
            from kazoo.security import make_digest_acl_credential

            # "super:<base64 sha1>", the form DigestAuthenticationProvider.superDigest takes.
            digest = make_digest_acl_credential("super", self.super_password)
            options.append(f"-Dzookeeper.DigestAuthenticationProvider.superDigest={digest}")
        if self.sasl_users:
            options.append(f"-Djava.security.auth.login.config={self._write_jaas()}")
        return options

    def _write_jaas(self) -> Path:
        users = []
        for user, password in self.sasl_users.items():
            if not re.fullmatch(r"[\w.-]+", user) or '"' in password or "\\" in password:
                raise ValueError(f"SASL user {user!r}: use plain names and unquoted passwords")
            users.append(f'  user_{user}="{password}"')
        jaas = self.base_dir / "jaas.conf"
        jaas.write_text(
            "Server {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n"
            + "\n".join(users)
            + ";\n};\n"
        )
        return jaas

    def start(self, timeout: float = 30.0) -> None:
        if self.tls is not None and not NETTY_CODEC_JAR.exists():
            raise ZooKeeperServerError(
                f"{NETTY_CODEC_JAR} not found: install Debian's libnetty-java (TLS needs it)"
            )
        if not ZK_JAR.exists():
            raise ZooKeeperServerError(
                f"{ZK_JAR} not found: install Debian's zookeeper package (make does this)"
            )
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperServerError("no java on PATH: install a Java runtime (make does this)")
        cfg = self._write_config()
        classpath = f"{ZK_CONF_DIR}:{ZK_JAR}" if ZK_CONF_DIR.exists() else str(ZK_JAR)
        if self.tls is not None:
            classpath += f":{NETTY_CODEC_JAR}"
        command = [
            java,
            "-Xmx256m",
            "-Djute.maxbuffer=8388608",
            "-Dzookeeper.admin.enableServer=false",
            *self._jvm_options(),
            "-cp",
            classpath,
            MAIN_CLASS,
            str(cfg),
        ]
        deadline = time.monotonic() + timeout
        self.launch(
            command,
            "zookeeper.log",
            lambda _left: (
                four_letter(self.port, "ruok") == "imok"
                and "Mode: standalone" in four_letter(self.port, "srvr")
                and self._tls_serves(deadline - time.monotonic())
            ),
            timeout,
            lambda message: ZooKeeperServerError(f"ZooKeeper {message}"),
            self.hosts,
        )

    def _tls_serves(self, timeout: float) -> bool:
        """Whether the secure port completes a TLS handshake (True without `tls`).

        The server's first handshake is its slowest by far: only then does the JVM load and
        warm up its TLS stack, which on a loaded machine took longer than a test's 3 s
        connect timeout. Serving TLS is part of being up, so `start()` waits for it."""
        if self.tls is None:
            return True
        m = self.tls.material
        context = ssl.create_default_context(cafile=str(m.ca.cert))
        context.check_hostname = False  # the CA is what is checked here
        context.load_cert_chain(m.client.cert, m.client.key)  # clientAuth=need asks for it
        try:
            with (
                socket.create_connection(
                    ("127.0.0.1", self.secure_port), timeout=max(timeout, 0.01)
                ) as raw,
                context.wrap_socket(raw) as secure,
            ):
                secure.getpeercert()
            return True
        except OSError:  # ssl.SSLError is one
            return False


def expire_session(hosts: str, client_id: tuple[int, bytes], timeout: float = 10.0) -> None:
    """Expires a session for real, on the server.

    A second client attaches to the same session (id and password) and closes
    it: the server ends the session at once and deletes its ephemeral znodes,
    and the victim sees SUSPENDED then LOST when it next talks to the server.
    """
    from kazoo.client import KazooClient

    twin = KazooClient(hosts=hosts, client_id=client_id)
    twin.start(timeout=timeout)
    with contextlib.suppress(Exception):
        twin.stop()
    with contextlib.suppress(Exception):
        twin.close()
