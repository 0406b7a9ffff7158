"""`bk-auditor demo`: the whole product on an embedded cluster.

A throwaway ZooKeeper; eight emulated bookies speaking the real protocol, in
three racks published in Pulsar's `/bookies` znode; a few thousand ledgers;
one seeded fault per category; a few Pulsar topics, one with a lost ledger, and
a deleted topic's orphan ledger (`build_pulsar_topics`); and two auditor daemons
electing a leader through BookKeeper's own election path, with the Pulsar audit
scheduled (`pulsar.interval`). It prints the leader's first report and its Pulsar audit,
the metrics URLs and the gRPC addresses; then shows the whole AutoRecovery
loop (below); then keeps running until Ctrl-C or until `--duration` seconds
have passed, and tears everything down.

The cluster and its seeded faults (one per category) are described in
`auditor.testing.seeded`; the leader must find exactly `EXPECTED`.

The whole loop comes second, with the replication workers on: a worker
repairs what it can of the seeded faults the moment they are marked, so with
workers running from the start the first report would depend on which came
first, the check or the repair. `worker.enabled` is read when a daemon
starts, so the daemons restart with it (as an operator turning the worker on
would restart them). The silent bookie answers again (a target that never
answers would only slow the copies down with time-outs), the workers settle
the marks the first round left, then bookie 1 stops: the leader's lost-bookie
audit marks its ledgers, both daemons' workers copy them (progress from
`DaemonState.worker`), and the leader's replicas and placement checks run
again. Bookie 1 is in `/rack-0` with bookie 0 only, and every ring of
healthy ledgers holding it spans three racks, so the placement policy sends
each of its copies to bookie 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from auditor.checks.findings import Category, Check, CheckReport
from auditor.checks.runner import ALL_CHECKS
from auditor.cli.check import render_text
from auditor.daemon.config import load_daemon_config
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.etcd import EtcdStore
from auditor.logs import configure_logging
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.metadata.walk import LedgerWalker
from auditor.store import MetadataStore, StoreKind
from auditor.testing.bookie import BookieEmulator
from auditor.testing.etcdserver import EtcdServer
from auditor.testing.seeded import (
    EXPECTED,
    HEALTHY,
    PULSAR_EXPECTED,
    PULSAR_TOPICS,
    RACKS,
    ROOT,
    build_pulsar_topics,
    build_seeded_cluster,
)
from auditor.testing.zkserver import ZooKeeperServer, free_port
from auditor.worker.repair import ranges_text
from auditor.zk import ZkClient

#: The bookie the whole loop stops (see the module's docstring).
STOPPED = 1
#: The bookie seeded as registered but silent, which answers again for the whole loop.
SILENT = 7
#: Seconds the workers have to settle the first round's marks, and to copy the stopped
#: bookie's ledgers; past them the demo says what is left and exits 1.
SETTLE_WITHIN = 60.0
REPAIR_WITHIN = 300.0
#: Seconds between two progress lines while the workers copy.
PROGRESS_EVERY = 2.0
#: The checks the whole loop runs again once the copies are done.
AFTER_CHECKS = (Check.REPLICAS, Check.PLACEMENT)


def _daemon_config(address: str, name: str, api: int, metrics: int, worker: bool) -> Any:
    """A daemon's configuration; `address` is a ZooKeeper connect string or a
    `metadataServiceUri` (the etcd demo's `metadata-store:etcd:...`)."""
    key = "daemon.metadata_service_uri" if address.startswith("metadata-store:") else "daemon.zk"
    return load_daemon_config(
        None,
        [
            f"{key}={address}",
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
            # The Pulsar audit (off by default) after the first round, with its rollups.
            "pulsar.interval=3600",
            "checks.retry_delay=1",
            "checks.retry_attempts=1",
            f"worker.enabled={'true' if worker else 'false'}",
            f"worker.lock_holder={name}",
            # A failed attempt holds its lock 0.1 s doubling to 3.2 s (upstream's rule
            # with a shorter cap than its 300 s), so a hiccup does not stall the demo.
            "lockReleaseOfFailedLedgerGracePeriod=3200",
        ],
        env={},
    )


def _first_round_done(d: Daemon) -> bool:
    return d.state.is_leader and all(
        d.state.checks[c].last_finished is not None for c in (*ALL_CHECKS, Check.PULSAR)
    )


def _audited(d: Daemon) -> bool:
    return d.state.is_leader and d.state.checks[Check.BOOKIES].last_finished is not None


def _start_daemons(configs: list[Any]) -> tuple[list[Daemon], list[asyncio.Task[int]]]:
    daemons: list[Daemon] = []
    runs: list[asyncio.Task[int]] = []
    for cfg in configs:
        d = Daemon(cfg, metrics=Metrics())

        async def api_factory(control: Daemon, cfg: Any = cfg) -> Any:
            from auditor.api.server import start_api_server

            return await start_api_server(control, host=cfg.api.host, port=cfg.api.port, token=None)

        daemons.append(d)
        runs.append(asyncio.ensure_future(d.run(api_factory=api_factory, signals=False)))
    return daemons, runs


async def run_sandbox(duration: float | None, kind: StoreKind = StoreKind.ZOOKEEPER) -> int:
    configure_logging("json", level="ERROR")
    store_name = "etcd" if kind is StoreKind.ETCD else "ZooKeeper"
    print(
        f"Starting a throwaway {store_name}, 8 emulated bookies and 2 auditor daemons ...",
        flush=True,
    )
    sys.stdout.flush()
    server: EtcdServer | ZooKeeperServer
    if kind is StoreKind.ETCD:
        server = EtcdServer()
        # Pulsar's driver on etcd: the same tree, Pulsar's leader key for the election.
        address = f"metadata-store:etcd:{server.endpoint}"
        where = f"etcd {server.endpoint}"
    else:
        server = ZooKeeperServer()
        address = server.hosts
        where = f"ZooKeeper {server.hosts}"
    await asyncio.to_thread(server.start)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    try:
        client: MetadataStore = (
            EtcdStore([server.endpoint], timeout=30)
            if isinstance(server, EtcdServer)
            else ZkClient(server.hosts, timeout=30)
        )
        async with client as store:
            bookies = [BookieEmulator(store, ledgers_root=ROOT) for _ in range(8)]
            for b in bookies:
                await b.start()
            await build_seeded_cluster(store, bookies)
            await build_pulsar_topics(store, bookies)
            await bookies[6].crash()
            bookies[SILENT].pause()
            print(
                f"Cluster: {HEALTHY} healthy ledgers and 8 seeded faults on "
                f"{where}{ROOT}; {len(PULSAR_TOPICS)} Pulsar topics "
                "(one with a lost ledger) and a deleted topic's orphan ledger",
                flush=True,
            )

            def configs(worker: bool) -> list[Any]:
                return [
                    _daemon_config(address, name, free_port(), free_port(), worker)
                    for name in ("auditor-a", "auditor-b")
                ]

            daemons, runs = _start_daemons(configs(False))
            try:
                leader = await _wait_first_round(daemons, stop)
                if leader is not None:
                    code = _print_round(leader, daemons)
                    loop_code = await _whole_loop(store, bookies, daemons, runs, configs, stop)
                    code = code or loop_code
                if not stop.is_set():
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
                bookies[SILENT].resume()
                for b in bookies:
                    if b.running:
                        await b.stop()
    finally:
        await asyncio.to_thread(server.destroy)
    print(f"Stopped: daemons, bookies and {store_name} are gone.", flush=True)
    return code


async def _wait_first_round(
    daemons: list[Daemon],
    stop: asyncio.Event,
    runs: list[asyncio.Task[int]] | None = None,
    done: Callable[[Daemon], bool] = _first_round_done,
) -> Daemon | None:
    """The first daemon for which `done` holds; None once stopped or every daemon ended."""
    while not stop.is_set():
        if runs and all(r.done() for r in runs):
            print("  the daemons ended")
            return None
        for d in daemons:
            if done(d):
                return d
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    return None


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleeps `seconds` unless stopped first; True if stopped."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


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
    ok = _print_pulsar(leader) and ok
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


def _print_pulsar(leader: Daemon) -> bool:
    """Prints the leader's Pulsar audit; True if it found exactly `PULSAR_EXPECTED`."""
    from auditor.cli import pulsar_audit

    cs = leader.state.checks[Check.PULSAR]
    audit = leader.state.pulsar
    print()
    if cs.last_report is None or audit is None:
        print(f"check pulsar: {cs.last_error}")
        return False
    doc = pulsar_audit.document(cs.last_report, audit, replicas=True, top=10)
    pulsar_audit.render_text(doc, sys.stdout)
    found = {
        str(c): {v.ledger_id for v in cs.last_report.violations if v.category == c}
        for c in (Category.MISSING, Category.ORPHAN, Category.DANGLING_CURSOR)
    }
    if found != PULSAR_EXPECTED:
        print(f"  (expected {PULSAR_EXPECTED})")
        return False
    return True


# --- the whole loop ------------------------------------------------------------------------


def _total(daemons: list[Daemon], field: str) -> int:
    return sum(int(getattr(d.state.worker, field)) for d in daemons)


def _unrecoverable(daemons: list[Daemon]) -> dict[int, tuple[tuple[int, int], ...]]:
    return {lid: u.ranges for d in daemons for lid, u in d.state.worker.unrecoverable.items()}


def _busy(daemons: list[Daemon]) -> bool:
    """Whether a worker is working on a ledger (a lock held for a back-off is not work)."""
    return any(h.step != "deferred" for d in daemons for h in d.state.worker.in_hand.values())


async def _marked(urm: UnderreplicationManager) -> set[int]:
    return {m.ledger_id async for m in urm.list_underreplicated()}


async def _settled(urm: UnderreplicationManager, daemons: list[Daemon]) -> bool:
    """No worker busy and every mark left is one the workers found unrecoverable."""
    if _busy(daemons):
        return False
    left = _unrecoverable(daemons)
    if await urm.count_underreplicated() > len(left):
        return False
    return await _marked(urm) <= set(left)


async def _naming(store: MetadataStore, leader: Daemon, bookie_id: str) -> set[int]:
    """The ledgers whose metadata names `bookie_id` in some segment."""
    assert leader.manager is not None
    out: set[int] = set()
    async for rec in LedgerWalker(store, ROOT, leader.manager).ledgers():
        md = rec.metadata
        if md is not None and any(bookie_id in s.bookies for s in md.segments):
            out.add(rec.ledger_id)
    return out


async def _run_check(leader: Daemon, check: Check, stop: asyncio.Event) -> CheckReport | None:
    """Triggers one of the leader's checks and returns its report once it has run."""
    state = leader.state.checks[check]
    before = state.last_finished
    await leader.trigger_check(check)
    while state.last_finished == before:
        if await _wait(stop, 0.2):
            return None
    return state.last_report


def _unrecoverable_text(unrecoverable: dict[int, tuple[tuple[int, int], ...]]) -> str:
    return "; ".join(
        f"{lid} (entries {ranges_text(r)} have no copy anywhere; kept marked for an operator)"
        for lid, r in sorted(unrecoverable.items())
    )


async def _whole_loop(
    store: MetadataStore,
    bookies: list[BookieEmulator],
    daemons: list[Daemon],
    runs: list[asyncio.Task[int]],
    configs: Callable[[bool], list[Any]],
    stop: asyncio.Event,
) -> int:
    """A bookie stops, its ledgers are marked, copied and checked; 0 if all came back."""
    urm = UnderreplicationManager(store, ROOT)
    print(
        "\nThe whole loop. The daemons restart with their replication workers on "
        "(worker.enabled=true) ...",
        flush=True,
    )
    for d in daemons:
        d.stop()
    await asyncio.gather(*runs, return_exceptions=True)
    bookies[SILENT].resume()
    started, starting = _start_daemons(configs(True))
    daemons[:], runs[:] = started, starting
    print(
        f"  bookie {bookies[SILENT].bookie_id} answers again; {bookies[6].bookie_id} stays lost",
        flush=True,
    )
    # A new leader resumes the old one's rhythm of the periodic checks (their ctimes are
    # in ZooKeeper: not due for an hour); its start audit of lost bookies runs at once.
    leader = await _wait_first_round(daemons, stop, runs, _audited)
    if leader is None:
        return 0 if stop.is_set() else 1
    deadline = time.monotonic() + SETTLE_WITHIN
    while not await _settled(urm, daemons):
        if time.monotonic() > deadline:
            print(f"  the workers did not settle the first round's marks in {SETTLE_WITHIN:g} s")
            return 1
        if await _wait(stop, 0.5):
            return 0
    unrecoverable = _unrecoverable(daemons)
    print(
        f"  {leader.state.identity} leads; the workers took the ledgers the first "
        f"rounds marked: {_total(daemons, 'ledgers_replicated')} re-replicated, "
        f"{_total(daemons, 'ledgers_found_healthy')} found whole"
        + (f", unrecoverable: {_unrecoverable_text(unrecoverable)}" if unrecoverable else ""),
        flush=True,
    )

    lost = bookies[STOPPED]
    named = await _naming(store, leader, lost.bookie_id)
    replicated0 = _total(daemons, "ledgers_replicated")
    entries0 = _total(daemons, "entries_written")
    bytes0 = _total(daemons, "bytes_written")
    per_daemon0 = [d.state.worker.ledgers_replicated for d in daemons]
    audit = leader.state.checks[Check.BOOKIES]
    audited = audit.last_finished
    print(
        f"\nBookie {lost.bookie_id} ({RACKS[STOPPED]}) stops; {len(named)} ledgers name it.",
        flush=True,
    )
    t0 = time.monotonic()
    await lost.stop()
    while audit.last_finished == audited or audit.last_report is None:
        if await _wait(stop, 0.2):
            return 0
        if time.monotonic() - t0 > REPAIR_WITHIN:
            print("  the leader's lost-bookie audit did not run")
            return 1
    report = audit.last_report
    marked = set(report.marked_underreplicated)
    print(
        f"  {time.monotonic() - t0:5.1f} s  the leader's lost-bookie audit found "
        f"{report.counts().get('ledgers_on_lost_bookies', 0)} ledgers on lost bookies "
        f"and marked {len(marked)} under-replicated",
        flush=True,
    )
    last_line = 0.0
    while True:
        done = await _settled(urm, daemons)
        now = time.monotonic()
        if done or now - last_line >= PROGRESS_EVERY:
            last_line = now
            copied = _total(daemons, "ledgers_replicated") - replicated0
            entries = _total(daemons, "entries_written") - entries0
            kb = (_total(daemons, "bytes_written") - bytes0) / 1e3
            each = ", ".join(
                f"{d.state.identity.split(':')[0]} {d.state.worker.ledgers_replicated - n}"
                for d, n in zip(daemons, per_daemon0, strict=True)
            )
            left = await urm.count_underreplicated()
            print(
                f"  {now - t0:5.1f} s  {copied:>5} ledgers re-replicated ({each}), "
                f"{entries} entries ({kb:.0f} kB) copied; {left} marked",
                flush=True,
            )
        if done:
            break
        if now - t0 > REPAIR_WITHIN:
            print(f"  not done within {REPAIR_WITHIN:g} s")
            break
        if await _wait(stop, 0.25):
            return 0

    named_after = await _naming(store, leader, lost.bookie_id)
    marked_after = await _marked(urm)
    reports: dict[Check, CheckReport] = {}
    for check in AFTER_CHECKS:
        got = await _run_check(leader, check, stop)
        if got is None:
            return 0
        reports[check] = got
    return _print_before_after(
        leader, lost.bookie_id, named, marked, named_after, marked_after, reports, daemons
    )


def _print_before_after(
    leader: Daemon,
    bookie_id: str,
    named: set[int],
    marked: set[int],
    named_after: set[int],
    marked_after: set[int],
    reports: dict[Check, CheckReport],
    daemons: list[Daemon],
) -> int:
    """The before/after table and the verdict; 0 if the stopped bookie's ledgers are whole."""
    print("\nBefore and after (checks before: the first round above):")
    print(f"  {'':<46}{'before':>8}{'after':>8}")
    print(f"  {'ledgers naming ' + bookie_id:<46}{len(named):>8}{len(named_after):>8}")
    print(
        f"  {'of them marked under-replicated':<46}{len(marked):>8}{len(marked_after & named):>8}"
    )
    print(f"  {'marked under-replicated in all':<46}{'':>8}{len(marked_after):>8}")
    in_named: list[int] = []
    for check, after in reports.items():
        before_counts = EXPECTED[str(check)]
        for category, n in after.counts().items():
            label = f"{check} {category}"
            print(f"  {label:<46}{before_counts.get(category, 0):>8}{n:>8}")
        for ids in after.samples().values():
            in_named += [lid for lid in ids if lid in named]
        if after.ledgers_skipped:
            skipped = ", ".join(f"{k} {v}" for k, v in sorted(after.ledgers_skipped.items()))
            print(f"  ({check} after: {after.ledgers_checked} ledgers checked; skipped: {skipped})")
    unrecoverable = _unrecoverable(daemons)
    if unrecoverable:
        print(f"  still marked: {_unrecoverable_text(unrecoverable)}")
    ok = not named_after and not (marked_after & named) and not in_named
    print(
        f"\nThe stopped bookie's {len(named)} ledgers are whole again: none names it, none is "
        "marked, and the replicas and placement checks find nothing in them."
        if ok
        else f"\nSome ledgers of the stopped bookie are not repaired: still naming it "
        f"{sorted(named_after)[:10]}, marked {sorted(marked_after & named)[:10]}, "
        f"with violations {sorted(set(in_named))[:10]}."
    )
    sys.stdout.flush()
    return 0 if ok else 1


__all__ = ["EXPECTED", "Check", "run_sandbox"]
