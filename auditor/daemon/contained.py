"""The leader's reads of znodes whose bad values must not end its leadership.

Why: every byte read from ZooKeeper is untrusted, and two small znodes used to
silence the whole cluster's auditor. A corrupt check-ctime znode (written, say, by
another version of the Java auditor) raised at election, outside any guard, and
ended the election task; a `lostBookieRecoveryDelay` of `abc` made every new
leader fail and step down about nine times a second, and a value beyond Java's
`Integer.parseInt` range postponed every lost-bookie audit for ever. Here a bad
ctime counts as absent (the check runs: the safe side) and a bad delay falls back
to the configured one; each bad value is logged once (again only when it changes),
kept in `DaemonState.invalid_znodes` for `status`, and shown by the
`znode_invalid` gauge while it lasts.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from structlog.typing import FilteringBoundLogger

from auditor.daemon.state import DaemonState
from auditor.metadata.records import (
    UNASSIGNED_CTIME,
    CheckKind,
    RecordFormatError,
    decode_check_ctime,
)
from auditor.metadata.underreplication import (
    MAX_DELAY_SECONDS,
    UnderreplicationManager,
    parse_lost_bookie_recovery_delay,
)
from auditor.store import NoNodeError

DELAY_ZNODE = "lostBookieRecoveryDelay"
#: Bytes of a bad value a log line or `status` shows.
SHOWN = 64


def shown(data: bytes) -> str:
    """A bad value, printable and bounded: `repr` of its first `SHOWN` bytes."""
    head = repr(data[:SHOWN])
    return head if len(data) <= SHOWN else f"{head}... ({len(data)} bytes)"


#: Java's `Integer.MAX_VALUE`: `Integer.parseInt` rejects anything larger.
MAX_DELAY = MAX_DELAY_SECONDS
#: The one rule for the znode's bytes (kept under the daemon's name for its callers).
parse_delay = parse_lost_bookie_recovery_delay


#: The one warning for a corrupt check-ctime znode, whichever read (leader or follower,
#: `daemon/cluster_checks.py`) meets it first: the same value is never warned twice.
CTIME_CORRUPT = "check time znode is corrupt; treating it as absent, the check runs"


class ContainedReads:
    """Reads for one leader term; what was found bad is remembered in `state`."""

    def __init__(
        self,
        state: DaemonState,
        urm: UnderreplicationManager,
        log: FilteringBoundLogger,
        *,
        configured_delay: int,
        on_read: Callable[[], None] | None = None,
    ) -> None:
        self.state = state
        self.urm = urm
        self.log = log
        self.configured_delay = configured_delay
        #: Told after each read of a contained znode, usable or not.
        self.on_read = on_read

    # --- check ctimes -------------------------------------------------------------------

    async def check_ctime(self, kind: CheckKind) -> int:
        """The check's stored run time in ms; UNASSIGNED_CTIME when absent or corrupt.

        ZooKeeper errors propagate (the caller's outage handling applies).
        """
        path = f"{self.urm.base}/{kind.znode}"
        try:
            data, _ = await self.urm.store.get(path)
        except NoNodeError:
            return UNASSIGNED_CTIME
        try:
            ctime = decode_check_ctime(kind, data)
        except RecordFormatError as exc:
            self._invalid(
                kind.znode,
                data,
                "absent: the check runs as if it never ran",
                CTIME_CORRUPT,
                path=path,
                error=str(exc),
            )
            return UNASSIGNED_CTIME
        self._valid(kind.znode, path)
        return ctime

    def ctime_stored(self, kind: CheckKind) -> None:
        """This leader wrote a good ctime over whatever was there."""
        self._valid(kind.znode, f"{self.urm.base}/{kind.znode}")

    # --- lostBookieRecoveryDelay ------------------------------------------------------------

    @property
    def delay_path(self) -> str:
        return f"{self.urm.base}/{DELAY_ZNODE}"

    async def delay(self) -> int:
        """The delay the leader uses now: the znode's, 0 when it is absent (as before),
        the configured one when its value is bad."""
        try:
            data, _ = await self.urm.store.get(self.delay_path)
        except NoNodeError:
            return 0
        return self.delay_of(data)

    def delay_of(self, data: bytes) -> int:
        """The delay to use for the znode's bytes `data`."""
        value = parse_delay(data)
        if value is None:
            self._invalid(
                DELAY_ZNODE,
                data,
                f"the configured {self.configured_delay} s",
                f"{DELAY_ZNODE} is not a whole number of seconds in 0..{MAX_DELAY}; "
                "using the configured value",
                path=self.delay_path,
                configured=self.configured_delay,
            )
            return self.configured_delay
        self._valid(DELAY_ZNODE, self.delay_path)
        return value

    # --- bookkeeping ----------------------------------------------------------------------

    def _invalid(self, znode: str, data: bytes, using: str, message: str, **fields: object) -> None:
        if self.state.znode_invalid(znode, shown(data), using, time.time()):
            self.log.warning(message, znode=znode, value=shown(data), **fields)
        self._read()

    def _valid(self, znode: str, path: str) -> None:
        if self.state.znode_valid(znode):
            self.log.info("znode holds a usable value again", znode=znode, path=path)
        self._read()

    def _read(self) -> None:
        if self.on_read is not None:
            self.on_read()
