"""The replication worker in `status`: from `WorkerState` to the gRPC message, the
`status --json` document and the text, exactly."""

from __future__ import annotations

import io

from auditor.api.convert import status_json, status_response
from auditor.cli.admin import render_status
from auditor.daemon.state import DaemonState
from auditor.proto import auditor_service_pb2 as pb
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
