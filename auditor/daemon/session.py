"""The metadata store's session as the daemon sees it: connected, suspended, lost.

Why: every part of the daemon waits on the connection (new checks pause while it is
suspended, the worker stops writing, the election's reads wait it out), and leadership
must end when the session may be gone on the server. One follower turns the store's
session states into the daemon's `connected` and `disconnected` events, its state and
tallies, and a leadership event each; after a whole session timeout suspended, a leader
steps down rather than waiting for a call to fail (`SuspendedTooLong`). At each connect
with ZooKeeper credentials it reads which relied-on znodes anyone may change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from structlog.typing import FilteringBoundLogger

from auditor.daemon.leadership import (
    Action,
    Connected,
    Decision,
    Event,
    SessionLost,
    Suspended,
    SuspendedTooLong,
)
from auditor.daemon.state import DaemonState
from auditor.metadata.acls import find_open_acls
from auditor.store import MetadataStore, SessionState, StoreAuthError, StoreUnavailableError
from auditor.zk import ZkClient


class SessionFollower:
    """Follows `store`'s session states for the daemon's whole run (`run`).

    `session_timeout` gives the configured timeout (s) in force; `readiness` is called
    after each state change; `on_connect` at each connect (the ACL check).
    """

    def __init__(
        self,
        store: MetadataStore,
        *,
        state: DaemonState,
        connected: asyncio.Event,
        disconnected: asyncio.Event,
        decide: Callable[[Event], Decision],
        readiness: Callable[[], None],
        session_timeout: Callable[[], float],
        on_connect: Callable[[], None],
    ) -> None:
        self.store = store
        self.state = state
        self._connected = connected
        self._disconnected = disconnected
        self._decide = decide
        self._readiness = readiness
        self._session_timeout = session_timeout
        self._on_connect = on_connect
        self._suspension_timer: asyncio.TimerHandle | None = None

    async def run(self) -> None:
        state, tallies = self.state, self.state.tallies
        async for st in self.store.states():
            if st == SessionState.CONNECTED:
                state.zk_connected = True
                tallies.zk_connected()
                self._disconnected.clear()
                self._connected.set()
                self._disarm_suspension_limit()
                self._decide(Connected())
                self._on_connect()
            elif st == SessionState.SUSPENDED:
                state.zk_connected = False
                tallies.zk_suspended()
                self._connected.clear()
                self._disconnected.set()
                if self._decide(Suspended()).action is Action.PAUSE:
                    self._arm_suspension_limit()
            elif st == SessionState.LOST:
                state.zk_connected = False
                tallies.zk_session_lost()
                self._connected.clear()
                self._disconnected.set()
                self._disarm_suspension_limit()
                self._decide(SessionLost())
            self._readiness()

    def _arm_suspension_limit(self) -> None:
        """Disconnected for a whole session timeout, the session may be gone on the
        server and another daemon may lead: stop acting as leader now rather than
        when a call finally fails (running checks are cancelled, nothing is written:
        writes are fenced anyway). A session that survives elects us again at once."""
        self._disarm_suspension_limit()
        limit = self._session_timeout()

        def expired() -> None:
            self._suspension_timer = None
            if not self._connected.is_set():
                self._decide(SuspendedTooLong(limit))

        self._suspension_timer = asyncio.get_running_loop().call_later(limit, expired)

    def _disarm_suspension_limit(self) -> None:
        if self._suspension_timer is not None:
            self._suspension_timer.cancel()
        self._suspension_timer = None


async def check_acls(
    zk: ZkClient,
    root: str,
    state: DaemonState,
    log: FilteringBoundLogger,
    checked: Callable[[], None],
) -> None:
    """At a connect with credentials: which relied-on znodes anyone may change
    (`auditor.metadata.acls`), each logged, counted and shown in `status`. A read that
    fails is logged and leaves the last finding; it never stops the daemon. `checked`
    is called after each look, after the state it announces."""

    async def acls_of(path: str) -> list[Any]:
        return (await zk.get_acls(path))[0]

    try:
        found = await find_open_acls(acls_of, root)
    except (StoreUnavailableError, StoreAuthError) as exc:
        log.warning("znode ACLs not checked", error=str(exc))
        checked()
        return
    state.open_acls = tuple(found)
    checked()
    for item in found:
        log.warning(
            "relied-on znode is open to anyone",
            path=item.path,
            perms=list(item.perms),
            fix="setAcl it to the auditor's and the bookies' credentials (docs/runbook.md)",
        )
    if not found:
        log.info("relied-on znodes admit only authenticated changes", root=root)
