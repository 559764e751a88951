"""Two ZooKeeper 3.6+ requests that kazoo (2.11) does not offer, in kazoo's own request shape.

* `MultiRead` (opcode 22, `multiRead`): many getData reads in one request and one response.
  Reading 5,000 partition states one getData at a time cost ~200 us of kazoo's Python per read,
  on the thread every ZooKeeper call of the broker shares.
* `AddWatch` (opcode 106, `addWatch`) in PERSISTENT_RECURSIVE mode: one watch on a subtree that
  stays set and fires for every create, change and delete below it. A one-shot watch per znode
  has to be set again with a read after every event it delivers.

kazoo sends any object with `type`, `serialize()` and `deserialize(buffer, offset)` through
`KazooClient._call`. It has no table for persistent watches: it looks up the watchers of an event
in `KazooClient._data_watchers` with `pop(path)`, so `TreeWatchingClient` keeps that table as a
`_WatcherTable`, whose `pop` also hands the path to the tree watch covering it. kazoo does not
restore such a watch after a reconnect (it sends SetWatches, not SetWatches2): the owner adds it
again and reads what it covers again (riverbed.coordination.zk).

The wire formats are ZooKeeper's jute records: MultiOperationRecord / MultiResponse with
MultiHeader, GetDataRequest / GetDataResponse, AddWatchRequest and ErrorResponse.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Final

from kazoo.client import KazooClient
from kazoo.protocol.serialization import (
    ZnodeStat,
    int_struct,
    multiheader_struct,
    read_buffer,
    stat_struct,
    write_string,
)

GET_DATA_OPCODE: Final = 4
ERROR_OPCODE: Final = -1
PERSISTENT_RECURSIVE_MODE: Final = 1  # ZooKeeper's AddWatchMode.PERSISTENT_RECURSIVE
NO_NODE_CODE: Final = -101  # KeeperException.Code.NONODE

# One read's outcome: (data, kazoo ZnodeStat), or the ZooKeeper error code of that read.
ReadOutcome = tuple[bytes, Any] | int


class MultiRead:
    """getData of every path (chroot included), without watches; answered with one outcome per
    path, in order."""

    type = 22

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = paths

    def serialize(self) -> bytearray:
        request = bytearray()
        for path in self.paths:
            request += multiheader_struct.pack(GET_DATA_OPCODE, False, -1)
            request += write_string(path)
            request.append(0)  # no watch
        request += multiheader_struct.pack(ERROR_OPCODE, True, -1)
        return request

    def deserialize(self, buffer: bytes, offset: int) -> list[ReadOutcome]:
        outcomes: list[ReadOutcome] = []
        while True:
            opcode, done, _err = multiheader_struct.unpack_from(buffer, offset)
            offset += multiheader_struct.size
            if done:
                break
            if opcode == GET_DATA_OPCODE:
                data, offset = read_buffer(buffer, offset)
                stat = ZnodeStat._make(stat_struct.unpack_from(buffer, offset))
                offset += stat_struct.size
                outcomes.append((b"" if data is None else data, stat))
            elif opcode == ERROR_OPCODE:
                (code,) = int_struct.unpack_from(buffer, offset)
                offset += int_struct.size
                outcomes.append(code)
            else:
                raise ValueError(f"multiRead answered an operation of type {opcode}")
        if len(outcomes) != len(self.paths):
            raise ValueError(f"multiRead answered {len(outcomes)} of {len(self.paths)} reads")
        return outcomes


class AddWatch:
    """A persistent recursive watch on `path` (chroot included)."""

    type = 106

    def __init__(self, path: str) -> None:
        self.path = path

    def serialize(self) -> bytes:
        encoded: bytes = write_string(self.path) + int_struct.pack(PERSISTENT_RECURSIVE_MODE)
        return encoded

    def deserialize(self, _buffer: bytes, _offset: int) -> bool:
        return True  # an ErrorResponse whose code is also the reply header's


class _WatcherTable(defaultdict[str, set[Any]]):
    """kazoo's data-watcher table, which also tells `owner` of every watch event's path."""

    def __init__(self, owner: TreeWatchingClient, initial: dict[str, set[Any]]) -> None:
        super().__init__(set, initial)
        self._owner = owner

    def pop(self, path: str, *default: Any) -> Any:  # kazoo connection thread, per event
        self._owner.tree_event(path)
        return super().pop(path, *default)


class TreeWatchingClient(KazooClient):  # type: ignore[misc]  # kazoo is untyped
    """A KazooClient that routes the events of persistent recursive watches to a callback.

    `on_tree_event(path)` runs on kazoo's connection thread for each event below a root added
    with `watch_tree_root` (the path without the chroot); it must only hand the path on."""

    def __init__(self, *args: Any, on_tree_event: Callable[[str], None], **kwargs: Any) -> None:
        self._tree_lock = threading.Lock()
        self._tree_roots: tuple[str, ...] = ()  # with the chroot, each ending in "/"
        self._on_tree_event = on_tree_event
        super().__init__(*args, **kwargs)

    @property
    def _data_watchers(self) -> _WatcherTable:
        return self._watcher_table

    @_data_watchers.setter
    def _data_watchers(self, table: dict[str, set[Any]]) -> None:
        # kazoo assigns a fresh table when built and when a session ends.
        self._watcher_table = _WatcherTable(self, table)

    def watch_tree_root(self, path: str) -> None:
        """Route events below `path` (chroot excluded) from now on; the AddWatch is sent
        separately (and again after every reconnect)."""
        rooted = (self.chroot + path).rstrip("/") + "/"
        with self._tree_lock:
            if rooted not in self._tree_roots:
                self._tree_roots = (*self._tree_roots, rooted)

    def tree_event(self, path: str) -> None:  # kazoo connection thread
        if path.startswith(self._tree_roots):
            self._on_tree_event(self.unchroot(path))

    def rooted(self, path: str) -> str:
        """`path` as the server knows it (with the chroot)."""
        return self.chroot + path if self.chroot else path
