"""Byte ranges of open files, sent to sockets with os.sendfile instead of being read into memory."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FileRegion:
    """`size` bytes of the open file `fd` starting at `position`.

    The region OWNS `fd` (the log hands out an `os.dup()` of its segment's descriptor, so the
    segment can be closed or deleted while a response is in flight); whoever sends the region
    calls `close()` exactly once.
    """

    fd: int
    position: int
    size: int

    def __post_init__(self) -> None:
        if self.fd < 0 or self.position < 0 or self.size < 0:
            raise ValueError(f"invalid file region {self}")

    def close(self) -> None:
        os.close(self.fd)
