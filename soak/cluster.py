"""The soak's cluster: a real ZooKeeper, six in-process bookies, three daemon processes.

Bookies live on the driver's event loop so that faults are method calls; the
daemons are real `bk-auditor run` processes, each behind a cuttable TCP proxy
to ZooKeeper (a partition of one daemon), each writing JSON logs to a file of
its own per incarnation (the analysis reads them at the end).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from auditor.daemon.election import election_path
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.serde import decode_ledger_metadata, encode_ledger_metadata
from auditor.metadata.underreplication import UnderreplicationManager, ur_ledger_path
from auditor.store import BadVersionError
from auditor.testing.bookie import BookieEmulator
from auditor.testing.cluster import ClusterWriter, make_metadata
from auditor.testing.netproxy import TcpProxy
from auditor.testing.zkserver import ZooKeeperServer, free_port
from auditor.zk import ZkClient

ROOT = "/ledgers"
ENTRIES = 10
SESSION = 4.0
#: Longer than the longest host restart (30 s) with room to spare: a bookie back within
#: it must cause nothing (issue 21's restart rule); a crash lasts well past it.
LOST_BOOKIE_DELAY = 40
#: Bookie i sits in rack RACKS[i]; every ensemble takes one bookie of each rack.
RACKS = ["/rack-0", "/rack-0", "/rack-1", "/rack-1", "/rack-2", "/rack-2"]

#: Checks run often so that a fault of a minute meets every check at least once.
DAEMON_SETTINGS = [
    "auditorPeriodicBookieCheckInterval=30",
    "auditorPeriodicCheckInterval=60",
    "auditorPeriodicPlacementPolicyCheckInterval=30",
    "auditorReplicasCheckInterval=30",
    f"lostBookieRecoveryDelay={LOST_BOOKIE_DELAY}",
    "readEntryTimeout=1",
    "checks.retry_delay=1",
    "daemon.jitter=0",
    # The soak's accounting reads every violation line: none is summarised away.
    "checks.violation_log_limit=-1",
]
#: Which replication worker repairs what the faults break (`SOAK_WORKER`).
WORKER_MODES = ("real", "simulated")
WORKER_SETTINGS = {
    # Every daemon runs the product's worker (as every Java AutoRecovery process does).
    # Its back-offs are shortened in the proportion of the soak's faults (a minute, not
    # hours): a ledger whose bookie did not answer is taken again within seconds of the
    # bookie's return, so the end of the run finds no mark that a worker would still
    # clear; `worker.unrecoverable_retry` only matters if a ledger is ever found with no
    # readable copy, which two bookie faults at once on E=W=3 can never cause.
    "real": [
        "worker.enabled=true",
        "lockReleaseOfFailedLedgerGracePeriod=5000",
        "rwRereplicateBackoffMs=1000",
        "worker.unrecoverable_retry=30",
    ],
    # The driver's stand-in (`soak/worker.py`), kept for comparison: the daemons' own
    # worker is off, it would race the stand-in.
    "simulated": ["worker.enabled=false"],
}


def daemon_settings(worker: str) -> list[str]:
    """Every daemon's `--set` settings for a run whose repairs are `worker`'s."""
    return [*DAEMON_SETTINGS, *WORKER_SETTINGS[worker]]


@dataclass
class Incarnation:
    """One process of a daemon: its log file and the samples of its RSS and fds."""

    pid: int
    log: Path
    started: float
    ended: float | None = None
    killed: bool = False
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, rss kB, fds)


@dataclass
class Daemon:
    name: str
    api_port: int
    metrics_port: int
    proxy: TcpProxy
    #: The HTTP views' port (`idle_http` holds idle connections against it).
    http_port: int = 0
    proc: asyncio.subprocess.Process | None = None
    incarnations: list[Incarnation] = field(default_factory=list)

    @property
    def identity(self) -> str:
        return f"{self.name}:{self.api_port}"


class SoakCluster:
    def __init__(self, workdir: Path, ledgers: int, worker: str = "real") -> None:
        if worker not in WORKER_MODES:
            raise ValueError(f"worker: {worker!r} is not one of {', '.join(WORKER_MODES)}")
        self.workdir = workdir
        self.n_ledgers = ledgers
        #: "real": the daemons' workers repair (they change ensembles: `refresh` reads
        #: them back); "simulated": the driver's stand-in does, ensembles never change.
        self.worker = worker
        self.zk_server = ZooKeeperServer(workdir / "zk")
        self.zk: ZkClient | None = None
        self.bookies: list[BookieEmulator] = []
        self.daemons: list[Daemon] = []
        #: Current metadata of every live ledger, and every bookie each ever had.
        self.ledgers: dict[int, LedgerMetadata] = {}
        self.ever_bookies: dict[int, set[str]] = {}
        self.deleted: dict[int, float] = {}
        self.next_ledger = 1
        self.writer: ClusterWriter | None = None

    @property
    def client(self) -> ZkClient:
        assert self.zk is not None
        return self.zk

    @property
    def ur_base(self) -> str:
        return UnderreplicationManager(self.client, ROOT).base

    def host_bookie(self, d: Daemon) -> BookieEmulator:
        """The bookie on the same host as daemon `d` (as when the daemon runs beside each
        bookie under systemd): daemon i sits with bookie 2i, one host per rack."""
        return self.bookies[2 * self.daemons.index(d)]

    # --- set-up ---------------------------------------------------------------------

    async def start(self, daemons: int = 3, bookies: int = 6) -> None:
        await asyncio.to_thread(self.zk_server.start)
        self.zk = ZkClient(self.zk_server.hosts, session_timeout=30.0, timeout=30.0)
        await self.zk.start()
        self.writer = ClusterWriter(self.zk, ROOT)
        await self.writer.init_cluster()
        self.bookies = [BookieEmulator(self.zk, ledgers_root=ROOT) for _ in range(bookies)]
        for b in self.bookies:
            await b.start()
        group = {
            b.bookie_id: {"rack": RACKS[i % len(RACKS)], "hostname": b.host}
            for i, b in enumerate(self.bookies)
        }
        await self.zk.create("/bookies", json.dumps({"default": group}).encode())
        for _ in range(self.n_ledgers):
            await self.add_ledger()
        # A cluster that has run a while: votes came and went, so the daemons' votes have
        # sequences above 1 and a foreign `V_1` (`soak.adversarial`) ranks ahead of them.
        votes = election_path(ROOT)
        await self.zk.ensure_path(votes)
        for _ in range(3):
            await self.zk.delete(await self.zk.create(f"{votes}/V_", ephemeral=True, sequence=True))
        for i in range(daemons):
            proxy = TcpProxy("127.0.0.1", self.zk_server.port)
            await proxy.start()
            d = Daemon(f"soak-{i}", free_port(), free_port(), proxy, http_port=free_port())
            self.daemons.append(d)
            await self.launch(d)

    async def stop(self) -> None:
        for d in self.daemons:
            if d.proc is not None and d.proc.returncode is None:
                d.proc.send_signal(signal.SIGTERM)
        for d in self.daemons:
            if d.proc is not None:
                try:
                    await asyncio.wait_for(d.proc.wait(), 20)
                except TimeoutError:
                    d.proc.kill()
                    await d.proc.wait()
                if d.incarnations and d.incarnations[-1].ended is None:
                    d.incarnations[-1].ended = time.time()
            await d.proxy.stop()
        for b in self.bookies:
            b.clear_faults()
            if b.running:
                with contextlib.suppress(Exception):
                    await b.stop()
        if self.zk is not None:
            await self.zk.close()
        await asyncio.to_thread(self.zk_server.stop)

    # --- daemons --------------------------------------------------------------------

    async def launch(self, d: Daemon) -> None:
        args = [
            "run", "--zk", d.proxy.address,
            "--set", f"daemon.identity={d.identity}",
            "--set", f"daemon.zk_session_timeout={SESSION}",
            "--set", "api.host=127.0.0.1", "--set", f"api.port={d.api_port}",
            "--set", "metrics.host=127.0.0.1", "--set", f"metrics.port={d.metrics_port}",
            "--set", f"api.http_port={d.http_port}",
            "--set", "logging.format=json",
        ]  # fmt: skip
        for s in daemon_settings(self.worker):
            args += ["--set", s]
        args += ["--set", f"worker.lock_holder={d.name}"]
        log = self.workdir / f"{d.name}.{len(d.incarnations)}.log"
        with _open_log(log) as f:
            d.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "auditor",
                *args,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=f,
                stdin=asyncio.subprocess.DEVNULL,
            )
        d.incarnations.append(Incarnation(d.proc.pid, log, time.time()))

    async def kill(self, d: Daemon) -> float:
        """SIGKILL: no goodbye, the vote stays until the session expires."""
        assert d.proc is not None
        d.proc.send_signal(signal.SIGKILL)
        t = time.time()
        await d.proc.wait()
        d.incarnations[-1].ended = t
        d.incarnations[-1].killed = True
        return t

    async def leader(self) -> Daemon | None:
        """The daemon whose vote is first (what BookKeeper reads as the auditor)."""
        from auditor.daemon.election import current_auditor

        try:
            ident = await current_auditor(self.client, ROOT)
        except Exception:
            return None
        return next((d for d in self.daemons if d.identity == ident), None)

    def acting_leader(self) -> Daemon | None:
        """The live daemon whose own log last said it was elected (the ZooKeeper vote of a
        killed daemon outlives it by a session timeout, and names its next incarnation)."""
        for d in self.daemons:
            if d.proc is None or d.proc.returncode is not None:
                continue
            text = _read_from(d.incarnations[-1].log, 0)
            won = text.rfind(b'"event": "elected auditor"')
            lost = text.rfind(b'"event": "no longer the auditor"')
            if won > lost:
                return d
        return None

    async def wait_log_event(self, event: str, within: float) -> bool:
        """Waits until any daemon's current log gains a line with `event`."""
        needle = f'"event": "{event}"'.encode()
        logs = [d.incarnations[-1].log for d in self.daemons if d.incarnations]
        offsets = {p: p.stat().st_size for p in logs}
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if any(needle in _read_from(p, at) for p, at in offsets.items()):
                return True
            await asyncio.sleep(0.1)
        return False

    def sample(self) -> None:
        now = time.time()
        for d in self.daemons:
            if d.proc is None or d.proc.returncode is not None:
                continue
            inc = d.incarnations[-1]
            try:
                status = Path(f"/proc/{inc.pid}/status").read_text()
                rss = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmRSS"))
                fds = len(os.listdir(f"/proc/{inc.pid}/fd"))
            except (OSError, StopIteration):
                continue
            inc.samples.append((now, rss, fds))

    # --- ledgers --------------------------------------------------------------------

    def ensemble_for(self, lid: int) -> list[BookieEmulator]:
        """One bookie of each rack, varying with the ledger id."""
        pairs = [(0, 1), (2, 3), (4, 5)]
        return [self.bookies[p[(lid >> i) & 1]] for i, p in enumerate(pairs)]

    async def add_ledger(self) -> int:
        assert self.writer is not None
        lid = self.next_ledger
        self.next_ledger += 1
        ensemble = self.ensemble_for(lid)
        for b in ensemble:
            b.put_ledger(lid, range(ENTRIES))
        md = make_metadata(
            lid,
            [b.bookie_id for b in ensemble],
            write_quorum=3,
            ack_quorum=2,
            last_entry_id=ENTRIES - 1,
            length=ENTRIES * 16,
        )
        await self.writer.write_ledger(md)
        self.ledgers[lid] = md
        self.ever_bookies[lid] = {b.bookie_id for b in ensemble}
        return lid

    def ledgers_on(self, bookie_id: str) -> list[int]:
        return sorted(
            lid
            for lid, md in self.ledgers.items()
            if any(bookie_id in seg.bookies for seg in md.segments)
        )

    async def refresh(self) -> dict[int, int]:
        """Reads every live ledger's metadata back from ZooKeeper (the daemons' workers
        change ensembles); returns each ledger's znode version. Every bookie a ledger's
        metadata ever named stays in `ever_bookies` (the analysis explains a line about a
        ledger by a fault of any bookie it had)."""
        assert self.writer is not None
        lids = sorted(self.ledgers)
        read = await self.client.get_many([self.writer.path(lid) for lid in lids])
        versions: dict[int, int] = {}
        for lid, got in zip(lids, read, strict=True):
            if got is None or lid not in self.ledgers:
                continue  # deleted by the driver meanwhile
            data, stat = got
            md = decode_ledger_metadata(data, lid)
            self.ledgers[lid] = md
            versions[lid] = stat.version
            for seg in md.segments:
                self.ever_bookies.setdefault(lid, set()).update(seg.bookies)
        return versions

    def by_id(self, bookie_id: str) -> BookieEmulator:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    async def delete_ledger(self, lid: int) -> None:
        """As BookKeeper deletes: metadata first, the bookies' data later (their GC, on
        every bookie: a worker may have left an unreferenced copy anywhere)."""
        assert self.writer is not None
        self.ledgers.pop(lid)
        await self.client.delete(self.writer.path(lid))
        self.deleted[lid] = time.time()
        await asyncio.sleep(1.0)
        for b in self.bookies:
            b.drop_ledger(lid)

    async def rereplicate(self, lid: int, old: str, new: str) -> bool:
        """As the replication worker does: copy, swap the bookie in the metadata, GC later.
        The swap is conditional on the version read (a daemon's worker may have changed
        the ensemble meanwhile): False, nothing changed in the metadata, when it did."""
        assert self.writer is not None
        path = self.writer.path(lid)
        data, stat = await self.client.get(path)
        md = decode_ledger_metadata(data, lid)
        seg = md.segments[0]
        if len(md.segments) != 1 or old not in seg.bookies or new in seg.bookies:
            return False
        self.by_id(new).put_ledger(lid, range(ENTRIES))
        bookies = tuple(new if b == old else b for b in seg.bookies)
        moved = replace(md, segments=(replace(seg, bookies=bookies),))
        self.ever_bookies[lid].add(new)
        try:
            await self.client.set(path, encode_ledger_metadata(moved), version=stat.version)
        except BadVersionError:
            return False
        self.ledgers[lid] = moved
        await asyncio.sleep(3.0)
        self.by_id(old).drop_ledger(lid)
        return True

    async def marked(self, lids: list[int]) -> list[int]:
        base = self.ur_base
        return [lid for lid in lids if await self.client.exists(ur_ledger_path(base, lid))]


def _open_log(path: Path) -> BinaryIO:
    return open(path, "wb")


def _read_from(path: Path, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read()
