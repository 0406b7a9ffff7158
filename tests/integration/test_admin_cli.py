"""The operator commands, run as an operator runs them (a subprocess).

The ZooKeeper commands are checked against the exact znodes BookKeeper's own
tools read and write; the daemon commands against an in-process API server
(the subprocess runs while this test's event loop keeps serving it).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from auditor.checks.findings import Check
from auditor.cli import api_commands
from auditor.cli.docs import _subparsers
from auditor.cli.main import build_parser
from auditor.daemon.config import DEFAULT_API_PORT
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.cli import bk as run_cli
from auditor.testing.cluster import ClusterWriter
from auditor.testing.zkserver import free_port
from auditor.zk import ZkClient
from tests.integration.test_api import (
    ME,
    OTHER,
    TOKEN,
    Api,
    Pki,
    open_api,
    pki,  # noqa: F401  (the module-scoped certificate fixture)
    sample_state,
)

ELECTION = "/ledgers/underreplication/auditorelection"
DELAY = "/ledgers/underreplication/lostBookieRecoveryDelay"
DISABLE = "/ledgers/underreplication/disable"


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


async def bk(*args: str, **env: str) -> Run:
    """`python -m auditor ARGS` without blocking the loop that serves the in-process API."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("BK_AUDITOR_API_TOKEN", "BK_AUDITOR_API_TARGET")
    }
    environ.update(env)
    start = time.monotonic()
    code, out, err = await run_cli(*args, within=60, env=environ)
    return Run(code, out, err, time.monotonic() - start)


def one_line_error(run: Run, needle: str, code: int) -> None:
    assert run.returncode == code, (run.returncode, run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("bk-auditor: error: "), lines[0]
    assert needle in lines[0], lines[0]
    assert "Traceback" not in run.stderr


async def cluster(zk: ZkClient) -> UnderreplicationManager:
    await ClusterWriter(zk).init_cluster()
    urm = UnderreplicationManager(zk, "/ledgers")
    await urm.check_layout()
    return urm


async def vote(zk: ZkClient, name: str, bookie: str) -> None:
    """A vote written as BookKeeper's Java elector writes it (TextFormat AuditorVoteFormat)."""
    await zk.create(f"{ELECTION}/{name}", f'bookieId: "{bookie}"\n'.encode(), makepath=True)


# --- ZooKeeper commands ------------------------------------------------------------------


async def test_whoisauditor_reads_the_first_vote(zk: ZkClient) -> None:
    await cluster(zk)
    zkargs = ("--zk", zk.hosts)
    one_line_error(await bk("whoisauditor", *zkargs), "no auditor elected", 1)
    await zk.ensure_path(ELECTION)
    one_line_error(await bk("whoisauditor", *zkargs), "no auditor elected: no vote under", 1)

    await vote(zk, "V_0000000003", "10.0.0.1:3181")
    # ours carry a prefix; by name it sorts after "V_...", by sequence it is first
    await vote(zk, "f3a9c0d2e1b84b5c9d1e2f3a4b5c6d7eV_0000000002", "10.0.0.7:3181")
    await zk.create(f"{ELECTION}/not-a-vote", b"junk")
    ours = "f3a9c0d2e1b84b5c9d1e2f3a4b5c6d7eV_0000000002"
    run = await bk("whoisauditor", *zkargs)
    # These votes are persistent znodes (the test's), so no session holds them.
    assert (run.returncode, run.stdout, run.stderr) == (
        0,
        f"10.0.0.7:3181 (BookKeeper's election, vote {ours}; held by no session)\n",
        "",
    )
    run = await bk("whoisauditor", *zkargs, "--json")
    found = {
        "auditor": "10.0.0.7:3181",
        "election": "bookkeeper",
        "path": f"{ELECTION}/{ours}",
        "vote": ours,
        "held_by_session": False,
    }
    assert json.loads(run.stdout) == {**found, "elections": [found]}
    await zk.delete(f"{ELECTION}/{ours}")
    run = await bk(
        "whoisauditor", "--metadata-service-uri", f"zk+hierarchical://{zk.hosts}/ledgers"
    )
    assert (run.returncode, run.stdout) == (
        0,
        "10.0.0.1:3181 (BookKeeper's election, vote V_0000000003; held by no session)\n",
    )

    await zk.set(f"{ELECTION}/V_0000000003", b"not text format")
    one_line_error(await bk("whoisauditor", *zkargs), "V_0000000003", 1)


async def test_commands_refuse_a_root_without_a_cluster(zk: ZkClient) -> None:
    run = await bk("lost-bookie-recovery-delay", "--zk", zk.hosts, "--set", "5")
    one_line_error(run, "no BookKeeper cluster at /ledgers", 1)
    assert await zk.exists("/ledgers") is None  # nothing created at a mistyped root


async def test_lost_bookie_recovery_delay(zk: ZkClient) -> None:
    await cluster(zk)
    zkargs = ("--zk", zk.hosts)
    one_line_error(
        await bk("lost-bookie-recovery-delay", *zkargs), "lostBookieRecoveryDelay does not exist", 1
    )
    run = await bk("lost-bookie-recovery-delay", *zkargs, "--set", "30")
    assert (run.returncode, run.stdout) == (0, "lostBookieRecoveryDelay set to 30\n")
    assert (await zk.get(DELAY))[0] == b"30"
    run = await bk("lost-bookie-recovery-delay", *zkargs)
    assert (run.returncode, run.stdout) == (0, "30\n")
    run = await bk("lost-bookie-recovery-delay", *zkargs, "--set", "0", "--json")
    assert json.loads(run.stdout) == {"lost_bookie_recovery_delay": 0}
    data, stat = await zk.get(DELAY)
    assert (data, stat.version) == (b"0", 1)
    for bad in ("-5", "soon"):
        one_line_error(await bk("lost-bookie-recovery-delay", *zkargs, "--set", bad), "--set", 2)
    assert (await zk.get(DELAY))[0] == b"0"


async def test_autorecovery_toggles_the_disable_znode(zk: ZkClient) -> None:
    await cluster(zk)
    zkargs = ("--zk", zk.hosts)
    assert (await bk("autorecovery", "status", *zkargs)).stdout == "enabled\n"
    run = await bk("autorecovery", "disable", *zkargs)
    assert (run.returncode, run.stdout) == (0, "auto-recovery disabled\n")
    assert (await zk.get(DISABLE))[0] == b""
    assert (await bk("autorecovery", "status", *zkargs)).stdout == "disabled\n"
    run = await bk("autorecovery", "disable", *zkargs, "--json")
    assert (run.returncode, json.loads(run.stdout)) == (0, {"enabled": False, "changed": False})
    run = await bk("autorecovery", "enable", *zkargs)
    assert (run.returncode, run.stdout) == (0, "auto-recovery enabled\n")
    assert await zk.exists(DISABLE) is None
    run = await bk("autorecovery", "enable", *zkargs)
    assert (run.returncode, run.stdout) == (0, "auto-recovery was already enabled\n")
    one_line_error(await bk("autorecovery", "toggle", *zkargs), "invalid choice", 2)


async def test_trigger_without_target_rewrites_the_delay(zk: ZkClient) -> None:
    urm = await cluster(zk)
    zkargs = ("--zk", zk.hosts)
    await urm.init_lost_bookie_recovery_delay(60)
    one_line_error(await bk("trigger", *zkargs), "no auditor elected", 1)
    await vote(zk, "V_0000000001", "10.0.0.5:3181")
    await urm.disable_replication()
    one_line_error(await bk("trigger", *zkargs), "auto-recovery is disabled", 1)
    assert (await zk.get(DELAY))[1].version == 0
    await urm.enable_replication()

    run = await bk("trigger", *zkargs)
    assert run.returncode == 0, run.stderr
    assert "10.0.0.5:3181" in run.stdout
    data, stat = await zk.get(DELAY)
    assert (data, stat.version) == (b"60", 1)
    run = await bk("trigger", "bookies", *zkargs, "--json")
    assert json.loads(run.stdout) == {
        "triggered": ["bookies"],
        "auditor": "10.0.0.5:3181",
        "lost_bookie_recovery_delay": 60,
    }
    data, stat = await zk.get(DELAY)
    assert (data, stat.version) == (b"60", 2)

    one_line_error(await bk("trigger", "replicas", *zkargs), "give --target", 2)
    one_line_error(await bk("trigger"), "give --target HOST:PORT (a daemon) or --zk", 2)


# --- commands that dial a daemon -----------------------------------------------------------


@pytest.fixture
async def daemon(zk: ZkClient) -> AsyncIterator[Api]:
    a = await open_api(zk)
    try:
        yield a
    finally:
        await a.channel.close()
        await a.server.stop(0)


async def test_status(daemon: Api) -> None:
    run = await bk("status", "--target", daemon.target, "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert (doc["identity"], doc["is_leader"], doc["leader"]) == (ME, True, ME)
    assert (doc["zk_connected"], doc["replication_enabled"], doc["retry_queue_ledgers"]) == (
        True,
        True,
        4,
    )
    rep = doc["checks"]["replicas"]
    assert rep["outcome"] == "violations"
    assert rep["last_started"] == "2023-11-14T22:13:20.250000Z"
    assert rep["next_run"] == "2023-11-14T23:15:00.250000Z"
    assert rep["counts"]["no_replica"] == 1 and rep["ledgers_checked"] == 10
    assert doc["checks"]["ledgers"]["last_error"] == "ZooKeeper unavailable"
    assert doc["checks"]["ledgers"]["counts"] is None
    assert doc["checks"]["grace"]["enabled"] is False

    run = await bk("status", BK_AUDITOR_API_TARGET=daemon.target)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == (
        f"{ME}: leader (auditor: {ME}); metadata store connected; auto-recovery enabled"
    )
    replicas = next(line for line in lines if line.strip().startswith("replicas"))
    assert "violations" in replicas and "no_replica=1" in replicas
    assert "last error: ZooKeeper unavailable" in run.stdout


async def test_report(daemon: Api) -> None:
    report = daemon.control.state.checks[Check.REPLICAS].last_report
    assert report is not None
    run = await bk("report", "replicas", "--target", daemon.target, "--json")
    assert run.returncode == 0, run.stderr
    assert run.stdout == json.dumps(report.to_json()) + "\n"
    run = await bk("report", "replicas", "--target", daemon.target)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("check replicas: 10 ledgers checked; skipped: open 2\n")
    assert "0/3 copies of entries 0-4" in run.stdout
    one_line_error(
        await bk("report", "ledgers", "--target", daemon.target), "no report of check ledgers", 1
    )
    one_line_error(await bk("report", "racks", "--target", daemon.target), "invalid choice", 2)


async def test_trigger_on_a_daemon(daemon: Api, zk: ZkClient) -> None:
    t = ("--target", daemon.target)
    one_line_error(await bk("trigger", "replicas", *t), "needs authentication", 1)
    one_line_error(await bk("trigger", "replicas", *t, "--token", "nope"), "not valid", 1)
    assert daemon.control.triggered == []
    run = await bk("trigger", "replicas", *t, "--token", TOKEN)
    assert (run.returncode, run.stdout) == (0, f"triggered replicas on {ME}\n")
    run = await bk("trigger", *t, "--json", BK_AUDITOR_API_TOKEN=TOKEN)
    assert json.loads(run.stdout) == {"triggered": ["bookies"], "auditor": ME}
    assert daemon.control.triggered == [Check.REPLICAS, Check.BOOKIES]

    follower = await open_api(zk, state=sample_state(leader=False))
    try:
        run = await bk("trigger", "placement", "--target", follower.target, "--token", TOKEN)
        one_line_error(run, f"the auditor is {OTHER}", 1)
        assert follower.control.triggered == []
    finally:
        await follower.channel.close()
        await follower.server.stop(0)


async def test_a_token_no_client_can_send_is_one_line(daemon: Api) -> None:
    run = await bk("trigger", "replicas", "--target", daemon.target, "--token", "tökén")
    one_line_error(
        run, "the API token (--token or BK_AUDITOR_API_TOKEN) must be printable ASCII", 2
    )
    assert "character 2 is a non-ASCII character (U+00F6)" in run.stderr
    assert "tökén" not in run.stderr
    assert daemon.control.triggered == []


async def test_health(daemon: Api) -> None:
    t = ("--target", daemon.target)
    run = await bk("health", *t)
    assert (run.returncode, run.stdout) == (0, "SERVING\n")
    daemon.control.state.zk_connected = False
    await daemon.server.refresh_health()
    run = await bk("health", *t, "--service", "auditor-readiness")
    assert (run.returncode, run.stdout) == (1, "NOT_SERVING\n")
    run = await bk("health", *t, "--service", "auditor-liveness")
    assert (run.returncode, run.stdout) == (0, "SERVING\n")
    run = await bk("health", *t, "--service", "other")
    assert (run.returncode, run.stdout) == (1, "SERVICE_UNKNOWN\n")


async def test_unreachable_target_is_exit_3_within_the_timeout() -> None:
    closed = f"127.0.0.1:{free_port()}"
    for args in (("status",), ("report", "replicas"), ("health",), ("trigger", "--token", "x")):
        run = await bk(*args, "--target", closed, "--timeout", "2")
        one_line_error(run, f"cannot reach the auditor at {closed}", 3)

    # a peer that accepts and never speaks: only the deadline ends the call
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    try:
        run = await bk("status", "--target", f"127.0.0.1:{port}", "--timeout", "1")
        one_line_error(run, f"127.0.0.1:{port}", 3)
        assert run.seconds < 8
    finally:
        silent.close()

    for target in ("nohostport", "host:99999", "h:p"):
        one_line_error(await bk("status", "--target", target), "--target must be HOST:PORT", 2)


def test_default_target_is_the_local_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BK_AUDITOR_API_TARGET", raising=False)
    args = build_parser().parse_args(["status"])
    assert api_commands.daemon_target(args) == f"127.0.0.1:{DEFAULT_API_PORT}"
    monkeypatch.setenv("BK_AUDITOR_API_TARGET", "auditor.example:1234")
    assert api_commands.daemon_target(args) == "auditor.example:1234"


async def test_tls_flags(zk: ZkClient, pki: Pki) -> None:  # noqa: F811
    a = await open_api(
        zk,
        token=None,
        tls_cert=str(pki.server_cert),
        tls_key=str(pki.server_key),
        tls_client_ca=str(pki.ca),
    )
    try:
        mtls = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert)]
        mtls += ["--tls-key", str(pki.client_key)]
        run = await bk("status", "--target", a.target, *mtls, "--json")
        assert (run.returncode, json.loads(run.stdout)["identity"]) == (0, ME)
        run = await bk("trigger", "grace", "--target", a.target, *mtls)
        assert (run.returncode, run.stdout) == (0, f"triggered grace on {ME}\n")
        assert a.control.triggered == [Check.GRACE]
        # without a client certificate the handshake fails: unreachable, exit 3
        run = await bk("status", "--target", a.target, "--tls-ca", str(pki.ca), "--timeout", "2")
        one_line_error(run, "cannot reach the auditor", 3)
        one_line_error(
            await bk("status", "--target", a.target, "--tls-cert", str(pki.client_cert)),
            "both --tls-cert and --tls-key",
            2,
        )
    finally:
        await a.channel.close()
        await a.server.stop(0)


async def test_token_file(daemon: Api, tmp_path: Path) -> None:
    """`--token-file`: the token never on the command line; its line break is not part of it."""
    t = ("trigger", "replicas", "--target", daemon.target)
    good = tmp_path / "token"
    good.write_text(TOKEN + "\n")
    # Readable by every user: refused, as SSH refuses such a key; private, it is used.
    good.chmod(0o644)
    one_line_error(
        await bk(*t, "--token-file", str(good)),
        f"--token-file {good} is open to every user (mode 0644): chmod o-rwx {good}",
        2,
    )
    assert daemon.control.triggered == []
    good.chmod(0o600)
    run = await bk(*t, "--token-file", str(good))
    assert (run.returncode, run.stdout) == (0, f"triggered replicas on {ME}\n"), run.stderr
    wrong = tmp_path / "wrong"
    wrong.write_text("nope")
    wrong.chmod(0o640)
    # the file wins over the environment
    run = await bk(*t, "--token-file", str(wrong), BK_AUDITOR_API_TOKEN=TOKEN)
    one_line_error(run, "not valid", 1)
    assert daemon.control.triggered == [Check.REPLICAS]

    missing = tmp_path / "missing"
    one_line_error(
        await bk(*t, "--token-file", str(missing)), f"--token-file {missing} does not exist", 2
    )
    one_line_error(
        await bk(*t, "--token-file", str(tmp_path)), f"cannot read --token-file {tmp_path}", 2
    )
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    one_line_error(await bk(*t, "--token-file", str(empty)), f"--token-file {empty} is empty", 2)
    one_line_error(await bk(*t, "--token", ""), "--token is empty", 2)
    one_line_error(
        await bk(*t, "--token", TOKEN, "--token-file", str(good)),
        "argument --token-file: not allowed with argument --token",
        2,
    )
    # Blanks around the token are no part of it, as the daemon reads api.token_file.
    blanks = tmp_path / "blanks"
    blanks.write_text(f" {TOKEN} \r\n")
    blanks.chmod(0o600)
    run = await bk(*t, "--token-file", str(blanks))
    assert (run.returncode, run.stdout) == (0, f"triggered replicas on {ME}\n"), run.stderr
    assert daemon.control.triggered == [Check.REPLICAS, Check.REPLICAS]
    inner = tmp_path / "inner"
    inner.write_text("s3cr\x7fet\n")
    inner.chmod(0o600)
    one_line_error(
        await bk(*t, "--token-file", str(inner)),
        f"the token in --token-file {inner} must be printable ASCII",
        2,
    )
    assert "s3cr" not in (await bk(*t, "--token-file", str(inner))).stderr
    # every command that dials a daemon takes it
    for args in (("status",), ("report", "replicas"), ("health",), ("explain", "1")):
        run = await bk(*args, "--target", daemon.target, "--token-file", str(missing))
        one_line_error(run, f"--token-file {missing} does not exist", 2)


async def test_health_json(daemon: Api) -> None:
    t = ("--target", daemon.target, "--json")
    run = await bk("health", *t)
    assert (run.returncode, run.stdout) == (0, '{"service": "", "status": "SERVING"}\n')
    daemon.control.state.zk_connected = False
    await daemon.server.refresh_health()
    run = await bk("health", *t, "--service", "auditor-readiness")
    assert (run.returncode, run.stdout) == (
        1,
        '{"service": "auditor-readiness", "status": "NOT_SERVING"}\n',
    )


async def test_explain_takes_target_and_the_deprecated_api(daemon: Api) -> None:
    """One name for a daemon's address everywhere; `--api` still works, hidden."""
    lost = "bk-auditor: error: explaining ledger 42: ledger 42 does not exist under /ledgers\n"
    run = await bk("explain", "42", "--target", daemon.target)
    assert (run.returncode, run.stdout, run.stderr) == (2, "", lost)
    run = await bk("explain", "42", "--api", daemon.target)
    assert (run.returncode, run.stdout, run.stderr) == (2, "", lost)
    run = await bk("explain", "42", "--api", daemon.target, "--target", daemon.target)
    one_line_error(run, "give --target alone (--api is its deprecated name)", 2)
    assert "--api" not in _subparsers(build_parser()).choices["explain"].format_help()


async def test_trigger_finds_the_cluster_in_the_environment(zk: ZkClient) -> None:
    urm = await cluster(zk)
    await urm.init_lost_bookie_recovery_delay(60)
    await vote(zk, "V_0000000001", "10.0.0.5:3181")
    run = await bk("trigger", BK_AUDITOR_ZK=zk.hosts)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("audit triggered: 10.0.0.5:3181 audits the bookies now")
