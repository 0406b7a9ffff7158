"""TLS tests need real chains (a CA, leaf certificates with the names a client checks, a
second CA nobody trusts) so that verification fails for the reasons it fails in production.

Throwaway certificate authorities for TLS tests, made with the openssl CLI.

The openssl CLI needs no Python dependency (`cryptography` is only the `tls` extra's).
EC P-256 keys keep generation to milliseconds; certificates last two days.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Issued", "issue", "new_ca", "server_context"]

_NEW_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
#: Generous: a loaded CI machine, but never a hung test.
_OPENSSL_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Issued:
    """A PEM certificate and its unencrypted PEM private key."""

    cert: Path
    key: Path


def _openssl(*args: str | Path) -> None:
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl CLI is needed to make test certificates")
    subprocess.run(
        ["openssl", *map(str, args)], check=True, capture_output=True, timeout=_OPENSSL_TIMEOUT
    )


def new_ca(directory: Path, name: str) -> Issued:
    """A self-signed CA certificate, `name` as its common name."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl(
        "req", "-x509", *_NEW_KEY, "-keyout", key, "-out", cert, "-days", "2",
        "-subj", f"/CN={name}",
    )  # fmt: skip
    return Issued(cert, key)


def issue(
    directory: Path, name: str, ca: Issued, common_name: str, names: Sequence[str] = ()
) -> Issued:
    """A leaf certificate signed by `ca`; `names` become its subjectAltNames (DNS:…, IP:…)."""
    cert, key, csr = (directory / f"{name}{ext}" for ext in (".pem", ".key", ".csr"))
    _openssl("req", *_NEW_KEY, "-keyout", key, "-out", csr, "-subj", f"/CN={common_name}")
    extra: list[str | Path] = []
    if names:
        ext = directory / f"{name}.ext"
        ext.write_text(f"subjectAltName={','.join(names)}\n")
        extra = ["-extfile", ext]
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-CAcreateserial",
        "-out", cert, "-days", "2", *extra,
    )  # fmt: skip
    return Issued(cert, key)


def server_context(issued: Issued, client_ca: Issued | None = None) -> ssl.SSLContext:
    """A TLS server context; with `client_ca`, clients must show a certificate it signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(issued.cert, issued.key)
    if client_ca is not None:
        context.load_verify_locations(cafile=client_ca.cert)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
