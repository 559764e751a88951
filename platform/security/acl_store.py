"""ACL writes to ZooKeeper: conditional read-modify-writes, each with its change notification;
and what CreateAcls and DeleteAcls mean on top of them (`create`, `delete`), shared by the
broker's handlers and the CLI's ZooKeeper mode.

A pattern's ACLs are one znode (acl_layout). Changing them reads the znode and its version,
applies the change, and writes back in one ZooKeeper transaction that is conditional on that
version (or on the znode not existing yet, or deletes it when no ACL is left) and creates the
change notification every broker's AclCache follows. Two brokers writing one pattern at once
therefore never lose a change: the loser's transaction fails as a whole (no notification either),
and it reads again and re-applies its change, up to WRITE_ATTEMPTS_MAX times with a jittered
backoff (Kafka's AclAuthorizer retries the same way, 10 times). Writes on one broker are also
serialized, as Kafka's are, so its own requests never race each other.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from riverbed.coordination.layout import MalformedZnodeError
from riverbed.coordination.zk import (
    AsyncZooKeeper,
    BadVersionError,
    CreateOp,
    DeleteOp,
    NodeExistsError,
    NoNodeError,
    SetOp,
    TransactionOp,
    ZkError,
)
from riverbed.security.acl import AclBinding, AclBindingFilter, AclEntry, ResourcePattern
from riverbed.security.acl_cache import AclCache
from riverbed.security.acl_layout import (
    change_path,
    decode_acls,
    encode_acls,
    encode_change,
    resource_path,
    type_path,
)
from riverbed.security.acl_snapshot import AclSnapshot, entry_order

# Kafka's AclAuthorizer: maxUpdateRetries 10, retryBackoffMs 100 + up to 50 of jitter.
WRITE_ATTEMPTS_MAX: Final = 10
WRITE_RETRY_BACKOFF_MS: Final = 100
WRITE_RETRY_JITTER_MS: Final = 50
# How long a write waits for this broker's cache to show it before answering anyway (it is
# durable in ZooKeeper by then; only read-your-writes on this broker is at stake).
APPLIED_WAIT_MS_MAX: Final = 10_000

AclChange = Callable[[frozenset[AclEntry]], frozenset[AclEntry]]


class AclWriteError(ZkError):
    """A pattern kept changing under us for WRITE_ATTEMPTS_MAX attempts."""


@dataclass(frozen=True, slots=True)
class AclDeletion:
    """A binding a DeleteAcls filter matched; `error` if its pattern could not be written."""

    binding: AclBinding
    error: Exception | None


@dataclass(frozen=True, slots=True)
class AclWrite:
    """One pattern's ACLs before and after a change; the notification path if it wrote."""

    pattern: ResourcePattern
    before: frozenset[AclEntry]
    after: frozenset[AclEntry]
    notification: str | None


class AclStore:
    def __init__(self, zk: AsyncZooKeeper, cache: AclCache, rng: random.Random | None = None):
        self._zk = zk
        self._cache = cache
        self._rng = rng or random.Random()
        self._lock = asyncio.Lock()

    @property
    def snapshot(self) -> AclSnapshot:
        """This broker's ACLs as its cache has them now."""
        return self._cache.snapshot

    async def read(self, pattern: ResourcePattern) -> frozenset[AclEntry]:
        """A pattern's ACLs as ZooKeeper has them now (DeleteAcls reads patterns a filter names
        exactly, even if this broker's cache has not seen them yet)."""
        entries, _ = await self._read(pattern)
        return entries

    async def create(self, bindings: Sequence[AclBinding]) -> list[Exception | None]:
        """Add `bindings` (one write per pattern); per binding, None or the error that kept it
        out (ZooKeeper unreachable, a pattern that kept changing, a malformed znode). Returns
        once this broker's cache shows the additions."""
        by_pattern: dict[ResourcePattern, list[int]] = {}
        for index, binding in enumerate(bindings):
            by_pattern.setdefault(binding.pattern, []).append(index)
        results: list[Exception | None] = [None] * len(bindings)
        writes = []
        for pattern, indexes in by_pattern.items():
            new = frozenset(bindings[i].entry for i in indexes)
            try:
                writes.append(await self.update(pattern, new.union))
            except (ZkError, MalformedZnodeError) as error:
                for index in indexes:
                    results[index] = error
        await self.wait_applied(writes)
        return results

    async def delete(self, filters: Sequence[AclBindingFilter]) -> list[list[AclDeletion]]:
        """Remove every binding a filter matches; per filter, the bindings it removed (each
        under the first filter, in order, that matches it), with the error of a pattern that
        could not be written. Patterns are those this broker's cache knows plus those a filter
        names exactly, read from ZooKeeper (Kafka's rule). Returns once the cache shows it."""
        results: list[list[AclDeletion]] = [[] for _ in filters]
        candidates = set(self.snapshot.acls)
        candidates.update(p for wanted in filters for p in wanted.exact_patterns())
        writes = []
        for pattern in sorted(candidates, key=str):
            matching = [(i, f) for i, f in enumerate(filters) if f.matches_pattern(pattern)]
            if not matching:
                continue
            deleted, write = await self._delete_matching(pattern, matching)
            for entry, error in deleted:
                index = next(i for i, f in matching if f.matches_entry(entry))
                results[index].append(AclDeletion(AclBinding.of(pattern, entry), error))
            if write is not None:
                writes.append(write)
        await self.wait_applied(writes)
        return results

    async def _delete_matching(
        self, pattern: ResourcePattern, matching: list[tuple[int, AclBindingFilter]]
    ) -> tuple[list[tuple[AclEntry, Exception | None]], AclWrite | None]:
        doomed: frozenset[AclEntry] = frozenset()

        def remove(current: frozenset[AclEntry]) -> frozenset[AclEntry]:
            nonlocal doomed
            doomed = frozenset(e for e in current if any(f.matches_entry(e) for _, f in matching))
            return current - doomed

        try:
            write = await self.update(pattern, remove)
        except (ZkError, MalformedZnodeError) as error:
            return [(entry, error) for entry in sorted(doomed, key=entry_order)], None
        removed = sorted(write.before - write.after, key=entry_order)
        return [(entry, None) for entry in removed], write

    async def update(self, pattern: ResourcePattern, change: AclChange) -> AclWrite:
        """Apply `change(current entries) -> new entries` to one pattern, conditionally.
        `change` may run more than once (after a concurrent write) and must not have effects.
        Raises ZkError (ZooKeeper unreachable, or AclWriteError) or MalformedZnodeError."""
        path = resource_path(pattern)
        async with self._lock:
            for attempt in range(WRITE_ATTEMPTS_MAX):
                if attempt:
                    backoff_ms = WRITE_RETRY_BACKOFF_MS + self._rng.uniform(
                        0, WRITE_RETRY_JITTER_MS
                    )
                    await asyncio.sleep(backoff_ms / 1000)
                before, version = await self._read(pattern)
                after = change(before)
                if after == before:
                    return AclWrite(pattern, before, after, None)
                if version is None:
                    await self._zk.ensure_path(
                        type_path(pattern.pattern_type, pattern.resource_type)
                    )
                try:
                    results = await self._zk.transaction(_write_ops(pattern, path, after, version))
                except (BadVersionError, NodeExistsError):
                    continue  # changed concurrently: read again, change again
                except NoNodeError as error:
                    if error.path != path:
                        raise
                    continue  # deleted concurrently
                notification = results[-1]
                assert isinstance(notification, str)  # a CreateOp's result is its path
                return AclWrite(pattern, before, after, notification)
        raise AclWriteError(f"{path} kept changing: gave up after {WRITE_ATTEMPTS_MAX} attempts")

    async def wait_applied(self, writes: Iterable[AclWrite]) -> bool:
        """Wait until this broker's cache shows `writes` (bounded by APPLIED_WAIT_MS_MAX)."""
        newest: dict[str, str] = {}
        for write in writes:
            if write.notification is not None:
                directory = write.notification.rpartition("/")[0]
                newest[directory] = max(newest.get(directory, ""), write.notification)
        results = [
            await self._cache.wait_applied(notification, APPLIED_WAIT_MS_MAX)
            for notification in newest.values()
        ]
        return all(results)

    async def _read(self, pattern: ResourcePattern) -> tuple[frozenset[AclEntry], int | None]:
        path = resource_path(pattern)
        try:
            data, stat = await self._zk.get(path)
        except NoNodeError:
            return frozenset(), None
        return decode_acls(path, data), stat.version


def _write_ops(
    pattern: ResourcePattern, path: str, after: frozenset[AclEntry], version: int | None
) -> list[TransactionOp]:
    notify = CreateOp(change_path(pattern.pattern_type), encode_change(pattern), sequence=True)
    if not after:
        assert version is not None  # before was not empty, so its znode exists
        return [DeleteOp(path, version), notify]
    if version is None:
        return [CreateOp(path, encode_acls(after)), notify]
    return [SetOp(path, encode_acls(after), version), notify]
