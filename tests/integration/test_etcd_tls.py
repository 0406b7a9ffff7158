"""etcd over TLS, as Pulsar's etcd configuration file (`configFilePath`) sets it up.

A real etcd that requires client certificates, whose own certificate names only
`etcd.test`: the CLI reaches it with the file's CA, client certificate and `authority`
(the name the certificate is checked against), and without them it cannot: one line and
exit 3, nothing else.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor.etcd import EtcdStore
from auditor.metadata.layout import LedgerManager
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.etcdserver import EtcdServer, EtcdTls
from auditor.testing.pki import issue, new_ca


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EtcdServer, Path]]:
    pki = tmp_path_factory.mktemp("etcd-pki")
    ca = new_ca(pki, "ca")
    server = issue(pki, "server", ca, "etcd.test", ["DNS:etcd.test"])
    client = issue(pki, "client", ca, "bk-auditor")
    etcd = EtcdServer(tls=EtcdTls(ca.cert, server, client))
    etcd.start()
    try:
        yield etcd, pki
    finally:
        etcd.destroy()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "auditor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_cli_reaches_a_tls_etcd_through_pulsars_configuration_file(
    tls_etcd: tuple[EtcdServer, Path],
) -> None:
    etcd, pki = tls_etcd
    assert etcd.tls is not None

    async def write() -> None:
        store = EtcdStore(
            [etcd.endpoint],
            ca_file=etcd.tls.ca if etcd.tls else None,
            cert_file=pki / "client.pem",
            key_file=pki / "client.key",
            authority="etcd.test",
        )
        async with store:
            writer = ClusterWriter(store, manager=LedgerManager.HIERARCHICAL)
            await writer.init_cluster()
            await writer.write_ledger(make_metadata(7, ["b1:3181", "b2:3181"]))

    asyncio.run(write())
    config = pki / "etcd.yaml"
    config.write_text(
        "useTls: true\n"
        f"tlsTrustCertsFilePath: {pki / 'ca.pem'}\n"
        f"tlsCertificateFilePath: {pki / 'client.pem'}\n"
        f"tlsKeyFilePath: {pki / 'client.key'}\n"
        "authority: etcd.test\n"
    )
    plain = etcd.endpoint.replace("https://", "http://")  # useTls turns it to TLS, as jetcd
    uri = f"metadata-store:etcd:{plain}?configFilePath={config}"
    proc = run("ledgers", "--metadata-service-uri", uri, "--timeout", "5")
    assert (proc.returncode, proc.stderr) == (
        0,
        "1 ledgers, 0 corrupt, 0 deleted during the walk\n",
    )
    assert proc.stdout.split()[0] == "7"

    # Without the file's authority the server's certificate does not name what we reach.
    config.write_text(config.read_text().replace("authority: etcd.test\n", ""))
    proc = run("ledgers", "--metadata-service-uri", uri, "--timeout", "3")
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("bk-auditor: error: ")

    # Without any file: plain text to a TLS port.
    proc = run(
        "ledgers", "--metadata-service-uri", f"metadata-store:etcd:{plain}", "--timeout", "3"
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
