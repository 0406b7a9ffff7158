"""The auditor writes into BookKeeper's tree, so on a secured cluster it must authenticate as
the Java nodes do and create its znodes with the ACL BookKeeper would give them, or it leaves
world-writable holes; the credentials and that policy are settled here, once, at start.

ZooKeeper credentials and the ACL policy of what the auditor creates.

A secured BookKeeper (`zkEnableSecurity=true`) creates every znode with
ZooKeeper's CREATOR_ALL_ACL: all permissions for the identities the creating
session authenticated as, nobody else. The auditor's writes (under-replication
marks and their parents, the urm LAYOUT, election votes, check ctimes,
lostBookieRecoveryDelay) do the same. Without the flag BookKeeper
uses OPEN_ACL_UNSAFE, which is kazoo's default as well.

Credentials are given as text, one per line, in the forms ZooKeeper knows:

* `digest:USER:PASSWORD`: `addauth digest USER:PASSWORD` (ZooKeeper's own scheme).
* `sasl:GSSAPI[:service=zookeeper,principal=client@REALM]`: Kerberos through
  kazoo's `sasl_options`, using the process's ticket cache (kinit, k5start, or a
  client keytab named by `KRB5_CLIENT_KTNAME`). This is what a JAAS `Client`
  section says to a Java client; Python has no JAAS, so the same facts are
  written here instead.
* `sasl:DIGEST-MD5:username=USER,password=PASSWORD`: ZooKeeper's SASL digest
  (a JAAS `DigestLoginModule` on the server); `password` comes last and takes
  the rest of the line, commas included.

A creator-all ACL only works for an authenticated session, so a policy that
asks for one without credentials is refused when it is built: the operator
gets one line at start, not an InvalidACL at the first write.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.security import CREATOR_ALL_ACL, make_digest_acl_credential

from auditor.errors import ConfigError
from auditor.secretfiles import refuse_if_public
from auditor.zk.tls import ZkTls

SASL_MECHANISMS = ("GSSAPI", "DIGEST-MD5")
_SASL_KEYS = ("service", "principal", "username", "password")
FORMS = (
    "digest:USER:PASSWORD, sasl:GSSAPI[:service=S,principal=P] or "
    "sasl:DIGEST-MD5:username=U,password=P"
)
DEFAULT_HINT = "give ZooKeeper credentials (see 'ZooKeeper security' in the README)"


@dataclass(frozen=True, slots=True)
class SaslOptions:
    """kazoo's `sasl_options` (handed to pure-sasl)."""

    mechanism: str
    service: str = "zookeeper"
    principal: str = ""
    username: str = ""
    password: str = field(default="", repr=False)

    def kazoo_options(self) -> dict[str, str]:
        """A fresh dict each time: kazoo writes defaults into the one it is given."""
        options = {"mechanism": self.mechanism, "service": self.service}
        for key in ("principal", "username", "password"):
            if value := getattr(self, key):
                options[key] = value
        return options

    def describe(self) -> str:
        who = self.principal or self.username
        return f"sasl {self.mechanism}" + (f" as {who}" if who else "")


@dataclass(frozen=True, slots=True)
class ZkCredentials:
    """What a session authenticates with: digest users (each "user:password") and SASL."""

    digest: tuple[str, ...] = field(default=(), repr=False)
    sasl: SaslOptions | None = None

    def __bool__(self) -> bool:
        return bool(self.digest) or self.sasl is not None

    def describe(self) -> str:
        """Who this session is, without secrets: for error messages."""
        parts = [f"digest user {d.partition(':')[0]}" for d in self.digest]
        if self.sasl is not None:
            parts.append(self.sasl.describe())
        return ", ".join(parts) or "no credentials"

    def digest_identities(self) -> list[str]:
        """The ids ZooKeeper gives these digest users in ACLs ("user:base64(sha1)")."""
        out: list[str] = []
        for d in self.digest:
            user, _, password = d.partition(":")
            out.append(str(make_digest_acl_credential(user, password)))
        return out


@dataclass(frozen=True, slots=True)
class ZkSecurity:
    """A session's credentials and the ACL of every znode it creates.

    `enable_security` is BookKeeper's `zkEnableSecurity`. `hint` says how
    credentials are given where this session is configured (a flag, a config
    key), for the error an operator sees when ZooKeeper wants some. `tls`:
    connections over TLS (`zookeeper.client.secure`, `auditor.zk.tls`); None: plain.
    """

    credentials: ZkCredentials = field(default_factory=ZkCredentials)
    enable_security: bool = False
    hint: str = DEFAULT_HINT
    tls: ZkTls | None = None

    def __post_init__(self) -> None:
        if self.enable_security and not self.credentials:
            raise ConfigError(
                "bookkeeper.zkEnableSecurity is true, so everything the auditor creates gets "
                "creator-only ACLs, which needs an authenticated ZooKeeper session, but no "
                f"ZooKeeper credentials were given: {self.hint}"
            )

    @property
    def default_acl(self) -> list[Any] | None:
        """CREATOR_ALL_ACL when secured; None leaves kazoo's default, OPEN_ACL_UNSAFE."""
        return list(CREATOR_ALL_ACL) if self.enable_security else None

    @property
    def auth_data(self) -> list[tuple[str, str]]:
        return [("digest", d) for d in self.credentials.digest]

    def sasl_options(self) -> dict[str, str] | None:
        sasl = self.credentials.sasl
        return None if sasl is None else sasl.kazoo_options()


def _where(origin: str) -> str:
    return f" (from {origin})" if origin else ""


def _require_module(module: str, package: str, what: str, origin: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"{what} needs the Python package {package}, which is not installed "
            f"(pip install {package}){_where(origin)}"
        )


def _parse_sasl(rest: str, origin: str) -> SaslOptions:
    mechanism, _, options = rest.partition(":")
    mechanism = mechanism.strip().upper()
    if mechanism not in SASL_MECHANISMS:
        raise ConfigError(
            f"ZooKeeper SASL mechanism must be {' or '.join(SASL_MECHANISMS)}, "
            f"got {mechanism or rest!r}{_where(origin)}"
        )
    values: dict[str, str] = {}
    remaining = options.strip()
    while remaining:
        item, sep, tail = remaining.partition(",")
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq or key not in _SASL_KEYS:
            # The key only when there is one: a bare item may be a misplaced secret.
            what = f"option {key!r}" if eq else "an option without '='"
            raise ConfigError(
                f"ZooKeeper SASL {what}: options are "
                f"{', '.join(k + '=...' for k in _SASL_KEYS)}{_where(origin)}"
            )
        if key == "password":  # the rest of the line: passwords may hold commas
            values[key] = remaining.partition("=")[2]
            break
        values[key] = value.strip()
        remaining = tail.strip() if sep else ""
    sasl = SaslOptions(mechanism=mechanism, **values)
    if mechanism == "DIGEST-MD5" and not (sasl.username and sasl.password):
        raise ConfigError(
            f"ZooKeeper SASL DIGEST-MD5 needs username=...,password=...{_where(origin)}"
        )
    if not sasl.service:
        raise ConfigError(f"ZooKeeper SASL service= must not be empty{_where(origin)}")
    _require_module("puresasl", "pure-sasl", "ZooKeeper SASL authentication", origin)
    if mechanism == "GSSAPI":
        _require_module("kerberos", "kerberos", "ZooKeeper SASL GSSAPI (Kerberos)", origin)
    return sasl


def parse_zk_auth(text: str, origin: str = "") -> ZkCredentials:
    """Credentials from text: one per line; blank lines and `#` comments are skipped.

    Errors name the form expected and the origin, never the secret itself.
    """
    digest: list[str] = []
    sasl: SaslOptions | None = None
    for line in text.splitlines():
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        scheme, sep, rest = entry.partition(":")
        scheme = scheme.strip().lower()
        if scheme == "digest" and sep:
            user, colon, password = rest.partition(":")
            if not user or not colon or not password:
                raise ConfigError(
                    f"ZooKeeper digest credentials must be digest:USER:PASSWORD{_where(origin)}"
                )
            digest.append(rest)
        elif scheme == "sasl" and sep:
            if sasl is not None:
                raise ConfigError(f"more than one sasl: credential given{_where(origin)}")
            sasl = _parse_sasl(rest, origin)
        else:
            # Not the entry itself: it may be a password given in the wrong form.
            raise ConfigError(
                f"ZooKeeper credentials must be {FORMS}; got a line starting with "
                f"{scheme[:16]!r}{_where(origin)}"
            )
    creds = ZkCredentials(digest=tuple(digest), sasl=sasl)
    if not creds:
        raise ConfigError(f"no ZooKeeper credentials in the text given{_where(origin)}")
    return creds


def read_zk_auth_file(path: str | Path, origin: str = "") -> ZkCredentials:
    p = Path(path)
    where = origin or str(p)
    refuse_if_public(p, "ZooKeeper credentials file")
    try:
        text = p.read_text()
    except FileNotFoundError as exc:
        raise ConfigError(f"ZooKeeper credentials file {p} does not exist{_where(origin)}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read ZooKeeper credentials file {p}: {exc}") from exc
    return parse_zk_auth(text, where)
