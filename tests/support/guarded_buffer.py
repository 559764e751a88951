"""Bytes placed right before an unreadable page, for the tests of the compiled decoders: reading
one byte past them is a segfault, so an over-read crashes the test instead of passing unseen."""

from __future__ import annotations

import ctypes
import mmap


class GuardedBuffer:
    def __init__(self, size_bytes_max: int) -> None:
        page_bytes = mmap.PAGESIZE
        self._end = -(-size_bytes_max // page_bytes) * page_bytes
        self._map = mmap.mmap(-1, self._end + page_bytes)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        libc = ctypes.CDLL(None, use_errno=True)
        no_access = 0
        if libc.mprotect(ctypes.c_void_p(address + self._end), page_bytes, no_access) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")

    def hold(self, data: bytes) -> memoryview:
        """`data` ending right at the unreadable page (valid until the next `hold`)."""
        if len(data) > self._end:
            raise ValueError(f"{len(data)} bytes do not fit {self._end}")
        self._map[self._end - len(data) : self._end] = data
        return memoryview(self._map)[self._end - len(data) : self._end]
