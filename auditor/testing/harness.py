"""Every check test and benchmark should start from the same real parts (a real ZooKeeper,
bookies speaking the real protocol) with a few lines of setup, not its own assembly of them.

A whole test cluster in one object: ZooKeeper layout, emulated bookies, writers, contexts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from auditor.bookie.client import BookieClient
from auditor.checks.context import CheckContext, open_context
from auditor.config import AuditorConfig, load_config
from auditor.metadata.layout import LedgerManager
from auditor.metadata.registry import resolve_bookie
from auditor.store import MetadataStore
from auditor.testing.bookie import BookieEmulator, Storage
from auditor.testing.cluster import ClusterWriter
from auditor.testing.writer import LedgerWriter


class TestCluster:
    """`bookies[i].bookie_id` are the ids to put in ensembles."""

    __test__ = False  # not a pytest class

    def __init__(
        self,
        store: MetadataStore,
        bookies: list[BookieEmulator],
        cluster: ClusterWriter,
        writer: LedgerWriter,
    ) -> None:
        self.store = store
        self.bookies = bookies
        self.cluster = cluster
        self.writer = writer
        self.root = cluster.root

    @property
    def ids(self) -> list[str]:
        return [b.bookie_id for b in self.bookies]

    def by_id(self, bookie_id: str) -> BookieEmulator:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    @asynccontextmanager
    async def context(
        self,
        config: AuditorConfig | None = None,
        *,
        overrides: Sequence[str] = (),
        mark: bool = False,
    ) -> AsyncIterator[CheckContext]:
        """A check context on this cluster (config from defaults plus `overrides`)."""
        cfg = config or load_config(None, overrides)
        async with open_context(self.store, self.root, self.cluster.manager, cfg, mark=mark) as ctx:
            yield ctx


@asynccontextmanager
async def test_cluster(
    store: MetadataStore,
    bookies: int | Sequence[Storage | str] = 3,
    *,
    root: str = "/ledgers",
    manager: LedgerManager = LedgerManager.HIERARCHICAL,
    password: bytes = b"",
) -> AsyncIterator[TestCluster]:
    """Lays out a cluster and starts emulated bookies; everything stops on exit."""
    cw = ClusterWriter(store, root, manager)
    await cw.init_cluster()
    kinds = [Storage.SORTED] * bookies if isinstance(bookies, int) else list(bookies)
    emus = [BookieEmulator(store, ledgers_root=root, storage=k) for k in kinds]

    async def resolve(bookie_id: str) -> tuple[str, int] | None:
        return await resolve_bookie(store, root, bookie_id)

    client = BookieClient(resolve, request_timeout=5.0)
    try:
        for e in emus:
            await e.start()
        yield TestCluster(store, emus, cw, LedgerWriter(cw, client, password=password))
    finally:
        await client.close()
        for e in emus:
            if e.running:
                await e.stop()


# Its name starts with test_; pytest must not collect it from modules that import it.
test_cluster.__test__ = False  # type: ignore[attr-defined]
