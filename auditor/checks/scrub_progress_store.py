"""Only the leader may move the scrub's cursor, and a leader that lost its place must not
write over its successor's: the record's reads and writes go through here, each write
conditional on the version last read. Kept apart from the rules (`scrub_progress`) so
that those stay free of I/O.

The deep scrub's progress record in the metadata store: `<root>/underreplication/bk-auditor-scrub`.

The name: BookKeeper keeps its own znodes under `underreplication/` (`ledgers`, `locks`,
`LAYOUT`, `disable`, `auditorelection`, `lostBookieRecoveryDelay` and the check ctimes),
Pulsar its election key (`leader`); nothing of theirs starts with `bk-auditor-`, and
nothing of BookKeeper's lists that directory's children, so the record is seen by no one
else. Under the ledgers root itself it would sit among the ledger directories, where walks
(ours and Java's) would take it for a stray znode.

Writes go through the store view the daemon's leader holds (fenced on its vote: a leader
that lost its vote cannot write) and are conditional on the version read (`set` with
that version, `create` when there was none): two writers cannot both move the cursor.
A record that does not decode is reported by `read` (`Stored.invalid`) and written over
by the next cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from auditor.checks.scrub_progress import ProgressFormatError, ScrubProgress, decode, encode
from auditor.store import MetadataStore, NoNodeError

__all__ = ["ZNODE", "Stored", "progress_path", "read_progress", "write_progress"]

#: The record's name under `<root>/underreplication`.
ZNODE = "bk-auditor-scrub"


def progress_path(root: str) -> str:
    """Where the record lives, under the ledgers root `root`."""
    return f"{root}/underreplication/{ZNODE}"


@dataclass(frozen=True, slots=True)
class Stored:
    """The record as read: its progress (None: absent or unusable), its version (None:
    absent), and why it is unusable (None: it is not)."""

    progress: ScrubProgress | None
    version: int | None
    invalid: str | None = None
    data: bytes = b""


async def read_progress(store: MetadataStore, root: str) -> Stored:
    """The record and its version."""
    try:
        data, stat = await store.get(progress_path(root))
    except NoNodeError:
        return Stored(None, None)
    try:
        return Stored(decode(data), stat.version, data=data)
    except ProgressFormatError as exc:
        return Stored(None, stat.version, str(exc), data)


async def write_progress(
    store: MetadataStore, root: str, progress: ScrubProgress, version: int | None
) -> int:
    """Writes `progress` over the record at `version` (None: there is none); returns the new
    version. A record changed meanwhile raises the store's BadVersionError (absent: its
    NodeExistsError); the caller reads it again."""
    path = progress_path(root)
    if version is None:
        await store.create(path, encode(progress), makepath=True)
        return 0
    stat = await store.set(path, encode(progress), version)
    return stat.version
