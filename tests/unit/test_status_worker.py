"""The replication worker in `status`: from `WorkerState` to the gRPC message, the
`status --json` document and the text, exactly."""

from __future__ import annotations

import io

from auditor.api.convert import status_json, status_response
from auditor.cli.api_commands import render_status
from auditor.daemon.state import DaemonState
from auditor.proto import auditor_service_pb2 as pb
from auditor.worker.risk import QueuedLedger, QueueRisk, Risk
from auditor.worker.state import Failure, InHand, Unrecoverable

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
FRAGMENT = "segment 0 [0-99] position 1 b3:3181 (lost) -> b7:3181"


def busy_state() -> DaemonState:
    state = DaemonState("a:1", started_at=T0)
    w = state.worker
    w.enabled = w.running = True
    w.ledgers_replicated, w.ledgers_found_healthy, w.fragments_replicated = 12, 1, 13
    w.entries_read, w.entries_written = 400, 400
    w.bytes_read, w.bytes_written = 40_960, 40_960
    w.failures[Failure.NO_TARGET] += 2
    w.failures[Failure.UNRECOVERABLE] += 1
    w.failures[Failure.ERROR] += 0  # a reason never seen is not listed
    w.lock_seconds, w.locks_released = 4.25, 14
    w.in_hand[9] = InHand(9, T0 + 3, "deferred", (), T0 + 303)
    w.in_hand[7] = InHand(7, T0 + 1, "copying", (FRAGMENT,))
    w.unrecoverable[4] = Unrecoverable(4, ((0, 9), (12, 12)), T0 + 2, T0 + 3602)
    w.queue = QueueRisk(
        T0 + 5,
        {"0": 0, "1": 2, "2": 1, "3+": 0, "unknown": 1},
        {"1": T0 - 600, "2": T0 - 60, "unknown": T0 - 30},
        (
            QueuedLedger(9, Risk(1, 1, T0 - 600), True),
            QueuedLedger(21, Risk(1, 2, T0 - 300), False),
            QueuedLedger(22, Risk(2, 2, T0 - 60), False),
            QueuedLedger(23, Risk(None, None, T0 - 30), False),
        ),
    )
    return state


def test_a_busy_worker_travels_to_proto_json_and_text() -> None:
    msg = status_response(busy_state(), now=T0 + 10)
    w = msg.worker
    assert [h.ledger_id for h in w.in_hand] == [7, 9]  # by id
    assert dict(w.failures) == {"no_target": 2, "unrecoverable": 1}
    assert list(w.unrecoverable[0].ranges) == [
        pb.EntryRange(first=0, last=9),
        pb.EntryRange(first=12, last=12),
    ]
    # Through the wire and back, as the CLI gets it.
    doc = status_json(pb.GetStatusResponse.FromString(msg.SerializeToString()))
    assert doc["worker"] == {
        "enabled": True,
        "running": True,
        "waiting": None,
        "ledgers_replicated": 12,
        "ledgers_found_healthy": 1,
        "fragments_replicated": 13,
        "entries_read": 400,
        "entries_written": 400,
        "bytes_read": 40960,
        "bytes_written": 40960,
        "failures": {"no_target": 2, "unrecoverable": 1},
        "lock_seconds": 4.25,
        "locks_released": 14,
        "in_hand": [
            {
                "ledger_id": 7,
                "step": "copying",
                "since": "2023-11-14T22:13:21Z",
                "until": None,
                "fragments": [FRAGMENT],
            },
            {
                "ledger_id": 9,
                "step": "deferred",
                "since": "2023-11-14T22:13:23Z",
                "until": "2023-11-14T22:18:23Z",
                "fragments": [],
            },
        ],
        "unrecoverable": [
            {
                "ledger_id": 4,
                "ranges": [[0, 9], [12, 12]],
                "since": "2023-11-14T22:13:22Z",
                "retry_at": "2023-11-14T23:13:22Z",
            }
        ],
        "queue": {
            "ranked_at": "2023-11-14T22:13:25Z",
            "by_copies_left": {"0": 0, "1": 2, "2": 1, "3+": 0, "unknown": 1},
            "oldest": {
                "1": "2023-11-14T22:03:20Z",
                "2": "2023-11-14T22:12:20Z",
                "unknown": "2023-11-14T22:12:50Z",
            },
            "next": [
                {
                    "ledger_id": 9,
                    "copies_left": 1,
                    "racks_left": 1,
                    "marked_at": "2023-11-14T22:03:20Z",
                    "in_flight": True,
                },
                {
                    "ledger_id": 21,
                    "copies_left": 1,
                    "racks_left": 2,
                    "marked_at": "2023-11-14T22:08:20Z",
                    "in_flight": False,
                },
                {
                    "ledger_id": 22,
                    "copies_left": 2,
                    "racks_left": 2,
                    "marked_at": "2023-11-14T22:12:20Z",
                    "in_flight": False,
                },
                {
                    "ledger_id": 23,
                    "copies_left": None,
                    "racks_left": None,
                    "marked_at": "2023-11-14T22:12:50Z",
                    "in_flight": False,
                },
            ],
        },
    }
    out = io.StringIO()
    render_status(doc, out)
    text = out.getvalue()
    block = text[text.index("  worker:") :]
    assert block == (
        "  worker: running\n"
        "    replicated 12 ledgers (13 fragments), 1 found whole; read 400 entries "
        "(40960 bytes), wrote 400 entries (40960 bytes); 14 locks released, held 4.25s in all\n"
        "    failed attempts: no_target=2, unrecoverable=1\n"
        "    marked ledgers by copies left: 0: 0, 1: 2 (oldest marked 2023-11-14T22:03:20Z), "
        "2: 1 (oldest marked 2023-11-14T22:12:20Z), 3+: 0, unknown: 1 (oldest marked "
        "2023-11-14T22:12:50Z)\n"
        "    next in take order: 9 (1 copy, 1 rack; in flight), 21 (1 copy, 2 racks), "
        "22 (2 copies, 2 racks), 23 (? copies)\n"
        "    ledger 7: copying (locked since 2023-11-14T22:13:21Z)\n"
        f"      {FRAGMENT}\n"
        "    ledger 9: deferred until 2023-11-14T22:18:23Z (locked since 2023-11-14T22:13:23Z)\n"
        "    UNRECOVERABLE ledger 4: no readable copy of entries 0-9, 12 "
        "(since 2023-11-14T22:13:22Z; tried again at 2023-11-14T23:13:22Z); kept marked\n"
    )


def test_an_idle_worker_says_why_and_an_off_one_says_so() -> None:
    state = DaemonState("a:1", started_at=T0)
    state.worker.enabled = state.worker.running = True
    state.worker.waiting = "replication disabled (underreplication/disable)"
    doc = status_json(status_response(state, now=T0))
    assert doc["worker"]["waiting"] == "replication disabled (underreplication/disable)"
    assert (doc["worker"]["in_hand"], doc["worker"]["unrecoverable"]) == ([], [])
    assert doc["worker"]["queue"] is None  # not ranked yet: no line about it
    assert doc["worker"]["failures"] == {}
    out = io.StringIO()
    render_status(doc, out)
    text = out.getvalue()
    assert text[text.index("  worker:") :] == (
        "  worker: running; waiting: replication disabled (underreplication/disable)\n"
        "    replicated 0 ledgers (0 fragments), 0 found whole; read 0 entries (0 bytes), "
        "wrote 0 entries (0 bytes); 0 locks released, held 0s in all\n"
    )

    off = status_json(status_response(DaemonState("a:1", started_at=T0), now=T0))
    assert off["worker"]["enabled"] is False
    out = io.StringIO()
    render_status(off, out)
    assert out.getvalue().endswith("  worker: off (worker.enabled)\n")


def test_a_daemon_without_a_worker_field_shows_none() -> None:
    msg = status_response(DaemonState("a:1", started_at=T0), now=T0)
    msg.ClearField("worker")
    doc = status_json(msg)
    assert doc["worker"] is None
    out = io.StringIO()
    render_status(doc, out)
    assert "worker" not in out.getvalue()
