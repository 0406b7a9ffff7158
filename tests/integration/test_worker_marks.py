"""The worker and a mark whose ledger does not exist, bytes that decode or not.

Java's worker takes a mark by its name alone and, finding no ledger, deletes it. Ours
does the same, and names the mark's path in the line that says so: a mark whose bytes
never decoded (written by a broken tool) leaves no other trace once it is gone (found
by the soak with real workers: a corrupt mark was removed within seconds and nothing
named it).
"""

from __future__ import annotations

import asyncio

import pytest

from auditor.metadata.underreplication import ur_ledger_path
from auditor.testing.harness import test_cluster
from auditor.testing.inprocess import until
from auditor.worker.loop import ReplicationWorker
from auditor.worker.repair import WorkerConnection
from auditor.worker.state import WorkerState
from auditor.zk import ZkClient
from tests.integration.test_worker_recovery import RecordingLog

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("data", [b'replica: "10.0.0.9:3181"\n', b"\xff\x00 not TextFormat"])
async def test_the_mark_of_a_ledger_that_does_not_exist_goes_and_is_named(
    zk: ZkClient, data: bytes
) -> None:
    async with test_cluster(zk, 3) as tc:
        path = ur_ledger_path(f"{tc.root}/underreplication", 9_000_000_001)
        await zk.create(path, data, makepath=True)
        log = RecordingLog()
        async with tc.context() as ctx:
            connected = asyncio.Event()
            connected.set()
            conn = WorkerConnection(connected, asyncio.Event())
            w = ReplicationWorker(ctx, conn, WorkerState(), holder="test-host", log=log)
            run = asyncio.ensure_future(w.run())
            try:
                await until(
                    log.changed,
                    lambda: bool(log.find("ledger no longer exists; its mark goes")),
                    f"the mark removed; log: {log.lines}",
                    within=20,
                )
            finally:
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
        [(level, fields, _)] = log.find("ledger no longer exists; its mark goes")
        assert (level, fields) == ("info", {"ledger": 9_000_000_001, "mark": path, "removed": True})
        assert await zk.exists(path) is None
