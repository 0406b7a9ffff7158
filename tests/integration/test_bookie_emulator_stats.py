"""The emulator's benchmark features: seed files, counters as JSON, a process that reports.

Benchmarks run each bookie in a process of its own, seeded from a file and
counting what the auditor sends; these tests hold those counts to exact
values against a real client over TCP and a real ZooKeeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from auditor.bookie.client import BookieClient
from auditor.bookie.protocol import Status, verify_entry_body
from auditor.bookie.results import ErrorStatus, Ok
from auditor.metadata.model import DigestType
from auditor.metadata.registry import resolve_bookie, watch_bookies
from auditor.testing.bookie import (
    SEED_MAGIC,
    BookieEmulator,
    SeedFileError,
    read_seed_file,
    run_emulator,
    write_seed_file,
)
from auditor.testing.bookie.storage import make_body_factory
from auditor.testing.zkserver import free_port
from auditor.zk import ZkClient

ROOT = "/ledgers"

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def client(zk: ZkClient) -> AsyncIterator[BookieClient]:
    async def resolve(bookie_id: str) -> tuple[str, int] | None:
        return await resolve_bookie(zk, ROOT, bookie_id)

    c = BookieClient(resolve, request_timeout=10.0, max_in_flight=3)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def emulator(zk: ZkClient) -> AsyncIterator[BookieEmulator]:
    emu = BookieEmulator(zk, ledgers_root=ROOT)
    await emu.start()
    try:
        yield emu
    finally:
        await emu.stop()


# --- seed files --------------------------------------------------------------------------


def test_seed_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "b.seed"
    ledgers = [(1, [(0, 2), (3, 5)]), (7, [(0, 10)]), (9, [])]
    assert write_seed_file(path, ledgers) == 3
    assert list(read_seed_file(path)) == ledgers
    emu = BookieEmulator(None)
    assert emu.load_seed_file(path) == 3
    assert emu.ledger_ids() == [1, 7, 9]
    assert list(emu.availability(1).entries()) == [0, 1, 3, 4]  # type: ignore[union-attr]
    assert list(emu.availability(7).entries()) == list(range(10))  # type: ignore[union-attr]
    assert list(emu.availability(9).entries()) == []  # type: ignore[union-attr]
    assert emu.entry_body(7, 9) is not None and emu.entry_body(1, 2) is None


def test_seed_file_with_a_body_factory_gives_its_payloads(tmp_path: Path) -> None:
    """The re-replication bench seeds 1 KiB payloads; the digest stays verifiable."""
    path = tmp_path / "b.seed"
    write_seed_file(path, [(4, [(0, 3)])])
    emu = BookieEmulator(None)
    assert emu.load_seed_file(path, make_body_factory(1024)) == 1
    body = emu.entry_body(4, 2)
    assert body is not None
    entry = verify_entry_body(body, DigestType.CRC32C)
    assert (entry.ledger_id, entry.entry_id, len(entry.payload)) == (4, 2, 1024)


def test_seed_file_bad_input(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.write_bytes(b"not a seed file")
    with pytest.raises(SeedFileError, match="not a bookie emulator seed file"):
        list(read_seed_file(foreign))
    truncated = tmp_path / "truncated"
    write_seed_file(truncated, [(1, [(0, 2), (3, 5)])])
    truncated.write_bytes(truncated.read_bytes()[:-1])
    with pytest.raises(SeedFileError, match="ledger 1 truncated"):
        list(read_seed_file(truncated))
    backwards = tmp_path / "backwards"
    backwards.write_bytes(SEED_MAGIC + struct.pack("<qI", 4, 1) + struct.pack("<qq", 5, 5))
    with pytest.raises(SeedFileError, match=r"ledger 4: bad entry run \[5, 5\)"):
        list(read_seed_file(backwards))
    with pytest.raises(ValueError, match=r"ledger 2: bad entry run \[-1, 3\)"):
        write_seed_file(tmp_path / "never", [(2, [(-1, 3)])])


# --- counters ------------------------------------------------------------------------------


async def test_stats_count_list_requests_per_ledger(
    emulator: BookieEmulator, client: BookieClient
) -> None:
    emulator.put_ledger(1, range(3))
    emulator.put_ledger(2, [0, 2])
    bookie = emulator.bookie_id
    for ledger_id in (1, 1, 2):
        assert isinstance(await client.get_list_of_entries(bookie, ledger_id), Ok)
    missing = await client.get_list_of_entries(bookie, 3)
    assert isinstance(missing, ErrorStatus) and missing.status is Status.ENOLEDGER
    stats = emulator.stats()
    assert stats == {
        "bookie_id": bookie,
        "ledgers": 2,
        # The client's first list request goes with a bookie-info request beside it
        # (how it tells "cannot list" from "stalled").
        "received": {"get_bookie_info": 1, "get_list_of_entries_of_ledger": 4},
        "answered": {"get_bookie_info": 1, "get_list_of_entries_of_ledger": 4},
        "in_flight": 0,
        "max_in_flight": 1,
        "connections_accepted": 1,
        "list_requests": 4,
        "ledgers_listed": 3,
        "lists_per_ledger": {"1": 2, "2": 1},
        "adds": 0,
        "recovery_adds": 0,
        "recovery_adds_repeated": 0,
    }
    assert json.loads(json.dumps(stats)) == stats
    emulator.reset_stats()
    after = emulator.stats()
    assert after["received"] == {} and after["list_requests"] == 0
    assert after["lists_per_ledger"] == {} and after["max_in_flight"] == 0


async def test_in_flight_with_latency_reaches_the_client_cap(
    emulator: BookieEmulator, client: BookieClient
) -> None:
    """With latency, answers wait, so the count in flight shows the client's cap (3)."""
    for ledger_id in range(8):
        emulator.put_ledger(ledger_id, range(2))
    emulator.set_latency(0.05)
    outs = await asyncio.gather(
        *(client.get_list_of_entries(emulator.bookie_id, i) for i in range(8))
    )
    assert all(isinstance(o, Ok) for o in outs)
    stats = emulator.stats()
    assert stats["max_in_flight"] == 3
    assert stats["lists_per_ledger"] == {"1": 8}


# --- a bookie process: seed at start, counters on signals and at the end ------------------------


async def test_run_emulator_seeds_and_reports_its_counters(
    zk: ZkClient,
    zk_hosts: str,
    client: BookieClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Signal handlers run on the loop with nothing to await, so each write is observed.
    written: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    write = BookieEmulator.write_stats

    def observed(self: BookieEmulator, path: str | Path) -> None:
        write(self, path)
        written.put_nowait(json.loads(Path(path).read_text()))

    monkeypatch.setattr(BookieEmulator, "write_stats", observed)
    seed, stats = tmp_path / "b.seed", tmp_path / "b.stats"
    write_seed_file(seed, [(5, [(0, 4)]), (6, [(1, 2)])])
    port = free_port()
    bookie = f"127.0.0.1:{port}"
    task = asyncio.create_task(
        run_emulator(
            zk_hosts, "127.0.0.1", port, ROOT, "sorted", False, seed=seed, stats=stats, latency_ms=1
        )
    )
    try:
        async with asyncio.timeout(20), contextlib.aclosing(watch_bookies(zk, ROOT)) as sets:
            async for bookies in sets:
                if bookie in bookies.writable:
                    break
        listed = await client.get_list_of_entries(bookie, 5)
        assert isinstance(listed, Ok) and list(listed.value.entries()) == [0, 1, 2, 3]

        os.kill(os.getpid(), signal.SIGUSR1)
        first = await asyncio.wait_for(written.get(), 10)
        assert (first["ledgers"], first["list_requests"]) == (2, 1)
        assert first["lists_per_ledger"] == {"1": 1}
        assert first == json.loads(stats.read_text())

        os.kill(os.getpid(), signal.SIGUSR2)
        reset = await asyncio.wait_for(written.get(), 10)
        assert (reset["list_requests"], reset["received"]) == (0, {})

        listed = await client.get_list_of_entries(bookie, 6)
        assert isinstance(listed, Ok) and list(listed.value.entries()) == [1]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    last = written.get_nowait()
    assert written.empty() and last == json.loads(stats.read_text())
    assert last["received"] == {"get_list_of_entries_of_ledger": 1}
    assert last["lists_per_ledger"] == {"1": 1}
    assert await zk.exists(f"{ROOT}/available/{bookie}") is None
