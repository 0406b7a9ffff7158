"""When each periodic check last completed anywhere in the cluster, seen by every daemon.

Why: BookKeeper's auditor, Java or ours, writes a check's completion time into
`<root>/underreplication/{checkallledgersctime,placementpolicycheckctime,
replicascheckctime}` after each run. Before this module only our leader exported a
completion time, so while a Java AutoRecovery led the staleness alert had nothing
to read on any of our daemons (silent), and a follower that had once led kept a
last-success time that only grew older (a false alarm). Every daemon, leader or
follower, runs `follow_cluster_checks`: it watches the three znodes and keeps the
latest time of each in `DaemonState.cluster_checks`, exported as
`bookkeeper_auditor_cluster_check_last_completed_timestamp_seconds{check}`, and it
exports the configured intervals (`bookkeeper_auditor_check_interval_seconds`)
from the start, so the alert can compare the two on any node.

The znodes are untrusted: a value that does not decode counts as absent, is named
in `status` (`DaemonState.invalid_znodes`, the entry the leader's contained reads
use too) and is logged once per value; nothing here ends the daemon. ZooKeeper
being away only pauses the loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from structlog.typing import FilteringBoundLogger

from auditor.checks.findings import Check
from auditor.config import BookKeeperConfig
from auditor.daemon.contained import CTIME_CORRUPT, shown
from auditor.daemon.scheduler import CTIME_KIND, intervals
from auditor.daemon.state import DaemonState
from auditor.metadata.records import CheckKind, RecordFormatError, decode_check_ctime
from auditor.store import MetadataStore, NoNodeError
from auditor.waits import until_any

#: Seconds between re-reads without a watch event: a watch lost with a session (or
#: never armed) costs at most this much delay.
SAFETY_REREAD = 60.0
#: Seconds before reading again after ZooKeeper (or anything else) failed a pass.
RETRY_AFTER = 1.0
#: What `status` says the daemon uses instead of a corrupt ctime (the leader's words too).
USING_ABSENT = "absent: the check runs as if it never ran"


def ctime_path(root: str, kind: CheckKind) -> str:
    """The znode that holds `kind`'s last completion time, under the ledgers root."""
    return f"{root}/underreplication/{kind.znode}"


class CtimeWatch:
    """One ctime znode, its check, and the watch armed on it."""

    def __init__(self, check: Check, kind: CheckKind, path: str) -> None:
        self.check = check
        self.kind = kind
        self.path = path
        #: Set by ZooKeeper when the znode is created, changed or deleted; None until
        #: armed (and again when the session that armed it is gone).
        self.changed: asyncio.Event | None = None

    def needs_arming(self) -> bool:
        return self.changed is None or self.changed.is_set()

    async def read(self, store: MetadataStore) -> bytes | None:
        """The znode's bytes (None when absent), arming a watch when the last one fired.

        A read without a watch (the safety re-read) leaves the armed one in place, so
        kazoo does not pile up one watcher per re-read on a znode that never changes.
        """
        if not self.needs_arming():
            try:
                data, _ = await store.get(self.path)
            except NoNodeError:
                return None
            return data
        while True:
            try:
                data, _, self.changed = await store.get_watched(self.path)
                return data
            except NoNodeError:
                # ZooKeeper sets no data watch on a missing node; `exists` does. If the
                # node appeared in between, read it again (with its watch).
                stat, self.changed = await store.exists_watched(self.path)
                if stat is None:
                    return None


def apply_intervals(state: DaemonState, bk: BookKeeperConfig) -> None:
    """The configured period of every check, exported by every daemon (not only the
    leader), so that the staleness alert has a threshold while a Java node leads."""
    for check, seconds in intervals(bk).items():
        state.check_interval(check, seconds)


def record_ctime(
    state: DaemonState,
    log: FilteringBoundLogger,
    watch: CtimeWatch,
    data: bytes | None,
) -> None:
    """Stores what the znode says in `state`: a time, or absent (missing, unassigned, corrupt)."""
    znode = watch.kind.znode
    if data is None:
        state.cluster_check_completed(watch.check, None)
        return
    try:
        ctime_ms = decode_check_ctime(watch.kind, data)
    except RecordFormatError as exc:
        state.cluster_check_completed(watch.check, None)
        if state.znode_invalid(znode, shown(data), USING_ABSENT, time.time()):
            log.warning(
                CTIME_CORRUPT,
                znode=znode,
                value=shown(data),
                path=watch.path,
                error=str(exc),
            )
        return
    if state.znode_valid(znode):
        log.info("znode holds a usable value again", znode=znode, path=watch.path)
    # Java's UNASSIGNED_CTIME (-1), or no time at all: nothing completed that we know of.
    state.cluster_check_completed(watch.check, ctime_ms / 1000 if ctime_ms > 0 else None)


async def follow_cluster_checks(
    store: MetadataStore,
    root: str,
    state: DaemonState,
    log: FilteringBoundLogger,
    bookkeeper: Callable[[], BookKeeperConfig],
    *,
    safety: float = SAFETY_REREAD,
    passed: asyncio.Event | None = None,
) -> None:
    """Runs until cancelled: keeps `state.cluster_checks` and the intervals current.

    `bookkeeper` gives the configuration in force (it changes on SIGHUP); its
    intervals are applied at every pass. `passed`, when given, is set after every
    pass that read all three znodes (tests wait on it).
    """
    watches = [CtimeWatch(c, k, ctime_path(root, k)) for c, k in CTIME_KIND.items()]
    session: int | None = None
    last_error: str | None = None
    while True:
        apply_intervals(state, bookkeeper())
        if store.session != session:  # a new session has none of the old one's watches
            session = store.session
            for w in watches:
                w.changed = None
        try:
            for w in watches:
                record_ctime(state, log, w, await w.read(store))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # ZooKeeper away or refusing: this loop must live on
            error = f"{type(exc).__name__}: {exc}"
            if error != last_error:
                log.info("cluster check times not read; trying again", error=error)
                last_error = error
            await asyncio.sleep(RETRY_AFTER)
            continue
        last_error = None
        if passed is not None:
            passed.set()
        await until_any(*(w.changed for w in watches if w.changed), within=safety)
