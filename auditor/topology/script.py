"""The topology script is the operator's program, and whatever it starts is too, yet a check
waits on its answer; nothing it does may stall or flood the auditor, or quietly make up a
rack.

BookKeeper's topology script (`ScriptBasedMapping`), run as the outside input it is.

Every call is bounded three ways:

* Time: the script runs in a process group of its own (a new session), and
  when the call outlasts its limit the whole group is killed with SIGKILL.
  Killing only the script is not enough: a child it left behind (`cmd &`)
  inherits stdout, and a reader waiting for end-of-file would wait for that
  child, past any limit on the script itself.
* Size: stdout is read as it arrives and more than `SCRIPT_OUTPUT_CAP` bytes
  is an error, the group killed at once; only the tail of stderr is kept.
* Content: every location printed must be one BookKeeper's network topology
  takes (`locations.topology_location`; all of one depth, as
  `NetworkTopologyImpl.add` requires), else the error names the script and
  the output line. The file and znode sources stay lenient; a script's words
  are what BookKeeper itself would be handed.

Upstream's ScriptBasedMapping runs the script with neither a time limit nor
an output limit, and a failing script there silently gives every host of the
call the default rack; here it is an error (exit 2), because a placement
verdict on a rack map that is half made up would be wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from auditor.errors import ConfigError
from auditor.topology.locations import InvalidLocationError, location_depth, topology_location
from auditor.topology.sources import AddressOf, RackSourceError

__all__ = [
    "SCRIPT_OUTPUT_CAP",
    "SCRIPT_TIMEOUT",
    "ScriptMapping",
    "check_script",
    "parse_script_output",
    "run_topology_script",
]

#: Seconds one call of a topology script may take before its process group is killed.
SCRIPT_TIMEOUT = 30.0
#: Bytes of stdout one call may print (a location per host, 100 hosts a call: plenty).
SCRIPT_OUTPUT_CAP = 1024 * 1024
#: Bytes of stderr kept for the error message; the rest is read and dropped.
_STDERR_KEPT = 4096
#: Characters of stderr an error message quotes.
_STDERR_SHOWN = 500
#: Seconds to wait, after killing the group, for the script's exit to be collected.
_REAP_GRACE = 2.0
#: Characters of a bad location an error message quotes.
_TOKEN_SHOWN = 60


class _Call(asyncio.SubprocessProtocol):
    """One call's output, bounded as it arrives; kills the call's process group on demand."""

    def __init__(self, cap: int) -> None:
        loop = asyncio.get_running_loop()
        self.cap = cap
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.over_cap = False
        self.pgid: int | None = None
        self.killed = False
        #: Set once the script has exited and both pipes are closed (every writer gone).
        self.finished: asyncio.Future[None] = loop.create_future()
        #: Set once the script's exit has been collected.
        self.exited: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        # A new session: the script leads its own process group, whose id is its pid.
        self.pgid = transport.get_pid()

    def pipe_data_received(self, fd: int, data: bytes | bytearray) -> None:
        if fd == 1:
            if self.over_cap:
                return
            if len(self.stdout) + len(data) > self.cap:
                self.over_cap = True
                self.stdout = bytearray()
                self.kill_group()
                return
            self.stdout += data
        else:
            self.stderr += data
            if len(self.stderr) > _STDERR_KEPT:
                del self.stderr[: len(self.stderr) - _STDERR_KEPT]

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    def kill_group(self) -> None:
        """SIGKILL to the script and everything it started (once: SIGKILL leaves no one)."""
        if self.pgid is None or self.killed:
            return
        self.killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)


async def run_topology_script(
    script: str,
    hosts: Sequence[str],
    *,
    time_limit: float = SCRIPT_TIMEOUT,
    output_cap: int = SCRIPT_OUTPUT_CAP,
) -> str:
    """Runs the script once with `hosts` as arguments and returns its stdout."""
    loop = asyncio.get_running_loop()
    try:
        transport, call = await loop.subprocess_exec(
            lambda: _Call(output_cap),
            script,
            *hosts,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise ConfigError(f"rack script {script} cannot be run: {exc}") from exc
    timed_out = False
    try:
        try:
            async with asyncio.timeout(time_limit):
                await call.finished
        except TimeoutError:
            timed_out = True
            call.kill_group()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_REAP_GRACE):
                    await call.exited
    except BaseException:
        call.kill_group()  # cancelled: nothing the call started outlives it
        raise
    finally:
        transport.close()
    if call.over_cap:
        raise RackSourceError(
            f"rack script {script} printed more than {output_cap} bytes "
            f"({len(hosts)} host argument(s)); its process group was killed"
        )
    if timed_out:
        raise RackSourceError(
            f"rack script {script} did not finish within {time_limit:g} s "
            f"({len(hosts)} host argument(s)); its process group was killed"
        )
    status = transport.get_returncode()
    if status != 0:
        tail = call.stderr.decode("utf-8", "replace").strip()[-_STDERR_SHOWN:]
        raise RackSourceError(
            f"rack script {script} exited with status {status}" + (f": {tail}" if tail else "")
        )
    try:
        return call.stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RackSourceError(f"rack script {script} printed non-UTF-8 output: {exc}") from exc


def _shown(token: str) -> str:
    return repr(token[:_TOKEN_SHOWN]) + ("..." if len(token) > _TOKEN_SHOWN else "")


def parse_script_output(
    stdout: str, count: int, source: str = "rack script", *, depth: int | None = None
) -> list[str] | None:
    """One location per host, in order; None when the count does not match.

    Every location printed is checked first, whatever the count: one that
    BookKeeper's topology would not take is a RackSourceError naming `source`
    and the output line, as is one whose depth differs from the others (or
    from `depth`, that of the script's earlier answers).
    """
    answers: list[str] = []
    for lineno, line in enumerate(stdout.split("\n"), 1):
        for token in line.split():
            try:
                location = topology_location(token)
            except InvalidLocationError as why:
                raise RackSourceError(
                    f"{source} line {lineno}: location {_shown(token)} {why}"
                ) from None
            levels = location_depth(location)
            if depth is None:
                depth = levels
            elif levels != depth:
                raise RackSourceError(
                    f"{source} line {lineno}: location {_shown(token)} has {levels} level(s) "
                    f"where its other locations have {depth} (BookKeeper's topology keeps "
                    "every bookie at one depth)"
                )
            answers.append(location)
    if len(answers) != count:
        return None
    return answers


@dataclass
class ScriptMapping:
    """BookKeeper's ScriptBasedMapping: hosts in batches, answers cached per host."""

    script: str
    max_args: int = 100
    timeout: float = SCRIPT_TIMEOUT
    output_cap: int = SCRIPT_OUTPUT_CAP
    log: Any = None
    _by_host: dict[str, str | None] = field(default_factory=dict)
    #: Levels of the locations this script has given so far (one depth for all).
    _depth: int | None = field(default=None, init=False)

    @property
    def name(self) -> str:
        return f"script:{self.script}"

    async def locate(self, bookies: Sequence[str], address_of: AddressOf) -> dict[str, str]:
        addresses = await asyncio.gather(*(address_of(b) for b in bookies))
        hosts = {b: a[0] for b, a in zip(bookies, addresses, strict=True) if a is not None}
        todo = list(dict.fromkeys(h for h in hosts.values() if h not in self._by_host))
        for i in range(0, len(todo), self.max_args):
            batch = todo[i : i + self.max_args]
            out = await run_topology_script(
                self.script, batch, time_limit=self.timeout, output_cap=self.output_cap
            )
            parsed = parse_script_output(
                out, len(batch), f"rack script {self.script}", depth=self._depth
            )
            answers: list[str | None]
            if parsed is None:
                if self.log is not None:
                    self.log.warning(
                        "rack script answered the wrong number of locations; "
                        "those hosts get no location from it",
                        script=self.script,
                        hosts=batch,
                        output=out.strip()[:500],
                    )
                answers = [None] * len(batch)
            else:
                if parsed:
                    self._depth = location_depth(parsed[0])
                answers = list(parsed)
            self._by_host.update(zip(batch, answers, strict=True))
        found: dict[str, str] = {}
        for bookie, host in hosts.items():
            loc = self._by_host.get(host)
            if loc is not None:
                found[bookie] = loc
        return found


def check_script(script: str, key: str) -> None:
    """Refuses, before any check starts, a script that is not an executable file."""
    p = Path(script)
    if not p.is_file():
        raise ConfigError(f"{key} {script} does not exist or is not a file")
    if not os.access(p, os.X_OK):
        raise ConfigError(f"{key} {script} is not executable")
