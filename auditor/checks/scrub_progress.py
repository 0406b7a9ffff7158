"""The daemon's deep scrub goes round the whole cluster once an interval (seven days by
default), through leader changes, and must neither start over nor read a ledger twice when
the leader changes; what it has done must fit in one small record whatever the cluster's
size. What to read next, when a cycle ends and how fast to read are rules, kept here without
clock or I/O so that tests can replay them; `scrub_progress_store` keeps the record.

The deep scrub's progress through a cycle, and the pace that ends the cycle in time.

The record (`ScrubProgress`) is a cycle's number, the wall-clock time it started, a cursor
(a ledger id) and a few counts: its size does not depend on how many ledgers there are.
Within a cycle the scrub reads ledgers in id order from the cursor, a chunk at a time,
and moves the cursor past each chunk once every ledger of it has been judged.

Invariant: every ledger whose id is below `cursor`, and that was closed and not marked
under-replicated when the scrub reached it, was verified at or after `started`; `finished`
is set only by a walk from the cursor that found no ledger left; a new cycle starts no
sooner than `started + interval`. So no ledger is read twice in one cycle (save the chunk
in flight when a leader stops, which its successor reads again: `chunk` ledgers at most),
and cycles start at least an interval apart.

Least recently verified first follows from the cursor: the ledgers at or above it were
last verified in the previous cycle, in id order, so the one the cursor reaches first
is the one verified longest ago (a ledger never verified is read in its id's turn).

Ledgers created during a cycle: BookKeeper's id generator hands out increasing ids, so a
new ledger is nearly always above the cursor and is read in this cycle, once closed. A
ledger below the cursor when it appears (a client-chosen id), or still open when the
cursor passed it (skipped as open), waits for the next cycle: it is verified at most two
intervals after it closed. A deleted ledger is simply not met again.

The pace: the byte budget `scrub.bytes_per_second` is a ceiling per bookie. Within it, the
rate is what spreads the bytes left over the time left: the previous cycle's bytes (the
best estimate of the cluster's) less this cycle's so far, over the seconds until
`started + interval`, over the bookies. It is recomputed before every chunk, so a scrub
that fell behind reads faster and one ahead reads slower. Without a previous cycle (the
first) or once behind the estimate or the interval, the scrub reads at the ceiling.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

__all__ = [
    "FORMAT",
    "MAX_RECORD_BYTES",
    "MIN_RATE",
    "ProgressFormatError",
    "Read",
    "Rest",
    "ScrubProgress",
    "advance",
    "decode",
    "encode",
    "expected_end",
    "finish",
    "next_step",
    "pace",
    "verified_share",
]

#: The record's format number (a record of another is unusable: the cycle starts afresh).
FORMAT: Final = 1
#: A record longer than this is not ours (ours is about 150 bytes).
MAX_RECORD_BYTES: Final = 4096
#: The slowest pace, bytes per second per bookie: below it a large entry would wait minutes
#: for a budget that buys nothing (the cycle ends early and rests instead).
MIN_RATE: Final = 64 * 1024.0
#: Ledger ids are 0..2^63-1; the cursor may stand one past the last.
_CURSOR_MAX: Final = 2**63


class ProgressFormatError(ValueError):
    """The stored record does not decode as ours."""


@dataclass(frozen=True, slots=True)
class ScrubProgress:
    """Where the scrub stands in its cycle (see the module for what each field promises)."""

    #: The cycle's number, from 1.
    cycle: int
    #: Unix time the cycle started.
    started: float
    #: Every ledger with a smaller id was scrubbed in this cycle.
    cursor: int = 0
    #: Payload bytes verified in this cycle (every verified copy counted).
    bytes: int = 0
    #: Ledgers judged in this cycle.
    ledgers: int = 0
    #: The bytes the last complete cycle verified (0: no cycle completed yet).
    previous_bytes: int = 0
    #: Unix time the cycle's walk found no ledger left; None while it goes on.
    finished: float | None = None


@dataclass(frozen=True, slots=True)
class Rest:
    """Nothing to read until `until` (unix time): the cycle is done and the interval runs."""

    until: float


@dataclass(frozen=True, slots=True)
class Read:
    """Scrub from `progress.cursor`; `new` when this starts a cycle (the record to write)."""

    progress: ScrubProgress
    new: bool = False


def encode(p: ScrubProgress) -> bytes:
    """The record's bytes: compact JSON with its format number."""
    return json.dumps({"format": FORMAT, **asdict(p)}, separators=(",", ":")).encode()


def _int(doc: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = doc.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ProgressFormatError(f"{key} must be an integer in {lo}..{hi}, got {v!r}")
    return v


def _time(doc: dict[str, Any], key: str) -> float:
    v = doc.get(key)
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v < 1e11:
        raise ProgressFormatError(f"{key} must be a unix time, got {v!r}")
    return float(v)


def decode(data: bytes) -> ScrubProgress:
    """The record in `data`, checked field by field (the store is untrusted)."""
    if len(data) > MAX_RECORD_BYTES:
        raise ProgressFormatError(f"{len(data)} bytes, more than a record's {MAX_RECORD_BYTES}")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProgressFormatError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProgressFormatError("not a JSON object")
    if doc.get("format") != FORMAT:
        raise ProgressFormatError(f"format {doc.get('format')!r}, not {FORMAT}")
    big = 2**63 - 1
    finished = None if doc.get("finished") is None else _time(doc, "finished")
    return ScrubProgress(
        cycle=_int(doc, "cycle", 1, big),
        started=_time(doc, "started"),
        cursor=_int(doc, "cursor", 0, _CURSOR_MAX),
        bytes=_int(doc, "bytes", 0, big),
        ledgers=_int(doc, "ledgers", 0, big),
        previous_bytes=_int(doc, "previous_bytes", 0, big),
        finished=finished,
    )


def next_step(p: ScrubProgress | None, now: float, interval: float) -> Read | Rest:
    """What to do now: read from the cursor, start the next cycle, or rest.

    No record (or an unusable one): the first cycle starts now. A finished cycle rests
    until an interval after it started, then the next starts at cursor 0, carrying the
    finished cycle's bytes as the estimate of the next one's.
    """
    if p is None:
        return Read(ScrubProgress(cycle=1, started=now), new=True)
    if p.finished is None:
        return Read(p)
    due = p.started + interval
    if now < due:
        return Rest(due)
    return Read(ScrubProgress(cycle=p.cycle + 1, started=now, previous_bytes=p.bytes), new=True)


def advance(p: ScrubProgress, last_id: int, bytes_verified: int, ledgers: int) -> ScrubProgress:
    """After a chunk whose walk went up to `last_id` (every ledger up to it judged)."""
    return replace(
        p,
        cursor=max(p.cursor, min(last_id + 1, _CURSOR_MAX)),
        bytes=p.bytes + bytes_verified,
        ledgers=p.ledgers + ledgers,
    )


def finish(
    p: ScrubProgress, now: float, last_id: int | None, bytes_verified: int, ledgers: int
) -> ScrubProgress:
    """After a chunk whose walk found no ledger left (`last_id`: the last it found, None:
    none): the cycle is complete."""
    done = p if last_id is None else advance(p, last_id, 0, 0)
    return replace(done, bytes=p.bytes + bytes_verified, ledgers=p.ledgers + ledgers, finished=now)


def pace(p: ScrubProgress, now: float, interval: float, ceiling: float, bookies: int) -> float:
    """Bytes per second per bookie for the next chunk (0: no budget; see the module).

    Never above `ceiling` (when it is > 0); `MIN_RATE` at least (or the ceiling when that
    is lower).
    """
    left_s = p.started + interval - now
    left_bytes = p.previous_bytes - p.bytes
    if p.previous_bytes <= 0 or bookies <= 0 or left_s <= 0 or left_bytes <= 0:
        return ceiling
    need = max(MIN_RATE, left_bytes / left_s / bookies)
    return need if ceiling <= 0 else min(ceiling, need)


def verified_share(p: ScrubProgress, max_ledger_id: int | None) -> float:
    """The share of the cluster verified in this cycle, 0..1.

    By bytes against the previous cycle's when there was one; in the first cycle, by the
    cursor against the highest ledger id handed out (`max_ledger_id`, None: unknown).
    """
    if p.finished is not None:
        return 1.0
    if p.previous_bytes > 0:
        return min(1.0, p.bytes / p.previous_bytes)
    if max_ledger_id is None or max_ledger_id < 0:
        return 0.0
    return min(1.0, p.cursor / (max_ledger_id + 1))


def expected_end(p: ScrubProgress, now: float, share: float) -> float | None:
    """When the cycle should end, at the rate it went so far (None: nothing to go by yet)."""
    if p.finished is not None:
        return p.finished
    if share <= 0 or now <= p.started:
        return None
    return p.started + (now - p.started) / share
