"""Bad znodes appearing and disappearing under the daemons (issue 21: nothing blinds the
auditor).

Every byte the auditor reads from ZooKeeper is untrusted: a znode written by
another version of the Java auditor, by hand or by a bug must be named where it
belongs while every check goes on. Each fault here writes one bad znode, keeps
it bad for 45-75 s (a daemon that rewrites it, as the leader rewrites a check's
ctime after each run, finds it bad again within 5 s: another writer is still at
work), then restores what was there (removes it, or puts the old bytes back if
they are still ours). The znodes:

* `bad_ctime`: a check's ctime (`underreplication/replicascheckctime`,
  `checkallledgersctime` or `placementpolicycheckctime`) holding bytes that are
  not its protobuf. Expected: silence; it counts as absent (the check runs).
* `bad_mark`: an under-replication mark `urL%010d` (of a ledger id no ledger
  has) holding bytes that are not its TextFormat. Expected: reported as a
  corrupt mark, named by its path in some daemon's log.
* `bad_delay`: `lostBookieRecoveryDelay` = `abc`. Expected: silence; the
  configured value applies.
* `bad_ledger_znode`: a ledger znode at the path of id 2^63 in the cluster's
  layout (valid metadata inside). Expected: `metadata_invalid` or an unexpected
  znode, named by path.

For all: the daemons keep auditing everything else (no "check failed", no leader
step-down because of it) and there is always exactly one acting leader; checked
by `soak.analysis`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from auditor.metadata.paths import long_path
from auditor.metadata.serde import encode_ledger_metadata
from auditor.metadata.underreplication import ur_ledger_path
from auditor.testing.cluster import make_metadata
from auditor.zk import NoNodeError, NotEmptyError
from soak.cluster import ENTRIES, ROOT
from soak.faults import Fault, Injector

#: How long a bad znode stays: longer than the 30 s check intervals.
BAD = (45.0, 75.0)
#: How often the fault puts its bytes back if something rewrote them.
REWRITE = 5.0
CTIME_ZNODES = ("replicascheckctime", "checkallledgersctime", "placementpolicycheckctime")
#: Not a protobuf message (a varint that never ends).
CTIME_GARBAGE = b"\xff" * 11 + b" garbage"
#: Not TextFormat.
MARK_GARBAGE = b"garbage \xff\x00{"
DELAY_GARBAGE = b"abc"
#: Ledger ids of bad marks: valid ids (10 digits) that no soak ledger ever has.
BAD_MARK_IDS = 9_000_000_000
#: How long a bad delay waits for every bookie to be up before it gives up; and how long
#: no bookie fault may begin after the delay is written.
BAD_WAIT = 120.0
QUIET = 2.0
#: One past the largest ledger id.
BEYOND_LONG = 2**63


class ZnodeFaults:
    """The bad-znode lane: one bad znode at a time."""

    def __init__(self, inj: Injector) -> None:
        self.inj = inj
        self.c = inj.c
        self.marks = 0

    async def _bad(
        self,
        kind: str,
        path: str,
        garbage: bytes,
        *,
        ledger_id: int | None = None,
        require_evidence: bool = False,
        quiet: bool = False,
    ) -> Fault | None:
        zk = self.c.client
        seconds = self.inj.rng.uniform(*BAD)
        if quiet and not await self._all_bookies_up():
            return None
        async with self.inj.zk_lock:
            before: bytes | None
            try:
                before, _ = await zk.get(path)
            except NoNodeError:
                before = None
            created = await self._missing_parents(path)
            f = self.inj.begin(
                kind, path, path=path, ledger_id=ledger_id, require_evidence=require_evidence
            )
            if before is None:
                await zk.create(path, garbage, makepath=True)
            else:
                await zk.set(path, garbage)
            if quiet:
                await asyncio.sleep(QUIET)
        rewrites = 0
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(REWRITE, left))
            async with self.inj.zk_lock:
                try:
                    now, _ = await zk.get(path)
                except NoNodeError:
                    now = None
                if now != garbage and time.monotonic() < deadline:
                    rewrites += 1
                    if now is None:
                        await zk.create(path, garbage, makepath=True)
                    else:
                        await zk.set(path, garbage)
        f.end = time.time()
        if quiet:
            await self._all_bookies_up(forever=True)
        async with self.inj.zk_lock:
            await self._restore(path, garbage, before, created)
            if quiet:
                await asyncio.sleep(QUIET)
        f.repaired = time.time()
        if rewrites:
            f.note = f"rewritten {rewrites} times after a daemon replaced it"
        return f

    async def _all_bookies_up(self, forever: bool = False) -> bool:
        """Waits (at most BAD_WAIT s unless `forever`) until every bookie is registered."""
        deadline = time.monotonic() + BAD_WAIT
        while forever or time.monotonic() < deadline:
            if all(b.running for b in self.c.bookies):
                return True
            await asyncio.sleep(0.5)
        return False

    async def _missing_parents(self, path: str) -> list[str]:
        """The ancestors of `path` that do not exist yet, deepest first."""
        missing: list[str] = []
        parent = path.rsplit("/", 1)[0]
        while parent and not await self.c.client.exists(parent):
            missing.append(parent)
            parent = parent.rsplit("/", 1)[0]
        return missing

    async def _restore(
        self, path: str, garbage: bytes, before: bytes | None, created: list[str]
    ) -> None:
        zk = self.c.client
        try:
            now, _ = await zk.get(path)
        except NoNodeError:
            now = None
        if before is None:
            if now == garbage:
                with contextlib.suppress(NoNodeError):
                    await zk.delete(path)
            for parent in created:
                with contextlib.suppress(NoNodeError, NotEmptyError):
                    await zk.delete(parent)
        elif now == garbage:
            await zk.set(path, before)
        elif now is None:
            await zk.create(path, before, makepath=True)
        # else: a daemon has written a valid value since; it stays.

    async def bad_ctime(self) -> Fault | None:
        name = self.inj.rng.choice(CTIME_ZNODES)
        return await self._bad("bad_ctime", f"{self.c.ur_base}/{name}", CTIME_GARBAGE)

    async def bad_mark(self) -> Fault | None:
        self.marks += 1
        lid = BAD_MARK_IDS + self.marks
        return await self._bad(
            "bad_mark",
            ur_ledger_path(self.c.ur_base, lid),
            MARK_GARBAGE,
            ledger_id=lid,
            require_evidence=True,
        )

    async def bad_delay(self) -> Fault | None:
        """Written and restored only while every bookie is up, with no bookie fault beginning
        for 2 s after (`quiet`): writing the delay is also BookKeeper's way to trigger an
        audit at once (`triggeraudit` writes the current value back), and a triggered audit
        while a host restarts would mark its bookie's ledgers by the operator's request."""
        path = f"{self.c.ur_base}/lostBookieRecoveryDelay"
        return await self._bad("bad_delay", path, DELAY_GARBAGE, quiet=True)

    async def bad_ledger_znode(self) -> Fault | None:
        """Valid metadata (three live bookies) at the path of id 2^63: a path, not a ledger."""
        bookies = [b.bookie_id for b in self.c.ensemble_for(0)]
        md = make_metadata(
            0, bookies, write_quorum=3, ack_quorum=2, last_entry_id=ENTRIES - 1, length=160
        )
        return await self._bad(
            "bad_ledger_znode",
            long_path(ROOT, BEYOND_LONG),
            encode_ledger_metadata(md),
            require_evidence=True,
        )
