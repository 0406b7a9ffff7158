"""Auditor elections understood by Java AutoRecovery nodes: BookKeeper's and Pulsar's.

**BookKeeper's driver** (`Elector`). Auditors vote with ephemeral-sequential
children of `<root>/underreplication/auditorelection` named `V_<seq>` whose data is
the TextFormat `AuditorVoteFormat`; the lowest sequence (the number after the first
"V_") leads. We run kazoo's Lock recipe with its node name set to "V_": our votes are
`<uuid>V_<seq>` (kazoo needs the unique prefix to find its node again after a
connection loss; Java reads the number after "V_" and the hex uuid never contains
"V_"), and kazoo orders contenders by the same sequence number, Java votes included
(`auditor.zk.votes`: a kazoo recipe, so ZooKeeper only).

**Pulsar's driver** (`PulsarElector`, for `metadata-store:` clusters). Pulsar's
`LeaderElectionImpl` has no votes: one ephemeral key `<root>/underreplication/leader`
holding the leader's bookie id as a JSON string; whoever creates it leads, the others
watch it and try again when it is deleted. We do the same, with one difference: a key
of another session carrying our own identity is not deleted (Pulsar deletes it as its
own stale key); it is a duplicate identity, refused like a vote with our identity, and
it ends by itself when that session expires. So two processes that share an identity
never take the key from each other in turn.

Either way a cluster mixing Java AutoRecovery nodes and these daemons has exactly one
auditor per election. Neither election sees the other, so the daemon also watches the
other one (`watch_other_election`) and stays out of leadership while it has a live
holder: nodes that disagree on the metadata driver would otherwise run two auditors.

kazoo's Lock never notices a lost session once it holds the lock, so leadership is
not trusted to it: the daemon watches the connection itself, and every leader write
is fenced on the vote node or the leader key (`MetadataStore.fenced`), so a leader that
lost its session cannot write anything.

Two daemons given the same identity would look like one auditor to BookKeeper's
`whoisauditor` while both act; so a vote of another session carrying our identity
(`rivals`) makes the daemon refuse to vote, or withdraw a vote that waits behind it.
The session that owns a vote tells them apart (a vote of our own session is ours,
whatever its name).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Protocol

from auditor.metadata.elections import (
    ElectionHolder,
    bookkeeper_election_path,
    bookkeeper_holder,
    decode_pulsar_leader,
    encode_pulsar_leader,
    holder_of,
    leader_key_path,
    ordered_votes,
    other_driver,
    pulsar_holder,
    vote_sequence,
)
from auditor.metadata.records import RecordFormatError, decode_auditor_vote, encode_auditor_vote
from auditor.metadata.service_uri import MetadataDriver
from auditor.store import MetadataStore, NodeExistsError, NoNodeError
from auditor.zk import ZkClient
from auditor.zk.votes import Vote

__all__ = [
    "Elector",
    "ElectorLike",
    "Leadership",
    "PulsarElector",
    "current_auditor",
    "election_path",
    "make_elector",
    "ordered_votes",
    "vote_sequence",
    "watch_election",
    "watch_other_election",
]


def election_path(root: str) -> str:
    """BookKeeper's election directory (the votes' parent)."""
    return bookkeeper_election_path(root)


async def current_auditor(
    store: MetadataStore, root: str, driver: MetadataDriver = MetadataDriver.BOOKKEEPER
) -> str | None:
    """Who leads `driver`'s election, read as BookKeeper's or Pulsar's `getCurrentAuditor`."""
    holder = await holder_of(store, root, driver)
    return holder.auditor if holder is not None else None


@dataclass(frozen=True, slots=True)
class Leadership:
    """Proof of leadership: our vote node, and a view of the metadata store fenced on it."""

    vote_path: str
    store: MetadataStore


class Elector:
    """BookKeeper's vote election: ZooKeeper only (its votes are kazoo's Lock recipe)."""

    def __init__(self, zk: ZkClient, root: str, identity: str) -> None:
        self.zk = zk
        self.root = root.rstrip("/")
        self.identity = identity
        self.path = election_path(root)
        self._lock: Vote | None = None

    async def campaign(self) -> Leadership:
        """Votes and waits until this node leads; cancelling withdraws the vote."""
        await self.zk.ensure_path(self.path)
        vote_data = encode_auditor_vote(self.identity).decode()
        lock = Vote(self.zk, self.path, vote_data, ordered_votes)
        self._lock = lock
        try:
            await lock.won()
        except asyncio.CancelledError:
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
        return vote_sequence(node) if node is not None else None

    async def rivals(self) -> tuple[list[str], asyncio.Event]:
        """Votes of other sessions carrying our identity (paths, election order), and an
        event set when the votes change.

        A vote of our own session that no campaign holds (a resign that timed out)
        is withdrawn here: left alone, it would stand in line ahead of our next vote.
        """
        await self.zk.ensure_path(self.path)
        children, changed = await self.zk.get_children_watched(self.path)
        session = self.zk.session
        found: list[str] = []
        for name in ordered_votes(children):
            path = f"{self.path}/{name}"
            try:
                data, stat = await self.zk.get(path)
            except NoNodeError:
                continue
            if session is not None and int(stat.ephemeralOwner) == session:
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
        await lock.withdraw()


class ElectorLike(Protocol):
    """What the daemon's election loop needs of an election (`Elector`, `PulsarElector`)."""

    identity: str
    #: The znode this election lives at: the votes' parent, or Pulsar's leader key.
    path: str

    async def campaign(self) -> Leadership: ...

    @property
    def our_sequence(self) -> int | None: ...

    async def rivals(self) -> tuple[list[str], asyncio.Event]: ...

    def ahead_of_us(self, rivals: list[str]) -> list[str]: ...

    async def still_leading(self, leadership: Leadership) -> bool: ...

    async def resign(self) -> None: ...


class PulsarElector:
    """Pulsar's LeaderElection on `<root>/underreplication/leader`, as a Java node runs it.

    Nothing is written while another session holds the key: a follower only watches
    it. The key's parent is created (persistent, as Pulsar's store creates parents)
    only if it is missing when we try to take the key. On BookKeeper's own etcd driver
    (`driver` ETCD) the same election runs on our own key, `<scope>/bk-auditor/leader`.
    """

    def __init__(
        self,
        store: MetadataStore,
        root: str,
        identity: str,
        driver: MetadataDriver = MetadataDriver.PULSAR,
    ) -> None:
        self.store = store
        self.root = root.rstrip("/")
        self.identity = identity
        self.path = leader_key_path(driver, root)
        self._value = encode_pulsar_leader(identity)
        self._campaigning = False

    def _session(self) -> int | None:
        return self.store.session

    async def _take(self) -> bool:
        """Creates the key (ephemeral); False when another session was first."""
        try:
            await self.store.create(self.path, self._value, ephemeral=True)
        except NodeExistsError:
            return False
        except NoNodeError:
            parent = self.path.rsplit("/", 1)[0]
            await self.store.ensure_path(parent)
            return False  # look again: the key may have appeared meanwhile
        return True

    async def campaign(self) -> Leadership:
        """Waits until this daemon holds the key; cancelling leaves nothing behind."""
        self._campaigning = True
        try:
            while True:
                stat, changed = await self.store.exists_watched(self.path)
                if stat is None:
                    await self._take()
                    continue  # read it back: leadership is the key owned by our session
                ours = self._session()
                if ours is not None and int(stat.ephemeralOwner) == ours:
                    data, stat = await self.store.get(self.path)
                    if data == self._value:
                        return Leadership(
                            self.path, self.store.fenced(self.path, int(stat.version))
                        )
                    # Our session holds it under another value (Pulsar's rule): replace it.
                    with contextlib.suppress(NoNodeError):
                        await self.store.delete(self.path, version=int(stat.version))
                    continue
                await changed.wait()  # another session leads: wait until its key goes
        except asyncio.CancelledError:
            await self.resign()
            raise
        finally:
            self._campaigning = False

    @property
    def our_sequence(self) -> int | None:
        return None  # no queue: nobody stands behind anybody

    async def rivals(self) -> tuple[list[str], asyncio.Event]:
        """The key, when another session holds it with our identity; an event when it changes."""
        stat, changed = await self.store.exists_watched(self.path)
        if stat is None:
            return [], changed
        ours = self._session()
        if ours is not None and int(stat.ephemeralOwner) == ours:
            return [], changed
        try:
            data, _ = await self.store.get(self.path)
        except NoNodeError:
            return [], changed
        try:
            who = decode_pulsar_leader(data)
        except RecordFormatError:
            return [], changed
        return ([self.path] if who == self.identity else []), changed

    def ahead_of_us(self, rivals: list[str]) -> list[str]:
        """Every rival: a key held by another session is always ahead of us."""
        return rivals

    async def still_leading(self, leadership: Leadership) -> bool:
        stat = await self.store.exists(leadership.vote_path)
        ours = self._session()
        return stat is not None and ours is not None and int(stat.ephemeralOwner) == ours

    async def resign(self) -> None:
        """Deletes the key if our session holds it (the next node takes it at once)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._release(), self.store.timeout)

    async def _release(self) -> None:
        stat = await self.store.exists(self.path)
        ours = self._session()
        if stat is None or ours is None or int(stat.ephemeralOwner) != ours:
            return
        with contextlib.suppress(NoNodeError):
            await self.store.delete(self.path, version=int(stat.version))


def make_elector(
    driver: MetadataDriver, store: MetadataStore, root: str, identity: str
) -> Elector | PulsarElector:
    """The election the cluster's Java nodes use with `driver`."""
    if driver is not MetadataDriver.BOOKKEEPER:
        return PulsarElector(store, root, identity, driver)
    if not isinstance(store, ZkClient):
        raise TypeError(f"BookKeeper's vote election runs on ZooKeeper, not {store.where}")
    return Elector(store, root, identity)


async def watch_election(
    store: MetadataStore, root: str, driver: MetadataDriver, *, live_only: bool = False
) -> tuple[ElectionHolder | None, asyncio.Event]:
    """The holder of `driver`'s election, and an event set when it may have changed.

    Reads and watches only, so a daemon can follow an election it takes no part in
    (or has not voted in yet) without writing anything there.
    """
    if driver is not MetadataDriver.BOOKKEEPER:
        stat, changed = await store.exists_watched(leader_key_path(driver, root))
        if stat is None or (live_only and int(stat.ephemeralOwner) == 0):
            return None, changed
        holder = await pulsar_holder(store, root, driver)
        if holder is not None and live_only and not holder.live:
            holder = None
        return holder, changed
    directory = bookkeeper_election_path(root)
    stat, changed = await store.exists_watched(directory)
    if stat is None:
        return None, changed
    try:
        _, changed = await store.get_children_watched(directory)
    except NoNodeError:
        return None, changed  # gone since: the exists watch fires for its re-creation
    return await bookkeeper_holder(store, root, live_only=live_only), changed


async def watch_other_election(
    store: MetadataStore, root: str, driver: MetadataDriver
) -> tuple[ElectionHolder | None, asyncio.Event]:
    """The live holder of the election `driver` does NOT use (see `watch_election`); on
    etcd's own driver there is none, and the event never fires."""
    other = other_driver(driver)
    if other is None:
        return None, asyncio.Event()
    return await watch_election(store, root, other, live_only=True)
