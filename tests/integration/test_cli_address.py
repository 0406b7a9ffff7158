"""Where the one-shot commands find the cluster: `--zk` > BK_AUDITOR_ZK > `--bk-conf`.

Run as an operator runs them (a subprocess), against a real ZooKeeper: each source
alone reaches the cluster, a higher one wins over a lower one (the lower one points at
a closed port, so the wrong choice fails), and none at all is one line, exit 2.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.cli import bk as run_cli
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.zkserver import free_port
from auditor.zk import ZkClient

E1 = ["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"]
ELECTION = "/ledgers/underreplication/auditorelection"


async def bk(*args: str, **env: str) -> tuple[int, str, str]:
    """`bk-auditor ARGS` with none of the address variables but those given."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BK_AUDITOR_", "PULSAR_PREFIX_")) and k not in ("zkServers",)
    }
    environ.update(env)
    return await run_cli(*args, within=60, env=environ)


def one_line_error(result: tuple[int, str, str], needle: str, code: int = 2) -> None:
    rc, _, err = result
    assert rc == code, result
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bk-auditor: error: "), lines[0]
    assert needle in lines[0], lines[0]


async def _cluster(zk: ZkClient) -> None:
    w = ClusterWriter(zk)
    await w.init_cluster()
    await w.write_ledger(make_metadata(7, E1, last_entry_id=9, length=100))
    urm = UnderreplicationManager(zk, "/ledgers")
    await urm.mark_underreplicated(7, ["10.0.0.2:3181"], now_ms=1700000000000)
    await urm.init_lost_bookie_recovery_delay(30)
    await zk.create(f"{ELECTION}/V_0000000001", b'bookieId: "10.0.0.9:3181"\n', makepath=True)


def _closed() -> str:
    return f"127.0.0.1:{free_port()}"


def _conf(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bk_server.conf"
    path.write_text(text)
    return str(path)


#: One read-only invocation of every one-shot command that connects to ZooKeeper, and
#: what it prints on its first stdout line.
COMMANDS: list[tuple[tuple[str, ...], str]] = [
    (("ledgers", "--json"), '"ledger_id": 7'),
    (("list-underreplicated",), "missing=10.0.0.2:3181"),
    (("bookies", "--json"), ""),
    (("whoisauditor",), "10.0.0.9:3181"),
    (("lost-bookie-recovery-delay",), "30"),
    (("autorecovery", "status"), "enabled"),
    (("autorecovery-status", "--json"), ""),
    (("trigger",), "audit triggered: 10.0.0.9:3181"),
]


async def test_every_source_reaches_the_cluster(zk: ZkClient, tmp_path: Path) -> None:
    await _cluster(zk)
    server, chroot = zk.hosts.split("/", 1)
    by_uri = _conf(tmp_path, f"metadataServiceUri=zk+hierarchical://{server}/{chroot}/ledgers\n")
    sources: list[tuple[tuple[str, ...], dict[str, str]]] = [
        (("--zk", zk.hosts), {}),
        ((), {"BK_AUDITOR_ZK": zk.hosts}),
        ((), {"BK_AUDITOR_ZK": f"zk+hierarchical://{server}/{chroot}/ledgers"}),
        (("--bk-conf", by_uri), {}),
    ]
    # The 32 runs are independent (the one write, `trigger`, writes what is there): a
    # few at a time, as the machine's cores allow.
    slots = asyncio.Semaphore(3)

    async def one(
        args: tuple[str, ...], how: tuple[str, ...], env: dict[str, str]
    ) -> tuple[int, str, str]:
        async with slots:
            return await bk(*args, *how, **env)

    runs = [(args, shown, how, env) for args, shown in COMMANDS for how, env in sources]
    results = await asyncio.gather(*(one(args, how, env) for args, _, how, env in runs))
    for (args, shown, how, env), (rc, out, err) in zip(runs, results, strict=True):
        assert rc == 0, (args, how, env, err)
        assert shown in out, (args, how, out)


async def test_bk_conf_zk_servers_and_ledgers_root(zk: ZkClient, tmp_path: Path) -> None:
    """zkServers (a comma list, as Commons Configuration reads it) and zkLedgersRootPath;
    `--ledgers-root` wins over the file's root."""
    await _cluster(zk)
    server, chroot = zk.hosts.split("/", 1)
    conf = _conf(
        tmp_path,
        f"# bk_server.conf\nzkServers={server}, {server}/{chroot}\n"
        "zkLedgersRootPath=/ledgers\nbookiePort=3181\n",
    )
    rc, out, err = await bk("ledgers", "--json", "--bk-conf", conf)
    assert rc == 0, err
    assert [json.loads(line)["ledger_id"] for line in out.splitlines()] == [7]
    conf = _conf(tmp_path, f"zkServers={zk.hosts}\nzkLedgersRootPath=/elsewhere\n")
    one_line_error(await bk("ledgers", "--bk-conf", conf), "no BookKeeper cluster at /elsewhere", 1)
    rc, out, err = await bk("ledgers", "--bk-conf", conf, "--ledgers-root", "/ledgers")
    assert rc == 0, err


async def test_precedence(zk: ZkClient, tmp_path: Path) -> None:
    """`--zk` > BK_AUDITOR_ZK > `--bk-conf`: the source below always names a closed port."""
    await _cluster(zk)
    closed_conf = _conf(tmp_path, f"zkServers={_closed()}\n")
    args = ("lost-bookie-recovery-delay", "--timeout", "2")
    rc, out, err = await bk(
        *args, "--zk", zk.hosts, "--bk-conf", closed_conf, BK_AUDITOR_ZK=_closed()
    )
    assert (rc, out) == (0, "30\n"), err
    rc, out, err = await bk(*args, "--bk-conf", closed_conf, BK_AUDITOR_ZK=zk.hosts)
    assert (rc, out) == (0, "30\n"), err
    one_line_error(await bk(*args, "--bk-conf", closed_conf), "cannot connect to ZooKeeper", 3)
    # an empty variable is unset, as the daemon's variables are
    rc, out, err = await bk(
        *args, "--bk-conf", _conf(tmp_path, f"zkServers={zk.hosts}\n"), BK_AUDITOR_ZK=" "
    )
    assert (rc, out) == (0, "30\n"), err


@pytest.mark.parametrize(
    "command",
    [
        ("ledgers",),
        ("list-underreplicated",),
        ("bookies",),
        ("check", "bookies"),
        ("explain", "1"),
        ("risk",),
        ("what-if", "--decommission", "10.0.0.1:3181"),
        ("recover", "10.0.0.1:3181", "--dry-run"),
        ("decommission", "10.0.0.1:3181"),
        ("autorecovery-status",),
        ("whoisauditor",),
        ("lost-bookie-recovery-delay",),
        ("autorecovery", "status"),
    ],
)
async def test_no_address_is_one_line_exit_2(command: tuple[str, ...]) -> None:
    one_line_error(
        await bk(*command),
        "give --zk HOST:PORT[,HOST:PORT...] or --metadata-service-uri, set BK_AUDITOR_ZK, "
        "or give --bk-conf bk_server.conf",
    )


async def test_a_bad_bk_conf_is_one_line_exit_2(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.conf")
    one_line_error(await bk("ledgers", "--bk-conf", missing), f"--bk-conf {missing} does not exist")
    empty = _conf(tmp_path, "bookiePort=3181\nzkServers=\n")
    one_line_error(
        await bk("whoisauditor", "--bk-conf", empty),
        f"--bk-conf {empty} names neither metadataServiceUri nor zkServers",
    )
    bad = _conf(tmp_path, "metadataServiceUri=metadata-store:oxia://h:6648\n")
    one_line_error(await bk("ledgers", "--bk-conf", bad), f"{bad}:1 metadataServiceUri")
    one_line_error(
        await bk("trigger"),
        "give --target HOST:PORT (a daemon) or --zk/--metadata-service-uri/BK_AUDITOR_ZK/"
        "--bk-conf (BookKeeper's own trigger)",
    )
