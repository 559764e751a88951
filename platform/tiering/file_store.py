"""`file:///path`: the object store as a local directory (the embedded default).

Writes go to a temporary file in the same directory, are fsynced, then renamed over the key, so
a reader sees the old object or the whole new one, never part of one. `put_if_absent` hard-links
the fully written temporary file onto the key: link() fails if the key exists, atomically.
Blocking file work runs in threads so a slow disk never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import shutil
import uuid
from pathlib import Path

from riverbed.hot.fileio import fsync_dir
from riverbed.tiering.store import ObjectInfo, ObjectNotFoundError, ObjectStoreError

TEMP_SUFFIX = ".tmp-upload"


class FileStore:
    def __init__(self, root: Path) -> None:
        if not root.is_absolute():
            raise ValueError(f"file:// store needs an absolute path, got {root}")
        self._root = root

    @property
    def url(self) -> str:
        return f"file://{self._root}"

    def _path(self, key: str) -> Path:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad object key {key!r}")
        return self._root / key

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._write, key, data, replace=True)

    async def put_file(self, key: str, path: Path) -> None:
        await asyncio.to_thread(self._copy, key, path)

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        return await asyncio.to_thread(self._write, key, data, replace=False)

    async def get(self, key: str, position: int = 0, size_bytes: int | None = None) -> bytes:
        return await asyncio.to_thread(self._read, key, position, size_bytes)

    async def size(self, key: str) -> int:
        try:
            return (await asyncio.to_thread(self._path(key).stat)).st_size
        except FileNotFoundError as error:
            raise ObjectNotFoundError(f"{self.url}: no object {key}") from error

    async def list(self, prefix: str) -> list[ObjectInfo]:
        return await asyncio.to_thread(self._list, prefix)

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self._path(key).unlink, missing_ok=True)

    async def close(self) -> None:
        return None

    # -- in threads ------------------------------------------------------------------------------
    def _temporary(self, target: Path) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        return target.with_name(f"{target.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")

    def _write(self, key: str, data: bytes, *, replace: bool) -> bool:
        target = self._path(key)
        temporary = self._temporary(target)
        try:
            with temporary.open("wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            return self._publish(temporary, target, replace=replace)
        except OSError as error:
            raise ObjectStoreError(f"{self.url}: writing {key} failed: {error}") from error
        finally:
            temporary.unlink(missing_ok=True)

    def _copy(self, key: str, source: Path) -> None:
        target = self._path(key)
        temporary = self._temporary(target)
        try:
            shutil.copyfile(source, temporary)
            with temporary.open("rb") as file:
                os.fsync(file.fileno())
            self._publish(temporary, target, replace=True)
        except OSError as error:
            raise ObjectStoreError(f"{self.url}: writing {key} failed: {error}") from error
        finally:
            temporary.unlink(missing_ok=True)

    def _publish(self, temporary: Path, target: Path, *, replace: bool) -> bool:
        if replace:
            os.replace(temporary, target)
        else:
            try:
                os.link(temporary, target)
            except FileExistsError:
                return False
        fsync_dir(target.parent)
        return True

    def _read(self, key: str, position: int, size_bytes: int | None) -> bytes:
        try:
            with self._path(key).open("rb") as file:
                file.seek(position)
                return file.read() if size_bytes is None else file.read(size_bytes)
        except FileNotFoundError as error:
            raise ObjectNotFoundError(f"{self.url}: no object {key}") from error
        except OSError as error:
            raise ObjectStoreError(f"{self.url}: reading {key} failed: {error}") from error

    def _list(self, prefix: str) -> builtins.list[ObjectInfo]:
        # Walk only the deepest directory the prefix names, then filter by the full prefix.
        directory = self._root / prefix.rpartition("/")[0]
        if not directory.is_dir():
            return []
        found = []
        for path in directory.rglob("*"):
            if path.name.endswith(TEMP_SUFFIX) or not path.is_file():
                continue
            key = path.relative_to(self._root).as_posix()
            if key.startswith(prefix):
                found.append(ObjectInfo(key, path.stat().st_size))
        return sorted(found, key=lambda info: info.key)
