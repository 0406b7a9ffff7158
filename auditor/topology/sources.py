"""What every rack source shares: its error, and how it is asked about bookies.

Kept apart from the sources themselves (`racks.py` for the file and Pulsar's
znode, `script.py` for the topology script) so that each can be read, and
tested, without the others.
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
