"""A partition's manifest in the object store: read the latest version, commit the next one.

Versions are immutable objects created with `put_if_absent`, so two writers can never both
write version N: one wins, the other re-reads. A writer whose leader epoch is below the latest
version's is a deposed leader and is fenced (FencedLeaderEpochError), so a zombie can neither
overwrite nor fork the manifest. LIST is strongly consistent on S3 (and on a directory), so the
highest version listed is the latest committed one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.tiering.manifest import Manifest, manifest_key, partition_prefix
from riverbed.tiering.store import ObjectStore

logger = logging.getLogger(__name__)

# Losing the race for a version means another writer just committed; a few rounds settle it
# (two leaders at most race, and one of them is fenced after its first re-read).
COMMIT_ATTEMPTS_MAX = 8
# Old versions are kept for readers that listed a moment ago, then deleted.
VERSIONS_KEPT = 16


class RemoteMetadata:
    def __init__(self, store: ObjectStore, topic: str, partition: int) -> None:
        self._store = store
        self.topic = topic
        self.partition = partition
        self._manifest_prefix = f"{partition_prefix(topic, partition)}manifest/"
        # The highest version read or written here: versions are immutable, so when a listing's
        # highest version is this one, its GET can be skipped. Only ever moves forward (two
        # tasks may share this object: the offloader and the cold compactor).
        self._known: Manifest | None = None

    @property
    def known(self) -> Manifest | None:
        """The highest version this object has read or written (no store call)."""
        return self._known

    def _learn(self, manifest: Manifest) -> None:
        if self._known is None or manifest.version > self._known.version:
            self._known = manifest

    async def versions(self) -> list[int]:
        infos = await self._store.list(self._manifest_prefix)
        versions = []
        for info in infos:
            name = info.key.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[: -len(".json")].isdigit():
                versions.append(int(name[: -len(".json")]))
        return sorted(versions)

    async def latest(self) -> Manifest:
        """The highest committed version, or the empty manifest (version 0)."""
        versions = await self.versions()
        if not versions:
            return Manifest.empty(self.topic, self.partition)
        if self._known is not None and self._known.version == versions[-1]:
            return self._known
        key = manifest_key(self.topic, self.partition, versions[-1])
        manifest = Manifest.from_json(await self._store.get(key), f"{self._store.url}/{key}")
        if (manifest.topic, manifest.partition, manifest.version) != (
            self.topic,
            self.partition,
            versions[-1],
        ):
            raise KafkaError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"{key} holds {manifest.topic}-{manifest.partition} v{manifest.version}",
            )
        self._learn(manifest)
        return manifest

    async def commit(self, leader_epoch: int, change: Callable[[Manifest], Manifest]) -> Manifest:
        """Apply `change` to the latest version and store the result as the next one, as the
        leader at `leader_epoch`. Returns the stored manifest."""
        for _ in range(COMMIT_ATTEMPTS_MAX):
            current = await self.latest()
            if current.leader_epoch > leader_epoch:
                raise KafkaError(
                    ErrorCode.FENCED_LEADER_EPOCH,
                    f"{self.topic}-{self.partition}: manifest v{current.version} was written at "
                    f"leader epoch {current.leader_epoch}, above ours ({leader_epoch})",
                )
            updated = change(current).next_version(leader_epoch)
            key = manifest_key(self.topic, self.partition, updated.version)
            if await self._store.put_if_absent(key, updated.to_json()):
                self._learn(updated)
                await self._prune(updated.version)
                return updated
            logger.info(
                "%s-%d: lost the race for manifest v%d", self.topic, self.partition, updated.version
            )
        raise KafkaError(
            ErrorCode.KAFKA_STORAGE_ERROR,
            f"{self.topic}-{self.partition}: "
            f"no manifest version won in {COMMIT_ATTEMPTS_MAX} tries",
        )

    async def _prune(self, latest: int) -> None:
        oldest_kept = latest - VERSIONS_KEPT
        if oldest_kept > 0 and latest % VERSIONS_KEPT == 0:  # one LIST every VERSIONS_KEPT commits
            for version in await self.versions():
                if version < oldest_kept:
                    await self._store.delete(manifest_key(self.topic, self.partition, version))
