"""`bk-auditor bookies`: state and rack columns, `--state` and `--rack` filters.

Real ZooKeeper, the CLI in a child process. Racks come from the sources the placement
check reads, in its order: the racks file over Pulsar's `/bookies` znode; a bookie that
no source knows gets the policy's default location.
"""

from __future__ import annotations

import json
from pathlib import Path

from auditor.metadata.registry import register_bookie
from auditor.testing.cli import bk
from auditor.testing.cluster import ClusterWriter
from auditor.zk import ZkClient

B1, B2, B3, B4 = "10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181", "10.0.0.4:3181"

PULSAR_RACKS = {
    "default": {
        B1: {"rack": "/rack-z", "hostname": "10.0.0.1"},  # the file wins for B1
        B2: {"rack": "rack-b", "hostname": "10.0.0.2"},
        "10.0.0.4:9999": {"rack": "/rack-a", "hostname": "10.0.0.4"},  # B4 by host
    }
}


async def _cluster(zk: ZkClient, tmp_path: Path) -> str:
    """B1 writable, B2 read-only, B3 down (a cookie, not registered), B4 writable (placed by
    its host in the znode); returns the racks file."""
    w = ClusterWriter(zk)
    await w.init_cluster()
    for b in (B1, B2, B3):
        await w.add_cookie(b)
    await register_bookie(zk, "/ledgers", B1, "127.0.0.1", 3181)
    await register_bookie(zk, "/ledgers", B2, "127.0.0.2", 3181, readonly=True)
    await register_bookie(zk, "/ledgers", B4, "10.0.0.4", 3181)
    await zk.create("/bookies", json.dumps(PULSAR_RACKS).encode())
    racks = tmp_path / "racks.json"
    racks.write_text(json.dumps({B1: "/rack-a"}))
    return str(racks)


def _rows(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


async def test_state_and_rack_columns(zk: ZkClient, tmp_path: Path) -> None:
    racks = await _cluster(zk, tmp_path)
    cfg = ("--set", f"checks.racks_file={racks}")
    rc, out, err = await bk("bookies", "--zk", zk.hosts, *cfg)
    assert rc == 0, err
    assert out.splitlines() == [
        f"{B1:<30} writable  {'/rack-a':<20} 127.0.0.1:3181",
        f"{B2:<30} readonly  {'/rack-b':<20} 127.0.0.2:3181",
        f"{B3:<30} down      {'/default-rack':<20} 10.0.0.3:3181",
        f"{B4:<30} writable  {'/rack-a':<20} 10.0.0.4:3181",
    ]
    rc, out, err = await bk("bookies", "--zk", zk.hosts, "--json", *cfg)
    assert rc == 0, err
    file_source = f"file:{tmp_path / 'racks.json'}"
    assert _rows(out) == [
        {
            "bookie_id": B1,
            "state": "writable",
            "rack": "/rack-a",
            "rack_source": file_source,
            "address": "127.0.0.1:3181",
            "cookie": True,
        },
        {
            "bookie_id": B2,
            "state": "readonly",
            "rack": "/rack-b",
            "rack_source": "znode:/bookies",
            "address": "127.0.0.2:3181",
            "cookie": True,
        },
        {
            "bookie_id": B3,
            "state": "down",
            "rack": "/default-rack",
            "rack_source": None,
            "address": "10.0.0.3:3181",
            "cookie": True,
        },
        {
            "bookie_id": B4,
            "state": "writable",
            "rack": "/rack-a",
            "rack_source": "znode:/bookies",
            "address": "10.0.0.4:3181",
            "cookie": True,
        },
    ]


async def test_filters(zk: ZkClient, tmp_path: Path) -> None:
    racks = await _cluster(zk, tmp_path)
    base = ("bookies", "--zk", zk.hosts, "--json", "--set", f"checks.racks_file={racks}")

    async def ids(*flags: str) -> list[object]:
        rc, out, err = await bk(*base, *flags)
        assert rc == 0, err
        return [row["bookie_id"] for row in _rows(out)]

    assert await ids("--state", "writable") == [B1, B4]
    assert await ids("--state", "readonly") == [B2]
    assert await ids("--state", "down") == [B3]
    assert await ids("--state", "readonly", "--state", "down") == [B2, B3]
    assert await ids("--rack", "/rack-a") == [B1, B4]
    assert await ids("--rack", "rack-b/") == [B2]  # normalised as BookKeeper does
    assert await ids("--rack", "/default-rack") == [B3]
    assert await ids("--rack", "/rack-a", "--state", "writable") == [B1, B4]
    assert await ids("--rack", "/rack-b", "--state", "writable") == []
    assert await ids("--rack", "/nowhere") == []
    # text output filters the same
    rc, out, err = await bk(*[a for a in base if a != "--json"], "--state", "readonly")
    assert (rc, out) == (0, f"{B2:<30} readonly  {'/rack-b':<20} 127.0.0.2:3181\n"), err


async def test_bad_filters_are_one_line_exit_2(zk: ZkClient, tmp_path: Path) -> None:
    await _cluster(zk, tmp_path)
    for flags, needle in (
        (("--state", "lost"), "invalid choice: 'lost'"),
        (("--rack", "/"), "--rack '/' names no location"),
    ):
        rc, out, err = await bk("bookies", "--zk", zk.hosts, *flags)
        assert rc == 2 and out == "", err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("bk-auditor: error: "), err
        assert needle in lines[0], err


async def test_broken_rack_source_is_one_line_exit_2(zk: ZkClient, tmp_path: Path) -> None:
    """Every bookie still listed (at the default rack), one error line, exit 2."""
    await _cluster(zk, tmp_path)
    await zk.set("/bookies", b"{not json")
    rc, out, err = await bk("bookies", "--zk", zk.hosts)
    assert rc == 2 and out != "", err
    assert err.startswith(
        "bk-auditor: error: rack sources unreadable, every bookie shown at the default rack: "
        "rack znode /bookies is not valid JSON"
    ), err
    assert len(err.strip().splitlines()) == 1, err
