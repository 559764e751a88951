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
    if offset < len(buf) and buf[offset] < 0x80:  # the common case: one byte
        return buf[offset], offset + 1
    value = 0
    for index in range(UVARINT_BYTES_MAX):
        if offset >= len(buf):
            raise ProtocolDecodeError("truncated varint")
        byte = buf[offset]
        offset += 1
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            if value > 0xFFFFFFFF:
                raise ProtocolDecodeError("varint exceeds 32 bits")
            return value, offset
    raise ProtocolDecodeError("varint longer than 5 bytes")


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


def read_length(buf: memoryview, offset: int, compact: bool) -> tuple[int, int]:
    """A string/bytes/array length: -1 for null, else checked to be non-negative."""
    if compact:
        length, offset = read_uvarint(buf, offset)
        return length - 1, offset
    if offset + 4 > len(buf):
        raise ProtocolDecodeError("truncated length")
    return INT32.unpack_from(buf, offset)[0], offset + 4


def read_string_length(buf: memoryview, offset: int, compact: bool) -> tuple[int, int]:
    if compact:
        return read_length(buf, offset, True)
    if offset + 2 > len(buf):
        raise ProtocolDecodeError("truncated string length")
    return INT16.unpack_from(buf, offset)[0], offset + 2


def check_span(buf: memoryview, offset: int, length: int) -> int:
    """The end of `length` bytes at `offset`, after checking they are all in `buf`."""
    end = offset + length
    if length < 0 or end > len(buf):
        raise ProtocolDecodeError(f"length {length} at offset {offset} exceeds the buffer")
    return end


def decode_utf8(buf: memoryview, offset: int, end: int) -> str:
    try:
        return str(buf[offset:end], "utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolDecodeError(f"invalid UTF-8 in string at offset {offset}") from exc


def read_uuid(buf: memoryview, offset: int) -> tuple[uuid.UUID, int]:
    end = check_span(buf, offset, 16)
    return uuid.UUID(bytes=bytes(buf[offset:end])), end
