"""This broker's ACLs in memory, kept current from ZooKeeper: what the authorizer decides from.

The authorizer never waits on ZooKeeper: it reads `AclCache.snapshot`, an immutable AclSnapshot
that only the cache's one refresher task replaces. When ZooKeeper is unreachable the last
snapshot keeps answering, and the refresher catches up once it is back.

How it stays current (Kafka's AclAuthorizer scheme, whose znodes we share, see acl_layout):

1. `start()` first watches the children of both change-notification paths, noting the newest
   notification each already holds, then loads every ACL znode. A change written after the watch
   was set is either in the load or in a notification still to come, so none is lost.
2. Every new notification is queued; the refresher reads the pattern it names, then that
   pattern's znode, and swaps in a snapshot with it. Notifications are handled in order, one at
   a time, so an older read can never overwrite a newer one.
3. A new ZooKeeper session (the old one expired: notifications may have been deleted meanwhile)
   and a notification that vanished before it was read queue a full reload instead; so do more
   than PENDING_NOTIFICATIONS_MAX waiting notifications (one reload is cheaper then).
4. Notifications older than `change_expiration_ms` (Kafka's 15 minutes) are deleted as they are
   passed, so the change paths stay short.

Writers (AclStore) wait with `wait_applied(notification)` until their own notification went
through step 2, so the next request on this broker sees their change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Final

from riverbed.coordination.layout import MalformedZnodeError
from riverbed.coordination.zk import (
    AsyncZooKeeper,
    ConnectionState,
    NoNodeError,
    WatchHandle,
    ZkError,
)
from riverbed.security.acl import AclEntry, PatternType, ResourcePattern
from riverbed.security.acl_layout import (
    ACL_PATHS,
    ACL_ROOTS,
    CHANGE_PATHS,
    decode_acls,
    decode_change,
    resource_path,
    resource_type_of_dir,
)
from riverbed.security.acl_snapshot import EMPTY_SNAPSHOT, AclSnapshot

log = logging.getLogger(__name__)

# Kafka's ZkNodeChangeNotificationListener deletes notifications older than this.
CHANGE_EXPIRATION_MS: Final = 15 * 60 * 1000
# Past this many notifications waiting, one full reload replaces reading them one by one.
PENDING_NOTIFICATIONS_MAX: Final = 1_000
# ZooKeeper reads in flight at once during a full reload.
LOAD_READS_IN_FLIGHT_MAX: Final = 32
# After a failed refresh (ZooKeeper unreachable), the wait before trying again.
REFRESH_RETRY_BACKOFF_MS: Final = 500
# Expired notifications deleted per pass (the rest go in later passes).
PURGE_PER_PASS_MAX: Final = 100


class AclCache:
    """`start()` once, `stop()` once; `snapshot` at any time (empty until started)."""

    def __init__(
        self, zk: AsyncZooKeeper, *, change_expiration_ms: int = CHANGE_EXPIRATION_MS
    ) -> None:
        self._zk = zk
        self._change_expiration_ms = change_expiration_ms
        self._snapshot = EMPTY_SNAPSHOT
        self._handles: list[WatchHandle] = []
        # Per change path: the children last delivered, and the newest one applied (a sequence
        # name sorts in creation order).
        self._children: dict[str, list[str]] = {}
        self._applied: dict[str, str] = {}
        self._pending: list[tuple[PatternType, str]] = []  # (store, notification name)
        self._reload_wanted = False
        self._wake = asyncio.Event()
        self._applied_changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def snapshot(self) -> AclSnapshot:
        return self._snapshot

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Watch the change notifications, load every ACL, then follow the notifications."""
        for path in ACL_PATHS:
            await self._zk.ensure_path(path)
        for pattern_type, path in CHANGE_PATHS.items():
            self._handles.append(
                await self._zk.watch_children(path, self._on_changes(pattern_type, path))
            )
        self._snapshot = await self._load_all()
        self._zk.add_state_listener(self._on_state)
        self._task = asyncio.create_task(self._refresh_loop(), name="acl-cache")
        self._wake.set()  # notifications that came during the load

    async def stop(self) -> None:
        for handle in self._handles:
            handle.cancel()
        self._handles.clear()
        with contextlib.suppress(ValueError):
            self._zk.remove_state_listener(self._on_state)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def wait_applied(self, notification: str, timeout_ms: int) -> bool:
        """Wait until the change of `notification` (a path as its create returned it) is in the
        snapshot; False if `timeout_ms` passed first (the change is durable in ZooKeeper
        anyway, and arrives with the refresher's next success)."""
        path, _, name = notification.rpartition("/")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while self._applied.get(path, "") < name:
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                return False
            self._applied_changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining_s):
                    await self._applied_changed.wait()
        return True

    # ---- notifications ----------------------------------------------------------------------

    def _on_changes(self, pattern_type: PatternType, path: str) -> Callable[[list[str]], None]:
        def on_children(children: list[str]) -> None:
            first = path not in self._children
            self._children[path] = children
            if first:
                # What is there already is in the load that follows the watch.
                self._applied[path] = children[-1] if children else ""
                return
            applied = self._applied.get(path, "")
            queued = {name for store, name in self._pending if store is pattern_type}
            for name in children:
                if name > applied and name not in queued:
                    self._pending.append((pattern_type, name))
            if len(self._pending) > PENDING_NOTIFICATIONS_MAX:
                self._reload_wanted = True
            self._wake.set()

        return on_children

    def _on_state(self, state: ConnectionState) -> None:
        if state is ConnectionState.CONNECTED:  # a new session: notifications may be gone
            self._reload_wanted = True
            self._wake.set()

    async def _refresh_loop(self) -> None:
        failing = False
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._refresh()
            except ZkError as error:
                # Decisions go on from the snapshot; the work stays queued for the next try.
                # One warning per outage, not one per retry.
                log.log(
                    logging.DEBUG if failing else logging.WARNING,
                    "ACL refresh failed, serving from the cached ACLs until ZooKeeper answers: %s",
                    error,
                )
                failing = True
                await asyncio.sleep(REFRESH_RETRY_BACKOFF_MS / 1000)
                self._wake.set()
            else:
                if failing:
                    log.info("ACL refresh caught up")
                failing = False

    async def _refresh(self) -> None:
        if self._reload_wanted:
            self._reload_wanted = False
            # Everything delivered so far is in the reload.
            delivered = {
                path: children[-1] for path, children in self._children.items() if children
            }
            self._pending.clear()
            try:
                self._snapshot = await self._load_all()
            except BaseException:
                self._reload_wanted = True
                raise
            self._mark_applied(delivered)
        while self._pending and not self._reload_wanted:
            pattern_type, name = self._pending[0]
            path = CHANGE_PATHS[pattern_type]
            await self._apply_notification(pattern_type, f"{path}/{name}")
            self._pending.pop(0)
            self._mark_applied({path: name})
        await self._purge_expired()
        if self._reload_wanted:
            self._wake.set()

    async def _apply_notification(self, pattern_type: PatternType, notification: str) -> None:
        try:
            data, _ = await self._zk.get(notification)
        except NoNodeError:
            log.warning("ACL change %s vanished before it was read: reloading", notification)
            self._reload_wanted = True
            return
        try:
            pattern = decode_change(pattern_type, notification, data)
        except MalformedZnodeError as error:
            log.error("ignoring an ACL change notification: %s", error)
            return
        self._snapshot = self._snapshot.with_entries(pattern, await self._read(pattern))

    def _mark_applied(self, applied: dict[str, str]) -> None:
        for path, name in applied.items():
            if name > self._applied.get(path, ""):
                self._applied[path] = name
        self._applied_changed.set()

    async def _purge_expired(self) -> None:
        """Delete notifications older than the expiration, oldest first, a few per pass."""
        expired_before_ms = time.time() * 1000 - self._change_expiration_ms
        for path, children in self._children.items():
            applied = self._applied.get(path, "")
            for name in children[:PURGE_PER_PASS_MAX]:
                if name > applied:
                    break  # not read yet
                stat = await self._zk.exists(f"{path}/{name}")
                if stat is not None and stat.created_ms >= expired_before_ms:
                    break  # the rest are newer
                with contextlib.suppress(NoNodeError):
                    await self._zk.delete(f"{path}/{name}")

    # ---- reading ACL znodes ------------------------------------------------------------------

    async def _read(self, pattern: ResourcePattern) -> frozenset[AclEntry]:
        """A pattern's entries as ZooKeeper has them now (none when its znode is gone); a
        malformed znode keeps what the snapshot had, rather than dropping a DENY."""
        path = resource_path(pattern)
        try:
            data, _ = await self._zk.get(path)
        except NoNodeError:
            return frozenset()
        try:
            return decode_acls(path, data)
        except MalformedZnodeError as error:
            log.error("ignoring a change of %s: %s", pattern, error)
            return self._snapshot.entries(pattern)

    async def _load_all(self) -> AclSnapshot:
        patterns = [pattern async for pattern in self._stored_patterns()]
        limit = asyncio.Semaphore(LOAD_READS_IN_FLIGHT_MAX)

        async def read(pattern: ResourcePattern) -> frozenset[AclEntry]:
            async with limit:
                return await self._read(pattern)

        entries = await asyncio.gather(*(read(pattern) for pattern in patterns))
        return AclSnapshot(
            {pattern: found for pattern, found in zip(patterns, entries, strict=True) if found}
        )

    async def _stored_patterns(self) -> AsyncIterator[ResourcePattern]:
        for pattern_type, root in ACL_ROOTS.items():
            for type_dir in await self._children_of(root):
                resource_type = resource_type_of_dir(type_dir)
                if resource_type is None:
                    log.warning("ignoring ACLs of unknown resource type %s/%s", root, type_dir)
                    continue
                for name in await self._children_of(f"{root}/{type_dir}"):
                    try:
                        yield ResourcePattern(resource_type, name, pattern_type)
                    except ValueError as error:
                        log.warning("ignoring ACL znode %s/%s/%s: %s", root, type_dir, name, error)

    async def _children_of(self, path: str) -> Iterable[str]:
        try:
            return sorted(await self._zk.get_children(path))
        except NoNodeError:
            return ()
