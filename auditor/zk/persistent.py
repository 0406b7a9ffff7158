"""The leader's metadata index and the replication workers must hear of every change below a
subtree (the ledgers root, `underreplication`) without a one-shot watch per znode or a
poll; ZooKeeper 3.6+ has one watch for a whole subtree, which kazoo cannot set.

Persistent recursive watches (ZooKeeper 3.6+ `addWatch`) on top of kazoo 2.11.

kazoo has no API for them (python-zk/kazoo#715 is still open), so this adds
the two pieces it lacks, in our own code, against kazoo's protocol layer:

- the `AddWatch` request (opcode 106: path, mode) and `RemoveWatches`
  (opcode 18: path, watcher type), sent through the client's own request
  queue like any kazoo request, so they are ordered with every other call;
- dispatch of the notifications such a watch produces. The server sends them
  as ordinary watch events (xid -1) for the watched node and every node below
  it, and keeps the watch after firing. kazoo's reader only knows one-shot
  watchers registered for the exact path; we wrap its `_read_watch_event` on
  this client's connection so every event is first offered to the persistent
  watches whose root contains its path, then handled by kazoo as before.

Failure modes, and what callers get told:
- A persistent watch lives on the server with the TCP connection, and kazoo
  does not re-register watches when it reconnects. Any connection loss
  (SUSPENDED) or session loss therefore ends every persistent watch; the
  watch's callback receives `Gap` and the caller must re-add the watch once
  connected again and re-read whatever it derives from the tree, since events
  during the gap are lost.
- A server older than 3.6 answers opcode 106 with an error: `add` raises
  `PersistentWatchUnsupported` and nothing is registered.
Events arrive on kazoo's callback thread in server order; callers hop to
their event loop themselves.
"""

from __future__ import annotations

import enum
import threading
from collections import namedtuple
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import UnimplementedError
from kazoo.protocol.serialization import Watch, int_struct, write_string
from kazoo.protocol.states import Callback

from auditor.store import Event, EventType, Gap, WatchUnsupportedError

ADD_WATCH = 106
REMOVE_WATCHES = 18
#: `WatcherType.Any` of RemoveWatches: one-shot and persistent watches alike.
WATCHER_TYPE_ANY = 3

# kazoo's event type numbers on the wire (ZooKeeper's Watcher.Event.EventType).
_CREATED, _DELETED, _CHANGED, _CHILD = 1, 2, 3, 4


class WatchMode(enum.IntEnum):
    PERSISTENT = 0
    PERSISTENT_RECURSIVE = 1


class PersistentWatchUnsupported(WatchUnsupportedError):
    """The ZooKeeper server does not know `addWatch` (it is older than 3.6)."""


class _AddWatch(namedtuple("_AddWatch", "path mode")):
    type = ADD_WATCH

    def serialize(self) -> bytearray:
        b = bytearray(write_string(self.path))
        b.extend(int_struct.pack(self.mode))
        return b

    @classmethod
    def deserialize(cls, buffer: bytes, offset: int) -> bool:
        return True  # the body is an error code already carried by the reply header


class _RemoveWatches(namedtuple("_RemoveWatches", "path watcher_type")):
    type = REMOVE_WATCHES

    def serialize(self) -> bytearray:
        b = bytearray(write_string(self.path))
        b.extend(int_struct.pack(self.watcher_type))
        return b

    @classmethod
    def deserialize(cls, buffer: bytes, offset: int) -> bool:
        return True


Listener = Callable[[Event | Gap], None]
_TYPES = {_CREATED: EventType.CREATED, _DELETED: EventType.DELETED, _CHANGED: EventType.CHANGED}


class PersistentWatches:
    """The persistent watches of one kazoo client; install once per client."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self._lock = threading.Lock()
        #: chrooted root path -> (recursive, listener)
        self._watches: dict[str, tuple[bool, Listener]] = {}
        conn = client._connection
        original = conn._read_watch_event

        def read_watch_event(buffer: bytes, offset: int) -> Any:
            self._offer(buffer, offset)
            return original(buffer, offset)

        conn._read_watch_event = read_watch_event
        client.add_listener(self._on_state)

    def _full(self, path: str) -> str:
        return ((self.client.chroot or "") + path).rstrip("/") or "/"

    def _offer(self, buffer: bytes, offset: int) -> None:
        watch, _ = Watch.deserialize(buffer, offset)
        kind = _TYPES.get(watch.type)
        if kind is None:  # child events come from one-shot watches only
            return
        with self._lock:
            targets = [
                listener
                for root, (recursive, listener) in self._watches.items()
                if watch.path == root
                or (recursive and watch.path.startswith(root.rstrip("/") + "/"))
            ]
        if not targets:
            return
        event = Event(kind, self.client.unchroot(watch.path))
        for listener in targets:
            self.client.handler.dispatch_callback(Callback("watch", listener, (event,)))

    def _on_state(self, state: KazooState) -> None:
        if state == KazooState.CONNECTED:
            return
        # The server dropped our watches with the connection (kazoo re-adds none).
        with self._lock:
            lost = list(self._watches.values())
            self._watches.clear()
        for _, listener in lost:
            self.client.handler.dispatch_callback(Callback("watch", listener, (Gap(str(state)),)))

    def add_async(self, path: str, listener: Listener, *, recursive: bool = True) -> Any:
        """Sends `addWatch`; the result is set once the server has accepted it.

        The listener is registered before the request goes out: the first
        events may be read before the reply's callback runs, and an event the
        listener did not strictly need (another watch's, for the same change)
        only makes it look again.
        """
        full = self._full(path)
        mode = WatchMode.PERSISTENT_RECURSIVE if recursive else WatchMode.PERSISTENT
        result = self.client.handler.async_result()
        outcome = self.client.handler.async_result()
        with self._lock:
            self._watches[full] = (recursive, listener)

        def done(ar: Any) -> None:
            try:
                ar.get()
            except Exception as exc:
                with self._lock:
                    if self._watches.get(full, (None, None))[1] is listener:
                        del self._watches[full]
                if isinstance(exc, UnimplementedError):
                    exc = PersistentWatchUnsupported(
                        "this ZooKeeper does not support persistent watches (addWatch needs 3.6+)"
                    )
                outcome.set_exception(exc)
                return
            outcome.set(True)

        result.rawlink(done)
        self.client._call(_AddWatch(full, int(mode)), result)
        return outcome

    def remove_async(self, path: str) -> Any:
        """Forgets the watch here and asks the server to drop it."""
        full = self._full(path)
        with self._lock:
            self._watches.pop(full, None)
        result = self.client.handler.async_result()
        self.client._call(_RemoveWatches(full, WATCHER_TYPE_ANY), result)
        return result
