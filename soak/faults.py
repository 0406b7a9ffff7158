"""The faults the soak injects, each with what the auditor is expected to say about it.

A fault is either reportable (it lasts longer than every retry and delay the
checks allow, so some check must report one of `expect` for its ledgers) or
transient by design (shorter than the retries, slower than usual but within
the read timeout, or a metadata change a careful check must not mistake for
damage): those expect silence. Reportable faults are repaired at their end
the way BookKeeper would be (bookie back with its data, marks removed by "the
replication worker"), so that later checks are clean again.
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
from soak.cluster import ENTRIES, SESSION, SoakCluster

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
#: How long a reportable fault lasts: longer than two check intervals.
LONG = (65.0, 90.0)


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

    # --- helpers ------------------------------------------------------------------------

    def _begin(self, kind: str, target: str, **kw: Any) -> Fault:
        f = Fault(kind, target, time.time(), **kw)
        self.faults.append(f)
        print(f"[soak] {time.strftime('%H:%M:%S')} {kind} on {target}", file=sys.stderr, flush=True)
        return f

    def _end(self, f: Fault) -> None:
        f.end = f.repaired = time.time()

    def free_bookies(self) -> list[BookieEmulator]:
        return [b for b in self.c.bookies if b.bookie_id not in self.busy]

    def bookie_slots(self) -> int:
        faulty = sum(1 for f in self.faults if f.end == 0.0 and f.kind.startswith("bookie_"))
        return self.max_bookie_faults - faulty

    def healthy_ledgers(self) -> list[int]:
        return [
            lid for lid, md in self.c.ledgers.items() if not set(md.segments[0].bookies) & self.busy
        ]

    # --- ZooKeeper and daemons --------------------------------------------------------

    async def zk_restart(self) -> Fault:
        async with self.zk_lock:
            f = self._begin("zk_restart", self.c.zk_server.hosts)
            await asyncio.to_thread(self.c.zk_server.stop)
            await asyncio.sleep(self.rng.uniform(1.0, 3.0))
            await asyncio.to_thread(self.c.zk_server.start)
            self._end(f)
        return f

    async def _cut(self, kind: str, seconds: float) -> Fault:
        d = self.rng.choice(self.c.daemons)
        f = self._begin(kind, d.name)
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
        f = self._begin("leader_kill", d.name)
        await self.c.kill(d)
        await asyncio.sleep(self.rng.uniform(2.0, 5.0))
        await self.c.launch(d)
        self._end(f)
        return f

    # --- bookies --------------------------------------------------------------------

    async def _bookie_fault(
        self,
        kind: str,
        inject: Callable[[BookieEmulator], Awaitable[None]],
        repair: Callable[[BookieEmulator], Awaitable[None]],
        seconds: float,
        expect: frozenset[str] | set[str] = frozenset(),
        require_marks: bool = False,
        explains: frozenset[str] | set[str] | None = None,
    ) -> Fault | None:
        free = self.free_bookies()
        if not free or self.bookie_slots() <= 0:
            return None
        b = self.rng.choice(free)
        self.busy.add(b.bookie_id)
        try:
            f = self._begin(
                kind,
                b.bookie_id,
                ledgers=self.c.ledgers_on(b.bookie_id),
                expect=sorted(expect),
                explains=sorted(DATA_CATEGORIES if expect else explains or ()),
                require_marks=require_marks,
            )
            async with self.zk_lock:
                await inject(b)
            await asyncio.sleep(seconds)
            f.end = time.time()
            async with self.zk_lock:
                if expect:
                    f.marked = len(await self.c.marked(f.ledgers))
                await repair(b)
                if f.explains:
                    await self.c.unmark(f.ledgers)
            f.repaired = time.time()
            return f
        finally:
            self.busy.discard(b.bookie_id)

    async def bookie_crash(self) -> Fault | None:
        """Killed and left down well past lostBookieRecoveryDelay: its ledgers are lost."""

        async def crash(b: BookieEmulator) -> None:
            await b.crash()

        async def start(b: BookieEmulator) -> None:
            await b.start()

        return await self._bookie_fault(
            "bookie_crash",
            crash,
            start,
            self.rng.uniform(*LONG),
            {"ledgers_on_lost_bookies"},
            require_marks=True,
        )

    async def bookie_crash_short(self) -> Fault | None:
        """Back within lostBookieRecoveryDelay: nothing to report."""

        async def crash(b: BookieEmulator) -> None:
            await b.crash()

        async def start(b: BookieEmulator) -> None:
            await b.start()

        # Upstream's periodic bookie check does not wait for lostBookieRecoveryDelay (only
        # the triggered audit does): if one falls within the outage it reports and marks.
        return await self._bookie_fault(
            "bookie_crash_short",
            crash,
            start,
            self.rng.uniform(1, 3),
            explains={"ledgers_on_lost_bookies"},
        )

    async def _pause(self, kind: str, seconds: float, expect: set[str]) -> Fault | None:
        async def pause(b: BookieEmulator) -> None:
            b.pause()

        async def resume(b: BookieEmulator) -> None:
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

        async def slow(b: BookieEmulator) -> None:
            b.set_latency(latency)

        async def clear(b: BookieEmulator) -> None:
            b.clear_faults()

        return await self._bookie_fault("bookie_slow", slow, clear, self.rng.uniform(20, 40))

    async def _storm(self, kind: str, status: Status) -> Fault | None:
        async def storm(b: BookieEmulator) -> None:
            b.inject_status(status)

        async def clear(b: BookieEmulator) -> None:
            b.clear_faults()

        return await self._bookie_fault(
            kind, storm, clear, self.rng.uniform(*LONG), DATA_CATEGORIES
        )

    async def bookie_eio(self) -> Fault | None:
        return await self._storm("bookie_eio", Status.EIO)

    async def bookie_toomany(self) -> Fault | None:
        return await self._storm("bookie_toomany", Status.ETOOMANYREQUESTS)

    async def bookie_empty(self) -> Fault | None:
        """Restarted with the same identity and empty storage: every copy on it is gone."""
        held: list[int] = []

        async def wipe(b: BookieEmulator) -> None:
            await b.stop()
            held.extend(b.ledger_ids())
            for lid in held:
                b.drop_ledger(lid)
            await b.start()

        async def refill(b: BookieEmulator) -> None:
            for lid in self.c.ledgers_on(b.bookie_id):
                b.put_ledger(lid, range(ENTRIES))

        return await self._bookie_fault(
            "bookie_empty",
            wipe,
            refill,
            self.rng.uniform(*LONG),
            DATA_CATEGORIES - {"ledgers_on_lost_bookies", "bookie_unavailable_registered"},
            require_marks=True,
        )

    # --- ledgers --------------------------------------------------------------------

    async def ledger_delete(self) -> Fault | None:
        """Deleted while a check runs (right after a 'check started' line)."""
        await self.c.wait_log_event("check started", 40.0)
        await asyncio.sleep(self.rng.uniform(0.0, 0.3))
        candidates = self.healthy_ledgers()
        if not candidates:
            return None
        lid = self.rng.choice(candidates)
        bookies = set(self.c.ledgers[lid].segments[0].bookies)
        self.busy |= bookies
        try:
            f = self._begin("ledger_delete", str(lid), ledgers=[lid])
            async with self.zk_lock:
                await self.c.delete_ledger(lid)
                await self.c.add_ledger()  # keep the population steady
            self._end(f)
            return f
        finally:
            self.busy -= bookies

    async def ledger_rereplicate(self) -> Fault | None:
        """The ensemble changes (a copy moves to the other bookie of the same rack)."""
        healthy = self.healthy_ledgers()
        for lid in self.rng.sample(healthy, k=min(20, len(healthy))):
            ensemble = list(self.c.ledgers[lid].segments[0].bookies)
            pos = self.rng.randrange(len(ensemble))
            i = next(i for i, b in enumerate(self.c.bookies) if b.bookie_id == ensemble[pos])
            new = self.c.bookies[i ^ 1].bookie_id  # the rack's other bookie
            if new in self.busy or new in ensemble:
                continue
            moved = {ensemble[pos], new}
            self.busy |= moved
            try:
                f = self._begin(
                    "ledger_rereplicate", f"{lid}:{ensemble[pos]}->{new}", ledgers=[lid]
                )
                async with self.zk_lock:
                    await self.c.rereplicate(lid, ensemble[pos], new)
                self._end(f)
                return f
            finally:
                self.busy -= moved
        return None
