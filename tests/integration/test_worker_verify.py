"""The verification after a commit asks the bookies for the ensembles it just wrote while
it reads the metadata back (`LedgerRepairer._read_for_verify`), on a real ZooKeeper and
emulated bookies: the answers are used only when the metadata read back expects exactly
what was committed, and no bookie is asked twice."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from auditor.checks.replicas import Listed
from auditor.logs import get_logger
from auditor.metadata.replication import ReplicationQueue
from auditor.testing.harness import test_cluster
from auditor.worker.repair import LedgerRepairer, WorkerConnection
from auditor.worker.state import WorkerState
from auditor.zk import ZkClient

ROOT = "/ledgers"
LID = 5

pytestmark = pytest.mark.timeout(60)


async def test_answers_asked_with_the_read_back_are_used_only_for_what_was_committed(
    zk: ZkClient,
) -> None:
    async with test_cluster(zk, 4) as tc:
        b = tc.ids
        await tc.writer.write_ledger(
            LID, [(0, (b[0], b[1], b[2]))], write_quorum=2, ack_quorum=2, num_entries=6
        )
        async with tc.context() as ctx:
            connected = asyncio.Event()
            connected.set()
            repairer = LedgerRepairer(
                ctx,
                ReplicationQueue(ctx.store, ROOT, "test"),
                WorkerConnection(connected, asyncio.Event()),
                WorkerState(),
                log=get_logger("test"),
            )
            stored = await repairer.read(LID)
            assert stored is not None

            # Nothing committed by this repair: nothing asked early.
            for emu in tc.bookies:
                emu.reset_stats()
            md, registered, answers = await repairer._read_for_verify(LID)
            assert (md, answers) == (stored, None)
            assert registered.writable == frozenset(b)
            assert [emu.list_requests[LID] for emu in tc.bookies] == [0, 0, 0, 0]

            # Committed as stored: each ensemble bookie asked once, its answer used.
            repairer._wrote[LID] = stored
            md, _, answers = await repairer._read_for_verify(LID)
            assert md == stored and answers is not None
            assert sorted(answers) == sorted([b[0], b[1], b[2]])
            assert all(isinstance(a, Listed) for a in answers.values())
            assert [emu.list_requests[LID] for emu in tc.bookies] == [1, 1, 1, 0]
            assert LID not in repairer._wrote  # used once

            # The metadata read back expects otherwise than what was committed (a
            # writer's change in between): the early answers are not used.
            [seg] = stored.segments
            other = dataclasses.replace(
                stored, segments=(dataclasses.replace(seg, bookies=(b[0], b[1], b[3])),)
            )
            repairer._wrote[LID] = other
            md, _, answers = await repairer._read_for_verify(LID)
            assert (md, answers) == (stored, None)
