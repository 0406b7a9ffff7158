"""The two auditor elections a BookKeeper cluster may run, read as their Java owners write them.

BookKeeper's own ZooKeeper driver elects with ephemeral-sequential votes under
`<root>/underreplication/auditorelection` (TextFormat `AuditorVoteFormat`; the lowest
sequence, the number after the first "V_", leads). Pulsar's metadata driver
(`metadata-store:`) elects with one ephemeral key, `<root>/underreplication/leader`,
whose value is the leader's bookie id as a JSON string (Jackson's `writeValueAsBytes`
of a `String`: UTF-8 with the quotes, no newline). Neither election sees the other, so
a cluster whose nodes disagree on the driver runs two auditors; the daemon and
`whoisauditor` read both through this module (`held_elections`: every election that has a
holder, as the shell's commands name it).

BookKeeper's own etcd driver has no election (nor anything that would act on one:
no under-replication manager, apache/bookkeeper#3441); our auditors on it elect with a
leader key of our own, `<scope>/bk-auditor/leader`, kept as Pulsar keeps its key (an
ephemeral key on the session's lease, the id as a JSON string), and there is no other
driver's election to watch.

"Live" means held by a session: a vote or a leader key that is not ephemeral is
nobody's (BookKeeper and Pulsar only ever write ephemeral ones), so it is named
but never taken for a leader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from auditor.errors import AuditorError
from auditor.metadata.records import RecordFormatError, decode_auditor_vote
from auditor.metadata.service_uri import MetadataDriver
from auditor.store import MetadataStore, NoNodeError

BOOKKEEPER_ELECTION = "underreplication/auditorelection"
PULSAR_LEADER = "underreplication/leader"
#: Our own leader key on BookKeeper's etcd driver (no Java node has an election there).
ETCD_LEADER = "bk-auditor/leader"
#: How often a reader looks again when the first vote vanishes as it reads it.
_ATTEMPTS = 5


def bookkeeper_election_path(root: str) -> str:
    return f"{root.rstrip('/')}/{BOOKKEEPER_ELECTION}"


def pulsar_leader_path(root: str) -> str:
    return f"{root.rstrip('/')}/{PULSAR_LEADER}"


def leader_key_path(driver: MetadataDriver, root: str) -> str:
    """The leader key of a driver that elects with one (Pulsar's, or ours on etcd)."""
    if driver is MetadataDriver.ETCD:
        return f"{root.rstrip('/')}/{ETCD_LEADER}"
    return pulsar_leader_path(root)


def election_path_of(driver: MetadataDriver, root: str) -> str:
    """The node a driver's election lives at (the votes' parent, or the leader key)."""
    if driver is MetadataDriver.BOOKKEEPER:
        return bookkeeper_election_path(root)
    return leader_key_path(driver, root)


def vote_sequence(name: str) -> int | None:
    """The number after the first "V_", as BookKeeper's ElectionComparator reads it."""
    _, sep, rest = name.partition("V_")
    return int(rest) if sep and rest.isascii() and rest.isdigit() else None


def ordered_votes(children: list[str]) -> list[str]:
    """Votes, lowest sequence (the auditor) first; other names are not votes."""
    votes = [(seq, c) for c in children if (seq := vote_sequence(c)) is not None]
    return [c for _, c in sorted(votes)]


def encode_pulsar_leader(bookie_id: str) -> bytes:
    """The leader key's value as Pulsar writes it: the id as a JSON string, UTF-8."""
    return json.dumps(bookie_id, ensure_ascii=False).encode("utf-8")


def decode_pulsar_leader(data: bytes) -> str:
    """The bookie id in a leader key, or RecordFormatError."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RecordFormatError("Pulsar leader key", f"not a JSON string: {data[:60]!r}") from exc
    if not isinstance(value, str):
        raise RecordFormatError("Pulsar leader key", f"not a JSON string: {data[:60]!r}")
    return value


@dataclass(frozen=True, slots=True)
class ElectionHolder:
    """Who holds an election: the znode, the id it names, the session that owns it."""

    election: MetadataDriver
    path: str
    #: The bookie id the vote or key names; None when its bytes do not decode.
    auditor: str | None
    #: The owning session (`ephemeralOwner`); 0 for a persistent node (nobody's).
    session: int
    #: Why `auditor` is None, when it is.
    error: str = ""

    @property
    def live(self) -> bool:
        return self.session != 0


async def pulsar_holder(
    store: MetadataStore, root: str, driver: MetadataDriver = MetadataDriver.PULSAR
) -> ElectionHolder | None:
    """The leader key of Pulsar's election (or of ours on etcd: `driver`), or None when
    there is none. Writes nothing."""
    path = leader_key_path(driver, root)
    try:
        data, stat = await store.get(path)
    except NoNodeError:
        return None
    try:
        auditor: str | None = decode_pulsar_leader(data)
        error = ""
    except RecordFormatError as exc:
        auditor, error = None, str(exc)
    return ElectionHolder(driver, path, auditor, int(stat.ephemeralOwner), error)


async def bookkeeper_holder(
    store: MetadataStore, root: str, *, live_only: bool = False
) -> ElectionHolder | None:
    """The first vote of BookKeeper's election, or None when there is none. Writes nothing.

    With `live_only`, votes that no session owns are passed over (they lead nobody).
    """
    path = bookkeeper_election_path(root)
    for _ in range(_ATTEMPTS):
        try:
            votes = ordered_votes(await store.get_children(path))
        except NoNodeError:
            return None
        vanished = False
        for vote in votes:
            try:
                data, stat = await store.get(f"{path}/{vote}")
            except NoNodeError:
                vanished = True
                break  # the auditor just left: look again
            session = int(stat.ephemeralOwner)
            if live_only and session == 0:
                continue
            try:
                auditor, error = decode_auditor_vote(data), ""
            except RecordFormatError as exc:
                auditor, error = None, str(exc)
            return ElectionHolder(
                MetadataDriver.BOOKKEEPER, f"{path}/{vote}", auditor, session, error
            )
        if not vanished:
            return None
    return None


async def holder_of(
    store: MetadataStore, root: str, driver: MetadataDriver, *, live_only: bool = False
) -> ElectionHolder | None:
    """The holder of `driver`'s election (see `pulsar_holder`, `bookkeeper_holder`)."""
    if driver is not MetadataDriver.BOOKKEEPER:
        found = await pulsar_holder(store, root, driver)
        return found if found is None or found.live or not live_only else None
    return await bookkeeper_holder(store, root, live_only=live_only)


def other_driver(driver: MetadataDriver) -> MetadataDriver | None:
    """The election nodes that disagree with us on the driver would run; None on etcd's
    own driver (no Java node runs an auditor there)."""
    if driver is MetadataDriver.ETCD:
        return None
    return MetadataDriver.BOOKKEEPER if driver is MetadataDriver.PULSAR else MetadataDriver.PULSAR


class NoAuditorError(AuditorError):
    """Nobody holds an auditor election."""


async def held_elections(store: MetadataStore, root: str) -> list[ElectionHolder]:
    """The holder of each auditor election that has one: BookKeeper's first vote, then
    Pulsar's leader key, each naming its auditor (the shell's `whoisauditor`).

    Two means the cluster's nodes disagree on the metadata driver (two auditors run).
    Unlike the daemon's reads of one driver's election, a vote or key whose bytes do not
    decode is an error naming its path (RecordFormatError), and none at all is
    NoAuditorError, saying whether an election ever ran here.
    """
    found: list[ElectionHolder] = []
    for driver in (MetadataDriver.BOOKKEEPER, MetadataDriver.PULSAR):
        holder = await holder_of(store, root, driver)
        if holder is None:
            continue
        if holder.auditor is None:
            what = "auditor vote" if driver is MetadataDriver.BOOKKEEPER else "Pulsar leader key"
            reason = holder.error or "names no auditor"
            raise RecordFormatError(what, f"{holder.path}: {reason}")
        found.append(holder)
    if not found:
        votes, key = bookkeeper_election_path(root), pulsar_leader_path(root)
        if await store.exists(votes) is None:
            raise NoAuditorError(
                f"no auditor elected: {votes} does not exist and there is no Pulsar leader "
                f"key {key} (auto-recovery never ran here)"
            )
        raise NoAuditorError(f"no auditor elected: no vote under {votes} and no key {key}")
    return found


async def first_held_election(store: MetadataStore, root: str) -> tuple[str, str]:
    """(vote or key path, auditor id) of the first of `held_elections`: the auditor a
    shell command such as `triggeraudit` speaks of, whichever election it holds."""
    holder = (await held_elections(store, root))[0]
    return holder.path, holder.auditor or ""
