"""Which bookies must hold entry `e` of a segment is asked by the checks, the worker and the
test writers alike, and all of them must answer by the one formula BookKeeper's client
writes by.

BookKeeper's round-robin distribution schedule, per entry.

Entry `e` of a segment with ensemble size E and write quorum W goes to the
bookies at indexes `(e + k) mod E` for k in 0..W-1, in that order (the
`WriteSetImpl` formula, which does not overflow for ids >= 2^31). The
availability codec answers the same question arithmetically for ranges; this
per-entry form is for writers that send one entry at a time.
"""

from __future__ import annotations


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    if not 1 <= write_quorum <= ensemble_size:
        raise ValueError(
            f"need 1 <= write quorum <= ensemble size, got {write_quorum}/{ensemble_size}"
        )
    if entry_id < 0:
        raise ValueError(f"entry id must be >= 0, got {entry_id}")
    return [(entry_id + k) % ensemble_size for k in range(write_quorum)]


def stores_entry(bookie_index: int, entry_id: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether the bookie at `bookie_index` is in the write set of `entry_id`."""
    return (bookie_index - entry_id) % ensemble_size < write_quorum


def run_offset(ensemble_size: int, write_quorum: int, index: int) -> int:
    """Residue where this index's runs of W stored entries start (each E entries)."""
    return (index - write_quorum + 1) % ensemble_size


def first_stored(
    first: int, last: int, ensemble_size: int, write_quorum: int, index: int
) -> int | None:
    """The smallest entry of `[first, last]` stored at `index`, or None."""
    if last < first:
        return None
    d = (first - run_offset(ensemble_size, write_quorum, index)) % ensemble_size
    e = first if d < write_quorum else first + ensemble_size - d
    return e if e <= last else None


def last_stored(
    first: int, last: int, ensemble_size: int, write_quorum: int, index: int
) -> int | None:
    """The largest entry of `[first, last]` stored at `index`, or None."""
    if last < first:
        return None
    d = (last - run_offset(ensemble_size, write_quorum, index)) % ensemble_size
    e = last if d < write_quorum else last - (d - write_quorum + 1)
    return e if e >= first else None
