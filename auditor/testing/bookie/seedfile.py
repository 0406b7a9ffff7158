"""A benchmark's bookie holds 10^5 ledgers in a process of its own; seeding it over the wire
would measure the emulator, and pickling its state would tie the file to the emulator's
internals.

Seed files: a bookie's ledgers written once, loaded by an emulator in a process of its own.

The format is this magic, then per ledger its id and run count (12 bytes), then its
half-open entry runs (16 bytes each), little-endian.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Final

from auditor.errors import FormatError

__all__ = ["SEED_MAGIC", "SeedFileError", "read_seed_file", "write_seed_file"]

#: A seed file: this magic, then per ledger its id and run count, then its runs.
SEED_MAGIC: Final = b"BKEMSEED"
_SEED_LEDGER: Final = struct.Struct("<qI")
_SEED_RUN: Final = struct.Struct("<qq")


class SeedFileError(FormatError):
    """A seed file that is not one `write_seed_file` wrote."""


def write_seed_file(
    path: str | Path, ledgers: Iterable[tuple[int, Sequence[tuple[int, int]]]]
) -> int:
    """Writes (ledger id, half-open entry runs) pairs for `load_seed_file`; returns how many.

    A benchmark's bookie holds 10^5 ledgers in a process of its own; seeding
    it over the wire would measure the emulator, and pickling its state would
    tie the file to this module's internals. This is 12 bytes a ledger and 16 a run.
    """
    count = 0
    with open(path, "wb") as f:
        f.write(SEED_MAGIC)
        for ledger_id, runs in ledgers:
            f.write(_SEED_LEDGER.pack(ledger_id, len(runs)))
            for start, stop in runs:
                if not 0 <= start < stop:
                    raise ValueError(f"ledger {ledger_id}: bad entry run [{start}, {stop})")
                f.write(_SEED_RUN.pack(start, stop))
            count += 1
    return count


def read_seed_file(path: str | Path) -> Iterator[tuple[int, list[tuple[int, int]]]]:
    """The (ledger id, runs) pairs of a seed file, in file order."""
    data = Path(path).read_bytes()
    if not data.startswith(SEED_MAGIC):
        raise SeedFileError(f"{path}: not a bookie emulator seed file")
    pos = len(SEED_MAGIC)
    while pos < len(data):
        if pos + _SEED_LEDGER.size > len(data):
            raise SeedFileError(f"{path}: truncated at byte {pos}")
        ledger_id, count = _SEED_LEDGER.unpack_from(data, pos)
        pos += _SEED_LEDGER.size
        end = pos + count * _SEED_RUN.size
        if end > len(data):
            raise SeedFileError(f"{path}: ledger {ledger_id} truncated at byte {pos}")
        runs = [_SEED_RUN.unpack_from(data, at) for at in range(pos, end, _SEED_RUN.size)]
        for start, stop in runs:
            if not 0 <= start < stop:
                raise SeedFileError(f"{path}: ledger {ledger_id}: bad entry run [{start}, {stop})")
        pos = end
        yield ledger_id, runs
