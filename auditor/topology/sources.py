"""The resolver asks every rack source alike, yet each source should be readable, and
testable, without the others; what they share is kept apart from all of them.

What every rack source shares: its error, and how it is asked about bookies. The
sources are `racks.py` (the file and Pulsar's znode) and `script.py` (the topology
script).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from auditor.errors import FormatError

__all__ = ["Address", "AddressOf", "RackSource", "RackSourceError"]

Address = tuple[str, int]
#: A bookie id -> its (host, port), from its registration or its id; None if neither says.
AddressOf = Callable[[str], Awaitable[Address | None]]


class RackSourceError(FormatError):
    """A rack source that exists but cannot be used (bad JSON, failing script, ...).

    Exit code 2: the check could not run, because verdicts built on a broken
    rack map would be wrong.
    """

    exit_code = 2


class RackSource(Protocol):
    """One source of locations: answers what it knows, leaves the rest out."""

    @property
    def name(self) -> str: ...

    async def locate(self, bookies: Sequence[str], address_of: AddressOf) -> dict[str, str]: ...
