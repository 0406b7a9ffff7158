"""A fault (a crashed, paused or erroring bookie) must cost nothing that outlives the check
that met it: no task still waiting for an answer, no connection the client forgot to close;
only counting what is left afterwards shows that.

What a test leaves behind: asyncio tasks, file descriptors, TCP connections to bookies.

Fault tests take a `snapshot()` once their cluster is
built and call `assert_no_leaks` once their checks are done; the helpers read
Linux's /proc, which is where these tests run.

Counting has to allow for things that are not leaks:
* tasks that existed before the snapshot (fixtures', the test's own) are
  not counted, and tasks still finishing get a bounded wait before they are;
* a bookie emulator learns that a client closed its connection only when its
  selector reports it, a loop iteration or two later, with no event to await,
  so its connection count is polled briefly;
* garbage not yet collected can hold a descriptor (kazoo's selectors, for
  one), so both counts are taken after `gc.collect()`;
* file descriptors may go down (a crashed emulator that stays down closed its
  listening socket), never up: a test that uses gRPC holds it up across its
  count (the `grpc_held` fixture), since gRPC core's poller comes and goes
  with its last object.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from auditor.testing.bookie import BookieEmulator

__all__ = [
    "Snapshot",
    "assert_no_leaks",
    "open_fds",
    "snapshot",
    "tcp_connections",
    "wait_disconnected",
]

_TCP_LISTEN: Final = "0A"
_PROC_TCP: Final = ("/proc/self/net/tcp", "/proc/self/net/tcp6")


@dataclass(frozen=True, slots=True)
class Snapshot:
    tasks: frozenset[asyncio.Task[Any]]
    fds: int
    #: Descriptor -> what it points at, to name the ones a failing test left open.
    targets: dict[int, str]


def open_fds() -> int:
    """File descriptors this process holds open."""
    return len(os.listdir("/proc/self/fd"))


def fd_targets() -> dict[int, str]:
    """Descriptor -> its /proc target (`socket:[inode]`, `pipe:[inode]`, a path)."""
    out: dict[int, str] = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed between listdir and readlink
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
    return out


def _socket_inode(target: str) -> int | None:
    return int(target[8:-1]) if target.startswith("socket:[") else None


@dataclass(frozen=True, slots=True)
class _TcpRow:
    inode: int
    local_port: int
    remote_port: int
    state: str


def _tcp_rows() -> Iterator[_TcpRow]:
    """Every TCP socket of this network namespace, from /proc/net/tcp and tcp6."""
    for table in _PROC_TCP:
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) >= 10:
                local = int(cols[1].rsplit(":", 1)[1], 16)
                remote = int(cols[2].rsplit(":", 1)[1], 16)
                yield _TcpRow(int(cols[9]), local, remote, cols[3])


def _socket_kinds() -> dict[int, str]:
    """Socket inode -> `tcp local->remote state` or `unix`, for this namespace's sockets."""
    kinds = {r.inode: f"tcp {r.local_port}->{r.remote_port} state {r.state}" for r in _tcp_rows()}
    with contextlib.suppress(OSError), open("/proc/self/net/unix") as f:
        for row in f.read().splitlines()[1:]:
            cols = row.split()
            if len(cols) >= 7:
                kinds.setdefault(int(cols[6]), "unix")
    return kinds


def _describe(new: dict[int, str]) -> list[str]:
    kinds = _socket_kinds()
    out = []
    for fd, target in sorted(new.items()):
        inode = _socket_inode(target)
        if inode is not None:
            target += f" ({kinds.get(inode, 'unknown kind')})"
        out.append(f"{fd}: {target}")
    return out


def tcp_connections(ports: Iterable[int]) -> int:
    """This process's TCP sockets, other than listeners, with either end on one of `ports`.

    /proc/net/tcp lists the whole network namespace; only rows whose socket
    inode one of our descriptors points at are ours (a socket in TIME_WAIT
    has no descriptor left and is not counted).
    """
    wanted = set(ports)
    mine = {i for t in fd_targets().values() if (i := _socket_inode(t)) is not None}
    return sum(
        1
        for r in _tcp_rows()
        if r.state != _TCP_LISTEN
        and r.inode in mine
        and (r.local_port in wanted or r.remote_port in wanted)
    )


def snapshot() -> Snapshot:
    """The tasks alive now (the caller's included) and the open descriptors."""
    gc.collect()
    targets = fd_targets()
    return Snapshot(frozenset(asyncio.all_tasks()), len(targets), targets)


async def _until(done: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def wait_disconnected(bookies: Sequence[BookieEmulator], within: float = 5.0) -> None:
    """Returns once no emulator has a client connection left; fails after `within` seconds."""
    ok = await _until(lambda: all(b.open_connections == 0 for b in bookies), within)
    assert ok, {b.bookie_id: b.open_connections for b in bookies if b.open_connections}


async def assert_no_leaks(
    before: Snapshot,
    *,
    bookies: Sequence[BookieEmulator] = (),
    within: float = 5.0,
) -> None:
    """Fails if tasks, bookie connections or descriptors outlive what `before` saw.

    New tasks get up to `within` seconds to finish (awaited, not polled); emulators
    must see every connection closed, and no socket of this process may still
    be connected to one of their ports.
    """
    current = asyncio.current_task()
    extra = {t for t in asyncio.all_tasks() if t not in before.tasks and t is not current}
    if extra:
        await asyncio.wait(extra, timeout=within)
    leaked = sorted(t.get_name() for t in extra if not t.done())
    assert leaked == [], f"tasks still running: {leaked}"
    await wait_disconnected(bookies, within)
    ports = [b.port for b in bookies if b.port]
    assert tcp_connections(ports) == 0, "a socket of this process is still connected to a bookie"
    gc.collect()  # objects already dropped may still hold a descriptor until collected
    now = fd_targets()
    fds = len(now)
    new = {fd: t for fd, t in now.items() if before.targets.get(fd) != t}
    assert fds <= before.fds, (
        f"{fds - before.fds} file descriptors more than before; new or reused: {_describe(new)}"
    )
