"""An auditor beside Pulsar and BookKeeper nodes must reach a TLS-only ZooKeeper with the
settings those Java nodes already have, not a second dialect of them, and kazoo's own TLS
(file names only, its trust store added to the system's CAs) cannot honour them.

ZooKeeper over TLS, configured with the client properties Java deployments already have.

A ZooKeeper that serves only its `secureClientPort` is reached by Java
clients through system properties (`-Dzookeeper.client.secure=true`,
`-Dzookeeper.ssl.trustStore.location=...`), set in Pulsar's and BookKeeper's
Java options or in a `zookeeper.client.config` file. This module takes the
very same Java property names (`ZKClientConfig`, `X509Util`) and their
defaults, and turns them into one `ZkTls`: what `ZkClient` needs to open its
connections.

What the names mean here, and where it differs from Java:

* PEM files are the native form (ZooKeeper 3.6+ reads them too): a trust store
  of CA certificates; a key store holding the private key and its certificate
  chain in one file, the key encrypted with the key store password or not.
* PKCS12 stores are read with `cryptography` (the `tls` extra) in memory: the
  trust store's certificates go to OpenSSL as data, the key store's key and
  chain through a 0600 temporary file that is removed as soon as OpenSSL has
  read it (Python's `ssl` loads a private key from a file only).
* JKS and BCFKS are Java's own formats and no maintained Python library reads
  them; they are refused with the `keytool` command that makes a PKCS12 copy.
* The trust store replaces the system's CAs, as it replaces the JVM's cacerts
  in Java (kazoo would add it to them: a public CA could then vouch for a
  ZooKeeper). Without a trust store the system's CAs are used, as Java uses
  cacerts.
* `hostnameVerification` (default true) checks the server's certificate
  against the host name or address of the connect string, as Java does.
* `protocol` and `enabledProtocols` bound the TLS versions. `ciphersuites` is
  named as ignored: Java's suite names are not OpenSSL's, and OpenSSL's
  defaults are used (the server still enforces its own list).
* `crl` and `ocsp` (revocation fetched by the JVM) and `context.supplier.class`
  (a Java class) cannot be honoured and are refused when turned on, never
  dropped silently: they are security controls.

kazoo builds its TLS context itself and only from file names; to get the
behaviour above, `ZkClient` hands kazoo a handler whose `create_connection`
uses `ZkTls.ssl_context()`, built afresh for every connection so that rotated
files are picked up at the next reconnect. A failed handshake is remembered
(`TlsFailure`) so that a connect that gives up says why in one line.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

from auditor.errors import ConfigError

#: The Java client properties this module knows, by their exact names.
SECURE = "zookeeper.client.secure"
CNXN_SOCKET = "zookeeper.clientCnxnSocket"
CLIENT_CONFIG = "zookeeper.client.config"
KEY_STORE = "zookeeper.ssl.keyStore"
TRUST_STORE = "zookeeper.ssl.trustStore"
HOSTNAME_VERIFICATION = "zookeeper.ssl.hostnameVerification"
PROTOCOL = "zookeeper.ssl.protocol"
ENABLED_PROTOCOLS = "zookeeper.ssl.enabledProtocols"
CIPHERSUITES = "zookeeper.ssl.ciphersuites"
CRL = "zookeeper.ssl.crl"
OCSP = "zookeeper.ssl.ocsp"
CONTEXT_SUPPLIER = "zookeeper.ssl.context.supplier.class"

_STORE_KEYS = ("location", "password", "passwordPath", "type")
PROPERTIES: tuple[str, ...] = (
    SECURE,
    CNXN_SOCKET,
    CLIENT_CONFIG,
    *(f"{KEY_STORE}.{k}" for k in _STORE_KEYS),
    *(f"{TRUST_STORE}.{k}" for k in _STORE_KEYS),
    HOSTNAME_VERIFICATION,
    PROTOCOL,
    ENABLED_PROTOCOLS,
    CIPHERSUITES,
    CRL,
    OCSP,
    CONTEXT_SUPPLIER,
)
#: Accepted and not honoured: named in `ZkTls.ignored` (callers log them).
IGNORED = {
    CNXN_SOCKET: "Java's socket implementation; Python always uses its own",
    CIPHERSUITES: "Java's suite names are not OpenSSL's; OpenSSL's defaults are used",
}
STORE_TYPES = ("PEM", "PKCS12", "JKS", "BCFKS")
#: Java's inference from a store's file name (KeyStoreFileType.fromFilename).
_EXTENSIONS = {".pem": "PEM", ".p12": "PKCS12", ".pfx": "PKCS12", ".jks": "JKS", ".bcfks": "BCFKS"}
_VERSIONS = {
    "TLSv1": ssl.TLSVersion.TLSv1,
    "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")

#: A property's value and where it was set ("environment X", "FILE:LINE key", ...).
Prop = tuple[str, str]


def canonical_property(name: str) -> str | None:
    """The exact Java name `name` stands for, matched ignoring case; None when unknown.

    `name` may lack the `zookeeper.` prefix (`ssl.trustStore.location`).
    """
    wanted = name.strip().lower()
    if not wanted.startswith("zookeeper."):
        wanted = "zookeeper." + wanted
    for known in PROPERTIES:
        if known.lower() == wanted:
            return known
    return None


def _where(origin: str) -> str:
    return f" (from {origin})" if origin else ""


@dataclass(frozen=True, slots=True)
class StoreFile:
    """A key or trust store: its file, its type (PEM or PKCS12), its password."""

    location: str
    type: str
    password: str = field(default="", repr=False)
    #: The property that named it, and where that was set: for error messages.
    label: str = ""
    origin: str = ""

    def _fail(self, what: str) -> ConfigError:
        return ConfigError(f"{self.label} {self.location}: {what}{_where(self.origin)}")

    def read(self) -> bytes:
        path = Path(self.location)
        if path.exists() and not path.is_file():  # a directory, a FIFO that would never end
            raise self._fail("not a regular file")
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise self._fail("no such file") from None
        except OSError as exc:
            raise self._fail(f"cannot be read: {exc.strerror or exc}") from None

    def pkcs12(self) -> tuple[Any, Any, list[Any]]:
        """(key, certificate, other certificates) of a PKCS12 store; ConfigError when bad."""
        try:
            from cryptography.hazmat.primitives.serialization import pkcs12
        except ImportError:
            raise self._fail(
                "PKCS12 stores need the Python package cryptography (pip install "
                "'bookkeeper-auditor[tls]'), or convert it to PEM: openssl pkcs12 -in "
                f"{self.location} -out store.pem -nodes"
            ) from None
        data = self.read()
        try:
            key, cert, extra = pkcs12.load_key_and_certificates(
                data, self.password.encode() if self.password else None
            )
        except ValueError:
            raise self._fail(
                "not a PKCS12 store, or the password is wrong "
                f"({self.label.rsplit('.', 1)[0]}.password)"
            ) from None
        return key, cert, list(extra)


@dataclass(frozen=True, slots=True)
class ZkTls:
    """How a ZooKeeper session's connections do TLS (`zookeeper.client.secure=true`).

    Frozen and picklable: it travels with `ZkSecurity` to the Spark executors,
    which read the same files at the same paths (as Java nodes would).
    """

    trust_store: StoreFile | None = None
    #: Our certificate for servers with `ssl.clientAuth=need` (mutual TLS).
    key_store: StoreFile | None = None
    hostname_verification: bool = True
    minimum_version: ssl.TLSVersion | None = None
    maximum_version: ssl.TLSVersion | None = None
    #: Properties that were set and are not honoured (see `IGNORED`).
    ignored: tuple[str, ...] = ()

    def ssl_context(self) -> ssl.SSLContext:
        """A client context with every file read now; ConfigError naming the property when
        a file is missing, unreadable, of the wrong form or locked with another password."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = self.hostname_verification
        context.verify_mode = ssl.CERT_REQUIRED
        if self.minimum_version is not None:
            context.minimum_version = self.minimum_version
        if self.maximum_version is not None:
            context.maximum_version = self.maximum_version
        if self.trust_store is None:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        else:
            _load_trust(context, self.trust_store)
        if self.key_store is not None:
            _load_key(context, self.key_store)
        return context

    def describe(self) -> str:
        """What this session trusts and shows, without secrets: for log lines."""
        trust = self.trust_store.location if self.trust_store else "the system's CAs"
        parts = [f"TLS trusting {trust}"]
        if self.key_store is not None:
            parts.append(f"client certificate {self.key_store.location}")
        if not self.hostname_verification:
            parts.append("no hostname verification")
        if self.ignored:
            parts.append(f"ignored: {', '.join(self.ignored)}")
        return ", ".join(parts)


def _load_trust(context: ssl.SSLContext, store: StoreFile) -> None:
    if store.type == "PKCS12":
        _key, cert, extra = store.pkcs12()
        certs = [c for c in (cert, *extra) if c is not None]
        if not certs:
            raise store._fail("the PKCS12 store holds no certificates")
        from cryptography.hazmat.primitives.serialization import Encoding

        cadata = "".join(c.public_bytes(Encoding.PEM).decode() for c in certs)
        context.load_verify_locations(cadata=cadata)
        return
    store.read()  # a missing or unreadable file named as such, not as an SSL error
    try:
        context.load_verify_locations(cafile=store.location)
    except (ssl.SSLError, ValueError):
        raise store._fail("holds no PEM certificates") from None


def _load_key(context: ssl.SSLContext, store: StoreFile) -> None:
    password = store.password or None
    if store.type == "PEM":
        store.read()
        try:
            context.load_cert_chain(store.location, store.location, password)
        except ssl.SSLError:
            raise store._fail(
                "needs a private key and its certificate in one PEM file, the key "
                f"unencrypted or encrypted with {store.label.rsplit('.', 1)[0]}.password"
            ) from None
        return
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    key, cert, extra = store.pkcs12()
    if key is None or cert is None:
        raise store._fail("the PKCS12 store holds no private key with its certificate")
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()) + b"".join(
        c.public_bytes(Encoding.PEM) for c in (cert, *extra)
    )
    # Python's ssl reads a private key from a file only: one only we can read (mkstemp
    # makes it 0600), removed as soon as OpenSSL holds the key.
    fd, name = tempfile.mkstemp(prefix="bk-auditor-zk-key-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
        context.load_cert_chain(name)
    except ssl.SSLError as exc:
        raise store._fail(f"its key and certificate do not load: {exc.reason}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)


def _flag(props: Mapping[str, Prop], name: str, default: bool) -> bool:
    if name not in props:
        return default
    value, origin = props[name]
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{name} must be true or false, got {value[:32]!r}{_where(origin)}")


def _store(props: Mapping[str, Prop], prefix: str) -> StoreFile | None:
    location, origin = props.get(f"{prefix}.location", ("", ""))
    location = location.strip()
    if not location:
        return None
    label = f"{prefix}.location"
    type_value, type_origin = props.get(f"{prefix}.type", ("", ""))
    kind = type_value.strip().upper()
    if kind and kind not in STORE_TYPES:
        raise ConfigError(
            f"{prefix}.type must be one of {', '.join(STORE_TYPES)}, got "
            f"{type_value[:32]!r}{_where(type_origin)}"
        )
    if not kind:
        kind = _EXTENSIONS.get(Path(location).suffix.lower(), "")
        if not kind:
            raise ConfigError(
                f"{label} {location}: cannot tell the store's type from its file name "
                f"(.pem, .p12, .pfx, .jks): set {prefix}.type{_where(origin)}"
            )
    if kind in ("JKS", "BCFKS"):
        raise ConfigError(
            f"{label} {location} is a {kind} store, which bk-auditor does not read: make a "
            f"PKCS12 copy with keytool -importkeystore -srckeystore {location} -srcstoretype "
            f"{kind} -destkeystore {Path(location).with_suffix('.p12')} -deststoretype PKCS12 "
            f"and point {label} at it{_where(origin)}"
        )
    password, _ = props.get(f"{prefix}.password", ("", ""))
    path, path_origin = props.get(f"{prefix}.passwordPath", ("", ""))
    if path.strip():
        # As ZooKeeper does: the file wins over the plain property.
        try:
            password = Path(path.strip()).read_text().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            why = "no such file" if isinstance(exc, FileNotFoundError) else "cannot be read"
            raise ConfigError(
                f"{prefix}.passwordPath {path.strip()}: {why}{_where(path_origin)}"
            ) from None
    return StoreFile(location, kind, password, label, origin)


def _versions(props: Mapping[str, Prop]) -> tuple[ssl.TLSVersion | None, ssl.TLSVersion | None]:
    if ENABLED_PROTOCOLS in props:
        value, origin = props[ENABLED_PROTOCOLS]
        names = [n.strip() for n in value.split(",") if n.strip()]
        label = ENABLED_PROTOCOLS
    elif PROTOCOL in props:
        value, origin = props[PROTOCOL]
        names = [value.strip()]
        label = PROTOCOL
        if names[0] == "TLS":  # Java's SSLContext name for "any version"
            return None, None
    else:
        return None, None
    unknown = [n for n in names if n not in _VERSIONS]
    if unknown or not names:
        raise ConfigError(
            f"{label} takes {', '.join(_VERSIONS)}, got {value[:48]!r}{_where(origin)}"
        )
    order = list(_VERSIONS)
    picked = sorted({order.index(n) for n in names})
    if picked[-1] - picked[0] + 1 != len(picked):
        # OpenSSL takes a range: a set with a gap is refused rather than widened.
        raise ConfigError(
            f"{label} must be consecutive versions (OpenSSL takes a range), got "
            f"{value[:48]!r}{_where(origin)}"
        )
    return _VERSIONS[order[picked[0]]], _VERSIONS[order[picked[-1]]]


def zk_tls_from_properties(props: Mapping[str, Prop]) -> ZkTls | None:
    """The TLS settings the Java client properties in `props` (exact names -> (value,
    origin)) ask for; None unless `zookeeper.client.secure` is true, as in Java.

    Every file is read once here, so a missing file, a wrong password or a store
    of the wrong form is a ConfigError at start, naming the property and where
    it was set.
    """
    if not _flag(props, SECURE, False):
        return None
    for name in (CRL, OCSP):
        if _flag(props, name, False):
            raise ConfigError(
                f"{name}=true cannot be honoured: Python's TLS does not fetch revocation "
                f"lists or OCSP answers; unset it for bk-auditor{_where(props[name][1])}"
            )
    if CONTEXT_SUPPLIER in props and props[CONTEXT_SUPPLIER][0].strip():
        raise ConfigError(
            f"{CONTEXT_SUPPLIER} names a Java class, which bk-auditor cannot run: give the "
            f"stores with {TRUST_STORE}.* and {KEY_STORE}.* instead"
            f"{_where(props[CONTEXT_SUPPLIER][1])}"
        )
    minimum, maximum = _versions(props)
    tls = ZkTls(
        trust_store=_store(props, TRUST_STORE),
        key_store=_store(props, KEY_STORE),
        hostname_verification=_flag(props, HOSTNAME_VERIFICATION, True),
        minimum_version=minimum,
        maximum_version=maximum,
        ignored=tuple(name for name in IGNORED if name in props),
    )
    tls.ssl_context()
    return tls


_PROTOCOL_ALERTS = ("PROTOCOL_VERSION", "UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE")


def tls_reason(exc: BaseException, has_key: bool = False) -> str:
    """What a failed TLS connection says, for an operator: one line, with a hint.

    `has_key`: whether we showed a certificate (a key store is configured).
    """
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = exc.verify_message or str(exc.reason or "")
        hint = ""
        if exc.verify_code in (2, 18, 19, 20, 21):  # no issuer / self-signed (in chain)
            hint = f" (is {TRUST_STORE}.location the CA that signed the server's certificate?)"
        elif exc.verify_code == 62 or "mismatch" in detail.lower():
            hint = f" (the connect string's host is checked; or set {HOSTNAME_VERIFICATION}=false)"
        return f"certificate verify failed: {detail}{hint}"
    if not isinstance(exc, ssl.SSLError):
        return str(exc) or type(exc).__name__
    reason = str(exc.reason or type(exc).__name__)
    ours = (
        f"the server did not accept our certificate ({KEY_STORE}.location): is it signed by a "
        "CA of the server's ssl.trustStore?"
        if has_key
        else f"a server with ssl.clientAuth=need wants our certificate: {KEY_STORE}.location"
    )
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER" in reason:
        return f"the server does not speak TLS there ({reason}): is it the secureClientPort?"
    if any(alert in reason for alert in _PROTOCOL_ALERTS):
        return f"the server and {PROTOCOL}/{ENABLED_PROTOCOLS} share no TLS version ({reason})"
    if isinstance(exc, ssl.SSLEOFError):
        return (
            f"the server closed the connection during the handshake ({reason}): is it the "
            f"secureClientPort? Or {ours[0].lower()}{ours[1:]}"
        )
    if "ALERT" in reason:
        return f"the server refused the handshake ({reason}); {ours}"
    return reason


class TlsFailure:
    """The last TLS failure a session's connection thread saw, for the error of a failed start."""

    def __init__(self) -> None:
        self.message = ""
        self.address = ""
        #: Whether our connections show a certificate (for the hint of a refusal).
        self.has_key = False
        #: A server took the connection and left the handshake unanswered.
        self.unanswered = False

    def record(self, address: str, exc: BaseException) -> None:
        self.address = address
        self.message = tls_reason(exc, self.has_key)


#: How often a handshake waiting for the server looks whether the client is stopping.
HANDSHAKE_POLL = 0.05


class TlsHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler with our TLS connections (see the module's docstring).

    The handshake runs in short slices: one that the server leaves unanswered
    gives up after `limit` seconds, or at once when `stopping()` says the client
    is stopping, so that a failed start takes no longer than its own deadline
    (kazoo's would wait the whole session timeout).
    """

    def __init__(self, tls: ZkTls, failure: TlsFailure, limit: float) -> None:
        super().__init__()
        self.tls = tls
        self.failure = failure
        self.limit = limit
        failure.has_key = tls.key_store is not None
        self.stopping: Callable[[], bool] = lambda: False

    def create_connection(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        # kazoo calls this with keywords (address, hostname, timeout, and its own TLS
        # options, which the context replaces).
        host, port = kwargs["address"]
        hostname = kwargs.get("hostname") or host
        where = f"{hostname}:{port}"
        timeout = min(kwargs.get("timeout") or self.limit, self.limit)
        try:
            context = self.tls.ssl_context()
        except ConfigError as exc:  # a file went away after start: retried, remembered
            self.failure.address, self.failure.message = where, str(exc)
            raise OSError(str(exc)) from None
        sock = socket.create_connection((host, port), timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = context.wrap_socket(
                sock, server_hostname=hostname, do_handshake_on_connect=False
            )
            self._handshake(conn, time.monotonic() + timeout)
            return conn
        except ssl.SSLError as exc:
            self.failure.record(where, exc)
            sock.close()
            raise
        except BaseException:
            sock.close()
            raise

    def _handshake(self, conn: ssl.SSLSocket, deadline: float) -> None:
        conn.setblocking(False)
        while True:
            try:
                conn.do_handshake()
                return
            except ssl.SSLWantReadError:
                wait: tuple[list[Any], list[Any]] = ([conn], [])
            except ssl.SSLWantWriteError:
                wait = ([], [conn])
            left = deadline - time.monotonic()
            if self.stopping() or left <= 0:
                self.failure.unanswered = True
                raise OSError("the server did not answer the TLS handshake")
            select.select(*wait, [], min(left, HANDSHAKE_POLL))
