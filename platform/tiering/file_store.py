"""`file:///path`: the object store as a local directory (the embedded default).

An object is a regular file at `<root>/<key>`. Writes go to a temporary file in the key's
directory, are fsynced, then renamed over the key, so a reader sees the old object or the whole
new one, never part of one, and a crash leaves no half object under a key. `put_if_absent`
hard-links the fully written temporary file onto the key instead: link() fails if the key
exists, atomically, so of many creators exactly one wins. Temporary files
(`.<random hex>.tmp-upload`) are never listed; one left by a crash can be deleted by hand.

Unlike S3, a key cannot also be the directory of other keys ("a" and "a/b"): writing the second
fails with an ObjectStoreError. The tiering layout never does that.

Blocking file work runs in threads (asyncio.to_thread) so a slow disk never stalls the event
loop. Local disk errors are not transient, so nothing is retried: an OSError becomes one
ObjectStoreError line naming the store, the operation and the key.
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final, TypeVar

from riverbed.common.fileio import fsync_dir, pread_exact
from riverbed.tiering.store import (
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStoreError,
    check_prefix,
)

T = TypeVar("T")

TEMP_SUFFIX: Final = ".tmp-upload"


class FileStore:
    def __init__(self, root: Path) -> None:
        if not root.is_absolute():
            raise ValueError(f"file:// store needs an absolute path, got {root}")
        self._root = root

    @property
    def url(self) -> str:
        return self._root.as_uri()

    async def open(self) -> None:
        """Nothing to prepare: a directory needs no client."""

    async def put(self, key: str, data: bytes) -> None:
        target = self._path(key)
        await self._run("put", key, lambda: self._publish(target, _writer(data), replace=True))

    async def put_file(self, key: str, path: Path) -> None:
        target = self._path(key)

        def copy(temporary: Path) -> None:
            shutil.copyfile(path, temporary)  # in the kernel (sendfile/copy_file_range)

        await self._run("put_file", key, lambda: self._publish(target, copy, replace=True))

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        target = self._path(key)
        return await self._run(
            "put_if_absent", key, lambda: self._publish(target, _writer(data), replace=False)
        )

    async def get(self, key: str, position: int = 0, size_bytes: int | None = None) -> bytes:
        if position < 0 or (size_bytes is not None and size_bytes <= 0):
            raise ValueError(f"bad range of {key!r}: position {position}, size {size_bytes}")
        path = self._path(key)
        return await self._run("get", key, lambda: self._read(key, path, position, size_bytes))

    async def size(self, key: str) -> int:
        path = self._path(key)

        def file_size() -> int:
            try:
                info = os.stat(path)
            except FileNotFoundError:
                raise self._absent("size", key) from None
            if not stat.S_ISREG(info.st_mode):  # a directory of other keys
                raise self._absent("size", key)
            return info.st_size

        return await self._run("size", key, file_size)

    async def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        check_prefix(prefix)
        return await self._run("list", prefix, lambda: self._list(prefix))

    async def abort_unfinished(self, prefix: str) -> int:
        check_prefix(prefix)

        def remove() -> int:
            temporaries = [
                path for path, _ in self._walk(prefix) if path.name.endswith(TEMP_SUFFIX)
            ]
            for path in temporaries:
                path.unlink(missing_ok=True)
            return len(temporaries)

        return await self._run("abort_unfinished", prefix, remove)

    async def delete(self, key: str) -> None:
        path = self._path(key)

        def remove() -> None:
            try:
                path.unlink()
            except FileNotFoundError:
                return  # deleted already: retries are safe
            fsync_dir(path.parent)  # a deleted object stays deleted after a crash

        await self._run("delete", key, remove)

    async def close(self) -> None:
        return None  # nothing is held open between calls

    # -- helpers ---------------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        """The key's file: every part a plain name, so no key can leave the root or name a
        temporary file."""
        parts = key.split("/")
        if (
            not key
            or "\0" in key
            or any(part in ("", ".", "..") for part in parts)
            or parts[-1].endswith(TEMP_SUFFIX)
        ):
            raise ValueError(f"bad object key {key!r}")
        return self._root.joinpath(*parts)

    async def _run(self, operation: str, key: str, work: Callable[[], T]) -> T:
        """`work()` in a thread; an OSError it raises becomes an ObjectStoreError."""
        try:
            return await asyncio.to_thread(work)
        except OSError as error:
            raise ObjectStoreError(self._message(operation, key, error)) from error

    def _message(self, operation: str, key: str, cause: object) -> str:
        return f"{self.url}: {operation} {key!r} failed: {cause}".replace("\n", " ")

    def _absent(self, operation: str, key: str) -> ObjectNotFoundError:
        return ObjectNotFoundError(self._message(operation, key, "no such object"))

    # -- in threads ------------------------------------------------------------------------------
    def _publish(self, target: Path, fill: Callable[[Path], None], *, replace: bool) -> bool:
        """`fill` a new temporary file next to `target`, fsync it, then rename it over `target`
        (`replace`) or link it to `target` unless that exists (then return False)."""
        self._make_directories(target.parent)
        temporary = target.with_name(f".{uuid.uuid4().hex}{TEMP_SUFFIX}")
        try:
            fill(temporary)
            fd = os.open(temporary, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if replace:
                os.replace(temporary, target)
            else:
                try:
                    os.link(temporary, target)
                except FileExistsError:
                    if target.is_dir():  # not an object: the directory of other keys
                        raise IsADirectoryError(errno.EISDIR, "a directory", str(target)) from None
                    return False
            fsync_dir(target.parent)  # the new name survives a crash
            return True
        finally:
            temporary.unlink(missing_ok=True)

    def _make_directories(self, directory: Path) -> None:
        """mkdir -p, fsyncing the parent of every directory it creates so the whole path to a
        new object survives a crash, not only its last step."""
        missing: builtins.list[Path] = []
        while not directory.is_dir():
            missing.append(directory)
            directory = directory.parent
        for new in reversed(missing):
            new.mkdir(exist_ok=True)  # a concurrent writer may have made it meanwhile
            fsync_dir(new.parent)

    def _read(self, key: str, path: Path, position: int, size_bytes: int | None) -> bytes:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise self._absent("get", key) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise self._absent("get", key)
            if position > 0 and position >= info.st_size:
                # As S3 answers such a range (416 Range Not Satisfiable).
                raise ObjectNotFoundError(
                    self._message(
                        "get",
                        key,
                        f"range starts at {position}, past the object's end ({info.st_size} bytes)",
                    )
                )
            end = info.st_size if size_bytes is None else min(position + size_bytes, info.st_size)
            return pread_exact(fd, end - position, position)
        finally:
            os.close(fd)

    def _list(self, prefix: str) -> builtins.list[ObjectInfo]:
        found = []
        for path, key in self._walk(prefix):
            if path.name.endswith(TEMP_SUFFIX):
                continue
            try:
                info = path.stat()
            except FileNotFoundError:  # deleted since the walk saw it
                continue
            if stat.S_ISREG(info.st_mode):
                found.append(ObjectInfo(key, info.st_size, info.st_mtime_ns // 1_000_000))
        return sorted(found, key=lambda info: info.key)

    def _walk(self, prefix: str) -> Iterator[tuple[Path, str]]:
        """(path, key) of every file whose key starts with `prefix`, temporary ones included."""

        def unreadable(error: OSError) -> None:
            # A directory that vanished holds nothing; one we cannot read must not look empty.
            if not isinstance(error, FileNotFoundError):
                raise error

        # Walk only the deepest directory the prefix names, then filter by the whole prefix.
        top = self._root.joinpath(*prefix.split("/")[:-1])
        for directory, _, names in os.walk(top, onerror=unreadable):
            for name in names:
                path = Path(directory, name)
                key = path.relative_to(self._root).as_posix()
                if key.startswith(prefix):
                    yield path, key


def _writer(data: bytes) -> Callable[[Path], None]:
    def write(temporary: Path) -> None:
        with temporary.open("xb") as file:
            file.write(data)

    return write
