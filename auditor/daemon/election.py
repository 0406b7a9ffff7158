"""Auditor election on BookKeeper's own path, understood by Java AutoRecovery nodes.

BookKeeper's auditors vote with ephemeral-sequential children of
`<root>/underreplication/auditorelection` named `V_<seq>` whose data is the
TextFormat `AuditorVoteFormat`; the lowest sequence (the number after the
first "V_") leads. We run kazoo's Lock recipe with its node name set to "V_":
our votes are `<uuid>V_<seq>` (kazoo needs the unique prefix to find its node
again after a connection loss; Java reads the number after "V_" and the hex
uuid never contains "V_"), and kazoo orders contenders by the same sequence
number, Java votes included. So a cluster mixing Java AutoRecovery nodes and
these daemons has exactly one auditor.

kazoo's Lock never notices a lost session once it holds the lock, so
leadership is not trusted to it: the daemon watches the connection itself, and
every leader write is fenced on the vote node (`ZkClient.fenced`), so a
leader that lost its session cannot write anything.

Two daemons given the same identity would look like one auditor to BookKeeper's
`whoisauditor` while both act; so a vote of another session carrying our identity
(`Elector.rivals`) makes the daemon refuse to vote, or withdraw a vote that waits
behind it. The session that owns a vote tells them apart (a vote of our own
session is ours, whatever its name).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass

from kazoo.exceptions import CancelledError as KazooCancelled
from kazoo.recipe.lock import Lock

from auditor.metadata.records import RecordFormatError, decode_auditor_vote, encode_auditor_vote
from auditor.zk import NoNodeError, ZkClient

ELECTION = "underreplication/auditorelection"
_VOTE = re.compile(r"V_(\d+)$")


def election_path(root: str) -> str:
    return f"{root.rstrip('/')}/{ELECTION}"


def vote_sequence(name: str) -> int | None:
    """The number after the first "V_", as BookKeeper's ElectionComparator reads it."""
    _, sep, rest = name.partition("V_")
    return int(rest) if sep and rest.isdigit() else None


def ordered_votes(children: list[str]) -> list[str]:
    votes = [(seq, c) for c in children if (seq := vote_sequence(c)) is not None]
    return [c for _, c in sorted(votes)]


async def current_auditor(zk: ZkClient, root: str) -> str | None:
    """Who leads, read exactly as BookKeeper's `getCurrentAuditor` reads it."""
    path = election_path(root)
    try:
        votes = ordered_votes(await zk.get_children(path))
    except NoNodeError:
        return None
    for vote in votes:  # the first one, unless it vanished while we looked
        try:
            data, _ = await zk.get(f"{path}/{vote}")
        except NoNodeError:
            continue
        try:
            return decode_auditor_vote(data)
        except RecordFormatError:
            return None
    return None


class VoteLock(Lock):  # type: ignore[misc]
    """kazoo's Lock with BookKeeper's vote naming."""

    _NODE_NAME = "V_"
    _EXCLUDE_NAMES = ["V_"]


@dataclass(frozen=True, slots=True)
class Leadership:
    """Proof of leadership: our vote node, and a ZooKeeper view fenced on it."""

    vote_path: str
    zk: ZkClient


class Elector:
    def __init__(self, zk: ZkClient, root: str, identity: str) -> None:
        self.zk = zk
        self.root = root.rstrip("/")
        self.identity = identity
        self.path = election_path(root)
        self._lock: VoteLock | None = None

    async def campaign(self) -> Leadership:
        """Votes and waits until this node leads; cancelling withdraws the vote."""
        await self.zk.ensure_path(self.path)
        vote_data = encode_auditor_vote(self.identity).decode()
        lock = VoteLock(self.zk.kazoo, self.path, identifier=vote_data)
        self._lock = lock
        acquiring = asyncio.ensure_future(asyncio.to_thread(lock.acquire))
        try:
            await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            lock.cancel()
            with contextlib.suppress(Exception, KazooCancelled):
                await acquiring
            await self.resign()
            raise
        vote_path = f"{self.path}/{lock.node}"
        stat = await self.zk.exists(vote_path)
        if stat is None:
            await self.resign()
            raise NoNodeError(f"our vote {vote_path} vanished as we were elected")
        fenced = self.zk.fenced(vote_path, int(stat.version))
        # As BookKeeper's leader does, for people reading the election node.
        await fenced.set(self.path, encode_auditor_vote(self.identity))
        return Leadership(vote_path, fenced)

    @property
    def our_sequence(self) -> int | None:
        """Our vote's sequence number while a campaign holds one, else None."""
        lock = self._lock
        node = lock.node if lock is not None else None
        return vote_sequence(node) if isinstance(node, str) else None

    async def rivals(self) -> tuple[list[str], asyncio.Event]:
        """Votes of other sessions carrying our identity (paths, election order), and an
        event set when the votes change.

        A vote of our own session that no campaign holds (a resign that timed out)
        is withdrawn here: left alone, it would stand in line ahead of our next vote.
        """
        await self.zk.ensure_path(self.path)
        children, changed = await self.zk.get_children_watched(self.path)
        session = self.zk.client_id
        found: list[str] = []
        for name in ordered_votes(children):
            path = f"{self.path}/{name}"
            try:
                data, stat = await self.zk.get(path)
            except NoNodeError:
                continue
            if session is not None and int(stat.ephemeralOwner) == session[0]:
                if self._lock is None:
                    with contextlib.suppress(NoNodeError):
                        await self.zk.delete(path)
                continue
            try:
                who = decode_auditor_vote(data)
            except RecordFormatError:
                continue
            if who == self.identity:
                found.append(path)
        return found, changed

    def ahead_of_us(self, rivals: list[str]) -> list[str]:
        """The rivals that precede our vote (all of them while we have none)."""
        ours = self.our_sequence
        if ours is None:
            return rivals
        return [
            r
            for r in rivals
            if (seq := vote_sequence(r.rsplit("/", 1)[-1])) is not None and seq < ours
        ]

    async def still_leading(self, leadership: Leadership) -> bool:
        """After a reconnect: is our vote still there and first in line?"""
        try:
            votes = ordered_votes(await self.zk.get_children(self.path))
        except NoNodeError:
            return False
        return bool(votes) and f"{self.path}/{votes[0]}" == leadership.vote_path

    async def resign(self) -> None:
        """Deletes our vote (if the session still has it), so the next in line leads."""
        lock, self._lock = self._lock, None
        if lock is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.to_thread(lock.release), self.zk.timeout)
