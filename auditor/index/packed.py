"""The index holds every ledger of the cluster in memory, so the per-ledger cost is the
design constraint (target: at most 200 bytes per ledger with the dict around it), and a
`LedgerMetadata` object with its tuples and strings is several hundred bytes alone.

One ledger's metadata packed into a short `bytes`, bookie ids and passwords interned.

Packed, a closed E=3 ledger with one ensemble is 61 bytes of
payload. Bookie ids repeat across millions of ledgers, so each is stored once
in an `Interner` and referred to by a 16-bit number; so are passwords (Pulsar
uses one per cluster) and error reasons.

What is kept is what the checks read. Custom metadata is not (no check uses
it; it can be large); the records rebuilt from here carry none.

Layout (little-endian): a fixed header, then per segment its first entry id
and `ensemble_size` bookie numbers. An undecodable ledger is a short record
with the error flag and its reason's number.
"""

from __future__ import annotations

import struct

from auditor.errors import AuditorError
from auditor.metadata.model import DigestType, LedgerMetadata, LedgerState, Segment

# version, format, state, E, W, A, digest, flags, password#, last entry, length, ctime,
# ctoken, segments
HEADER = struct.Struct("<iBBBBBBBHqqqqH")
_ERROR = struct.Struct("<iBH")  # version, flags (error bit), reason#
_FIRST = struct.Struct("<q")
CTIME_STORED = 1
HAS_CTOKEN = 2
_ERROR_FLAG = 4
NO_PASSWORD = 0xFFFF
_MAX_INTERNED = 0xFFFE


class IndexCapacityError(AuditorError):
    """More distinct bookie ids (or passwords) than a packed record can number."""


class Interner:
    """Strings (or bytes) stored once, numbered in order of first sight."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.values: list[str | bytes] = []
        self.numbers: dict[str | bytes, int] = {}

    def number(self, value: str | bytes) -> int:
        n = self.numbers.get(value)
        if n is None:
            n = len(self.values)
            if n > _MAX_INTERNED:
                raise IndexCapacityError(f"more than {_MAX_INTERNED} distinct {self.what}")
            self.values.append(value)
            self.numbers[value] = n
        return n

    def __len__(self) -> int:
        return len(self.values)


class Tables:
    """The interned values a set of packed records refers to."""

    def __init__(self) -> None:
        self.bookies = Interner("bookie ids")
        self.passwords = Interner("ledger passwords")
        self.reasons = Interner("error reasons")


def pack(md: LedgerMetadata, version: int, tables: Tables) -> bytes:
    e = md.ensemble_size
    flags = (CTIME_STORED if md.ctime_stored else 0) | (HAS_CTOKEN if md.ctoken is not None else 0)
    password = NO_PASSWORD if md.password is None else tables.passwords.number(md.password)
    parts = [
        HEADER.pack(
            version,
            md.format_version,
            int(md.state),
            e,
            md.write_quorum,
            md.ack_quorum,
            int(md.digest_type) if md.digest_type is not None else 0,
            flags,
            password,
            md.last_entry_id,
            md.length,
            md.ctime,
            md.ctoken or 0,
            len(md.segments),
        )
    ]
    number = tables.bookies.number
    for seg in md.segments:
        if len(seg.bookies) != e:
            # The decoder guarantees this; a record that breaks it cannot be packed.
            raise ValueError(f"ledger {md.ledger_id}: ensemble of {len(seg.bookies)} != {e}")
        parts.append(_FIRST.pack(seg.first_entry_id))
        parts.append(struct.pack(f"<{e}H", *(number(b) for b in seg.bookies)))
    return b"".join(parts)


def pack_error(reason: str, version: int, tables: Tables) -> bytes:
    return _ERROR.pack(version, _ERROR_FLAG, tables.reasons.number(reason))


def is_error(record: bytes) -> bool:
    return len(record) == _ERROR.size


def version_of(record: bytes) -> int:
    version: int = struct.unpack_from("<i", record)[0]
    return version


def error_of(record: bytes, tables: Tables) -> str:
    _, _, reason = _ERROR.unpack(record)
    return str(tables.reasons.values[reason])


def unpack(ledger_id: int, record: bytes, tables: Tables) -> LedgerMetadata:
    (
        _version,
        fmt,
        state,
        e,
        w,
        a,
        digest,
        flags,
        password,
        last,
        length,
        ctime,
        ctoken,
        nseg,
    ) = HEADER.unpack_from(record)
    offset = HEADER.size
    bookies = tables.bookies.values
    ensemble = struct.Struct(f"<{e}H")
    segments = []
    for _ in range(nseg):
        (first,) = _FIRST.unpack_from(record, offset)
        offset += _FIRST.size
        numbers = ensemble.unpack_from(record, offset)
        offset += ensemble.size
        segments.append(Segment(first, tuple(str(bookies[n]) for n in numbers)))
    pw = tables.passwords.values[password] if password != NO_PASSWORD else None
    return LedgerMetadata(
        ledger_id=ledger_id,
        format_version=fmt,
        ensemble_size=e,
        write_quorum=w,
        ack_quorum=a,
        state=LedgerState(state),
        segments=tuple(segments),
        last_entry_id=last,
        length=length,
        digest_type=DigestType(digest) if digest else None,
        password=bytes(pw) if pw is not None else None,
        ctime=ctime,
        ctime_stored=bool(flags & CTIME_STORED),
        ctoken=ctoken if flags & HAS_CTOKEN else None,
    )
