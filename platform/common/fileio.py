"""Low-level file writes the log relies on for durability: whole writes, exact reads, dir fsyncs.

Every write that can fail half-way (disk full, I/O error) goes through `write_all`, so callers
have one place where a short write turns into an OSError they can roll back from.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

# syncfs(2) is not in the os module; the C library of the running process has it (Linux).
_LIBC = ctypes.CDLL(None, use_errno=True)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of `data` at the fd's current position (the log's fds are O_APPEND).

    os.write may write fewer bytes than asked (signals, a nearly full disk); loop until done. A
    write that makes no progress is reported as ENOSPC rather than looping forever.
    """
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, "write made no progress")
        view = view[written:]


def pread_exact(fd: int, size: int, position: int) -> bytes:
    """Read `size` bytes at `position`; fewer only at end of file (the caller checks)."""
    chunks = []
    remaining = size
    while remaining > 0:
        chunk = os.pread(fd, remaining, position)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
        position += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def fsync_dir(directory: Path) -> None:
    """Make file creations, renames and deletions inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new content.

    tmp file + fsync + rename + fsync of the directory (the rename itself must be durable).
    With `durable=False` the two fsyncs are skipped: readers still see the old or the new
    content, never a mix, but a power loss may lose the change or leave a file that does not
    parse, so only for files the caller syncs later (`syncfs`) or can rebuild.
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def syncfs(directory: Path) -> None:
    """Make everything written on the file system holding `directory` durable, in one call:
    file data, metadata and directory entries (syncfs(2); it reports write-back errors since
    Linux 5.8). Thousands of files closed together cost one journal commit this way instead of
    two fsyncs each."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _LIBC.syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs: {os.strerror(code)}", str(directory))
    finally:
        os.close(fd)
