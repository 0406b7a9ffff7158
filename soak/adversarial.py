"""Issue 30's adversarial cases as soak faults: the election held by a foreign vote or by a
vote nobody can read, and the HTTP views under idle connections.

Each was found by hand against one daemon; here they come at random, under three daemons
and every other fault, to show that the fix holds while the rest of the cluster moves:

* `foreign_vote`: a live ephemeral `V_1` under `auditorelection` (another session: a Java
  node, a tool). BookKeeper's order reads its sequence as 1, so it leads (the soak's
  cluster starts with votes past sequence 2): every daemon waits behind it. Expected: the
  leader steps down once, no daemon is elected while it lives (before: 746 elections in
  10 s), a daemon leads within 30 s of its end.
* `garbage_vote`: the same with bytes that do not decode. Expected as above, and some
  daemon names the znode in its log (it also reports NOT_SERVING and the metric; the
  integration tests pin those).
* `idle_http`: 300 connections that never send a request, held against one daemon's HTTP
  views and topped up as the server cuts them, while `/status` is asked every second.
  Expected: every ask answered 200 within `ASK_TIMEOUT` (before: 64 idle connections
  locked every request out).

A held election means nobody audits, by design: a bookie fault that began then would go
unreported by design, not by fault. So a vote fault begins only while every bookie is up
and in no fault, and no bookie fault begins while it holds (it takes every bookie slot).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from auditor.daemon.election import election_path
from auditor.metadata.elections import vote_sequence
from auditor.metadata.records import encode_auditor_vote
from auditor.zk import ZkClient
from soak.cluster import ROOT, Daemon
from soak.faults import Fault, Injector
from soak.leadership import cluster_explains, elections_during
from soak.logs import Line, Span

#: How long a vote fault holds the election: long enough for several check intervals of
#: a looping daemon to show, short enough not to starve the run.
HOLD = (15.0, 30.0)
#: How long a vote fault waits for a quiet cluster before it gives up.
QUIET_WAIT = 120.0
#: The name BookKeeper's comparator reads as sequence 1 (first in line).
FIRST = "V_1"
FOREIGN_ID = "foreign-java-node:3181"
GARBAGE_VOTE = b"\xff\x00 not an AuditorVoteFormat {"
#: Idle connections held against the HTTP views (the issue's probe held 300).
IDLE = 300
IDLE_HOLD = (20.0, 40.0)
#: How long one `/status` may take under the idle connections.
ASK_TIMEOUT = 3.0
#: Elections while a vote fault holds the election that still count as no loop: a
#: campaign under way as the vote appeared may end in one.
LOOP = 2
#: How long after a vote appears the leader may take to step down (its watch fires at
#: once; a decision and a log line later).
STEP_DOWN = 5.0
VOTE_FAULTS = frozenset({"foreign_vote", "garbage_vote"})


class AdversarialFaults:
    """The election lane (vote faults, in the cluster lane) and the HTTP lane."""

    def __init__(self, inj: Injector) -> None:
        self.inj = inj
        self.c = inj.c

    async def _quiet(self) -> bool:
        """Waits (at most QUIET_WAIT s) until every bookie runs and none is in a fault."""
        deadline = time.monotonic() + QUIET_WAIT
        while time.monotonic() < deadline:
            no_fault = self.inj.bookie_slots() == self.inj.max_bookie_faults
            if no_fault and all(b.running for b in self.c.bookies):
                return True
            await asyncio.sleep(0.5)
        return False

    async def _hold_election(self, kind: str, data: bytes, *, evidence: bool) -> Fault | None:
        if not await self._quiet():
            return None
        votes = await self.c.client.get_children(election_path(ROOT))
        sequences = [n for v in votes if (n := vote_sequence(v)) is not None]
        if not sequences or min(sequences) <= 1:
            # `V_1` would not be first (or would tie, an order BookKeeper leaves open). The
            # soak's cluster starts past sequence 2 (`SoakCluster.start`), so this is rare.
            return None
        path = f"{election_path(ROOT)}/{FIRST}"
        slots, self.inj.max_bookie_faults = self.inj.max_bookie_faults, 0
        try:
            async with ZkClient(self.c.zk_server.hosts, session_timeout=10.0, timeout=10.0) as zk:
                f = self.inj.begin(
                    kind,
                    path,
                    path=path if evidence else None,
                    require_evidence=evidence,
                )
                await zk.create(path, data, ephemeral=True)
                await asyncio.sleep(self.inj.rng.uniform(*HOLD))
            # Closing the session removed the vote.
            f.end = f.repaired = time.time()
        finally:
            self.inj.max_bookie_faults = slots
        return f

    async def foreign_vote(self) -> Fault | None:
        return await self._hold_election(
            "foreign_vote", encode_auditor_vote(FOREIGN_ID), evidence=False
        )

    async def garbage_vote(self) -> Fault | None:
        return await self._hold_election("garbage_vote", GARBAGE_VOTE, evidence=True)

    async def idle_http(self) -> Fault | None:
        live = [d for d in self.c.daemons if d.proc is not None and d.proc.returncode is None]
        if not live:
            return None
        d = self.inj.rng.choice(live)
        f = self.inj.begin("idle_http", d.name)
        idle: list[asyncio.StreamWriter] = []
        deadline = time.monotonic() + self.inj.rng.uniform(*IDLE_HOLD)
        try:
            while time.monotonic() < deadline:
                idle = [w for w in idle if not w.is_closing() and not _cut(w)]
                await _top_up(idle, d)
                t = time.time()
                f.asked += 1
                if not await _status_answers(d):
                    f.unanswered.append(t)
                await asyncio.sleep(1.0)
        finally:
            for w in idle:
                w.close()
        f.end = f.repaired = time.time()
        f.note = f"{f.asked - len(f.unanswered)} of {f.asked} /status asks answered"
        return f


def _cut(w: asyncio.StreamWriter) -> bool:
    """Whether the server closed this idle connection (its header timeout)."""
    transport = w.transport
    return transport.is_closing() or transport.get_extra_info("socket") is None


async def _top_up(idle: list[asyncio.StreamWriter], d: Daemon) -> None:
    """Opens connections (that send nothing) until IDLE are held; a refused one is the
    daemon's to refuse (its limit), not a driver failure."""
    while len(idle) < IDLE:
        try:
            _, w = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", d.http_port), ASK_TIMEOUT
            )
        except (OSError, TimeoutError):
            return
        idle.append(w)


async def _status_answers(d: Daemon) -> bool:
    """One `GET /status` on a fresh connection: answered 200 within ASK_TIMEOUT."""

    async def ask() -> bool:
        r, w = await asyncio.open_connection("127.0.0.1", d.http_port)
        try:
            w.write(b"GET /status HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
            await w.drain()
            head = await r.readline()
            return head.startswith(b"HTTP/1.1 200")
        finally:
            w.close()
            with contextlib.suppress(OSError):
                await w.wait_closed()

    try:
        return await asyncio.wait_for(ask(), ASK_TIMEOUT)
    except (OSError, TimeoutError):
        return False


# --- judging (pure: faults and log lines in) ---------------------------------------------


def election_loops(faults: list[Fault], lines: list[Line], run_end: float) -> list[dict[str, Any]]:
    """Vote faults during which daemons were elected more than LOOP times."""
    out: list[dict[str, Any]] = []
    for f in faults:
        if f.kind not in VOTE_FAULTS:
            continue
        n = elections_during(f, lines, run_end)
        if n > LOOP:
            out.append({"kind": f.kind, "start": f.start, "elections": n})
    return out


def http_lockouts(faults: list[Fault], run_end: float) -> list[dict[str, Any]]:
    """`/status` asks unanswered under idle connections that no cluster fault on that
    daemon (a kill, a restart, a cut) explains."""
    out: list[dict[str, Any]] = []
    for f in faults:
        if f.kind != "idle_http":
            continue
        unexplained = [
            t for t in f.unanswered if cluster_explains(f.target, t, faults, run_end) is None
        ]
        if unexplained:
            out.append({"daemon": f.target, "asked": f.asked, "unanswered": unexplained})
    return out


def led_beside(faults: list[Fault], spans: list[Span], run_end: float) -> list[dict[str, Any]]:
    """Leaderships that went on while a vote fault held the election (from STEP_DOWN s
    after it appeared to its end): a second auditor beside the one BookKeeper names."""
    out: list[dict[str, Any]] = []
    for f in faults:
        if f.kind not in VOTE_FAULTS:
            continue
        lo, hi = f.start + STEP_DOWN, f.end or run_end
        for s in spans:
            if s.start < hi and s.end > lo:
                out.append({"kind": f.kind, "start": f.start, "daemon": s.daemon})
    return out
