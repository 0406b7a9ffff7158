"""The replication worker changes ledger metadata that other processes write too, and must
neither lose their changes nor let them lose its own, nor write once its lock is gone.

Versioned updates of a ledger's metadata, as BookKeeper's `MetadataUpdateLoop` makes them.

The ledger's writer adds ensembles and closes it, a recoverer closes it, another
worker replaces bookies. A change is therefore a transform of the metadata, applied to
what the metadata store holds now and written with that znode's version; when the
version moved (someone else wrote), the metadata is read again and the
transform applied again to the fresh copy, so the other change is kept and
ours lands on top of it. A transform that finds nothing left to do (someone
already did it) writes nothing.

The bytes are those Java's `LedgerMetadataSerDe` writes, in the ledger's own
format version (an update never upgrades a ledger's format, as
`LedgerMetadataBuilder.from` keeps it); a v2 ledger also keeps the TextFormat
escaping of the Java release that wrote it, where the two differ (0x07 and 0x0b
in a password). The write goes through a fenced view of the store (the
replication lock), so a worker that lost its lock cannot commit.

Unlike Java's loop, attempts are bounded: a ledger rewritten by others on
every attempt is a conflict to report, not a reason to spin.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from auditor.errors import AuditorError, NotFoundError
from auditor.metadata.model import LedgerMetadata, LedgerState
from auditor.metadata.serde import (
    FORMAT_VERSION_2,
    LedgerMetadataFormatError,
    decode_ledger_metadata,
    encode_ledger_metadata,
)
from auditor.metadata.textformat import DEFAULT_STYLE, EscapeStyle
from auditor.store import BadVersionError, MetadataStore, NoNodeError, Stat

#: A change to a ledger's metadata: the new metadata, or None when there is nothing to do.
Transform = Callable[[LedgerMetadata], LedgerMetadata | None]

DEFAULT_ATTEMPTS = 16


class LedgerUpdateError(AuditorError):
    """A ledger's metadata could not be updated."""


class LedgerDeletedError(LedgerUpdateError, NotFoundError):
    """The ledger's metadata znode is gone: the ledger was deleted."""

    def __init__(self, ledger_id: int, path: str) -> None:
        super().__init__(f"ledger {ledger_id} was deleted ({path} is gone)")
        self.ledger_id = ledger_id
        self.path = path


class ConcurrentUpdateError(LedgerUpdateError):
    """Others rewrote the ledger's metadata between each of our reads and writes."""


class EnsembleConflictError(LedgerUpdateError):
    """A replacement bookie is already another member of the segment's ensemble."""


@dataclass(frozen=True, slots=True)
class UpdateResult:
    """`metadata` and `version` as the store holds them after the update: what we
    wrote (`written`), or what we found when there was nothing to do."""

    written: bool
    metadata: LedgerMetadata
    version: int


async def update_ledger(
    fenced_store: MetadataStore,
    store: MetadataStore,
    path: str,
    ledger_id: int,
    transform: Transform,
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    before_write: Callable[[], object] | None = None,
    known: tuple[bytes, Stat] | None = None,
) -> UpdateResult:
    """Applies `transform` to the ledger's metadata at `path` and writes the result with a
    version check, reading with `store` and writing with `fenced_store`; on a concurrent write,
    reads again and re-applies, up to `attempts` times.

    `before_write` is called after each read, right before its write, and stops the
    write by raising: the caller's last look at its right to write (the replication
    lock's session, `ReplicationQueue.fenced`). Looked at before the read only, a
    session that ended while the read was answered (and a lock another worker took
    meanwhile, at the same version as ours) would let the write through.

    LedgerDeletedError when the ledger is gone; FencedOutError (from `fenced_store`) when the
    fence is; ConcurrentUpdateError when every attempt met another write;
    LedgerMetadataFormatError when the stored metadata does not decode; what
    `before_write` raises.

    `known` is the node's (data, stat) as the caller read it moments before (under the
    same lock): a first write is tried from it rather than after reading again, one
    round trip less per ledger. Only a write is taken from it: its version check makes
    it as safe as a fresh read (had the node moved, it fails, and the attempts that
    follow read as usual); any other outcome (nothing to write, a transform that
    refuses) is decided again on a fresh read. That try is not one of `attempts`.
    """
    if known is not None:
        data, stat = known
        with contextlib.suppress(LedgerUpdateError, BadVersionError):
            written = await _write(
                fenced_store, path, ledger_id, transform, data, stat, before_write
            )
            if written is not None:
                return written
    for _ in range(max(1, attempts)):
        try:
            data, stat = await store.get(path)
        except NoNodeError:
            raise LedgerDeletedError(ledger_id, path) from None
        try:
            current = decode_ledger_metadata(data, ledger_id, int(stat.ctime))
        except LedgerMetadataFormatError as exc:
            raise LedgerMetadataFormatError(ledger_id, f"{path}: {exc.reason}") from exc
        wanted = transform(current)
        if wanted is None or wanted == current:
            return UpdateResult(False, current, int(stat.version))
        try:
            return await _write_wanted(
                fenced_store, path, ledger_id, current, wanted, data, stat, before_write
            )
        except BadVersionError:
            continue
    raise ConcurrentUpdateError(
        f"ledger {ledger_id}: {path} was rewritten by others on each of {attempts} attempts"
    )


async def _write(
    fenced_store: MetadataStore,
    path: str,
    ledger_id: int,
    transform: Transform,
    data: bytes,
    stat: Stat,
    before_write: Callable[[], object] | None,
) -> UpdateResult | None:
    """The write `transform` makes of (`data`, `stat`) as read before; None when it makes
    none. BadVersionError when the node moved since."""
    current = decode_ledger_metadata(data, ledger_id, int(stat.ctime))
    wanted = transform(current)
    if wanted is None or wanted == current:
        return None
    return await _write_wanted(
        fenced_store, path, ledger_id, current, wanted, data, stat, before_write
    )


async def _write_wanted(
    fenced_store: MetadataStore,
    path: str,
    ledger_id: int,
    current: LedgerMetadata,
    wanted: LedgerMetadata,
    data: bytes,
    stat: Stat,
    before_write: Callable[[], object] | None,
) -> UpdateResult:
    """`wanted` written over `current` (read as `data` at `stat`), version-checked.
    BadVersionError when the node moved since; LedgerDeletedError when it is gone."""
    version = int(stat.version)
    # The ledger's own format, whatever the transform built.
    wanted = dataclasses.replace(wanted, format_version=current.format_version)
    encoded = encode_ledger_metadata(wanted, text_style=_style_of(current, data))
    if before_write is not None:
        before_write()
    try:
        await fenced_store.set(path, encoded, version)
    except NoNodeError:
        raise LedgerDeletedError(ledger_id, path) from None
    return UpdateResult(True, wanted, version + 1)


def _style_of(md: LedgerMetadata, data: bytes) -> EscapeStyle:
    """The TextFormat escaping the stored v2 bytes were written with (ours by default)."""
    if md.format_version != FORMAT_VERSION_2:
        return DEFAULT_STYLE
    others = [s for s in EscapeStyle if s is not DEFAULT_STYLE]
    for style in (DEFAULT_STYLE, *others):
        with contextlib.suppress(LedgerMetadataFormatError):
            if encode_ledger_metadata(md, text_style=style) == data:
                return style
    return DEFAULT_STYLE


def replace_bookies(segment_first_entry: int, replacements: Mapping[str, str]) -> Transform:
    """The transform of a fragment's commit: in the segment starting at
    `segment_first_entry`, each old bookie of `replacements` becomes its new one, at its
    position; nothing else changes (state, last entry, length, quorums, password, digest,
    custom metadata, ctime, cToken, the other segments).

    Nothing to do (None) when the segment holds none of the old bookies any more
    (someone already replaced them), and when no segment starts there any more: segment
    keys are only ever added, so a missing key means the metadata is not the one the
    copy was planned on; writing bookies into another segment could name a bookie for
    entries it never received. The caller's verification re-judges the ledger from the
    fresh metadata. EnsembleConflictError when a new bookie is already another member of
    the segment (two positions cannot share a bookie; the copy must be planned again).
    """
    wanted = dict(replacements)

    def transform(md: LedgerMetadata) -> LedgerMetadata | None:
        keys = [seg.first_entry_id for seg in md.segments]
        if segment_first_entry not in keys:
            return None
        k = keys.index(segment_first_entry)
        seg = md.segments[k]
        if not any(b in wanted for b in seg.bookies):
            return None
        bookies = tuple(wanted.get(b, b) for b in seg.bookies)
        twice = sorted({b for b in bookies if bookies.count(b) > 1})
        if twice:
            raise EnsembleConflictError(
                f"ledger {md.ledger_id}: replacing {wanted} in segment {segment_first_entry} "
                f"{list(seg.bookies)} would name {', '.join(twice)} twice"
            )
        segments = (
            *md.segments[:k],
            dataclasses.replace(seg, bookies=bookies),
            *md.segments[k + 1 :],
        )
        return dataclasses.replace(md, segments=segments)

    return transform


def begin_recovery() -> Transform:
    """OPEN -> IN_RECOVERY, the first step of a recovery open (nothing to do when the
    ledger is already in recovery or closed)."""

    def transform(md: LedgerMetadata) -> LedgerMetadata | None:
        if md.state is not LedgerState.OPEN:
            return None
        return dataclasses.replace(md, state=LedgerState.IN_RECOVERY)

    return transform


def close_ledger(last_entry_id: int, length: int) -> Transform:
    """The close of a recovered ledger, as Java's `closeRecovered`: IN_RECOVERY -> CLOSED
    with `last_entry_id` and `length`; nothing to do when the ledger is not in recovery
    (closed by another recoverer or its writer: the caller reads what they closed it with
    from the result; still OPEN: recovery was never begun, and closing it unfenced would
    cut off its writer). `last_entry_id` -1 with `length` 0 closes an empty ledger."""
    if last_entry_id < -1 or length < 0 or (last_entry_id == -1 and length != 0):
        raise LedgerUpdateError(f"cannot close at last entry {last_entry_id} with length {length}")

    def transform(md: LedgerMetadata) -> LedgerMetadata | None:
        if md.state is not LedgerState.IN_RECOVERY:
            return None
        return dataclasses.replace(
            md, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length
        )

    return transform
