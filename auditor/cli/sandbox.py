"""`bk-auditor demo`: the whole product on an embedded cluster.

A throwaway ZooKeeper; eight emulated bookies speaking the real protocol, in
three racks published in Pulsar's `/bookies` znode; a few thousand ledgers;
one seeded fault per category; and two auditor daemons electing a leader
through BookKeeper's own election path. It prints the leader's first report,
the metrics URLs and the gRPC addresses, then keeps running until Ctrl-C or
until `--duration` seconds have passed, and tears everything down.

The cluster and its seeded faults (one per category) are described in
`auditor.testing.seeded`; the leader must find exactly `EXPECTED`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import Any

from auditor.checks.findings import Check
from auditor.checks.runner import ALL_CHECKS
from auditor.cli.check import render_text
from auditor.daemon.config import load_daemon_config
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.logs import configure_logging
from auditor.testing.bookie import BookieEmulator
from auditor.testing.seeded import EXPECTED, HEALTHY, ROOT, build_seeded_cluster
from auditor.testing.zkserver import ZooKeeperServer, free_port
from auditor.zk import ZkClient


def _daemon_config(hosts: str, name: str, api: int, metrics: int) -> Any:
    return load_daemon_config(
        None,
        [
            f"daemon.zk={hosts}",
            f"daemon.identity={name}:{api}",
            "daemon.jitter=0",
            "daemon.zk_session_timeout=6",
            "api.host=127.0.0.1",
            f"api.port={api}",
            "metrics.host=127.0.0.1",
            f"metrics.port={metrics}",
            "auditorPeriodicBookieCheckInterval=3600",
            "auditorPeriodicCheckInterval=3600",
            "auditorPeriodicPlacementPolicyCheckInterval=3600",
            "auditorReplicasCheckInterval=3600",
            "underreplicatedLedgerRecoveryGracePeriod=3600",
            "readEntryTimeout=1",
            "checks.retry_delay=1",
            "checks.retry_attempts=1",
        ],
        env={},
    )


def _first_round_done(d: Daemon) -> bool:
    return d.state.is_leader and all(
        d.state.checks[c].last_finished is not None for c in ALL_CHECKS
    )


async def run_sandbox(duration: float | None) -> int:
    configure_logging("json", level="ERROR")
    print(
        "Starting a throwaway ZooKeeper, 8 emulated bookies and 2 auditor daemons ...", flush=True
    )
    sys.stdout.flush()
    server = ZooKeeperServer()
    await asyncio.to_thread(server.start)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    try:
        async with ZkClient(server.hosts, timeout=30) as zk:
            bookies = [BookieEmulator(zk, ledgers_root=ROOT) for _ in range(8)]
            for b in bookies:
                await b.start()
            await build_seeded_cluster(zk, bookies)
            await bookies[6].crash()
            bookies[7].pause()
            print(
                f"Cluster: {HEALTHY} healthy ledgers and 8 seeded faults on "
                f"ZooKeeper {server.hosts}{ROOT}",
                flush=True,
            )
            daemons: list[Daemon] = []
            runs: list[asyncio.Task[int]] = []
            for name in ("auditor-a", "auditor-b"):
                api, metrics_port = free_port(), free_port()
                cfg = _daemon_config(server.hosts, name, api, metrics_port)
                d = Daemon(cfg, metrics=Metrics())

                async def api_factory(control: Daemon, cfg: Any = cfg) -> Any:
                    from auditor.api.server import start_api_server

                    return await start_api_server(
                        control, host=cfg.api.host, port=cfg.api.port, token=None
                    )

                daemons.append(d)
                runs.append(asyncio.ensure_future(d.run(api_factory=api_factory, signals=False)))
            try:
                leader = await _wait_first_round(daemons, stop)
                if leader is not None:
                    code = _print_round(leader, daemons)
                    if duration is not None:
                        print(
                            f"\nRunning for {duration:g} s (Ctrl-C stops earlier) ...", flush=True
                        )
                    else:
                        print("\nRunning until Ctrl-C ...", flush=True)
                    sys.stdout.flush()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), duration)
            finally:
                for d in daemons:
                    d.stop()
                await asyncio.gather(*runs, return_exceptions=True)
                bookies[7].resume()
                for b in bookies:
                    if b.running:
                        await b.stop()
    finally:
        await asyncio.to_thread(server.destroy)
    print("Stopped: daemons, bookies and ZooKeeper are gone.", flush=True)
    return code


async def _wait_first_round(daemons: list[Daemon], stop: asyncio.Event) -> Daemon | None:
    while not stop.is_set():
        for d in daemons:
            if _first_round_done(d):
                return d
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    return None


def _print_round(leader: Daemon, daemons: list[Daemon]) -> int:
    """Prints the leader's reports; returns 0 if they match the seeded faults, else 1."""
    print(f"\nThe auditor is {leader.state.identity}; its first round of checks:\n", flush=True)
    ok = True
    for check in ALL_CHECKS:
        report = leader.state.checks[check].last_report
        if report is None:
            print(f"check {check}: {leader.state.checks[check].last_error}")
            ok = False
            continue
        render_text(report, sys.stdout)
        counts = report.counts()
        expected = EXPECTED[str(check)]
        if any(counts.get(k, 0) != v for k, v in expected.items()):
            ok = False
            print(f"  (expected {expected})")
    print("\nEndpoints:")
    for d in daemons:
        role = "leader" if d is leader else "follower"
        api = d.api.port if d.api is not None else "-"
        metrics = d.metrics.http_port if d.metrics is not None else "-"
        print(
            f"  {d.state.identity:<22} {role:<9} gRPC 127.0.0.1:{api}   "
            f"metrics http://127.0.0.1:{metrics}/metrics"
        )
    print(
        "\nEvery seeded fault was found as expected."
        if ok
        else "\nSome counts differ from the seeded faults (see above)."
    )
    sys.stdout.flush()
    return 0 if ok else 1


__all__ = ["EXPECTED", "Check", "run_sandbox"]
