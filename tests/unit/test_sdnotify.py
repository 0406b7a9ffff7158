"""sd_notify against real AF_UNIX datagram sockets: a path and an abstract name."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor.daemon.sdnotify import Notifier, notify, watchdog_interval


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2.0)
    try:
        yield sock, str(path)
    finally:
        sock.close()


def test_ready_status_watchdog_stopping(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready(status="follower")
    assert sock.recv(4096) == b"READY=1\nSTATUS=follower\n"
    assert n.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1\n"
    assert n.status("leader\nsince now")
    assert sock.recv(4096) == b"STATUS=leader since now\n"
    assert n.reloading()
    assert sock.recv(4096) == b"RELOADING=1\n"
    assert n.stopping()
    assert sock.recv(4096) == b"STOPPING=1\n"
    n.close()
    n.close()
    assert notify({"NOTIFY_SOCKET": path}, status="one-shot")
    assert sock.recv(4096) == b"STATUS=one-shot\n"


def test_abstract_socket_name() -> None:
    name = f"bk-auditor-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2.0)
    try:
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert sock.recv(4096) == b"READY=1\n"
        n.close()
    finally:
        sock.close()


def test_no_socket_is_a_no_op() -> None:
    n = Notifier({})
    assert not n.enabled
    assert not n.ready()
    assert not n.watchdog()
    assert not Notifier({"NOTIFY_SOCKET": "vsock:2:1234"}).enabled


def test_a_vanished_socket_is_reported_not_raised(tmp_path: Path) -> None:
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.enabled
    assert not n.watchdog()
    assert not n.watchdog()  # and again, with a fresh socket


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}) == 15
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}) is None
