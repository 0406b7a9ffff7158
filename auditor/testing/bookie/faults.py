"""Tests break an emulated bookie per operation (slow reads, an error status on adds) as
well as wholesale, and the request path must ask one place what to do to each request.

The faults an emulated bookie answers with: latency, and statuses in place of handling.

Both are set per operation or for every operation (`None`), the operation's
own setting winning. Pausing (requests held, connections open), crashing and
turning read-only act on the emulator's lifecycle and request path and stay
there (`emulator.py`); this is the table those paths consult.
"""

from __future__ import annotations

from collections.abc import Callable

from auditor.bookie.protocol import Operation, Status
from auditor.proto import bookkeeper_protocol_pb2 as pb

__all__ = ["FaultTable", "Latency"]

#: A fixed delay in seconds, or one computed per request.
Latency = float | Callable[[pb.Request], float]


class FaultTable:
    """Latency and injected statuses, per operation or for all of them (`None`)."""

    def __init__(self) -> None:
        self._latency: dict[Operation | None, Latency] = {}
        self._statuses: dict[Operation | None, Status] = {}

    def set_latency(self, latency: Latency | None, op: Operation | None) -> None:
        if latency is None:
            self._latency.pop(op, None)
        else:
            self._latency[op] = latency

    def inject_status(self, status: Status | None, op: Operation | None) -> None:
        if status is None:
            self._statuses.pop(op, None)
        else:
            self._statuses[op] = Status(status)

    def clear(self) -> None:
        self._latency.clear()
        self._statuses.clear()

    def delay(self, op: Operation, request: pb.Request) -> float:
        """Seconds to hold the answer to `request` (0.0 without latency)."""
        latency = self._latency.get(op, self._latency.get(None))
        delay = 0.0
        if latency is not None:
            delay = latency(request) if callable(latency) else latency
        return delay

    def status(self, op: Operation) -> Status | None:
        """The status to answer `op` with instead of handling it, if one is injected."""
        return self._statuses.get(op, self._statuses.get(None))
