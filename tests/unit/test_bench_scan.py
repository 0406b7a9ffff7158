"""bench/bench_scan.py reads its time split from Spark's event log and tells a run's
processes apart by where they sit; a mistake in either would put wrong figures in the
README without any run failing, so both are held to exact answers here.

The event log is written as Spark 4.3 writes it (`eventlog_v2_APP/events_N_APP`, one JSON
event a line, the field names of its JsonProtocol), trimmed to the events the bench reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.bench_scan import (
    DRIVER_JVM,
    DRIVER_PY,
    EXEC_JVM,
    EXEC_PY,
    FORK,
    OTHER,
    WORKER_JVM,
    _event_files,
    roles,
    split_from_event_log,
)

APP = "app-20261129095000-0000"
T0 = 1_795_946_000.0  # the run's process started (s)


def _ms(s: float) -> int:
    return round((T0 + s) * 1000)


def _task(stage: int, launch: float, finish: float, executor: str, run_s: float) -> Any:
    return {
        "Event": "SparkListenerTaskEnd",
        "Stage ID": stage,
        "Task Info": {"Launch Time": _ms(launch), "Finish Time": _ms(finish),
                      "Executor ID": executor},
        "Task Metrics": {"Executor Run Time": int(run_s * 1000),
                         "Executor Deserialize Time": 100},
    }  # fmt: skip


def _job(job: int, stage: int, start: float, end: float, what: str) -> list[Any]:
    return [
        {"Event": "SparkListenerJobStart", "Job ID": job, "Submission Time": _ms(start),
         "Stage IDs": [stage], "Properties": {"spark.job.description": what}},
        {"Event": "SparkListenerJobEnd", "Job ID": job, "Completion Time": _ms(end)},
    ]  # fmt: skip


def _write_log(directory: Path) -> None:
    events: list[Any] = [
        {"Event": "SparkListenerLogStart", "Spark Version": "4.3.0"},
        {"Event": "SparkListenerApplicationStart", "App ID": APP, "Timestamp": _ms(10)},
        {"Event": "SparkListenerExecutorAdded", "Timestamp": _ms(25), "Executor ID": "0",
         "Executor Info": {"Total Cores": 1}},
        {"Event": "SparkListenerExecutorAdded", "Timestamp": _ms(30), "Executor ID": "1",
         "Executor Info": {"Total Cores": 1}},
        *_job(0, 0, 21, 61, "scan of 4 id ranges"),
        {"Event": "SparkListenerStageCompleted", "Stage Info": {
            "Stage ID": 0, "Number of Tasks": 4, "Submission Time": _ms(21),
            "Completion Time": _ms(61)}},
        _task(0, 31, 51, "0", 20),
        _task(0, 31, 46, "1", 15),
        _task(0, 46, 61, "1", 15),
        _task(0, 51, 60, "0", 9),
        *_job(1, 1, 63, 67, "scan of 4 id ranges"),  # the coverage written
        *_job(2, 2, 70, 71, "write violations"),
    ]  # fmt: skip
    rolled = directory / f"eventlog_v2_{APP}"
    rolled.mkdir()
    (rolled / f"appstatus_{APP}").write_text("")
    (rolled / f".events_1_{APP}.crc").write_text("x")
    (rolled / f"events_2_{APP}").write_text(json.dumps(events[8]) + "\n")
    head = events[:8] + events[9:]
    (rolled / f"events_1_{APP}").write_text("".join(json.dumps(e) + "\n" for e in head))


def test_the_split_of_a_standalone_run(tmp_path: Path) -> None:
    _write_log(tmp_path)
    files = _event_files(tmp_path)
    assert [f.name for f in files] == [f"events_1_{APP}", f"events_2_{APP}"]
    split = split_from_event_log(files, T0, planned=T0 + 20, finished=T0 + 72)
    assert split == {
        "session_s": 10.0,
        "executors": 2,
        "slots": 2,
        "executors_s": 20.0,
        "to_planned_s": 10.0,
        "to_stage_s": 1.0,
        "stage_s": 40.0,
        "stage_tasks": 4,
        "tasks_per_executor": {"0": 2, "1": 2},
        "first_launch_s": 10.0,
        "task_run_sum_s": 59.0,
        "task_run_max_s": 20.0,
        "task_run_min_s": 9.0,
        "task_deserialize_sum_s": 0.4,
        "slot_use": 0.738,
        "writes_s": 5.0,
        "write_jobs": 2,
        "driver_gaps_s": [2.0, 3.0, 1.0],
        "merge_s": 3.0,
        "after_stage_s": 11.0,
    }


def test_a_log_without_the_scan_job_says_so(tmp_path: Path) -> None:
    log = tmp_path / "local-1"
    log.write_text(
        json.dumps({"Event": "SparkListenerApplicationStart", "Timestamp": _ms(1)}) + "\n"
    )
    assert _event_files(tmp_path) == [log]
    assert split_from_event_log([log], T0, T0, T0) == {"error": f"no scan job in {[log]}"}


def test_roles_under_the_cli_and_under_spark_submit() -> None:
    procs = {
        # `python -m auditor scan --master local[2]`: the driver, its JVM, the workers.
        100: ("python3.11", 1),
        101: ("java", 100),
        102: ("python3.11", 101),
        103: ("python3.11", 102),
        # spark-submit: the driver's JVM, its Python driver; a worker, its executor's tree.
        200: ("java", 1),
        201: ("python", 200),
        300: ("java", 1),
        301: ("java", 300),
        302: ("python", 301),
        303: ("bash", 300),
        304: ("java", 301),  # the executor starting `bash -c "gzip | tar"`: not exec'd yet
        305: ("java", 101),  # the local driver's JVM starting its Python daemon
        400: ("java", 1),  # ZooKeeper, nobody's
    }
    forks = {(304, 301), (305, 101)}

    def forked(pid: int, ppid: int) -> bool:
        return (pid, ppid) in forks

    assert roles(100, [], procs, forked) == {
        100: DRIVER_PY, 101: DRIVER_JVM, 102: EXEC_PY, 103: EXEC_PY, 305: FORK,
    }  # fmt: skip
    assert roles(200, [300], procs, forked) == {
        200: DRIVER_JVM, 201: DRIVER_PY, 300: WORKER_JVM, 301: EXEC_JVM, 302: EXEC_PY,
        303: OTHER, 304: FORK,
    }  # fmt: skip
