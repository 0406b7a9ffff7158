"""Bookie TLS: START_TLS and the upgrade of the same connection, against emulated bookies.

Every bookie here is an emulator with a real TLS server context and
certificates made for the test by a throwaway CA; the client is configured
only through BookKeeper's keys, as an operator would configure it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from auditor.bookie.client import BookieClient
from auditor.bookie.protocol import Operation
from auditor.bookie.results import NoAnswer, Ok, Unanswered
from auditor.bookie.tls import TLS_CONTEXT_FACTORY, bookie_tls
from auditor.checks.context import open_context
from auditor.checks.findings import Category, CheckReport
from auditor.checks.replicas_run import run_replicas_check
from auditor.config import load_config
from auditor.daemon.config import load_daemon_config
from auditor.daemon.config.identity import StaticHost
from auditor.errors import ConfigError
from auditor.metadata.layout import LedgerManager
from auditor.metadata.records import decode_bookie_service_info
from auditor.metadata.registry import resolve_bookie
from auditor.testing.bookie import BookieEmulator
from auditor.testing.cli import bk
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.pki import Issued, issue, new_ca, server_context
from auditor.zk import ZkClient

ROOT = "/ledgers"
FAST = ["checks.retry_delay=0.1", "checks.retry_attempts=1", "readEntryTimeout=2"]
#: Bounds every test's waiting: a hang fails here, well before pytest's own timeout.
LIMIT = 8.0


@dataclass(frozen=True)
class Certs:
    ca: Issued
    rogue_ca: Issued
    #: The bookies' certificate: for 127.0.0.1 and localhost, signed by `ca`.
    bookie: Issued
    #: A bookie certificate naming only bookie.invalid (signed by `ca`).
    misnamed: Issued
    #: The auditor's client certificate, signed by `ca`.
    client: Issued


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("bookie-pki")
    ca, rogue = new_ca(d, "ca"), new_ca(d, "rogue-ca")
    return Certs(
        ca,
        rogue,
        issue(d, "bookie", ca, "bookie", ["IP:127.0.0.1", "DNS:localhost"]),
        issue(d, "misnamed", ca, "bookie.invalid", ["DNS:bookie.invalid"]),
        issue(d, "client", ca, "auditor"),
    )


def tls_keys(trust: Path, client: Issued | None = None, *, verify_names: bool = False) -> list[str]:
    """The BookKeeper keys (as `--set` items) of a client with TLS."""
    keys = [
        f"tlsProviderFactoryClass={TLS_CONTEXT_FACTORY}",
        "tlsTrustStoreType=PEM",
        f"tlsTrustStore={trust}",
        "startTLSTimeoutSecs=2",
        f"tlsHostnameVerificationEnabled={str(verify_names).lower()}",
    ]
    if client is not None:
        keys += [
            "tlsClientAuthentication=true",
            "tlsKeyStoreType=PEM",
            f"tlsKeyStore={client.key}",
            f"tlsCertificatePath={client.cert}",
        ]
    return keys


@asynccontextmanager
async def bookies(zk: ZkClient, count: int, **options: Any) -> AsyncIterator[list[BookieEmulator]]:
    """Registered emulated bookies with `options` (tls, tls_required) under a fresh cluster."""
    await ClusterWriter(zk, ROOT).init_cluster()
    emus = [BookieEmulator(zk, ledgers_root=ROOT, **options) for _ in range(count)]
    try:
        for e in emus:
            await e.start()
        yield emus
    finally:
        for e in emus:
            if e.running:
                await e.stop()


@asynccontextmanager
async def client(zk: ZkClient, keys: Sequence[str]) -> AsyncIterator[BookieClient]:
    async def resolve(bookie_id: str) -> tuple[str, int] | None:
        return await resolve_bookie(zk, ROOT, bookie_id)

    config = load_config(None, [*FAST, *keys])
    async with BookieClient(
        resolve, request_timeout=2.0, tls=bookie_tls(config.bookkeeper), backoff_initial=0.05
    ) as c:
        yield c


# --- over TLS ---------------------------------------------------------------------------


async def replicas(zk: ZkClient, keys: Sequence[str]) -> CheckReport:
    config = load_config(None, [*FAST, *keys])
    async with open_context(zk, ROOT, LedgerManager.HIERARCHICAL, config) as ctx:
        return await run_replicas_check(ctx)


async def seed_two_ledgers(zk: ZkClient, emus: list[BookieEmulator]) -> list[str]:
    """Ledger 1 lost entries 5..9 on its third bookie; ledger 2 is whole everywhere."""
    cw = ClusterWriter(zk, ROOT)
    ids = [e.bookie_id for e in emus]
    for ledger_id in (1, 2):
        md = make_metadata(
            ledger_id, [(0, ids)], write_quorum=3, ack_quorum=2, last_entry_id=9, length=100
        )
        await cw.write_ledger(md)
        for e in emus:
            e.put_ledger(ledger_id, range(10))
    emus[2].drop_entries(1, range(5, 10))
    return ids


async def test_replicas_check_over_tls_finds_exactly_the_damaged_ledger(
    zk: ZkClient, certs: Certs
) -> None:
    context = server_context(certs.bookie)
    async with bookies(zk, 3, tls=context, tls_required=True) as emus:
        ids = await seed_two_ledgers(zk, emus)
        async with asyncio.timeout(LIMIT):
            report = await replicas(zk, tls_keys(certs.ca.cert))
        assert [(v.ledger_id, v.category, v.bookie) for v in report.violations] == [
            (1, Category.BELOW_WRITE_QUORUM, None)
        ]
        (violation,) = report.violations
        assert [m["bookie"] for m in violation.detail["missing"]] == [ids[2]]
        assert report.ledgers_checked == 2
        for e in emus:
            # One connection per bookie, upgraded once; every list request came over TLS
            # (a request in clear would have been refused with EUA and nothing was).
            assert e.received[Operation.START_TLS] == 1
            assert e.received[Operation.GET_LIST_OF_ENTRIES_OF_LEDGER] == 2
            assert e.tls_handshakes == 1 and e.tls_failures == []
            assert e.connections_accepted == 1
            assert [cipher.startswith("TLS_") for cipher, _ in e.tls_sessions] == [True]


async def test_the_connection_really_is_tls(zk: ZkClient, certs: Certs) -> None:
    async with bookies(zk, 1, tls=server_context(certs.bookie), tls_required=True) as (emu,):
        emu.put_ledger(7, range(3))
        async with client(zk, tls_keys(certs.ca.cert)) as c, asyncio.timeout(LIMIT):
            got = await c.read_entry(emu.bookie_id, 7, 2)
            assert isinstance(got, Ok) and got.value.header.entry_id == 2
            ((cipher, client_cert),) = emu.tls_sessions
            assert cipher.startswith("TLS_") and emu.open_connections == 1
            assert client_cert is None  # no client certificate was asked for
            assert c.tls_cipher(emu.bookie_id) == cipher
        # Registered as a TLS bookie registers: extension `tls` on its bookie-rpc endpoint.
        data, _ = await zk.get(f"{ROOT}/available/{emu.bookie_id}")
        endpoint = decode_bookie_service_info(data).endpoint()
        assert endpoint is not None and endpoint.extensions == ("tls",)


async def test_hostname_verification_as_bookkeeper_does(zk: ZkClient, certs: Certs) -> None:
    """Off by default (tlsHostnameVerificationEnabled=false): only the chain is checked."""
    async with bookies(zk, 1, tls=server_context(certs.misnamed)) as (emu,):
        emu.put_ledger(7, range(3))
        async with client(zk, tls_keys(certs.ca.cert)) as c, asyncio.timeout(LIMIT):
            assert isinstance(await c.read_lac(emu.bookie_id, 7), Ok)
        async with (
            client(zk, tls_keys(certs.ca.cert, verify_names=True)) as c,
            asyncio.timeout(LIMIT),
        ):
            assert await c.read_lac(emu.bookie_id, 7) == NoAnswer(
                Unanswered.TLS_FAILED,
                f"TLS handshake with {emu.bookie_id} at {emu.host}:{emu.port} failed: "
                "certificate verify failed: IP address mismatch, "
                "certificate is not valid for '127.0.0.1'.",
            )


# --- failures -----------------------------------------------------------------------------


async def test_plain_client_is_refused_by_a_tls_only_bookie(zk: ZkClient, certs: Certs) -> None:
    async with bookies(zk, 3, tls=server_context(certs.bookie), tls_required=True) as emus:
        ids = await seed_two_ledgers(zk, emus)
        async with client(zk, []) as c, asyncio.timeout(LIMIT):
            assert await c.get_list_of_entries(ids[0], 1) == NoAnswer(
                Unanswered.UNAUTHORIZED,
                f"{ids[0]} refused the request as unauthenticated (EUA): it requires TLS "
                f"(or another authentication); set bookkeeper.tlsProviderFactoryClass="
                f"{TLS_CONTEXT_FACTORY} and bookkeeper.tlsTrustStore",
            )
        async with asyncio.timeout(LIMIT):
            report = await replicas(zk, [])
        # Refused is not silence about the ledger: no durability verdict, each bookie reported.
        assert sorted((v.ledger_id, v.category, v.bookie) for v in report.violations) == sorted(
            (lid, Category.BOOKIE_UNAVAILABLE_REGISTERED, b) for lid in (1, 2) for b in ids
        )
        assert {v.detail["reason"].split(":")[0] for v in report.violations} == {"unauthorized"}
        for e in emus:
            assert e.received[Operation.START_TLS] == 0 and e.tls_handshakes == 0


async def test_tls_client_against_a_bookie_without_tls(zk: ZkClient, certs: Certs) -> None:
    async with bookies(zk, 1) as (emu,):
        emu.put_ledger(7, range(3))
        async with client(zk, tls_keys(certs.ca.cert)) as c, asyncio.timeout(LIMIT):
            assert await c.read_entry(emu.bookie_id, 7, 0) == NoAnswer(
                Unanswered.TLS_FAILED,
                f"{emu.bookie_id} at {emu.host}:{emu.port} refused START_TLS with EBADREQ "
                "(TLS is not enabled on that bookie)",
            )
        assert emu.received == {Operation.START_TLS: 1}  # nothing was sent in clear after it
        data, _ = await zk.get(f"{ROOT}/available/{emu.bookie_id}")
        endpoint = decode_bookie_service_info(data).endpoint()
        assert endpoint is not None and endpoint.extensions == ()  # it does not advertise TLS


async def test_enabled_protocols_bound_the_version(zk: ZkClient, certs: Certs) -> None:
    """`tlsEnabledProtocols` as BookKeeper reads it: TLS 1.2 only is spoken with a bookie
    that offers 1.3 too; 1.3 only against a bookie that stops at 1.2 fails the handshake
    (a TLS failure, never an answer about the ledger)."""
    async with bookies(zk, 1, tls=server_context(certs.bookie), tls_required=True) as (emu,):
        emu.put_ledger(7, range(3))
        keys = [*tls_keys(certs.ca.cert), "tlsEnabledProtocols=TLSv1.2"]
        async with client(zk, keys) as c, asyncio.timeout(LIMIT):
            got = await c.read_entry(emu.bookie_id, 7, 1)
            assert isinstance(got, Ok) and got.value.header.entry_id == 1
            cipher = c.tls_cipher(emu.bookie_id)
            # TLS 1.3 suites are the only ones named TLS_* by OpenSSL.
            assert cipher is not None and not cipher.startswith("TLS_"), cipher
    old = server_context(certs.bookie)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    async with bookies(zk, 1, tls=old, tls_required=True) as (emu,):
        emu.put_ledger(7, range(3))
        keys = [*tls_keys(certs.ca.cert), "tlsEnabledProtocols=TLSv1.3"]
        async with client(zk, keys) as c, asyncio.timeout(LIMIT):
            got = await c.read_entry(emu.bookie_id, 7, 1)
            assert isinstance(got, NoAnswer) and got.reason is Unanswered.TLS_FAILED, got
            assert got.detail.startswith(f"TLS handshake with {emu.bookie_id} at "), got.detail
            await emu.tls_settled()
        assert emu.tls_handshakes == 0 and len(emu.tls_failures) == 1


async def test_wrong_ca_fails_the_handshake(zk: ZkClient, certs: Certs) -> None:
    async with bookies(zk, 1, tls=server_context(certs.bookie), tls_required=True) as (emu,):
        emu.put_ledger(7, range(3))
        async with client(zk, tls_keys(certs.rogue_ca.cert)) as c, asyncio.timeout(LIMIT):
            first = await c.read_entry(emu.bookie_id, 7, 0)
            assert first == NoAnswer(
                Unanswered.TLS_FAILED,
                f"TLS handshake with {emu.bookie_id} at {emu.host}:{emu.port} failed: "
                "certificate verify failed: unable to get local issuer certificate",
            )
            # The failure backs off like a failed connect: the next call fails at once.
            again = await c.read_entry(emu.bookie_id, 7, 0)
            assert isinstance(again, NoAnswer) and again.reason is Unanswered.TLS_FAILED
            assert again.detail.startswith(f"{first.detail} (next attempt in ")
            await emu.tls_settled()
        assert emu.tls_handshakes == 0 and len(emu.tls_failures) == 1
        assert emu.received == {Operation.START_TLS: 1}


async def test_a_paused_bookie_costs_start_tls_its_timeout(zk: ZkClient, certs: Certs) -> None:
    async with bookies(zk, 1, tls=server_context(certs.bookie), tls_required=True) as (emu,):
        emu.put_ledger(7, range(3))
        emu.pause()
        keys = [*tls_keys(certs.ca.cert), "startTLSTimeoutSecs=1"]
        async with client(zk, keys) as c, asyncio.timeout(LIMIT):
            assert await c.read_entry(emu.bookie_id, 7, 0) == NoAnswer(
                Unanswered.TLS_FAILED,
                f"START_TLS to {emu.bookie_id} at {emu.host}:{emu.port} got no answer: "
                f"timeout: {emu.bookie_id} did not answer within 1s",
            )
        # Held, not answered: the client gave up on its own clock.
        assert (emu.received, emu.answered, emu.tls_handshakes) == ({Operation.START_TLS: 1}, {}, 0)


async def test_mutual_tls(zk: ZkClient, certs: Certs) -> None:
    """A bookie with tlsClientAuthentication refuses a client without a certificate."""
    context = server_context(certs.bookie, client_ca=certs.ca)
    async with bookies(zk, 1, tls=context, tls_required=True) as (emu,):
        emu.put_ledger(7, range(3))
        async with client(zk, tls_keys(certs.ca.cert)) as c, asyncio.timeout(LIMIT):
            refused = await c.read_entry(emu.bookie_id, 7, 0)
            await emu.tls_settled()
        # Python's TLS server closes without its alert; a Netty bookie sends one, which
        # reads "TLS: tlsv13 alert certificate required". Both are TLS failures.
        assert refused == NoAnswer(
            Unanswered.TLS_FAILED,
            f"{emu.bookie_id} closed the TLS connection before answering anything "
            "(as a bookie does that wants a client certificate: tlsClientAuthentication)",
        )
        assert emu.tls_handshakes == 0 and len(emu.tls_failures) == 1
        assert emu.received[Operation.READ_ENTRY] == 0
        async with (
            client(zk, tls_keys(certs.ca.cert, certs.client)) as c,
            asyncio.timeout(LIMIT),
        ):
            got = await c.read_entry(emu.bookie_id, 7, 0)
            assert isinstance(got, Ok) and got.value.header.entry_id == 0
            ((_, client_cert),) = emu.tls_sessions
            assert client_cert is not None
            assert client_cert["subject"] == ((("commonName", "auditor"),),)
        assert emu.tls_handshakes == 1


# --- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            ["tlsProviderFactoryClass=com.example.Tls"],
            "bookkeeper.tlsProviderFactoryClass must be org.apache.bookkeeper.tls."
            "TLSContextFactory (or empty for no TLS), got 'com.example.Tls'",
        ),
        (
            [f"tlsProviderFactoryClass={TLS_CONTEXT_FACTORY}", "tlsTrustStore=/x.jks"],
            "bookkeeper.tlsTrustStoreType is 'JKS': bookie TLS here reads PEM files only; "
            "set tlsTrustStoreType=PEM and bookkeeper.tlsTrustStore to a PEM file",
        ),
        (
            [f"tlsProviderFactoryClass={TLS_CONTEXT_FACTORY}", "tlsTrustStoreType=PEM"],
            "bookie TLS needs the CA certificate that signed the bookies' certificates: "
            "set bookkeeper.tlsTrustStore to a PEM file",
        ),
        (
            [
                f"tlsProviderFactoryClass={TLS_CONTEXT_FACTORY}",
                "clientTrustStoreType=PKCS12",
                "tlsTrustStoreType=PEM",
            ],
            "bookkeeper.clientTrustStoreType is 'PKCS12': bookie TLS here reads PEM files only; "
            "set clientTrustStoreType=PEM and bookkeeper.tlsTrustStore to a PEM file",
        ),
        (
            [
                f"tlsProviderFactoryClass={TLS_CONTEXT_FACTORY}",
                "tlsTrustStoreType=PEM",
                "tlsTrustStore=/ca.pem",
                "tlsEnabledProtocols=TLSv1.2,SSLv3",
            ],
            "bookkeeper.tlsEnabledProtocols: unknown protocol 'SSLv3'; "
            "known: TLSv1, TLSv1.1, TLSv1.2, TLSv1.3",
        ),
        (
            [
                f"tlsProviderFactoryClass={TLS_CONTEXT_FACTORY}",
                "tlsTrustStoreType=PEM",
                "tlsTrustStore=/ca.pem",
                "tlsEnabledProtocols=TLSv1.3, TLSv1.1",
            ],
            "bookkeeper.tlsEnabledProtocols 'TLSv1.3, TLSv1.1' leaves a gap: give consecutive "
            "versions (from TLSv1.1 to TLSv1.3, or fewer)",
        ),
        (
            ["startTLSTimeoutSecs=0"],
            "bookkeeper.startTLSTimeoutSecs must be a positive number of seconds, got '0'",
        ),
    ],
)
def test_unusable_tls_settings_are_config_errors(keys: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, keys)
    assert str(err.value) == message


def test_unreadable_tls_files_are_config_errors(certs: Certs, tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(ConfigError) as err:
        load_config(None, tls_keys(missing))
    assert str(err.value) == (
        f"cannot load the bookie TLS CA certificate bookkeeper.tlsTrustStore {missing}: "
        "[Errno 2] No such file or directory"
    )
    keys = [*tls_keys(certs.ca.cert), "tlsClientAuthentication=true", "tlsKeyStoreType=PEM"]
    with pytest.raises(ConfigError) as err:
        load_config(None, keys)
    assert str(err.value) == (
        "tlsClientAuthentication needs a client certificate: "
        "set bookkeeper.tlsCertificatePath to a PEM file"
    )
    # The client's key does not match the CA's certificate.
    mismatched = [*keys, f"tlsCertificatePath={certs.ca.cert}", f"tlsKeyStore={certs.client.key}"]
    with pytest.raises(ConfigError) as err:
        load_config(None, mismatched)
    assert str(err.value).startswith(
        f"cannot load the bookie TLS client certificate bookkeeper.tlsCertificatePath "
        f"{certs.ca.cert} with bookkeeper.tlsKeyStore {certs.client.key}: "
    )


# --- the CLI ------------------------------------------------------------------------------


def as_sets(keys: Sequence[str]) -> list[str]:
    return [arg for key in keys for arg in ("--set", key)]


async def test_cli_refuses_an_unusable_tls_setting_in_one_line(tmp_path: Path) -> None:
    """Before touching ZooKeeper (none listens there): exit 2, one line, nothing on stdout."""
    missing = tmp_path / "ca.pem"
    keys = as_sets(tls_keys(missing))
    code, out, err = await bk("check", "replicas", "--zk", "127.0.0.1:1", "--json", *keys)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "bk-auditor: error: cannot load the bookie TLS CA certificate bookkeeper.tlsTrustStore "
        f"{missing}: [Errno 2] No such file or directory"
    ]


def test_the_daemon_takes_bookie_tls_from_bk_server_conf(certs: Certs, tmp_path: Path) -> None:
    """A bookie's own conf turns TLS on for the daemon beside it, as for AutoRecovery."""
    conf = tmp_path / "bk_server.conf"
    lines = [
        "zkServers=127.0.0.1:2181",
        f"tlsProviderFactoryClass={TLS_CONTEXT_FACTORY}",
        "tlsKeyStoreType=JKS",
        "tlsKeyStore=/etc/bookie/server.jks",  # the bookie's own key: not read by the client
        f"tlsTrustStore={certs.ca.cert}",
    ]
    conf.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as err:
        load_daemon_config(None, env={}, bk_conf=str(conf), host=StaticHost())
    assert str(err.value) == (
        "bookkeeper.tlsTrustStoreType is 'JKS': bookie TLS here reads PEM files only; "
        "set tlsTrustStoreType=PEM and bookkeeper.tlsTrustStore to a PEM file "
        f"(bookie TLS on: tlsProviderFactoryClass from {conf}:2 tlsProviderFactoryClass)"
    )
    env = {"BK_AUDITOR_BOOKKEEPER_TLSTRUSTSTORETYPE": "PEM"}
    config = load_daemon_config(None, env=env, bk_conf=str(conf), host=StaticHost())
    tls = bookie_tls(config.bookkeeper)
    assert tls is not None
    assert (tls.timeout, tls.client_auth, tls.context.check_hostname) == (10.0, False, False)
    assert config.origin("bookkeeper.tlsTrustStore") == f"{conf}:5 tlsTrustStore"
