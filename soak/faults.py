"""The faults the soak injects, each with what the auditor is expected to say about it.

A fault is either reportable (it lasts longer than every retry and delay the
checks allow, so some check must report one of `expect` for its ledgers) or
transient by design (shorter than the retries, slower than usual but within
the read timeout, a bookie back within lostBookieRecoveryDelay, or a metadata
change a careful check must not mistake for damage): those expect silence.
Every bookie fault is repaired at its end the way BookKeeper would be (bookie
back with its data; `soak.worker` copies what an emptied bookie lacks and
unmarks the ledgers that are whole again), so that later checks are clean.

A host is a daemon and the bookie beside it (`SoakCluster.host_bookie`): a host
restart SIGKILLs the daemon and crashes the bookie together (a host that goes
down hard: power, kernel, hypervisor), then starts both again, the bookie with
its data and the daemon with the same identity.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from auditor.bookie.protocol import Status
from auditor.testing.bookie import BookieEmulator
from soak.cluster import SESSION, Daemon, SoakCluster
from soak.worker import ReplicationWorker

#: Categories a damaged or unreachable copy can legitimately produce.
DATA_CATEGORIES = frozenset(
    {
        "no_replica",
        "below_ack_quorum",
        "below_write_quorum",
        "bookie_unavailable_registered",
        "ledgers_on_lost_bookies",
        "unreadable_fragments",
    }
)
#: How long a reportable fault lasts: longer than two check intervals, and than
#: lostBookieRecoveryDelay (40 s) by 25 s at least.
LONG = (65.0, 90.0)
#: How long a host (daemon and bookie) stays down: less than lostBookieRecoveryDelay.
HOST_DOWN = (5.0, 30.0)
#: How long a rolling restart waits for a host's bookie to leave its other fault.
ROLL_WAIT = 100.0
#: How long an emptied bookie's fault waits, at its end, for the daemons' workers to move
#: its ledgers elsewhere (real workers). Its bookie keeps a bookie slot meanwhile: its data
#: is gone for good, so until the workers have restored the copies it is a fault under way
#: (letting another bookie of the same ledgers fail would test three faults at once). Not
#: done in this time is a failure of the run (`emptied_not_drained`).
MOVE_WAIT = 300.0


@dataclass
class Fault:
    kind: str
    target: str
    start: float
    end: float = 0.0
    #: When its consequences were repaired (bookie data back, marks removed).
    repaired: float = 0.0
    #: Ledgers whose current ensemble held the faulty bookie when it began.
    ledgers: list[int] = field(default_factory=list)
    #: Categories of which at least one must be reported; empty: silence expected.
    expect: list[str] = field(default_factory=list)
    #: Categories this fault may legitimately cause (on its ledgers, while it lasts
    #: and shortly after its repair); anything else is a false alarm.
    explains: list[str] = field(default_factory=list)
    #: Whether every affected ledger must be marked under-replicated before the repair.
    require_marks: bool = False
    marked: int | None = None
    #: A leader was in place within 30 s of the fault's end.
    survived: bool | None = None
    #: The bookie the fault acts on (bookie faults and host restarts), else None.
    bookie: str | None = None
    #: The daemon it stops or cuts off, else None.
    daemon: str | None = None
    #: When its bookie was unregistered: [gone, back] pairs (back 0.0 while gone).
    down: list[list[float]] = field(default_factory=list)
    #: A bad znode's path, and the ledger id it names (a mark's), if any.
    path: str | None = None
    ledger_id: int | None = None
    #: Whether the analysis must find the bad znode named by path in some daemon's log.
    require_evidence: bool = False
    #: A rolling restart's number (its hosts are one fault each).
    roll: int | None = None
    #: Set by the analysis for faults that must be reported.
    reported: bool | None = None
    #: `idle_http`: how many `/status` asks it made, and when one went unanswered.
    asked: int = 0
    unanswered: list[float] = field(default_factory=list)
    #: `bookie_empty` with real workers: its ledgers still on it when the wait ended.
    not_drained: list[int] = field(default_factory=list)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Injector:
    """Runs faults in three lanes: ZooKeeper/daemons (one at a time), bookies, ledgers."""

    def __init__(self, cluster: SoakCluster, rng: random.Random) -> None:
        self.c = cluster
        self.rng = rng
        self.faults: list[Fault] = []
        self.cluster_lane = asyncio.Lock()
        #: Held while ZooKeeper is down, and by every driver write to it.
        self.zk_lock = asyncio.Lock()
        self.busy: set[str] = set()  # bookie ids in a fault or a ledger move
        self.max_bookie_faults = 2
        self.worker = ReplicationWorker(cluster)
        self.rolls = 0

    # --- helpers ------------------------------------------------------------------------

    def begin(self, kind: str, target: str, **kw: Any) -> Fault:
        f = Fault(kind, target, time.time(), **kw)
        self.faults.append(f)
        print(f"[soak] {time.strftime('%H:%M:%S')} {kind} on {target}", file=sys.stderr, flush=True)
        return f

    def _end(self, f: Fault) -> None:
        f.end = f.repaired = time.time()

    def free_bookies(self) -> list[BookieEmulator]:
        return [b for b in self.c.bookies if b.bookie_id not in self.busy]

    def bookie_slots(self) -> int:
        """Bookie faults (host restarts included) that may still begin now."""
        faulty = sum(1 for f in self.faults if f.end == 0.0 and f.bookie is not None)
        return self.max_bookie_faults - faulty

    async def survives(self, f: Fault) -> None:
        """Whether some live daemon acts as leader within 30 s of the fault's end."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.c.acting_leader() is not None:
                f.survived = True
                return
            await asyncio.sleep(0.5)
        f.survived = False

    async def _gone(self, b: BookieEmulator, f: Fault, *, wipe: bool = False) -> None:
        """Crashes the bookie (or stops it and, with `wipe`, loses its storage)."""
        if wipe:
            await b.stop()
            for lid in b.ledger_ids():
                b.drop_ledger(lid)
        else:
            await b.crash()
        f.down.append([time.time(), 0.0])

    async def _back(self, b: BookieEmulator, f: Fault) -> None:
        await b.start()
        f.down[-1][1] = time.time()

    @property
    def real_worker(self) -> bool:
        return self.c.worker == "real"

    async def repair_ledgers(self, f: Fault, b: BookieEmulator) -> None:
        """The replication worker after a bookie fault. Simulated: what `b` lacks is
        copied into it from surviving replicas, then the fault's ledgers that are whole
        are unmarked. Real: the daemons' workers repair; for a bookie that lost its data
        the fault lasts until they have moved every one of its ledgers to other bookies
        (a ledger still naming it is still short of a copy: a report after the repair
        would be right, not a false alarm). A bookie back with its data needs nothing."""
        if self.real_worker:
            if f.kind == "bookie_empty":
                await self._moved_off(f, b)
            return
        _, kept = await self.worker.repair(f.ledgers, into=[b])
        if kept:
            f.note = f"{len(kept)} ledgers kept marked at the repair (not whole)"

    async def _moved_off(self, f: Fault, b: BookieEmulator) -> None:
        """Waits (up to MOVE_WAIT) until no live ledger of the fault names `b`."""
        deadline = time.monotonic() + MOVE_WAIT
        left: list[int] = []
        while True:
            await self.c.refresh()
            left = [lid for lid in f.ledgers if lid in self.c.ledgers_on(b.bookie_id)]
            if not left or time.monotonic() >= deadline:
                break
            await asyncio.sleep(1.0)
        if left:
            f.note = f"{len(left)} ledgers still on the emptied bookie after {MOVE_WAIT:g} s"
            f.not_drained = left

    async def handled(self, f: Fault) -> int:
        """How many of the fault's ledgers are marked under-replicated now, or (real
        workers) were already moved off its bookie or deleted: a worker repairs only what
        was marked, so a ledger moved off was marked before."""
        marked = set(await self.c.marked(f.ledgers))
        if not self.real_worker or f.bookie is None:
            return len(marked)
        await self.c.refresh()
        on = set(self.c.ledgers_on(f.bookie))
        return sum(1 for lid in f.ledgers if lid in marked or lid not in on)

    async def sweep(self) -> None:
        """The replication worker's loop: copies into idle bookies what they lack, unmarks
        every marked ledger that is whole (the simulated worker only)."""
        if self.real_worker:
            return
        async with self.zk_lock:
            await self.worker.sweep([b for b in self.free_bookies() if b.running])

    async def healthy_ledgers(self) -> list[int]:
        """Ledgers none of whose bookies is in a fault, from metadata read now when the
        daemons' workers may have changed it."""
        if self.real_worker:
            await self.c.refresh()
        return [
            lid
            for lid, md in self.c.ledgers.items()
            if not {b for seg in md.segments for b in seg.bookies} & self.busy
        ]

    # --- ZooKeeper and daemons --------------------------------------------------------

    async def zk_restart(self) -> Fault:
        async with self.zk_lock:
            f = self.begin("zk_restart", self.c.zk_server.hosts)
            await asyncio.to_thread(self.c.zk_server.stop)
            await asyncio.sleep(self.rng.uniform(1.0, 3.0))
            await asyncio.to_thread(self.c.zk_server.start)
            self._end(f)
        return f

    async def _cut(self, kind: str, seconds: float) -> Fault:
        d = self.rng.choice(self.c.daemons)
        f = self.begin(kind, d.name, daemon=d.name)
        d.proxy.cut()
        await asyncio.sleep(seconds)
        d.proxy.mend()
        self._end(f)
        return f

    async def zk_partition(self) -> Fault:
        """ZooKeeper unreachable for one daemon for twice the session timeout."""
        return await self._cut("zk_partition", self.rng.uniform(2 * SESSION, 3 * SESSION))

    async def session_expire(self) -> Fault:
        """Cut just past the session timeout: the server expires the session, the
        daemon learns it (LOST) the moment it reconnects."""
        return await self._cut("session_expire", SESSION + self.rng.uniform(1.0, 2.0))

    async def leader_kill(self) -> Fault:
        d = self.c.acting_leader()
        if d is None or d.proc is None or d.proc.returncode is not None:
            d = self.rng.choice(self.c.daemons)
        f = self.begin("leader_kill", d.name, daemon=d.name)
        await self.c.kill(d)
        await asyncio.sleep(self.rng.uniform(2.0, 5.0))
        await self.c.launch(d)
        self._end(f)
        return f

    # --- hosts: a daemon and the bookie beside it ------------------------------------

    def _host_for_restart(self) -> tuple[Daemon, BookieEmulator] | None:
        """The acting leader's host (the case the restart rule is about) if its bookie is
        free, else another host whose bookie is; None if none is or no bookie slot is left."""
        if self.bookie_slots() <= 0:
            return None
        leader = self.c.acting_leader()
        hosts = [(d, self.c.host_bookie(d)) for d in self.c.daemons]
        free = [(d, b) for d, b in hosts if b.bookie_id not in self.busy]
        if not free:
            return None
        return next(((d, b) for d, b in free if d is leader), None) or self.rng.choice(free)

    async def _restart_host(
        self, kind: str, d: Daemon, b: BookieEmulator, seconds: float, roll: int | None = None
    ) -> Fault:
        """Daemon SIGKILLed and bookie crashed together; both back `seconds` later."""
        self.busy.add(b.bookie_id)
        try:
            if self.real_worker:
                await self.c.refresh()
            f = self.begin(
                kind,
                f"{d.name}+{b.bookie_id}",
                bookie=b.bookie_id,
                daemon=d.name,
                ledgers=self.c.ledgers_on(b.bookie_id),
                roll=roll,
            )
            async with self.zk_lock:
                if d.proc is not None and d.proc.returncode is None:
                    await self.c.kill(d)
                await self._gone(b, f)
            await asyncio.sleep(seconds)
            async with self.zk_lock:
                await self._back(b, f)
            await self.c.launch(d)
            f.end = time.time()
            if self.real_worker:
                await self.repair_ledgers(f, b)
            else:
                async with self.zk_lock:
                    await self.repair_ledgers(f, b)
            f.repaired = time.time()
            return f
        finally:
            self.busy.discard(b.bookie_id)

    async def host_restart(self) -> Fault | None:
        """Back within lostBookieRecoveryDelay: no mark, no report (issue 21's restart rule)."""
        pick = self._host_for_restart()
        if pick is None:
            return None
        return await self._restart_host("host_restart", *pick, self.rng.uniform(*HOST_DOWN))

    async def _wait_free(self, b: BookieEmulator, within: float) -> bool:
        """Polls until `b` is in no other fault and a bookie slot is free."""
        deadline = time.monotonic() + within
        while b.bookie_id in self.busy or self.bookie_slots() <= 0:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.5)
        return True

    async def rolling_restart(self) -> Fault | None:
        """Each host in turn, one at a time, as an upgrade does; each waits for a leader
        before the next goes down. Every host is a fault of its own (their survival is
        judged here); a host whose bookie stays in another fault is skipped."""
        self.rolls += 1
        roll = self.rolls
        start = self.rng.randrange(len(self.c.daemons))
        order = self.c.daemons[start:] + self.c.daemons[:start]
        for d in order:
            b = self.c.host_bookie(d)
            if not await self._wait_free(b, ROLL_WAIT):
                print(f"[soak] rolling restart {roll}: {d.name} skipped", file=sys.stderr)
                continue
            seconds = self.rng.uniform(*HOST_DOWN)
            f = await self._restart_host("rolling_restart", d, b, seconds, roll)
            await self.survives(f)
            await asyncio.sleep(2.0)
        return None

    # --- bookies --------------------------------------------------------------------

    async def _bookie_fault(
        self,
        kind: str,
        inject: Callable[[BookieEmulator, Fault], Awaitable[None]],
        repair: Callable[[BookieEmulator, Fault], Awaitable[None]],
        seconds: float,
        expect: frozenset[str] | set[str] = frozenset(),
        require_marks: bool = False,
    ) -> Fault | None:
        free = self.free_bookies()
        if not free or self.bookie_slots() <= 0:
            return None
        b = self.rng.choice(free)
        self.busy.add(b.bookie_id)
        try:
            if self.real_worker:
                await self.c.refresh()
            ledgers = self.c.ledgers_on(b.bookie_id)
            # Real workers may have moved every ledger off a bookie (an emptied one keeps
            # none): a fault of a bookie that holds nothing has nothing to report. It still
            # explains reports about ledgers given to it meanwhile.
            f = self.begin(
                kind,
                b.bookie_id,
                bookie=b.bookie_id,
                ledgers=ledgers,
                expect=sorted(expect) if ledgers else [],
                explains=sorted(DATA_CATEGORIES if expect else ()),
                require_marks=require_marks and bool(ledgers),
                note="" if ledgers or not expect else "the bookie held no ledger",
            )
            async with self.zk_lock:
                await inject(b, f)
            await asyncio.sleep(seconds)
            f.end = time.time()
            async with self.zk_lock:
                if expect:
                    f.marked = await self.handled(f)
                await repair(b, f)
                if not self.real_worker:
                    await self.repair_ledgers(f, b)
            if self.real_worker:
                # Waits for the daemons' workers: never under the driver's lock, which
                # would hold every other fault's injection and repair meanwhile.
                await self.repair_ledgers(f, b)
            f.repaired = time.time()
            return f
        finally:
            self.busy.discard(b.bookie_id)

    async def bookie_crash(self) -> Fault | None:
        """Killed and left down well past lostBookieRecoveryDelay: its ledgers are lost."""

        return await self._bookie_fault(
            "bookie_crash",
            self._gone,
            self._back,
            self.rng.uniform(*LONG),
            {"ledgers_on_lost_bookies"},
            require_marks=True,
        )

    async def bookie_crash_short(self) -> Fault | None:
        """Back within lostBookieRecoveryDelay: nothing to report."""

        # Upstream's periodic bookie check does not wait for lostBookieRecoveryDelay (only
        # the triggered audit does); issue 21's restart rule does: silence, no exception.
        return await self._bookie_fault(
            "bookie_crash_short", self._gone, self._back, self.rng.uniform(1, 3)
        )

    async def _pause(self, kind: str, seconds: float, expect: set[str]) -> Fault | None:
        async def pause(b: BookieEmulator, f: Fault) -> None:
            b.pause()

        async def resume(b: BookieEmulator, f: Fault) -> None:
            b.resume()

        return await self._bookie_fault(kind, pause, resume, seconds, expect)

    async def bookie_pause(self) -> Fault | None:
        """Registered but silent past every retry."""
        return await self._pause(
            "bookie_pause",
            self.rng.uniform(*LONG),
            {"bookie_unavailable_registered", "unreadable_fragments"},
        )

    async def bookie_pause_short(self) -> Fault | None:
        """A GC pause: shorter than one read timeout."""
        return await self._pause("bookie_pause_short", self.rng.uniform(0.3, 0.8), set())

    async def bookie_slow(self) -> Fault | None:
        """Slow answers, within readEntryTimeout."""
        latency = self.rng.uniform(0.1, 0.4)

        async def slow(b: BookieEmulator, f: Fault) -> None:
            b.set_latency(latency)

        async def clear(b: BookieEmulator, f: Fault) -> None:
            b.clear_faults()

        return await self._bookie_fault("bookie_slow", slow, clear, self.rng.uniform(20, 40))

    async def _storm(self, kind: str, status: Status) -> Fault | None:
        async def storm(b: BookieEmulator, f: Fault) -> None:
            b.inject_status(status)

        async def clear(b: BookieEmulator, f: Fault) -> None:
            b.clear_faults()

        return await self._bookie_fault(
            kind, storm, clear, self.rng.uniform(*LONG), DATA_CATEGORIES
        )

    async def bookie_eio(self) -> Fault | None:
        return await self._storm("bookie_eio", Status.EIO)

    async def bookie_toomany(self) -> Fault | None:
        return await self._storm("bookie_toomany", Status.ETOOMANYREQUESTS)

    async def bookie_empty(self) -> Fault | None:
        """Restarted with the same identity and empty storage: every copy on it is gone.
        The repair is the replication worker's: it copies the entries back from the
        surviving replicas (`repair_ledgers`), then unmarks what is whole."""

        async def wipe(b: BookieEmulator, f: Fault) -> None:
            await self._gone(b, f, wipe=True)
            await self._back(b, f)

        async def nothing(b: BookieEmulator, f: Fault) -> None:
            return None

        return await self._bookie_fault(
            "bookie_empty",
            wipe,
            nothing,
            self.rng.uniform(*LONG),
            DATA_CATEGORIES - {"ledgers_on_lost_bookies", "bookie_unavailable_registered"},
            require_marks=True,
        )

    # --- ledgers --------------------------------------------------------------------

    async def ledger_delete(self) -> Fault | None:
        """Deleted while a check runs (right after a 'check started' line)."""
        await self.c.wait_log_event("check started", 40.0)
        await asyncio.sleep(self.rng.uniform(0.0, 0.3))
        candidates = await self.healthy_ledgers()
        if not candidates:
            return None
        lid = self.rng.choice(candidates)
        bookies = {b for seg in self.c.ledgers[lid].segments for b in seg.bookies}
        self.busy |= bookies
        try:
            f = self.begin("ledger_delete", str(lid), ledgers=[lid])
            async with self.zk_lock:
                await self.c.delete_ledger(lid)
                await self.c.add_ledger()  # keep the population steady
            self._end(f)
            return f
        finally:
            self.busy -= bookies

    async def ledger_rereplicate(self) -> Fault | None:
        """The ensemble changes (a copy moves to the other bookie of the same rack)."""
        healthy = await self.healthy_ledgers()
        for lid in self.rng.sample(healthy, k=min(20, len(healthy))):
            if len(self.c.ledgers[lid].segments) != 1:
                continue
            ensemble = list(self.c.ledgers[lid].segments[0].bookies)
            pos = self.rng.randrange(len(ensemble))
            i = next(i for i, b in enumerate(self.c.bookies) if b.bookie_id == ensemble[pos])
            new = self.c.bookies[i ^ 1].bookie_id  # the rack's other bookie
            if new in self.busy or new in ensemble:
                continue
            moved = {ensemble[pos], new}
            self.busy |= moved
            try:
                f = self.begin("ledger_rereplicate", f"{lid}:{ensemble[pos]}->{new}", ledgers=[lid])
                async with self.zk_lock:
                    if not await self.c.rereplicate(lid, ensemble[pos], new):
                        f.note = "not moved: a daemon's worker changed the ledger first"
                self._end(f)
                return f
            finally:
                self.busy -= moved
        return None
