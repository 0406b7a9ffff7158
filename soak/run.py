"""`make soak`: three daemons, a ZooKeeper and six bookies under random faults for a while.

Environment: SOAK_MINUTES (20), SOAK_SEED (1: the same seed gives the same
fault schedule), SOAK_LEDGERS (120), SOAK_DIR (/tmp/bk-auditor-soak: daemon
logs, faults.json, summary.json). Progress on stderr, the JSON summary on
stdout; exit 1 when an assertion fails (each failure named on stderr).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from soak.analysis import analyse
from soak.cluster import DAEMON_SETTINGS, SoakCluster
from soak.faults import LONG, Fault, Injector

#: (kind, lane, weight). Lanes: one ZooKeeper/daemon fault at a time, up to two
#: bookie faults, one ledger change at a time.
KINDS: list[tuple[str, str, float]] = [
    ("zk_restart", "cluster", 1.0),
    ("zk_partition", "cluster", 1.0),
    ("session_expire", "cluster", 1.0),
    ("leader_kill", "cluster", 0.7),
    ("bookie_crash", "bookie", 1.0),
    ("bookie_crash_short", "bookie", 1.0),
    ("bookie_pause", "bookie", 1.0),
    ("bookie_pause_short", "bookie", 1.0),
    ("bookie_slow", "bookie", 1.0),
    ("bookie_eio", "bookie", 1.0),
    ("bookie_toomany", "bookie", 1.0),
    ("bookie_empty", "bookie", 1.0),
    ("ledger_delete", "ledger", 1.0),
    ("ledger_rereplicate", "ledger", 1.0),
]
REPORTABLE = {"bookie_crash", "bookie_pause", "bookie_eio", "bookie_toomany", "bookie_empty"}
SETTLE = 30.0


def log(msg: str) -> None:
    print(f"[soak] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


async def _survives(c: SoakCluster, f: Fault) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if c.acting_leader() is not None:
            f.survived = True
            return
        await asyncio.sleep(0.5)
    f.survived = False


async def soak(minutes: float, seed: int, ledgers: int, workdir: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    c = SoakCluster(workdir, ledgers)
    errors: list[str] = []
    await c.start()
    inj = Injector(c, rng)
    t_start = time.time()
    deadline = time.monotonic() + minutes * 60
    stop_sampling = asyncio.Event()

    async def sampler() -> None:
        while not stop_sampling.is_set():
            c.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_sampling.wait(), 10)

    sampling = asyncio.ensure_future(sampler())
    tasks: set[asyncio.Task[None]] = set()
    lanes_busy: dict[str, bool] = {"cluster": False, "ledger": False}
    skipped = 0

    def spawn(kind: str, lane: str, run: Callable[[], Awaitable[Fault | None]]) -> None:
        async def go() -> None:
            if lane in lanes_busy:
                lanes_busy[lane] = True
            try:
                f = await run()
                if f is not None:
                    await _survives(c, f)
            except Exception as exc:  # a driver failure, not a finding: reported as such
                errors.append(f"{kind}: {type(exc).__name__}: {exc}")
                log(f"driver error in {kind}: {exc!r}")
            finally:
                if lane in lanes_busy:
                    lanes_busy[lane] = False

        t = asyncio.ensure_future(go())
        tasks.add(t)
        t.add_done_callback(tasks.discard)

    try:
        await asyncio.sleep(20)  # the first election and the leader's start audit
        weights = [w for _, _, w in KINDS]
        while time.monotonic() < deadline:
            await asyncio.sleep(rng.uniform(3.0, 8.0))
            kind, lane, _ = rng.choices(KINDS, weights)[0]
            remaining = deadline - time.monotonic()
            busy = lanes_busy.get(lane, False) or (lane == "bookie" and inj.bookie_slots() <= 0)
            if busy or (kind in REPORTABLE and remaining < LONG[1]):
                skipped += 1
                continue
            spawn(kind, lane, getattr(inj, kind))
        log("schedule over; waiting for faults under way")
        while tasks:
            await asyncio.gather(*list(tasks))
        log(f"settling {SETTLE:g} s")
        await asyncio.sleep(SETTLE)
        final_leader = c.acting_leader()
    finally:
        stop_sampling.set()
        await sampling
        await c.stop()
    run_end = time.time()
    (workdir / "faults.json").write_text(json.dumps([f.as_dict() for f in inj.faults], indent=1))
    result = analyse(c, inj.faults, run_end)
    return {
        "seed": seed,
        "minutes": round((run_end - t_start) / 60, 1),
        "ledgers": ledgers,
        "daemons": len(c.daemons),
        "bookies": len(c.bookies),
        "daemon_settings": DAEMON_SETTINGS,
        "faults_injected": len(inj.faults),
        "schedule_skipped": skipped,
        "final_leader": final_leader.name if final_leader else None,
        "driver_errors": errors,
        **result,
    }


def failures(s: dict[str, Any]) -> list[str]:
    out = []
    if s["leader_overlaps_acting"]:
        out.append(f"two acting leaders at once: {s['leader_overlaps_acting']}")
    if s["missed"]:
        out.append(f"faults not reported: {s['missed']}")
    if s["false_alarms"]:
        out.append(f"false alarms: {len(s['false_alarms'])}")
    if s["resources_grew"]:
        out.append(f"RSS or fds grew: {s['resources_grew']}")
    if s["driver_errors"]:
        out.append(f"driver errors: {s['driver_errors']}")
    if s["final_leader"] is None:
        out.append("no leader at the end")
    lost = [k for k, v in s["faults_by_kind"].items() if v["survived"] < v["injected"]]
    if lost:
        out.append(f"no leader within 30 s after: {lost}")
    return out


def main() -> int:
    minutes = float(os.environ.get("SOAK_MINUTES", "20"))
    seed = int(os.environ.get("SOAK_SEED", "1"))
    ledgers = int(os.environ.get("SOAK_LEDGERS", "120"))
    workdir = Path(os.environ.get("SOAK_DIR", "/tmp/bk-auditor-soak"))
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    log(f"{minutes:g} min, seed {seed}, {ledgers} ledgers, logs in {workdir}")
    summary = asyncio.run(soak(minutes, seed, ledgers, workdir))
    fails = failures(summary)
    summary["failures"] = fails
    text = json.dumps(summary, indent=1, default=str)
    (workdir / "summary.json").write_text(text)
    print(text)
    for f in fails:
        log(f"FAIL: {f}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
