"""One emulated bookie in a process of its own, seeded from a file, counting what it is sent.

    python -m bench.bookie_host --zk HOST:PORT --port PORT --seed FILE --stats FILE
        [--latency-ms MS] [--payload-size BYTES] [--ledgers-root PATH]

It is `bk-auditor bookie-emulator` plus the benchmark's options (`--seed`,
`--stats`, `--latency-ms`, `--payload-size`, all of them `run_emulator` arguments). A bookie
per process keeps the bookies' CPU and memory out of the measured process,
and lets six of them use more than one core. SIGUSR1 writes the counters to
the stats file, SIGUSR2 resets them and writes them, SIGTERM stops the
bookie (unregistering it) after a last write.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from auditor.testing.bookie import run_emulator


async def serve(args: argparse.Namespace) -> None:
    task = asyncio.ensure_future(
        run_emulator(
            args.zk,
            "127.0.0.1",
            args.port,
            args.ledgers_root,
            "sorted",
            False,
            seed=args.seed,
            stats=args.stats,
            latency_ms=args.latency_ms,
            payload_size=args.payload_size,
        )
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bookie_host")
    parser.add_argument("--zk", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ledgers-root", default="/ledgers")
    parser.add_argument("--seed", default=None)
    parser.add_argument("--stats", default=None)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--payload-size", type=int, default=None)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
