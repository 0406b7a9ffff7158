"""Bookies that require TLS must be reached with the settings operators already keep for
BookKeeper's clients, and a store Python cannot read must stop the start rather than leave
the auditor talking in clear to a bookie that expects TLS.

Bookie TLS, configured by the keys BookKeeper's own client reads.

A BookKeeper client turns TLS on with `tlsProviderFactoryClass`: every new
connection then sends START_TLS, gets the answer in clear, and upgrades the
same socket (the bookie is the TLS server). Operators already have those keys
in `bk_server.conf` (an AutoRecovery beside a bookie uses them), so the auditor
reads the same ones, with the deprecated `client*` spellings first, as
BookKeeper does.

Netty reads JKS, PKCS12 or PEM stores; Python's `ssl` reads PEM only. A store
of another type is refused at start with the key to change: quietly talking
in clear to a bookie that expects TLS would only turn into a run of confusing
"unauthorized" answers later.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from auditor.errors import ConfigError

__all__ = ["TLS_CONTEXT_FACTORY", "BookieTls", "TlsKeys", "bookie_tls", "cipher_name"]

#: The one TLS provider BookKeeper ships; the value that turns bookie TLS on.
TLS_CONTEXT_FACTORY = "org.apache.bookkeeper.tls.TLSContextFactory"


class TlsKeys(Protocol):
    """BookKeeper's TLS keys, as `auditor.config.BookKeeperConfig` holds them.

    A protocol rather than the config class itself: the bookie layer sits below
    the configuration (which calls `bookie_tls` to refuse bad settings at load).
    """

    @property
    def tlsProviderFactoryClass(self) -> str: ...
    @property
    def tlsClientAuthentication(self) -> bool: ...
    @property
    def tlsHostnameVerificationEnabled(self) -> bool: ...
    @property
    def startTLSTimeoutSecs(self) -> int: ...
    @property
    def tlsTrustStoreType(self) -> str: ...
    @property
    def tlsTrustStore(self) -> str: ...
    @property
    def tlsKeyStoreType(self) -> str: ...
    @property
    def tlsKeyStore(self) -> str: ...
    @property
    def tlsKeyStorePasswordPath(self) -> str: ...
    @property
    def tlsCertificatePath(self) -> str: ...
    @property
    def tlsEnabledProtocols(self) -> str: ...
    @property
    def clientTrustStoreType(self) -> str: ...
    @property
    def clientTrustStore(self) -> str: ...
    @property
    def clientKeyStoreType(self) -> str: ...
    @property
    def clientKeyStore(self) -> str: ...
    @property
    def clientKeyStorePasswordPath(self) -> str: ...


@dataclass(frozen=True, slots=True)
class BookieTls:
    """What a connection needs to upgrade itself: a client context and a time limit."""

    context: ssl.SSLContext
    #: Seconds for the START_TLS answer, and again for the handshake (`startTLSTimeoutSecs`).
    timeout: float
    #: Whether a client certificate is presented (`tlsClientAuthentication`).
    client_auth: bool = False


def cipher_name(transport: asyncio.BaseTransport) -> str | None:
    """The cipher suite negotiated on `transport`; None on a transport in clear."""
    cipher = transport.get_extra_info("cipher")
    return None if cipher is None else str(cipher[0])


def _pick(bk: TlsKeys, alias: str, key: str) -> tuple[str, str]:
    """(value, the key it came from): the deprecated `client*` key wins, as in BookKeeper."""
    value = str(getattr(bk, alias))
    if value:
        return value, alias
    return str(getattr(bk, key)), key


def _pem_only(kind: str, key: str, store_key: str) -> None:
    if kind.upper() != "PEM":
        raise ConfigError(
            f"bookkeeper.{key} is {kind!r}: bookie TLS here reads PEM files only; "
            f"set {key}=PEM and bookkeeper.{store_key} to a PEM file"
        )


def _read_password(key: str, path: str) -> str:
    try:
        return Path(path).read_text().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read bookkeeper.{key} {path}: {exc}") from None


#: BookKeeper's (Java's) protocol names, in order.
_VERSIONS = {
    "TLSv1": ssl.TLSVersion.TLSv1,
    "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}


def _protocols(value: str) -> tuple[ssl.TLSVersion, ssl.TLSVersion] | None:
    """`tlsEnabledProtocols` as (lowest, highest); None when empty.

    Java enables a set of versions, OpenSSL a range: a set with a gap
    (`TLSv1,TLSv1.3`) would silently enable the versions between, so it is
    refused rather than widened.
    """
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        return None
    order = list(_VERSIONS)
    unknown = [n for n in names if n not in _VERSIONS]
    if unknown:
        raise ConfigError(
            f"bookkeeper.tlsEnabledProtocols: unknown protocol {unknown[0]!r}; "
            f"known: {', '.join(order)}"
        )
    idx = sorted({order.index(n) for n in names})
    if idx != list(range(idx[0], idx[-1] + 1)):
        raise ConfigError(
            f"bookkeeper.tlsEnabledProtocols {value!r} leaves a gap: give consecutive "
            f"versions (from {order[idx[0]]} to {order[idx[-1]]}, or fewer)"
        )
    return _VERSIONS[order[idx[0]]], _VERSIONS[order[idx[-1]]]


def bookie_tls(bk: TlsKeys) -> BookieTls | None:
    """The client side of bookie TLS, or None when `tlsProviderFactoryClass` is unset.

    Raises `ConfigError` naming the key for anything unusable: another
    provider class, a non-PEM store, a missing or unreadable file.
    """
    provider = bk.tlsProviderFactoryClass.strip()
    if not provider:
        return None
    if provider != TLS_CONTEXT_FACTORY:
        raise ConfigError(
            f"bookkeeper.tlsProviderFactoryClass must be {TLS_CONTEXT_FACTORY} "
            f"(or empty for no TLS), got {provider!r}"
        )
    trust_type, trust_type_key = _pick(bk, "clientTrustStoreType", "tlsTrustStoreType")
    trust, trust_key = _pick(bk, "clientTrustStore", "tlsTrustStore")
    _pem_only(trust_type, trust_type_key, trust_key)
    if not trust:
        raise ConfigError(
            "bookie TLS needs the CA certificate that signed the bookies' certificates: "
            "set bookkeeper.tlsTrustStore to a PEM file"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # BookKeeper checks the chain always, the name only with tlsHostnameVerificationEnabled.
    context.check_hostname = bk.tlsHostnameVerificationEnabled
    context.verify_mode = ssl.CERT_REQUIRED
    versions = _protocols(bk.tlsEnabledProtocols)
    if versions is not None:
        context.minimum_version, context.maximum_version = versions
    try:
        context.load_verify_locations(cafile=trust)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(
            f"cannot load the bookie TLS CA certificate bookkeeper.{trust_key} {trust}: {exc}"
        ) from None
    has_cert = False
    if bk.tlsClientAuthentication:
        key_type, key_type_key = _pick(bk, "clientKeyStoreType", "tlsKeyStoreType")
        key, key_key = _pick(bk, "clientKeyStore", "tlsKeyStore")
        password_path, password_key = _pick(
            bk, "clientKeyStorePasswordPath", "tlsKeyStorePasswordPath"
        )
        _pem_only(key_type, key_type_key, key_key)
        if not bk.tlsCertificatePath:
            raise ConfigError(
                "tlsClientAuthentication needs a client certificate: "
                "set bookkeeper.tlsCertificatePath to a PEM file"
            )
        if not key:
            raise ConfigError(
                "tlsClientAuthentication needs the client certificate's private key: "
                f"set bookkeeper.{key_key} to a PEM file"
            )
        password = _read_password(password_key, password_path) if password_path else None
        try:
            context.load_cert_chain(bk.tlsCertificatePath, key, password)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                f"cannot load the bookie TLS client certificate bookkeeper.tlsCertificatePath "
                f"{bk.tlsCertificatePath} with bookkeeper.{key_key} {key}: {exc}"
            ) from None
        has_cert = True
    return BookieTls(context, float(bk.startTLSTimeoutSecs), has_cert)
