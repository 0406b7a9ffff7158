"""The first `bk-auditor` commands, run as an operator runs them (a subprocess)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import pytest

from auditor.bookie.client import BookieClient
from auditor.bookie.protocol import Status
from auditor.bookie.results import ErrorStatus
from auditor.metadata.model import LedgerState
from auditor.metadata.registry import address_from_service_info, register_bookie
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.zkserver import free_port
from auditor.zk import ZkClient

E1 = ["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"]
E2 = ["10.0.0.1:3181", "10.0.0.4:3181", "10.0.0.3:3181"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "auditor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("bk-auditor: error: ")
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr


async def _sample(zk: ZkClient) -> None:
    w = ClusterWriter(zk)
    await w.init_cluster()
    await w.write_ledger(
        make_metadata(
            1, [(0, E1), (10, E2)], write_quorum=2, ack_quorum=2, last_entry_id=19, length=2000
        )
    )
    await w.write_ledger(make_metadata(2, E1, state=LedgerState.OPEN, format_version=2))
    await w.write_ledger(make_metadata(2147483647, E1, last_entry_id=0, length=1, format_version=1))
    for b in E1:
        await w.add_cookie(b)
    await register_bookie(zk, "/ledgers", "10.0.0.1:3181", "127.0.0.1", 3181)
    await UnderreplicationManager(zk, "/ledgers").mark_underreplicated(
        1, ["10.0.0.2:3181"], now_ms=1700000000000
    )


async def test_ledgers_json(zk: ZkClient) -> None:
    await _sample(zk)
    proc = run("ledgers", "--zk", zk.hosts, "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["ledger_id"] for r in rows] == [1, 2, 2147483647]
    assert rows[0]["state"] == "CLOSED"
    assert rows[0]["ensembles"] == {"0": E1, "10": E2}
    assert (rows[0]["ensemble_size"], rows[0]["write_quorum"], rows[0]["ack_quorum"]) == (3, 2, 2)
    assert (rows[0]["last_entry_id"], rows[0]["length"]) == (19, 2000)
    assert rows[1]["state"] == "OPEN" and rows[1]["format_version"] == 2
    assert rows[2]["format_version"] == 1
    assert rows[2]["path"] == "/ledgers/000/0000/0021/4748/L3647"
    assert "3 ledgers, 0 corrupt" in proc.stderr


async def test_ledgers_table_and_the_other_listings(zk: ZkClient) -> None:
    await _sample(zk)
    proc = run("ledgers", "--zk", zk.hosts)
    assert proc.returncode == 0
    assert len(proc.stdout.splitlines()) == 3
    assert "CLOSED" in proc.stdout.splitlines()[0]

    proc = run("list-underreplicated", "--zk", zk.hosts, "--json")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x) for x in proc.stdout.splitlines()] == [
        {"ledger_id": 1, "replicas": ["10.0.0.2:3181"], "ctime": 1700000000000}
    ]

    proc = run("bookies", "--zk", zk.hosts, "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["bookie_id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert rows["10.0.0.1:3181"]["state"] == "writable"
    assert rows["10.0.0.1:3181"]["address"] == "127.0.0.1:3181"
    assert rows["10.0.0.2:3181"]["state"] == "down"
    assert rows["10.0.0.2:3181"]["address"] == "10.0.0.2:3181"


async def test_metadata_service_uri(zk: ZkClient) -> None:
    await _sample(zk)
    uri = f"zk+hierarchical://{zk.hosts.replace(',', ';')}/ledgers"
    proc = run("ledgers", "--metadata-service-uri", uri, "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 3


async def test_corrupt_ledger_names_id_and_path_and_listing_goes_on(zk: ZkClient) -> None:
    await _sample(zk)
    w = ClusterWriter(zk)
    await w.write_raw(5, b"garbage")
    proc = run("ledgers", "--zk", zk.hosts, "--json")
    assert proc.returncode == 1
    assert [json.loads(x)["ledger_id"] for x in proc.stdout.splitlines()] == [1, 2, 2147483647]
    err = [x for x in proc.stderr.splitlines() if x.startswith("bk-auditor: error")]
    assert len(err) == 1
    assert "ledger 5" in err[0] and "/ledgers/00/0000/L0005" in err[0]
    assert "Traceback" not in proc.stderr


async def test_unknown_layout_is_one_line(zk: ZkClient) -> None:
    await zk.create("/ledgers/LAYOUT", b"2\norg.example.SomethingElseFactory:1", makepath=True)
    assert_one_line_error(run("ledgers", "--zk", zk.hosts), "unknown ledger manager")


async def test_missing_cluster_is_one_line(zk: ZkClient) -> None:
    assert_one_line_error(run("ledgers", "--zk", zk.hosts), "no BookKeeper cluster at /ledgers")


def test_unreachable_zookeeper_fails_within_its_timeout() -> None:
    t0 = time.monotonic()
    proc = run("ledgers", "--zk", f"127.0.0.1:{free_port()}", "--timeout", "2")
    elapsed = time.monotonic() - t0
    assert_one_line_error(proc, "cannot connect to ZooKeeper")
    assert proc.returncode == 3
    assert elapsed < 15


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["ledgers"], "--zk"),
        (["ledgers", "--zk", "h:1", "--timeout", "0"], "--timeout"),
        (["ledgers", "--zk", "h:1", "--ledgers-root", "ledgers"], "--ledgers-root"),
        (["ledgers", "--metadata-service-uri", "metadata-store:oxia://x:6648"], "Oxia"),
        (["check", "replicas", "--mark", "--metadata-service-uri", "etcd://x/ledgers"], "etcd"),
        (["recover", "h:1", "--metadata-service-uri", "etcd://x/ledgers"], "etcd"),
        (["nonsense"], "invalid choice"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(args: list[str], needle: str) -> None:
    proc = run(*args)
    assert_one_line_error(proc, needle)
    assert proc.returncode == 2


async def test_bookie_emulator_command_registers_and_unregisters(zk: ZkClient) -> None:
    await ClusterWriter(zk).init_cluster()
    port = free_port()
    bookie_id = f"127.0.0.1:{port}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "auditor", "bookie-emulator", "--zk", zk.hosts, "--port", str(port)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        while True:
            children, changed = await zk.get_children_watched("/ledgers/available")
            if bookie_id in children:
                break
            assert proc.returncode is None
            await asyncio.wait_for(changed.wait(), 30)
        data, _ = await zk.get(f"/ledgers/available/{bookie_id}")
        assert address_from_service_info(data) == ("127.0.0.1", port)

        async def resolve(b: str) -> tuple[str, int] | None:
            return ("127.0.0.1", port)

        async with BookieClient(resolve, request_timeout=5.0) as client:  # it speaks v3
            listed = await client.get_list_of_entries(bookie_id, 1)
            assert isinstance(listed, ErrorStatus) and listed.status is Status.ENOLEDGER
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert await zk.exists(f"/ledgers/available/{bookie_id}") is None
        assert await zk.exists(f"/ledgers/cookies/{bookie_id}") is not None
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.communicate()


def test_demo_finds_every_seeded_fault_and_stops_by_itself() -> None:
    """`make demo DURATION=...`: two daemons elect a leader whose first round finds
    exactly the seeded faults; then the whole loop (a bookie stops, its ledgers are
    marked, the workers copy them, the checks come back clean); then everything stops
    on its own."""
    proc = run("demo", "--duration", "1", timeout=480)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for needle in [
        "Cluster: 2000 healthy ledgers and 8 seeded faults",
        # the seeded 2,008 and the demo's Pulsar topics' 14 (a deleted one's orphan included)
        "check bookies: 2026 ledgers checked",
        "  no_replica                           1",
        "  below_ack_quorum                     1",
        "  below_write_quorum                   1",
        "  bookie_unavailable_registered        1",
        "  placement_not_adhering               1",
        "  unreadable_fragments                 2",
        "pulsar-audit: 2026 ledgers checked",
        "  ledger       4021  persistent://acme/iot/readings  (no metadata)",
        "  ledger       4030  persistent://acme/iot/old-readings  size 48  "
        "bookkeeper shell deleteledger -ledgerid 4030 -force",
        "Every seeded fault was found as expected.",
        "The daemons restart with their replication workers on (worker.enabled=true)",
        "unrecoverable: 3002 (entries 5 have no copy anywhere; kept marked for an operator)",
        "(/rack-0) stops; 1002 ledgers name it.",
        "the leader's lost-bookie audit found 1002 ledgers on lost bookies "
        "and marked 1002 under-replicated",
        "1002 ledgers re-replicated (auditor-",
        "  of them marked under-replicated                   1002       0",
        "  replicas no_replica                                  1       0",
        "  placement placement_not_adhering                     1       0",
        "The stopped bookie's 1002 ledgers are whole again: none names it, none is marked, "
        "and the replicas and placement checks find nothing in them.",
        "Running for 1 s",
        "Stopped: daemons, bookies and ZooKeeper are gone.",
    ]:
        assert needle in out, needle
    assert out.count(" leader    gRPC 127.0.0.1:") == 1
    assert out.count(" follower  gRPC 127.0.0.1:") == 1
