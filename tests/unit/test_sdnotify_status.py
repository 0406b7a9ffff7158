"""The STATUS line systemd shows ("Status:" in `systemctl status`), over a real socket.

The daemon's state is driven by the real leadership machine; each step sends what
`Notifier.show` would send from the daemon, to an AF_UNIX datagram socket bound as
`$NOTIFY_SOCKET`.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor.checks.findings import Check, CheckReport
from auditor.daemon.leadership import (
    Connected,
    DuplicateIdentity,
    Elected,
    Event,
    LeadershipMachine,
    OtherElectionLeader,
    Started,
    StopRequested,
    Suspended,
    TaskEnded,
    WorkFailed,
    leader_backoff,
)
from auditor.daemon.sdnotify import Notifier, status_line
from auditor.daemon.state import (
    DaemonState,
    OtherElection,
    RunCompleted,
    RunFailed,
    RunState,
)

ME = "bookie-1:9876"
#: 2026-11-27 09:31:02 UTC.
T = 1_795_771_862.0


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    try:
        yield sock, str(path)
    finally:
        sock.close()


def received(sock: socket.socket) -> list[str]:
    """Every datagram waiting on `sock`, decoded (a local datagram arrives at once)."""
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


class Daemon:
    """What the daemon does with its state and its notifier, without the I/O."""

    def __init__(self, path: str) -> None:
        self.state = DaemonState(identity=ME)
        self.machine = LeadershipMachine(leader_backoff(initial=10.0, maximum=10.0))
        self.notify = Notifier({"NOTIFY_SOCKET": path})

    def decide(self, event: Event, at: float = T) -> None:
        self.state.record_decision(self.machine.decide(event, at))
        self.notify.show(self.state)


def test_status_follows_the_phases_and_is_sent_only_when_it_changes(
    listener: tuple[socket.socket, str],
) -> None:
    sock, path = listener
    d = Daemon(path)
    assert d.notify.show(d.state)  # before ZooKeeper answers
    assert not d.notify.show(d.state)  # the same line: nothing sent
    assert received(sock) == ["STATUS=waiting for ZooKeeper\n"]

    d.state.zk_connected = True
    d.decide(Connected())
    assert received(sock) == ["STATUS=starting: connected to ZooKeeper, not yet voting\n"]

    d.decide(Started())
    assert received(sock) == ["STATUS=voting; no auditor elected yet\n"]
    d.state.leader = "bookie-2:9876"  # `_follow_leader` read the election: the heartbeat shows it
    assert d.notify.show(d.state)
    assert not d.notify.show(d.state)
    assert received(sock) == ["STATUS=following bookie-2:9876\n"]

    d.decide(Elected("/ledgers/underreplication/auditorelection/V_0000000001"))
    d.state.lead(T)
    assert received(sock) == ["STATUS=leading; no check ended yet\n"]

    d.state.check_run_state(Check.REPLICAS, RunState.RUNNING, None)
    d.notify.show(d.state)
    assert received(sock) == ["STATUS=leading; no check ended yet; running replicas\n"]
    report = CheckReport(Check.REPLICAS, started_at=T, finished_at=T + 60)
    d.state.check_ended(Check.REPLICAS, RunCompleted(report, 60.0), T + 60)
    d.notify.show(d.state)
    d.state.check_run_state(Check.PLACEMENT, RunState.RUNNING, None)
    d.state.check_ended(Check.PLACEMENT, RunFailed("ZooKeeper: timeout", 1.0), T + 120)
    d.state.replication_enabled = False
    d.notify.show(d.state)
    assert received(sock) == [
        "STATUS=leading; last check replicas clean at 09:32:02Z\n",
        "STATUS=leading; last check placement failed at 09:33:02Z; autorecovery disabled\n",
    ]

    d.state.zk_connected = False
    d.decide(Suspended())
    assert received(sock) == ["STATUS=waiting for ZooKeeper (leading; new checks wait)\n"]
    d.state.zk_connected = True
    d.decide(Connected())
    assert received(sock) == [
        "STATUS=leading; last check placement failed at 09:33:02Z; autorecovery disabled\n"
    ]

    d.decide(WorkFailed("RuntimeError: boom"), at=T + 200)
    d.state.stepped_down()
    [line] = received(sock)
    assert line.startswith("STATUS=backing off until 09:34:")
    assert line.endswith(": leader work failed; stepping down (RuntimeError: boom)\n"), line

    d.decide(StopRequested("SIGTERM"))
    assert received(sock) == ["STATUS=stopping: handing over leadership\n"]
    d.notify.close()


def test_refused_other_election_and_ended() -> None:
    state = DaemonState(identity=ME, zk_connected=True)
    m = LeadershipMachine()
    m.decide(Started(), T)
    state.record_decision(m.decide(DuplicateIdentity("/ledgers/x/V_07"), T))
    assert status_line(state) == (
        f"not voting: another session holds a vote as {ME} (/ledgers/x/V_07)"
    )

    state = DaemonState(identity=ME, zk_connected=True, election="pulsar")
    m = LeadershipMachine()
    m.decide(Started(), T)
    state.record_decision(m.decide(OtherElectionLeader("bookkeeper", "bookie-9:3181"), T))
    state.other_election = OtherElection("bookkeeper", "/ledgers/x/V_01", "bookie-9:3181", T)
    assert status_line(state) == "not voting: bookie-9:3181 leads the bookkeeper election"

    state.record_decision(m.decide(TaskEnded("election", "RuntimeError: x"), T))
    line = status_line(state)
    assert line.startswith("exiting: ") and "election" in line


def test_no_socket_shows_nothing() -> None:
    n = Notifier({})
    assert not n.show(DaemonState(identity=ME))
    assert n.shown is None


def test_a_failed_send_is_sent_again_next_time(tmp_path: Path) -> None:
    path = tmp_path / "late.sock"
    n = Notifier({"NOTIFY_SOCKET": str(path)})
    state = DaemonState(identity=ME)
    assert not n.show(state)  # nobody listens yet
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    try:
        assert n.show(state)
        assert received(sock) == ["STATUS=waiting for ZooKeeper\n"]
    finally:
        sock.close()
        n.close()


def test_on_etcd_the_status_names_etcd() -> None:
    state = DaemonState(identity=ME, store="etcd")
    assert status_line(state) == "waiting for etcd"
    state.zk_connected = True
    assert status_line(state) == "starting: connected to etcd, not yet voting"
