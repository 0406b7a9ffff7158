"""`bk-auditor demo` and `bk-auditor bookie-emulator`: throwaway parts for demos and tests.

`demo` runs the whole product on an embedded cluster (`cli/sandbox.py`);
`bookie-emulator` runs one emulated bookie (`testing/bookie/`) until a signal stops it.
Both import what they run only when they run: it brings in servers and the daemon,
which no other command needs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import Any

from auditor.cli.argtypes import MAX_DURATION, seconds
from auditor.cli.options import bind
from auditor.errors import ConfigError


def add_parsers(sub: Any) -> None:
    emu = sub.add_parser("bookie-emulator", help="run one emulated bookie (tests, demos)")
    emu.add_argument("--zk", required=True, metavar="HOST:PORT")
    emu.add_argument("--port", type=int, required=True)
    emu.add_argument("--host", default="127.0.0.1")
    emu.add_argument("--ledgers-root", default="/ledgers")
    emu.add_argument("--storage", choices=["sorted", "interleaved", "dbledger"], default="sorted")
    emu.add_argument("--readonly", action="store_true")
    bind(emu, emulator_command)
    demo = sub.add_parser("demo", help="the whole product on an embedded cluster")
    demo.add_argument(
        "--duration",
        type=seconds(MAX_DURATION),
        default=None,
        help="stop after this many seconds",
    )
    demo.add_argument(
        "--store",
        choices=("zookeeper", "etcd"),
        default="zookeeper",
        help="the metadata store: ZooKeeper (BookKeeper's election), or etcd with Pulsar's "
        "driver (metadata-store:etcd:, Pulsar's leader key)",
    )
    bind(demo, demo_command)


async def emulator_command(args: argparse.Namespace) -> int:
    from auditor.testing.bookie import run_emulator

    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be 0..65535, got {args.port}")
    task = asyncio.ensure_future(
        run_emulator(args.zk, args.host, args.port, args.ledgers_root, args.storage, args.readonly)
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    # Stopping by signal is the normal end: the emulator unregisters on the way out.
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return 0


async def demo_command(args: argparse.Namespace) -> int:
    from auditor.cli.sandbox import run_sandbox
    from auditor.store import StoreKind

    if args.duration is not None and args.duration < 0:
        raise ConfigError(f"--duration must be >= 0, got {args.duration:g}")
    return await run_sandbox(args.duration, StoreKind(args.store))
