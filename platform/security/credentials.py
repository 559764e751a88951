"""Users' SCRAM credentials in ZooKeeper, in Kafka's pre-KRaft layout, and the broker's cache.

Each user is one znode, `/config/users/<sanitized name>` (layout.user_config_path), holding the
user configs as Kafka writes them: `{"version":1,"config":{"SCRAM-SHA-512":"salt=<b64>,
stored_key=<b64>,server_key=<b64>,iterations=4096"}}`. Kafka keeps a user's quotas in the same
znode, so writers change only the keys they own: a read-modify-write conditional on the znode's
version, retried when another writer got in between. A user whose last config key goes is
deleted. No `/config/changes/config_change_*` notification is written: Riverbed brokers watch the
user znodes themselves (like every other config they follow), and notifications would need a
purger to keep them from piling up. Kafka's own tools writing into this tree still work: the
watches see their writes, and their notifications are ignored.

`CredentialCache` is what authentication reads (`scram.CredentialLookup`): synchronous, no I/O,
so authentications never wait on ZooKeeper and keep working while it is unreachable.
`CredentialWatcher` keeps it current from watches; its owner starts and stops it, and stop
cancels every watch and task it made.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final

from riverbed.coordination import layout
from riverbed.coordination.layout import MalformedZnodeError, TopicConfigOverrides
from riverbed.coordination.zk import (
    AsyncZooKeeper,
    BadVersionError,
    NodeExistsError,
    NodeStat,
    NoNodeError,
    WatchHandle,
    ZkError,
)
from riverbed.security.scram import ScramCredential, ScramMechanism

log = logging.getLogger(__name__)

# Conditional read-modify-writes retried when other writers change the same user meanwhile.
WRITE_ATTEMPTS_MAX: Final = 8
# Users a broker caches (one data watch each). Far above what SCRAM deployments hold; past it new
# users are not watched (an error is logged) rather than growing memory without bound.
CACHED_USERS_MAX: Final = 100_000
# Kafka's entity for default user quotas; not a user.
DEFAULT_ENTITY: Final = "<default>"
# A user's data watch that could not be set up (ZooKeeper unreachable) is tried again this often,
# until it is set up or the watcher stops.
WATCH_RETRY_MS: Final = 1000


class UnknownUserError(ValueError):
    """The user has none of the SCRAM credentials asked about."""


@dataclass(frozen=True, slots=True)
class UserSummary:
    """What `list_users` tells: never a salt or a key."""

    name: str
    iterations: Mapping[ScramMechanism, int]  # per stored mechanism


def decode_scram_credentials(
    path: str, data: bytes
) -> tuple[dict[ScramMechanism, ScramCredential], dict[str, str]]:
    """A user znode's SCRAM credentials, and every other config key it holds. Raises
    MalformedZnodeError (naming the path and the key) for anything Kafka would not read."""
    config = dict(TopicConfigOverrides.decode_at(path, data).config)
    credentials: dict[ScramMechanism, ScramCredential] = {}
    for mechanism in ScramMechanism:
        text = config.pop(mechanism.value, None)
        if text is None:
            continue
        try:
            credentials[mechanism] = ScramCredential.from_kafka_string(text)
        except ValueError as error:
            raise MalformedZnodeError(path, f"{mechanism.value}: {error}") from None
    return credentials, config


# ---- writers (riverbed users) -------------------------------------------------------------------


async def set_scram_credential(
    zk: AsyncZooKeeper, user: str, mechanism: ScramMechanism, credential: ScramCredential
) -> None:
    """Add or replace `user`'s credential for `mechanism`; other keys stay as they are."""

    def change(config: dict[str, str]) -> dict[str, str]:
        return {**config, mechanism.value: credential.to_kafka_string()}

    await _update_user(zk, user, change)


async def delete_scram_credentials(
    zk: AsyncZooKeeper, user: str, mechanisms: Collection[ScramMechanism] | None = None
) -> tuple[ScramMechanism, ...]:
    """Delete `user`'s credentials for `mechanisms` (all when None); return the ones that
    existed. UnknownUserError if none did."""
    wanted = tuple(ScramMechanism) if mechanisms is None else tuple(mechanisms)
    deleted: tuple[ScramMechanism, ...] = ()

    def change(config: dict[str, str]) -> dict[str, str]:
        nonlocal deleted
        deleted = tuple(m for m in wanted if m.value in config)
        if not deleted:
            names = "/".join(m.value for m in wanted)
            raise UnknownUserError(f"user {user!r} has no {names} credential")
        return {key: value for key, value in config.items() if key not in {m.value for m in wanted}}

    await _update_user(zk, user, change)
    return deleted


async def read_scram_credentials(
    zk: AsyncZooKeeper, user: str
) -> dict[ScramMechanism, ScramCredential]:
    path = layout.user_config_path(user)
    try:
        data, _ = await zk.get(path)
    except NoNodeError:
        return {}
    return decode_scram_credentials(path, data)[0]


async def list_users(zk: AsyncZooKeeper) -> list[UserSummary]:
    """Every user with a SCRAM credential, by name. A znode that cannot be read is reported as
    MalformedZnodeError (an operator should see it), not skipped."""
    try:
        children = await zk.get_children(layout.CONFIG_USERS_PATH)
    except NoNodeError:
        return []
    summaries = []
    for child in sorted(children):
        if child == DEFAULT_ENTITY:
            continue
        path = f"{layout.CONFIG_USERS_PATH}/{child}"
        try:
            name = layout.desanitize_entity_name(child)
            data, _ = await zk.get(path)
        except ValueError as error:
            raise MalformedZnodeError(path, str(error)) from None
        except NoNodeError:
            continue  # deleted while listing
        credentials, _ = decode_scram_credentials(path, data)
        if credentials:
            iterations = {m: c.iterations for m, c in sorted(credentials.items(), key=_by_name)}
            summaries.append(UserSummary(name, iterations))
    return sorted(summaries, key=lambda summary: summary.name)


async def _update_user(
    zk: AsyncZooKeeper, user: str, change: Callable[[dict[str, str]], dict[str, str]]
) -> None:
    """Apply `change` to the user's config keys, conditionally on the znode's version."""
    path = layout.user_config_path(user)
    for _ in range(WRITE_ATTEMPTS_MAX):
        try:
            data, stat = await zk.get(path)
        except NoNodeError:
            config, version = {}, None
        else:
            config, version = dict(TopicConfigOverrides.decode_at(path, data).config), stat.version
        updated = change(dict(config))
        encoded = TopicConfigOverrides(updated).encode()
        try:
            if version is None:
                if updated:
                    await zk.create(path, encoded, makepath=True)
            elif updated:
                await zk.set(path, encoded, version)
            else:
                await zk.delete(path, version)
            return
        except (NodeExistsError, BadVersionError, NoNodeError):
            continue  # another writer got in between: read again
    raise ZkError(f"{path} kept changing under {WRITE_ATTEMPTS_MAX} attempts to update it", path)


def _by_name(item: tuple[ScramMechanism, Any]) -> str:
    return item[0].value


# ---- the broker's cache -------------------------------------------------------------------------


class CredentialCache:
    """Every user's SCRAM credentials, in memory; a `scram.CredentialLookup`. All changes come
    through `apply_user` / `remove_user` (from CredentialWatcher, on the loop)."""

    def __init__(self) -> None:
        self._users: dict[str, Mapping[ScramMechanism, ScramCredential]] = {}

    def credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        credentials = self._users.get(user)
        return None if credentials is None else credentials.get(mechanism)

    def users(self) -> frozenset[str]:
        return frozenset(self._users)

    def apply_user(self, user: str, credentials: Mapping[ScramMechanism, ScramCredential]) -> None:
        if credentials:
            self._users[user] = dict(credentials)
        else:
            self._users.pop(user, None)

    def remove_user(self, user: str) -> None:
        self._users.pop(user, None)


class CredentialWatcher:
    """Owns the watches on /config/users and on each user znode, and folds every change into
    `cache`. A user znode that cannot be decoded is logged and leaves that user without
    credentials (failing closed), without affecting the others."""

    def __init__(self, zk: AsyncZooKeeper, cache: CredentialCache) -> None:
        self.zk = zk
        self.cache = cache
        self._children_handle: WatchHandle | None = None
        self._user_handles: dict[str, WatchHandle | None] = {}  # znode name -> None: being set up
        self._user_names: dict[str, str] = {}  # znode name -> user name
        self._pending: set[asyncio.Task[None]] = set()
        self._stopped = False

    @property
    def running_tasks(self) -> int:
        """Watch setups still in progress (0 once started and after stop)."""
        return len(self._pending)

    @property
    def active_watches(self) -> int:
        handles = [self._children_handle, *self._user_handles.values()]
        return sum(1 for handle in handles if handle is not None and not handle.cancelled)

    async def start(self) -> None:
        """Set up the watches; return once every user known now is in the cache."""
        if self._stopped or self._children_handle is not None:
            raise RuntimeError("a CredentialWatcher starts once")
        await self.zk.ensure_path(layout.CONFIG_USERS_PATH)
        self._children_handle = await self.zk.watch_children(
            layout.CONFIG_USERS_PATH, self._on_users
        )
        while self._pending:  # each listed user schedules its watch
            await asyncio.gather(*list(self._pending))

    async def stop(self) -> None:
        """Cancel every watch and pending setup. The cache keeps what it holds. Idempotent."""
        self._stopped = True
        for handle in [self._children_handle, *self._user_handles.values()]:
            if handle is not None:
                handle.cancel()
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    def _on_users(self, children: list[str]) -> None:
        if self._stopped:
            return
        current = {child for child in children if child != DEFAULT_ENTITY}
        for child in sorted(current - set(self._user_handles)):
            if len(self._user_handles) >= CACHED_USERS_MAX:
                log.error(
                    "more than %d users: %r and later are not loaded", CACHED_USERS_MAX, child
                )
                break
            try:
                user = layout.desanitize_entity_name(child)
            except ValueError:
                log.exception("ignoring user znode %r", child)
                continue
            self._user_handles[child] = None
            self._user_names[child] = user
            self._spawn(self._watch_user(child, user))
        for child in set(self._user_handles) - current:
            handle = self._user_handles.pop(child)
            if handle is not None:
                handle.cancel()
            self.cache.remove_user(self._user_names.pop(child))

    async def _watch_user(self, child: str, user: str) -> None:
        path = f"{layout.CONFIG_USERS_PATH}/{child}"

        def on_data(data: bytes | None, _stat: NodeStat | None) -> None:
            credentials: dict[ScramMechanism, ScramCredential] = {}
            if data is not None:
                try:
                    credentials = decode_scram_credentials(path, data)[0]
                except MalformedZnodeError:
                    log.exception("ignoring the SCRAM credentials of user %r", user)
            self.cache.apply_user(user, credentials)

        while True:
            try:
                handle = await self.zk.watch_data(path, on_data)
                break
            except ZkError:
                log.warning("could not watch %s; trying again in %d ms", path, WATCH_RETRY_MS)
                await asyncio.sleep(WATCH_RETRY_MS / 1000)
            if self._stopped or child not in self._user_handles:
                return
        if self._stopped or child not in self._user_handles:
            handle.cancel()  # gone (or stopped) while the watch was being set up
            return
        self._user_handles[child] = handle

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("user credential watch setup failed", exc_info=task.exception())
