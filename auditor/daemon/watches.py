"""What every daemon watches, leader or not: who leads (and whether auto-recovery is
on), and when each bookie went missing.

Why: a follower must show who leads in `status` and the metrics, say loudly when a
vote nobody can read holds the election, and keep the restart rule's clock (a new
leader waits `lostBookieRecoveryDelay` from when this process first saw a bookie
missing) although it does no leader work. These loops only read (watches, never a
write in the election they wait in) and never end by themselves: the daemon runs them
beside its election and cancels them at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from structlog.typing import FilteringBoundLogger

from auditor.daemon.election import watch_election
from auditor.daemon.outage import wait_out_outage
from auditor.daemon.state import DaemonState, UnreadableVote
from auditor.metadata.elections import ElectionHolder
from auditor.metadata.registry import watch_bookies
from auditor.metadata.service_uri import MetadataDriver
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.schedule.bookie_sightings import BookieSightings
from auditor.store import MetadataStore, StoreUnavailableError

#: Who leads is read again at least this often (s), in case a watch went with a session.
SAFETY_REREAD = 30.0
#: After a failed read of who leads, the next one comes this much later (s).
REREAD_AFTER_FAILURE = 1.0


async def note_missing_bookies(
    store: MetadataStore,
    root: str,
    sightings: BookieSightings,
    connected: asyncio.Event,
    log: FilteringBoundLogger,
) -> None:
    """Notes when each bookie disappears, leader or not (the restart rule's clock).

    A new leader waits `lostBookieRecoveryDelay` from the moment this
    process first saw a bookie missing, so every daemon keeps watching.
    After an outage the first set read is compared with the last one seen:
    a bookie that went meanwhile is missing from then on, later than it
    really went, which only makes the wait longer, never a false alarm.
    """
    while True:
        stream = watch_bookies(store, root)
        try:
            async for bookies in stream:
                sightings.observe(bookies.available, time.monotonic())
        except StoreUnavailableError as exc:
            log.info("bookie watch interrupted; resuming when connected", error=str(exc))
            await wait_out_outage(connected)
        finally:
            await stream.aclose()


class LeaderFollower:
    """Who leads and whether auto-recovery is on, in `state`, for status and metrics.

    `readiness` is called when readiness may have changed (an unreadable vote came or
    went); `read` after each read of the election.
    """

    def __init__(
        self,
        store: MetadataStore,
        *,
        root: str,
        driver: MetadataDriver,
        state: DaemonState,
        log: FilteringBoundLogger,
        readiness: Callable[[], None],
        read: Callable[[], None],
    ) -> None:
        self.store = store
        self.root = root
        self.driver = driver
        self.state = state
        self.log = log
        self._readiness = readiness
        self._read = read

    async def run(self) -> None:
        """Re-read when the election (votes or Pulsar's key) or the disable flag change
        (watches); a slow safety re-read covers watches lost with a session."""
        store, state = self.store, self.state
        urm = UnderreplicationManager(store, self.root)
        while True:
            waits: list[asyncio.Event] = []
            with contextlib.suppress(Exception):
                # Watches only: a follower writes nothing in the election it waits in.
                holder, votes_changed = await watch_election(store, self.root, self.driver)
                disabled, flag_changed = await store.exists_watched(f"{urm.base}/disable")
                waits = [votes_changed, flag_changed]
                if not state.is_leader:
                    state.leader = holder.auditor if holder is not None else None
                self.note_unreadable_vote(holder)
                state.replication_enabled = disabled is None
                self._read()
            if not waits:  # the store unavailable: try again shortly
                await asyncio.sleep(REREAD_AFTER_FAILURE)
                continue
            pending = [asyncio.ensure_future(e.wait()) for e in waits]
            try:
                await asyncio.wait(
                    pending, timeout=SAFETY_REREAD, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for t in pending:
                    t.cancel()

    def note_unreadable_vote(self, holder: ElectionHolder | None) -> None:
        """Says so, loudly and once, while a live vote we cannot read holds the election
        (`DaemonState.unreadable_vote`: status, a metric, readiness); and when it ends."""
        held = self.state.unreadable_vote
        if holder is not None and holder.live and holder.auditor is None:
            if held is None or held.path != holder.path:
                self.state.unreadable_vote = UnreadableVote(
                    holder.path, holder.session, holder.error, time.time()
                )
                self.log.error(
                    "election held by a vote that does not decode; nobody audits the "
                    "cluster while its session lives",
                    znode=holder.path,
                    session=f"0x{holder.session:x}",
                    error=holder.error,
                )
                self._readiness()
            return
        if held is not None:
            self.state.unreadable_vote = None
            self.log.info("the election is no longer held by an unreadable vote", znode=held.path)
            self._readiness()
