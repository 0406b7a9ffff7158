"""The Spark engine sees its stage's progress in Spark's status tracker, as tasks finish.

A real local Spark: a stage of two partitions where one is held until the test lets it
go, so the driver must see exactly one of two partitions done, then none running.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from auditor.scan.engine import EngineOptions
from auditor.scan.spark import RESULT, SparkEngine

pytestmark = pytest.mark.slow


def _held_task(gate: str) -> Callable[[Iterable[int]], Iterator[tuple[str, Any]]]:
    def task(items: Iterable[int]) -> Iterator[tuple[str, Any]]:
        got = list(items)
        if 1 in got:  # the second partition waits for the gate (a file: another process)
            while not os.path.exists(gate):
                time.sleep(0.01)
        yield RESULT, got

    return task


async def test_partitions_done_come_from_the_status_tracker(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    engine = SparkEngine(EngineOptions("spark", "local[2]"), None)
    try:
        assert engine.progress() is None
        rdd = engine.sc.parallelize([0, 1], 2).mapPartitions(_held_task(str(gate)))
        stage = asyncio.create_task(engine._stage("probe of 2 partitions", rdd))
        deadline = time.monotonic() + 120
        while True:  # Spark tells finished tasks only when asked
            tally = engine.progress()
            if tally is not None and tally.partitions_done >= 1:
                break
            assert time.monotonic() < deadline, "the first partition never finished"
            assert not stage.done()
            await asyncio.sleep(0.05)
        assert (tally.stage, tally.partitions, tally.partitions_done) == (
            "probe of 2 partitions",
            2,
            1,
        )
        assert tally.fields(tally.started)["percent"] == 50.0
        gate.touch()
        assert sorted(await asyncio.wait_for(stage, 120)) == [[0], [1]]
        assert engine.progress() is None  # between stages: nothing running
    finally:
        gate.touch()
        await engine.close()
