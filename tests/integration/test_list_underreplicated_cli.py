"""`list-underreplicated` with BookKeeper's filters (`listunderreplicated -missingreplica`,
`-excludingmissingreplica`, `-c`) and ISO 8601 times, run as an operator runs it."""

from __future__ import annotations

import json
import os

from auditor.metadata.underreplication import UnderreplicationManager, ur_ledger_path
from auditor.testing.cli import bk as run_cli
from auditor.testing.cluster import ClusterWriter
from auditor.zk import ZkClient

A, B, C = "10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"
CTIME = 1_700_000_000_250  # 2023-11-14T22:13:20.250Z


async def bk(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BK_AUDITOR_")}
    return await run_cli("list-underreplicated", *args, within=60, env=env)


async def _marks(zk: ZkClient) -> None:
    """Ledger 1 misses A, 2 misses A and B, 3 misses B, 4 misses C and has no ctime."""
    await ClusterWriter(zk).init_cluster()
    urm = UnderreplicationManager(zk, "/ledgers")
    await urm.check_layout()
    await urm.mark_underreplicated(1, [A], now_ms=CTIME)
    await urm.mark_underreplicated(2, [A, B], now_ms=CTIME)
    await urm.mark_underreplicated(3, [B], now_ms=CTIME)
    await UnderreplicationManager(zk, "/ledgers", store_ctime=False).mark_underreplicated(4, [C])


async def test_filters_and_count(zk: ZkClient) -> None:
    await _marks(zk)
    z = ("--zk", zk.hosts)
    code, out, err = await bk(*z)
    assert (code, out) == (
        0,
        f"           1  ctime={CTIME}  missing={A}\n"
        f"           2  ctime={CTIME}  missing={A},{B}\n"
        f"           3  ctime={CTIME}  missing={B}\n"
        f"           4  ctime=-1  missing={C}\n",
    )
    assert err == "4 under-replicated ledgers; auto-recovery enabled\n"

    code, out, err = await bk(*z, "--missing-replica", A)
    assert (code, [line.split()[0] for line in out.splitlines()]) == (0, ["1", "2"])
    assert err == "2 under-replicated ledgers; auto-recovery enabled\n"
    code, out, _ = await bk(*z, "--exclude-missing-replica", A)
    assert [line.split()[0] for line in out.splitlines()] == ["3", "4"]
    code, out, _ = await bk(*z, "--missing-replica", B, "--exclude-missing-replica", A)
    assert [line.split()[0] for line in out.splitlines()] == ["3"]
    code, out, _ = await bk(*z, "--missing-replica", "10.0.0.9:3181")
    assert (code, out) == (0, "")

    code, out, err = await bk(*z, "--count-only")
    assert (code, out, err) == (0, "4\n", "4 under-replicated ledgers; auto-recovery enabled\n")
    code, out, _ = await bk(*z, "--count-only", "--missing-replica", B)
    assert (code, out) == (0, "2\n")
    code, out, _ = await bk(*z, "--count-only", "--json", "--exclude-missing-replica", B)
    assert (code, out) == (0, '{"count": 2, "corrupt": 0}\n')

    code, out, _ = await bk(*z, "--json", "--missing-replica", B)
    assert [json.loads(line) for line in out.splitlines()] == [
        {"ledger_id": 2, "replicas": [A, B], "ctime": CTIME},
        {"ledger_id": 3, "replicas": [B], "ctime": CTIME},
    ]


async def test_iso_time(zk: ZkClient) -> None:
    await _marks(zk)
    z = ("--zk", zk.hosts, "--iso-time")
    code, out, _ = await bk(*z, "--exclude-missing-replica", B)
    assert (code, out) == (
        0,
        f"           1  ctime=2023-11-14T22:13:20.250000Z  missing={A}\n"
        f"           4  ctime=-  missing={C}\n",
    )
    code, out, _ = await bk(*z, "--json", "--exclude-missing-replica", B)
    assert [json.loads(line) for line in out.splitlines()] == [
        {
            "ledger_id": 1,
            "replicas": [A],
            "ctime": CTIME,
            "ctime_iso": "2023-11-14T22:13:20.250000Z",
        },
        {"ledger_id": 4, "replicas": [C], "ctime": -1, "ctime_iso": None},
    ]


async def test_a_corrupt_mark_passes_every_filter(zk: ZkClient) -> None:
    """A corrupt mark names no replicas, so no filter can leave it out: it is always named,
    and the exit status is 1, counting or not."""
    await _marks(zk)
    path = ur_ledger_path("/ledgers/underreplication", 5)
    await zk.create(path, b"\xfe\xfe", makepath=True)
    z = ("--zk", zk.hosts, "--missing-replica", C)
    code, out, err = await bk(*z)
    assert (code, out) == (1, f"           4  ctime=-1  missing={C}\n")
    lines = err.splitlines()
    assert lines[0].startswith(f"bk-auditor: error: corrupt under-replication mark {path}: ")
    assert lines[1:] == ["1 under-replicated ledgers, 1 corrupt marks; auto-recovery enabled"]
    code, out, err = await bk(*z, "--count-only")
    assert (code, out) == (1, "1\n")
    assert err.splitlines()[0].startswith("bk-auditor: error: corrupt under-replication mark")
    code, out, _ = await bk(*z, "--count-only", "--json")
    assert (code, out) == (1, '{"count": 1, "corrupt": 1}\n')
    code, out, _ = await bk(*z, "--json")
    docs = [json.loads(line) for line in out.splitlines()]
    assert code == 1
    assert [d["ledger_id"] for d in docs] == [4, 5] and docs[1]["path"] == path
