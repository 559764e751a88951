"""The object store interface tiering is written against, and its errors.

Two implementations: `file_store.FileStore` (`file:///path`, the embedded default) and
`s3_store.S3Store` (`s3://bucket/prefix` through aiobotocore: AWS, MinIO, moto's server).
`open_store(url, settings)` in `stores.py` picks one.

Keys are '/'-separated paths relative to the store's root (the URL's path or bucket prefix); no
key starts with '/' or holds '..'. Objects are immutable once written except through `put`; the
tiering layer only ever overwrites nothing: data objects have unique names and manifest versions
are created with `put_if_absent`, which is how two leaders are kept from forking a manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class ObjectStoreError(Exception):
    """A store call failed after its retries (unreachable, timed out, refused): one line naming
    the store, the operation and the key."""


class ObjectNotFoundError(ObjectStoreError):
    """The key does not exist (or a range starts past its end)."""


def check_key(key: str) -> str:
    """A key relative to the store's root that cannot leave it, else ValueError."""
    if not key or key.startswith("/") or ".." in key.split("/"):
        raise ValueError(f"bad object key {key!r}")
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix (may be empty) that cannot leave the store's root, else ValueError."""
    if prefix.startswith("/") or ".." in prefix.split("/"):
        raise ValueError(f"bad object key prefix {prefix!r}")
    return prefix


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size_bytes: int
    # When it was written (ms since the epoch, the store's clock); not part of equality.
    modified_ms: int = field(default=0, compare=False)


class ObjectStore(Protocol):
    """Every call is bounded in time and retried on transient faults inside the implementation;
    what reaches the caller is a result or an ObjectStoreError."""

    @property
    def url(self) -> str:
        """Where this store points (no credentials), for logs and errors."""
        ...

    async def open(self) -> None:
        """Get ready for calls without a request to the store (so an unreachable store does not
        fail it): what the first call would otherwise do first, done ahead of it."""
        ...

    async def put(self, key: str, data: bytes) -> None:
        """Write (or replace) `key`; readers see the old object or the whole new one."""
        ...

    async def put_file(self, key: str, path: Path) -> None:
        """Write `key` from a local file, in parts when it is large (multipart on S3)."""
        ...

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create `key` only if it does not exist (atomically); False if it already did. True
        only when this call created it, even if the store's first answer was lost."""
        ...

    async def get(self, key: str, position: int = 0, size_bytes: int | None = None) -> bytes:
        """Bytes [position, position + size_bytes) of `key` (to its end when size_bytes is
        None; clipped at the end): a ranged GET. A range starting past the end (position > 0)
        raises ObjectNotFoundError, as S3 answers 416; a negative position or a size of 0 is
        a ValueError."""
        ...

    async def size(self, key: str) -> int:
        """The object's size in bytes (ObjectNotFoundError if absent)."""
        ...

    async def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key (all pages)."""
        ...

    async def delete(self, key: str) -> None:
        """Delete `key`; deleting an absent key succeeds (so retries are safe)."""
        ...

    async def abort_unfinished(self, prefix: str) -> int:
        """Remove what writes under `prefix` that never finished left behind (S3: multipart
        uploads neither completed nor aborted, whose parts are stored and billed; a directory:
        temporary files), and return how many. Only for a prefix no write is in flight under:
        a write it catches fails (and may be retried)."""
        ...

    async def close(self) -> None: ...
