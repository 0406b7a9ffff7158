"""`make soak`: three daemons, a ZooKeeper and six bookies under random faults for a while.

Environment: SOAK_MINUTES (20), SOAK_SEED (1: the same seed gives the same
fault schedule), SOAK_SEEDS (e.g. `1,2,3` or `1-5`: several full runs one
after another, each in SOAK_DIR/seed-N, with a combined summary; overrides
SOAK_SEED), SOAK_ONLY (e.g. `host_restart,bad_mark`: draw only these kinds, to
reproduce one fault), SOAK_WORKER (`real`: the daemons' own replication workers
repair; `simulated`: the driver's stand-in does, as before), SOAK_LEDGERS (120),
SOAK_DIR (/tmp/bk-auditor-soak: daemon logs, faults.json, summary.json).
Progress on stderr, the JSON summary on stdout (the combined one for
SOAK_SEEDS), a PASS/FAIL line per seed and overall on stderr; exit 1 when an
assertion fails (each failure named on stderr), 2 on a bad setting.
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

from soak.adversarial import AdversarialFaults
from soak.analysis import analyse
from soak.badznodes import ZnodeFaults
from soak.cluster import WORKER_MODES, SoakCluster, daemon_settings
from soak.faults import LONG, Fault, Injector
from soak.seeds import SeedsError, combine, parse_seeds
from soak.verify import EndState, drain, end_state

#: (kind, lane, weight). Lanes: one ZooKeeper/daemon fault at a time (host restarts
#: included: they also take a bookie slot; a held election takes them all), up to two
#: bookie faults, one ledger change at a time, one bad znode at a time, one siege of the
#: HTTP views at a time.
KINDS: list[tuple[str, str, float]] = [
    ("zk_restart", "cluster", 1.0),
    ("zk_partition", "cluster", 1.0),
    ("session_expire", "cluster", 1.0),
    ("leader_kill", "cluster", 0.7),
    ("host_restart", "cluster", 0.7),
    ("rolling_restart", "cluster", 0.3),
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
    ("bad_ctime", "znode", 0.5),
    ("bad_mark", "znode", 0.5),
    ("bad_delay", "znode", 0.5),
    ("bad_ledger_znode", "znode", 0.5),
    ("foreign_vote", "cluster", 0.5),
    ("garbage_vote", "cluster", 0.5),
    ("idle_http", "http", 0.5),
]
#: Issue 30's cases (`soak.adversarial`).
ADVERSARIAL = {"foreign_vote", "garbage_vote", "idle_http"}
REPORTABLE = {"bookie_crash", "bookie_pause", "bookie_eio", "bookie_toomany", "bookie_empty"}
#: Kinds that also take a bookie slot when they begin.
NEEDS_BOOKIE = {"host_restart"}
SETTLE = 30.0
#: How often the replication worker looks at every mark.
SWEEP = 10.0
#: Real workers: how long the end of a run waits for them to clear every mark.
DRAIN = 120.0


def log(msg: str) -> None:
    print(f"[soak] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def parse_worker(text: str) -> str:
    """SOAK_WORKER: `real` (the default) or `simulated`; ValueError naming another."""
    name = text.strip() or "real"
    if name not in WORKER_MODES:
        raise ValueError(f"SOAK_WORKER: {name[:40]!r} is not one of {', '.join(WORKER_MODES)}")
    return name


def parse_only(text: str) -> list[tuple[str, str, float]]:
    """The kinds SOAK_ONLY names (all when empty); ValueError naming an unknown one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {k for k, _, _ in KINDS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"SOAK_ONLY: unknown fault kind {unknown[0][:40]!r}")
    return [k for k in KINDS if not names or k[0] in names]


async def soak(
    minutes: float,
    seed: int,
    ledgers: int,
    workdir: Path,
    kinds: list[tuple[str, str, float]] | None = None,
    worker: str = "real",
) -> dict[str, Any]:
    kinds = kinds or KINDS
    rng = random.Random(seed)
    c = SoakCluster(workdir, ledgers, worker)
    errors: list[str] = []
    await c.start()
    inj = Injector(c, rng)
    znodes = ZnodeFaults(inj)
    adversary = AdversarialFaults(inj)
    t_start = time.time()
    deadline = time.monotonic() + minutes * 60
    stop_sampling = asyncio.Event()

    async def sampler() -> None:
        while not stop_sampling.is_set():
            c.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_sampling.wait(), 10)

    async def stand_in() -> None:
        while not stop_sampling.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_sampling.wait(), SWEEP)
            try:
                await inj.sweep()
            except Exception as exc:  # a driver failure, not a finding: reported as such
                errors.append(f"worker sweep: {type(exc).__name__}: {exc}")
                log(f"driver error in the worker's sweep: {exc!r}")

    sampling = asyncio.ensure_future(sampler())
    sweeping = asyncio.ensure_future(stand_in())
    tasks: set[asyncio.Task[None]] = set()
    ended = EndState()
    lanes_busy: dict[str, bool] = {"cluster": False, "ledger": False, "znode": False, "http": False}
    skipped = 0

    def spawn(kind: str, lane: str, run: Callable[[], Awaitable[Fault | None]]) -> None:
        async def go() -> None:
            if lane in lanes_busy:
                lanes_busy[lane] = True
            try:
                f = await run()
                if f is not None:
                    await inj.survives(f)
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
        weights = [w for _, _, w in kinds]
        while time.monotonic() < deadline:
            await asyncio.sleep(rng.uniform(3.0, 8.0))
            kind, lane, _ = rng.choices(kinds, weights)[0]
            remaining = deadline - time.monotonic()
            needs_slot = lane == "bookie" or kind in NEEDS_BOOKIE
            busy = lanes_busy.get(lane, False) or (needs_slot and inj.bookie_slots() <= 0)
            if busy or (kind in REPORTABLE and remaining < LONG[1]):
                skipped += 1
                continue
            owner = znodes if lane == "znode" else adversary if kind in ADVERSARIAL else inj
            spawn(kind, lane, getattr(owner, kind))
        log("schedule over; waiting for faults under way")
        while tasks:
            await asyncio.gather(*list(tasks))
        log(f"settling {SETTLE:g} s")
        await asyncio.sleep(SETTLE)
        final_leader = c.acting_leader()
        if worker == "real":
            log(f"waiting up to {DRAIN:g} s for the workers to clear every mark")
            drained = await drain(c, DRAIN)
            ended = await end_state(c)
            ended.drained_s = drained
            log(
                f"end state: {ended.ledgers} ledgers, {ended.entries_read} copies read, "
                f"{len(ended.unreadable)} unreadable, {len(ended.gone)} on gone bookies, "
                f"marks left {ended.marks_on_whole + ended.marks_on_damaged}"
            )
    finally:
        stop_sampling.set()
        await sampling
        await sweeping
        await c.stop()
    run_end = time.time()
    (workdir / "faults.json").write_text(json.dumps([f.as_dict() for f in inj.faults], indent=1))
    result = analyse(c, inj.faults, run_end)
    if worker == "real":
        repairs: dict[str, Any] = {
            "end_state": ended.as_dict(),
            "emptied_not_drained": [
                {"bookie": f.bookie, "start": f.start, "ledgers": f.not_drained}
                for f in inj.faults
                if f.not_drained
            ],
            **result.pop("real_worker"),
        }
    else:
        result.pop("real_worker")
        repairs = {
            "entries_copied": inj.worker.copied,
            "marks_removed": inj.worker.unmarked,
            "ledgers_kept_marked_not_whole": len(inj.worker.kept),
        }
    return {
        "seed": seed,
        "minutes": round((run_end - t_start) / 60, 1),
        "ledgers": ledgers,
        "daemons": len(c.daemons),
        "bookies": len(c.bookies),
        "worker_mode": worker,
        "daemon_settings": daemon_settings(worker),
        "kinds_drawn": [k for k, _, _ in kinds] if kinds != KINDS else "all",
        "faults_injected": len(inj.faults),
        "schedule_skipped": skipped,
        "final_leader": final_leader.name if final_leader else None,
        "driver_errors": errors,
        "worker": repairs,
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
    if s["leader_flaps"]:
        out.append(f"leaderships that did not hold: {s['leader_flaps']}")
    if s["election_loops"]:
        out.append(f"elections in a loop behind a held election: {s['election_loops']}")
    if s["led_beside_held_votes"]:
        out.append(
            f"a leader beside the vote that holds the election: {s['led_beside_held_votes']}"
        )
    if s["http_lockouts"]:
        out.append(f"HTTP views locked out by idle connections: {s['http_lockouts']}")
    if s["blinded"]:
        out.append(f"auditing stopped by a bad znode: {s['blinded']}")
    if s["resources_grew"]:
        out.append(f"RSS or fds grew: {s['resources_grew']}")
    if s["driver_errors"]:
        out.append(f"driver errors: {s['driver_errors']}")
    if s["final_leader"] is None:
        out.append("no leader at the end")
    out += worker_failures(s)
    lost = [k for k, v in s["faults_by_kind"].items() if v["survived"] < v["injected"]]
    if lost:
        out.append(f"no leader within 30 s after: {lost}")
    return out


def worker_failures(s: dict[str, Any]) -> list[str]:
    """What the real workers must have achieved (nothing for the simulated one)."""
    if s.get("worker_mode") != "real":
        return []
    w = s["worker"]
    end = w["end_state"]
    out = []
    if end["unreadable_count"]:
        out.append(f"copies that do not read back at the end: {end['unreadable_count']}")
    if end["gone"]:
        out.append(f"ledgers naming a bookie that is gone: {end['gone']}")
    if end["marks_on_whole"]:
        out.append(f"marks left on ledgers that read back whole: {end['marks_on_whole']}")
    if end["marks_on_damaged"]:
        out.append(f"marks left on ledgers not repaired: {end['marks_on_damaged']}")
    if w["emptied_not_drained"]:
        out.append(
            f"emptied bookies whose ledgers the workers did not move: {w['emptied_not_drained']}"
        )
    if w["unrecoverable"]:
        out.append(
            f"ledgers found unrecoverable (two faults on E=W=3 leave a copy): {w['unrecoverable']}"
        )
    if w["risk_order_breaks"]:
        out.append(f"ledgers taken ahead of riskier ones waiting: {w['risk_order_breaks']}")
    return out


def run_seed(
    minutes: float,
    seed: int,
    ledgers: int,
    workdir: Path,
    kinds: list[tuple[str, str, float]],
    worker: str = "real",
) -> dict[str, Any]:
    """One full run in `workdir` (emptied first): its summary, failures included."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    log(f"{minutes:g} min, seed {seed}, {ledgers} ledgers, {worker} workers, logs in {workdir}")
    summary = asyncio.run(soak(minutes, seed, ledgers, workdir, kinds, worker))
    fails = failures(summary)
    summary["failures"] = fails
    summary["verdict"] = "FAIL" if fails else "PASS"
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    for f in fails:
        log(f"FAIL (seed {seed}): {f}")
    log(f"seed {seed}: {summary['verdict']}")
    return summary


def main() -> int:
    try:
        minutes = float(os.environ.get("SOAK_MINUTES", "20"))
        ledgers = int(os.environ.get("SOAK_LEDGERS", "120"))
        seeds = parse_seeds(os.environ.get("SOAK_SEEDS", ""))
        seed = int(os.environ.get("SOAK_SEED", "1"))
        kinds = parse_only(os.environ.get("SOAK_ONLY", ""))
        worker = parse_worker(os.environ.get("SOAK_WORKER", ""))
    except (ValueError, SeedsError) as exc:
        log(f"bad setting: {exc}")
        return 2
    workdir = Path(os.environ.get("SOAK_DIR", "/tmp/bk-auditor-soak"))
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    if not seeds:
        summary = run_seed(minutes, seed, ledgers, workdir, kinds, worker)
        print(json.dumps(summary, indent=1, default=str))
        return 1 if summary["failures"] else 0
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    summaries = []
    for n in seeds:
        summaries.append(run_seed(minutes, n, ledgers, workdir / f"seed-{n}", kinds, worker))
    combined = combine(summaries, workdir)
    (workdir / "summary.json").write_text(json.dumps(combined, indent=1, default=str))
    print(json.dumps(combined, indent=1, default=str))
    for line in combined["lines"]:
        log(line)
    log(f"overall: {combined['verdict']}")
    return 0 if combined["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
