"""The daemon's election loop: when to vote, voting, and what ends a term from outside.

Why: the election is the daemon's most delicate part (never two auditors, never none
for long), and it used to be spread through the daemon's lifecycle class. Here one
object holds it: waiting to be clear to vote (no other session's vote with our
identity, no live holder of the other metadata driver's election), the vote itself
raced against a rival's vote that lands ahead of ours and against the other election,
one last look at the other election once elected, the back-off after a failure, and,
while leading, the watch on our vote. Every event becomes an event of the leadership
machine (`auditor.daemon.leadership`) through `decide`; the leader's term itself is the
daemon's (`lead`, handed to `run`).

Store outages interrupt every read here and end none of them (`auditor.daemon.outage`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from structlog.typing import FilteringBoundLogger

from auditor.daemon.election import ElectorLike, Leadership, watch_other_election
from auditor.daemon.leadership import (
    Action,
    BackoffElapsed,
    CampaignFailed,
    Decision,
    DuplicateCleared,
    DuplicateIdentity,
    Event,
    OtherElectionCleared,
    OtherElectionLeader,
    Phase,
)
from auditor.daemon.outage import when_available
from auditor.daemon.state import DaemonState, OtherElection
from auditor.metadata.elections import ElectionHolder
from auditor.metadata.service_uri import MetadataDriver
from auditor.store import MetadataStore, NoNodeError, StoreUnavailableError
from auditor.waits import until_any

#: While refusing to vote for a duplicate identity, the daemon says so this often (s).
DUPLICATE_REMINDER = 60.0
#: After the other driver's election clears, the daemon waits up to this long (s, at
#: random) before voting, so that daemons of both drivers do not take both at once again.
OTHER_ELECTION_SETTLE = 2.0

T = TypeVar("T")

#: Runs one leader term on a fresh leadership; returns the decision that ended it.
Lead = Callable[[Leadership], Awaitable[Decision]]


class Campaign:
    """One daemon's part in its driver's election, for the daemon's whole life.

    `connected` is set while the session is; `stop` ends the loop (the vote is withdrawn
    on the way out). `store_name` names the metadata store in messages.
    """

    def __init__(
        self,
        elector: ElectorLike,
        store: MetadataStore,
        *,
        root: str,
        driver: MetadataDriver,
        state: DaemonState,
        decide: Callable[[Event], Decision],
        connected: asyncio.Event,
        stop: asyncio.Event,
        rng: random.Random,
        log: FilteringBoundLogger,
        store_name: str,
    ) -> None:
        self.elector = elector
        self.store = store
        self.root = root
        self.driver = driver
        self.state = state
        self._decide = decide
        self._connected = connected
        self._stop = stop
        self._rng = rng
        self.log = log
        self.store_name = store_name
        self._reminded = 0.0
        self._reminded_other = 0.0

    async def run(self, lead: Lead) -> None:
        """Vote, lead (`lead`), step down, back off; until stopped."""
        elector = self.elector
        try:
            while not self._stop.is_set():
                await self._until(self._connected)
                if self._stop.is_set():
                    break
                if not await self.clear_to_vote():
                    break
                self.state.tallies.election_attempt()
                leadership, failed = await self.attempt()
                if leadership is None:
                    await elector.resign()
                    if failed is not None and failed.action is Action.BACK_OFF:
                        await self.back_off(failed)
                    continue
                try:
                    end = await lead(leadership)
                finally:
                    await elector.resign()
                    self.state.leader = None
                if end.action is Action.BACK_OFF:
                    await self.back_off(end)
        finally:
            await elector.resign()

    async def back_off(self, d: Decision) -> None:
        """Waits out `d`'s back-off (or until stopped), then says it is over."""
        await self._until(within=d.backoff)
        if not self._stop.is_set():
            self._decide(BackoffElapsed())

    async def _until(self, *events: asyncio.Event, within: float | None = None) -> None:
        """Until any of `events` (or `stop`) is set, or `within` seconds pass."""
        await until_any(*events, self._stop, within=within)

    # --- before voting ----------------------------------------------------------------

    async def clear_to_vote(self) -> bool:
        """Whether to vote now: the other driver's election has no live holder, and no
        other session's vote carries our identity.

        While one does, the daemon refuses (one decision), says so again once a
        minute, and looks again whenever the votes change.
        """
        while not self._stop.is_set():
            if not await self.clear_of_other_election():
                return False
            read = await when_available(self.elector.rivals, self._connected, self._stop)
            if read is None:
                return False
            rivals, changed = read
            if not rivals:
                if self.state.phase is Phase.REFUSED:
                    self._decide(DuplicateCleared())
                return True
            if self.state.phase is not Phase.REFUSED:
                self._decide(DuplicateIdentity(rivals[0]))
                self._reminded = time.monotonic()
            elif time.monotonic() - self._reminded >= DUPLICATE_REMINDER:
                self._reminded = time.monotonic()
                self.log.error(
                    f"still refusing to vote: another {self.store_name} session holds a "
                    "vote with this daemon's identity",
                    vote=rivals[0],
                    since=self.state.duplicate_since,
                )
            await self._until(changed, within=DUPLICATE_REMINDER)
        return False

    async def clear_of_other_election(self) -> bool:
        """Whether the other driver's election is free of live holders (waits until it is).

        While it is held the daemon stays out (one decision), says so again once a
        minute, and looks again whenever that election changes. When it clears, a
        short random pause keeps daemons of both drivers from trying again in step.
        """
        deferred = False
        while not self._stop.is_set():
            read = await when_available(self._watch_other, self._connected, self._stop)
            if read is None:
                break
            holder, changed = read
            if holder is None:
                if self.state.other_election is not None:
                    self.state.other_election = None
                    self._decide(OtherElectionCleared())
                    deferred = True
                break
            if self.state.other_election is None:
                self.defer_to(holder)
            elif time.monotonic() - self._reminded_other >= DUPLICATE_REMINDER:
                self._reminded_other = time.monotonic()
                self.log.error(
                    "still not leading: the other metadata driver's election has a live auditor",
                    election=str(holder.election),
                    holder=holder.auditor,
                    path=holder.path,
                    since=self.state.other_election.since if self.state.other_election else None,
                )
            await self._until(changed, within=DUPLICATE_REMINDER)
        if deferred and not self._stop.is_set():
            await self._until(within=self._rng.uniform(0.0, OTHER_ELECTION_SETTLE))
        return not self._stop.is_set()

    def defer_to(self, holder: ElectionHolder) -> Decision:
        """The decision to stay out while `holder` holds the other driver's election."""
        if self.state.other_election is None or self.state.other_election.path != holder.path:
            self.state.other_election = OtherElection(
                str(holder.election), holder.path, holder.auditor or "", time.time()
            )
        self._reminded_other = time.monotonic()
        who = holder.auditor if holder.auditor is not None else f"undecodable ({holder.error})"
        return self._decide(OtherElectionLeader(str(holder.election), f"{who} at {holder.path}"))

    # --- voting -----------------------------------------------------------------------

    async def attempt(self) -> tuple[Leadership | None, Decision | None]:
        """Votes and waits in line: (leadership, None) once elected; (None, the decision)
        when voting failed; (None, None) when stopped or refused for a rival ahead."""
        elector = self.elector
        campaign = asyncio.ensure_future(elector.campaign())
        stop = asyncio.ensure_future(self._stop.wait())
        rival = asyncio.ensure_future(self.rival_ahead())
        other = asyncio.ensure_future(self.other_leader_appears())
        try:
            await asyncio.wait([campaign, stop, rival, other], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            rival.cancel()
            other.cancel()
            await asyncio.gather(stop, return_exceptions=True)
            if not campaign.done():  # stopped, a rival's vote ahead, or the other election
                campaign.cancel()
                await asyncio.gather(campaign, return_exceptions=True)
            await asyncio.gather(rival, other, return_exceptions=True)
        if campaign.cancelled():
            if rival.done() and not rival.cancelled() and rival.exception() is None:
                self._decide(DuplicateIdentity(rival.result()))
            elif other.done() and not other.cancelled() and other.exception() is None:
                self.defer_to(other.result())
            return None, None
        error = campaign.exception()
        if error is not None:
            return None, self._decide(CampaignFailed(f"{type(error).__name__}: {error}"))
        try:  # elected: one last look, so no leader work starts beside another election's
            holder, _ = await self._watch_other()
        except StoreUnavailableError as exc:
            return None, self._decide(CampaignFailed(f"{type(exc).__name__}: {exc}"))
        if holder is not None:
            await elector.resign()  # out of our election before saying so
            self.defer_to(holder)
            return None, None
        return campaign.result(), None

    async def rival_ahead(self) -> str:
        """Returns the first vote of another session, with our identity, ahead of ours."""
        while True:
            rivals, changed = await self._must(self.elector.rivals)
            ahead = self.elector.ahead_of_us(rivals)
            if ahead:
                return ahead[0]
            await changed.wait()

    async def other_leader_appears(self) -> ElectionHolder:
        """Returns the live holder of the other driver's election once there is one."""
        while True:
            holder, changed = await self._must(self._watch_other)
            if holder is not None:
                return holder
            await changed.wait()

    # --- while leading ----------------------------------------------------------------

    async def watch_vote(self, leadership: Leadership) -> None:
        """Returns when our vote is gone or no longer first in line.

        Both are watched: our vote (gone after a reconnect of the same session, or
        deleted by hand) and the election's votes. A vote that BookKeeper's order puts
        ahead of ours (a foreign `V_1`, a hand-made name) makes its holder the auditor
        for every Java node and for `whoisauditor`; leading on would be a second auditor,
        so leadership ends by the same rule that won it (issue 30). Sequences only grow,
        so a rival's ordinary vote never lands ahead of a leader's."""
        store, elector = self.store, self.elector

        async def look() -> tuple[bool, asyncio.Event, asyncio.Event]:
            stat, changed = await store.exists_watched(leadership.vote_path)
            _, votes_changed = await store.get_children_watched(elector.path)
            leading = stat is not None and await elector.still_leading(leadership)
            return leading, changed, votes_changed

        while True:
            # While disconnected nothing can be read; a session that survives the
            # outage keeps its vote, and a lost one ends leadership elsewhere (LOST).
            await self._connected.wait()
            try:
                leading, changed, votes_changed = await self._must(look)
            except NoNodeError:
                return  # the election's node itself is gone: so is our vote
            if not leading:
                return
            await until_any(changed, votes_changed)

    # --- reads ------------------------------------------------------------------------

    async def _watch_other(self) -> tuple[ElectionHolder | None, asyncio.Event]:
        return await watch_other_election(self.store, self.root, self.driver)

    async def _must(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`'s result, however many outages it takes (only cancellation ends it)."""
        result = await when_available(call, self._connected)
        assert result is not None  # without `stop`, only a result returns
        return result
