"""An asyncio face on kazoo: every ZooKeeper call is awaitable and never blocks the event loop.

How the bridge works, and why:

* Data calls use kazoo's `*_async` methods. Each returns an IAsyncResult whose `rawlink`
  callback runs on kazoo's completion thread; that callback only hands the outcome to the loop
  (`_post`). No thread is parked per call, so there is nothing to bound:
  kazoo already pipelines every request over its one connection, and a cancelled awaiter simply
  drops the answer when it arrives.
* Children watches use kazoo's ChildrenWatch recipe, which re-arms the one-shot ZooKeeper watch
  after every event and re-reads after a reconnect or a new session. It fetches synchronously
  when built, so it is built on a small bounded executor.
* Data watches (`_DataWatch`) re-arm with the asynchronous calls instead: kazoo's DataWatch
  re-reads with a blocking call on its one callback thread, so a broker took in one partition
  state change per ZooKeeper round trip, and a controlled shutdown that moved 1,000 leaderships
  reached the other brokers seconds later; setting up thousands of them took as long. Ours
  pipeline every read over the connection, re-arm what failed once connected again, and re-read
  everything after a new session (whose server-side watches are gone).
* Partition states are followed with one persistent recursive watch on their subtree
  (`watch_tree`) and read in multiRead batches (`get_many`), both ZooKeeper 3.6+ requests that
  kazoo lacks (riverbed.coordination.zk_wire). A data watch per state cost a read per event to
  set it again: a broker took in a 5,000-partition leadership change at ~200 us of kazoo's
  Python per partition, on the one thread all its ZooKeeper calls share.
* Every outcome and watch callback reaches the loop in order, through one inbox that wakes the
  loop once per burst (`_post`), not once per callback.
* kazoo waits on its sockets with poll(2) (`_PollingHandler`), not a new epoll instance per
  wait.
* Lifecycle steps that kazoo only offers as blocking calls (stopping joins its threads;
  creating a missing chroot needs a session outside the chroot) run in a worker thread.
* Connection state changes are forwarded to the loop as `ConnectionState`, which separates a
  resumed session (ephemerals intact) from a new one (ephemerals must be recreated).

kazoo's exceptions are translated once, here, into the `ZkError` family below, so nothing above
this module imports kazoo.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import enum
import logging
import selectors
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from kazoo import exceptions as kazoo_errors
from kazoo.client import KazooState
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.handlers.utils import selector_select
from kazoo.recipe.watchers import ChildrenWatch
from kazoo.retry import KazooRetry
from kazoo.security import make_digest_acl
from riverbed.coordination.zk_wire import NO_NODE_CODE, AddWatch, MultiRead, TreeWatchingClient

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_MS: Final = 15_000
SESSION_TIMEOUT_MS: Final = 18_000  # Kafka's zookeeper.session.timeout.ms default
# kazoo's default reconnect backoff grows to 60 s; a restarted ZooKeeper should be found quickly.
RECONNECT_DELAY_MS_MAX: Final = 1_000
# Children watch recipes do one blocking read when built; this many may be built at once.
WATCH_SETUP_THREADS_MAX: Final = 4
# A data watch whose read failed while connected (not a lost connection) is retried after this.
WATCH_RETRY_MS: Final = 200
# Reads per multiRead request (get_many): a partition state answer is ~170 bytes with its stat,
# so one response stays far below ZooKeeper's 1 MiB packet limit (jute.maxbuffer).
MULTI_READ_PATHS_MAX: Final = 1_000

T = TypeVar("T")


class ConnectionState(enum.Enum):
    CONNECTED = "connected"  # a new session: the first one, or the one after LOST
    SUSPENDED = "suspended"  # connection dropped; the session may still be alive
    RECONNECTED = "reconnected"  # the same session resumed: ephemerals and watches intact
    LOST = "lost"  # the session expired or was closed: its ephemerals are gone


class ZkError(Exception):
    """A ZooKeeper operation failed; `path` is the znode it concerned, if any."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class ZkVersionError(ZkError):
    """The server does not know a request (ZooKeeper's UNIMPLEMENTED): it is older than 3.6."""


class NoNodeError(ZkError):
    pass


class NodeExistsError(ZkError):
    pass


class BadVersionError(ZkError):
    pass


class NotEmptyError(ZkError):
    pass


class ZkConnectionError(ZkError):
    """Not connected: the connection was lost, the session expired, or the client is closed."""


class NoAuthError(ZkError):
    """The znode's ACL does not allow this session (no or other digest credentials)."""


_TRANSLATIONS: Final[tuple[tuple[type[Exception], type[ZkError]], ...]] = (
    (kazoo_errors.NoNodeError, NoNodeError),
    (kazoo_errors.NodeExistsError, NodeExistsError),
    (kazoo_errors.BadVersionError, BadVersionError),
    (kazoo_errors.NotEmptyError, NotEmptyError),
    (kazoo_errors.NoAuthError, NoAuthError),
    (kazoo_errors.AuthFailedError, NoAuthError),
    (kazoo_errors.ConnectionLoss, ZkConnectionError),
    (kazoo_errors.SessionExpiredError, ZkConnectionError),
    (kazoo_errors.ConnectionClosedError, ZkConnectionError),
    (kazoo_errors.ZookeeperStoppedError, ZkConnectionError),
    (kazoo_errors.UnimplementedError, ZkVersionError),
    (kazoo_errors.ZookeeperError, ZkError),
    (kazoo_errors.KazooException, ZkError),
)


def translate_error(error: BaseException, path: str | None) -> BaseException:
    for kazoo_type, ours in _TRANSLATIONS:
        if isinstance(error, kazoo_type):
            name = type(error).__name__
            where = f" at {path}" if path else ""
            return ours(f"{name}{where}{': ' if str(error) else ''}{error}", path)
    return error


@dataclass(frozen=True, slots=True)
class NodeStat:
    version: int  # data version, the one conditional writes compare against
    children_version: int
    ephemeral_owner: int  # session id owning an ephemeral node, else 0
    created_zxid: int
    modified_zxid: int
    created_ms: int
    modified_ms: int
    data_length: int
    children_count: int

    @classmethod
    def from_kazoo(cls, stat: Any) -> NodeStat:
        return cls(
            version=stat.version,
            children_version=stat.cversion,
            ephemeral_owner=stat.ephemeralOwner,
            created_zxid=stat.czxid,
            modified_zxid=stat.mzxid,
            created_ms=stat.ctime,
            modified_ms=stat.mtime,
            data_length=stat.dataLength,
            children_count=stat.numChildren,
        )


# Transaction operations (all applied atomically, or none).
@dataclass(frozen=True, slots=True)
class CheckOp:
    path: str
    version: int


@dataclass(frozen=True, slots=True)
class CreateOp:
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequence: bool = False


@dataclass(frozen=True, slots=True)
class SetOp:
    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True, slots=True)
class DeleteOp:
    path: str
    version: int = -1


TransactionOp = CheckOp | CreateOp | SetOp | DeleteOp
# Per op: the created path for CreateOp, the new stat for SetOp, True for CheckOp / DeleteOp.
TransactionResult = str | NodeStat | bool

ChildrenCallback = Callable[[list[str]], None]
# (data, stat); both None while the node does not exist.
DataCallback = Callable[[bytes | None, NodeStat | None], None]
StateCallback = Callable[[ConnectionState], None]
# A znode below a watched tree changed; None: events may have been missed, read again.
TreeCallback = Callable[[str | None], None]


@dataclass(frozen=True, slots=True)
class _TreeWatch:
    prefix: str  # the watched path, ending in "/"
    handle: WatchHandle
    callback: TreeCallback


class WatchHandle:
    """Stops a watch: no callback runs on the loop after `cancel()` returns."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def split_chroot(hosts: str) -> tuple[str, str]:
    """`"h1:2181,h2:2181/riverbed"` -> `("h1:2181,h2:2181", "/riverbed")`; chroot may be ""."""
    slash = hosts.find("/")
    if slash < 0:
        return hosts, ""
    chroot = hosts[slash:].rstrip("/")
    if chroot and any(not part for part in chroot[1:].split("/")):
        raise ValueError(f"malformed chroot in ZooKeeper connect string {hosts!r}")
    return hosts[:slash], chroot


@dataclass(frozen=True, slots=True)
class ZkDigest:
    """Credentials of ZooKeeper's `digest` scheme (zkCli's `addauth digest user:password`).

    The session always authenticates with them. With `set_acl`, every znode it creates (and a
    chroot it creates) gets the ACL `digest:user:<base64 SHA-1 of user:password>` with every
    permission and nothing for anyone else: only sessions with the same credentials can read or
    change it. The password itself is not stored in ZooKeeper."""

    username: str
    password: str
    set_acl: bool = False

    def __post_init__(self) -> None:
        if not self.username or ":" in self.username or not self.password:
            raise ValueError("ZooKeeper digest credentials are written user:password")

    def __repr__(self) -> str:  # never log the password
        return f"ZkDigest(username={self.username!r}, set_acl={self.set_acl})"

    @classmethod
    def parse(cls, text: str, *, set_acl: bool = False) -> ZkDigest:
        username, _, password = text.partition(":")
        return cls(username, password, set_acl)


# What the command-line tools that talk to ZooKeeper directly (riverbed users, riverbed acls
# --zookeeper, riverbed cluster up) read their credentials from: the variables that set the
# broker's zookeeper.auth.digest and zookeeper.set.acl (riverbed.cli.env_config's convention).
DIGEST_ENV: Final = "RIVERBED_ZOOKEEPER_AUTH_DIGEST"
SET_ACL_ENV: Final = "RIVERBED_ZOOKEEPER_SET_ACL"


def digest_from_environment(environ: Mapping[str, str]) -> ZkDigest | None:
    """The tools' ZooKeeper credentials: RIVERBED_ZOOKEEPER_AUTH_DIGEST=user:password, with
    RIVERBED_ZOOKEEPER_SET_ACL=true to protect what they create; None without them."""
    text = environ.get(DIGEST_ENV)
    if not text:
        return None
    set_acl = environ.get(SET_ACL_ENV, "false").strip().lower()
    if set_acl not in ("true", "false"):
        raise ValueError(f"{SET_ACL_ENV} must be true or false, got {set_acl!r}")
    return ZkDigest.parse(text, set_acl=set_acl == "true")


class AsyncZooKeeper:
    """One ZooKeeper session. Connect string `host:port[,host:port...][/chroot]`."""

    def __init__(
        self,
        hosts: str,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
        connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
        digest: ZkDigest | None = None,
    ) -> None:
        self.hosts = hosts
        self.digest = digest
        self.servers, self.chroot = split_chroot(hosts)
        self.session_timeout_ms = session_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self.state = ConnectionState.LOST  # changed on the loop only, in _deliver_state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._kazoo_state: Any = KazooState.LOST  # read and written on kazoo's connection thread
        self._state_listeners: list[StateCallback] = []
        self._connected = asyncio.Event()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # Live data watches (pruned of cancelled ones as they are met), and those whose last
        # read failed, to re-arm once connected; both touched on the loop only.
        self._data_watches: set[_DataWatch] = set()
        self._stalled_watches: set[_DataWatch] = set()
        self._stalled_retry: asyncio.TimerHandle | None = None
        # Calls for the loop from kazoo's threads (`_post`), in order; `_inbox_posted` says the
        # loop has been asked to take them.
        self._inbox: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = (
            collections.deque()
        )
        self._inbox_lock = threading.Lock()
        self._inbox_posted = False
        # Persistent recursive watches (watch_tree), set again after every reconnect by
        # `_tree_restore`; touched on the loop only.
        self._tree_watches: list[_TreeWatch] = []
        self._tree_restore: asyncio.Task[None] | None = None

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (creating the chroot if missing); raise ZkConnectionError after the timeout."""
        if self._client is not None:
            raise RuntimeError("AsyncZooKeeper is already started")
        self._loop = asyncio.get_running_loop()
        if self.chroot:
            await asyncio.to_thread(self._ensure_chroot_blocking)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=WATCH_SETUP_THREADS_MAX, thread_name_prefix="zk-watch-setup"
        )
        self._client = self._new_client(self.hosts)
        self._client.add_listener(self._on_kazoo_state)
        self._client.start_async()
        try:
            async with asyncio.timeout(self.connect_timeout_ms / 1000):
                await self._connected.wait()
        except TimeoutError:
            await self.stop()
            raise ZkConnectionError(
                f"could not connect to ZooKeeper at {self.hosts} within "
                f"{self.connect_timeout_ms} ms"
            ) from None

    async def stop(self) -> None:
        """Close the session (its ephemerals go at once) and join kazoo's threads. Idempotent."""
        if self._tree_restore is not None:
            self._tree_restore.cancel()
            await asyncio.gather(self._tree_restore, return_exceptions=True)
            self._tree_restore = None
        client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(_close_blocking, client)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        self._connected.clear()

    async def __aenter__(self) -> AsyncZooKeeper:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def session_id(self) -> int | None:
        if self._client is None:
            return None
        session: int | None = self._client.client_id[0] if self._client.client_id else None
        return session

    def add_state_listener(self, callback: StateCallback) -> None:
        """`callback(state)` runs on the loop for every connection state change."""
        self._state_listeners.append(callback)

    def remove_state_listener(self, callback: StateCallback) -> None:
        self._state_listeners.remove(callback)

    async def wait_connected(self, timeout_ms: int) -> None:
        async with asyncio.timeout(timeout_ms / 1000):
            await self._connected.wait()

    # ---- data calls -------------------------------------------------------------------------

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str:
        """Create a znode; return its path (with the sequence suffix when `sequence`)."""
        result = self._kazoo.create_async(
            path, data, ephemeral=ephemeral, sequence=sequence, makepath=makepath
        )
        created: str = await self._bridge(result, path, _identity)
        return created

    async def get(self, path: str) -> tuple[bytes, NodeStat]:
        result = self._kazoo.get_async(path)
        return await self._bridge(result, path, _data_and_stat)

    async def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, NodeStat] | None]:
        """Read every path (no watches) in multiRead requests of MULTI_READ_PATHS_MAX, sent at
        once (ZooKeeper 3.6+): each one's data and stat, None where it does not exist. Raises
        ZkError if a request fails (the reads are then to be retried as a whole)."""
        client = self._kazoo
        chunks = [
            paths[start : start + MULTI_READ_PATHS_MAX]
            for start in range(0, len(paths), MULTI_READ_PATHS_MAX)
        ]
        answers = [
            self._send(MultiRead([client.rooted(path) for path in chunk]), chunk[0])
            for chunk in chunks
        ]
        found: list[tuple[bytes, NodeStat] | None] = []
        for chunk, outcomes in zip(chunks, await asyncio.gather(*answers), strict=True):
            for path, outcome in zip(chunk, outcomes, strict=True):
                if isinstance(outcome, int):
                    if outcome != NO_NODE_CODE:
                        raise translate_error(kazoo_errors.EXCEPTIONS[outcome](), path)
                    found.append(None)
                else:
                    found.append((outcome[0], NodeStat.from_kazoo(outcome[1])))
        return found

    async def set(self, path: str, data: bytes, version: int = -1) -> NodeStat:
        """Write data; with `version` >= 0 only if the node is at that version (BadVersionError)."""
        result = self._kazoo.set_async(path, data, version)
        return await self._bridge(result, path, NodeStat.from_kazoo)

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        """Delete a node; `recursive` first deletes its subtree (not atomically)."""
        if recursive:
            for child in await self.get_children(path):
                # NoNodeError: deleted concurrently, which is the goal anyway.
                with contextlib.suppress(NoNodeError):
                    await self.delete(f"{path.rstrip('/')}/{child}", recursive=True)
        await self._bridge(self._kazoo.delete_async(path, version), path, _identity)

    async def exists(self, path: str) -> NodeStat | None:
        result = self._kazoo.exists_async(path)
        return await self._bridge(result, path, _optional_stat)

    async def get_children(self, path: str) -> list[str]:
        result = self._kazoo.get_children_async(path)
        children: list[str] = await self._bridge(result, path, _identity)
        return children

    async def ensure_path(self, path: str) -> None:
        """Create `path` and any missing parents; no error if it exists."""
        await self._bridge(self._kazoo.ensure_path_async(path), path, _identity)

    async def transaction(self, ops: Sequence[TransactionOp]) -> list[TransactionResult]:
        """Apply all `ops` atomically. On failure nothing is applied and the error of the
        failing op is raised (its `.path` names the znode)."""
        if not ops:
            raise ValueError("a transaction needs at least one operation")
        request = self._kazoo.transaction()
        for op in ops:
            _add_to_transaction(request, op)
        results: list[Any] = await self._bridge(request.commit_async(), None, _identity)
        for op, outcome in zip(ops, results, strict=True):
            if isinstance(outcome, Exception) and not isinstance(
                outcome, kazoo_errors.RolledBackError
            ):
                raise translate_error(outcome, op.path)
        return [_transaction_result(op, outcome) for op, outcome in zip(ops, results, strict=True)]

    # ---- watches ----------------------------------------------------------------------------

    async def watch_children(self, path: str, callback: ChildrenCallback) -> WatchHandle:
        """Call `callback(children)` on the loop now and after every change of `path`'s children,
        across reconnects and new sessions, until the handle is cancelled. The node must exist
        (NoNodeError); if it is deleted later the watch ends."""
        handle = WatchHandle(path)
        delivered = False

        def on_children(children: list[str]) -> bool:  # kazoo thread
            nonlocal delivered
            delivered = True
            if handle.cancelled:
                return False  # tells the recipe to stop
            self._post(_deliver_children, handle, callback, sorted(children))
            return True

        await self._build_watch(lambda client: ChildrenWatch(client, path, on_children))
        if not delivered:
            raise NoNodeError(f"cannot watch the children of missing node {path}", path)
        return handle

    async def watch_tree(self, path: str, callback: TreeCallback) -> WatchHandle:
        """Call `callback(znode)` on the loop for every znode below `path` created, changed or
        deleted, until the handle is cancelled: one persistent recursive watch (ZooKeeper
        3.6+), never set again per event. `callback(None)` means events may have been missed
        (the connection was lost, or the session): read what matters below `path` again. It
        comes once the watch is set anew, so nothing after that read is missed.

        The session must hold no other watch on `path` itself: ZooKeeper before 3.9 keeps one
        watch mode per path and session (ZOOKEEPER-4466), so a children watch there and this
        one replace each other (the one set last wins, and this one is set again after every
        reconnect). Watches on znodes below `path` are fine."""
        handle = WatchHandle(path)
        self._kazoo.watch_tree_root(path)
        self._tree_watches.append(_TreeWatch(path.rstrip("/") + "/", handle, callback))
        try:
            await self._add_tree_watch(path)
        except BaseException:
            handle.cancel()
            raise
        return handle

    async def _add_tree_watch(self, path: str) -> None:
        try:
            await self._send(AddWatch(self._kazoo.rooted(path)), path)
        except ZkVersionError as error:
            raise ZkVersionError(
                f"ZooKeeper at {self.servers} does not know addWatch (persistent watches): "
                "Riverbed needs ZooKeeper 3.6 or later",
                path,
            ) from error

    def _send(self, request: MultiRead | AddWatch, path: str) -> asyncio.Future[Any]:
        """Send a request kazoo has no method for (riverbed.coordination.zk_wire); its answer,
        as the bridged calls answer."""
        client = self._kazoo
        result = client.handler.async_result()
        client._call(request, result)
        return self._bridge(result, path, _identity)

    def _on_tree_event(self, path: str) -> None:  # kazoo connection thread
        self._post(self._deliver_tree_event, path)

    def _deliver_tree_event(self, path: str) -> None:  # loop
        for watch in self._tree_watches:
            if path.startswith(watch.prefix) and not watch.handle.cancelled:
                watch.callback(path)

    def _restore_tree_watches(self) -> None:  # loop, once connected again
        self._tree_watches = [w for w in self._tree_watches if not w.handle.cancelled]
        if self._tree_restore is not None:
            self._tree_restore.cancel()  # begun on the connection before: begin again
            self._tree_restore = None
        if self._tree_watches:
            self._tree_restore = self._require_loop().create_task(
                self._rewatch_trees(), name="zk-tree-watches"
            )

    async def _rewatch_trees(self) -> None:
        for watch in list(self._tree_watches):
            try:
                await self._add_tree_watch(watch.handle.path)
            except ZkError as error:  # lost again: the next reconnect begins again
                log.warning("could not watch %s again: %s", watch.handle.path, error)
                return
            if not watch.handle.cancelled:
                watch.callback(None)

    async def watch_data(self, path: str, callback: DataCallback) -> WatchHandle:
        """Call `callback(data, stat)` on the loop now and after every change of `path` (create,
        set, delete: `(None, None)` while it does not exist), across reconnects and new
        sessions, until the handle is cancelled. Raises ZkError if the first read fails."""
        handle = WatchHandle(path)
        watch = _DataWatch(self, path, handle, callback, self._require_loop().create_future())
        self._data_watches.add(watch)  # a new session re-arms it, also before its first read
        watch.arm()
        try:
            await watch.first_read
        except BaseException:  # failed, or the caller was cancelled: nothing may fire later
            handle.cancel()
            self._data_watches.discard(watch)
            raise
        return handle

    def _stall(self, watch: _DataWatch) -> None:  # loop
        """`watch`'s read failed: re-arm it once connected (at once if we still are)."""
        if watch.handle.cancelled:
            self._data_watches.discard(watch)
            return
        self._stalled_watches.add(watch)
        if self._connected.is_set() and self._stalled_retry is None:
            self._stalled_retry = self._require_loop().call_later(
                WATCH_RETRY_MS / 1000, self._rearm_stalled
            )

    def _rearm_stalled(self) -> None:  # loop
        self._stalled_retry = None
        stalled, self._stalled_watches = self._stalled_watches, set()
        for watch in stalled:
            watch.arm()

    def _rearm_all(self) -> None:  # loop, on a new session: the server forgot every watch
        self._stalled_watches.clear()
        for watch in list(self._data_watches):
            if watch.handle.cancelled:
                self._data_watches.discard(watch)
            else:
                watch.arm()

    # ---- internals --------------------------------------------------------------------------

    @property
    def _kazoo(self) -> Any:
        if self._client is None:
            raise ZkConnectionError(f"AsyncZooKeeper for {self.hosts} is not started")
        return self._client

    def _new_client(self, hosts: str) -> Any:
        digest = self.digest
        auth: dict[str, Any] = {}
        if digest is not None:
            auth["auth_data"] = [("digest", f"{digest.username}:{digest.password}")]
            if digest.set_acl:
                auth["default_acl"] = [make_digest_acl(digest.username, digest.password, all=True)]
        return TreeWatchingClient(
            hosts=hosts,
            on_tree_event=self._on_tree_event,
            handler=_PollingHandler(),
            timeout=self.session_timeout_ms / 1000,
            connection_retry=KazooRetry(max_tries=-1, max_delay=RECONNECT_DELAY_MS_MAX / 1000),
            command_retry=KazooRetry(max_tries=3, max_delay=RECONNECT_DELAY_MS_MAX / 1000),
            **auth,
        )

    def _ensure_chroot_blocking(self) -> None:
        client = self._new_client(self.servers)
        try:
            client.start(timeout=self.connect_timeout_ms / 1000)
            client.ensure_path(self.chroot)
        except kazoo_errors.KazooException as error:
            raise translate_error(error, self.chroot) from error
        except (TimeoutError, KazooTimeoutError) as error:  # kazoo's is not a TimeoutError
            raise ZkConnectionError(
                f"could not connect to ZooKeeper at {self.servers} within "
                f"{self.connect_timeout_ms} ms",
                self.chroot,
            ) from error
        finally:
            _close_blocking(client)

    def _bridge(
        self, result: Any, path: str | None, convert: Callable[[Any], T]
    ) -> asyncio.Future[T]:
        loop = self._require_loop()
        future: asyncio.Future[T] = loop.create_future()

        def on_complete(done: Any) -> None:  # kazoo completion thread
            try:
                value = convert(done.get())
            except Exception as error:  # handed to the awaiter, translated
                self._post(_settle_exception, future, translate_error(error, path))
            else:
                self._post(_settle_result, future, value)

        result.rawlink(on_complete)
        return future

    async def _build_watch(self, build: Callable[[Any], object]) -> None:
        loop = self._require_loop()
        client = self._kazoo
        try:
            await loop.run_in_executor(self._executor, build, client)
        except kazoo_errors.KazooException as error:
            raise translate_error(error, None) from error

    def _post(self, function: Callable[..., None], *args: Any) -> None:
        """Run `function(*args)` on the loop, after everything posted before it; from any
        thread. Calls posted while the loop has not yet taken the earlier ones wait in the inbox
        and cost no wake-up of their own: a controller's transaction fires a watch per
        partition it wrote, and each one used to write to the loop's self-pipe."""
        loop = self._require_loop()
        with self._inbox_lock:
            self._inbox.append((function, args))
            if self._inbox_posted:
                return
            self._inbox_posted = True
        try:
            loop.call_soon_threadsafe(self._take_inbox)
        except RuntimeError:
            log.debug("event loop closed; dropped ZooKeeper callbacks")

    def _take_inbox(self) -> None:  # loop
        with self._inbox_lock:
            posted, self._inbox = self._inbox, collections.deque()
            self._inbox_posted = False
        for function, args in posted:
            try:
                function(*args)
            except Exception:  # one failing callback must not drop the ones behind it
                log.exception("a ZooKeeper callback failed")

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("AsyncZooKeeper.start() has not been awaited")
        return self._loop

    def _on_kazoo_state(self, kazoo_state: Any) -> None:  # kazoo connection thread
        previous, self._kazoo_state = self._kazoo_state, kazoo_state
        if kazoo_state == KazooState.CONNECTED:
            resumed = previous == KazooState.SUSPENDED
            state = ConnectionState.RECONNECTED if resumed else ConnectionState.CONNECTED
        elif kazoo_state == KazooState.SUSPENDED:
            state = ConnectionState.SUSPENDED
        else:
            state = ConnectionState.LOST
        self._post(self._deliver_state, state)

    def _deliver_state(self, state: ConnectionState) -> None:  # loop
        self.state = state
        if state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            self._connected.set()
            if state is ConnectionState.CONNECTED:
                self._rearm_all()
            else:
                self._rearm_stalled()  # the resumed session kept the armed ones
            # kazoo restores one-shot watches on a reconnect, never persistent ones.
            self._restore_tree_watches()
        else:
            self._connected.clear()
        for listener in list(self._state_listeners):
            listener(state)


# kazoo's waits on its sockets through `selector_select` with this in place of the selectors
# module: PollSelector (poll(2)) instead of DefaultSelector (epoll).
_POLL_SELECTORS: Final = types.SimpleNamespace(
    EVENT_READ=selectors.EVENT_READ,
    EVENT_WRITE=selectors.EVENT_WRITE,
    DefaultSelector=selectors.PollSelector,
)


class _PollingHandler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's threading handler, waiting with poll(2).

    kazoo's connection thread waits on its sockets before every read and every write, and each
    wait builds a new selector. An epoll selector costs three more system calls per wait
    (epoll_create1, epoll_ctl, close): py-spy found that wait was most of the thread's time while
    5,000 data watches were armed or re-armed, and that thread is what bounds how fast a broker
    takes in a controller's leadership changes. poll(2) needs no kernel object and, unlike
    select(2), takes any file descriptor number."""

    def select(self, *args: Any, **kwargs: Any) -> Any:
        return selector_select(*args, selectors_module=_POLL_SELECTORS, **kwargs)


# Failures that a later read, once connected again, can overcome.
_CONNECTION_LOST: Final = (kazoo_errors.ConnectionLoss, kazoo_errors.SessionExpiredError)


class _DataWatch:
    """One data watch, re-armed after each event with an asynchronous read (see the module
    docstring). Reads on a missing znode arm an existence watch instead, which fires on its
    creation. kazoo keeps one watcher per path and callable, and a bound method of the same
    object compares equal, so re-arming never stacks duplicate callbacks."""

    __slots__ = ("_callback", "_owner", "_settled", "first_read", "handle", "path")

    def __init__(
        self,
        owner: AsyncZooKeeper,
        path: str,
        handle: WatchHandle,
        callback: DataCallback,
        first_read: asyncio.Future[None],
    ) -> None:
        self._owner = owner
        self.path = path
        self.handle = handle
        self._callback = callback
        self.first_read = first_read  # settled on the loop by the first read's outcome
        # Whether the first outcome was seen; only the completion thread (FIFO) touches it.
        self._settled = False

    def arm(self) -> None:  # any thread
        if self.handle.cancelled:
            return
        try:
            client = self._owner._kazoo
            client.get_async(self.path, watch=self._on_event).rawlink(self._on_read)
        except Exception as error:  # a stopped or closing client
            self._failed(error)

    def _on_event(self, _event: Any) -> None:  # kazoo callback thread
        self.arm()

    def _on_read(self, result: Any) -> None:  # kazoo completion thread
        try:
            data, stat = result.get()
        except kazoo_errors.NoNodeError:
            try:
                client = self._owner._kazoo
                client.exists_async(self.path, watch=self._on_event).rawlink(self._on_exists)
            except Exception as error:
                self._failed(error)
            return
        except Exception as error:
            self._failed(error)
            return
        self._deliver(data, NodeStat.from_kazoo(stat))

    def _on_exists(self, result: Any) -> None:  # kazoo completion thread
        try:
            stat = result.get()
        except Exception as error:
            self._failed(error)
            return
        if stat is not None:
            self.arm()  # created since the read: read it (its watch is armed too)
        else:
            self._deliver(None, None)

    def _deliver(self, data: bytes | None, stat: NodeStat | None) -> None:
        owner = self._owner
        if not self.handle.cancelled:
            owner._post(_deliver_data, self.handle, self._callback, data, stat)
        if not self._settled:
            self._settled = True
            owner._post(_settle_result, self.first_read, None)

    def _failed(self, error: BaseException) -> None:
        owner = self._owner
        if self._settled or isinstance(error, _CONNECTION_LOST):
            # Read again once connected; a first read keeps its caller waiting until then,
            # as a session's watches outlive its connections.
            owner._post(owner._stall, self)
        else:  # the caller of watch_data learns it; the watch is dropped
            self._settled = True
            owner._post(_settle_exception, self.first_read, translate_error(error, self.path))


def _close_blocking(client: Any) -> None:
    client.stop()
    client.close()


def _identity(value: T) -> T:
    return value


def _data_and_stat(value: Any) -> tuple[bytes, NodeStat]:
    data, stat = value
    return data, NodeStat.from_kazoo(stat)


def _optional_stat(value: Any) -> NodeStat | None:
    return None if value is None else NodeStat.from_kazoo(value)


def _add_to_transaction(request: Any, op: TransactionOp) -> None:
    match op:
        case CheckOp(path, version):
            request.check(path, version)
        case CreateOp(path, data, ephemeral, sequence):
            request.create(path, data, ephemeral=ephemeral, sequence=sequence)
        case SetOp(path, data, version):
            request.set_data(path, data, version)
        case DeleteOp(path, version):
            request.delete(path, version)


def _transaction_result(op: TransactionOp, outcome: Any) -> TransactionResult:
    if isinstance(op, CreateOp):
        created: str = outcome
        return created
    if isinstance(op, SetOp):
        return NodeStat.from_kazoo(outcome)
    return True


def _settle_result(future: asyncio.Future[T], value: T) -> None:
    if not future.done():  # the awaiter may have been cancelled meanwhile
        future.set_result(value)


def _settle_exception(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _deliver_children(handle: WatchHandle, callback: ChildrenCallback, children: list[str]) -> None:
    if not handle.cancelled:
        callback(children)


def _deliver_data(
    handle: WatchHandle, callback: DataCallback, data: bytes | None, stat: NodeStat | None
) -> None:
    if not handle.cancelled:
        callback(data, stat)
