"""Benchmarks need bookies whose work does not run on the client's CPU and event loop, and
still need to know what the client sent them.

An emulated bookie in a process of its own (benchmarks, `bk-auditor bookie-emulator`).

Seeded from a file rather than over the wire, and reporting its counters to
whoever started it through a file: written on SIGUSR1 (SIGUSR2 resets them
first) and when it stops, so a benchmark can count what a client sent.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from auditor.testing.bookie.emulator import BookieEmulator
from auditor.testing.bookie.storage import make_body_factory
from auditor.zk import ZkClient

__all__ = ["run_emulator"]


async def run_emulator(
    zk_hosts: str,
    host: str,
    port: int,
    ledgers_root: str,
    storage: str,
    readonly: bool,
    *,
    seed: str | Path | None = None,
    stats: str | Path | None = None,
    latency_ms: float = 0.0,
    payload_size: int | None = None,
) -> None:
    """Runs one emulated bookie registered in ZooKeeper until cancelled.

    `seed` is a `write_seed_file` file loaded before the bookie registers (so
    once it is registered it holds everything). With `stats`, the counters
    are written there on SIGUSR1, reset and then written on SIGUSR2, and
    written when the bookie stops. `latency_ms` delays every answer. `payload_size`
    gives seeded entries payloads of that many bytes (default: 16, `default_body`).
    """
    zk = ZkClient(zk_hosts)
    await zk.start()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    try:
        emulator = BookieEmulator(
            zk, host=host, port=port, ledgers_root=ledgers_root, storage=storage, readonly=readonly
        )
        if seed is not None:
            factory = make_body_factory(payload_size) if payload_size is not None else None
            emulator.load_seed_file(seed, factory)
        if latency_ms > 0:
            emulator.set_latency(latency_ms / 1000.0)
        if stats is not None:
            out = stats

            def reset_and_write() -> None:
                emulator.reset_stats()
                emulator.write_stats(out)

            loop.add_signal_handler(signal.SIGUSR1, emulator.write_stats, out)
            loop.add_signal_handler(signal.SIGUSR2, reset_and_write)
            handled += [signal.SIGUSR1, signal.SIGUSR2]
        await emulator.start()
        try:
            await asyncio.Event().wait()
        finally:
            if stats is not None:
                emulator.write_stats(stats)
            await emulator.stop()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        await zk.close()
