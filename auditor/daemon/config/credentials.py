"""The daemon's credentials and the files they live in, checked at start (and on reload).

The admin API's TLS files and bearer token, and the ZooKeeper credentials
with BookKeeper's `zkEnableSecurity`: a missing file, a half-configured TLS
pair or an unusable combination refuses the start, naming the key and where
it was set, instead of failing at the first client or the first znode. The
secrets themselves never reach an error message or a log line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from auditor.config import BookKeeperConfig, from_origin
from auditor.daemon.config.sections import ApiConfig, DaemonSection
from auditor.errors import ConfigError
from auditor.secretfiles import check_api_token, read_token_file
from auditor.zk.security import ZkCredentials, ZkSecurity, parse_zk_auth, read_zk_auth_file

DAEMON_ZK_HINT = (
    "set daemon.zk_auth_file to a file holding them, or daemon.zk_auth "
    "(BK_AUDITOR_DAEMON_ZK_AUTH), e.g. digest:USER:PASSWORD or sasl:GSSAPI"
)


def check_file(key: str, path: str, origin: str) -> None:
    if path and not Path(path).is_file():
        raise ConfigError(f"{key}: no such file {path}{from_origin(origin)}")


def resolve_api(api: ApiConfig, origins: Mapping[str, str]) -> ApiConfig:
    """`api` checked, with `token_file`'s content in `token`."""

    def at(key: str) -> str:
        return origins.get(f"api.{key}", "")

    for key in ("tls_cert", "tls_key", "tls_client_ca"):
        check_file(f"api.{key}", getattr(api, key), at(key))
    if bool(api.tls_cert) != bool(api.tls_key):
        raise ConfigError("api.tls_cert and api.tls_key must be set together")
    if api.tls_client_ca and not api.tls_cert:
        raise ConfigError("api.tls_client_ca needs api.tls_cert and api.tls_key (mTLS is TLS)")
    if api.protect_reads and not (api.token or api.token_file or api.tls_client_ca):
        raise ConfigError(
            "api.protect_reads needs a credential to check: api.token, api.token_file "
            "or api.tls_client_ca"
        )
    if not api.token_file:
        if api.token:
            check_api_token(api.token, f"api.token{from_origin(at('token'))}")
        return api
    if api.token:
        raise ConfigError("api.token and api.token_file are both set; set one")
    check_file("api.token_file", api.token_file, at("token_file"))
    return replace(api, token=read_token_file(api.token_file, "api.token_file"))


def resolve_zk_security(
    daemon: DaemonSection, bk: BookKeeperConfig, origins: Mapping[str, str]
) -> ZkSecurity:
    """The daemon's ZooKeeper credentials and ACL policy, refused at start when unusable."""
    creds = ZkCredentials()
    if daemon.zk_auth and daemon.zk_auth_file:
        raise ConfigError("daemon.zk_auth and daemon.zk_auth_file are both set; set one")
    if daemon.zk_auth_file:
        where = origins.get("daemon.zk_auth_file", "")
        check_file("daemon.zk_auth_file", daemon.zk_auth_file, where)
        creds = read_zk_auth_file(daemon.zk_auth_file, f"daemon.zk_auth_file {daemon.zk_auth_file}")
    elif daemon.zk_auth.strip():
        where = origins.get("daemon.zk_auth", "")
        creds = parse_zk_auth(
            daemon.zk_auth, "daemon.zk_auth" + (f" from {where}" if where else "")
        )
    try:
        return ZkSecurity(creds, bk.zkEnableSecurity, hint=DAEMON_ZK_HINT)
    except ConfigError as exc:
        where = origins.get("bookkeeper.zkEnableSecurity", "default")
        raise ConfigError(f"{exc} (zkEnableSecurity from {where})") from None
