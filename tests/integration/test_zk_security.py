"""ZooKeeper security: digest credentials, a server that requires them, and BookKeeper's ACLs.

A ZooKeeper of its own (module scope) enforces authentication (digest, or SASL
DIGEST-MD5 from a JAAS `Server` section), as a secured BookKeeper's would; a
`super` admin creates each test's chroot. With
`zkEnableSecurity` everything the auditor creates must carry CREATOR_ALL_ACL:
all permissions for the creating identity, none for anybody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from kazoo.security import ACL, Id

from auditor.api.convert import status_json, status_response
from auditor.cli.api_commands import render_status
from auditor.daemon.config import load_daemon_config
from auditor.daemon.election import current_auditor, election_path, ordered_votes
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.errors import ConfigError
from auditor.logs import configure_logging
from auditor.metadata.acls import OpenAcl, open_grants
from auditor.metadata.records import CheckKind
from auditor.metadata.underreplication import (
    MarkOutcome,
    UnderreplicationManager,
    ur_ledger_path,
)
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.observe import events_of
from auditor.testing.zkserver import ZooKeeperServer
from auditor.zk import (
    ZkAuthError,
    ZkClient,
    ZkCredentials,
    ZkSecurity,
    parse_zk_auth,
)

ROOT = "/ledgers"
ADMIN_PASSWORD = "admin-secret"
ALICE = "digest:alice:alice-secret"
BOB = "digest:bob:bob-secret"
SASL_USER, SASL_PASSWORD = "bk", "bk-secret"
#: READ | WRITE | CREATE | DELETE | ADMIN
ALL = 31


def security(text: str, *, enable: bool = False) -> ZkSecurity:
    return ZkSecurity(parse_zk_auth(text), enable)


def creator_all(text: str) -> list[tuple[int, str, str]]:
    """CREATOR_ALL_ACL as the server stores it for the digest user of `text`."""
    (identity,) = parse_zk_auth(text).digest_identities()
    return [(ALL, "digest", identity)]


async def acl_of(zk: ZkClient, path: str) -> list[tuple[int, str, str]]:
    acls, _ = await zk.get_acls(path)
    return [(int(a.perms), str(a.id.scheme), str(a.id.id)) for a in acls]


@pytest.fixture(scope="module")
def secure_server() -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(
        require_auth=("digest", "sasl"),
        super_password=ADMIN_PASSWORD,
        sasl_users={SASL_USER: SASL_PASSWORD},
    )
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
async def hosts(secure_server: ZooKeeperServer) -> str:
    """A fresh chroot (open ACL, made by the admin): the cluster below it is the test's."""
    chroot = f"/s-{uuid.uuid4().hex[:12]}"
    admin = security(f"digest:super:{ADMIN_PASSWORD}")
    async with ZkClient(secure_server.hosts, security=admin) as zk:
        await zk.create(chroot)
    return f"{secure_server.hosts}{chroot}"


@pytest.fixture
async def alice(hosts: str) -> AsyncIterator[ZkClient]:
    """BookKeeper's identity, creating with creator-only ACLs (zkEnableSecurity=true)."""
    async with ZkClient(hosts, security=security(ALICE, enable=True)) as zk:
        yield zk


async def run_cli(*argv: str, zk_auth: str | None = None) -> tuple[int, str, str]:
    """`bk-auditor` as operators run it: a process, credentials (if any) in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "BK_AUDITOR_ZK_AUTH"}
    if zk_auth is not None:
        env["BK_AUDITOR_ZK_AUTH"] = zk_auth
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "auditor",
        *argv,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def auth_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "zk-auth"
    path.write_text(f"# ZooKeeper credentials\n{text}\n")
    path.chmod(0o600)
    return str(path)


# --- the one-shot CLI ---------------------------------------------------------------------


async def test_unauthenticated_cli_gets_one_line_and_exit_2(hosts: str) -> None:
    rc, out, err = await run_cli("ledgers", "--zk", hosts)
    assert (rc, out) == (2, "")
    assert err == (
        f"bk-auditor: error: ZooKeeper at {hosts} requires authentication and closed this "
        "session: give credentials with --zk-auth-file FILE or BK_AUDITOR_ZK_AUTH, "
        "e.g. digest:USER:PASSWORD or sasl:GSSAPI\n"
    )


async def secured_cluster(alice: ZkClient) -> None:
    """A cluster BookKeeper wrote with zkEnableSecurity: every znode is alice's alone."""
    writer = ClusterWriter(alice, ROOT)
    await writer.init_cluster()
    await writer.write_ledger(make_metadata(7, ["b1:3181", "b2:3181"]))


async def test_authenticated_cli_reads(hosts: str, alice: ZkClient, tmp_path: Path) -> None:
    await secured_cluster(alice)
    # Credentials from a file (which wins over the environment)...
    rc, out, err = await run_cli(
        "ledgers", "--zk", hosts, "--json", "--zk-auth-file", auth_file(tmp_path, ALICE),
        zk_auth=BOB,
    )  # fmt: skip
    assert (rc, err) == (0, "1 ledgers, 0 corrupt, 0 deleted during the walk\n")
    assert [line.split('"ledger_id": ')[1].split(",")[0] for line in out.splitlines()] == ["7"]

    # A credentials file every user can read is refused, one line, nothing read.
    shared = auth_file(tmp_path, ALICE)
    os.chmod(shared, 0o644)
    rc, out, err = await run_cli("ledgers", "--zk", hosts, "--zk-auth-file", shared)
    assert (rc, out) == (2, "")
    assert err == (
        f"bk-auditor: error: ZooKeeper credentials file {shared} is open to every user "
        f"(mode 0644): chmod o-rwx {shared} (600 or 640), as SSH refuses a private key "
        "others can read\n"
    )

    # ... or from the environment.
    rc, out, err = await run_cli("list-underreplicated", "--zk", hosts, zk_auth=ALICE)
    assert (rc, out, err) == (0, "", "0 under-replicated ledgers; auto-recovery enabled\n")


async def test_another_identity_is_denied_in_one_line(hosts: str, alice: ZkClient) -> None:
    await secured_cluster(alice)
    # Another authenticated identity passes the server's gate but not alice's ACLs.
    rc, out, err = await run_cli("ledgers", "--zk", hosts, zk_auth=BOB)
    assert (rc, out) == (2, "")
    assert err == (
        f"bk-auditor: error: ZooKeeper denied get {ROOT}/LAYOUT: its ACL does not admit "
        "this session (as digest user bob)\n"
    )


async def test_zk_enable_security_without_credentials_fails_before_connecting() -> None:
    # Port 9 (discard): nothing listens; the refusal must come before any connect.
    rc, out, err = await run_cli(
        "check", "placement", "--zk", "127.0.0.1:9", "--set", "zkEnableSecurity=true"
    )
    assert (rc, out) == (2, "")
    assert err == (
        "bk-auditor: error: bookkeeper.zkEnableSecurity is true, so everything the auditor "
        "creates gets creator-only ACLs, which needs an authenticated ZooKeeper session, but "
        "no ZooKeeper credentials were given: give credentials with --zk-auth-file FILE or "
        "BK_AUDITOR_ZK_AUTH, e.g. digest:USER:PASSWORD or sasl:GSSAPI\n"
    )


# --- what the auditor creates --------------------------------------------------------------


async def test_marks_and_every_urm_znode_get_creator_all_acls(alice: ZkClient, hosts: str) -> None:
    urm = UnderreplicationManager(alice, ROOT)
    await urm.check_layout()
    assert await urm.mark_underreplicated(0x1_0002_0003, ["b1:3181"]) is MarkOutcome.CREATED
    await urm.init_lost_bookie_recovery_delay(30)
    await urm.set_check_ctime(CheckKind.REPLICAS_CHECK, 1_700_000_000_000)
    await urm.disable_replication()

    mark = ur_ledger_path(urm.base, 0x1_0002_0003)
    parents = [mark.rsplit("/", n)[0] for n in range(1, 5)]
    created = [
        ROOT,
        urm.base,
        f"{urm.base}/LAYOUT",
        f"{urm.base}/ledgers",
        f"{urm.base}/locks",
        *parents,
        mark,
        f"{urm.base}/lostBookieRecoveryDelay",
        f"{urm.base}/{CheckKind.REPLICAS_CHECK.znode}",
        f"{urm.base}/disable",
    ]
    expected = creator_all(ALICE)
    assert {path: await acl_of(alice, path) for path in created} == dict.fromkeys(created, expected)

    async with ZkClient(hosts, security=security(BOB)) as bob:
        intruder = f"{parents[0]}/urL9999999999"
        attempts: list[tuple[Callable[[], Awaitable[object]], str]] = [
            (lambda: bob.set(mark, b"overwritten"), f"set {mark}"),
            (lambda: bob.delete(mark), f"delete {mark}"),
            (lambda: bob.get(mark), f"get {mark}"),
            (lambda: bob.create(intruder), f"create {intruder}"),
        ]
        for attempt, what in attempts:
            with pytest.raises(ZkAuthError) as info:
                await attempt()
            assert str(info.value) == (
                f"ZooKeeper denied {what}: its ACL does not admit this session (as digest user bob)"
            )
    # Untouched: still alice's mark.
    ur = await urm.get(0x1_0002_0003)
    assert ur is not None and ur.replicas == ("b1:3181",)


async def test_without_zk_enable_security_creates_stay_open(hosts: str) -> None:
    """BookKeeper's OPEN_ACL_UNSAFE: authenticating alone changes no ACL."""
    async with ZkClient(hosts, security=security(ALICE)) as zk:
        await UnderreplicationManager(zk, ROOT).mark_underreplicated(5, ["b1:3181"])
        path = ur_ledger_path(f"{ROOT}/underreplication", 5)
        assert await acl_of(zk, path) == [(ALL, "world", "anyone")]


# --- the daemon ----------------------------------------------------------------------------


async def node_appears(zk: ZkClient, path: str, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        stat, changed = await zk.exists_watched(path)
        if stat is not None:
            return
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{path} did not appear within {within}s"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), remaining)


async def test_daemon_with_credentials_from_env_leads_with_creator_only_votes(
    alice: ZkClient, hosts: str
) -> None:
    await ClusterWriter(alice, ROOT).init_cluster()
    identity = "secure-auditor:9876"
    cfg = load_daemon_config(
        None,
        [
            f"daemon.identity={identity}",
            "worker.enabled=false",
            "daemon.zk_session_timeout=4",
            "daemon.metadata_index=false",
            "auditorPeriodicCheckInterval=0",
            "auditorReplicasCheckInterval=0",
            "auditorPeriodicPlacementPolicyCheckInterval=3600",
        ],
        env={
            "BK_AUDITOR_DAEMON_ZK": hosts,
            "BK_AUDITOR_DAEMON_ZK_AUTH": ALICE,
            "BK_AUDITOR_BOOKKEEPER_ZKENABLESECURITY": "true",
        },
    )
    assert cfg.describe()["daemon"]["zk_auth"] == "***"
    # Earlier in-process commands may have left structlog writing to a closed stream.
    configure_logging("console", level="WARNING")
    daemon = Daemon(cfg, metrics=None)
    run = asyncio.ensure_future(daemon.run(signals=False))
    try:
        # The placement check's ctime is the last thing a new leader's first round writes.
        ctime = f"{ROOT}/underreplication/{CheckKind.PLACEMENT_POLICY_CHECK.znode}"
        await node_appears(alice, ctime, within=8)
        assert await current_auditor(alice, ROOT) == identity
        votes = election_path(ROOT)
        (vote,) = ordered_votes(await alice.get_children(votes))
        expected = creator_all(ALICE)
        for path in [
            votes,
            f"{votes}/{vote}",
            f"{ROOT}/underreplication/lostBookieRecoveryDelay",
            ctime,
        ]:
            assert await acl_of(alice, path) == expected, path
    finally:
        daemon.stop()
        assert await asyncio.wait_for(run, 8) == 0


# --- configuration -------------------------------------------------------------------------


def test_daemon_refuses_zk_enable_security_without_credentials() -> None:
    with pytest.raises(ConfigError) as info:
        load_daemon_config(
            None, ["zkEnableSecurity=true"], env={"BK_AUDITOR_DAEMON_ZK": "zk:2181"}, hostname="h"
        )
    assert str(info.value) == (
        "bookkeeper.zkEnableSecurity is true, so everything the auditor creates gets "
        "creator-only ACLs, which needs an authenticated ZooKeeper session, but no ZooKeeper "
        "credentials were given: set daemon.zk_auth_file to a file holding them, or "
        "daemon.zk_auth (BK_AUDITOR_DAEMON_ZK_AUTH), e.g. digest:USER:PASSWORD or sasl:GSSAPI "
        "(zkEnableSecurity from --set)"
    )


def test_daemon_reads_credentials_from_a_file(tmp_path: Path) -> None:
    path = auth_file(tmp_path, ALICE)
    cfg = load_daemon_config(
        None,
        [f"daemon.zk_auth_file={path}", "zkEnableSecurity=true"],
        env={"BK_AUDITOR_DAEMON_ZK": "zk:2181"},
        hostname="h",
    )
    assert cfg.zk_security == ZkSecurity(parse_zk_auth(ALICE), True, hint=cfg.zk_security.hint)
    assert cfg.zk_security.auth_data == [("digest", "alice:alice-secret")]
    with pytest.raises(ConfigError, match=r"daemon\.zk_auth and daemon\.zk_auth_file are both"):
        load_daemon_config(
            None,
            [f"daemon.zk_auth_file={path}"],
            env={"BK_AUDITOR_DAEMON_ZK": "zk:2181", "BK_AUDITOR_DAEMON_ZK_AUTH": ALICE},
            hostname="h",
        )


def test_credential_forms() -> None:
    creds = parse_zk_auth("digest:alice:pass:with:colons\n\n# comment\ndigest:bob:b")
    assert creds.digest == ("alice:pass:with:colons", "bob:b")
    assert creds.describe() == "digest user alice, digest user bob"
    assert not ZkCredentials()
    assert ZkSecurity().default_acl is None  # kazoo's default: OPEN_ACL_UNSAFE
    acl = ZkSecurity(creds, True).default_acl
    assert acl is not None
    assert [(a.perms, a.id.scheme, a.id.id) for a in acl] == [(ALL, "auth", "")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"^no ZooKeeper credentials in the text given \(from X\)$"),
        ("digest:alice", r"^ZooKeeper digest credentials must be digest:USER:PASSWORD \(from X\)$"),
        ("digest::secret", r"^ZooKeeper digest credentials must be digest:USER:PASSWORD"),
        ("alice:secret", r"^ZooKeeper credentials must be digest:USER:PASSWORD, .* 'alice'"),
        ("sasl:PLAIN", r"^ZooKeeper SASL mechanism must be GSSAPI or DIGEST-MD5, got 'PLAIN'"),
        ("sasl:GSSAPI:secret", r"^ZooKeeper SASL an option without '=': options are service="),
        ("sasl:DIGEST-MD5:username=u", r"^ZooKeeper SASL DIGEST-MD5 needs username=...,pass"),
    ],
)
def test_bad_credentials_are_named_without_the_secret(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_zk_auth(text, "X")
    assert "secret" not in str(info.value)


def test_sasl_options_pass_through_to_kazoo_when_pure_sasl_is_there() -> None:
    """Without pure-sasl (and kerberos for GSSAPI) SASL is refused at start, with the fix."""
    import importlib.util

    text = "sasl:DIGEST-MD5:username=bk,password=p,w=d"
    if importlib.util.find_spec("puresasl") is None:
        with pytest.raises(ConfigError) as info:
            parse_zk_auth(text, "X")
        assert str(info.value) == (
            "ZooKeeper SASL authentication needs the Python package pure-sasl, which is not "
            "installed (pip install pure-sasl) (from X)"
        )
        return
    sec = ZkSecurity(parse_zk_auth(text), True)
    assert sec.sasl_options() == {
        "mechanism": "DIGEST-MD5",
        "service": "zookeeper",
        "username": "bk",
        "password": "p,w=d",
    }
    assert sec.auth_data == []


async def test_sasl_digest_md5_session_creates_creator_only_znodes(hosts: str) -> None:
    """kazoo's SASL runs on pure-sasl, an optional package: without it this cannot run."""
    pytest.importorskip("puresasl")
    sasl = f"sasl:DIGEST-MD5:username={SASL_USER},password={SASL_PASSWORD}"
    async with ZkClient(hosts, security=security(sasl, enable=True)) as zk:
        urm = UnderreplicationManager(zk, ROOT)
        await urm.mark_underreplicated(9, ["b1:3181"])
        assert await acl_of(zk, ur_ledger_path(urm.base, 9)) == [(ALL, "sasl", SASL_USER)]
    wrong = security(f"sasl:DIGEST-MD5:username={SASL_USER},password=not-{SASL_PASSWORD}")
    with pytest.raises(ZkAuthError) as info:
        # The refusal ends the session as it starts (kazoo reads the chroot then).
        async with ZkClient(hosts, security=wrong):
            pass
    assert str(info.value) == (
        f"ZooKeeper at {hosts} rejected this session's credentials (sasl DIGEST-MD5 as bk)"
    )


async def test_relied_on_znodes_open_to_anyone_are_named(hosts: str, tmp_path: Path) -> None:
    """A tree whose `/ledgers` and `underreplication` were created without credentials
    (open ACLs) before BookKeeper's secured nodes created the rest: a daemon connecting
    with credentials names exactly those two (status, the metric's state, its log), not
    the creator-only znodes below them. Before, nothing warned while anyone could create
    `disable` under them."""
    async with ZkClient(hosts, security=security(BOB)) as careless:
        await careless.ensure_path(f"{ROOT}/underreplication")
    async with ZkClient(hosts, security=security(ALICE, enable=True)) as zk:
        await ClusterWriter(zk, ROOT).init_cluster()
        assert await acl_of(zk, f"{ROOT}/underreplication") == [(ALL, "world", "anyone")]
        assert await acl_of(zk, f"{ROOT}/available") == creator_all(ALICE)
    cfg = load_daemon_config(
        None,
        [
            "daemon.identity=secure-auditor:9876",
            "worker.enabled=false",
            "daemon.metadata_index=false",
            "auditorPeriodicCheckInterval=0",
            "auditorReplicasCheckInterval=0",
            "auditorPeriodicPlacementPolicyCheckInterval=0",
            f"daemon.zk_auth_file={auth_file(tmp_path, ALICE)}",
            "zkEnableSecurity=true",
        ],
        env={"BK_AUDITOR_DAEMON_ZK": hosts},
    )
    configure_logging("console", level="WARNING")
    metrics = Metrics()
    daemon = Daemon(cfg, metrics=metrics)
    run = asyncio.ensure_future(daemon.run(signals=False))
    try:
        await asyncio.wait_for(events_of(daemon).acls_checked.wait(), 15)
        gauge = "bookkeeper_auditor_zk_open_acl_znodes"
        assert metrics.registry.get_sample_value(gauge, {}) == 2
        everything = ("write", "create", "delete", "admin")
        assert daemon.state.open_acls == (
            OpenAcl(ROOT, everything),
            OpenAcl(f"{ROOT}/underreplication", everything),
        )
        doc = status_json(status_response(daemon.state))
        assert doc["open_acl_znodes"] == [
            f"{ROOT} (anyone may write, create, delete, admin)",
            f"{ROOT}/underreplication (anyone may write, create, delete, admin)",
        ]
        text = io.StringIO()
        render_status(doc, text)
        assert (
            f"  OPEN ACL: {ROOT}/underreplication (anyone may write, create, delete, admin): "
            "unauthenticated clients can silence or mislead the auditor here; setAcl it "
            "(docs/runbook.md)\n"
        ) in text.getvalue()
    finally:
        daemon.stop()
        assert await asyncio.wait_for(run, 8) == 0
    # The pure judgement: READ alone is no finding; any other grant to anyone is.
    read_only = [ACL(1, Id("world", "anyone")), ACL(ALL, Id("digest", "alice:x"))]
    assert open_grants(read_only) == ()
    assert open_grants([ACL(1 | 4, Id("world", "anyone"))]) == ("create",)
    assert open_grants([ACL(ALL, Id("ip", "10.0.0.1"))]) == ()
