"""The daemon's metadata index, kept and replaced: so that a new leader's first check
reads memory instead of waiting for a full read of the store.

Why a module of its own: the index outlives leader terms (`daemon.standby_index`: every
daemon keeps one from its first session on, leader or not), it fails and is replaced on
its own schedule, and it must never end or hold up leadership; the daemon's lifecycle
only starts it and hands it to the leader's checks.

The daemon has one metadata-store client for its whole life (a new session after an
expiry is in the same client; the leader's view is that client, fenced on the vote), so
one index follows it: a lost watch or session is a gap, after which the index reads
everything again. An index that fails is logged, counted and started again after a
back-off (`auditor.backoff`: 10 s, doubling while new ones keep failing before they
load, up to 10 minutes); meanwhile checks walk the store. With `standby_index = false`
only the leader holds one, loaded when it is elected and dropped when its term ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from structlog.typing import FilteringBoundLogger

from auditor.backoff import Backoff
from auditor.checks.context import CheckContext
from auditor.daemon.config import DaemonConfig
from auditor.daemon.tallies import Tallies
from auditor.index.store import MetadataIndex
from auditor.index.sync import IndexSync
from auditor.metadata.layout import LedgerManager
from auditor.store import MetadataStore

#: After the standby index failed, a new one starts after this back-off: 10 s, doubling
#: with each failure in a row (of ones that never loaded), up to 10 minutes.
INDEX_BACKOFF = Backoff(initial=10.0, maximum=600.0)

#: The leader's own index for one term, and the task that keeps it.
TermIndex = tuple[IndexSync, "asyncio.Task[None]"]


class IndexSupervisor:
    """The metadata indexes of one daemon: the standby one, and a leader's for one term.

    `config` gives the configuration in force (a reload may turn the index off, or
    change how wide it reads).
    """

    def __init__(
        self,
        store: MetadataStore,
        *,
        root: str,
        manager: LedgerManager,
        config: Callable[[], DaemonConfig],
        tallies: Tallies,
        log: FilteringBoundLogger,
    ) -> None:
        self.store = store
        self.root = root
        self.manager = manager
        self._config = config
        self.tallies = tallies
        self.log = log
        #: The standby index, leader or not, from the first session on; replaced by a
        #: new one after a failure. None when there is none (`daemon.standby_index`).
        self.standby: IndexSync | None = None
        #: The leader's check context while it reads the standby index, so that a
        #: replacement reaches its checks.
        self._reader: CheckContext | None = None

    def new(self, store: MetadataStore) -> IndexSync:
        """A metadata index on `store`, not started; its loads, gaps and size are tallied."""
        sync = IndexSync(
            store,
            MetadataIndex(self.root, self.manager),
            concurrency=self._config().auditor.checks.walk_window,
            log=self.log,
        )
        tallies = self.tallies
        sync.on_loaded = lambda s: tallies.index_loaded(s.index.bytes_per_ledger())
        sync.on_resync = lambda _reason: tallies.index_resynced()
        self.count(sync)
        return sync

    def count(self, sync: IndexSync | None) -> None:
        """The index whose size the metrics show (None: this node holds none)."""
        self.tallies.index_size = None if sync is None else (lambda: len(sync.index))

    async def _run(self, sync: IndexSync) -> None:
        """Runs `sync` until cancelled; it returns only when it failed, which is counted
        (it has logged why)."""
        await sync.run()
        self.tallies.index_failed()

    # --- the standby index --------------------------------------------------------------

    def start_standby(self) -> IndexSync:
        """The standby index on the daemon's client, not started (`keep` runs it)."""
        self.standby = self.new(self.store)
        return self.standby

    async def keep(self) -> None:
        """The standby index, leader or not, until cancelled (shutdown).

        It resyncs by itself after every gap (connection or session lost; a new session
        of the same client included). One that fails is replaced after a back-off;
        meanwhile the leader's checks walk the store. Nothing here can end the daemon or
        its leadership.
        """
        sync = self.standby if self.standby is not None else self.start_standby()
        failures = 0
        while True:
            try:
                await self._run(sync)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug in the index must not end the daemon
                self.tallies.index_failed()
                self.log.error("metadata index stopped", error=f"{type(exc).__name__}: {exc}")
            # One that had loaded starts the back-off again; one that never did waits longer.
            failures = 1 if sync.loads else failures + 1
            delay = INDEX_BACKOFF.draw(failures)
            self.log.warning("standby metadata index failed; starting again", retry_s=delay)
            await asyncio.sleep(delay)
            sync = self.start_standby()
            if self._reader is not None:  # the leader's checks read the new one
                self._reader.index = sync

    def usable_standby(self, store: MetadataStore) -> IndexSync | None:
        """The standby index, when the leader's work may read it: the index is on (a
        reload may have turned it off) and reads through the leader's own client."""
        sync = self.standby
        if sync is None or not self._config().daemon.metadata_index:
            return None
        if sync.store.session != store.session:
            # One session per daemon (the leader's client is a fenced view of it).
            self.log.warning("the standby index is on another metadata-store client; not read")
            return None
        return sync

    # --- a leader's term ------------------------------------------------------------------

    def start_term(self, store: MetadataStore) -> TermIndex | None:
        """The leader's own index for one term when it has no standby index to read: loading
        in the background (checks wait for it). None when there is a standby index, or
        no index at all (`daemon.metadata_index`)."""
        if self.usable_standby(store) is not None or not self._config().daemon.metadata_index:
            return None
        sync = self.new(store)
        return sync, asyncio.ensure_future(self._run(sync))

    async def end_term(self, term: TermIndex | None) -> None:
        """Drops the term's index (the metrics show the standby one again, if any)."""
        if term is None:
            return
        # Before any await: the term's index is no longer this node's.
        self.count(self.standby)
        term[1].cancel()
        await asyncio.gather(term[1], return_exceptions=True)

    @contextlib.contextmanager
    def reading(
        self, ctx: CheckContext, store: MetadataStore, term: TermIndex | None
    ) -> Iterator[None]:
        """While the leader's checks run on `ctx`: they read the term's index, else the
        standby index (and its replacements)."""
        ctx.index = term[0] if term is not None else self.usable_standby(store)
        self._reader = ctx if term is None and ctx.index is not None else None
        try:
            yield
        finally:
            self._reader = None
