"""The deep scrub's progress record on both metadata stores: where it lives, its bytes, and
the version check that keeps two leaders from both moving the cursor (the daemon's test
runs on ZooKeeper; Pulsar's etcd driver keeps the same tree as keys)."""

from __future__ import annotations

import pytest

from auditor.checks.scrub_progress import ScrubProgress, encode
from auditor.checks.scrub_progress_store import (
    progress_path,
    read_progress,
    write_progress,
)
from auditor.store import BadVersionError, MetadataStore, NodeExistsError

ROOT = "/ledgers"


async def test_the_record_is_created_moved_at_its_version_and_refused_at_another(
    store: MetadataStore,
) -> None:
    assert progress_path(ROOT) == "/ledgers/underreplication/bk-auditor-scrub"
    absent = await read_progress(store, ROOT)
    assert (absent.progress, absent.version, absent.invalid) == (None, None, None)

    first = ScrubProgress(cycle=1, started=1_700_000_000.5)
    created = await write_progress(store, ROOT, first, None)
    assert created == 0
    data, _ = await store.get(progress_path(ROOT))
    assert data == encode(first)
    assert data == (
        b'{"format":1,"cycle":1,"started":1700000000.5,"cursor":0,"bytes":0,"ledgers":0,'
        b'"previous_bytes":0,"finished":null}'
    )

    moved = ScrubProgress(cycle=1, started=1_700_000_000.5, cursor=33, bytes=4096, ledgers=32)
    version = await write_progress(store, ROOT, moved, created)
    read = await read_progress(store, ROOT)
    assert (read.progress, read.version, read.invalid) == (moved, version, None)
    assert version != created

    # A leader that read the record before the move (its version) writes nothing; nor does
    # one that saw no record at all.
    with pytest.raises(BadVersionError):
        await write_progress(store, ROOT, first, created)
    with pytest.raises(NodeExistsError):
        await write_progress(store, ROOT, first, None)
    assert (await read_progress(store, ROOT)).progress == moved


async def test_an_unusable_record_is_named_with_its_version_so_a_new_cycle_can_write_over_it(
    store: MetadataStore,
) -> None:
    await store.create(progress_path(ROOT), b"not json", makepath=True)
    read = await read_progress(store, ROOT)
    assert (read.progress, read.data) == (None, b"not json")
    assert read.invalid is not None and read.version is not None
    fresh = ScrubProgress(cycle=1, started=5.0)
    await write_progress(store, ROOT, fresh, read.version)
    assert (await read_progress(store, ROOT)).progress == fresh
