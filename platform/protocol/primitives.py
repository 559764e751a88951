"""The wire encodings of Kafka's primitive types, and the chunked output they are written to.

Readers take `(buf, offset)` and return `(value, next_offset)`; they check every length against
the bytes that remain before slicing or allocating, and raise `ProtocolDecodeError`.
"""

from __future__ import annotations

import struct
import uuid
from typing import Final

from riverbed.protocol.errors import ProtocolDecodeError
from riverbed.protocol.regions import FileRegion

ZERO_UUID: Final = uuid.UUID(int=0)

Chunk = bytes | FileRegion

INT8: Final = struct.Struct(">b")
INT16: Final = struct.Struct(">h")
INT32: Final = struct.Struct(">i")
INT64: Final = struct.Struct(">q")
UINT16: Final = struct.Struct(">H")
UINT32: Final = struct.Struct(">I")
FLOAT64: Final = struct.Struct(">d")

# Every Kafka frame starts with its size as an int32.
FRAME_PREFIX_BYTES: Final = 4
# Kafka's unsigned varints carry 32-bit lengths and counts: at most 5 bytes of 7 bits.
UVARINT_BYTES_MAX: Final = 5
# Topic ids come back in every Fetch, Produce (v13+) and Metadata message, and building a
# uuid.UUID costs a microsecond: decoded UUIDs are shared (they are immutable) from a cache keyed
# by their 16 bytes. Bounded, as ids come from peers: a cluster's topics fit (each entry is about
# 200 bytes); beyond that the cache starts over.
UUID_CACHE_ENTRIES_MAX: Final = 4096
uuid_cache: Final[dict[bytes, uuid.UUID]] = {}


class Output:
    """An encoding in progress: bytes interleaved with file regions, in wire order.

    Bytes accumulate in `buffer` until a region is written, so the chunk list alternates between
    one joined `bytes` chunk and one region and stays short. A `framed` output starts with the
    4-byte size of everything after it: a Kafka frame.
    """

    __slots__ = ("_chunks", "_flushed_size", "_framed", "buffer")

    def __init__(self, framed: bool = False) -> None:
        self.buffer = bytearray(FRAME_PREFIX_BYTES) if framed else bytearray()
        self._chunks: list[Chunk] = []
        self._flushed_size = 0
        self._framed = framed

    @property
    def size(self) -> int:
        return self._flushed_size + len(self.buffer)

    def write_region(self, region: FileRegion) -> None:
        self._flush()
        self._chunks.append(region)
        self._flushed_size += region.size

    def extend(self, other: Output) -> None:
        if not other._chunks and not other._framed:  # bytes alone: no chunk list to build
            self.buffer += other.buffer
            return
        for chunk in other.chunks():
            if isinstance(chunk, FileRegion):
                self.write_region(chunk)
            else:
                self.buffer += chunk

    def chunks(self) -> list[Chunk]:
        if self._framed:
            self._write_frame_size()
        self._flush()
        return list(self._chunks)

    def _write_frame_size(self) -> None:
        prefix = INT32.pack(self.size - FRAME_PREFIX_BYTES)
        if not self._chunks:  # the common case: no region was written, patch in place
            self.buffer[:FRAME_PREFIX_BYTES] = prefix
            return
        first = self._chunks[0]
        if not isinstance(first, bytes):
            raise AssertionError("a framed output always starts with its size prefix")
        self._chunks[0] = prefix + first[FRAME_PREFIX_BYTES:]

    def _flush(self) -> None:
        if self.buffer:
            self._chunks.append(bytes(self.buffer))
            self._flushed_size += len(self.buffer)
            self.buffer.clear()


def read_uvarint(buf: memoryview, offset: int) -> tuple[int, int]:
    # Unrolled: the 3-byte lengths of record batches (16 KiB to 2 MiB) cost half what a loop does.
    try:
        byte = buf[offset]
        if byte < 0x80:  # the common case: one byte
            return byte, offset + 1
        value = byte & 0x7F
        byte = buf[offset + 1]
        if byte < 0x80:
            return value | byte << 7, offset + 2
        value |= (byte & 0x7F) << 7
        byte = buf[offset + 2]
        if byte < 0x80:
            return value | byte << 14, offset + 3
        value |= (byte & 0x7F) << 14
        byte = buf[offset + 3]
        if byte < 0x80:
            return value | byte << 21, offset + 4
        value |= (byte & 0x7F) << 21
        byte = buf[offset + UVARINT_BYTES_MAX - 1]
    except IndexError:
        raise ProtocolDecodeError("truncated varint") from None
    if byte & 0x80:
        raise ProtocolDecodeError(f"varint longer than {UVARINT_BYTES_MAX} bytes")
    value |= byte << 28
    if value > 0xFFFFFFFF:
        raise ProtocolDecodeError("varint exceeds 32 bits")
    return value, offset + UVARINT_BYTES_MAX


def write_uvarint(out: bytearray, value: int) -> None:
    if 0 <= value < 0x80:  # the common case: one byte
        out.append(value)
        return
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"unsigned varint out of range: {value}")
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def check_span(buf: memoryview, offset: int, length: int) -> int:
    """The end of `length` bytes at `offset`, after checking they are all in `buf`."""
    end = offset + length
    if length < 0 or end > len(buf):
        raise ProtocolDecodeError(f"length {length} at offset {offset} exceeds the buffer")
    return end


def uuid_from_bytes(raw: bytes) -> uuid.UUID:
    """The UUID of 16 bytes, through `uuid_cache` (the generated codecs look it up inline and call
    this only on a miss)."""
    value = uuid_cache.get(raw)
    if value is None:
        if len(uuid_cache) >= UUID_CACHE_ENTRIES_MAX:
            uuid_cache.clear()  # simpler than tracking recency, and as bounded
        value = uuid_cache[raw] = uuid.UUID(bytes=raw)
    return value
