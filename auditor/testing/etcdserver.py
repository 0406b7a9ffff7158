"""Tests run the etcd adapter against a real server, never a fake, and need one that starts
in moments, on ports nobody else uses, and restarts with its data.

A throwaway single-member etcd from Debian's `etcd-server` package (etcd 3.4).

This starts `/usr/bin/etcd` on free loopback ports (client and peer) with its data in a
temporary directory, and returns once its `/health` endpoint answers healthy (polled at
a short interval, within a deadline). `stop()` keeps the data and the ports, so a later
`start()` is the same server restarted (lease and keys kept, as a restarted etcd keeps
them); `destroy()` removes everything.
"""

from __future__ import annotations

import json
import os
import ssl
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from auditor.errors import ServiceUnavailableError
from auditor.testing.pki import Issued
from auditor.testing.serverprocess import ServerProcess
from auditor.testing.zkserver import free_port

ETCD_BIN = Path(os.environ.get("BK_AUDITOR_ETCD", "/usr/bin/etcd"))


class EtcdServerError(ServiceUnavailableError):
    """The throwaway etcd could not be started."""


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """A TLS etcd's material: the CA that signed both, the server's and a client's pair."""

    ca: Path
    server: Issued
    client: Issued


def healthy(endpoint: str, timeout: float = 1.0, context: ssl.SSLContext | None = None) -> bool:
    """Whether the etcd at `endpoint` answers its health check as healthy."""
    try:
        url = f"{endpoint}/health"
        with urllib.request.urlopen(url, timeout=timeout, context=context) as reply:
            return bool(json.loads(reply.read()).get("health") == "true")
    except (OSError, ValueError, urllib.error.URLError):
        return False


class EtcdServer(ServerProcess):
    """One single-member etcd cluster; `start()` blocks until it serves (or raises)."""

    def __init__(
        self, base_dir: Path | None = None, port: int | None = None, tls: EtcdTls | None = None
    ) -> None:
        #: With `tls`, clients connect over TLS and must show a certificate `tls.ca` signed.
        self.tls = tls
        super().__init__(
            base_dir or Path(tempfile.mkdtemp(prefix="bk-auditor-etcd-")), base_dir is None
        )
        self.port = port or free_port()
        self.peer_port = free_port()

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def hosts(self) -> str:
        """host:port, the form without a scheme."""
        return f"127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            str(ETCD_BIN),
            "--name", "bk-auditor-test",
            "--data-dir", str(self.base_dir / "data"),
            "--listen-client-urls", self.endpoint,
            "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"bk-auditor-test={peer}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", "bk-auditor-test",
            "--logger", "zap",
            "--log-outputs", "stderr",
            *self._tls_flags(),
        ]  # fmt: skip

    def _tls_flags(self) -> list[str]:
        if self.tls is None:
            return []
        return [
            "--cert-file", str(self.tls.server.cert),
            "--key-file", str(self.tls.server.key),
            "--trusted-ca-file", str(self.tls.ca),
            "--client-cert-auth",
        ]  # fmt: skip

    def _health_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        # The CA is checked, not the name: a test may issue a certificate for another name
        # than 127.0.0.1 (the `authority` of Pulsar's etcd configuration).
        context.check_hostname = False
        context.load_cert_chain(self.tls.client.cert, self.tls.client.key)
        return context

    def start(self, timeout: float = 30.0) -> None:
        if not ETCD_BIN.exists():
            raise EtcdServerError(
                f"{ETCD_BIN} not found: install Debian's etcd-server package (make test does)"
            )
        self.launch(
            self._command(),
            "etcd.log",
            lambda left: healthy(self.endpoint, timeout=left, context=self._health_context()),
            timeout,
            lambda message: EtcdServerError(f"etcd {message}"),
            self.endpoint,
        )
