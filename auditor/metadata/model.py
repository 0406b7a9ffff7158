"""Ledger metadata is stored in three formats, and nothing past decoding should care which:
the checks, the index and the worker all read one value.

Ledger metadata as the auditor sees it, independent of the stored format.

One immutable value per ledger, holding exactly what BookKeeper's
`LedgerMetadataSerDe` keeps after decoding, plus the format version so that a
re-encode reproduces the stored bytes (BookKeeper keeps a ledger's format
version across updates).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field


class LedgerState(enum.IntEnum):
    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


class DigestType(enum.IntEnum):
    CRC32 = 1
    HMAC = 2
    CRC32C = 3
    DUMMY = 4


#: Entry id BookKeeper uses for "no entry" (an empty or not yet closed ledger).
INVALID_ENTRY_ID = -1


@dataclass(frozen=True, slots=True)
class Segment:
    """One ensemble: the bookies that store entries from `first_entry_id` on."""

    first_entry_id: int
    bookies: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SegmentRange:
    """A segment with its inclusive entry range; `last < first` means empty."""

    first: int
    last: int
    bookies: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return self.last < self.first


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    ledger_id: int
    format_version: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: LedgerState
    segments: tuple[Segment, ...]
    last_entry_id: int = INVALID_ENTRY_ID
    length: int = 0
    digest_type: DigestType | None = None
    password: bytes | None = None
    #: Creation time in ms: stored in the metadata, else the znode ctime, else -1.
    ctime: int = -1
    #: Whether ctime is part of the stored metadata (and so re-encoded).
    ctime_stored: bool = False
    ctoken: int | None = None
    custom_metadata: tuple[tuple[str, bytes], ...] = field(default=())

    @property
    def closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def summary_json(self) -> dict[str, object]:
        """The scalar fields every JSON view of a ledger shows (`ledgers --json`, `explain`);
        each view adds its own path, ensembles and custom-metadata encoding. No password."""
        return {
            "format_version": self.format_version,
            "state": self.state.name,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "digest_type": self.digest_type.name if self.digest_type is not None else None,
            "ctime": self.ctime,
        }

    def bookies(self) -> set[str]:
        """Every bookie of every segment (historical ensembles included)."""
        return {b for s in self.segments for b in s.bookies}

    def segment_ranges(self) -> Iterator[SegmentRange]:
        """Segments with their entry ranges, following BookKeeper's rules.

        Segment k covers [first_k, first_{k+1} - 1]; the last one ends at
        `last_entry_id` (so for a ledger that is not closed, the last segment is
        empty as far as a closed-ledger check is concerned).
        """
        for k, seg in enumerate(self.segments):
            if k + 1 < len(self.segments):
                last = self.segments[k + 1].first_entry_id - 1
            else:
                last = self.last_entry_id
            yield SegmentRange(seg.first_entry_id, last, seg.bookies)
