"""Our daemons and BookKeeper's Java auditors must elect one auditor by one rule, so our vote
has to be cast exactly as theirs; the recipe that casts it makes blocking kazoo calls, which
stay inside the adapter.

BookKeeper's auditor votes, cast with kazoo's Lock recipe (ZooKeeper only).

BookKeeper's ZooKeeper driver elects its auditor with ephemeral-sequential votes
`V_<seq>` under `<root>/underreplication/auditorelection`; the lowest sequence leads.
kazoo's Lock recipe with its node name set to "V_" casts exactly such votes (`<uuid>V_<seq>`:
kazoo needs the unique prefix to find its node again after a connection loss; Java reads
the number after "V_" and the hex uuid never contains "V_") and orders contenders by the
same number, Java's votes included. The daemon's `Elector` runs it on a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import CancelledError as KazooCancelled
from kazoo.recipe.lock import Lock
from kazoo.retry import ForceRetryError

from auditor.zk.client import ZkClient

#: Orders an election directory's children: the votes, leader first (others dropped).
VoteOrder = Callable[[list[str]], list[str]]


class _VoteLock(Lock):  # type: ignore[misc]
    """kazoo's Lock with BookKeeper's vote naming and BookKeeper's order of votes.

    kazoo ranks contenders by the ten-digit string after "V_" and ignores any other
    name; BookKeeper ranks every `V_<number>` by its number. Left to kazoo, a foreign
    `V_1` is no contender, so our vote "wins" while BookKeeper's rule (and the daemon's
    own check of it) says `V_1` leads: elected, stepping down, elected again, hundreds
    of times a second. So the predecessor a vote waits on comes from the one rule the
    daemon judges by (`order`), as Java's `AuditorElector` watches the vote before its
    own in its comparator's order."""

    _NODE_NAME = "V_"
    _EXCLUDE_NAMES = ["V_"]

    def __init__(self, client: Any, path: str, identifier: str, order: VoteOrder) -> None:
        super().__init__(client, path, identifier=identifier)
        self._order = order

    def _get_predecessor(self, node: str) -> str | None:
        children = self.client.get_children(self.path)
        ordered = self._order(list(children))
        if node not in ordered:
            # Our vote is gone (a session lost meanwhile): kazoo votes again.
            raise ForceRetryError()
        at = ordered.index(node)
        return ordered[at - 1] if at > 0 else None


class Vote:
    """One vote in the election directory `path`, carrying `identifier` as its data;
    `order` is the election's rule (lowest sequence first)."""

    def __init__(self, zk: ZkClient, path: str, identifier: str, order: VoteOrder) -> None:
        self._lock = _VoteLock(zk.kazoo, path, identifier, order)
        self._timeout = zk.timeout

    @property
    def node(self) -> str | None:
        """Our vote's name while we hold one (`<uuid>V_<seq>`)."""
        node = self._lock.node
        return node if isinstance(node, str) else None

    async def won(self) -> None:
        """Casts the vote and waits until it is first in line; cancelling withdraws it
        (the caller still calls `withdraw` to delete what was cast)."""
        acquiring = asyncio.ensure_future(asyncio.to_thread(self._lock.acquire))
        try:
            await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            self._lock.cancel()
            with contextlib.suppress(Exception, KazooCancelled):
                await acquiring
            raise

    async def withdraw(self) -> None:
        """Deletes the vote if the session still has it (within the client's timeout)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.to_thread(self._lock.release), self._timeout)
