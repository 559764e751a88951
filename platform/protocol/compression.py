"""Compression codecs of Kafka record batches (attributes bits 0-2), backed by cramjam.

The whole records section of a batch is compressed as one unit. Each codec writes what Kafka's
Java client reads, and reads what every common producer writes:

- gzip: a gzip member (RFC 1952), level 6 (java.util.zip's default, which Kafka uses).
- snappy: we write raw snappy, as librdkafka does. Java producers write the xerial-framed format
  (b"\\x82SNAPPY\\x00", two int32 version fields, then [int32 length][raw chunk] blocks); we read
  both. The Java consumer reads raw snappy too: snappy-java's SnappyInputStream falls back to a
  plain `Snappy.uncompress` of the whole input when the xerial magic header is absent.
- lz4: an LZ4 frame with independent blocks. Kafka's KafkaLZ4BlockInputStream rejects linked
  blocks ("Dependent block stream is unsupported", KIP-57), so block_linked must be False. Level 9
  is Kafka's default for lz4 (KIP-390).
- zstd: a zstd frame at level 3, Kafka's default (KIP-390).
"""

import enum
import mmap
import struct
from collections.abc import Callable
from typing import Final

import cramjam


class CompressionType(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class DecompressionError(ValueError):
    """The compressed bytes are malformed: the batch that holds them is corrupt."""


GZIP_LEVEL = 6
LZ4_LEVEL = 9
ZSTD_LEVEL = 3

# The most bytes one records section may decompress to. Compression makes a batch's section any
# size at all (a 16 KiB zstd frame holds 512 MiB of zeros), and the broker decompresses batches
# that clients produced (the log cleaner, tiering, ListOffsets by time) as consumers decompress
# what they fetch: without a bound, one small batch makes either allocate without limit.
# 128 MiB is far above any batch a Kafka producer builds with its defaults (the Java producer
# closes a batch at batch.size, 16 KiB of estimated compressed bytes, and refuses records over
# max.request.size, 1 MiB uncompressed; librdkafka's batch.size is 1 MB uncompressed), and room
# for a 100 MiB record (Kafka's socket.request.max.bytes) sent compressed.
DECOMPRESSED_BYTES_MAX: Final = 128 * 1024 * 1024
# The first output buffer tried, as a multiple of the compressed size (and at least
# _GUESS_BYTES_MIN): typical record data compresses 4-20x. Only a section that does not fit is
# decompressed again, into an anonymous map of the whole limit, whose pages the kernel commits
# only as they are written.
_GUESS_RATIO: Final = 32
_GUESS_BYTES_MIN: Final = 64 * 1024

# The xerial (snappy-java SnappyOutputStream) framing: an 8-byte magic, then int32 version and
# int32 minimum compatible version, then blocks of [int32 compressed length][raw snappy chunk].
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER_BYTES = 16
_XERIAL_BLOCK_LENGTH = struct.Struct(">i")


Bytes = bytes | bytearray | memoryview


def compress(codec: CompressionType, data: Bytes) -> bytes:
    """Compress `data` as `codec`; NONE returns the bytes unchanged."""
    return _COMPRESSORS[codec](data)


def decompress(
    codec: CompressionType, data: Bytes, max_bytes: int = DECOMPRESSED_BYTES_MAX
) -> bytes:
    """Decompress `data` written by any Kafka client as `codec`.

    Raises DecompressionError when the bytes are not valid for the codec or would decompress to
    more than `max_bytes`; decompression stops there, so no more than that is ever allocated.
    """
    if codec == CompressionType.NONE:
        if len(data) > max_bytes:
            raise DecompressionError(f"{len(data)} bytes are over the limit of {max_bytes}")
        return bytes(data)
    try:
        if codec == CompressionType.SNAPPY:
            return _snappy_decompress(data, max_bytes)
        return _decompress_bounded(_DECOMPRESSORS_INTO[codec], data, max_bytes)
    except cramjam.DecompressionError as error:
        raise DecompressionError(
            f"{codec.name.lower()}: {error} (malformed, or over {max_bytes} bytes)"
        ) from error


DecompressInto = Callable[[Bytes, bytearray | mmap.mmap], int]


def _decompress_bounded(decompress_into: DecompressInto, data: Bytes, max_bytes: int) -> bytes:
    # cramjam's decompress_into stops with an error as soon as the output buffer is full, so
    # the buffer's size is the bound.
    guess = min(max_bytes, max(_GUESS_BYTES_MIN, _GUESS_RATIO * len(data)))
    out = bytearray(guess)
    try:
        written = decompress_into(data, out)
        return bytes(memoryview(out)[:written])
    except cramjam.DecompressionError:
        if guess >= max_bytes:
            raise
    del out
    with mmap.mmap(-1, max_bytes) as whole:
        written = decompress_into(data, whole)
        return whole[:written]


def _lz4_compress(data: Bytes) -> bytes:
    compressor = cramjam.lz4.Compressor(level=LZ4_LEVEL, content_checksum=False, block_linked=False)
    # Unlike the module-level functions, the streaming compressor refuses a memoryview.
    compressor.compress(data if isinstance(data, bytes) else bytes(data))
    return bytes(compressor.finish())


def _snappy_raw_decompress(data: Bytes, max_bytes: int) -> bytes:
    # Raw snappy starts with the exact decompressed length: judge it before allocating it.
    length = cramjam.snappy.decompress_raw_len(data)
    if length > max_bytes:
        raise DecompressionError(f"snappy: {length} bytes are over the limit of {max_bytes}")
    return bytes(cramjam.snappy.decompress_raw(data))


def _snappy_decompress(data: Bytes, max_bytes: int) -> bytes:
    view = memoryview(data)
    if view[: len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        return _snappy_raw_decompress(view, max_bytes)
    if len(view) < XERIAL_HEADER_BYTES:
        raise DecompressionError("snappy: xerial header is truncated")
    chunks = []
    position = XERIAL_HEADER_BYTES
    end = len(view)
    while position < end:
        if end - position < _XERIAL_BLOCK_LENGTH.size:
            raise DecompressionError("snappy: xerial block length is truncated")
        (block_bytes,) = _XERIAL_BLOCK_LENGTH.unpack_from(view, position)
        position += _XERIAL_BLOCK_LENGTH.size
        if block_bytes < 0 or position + block_bytes > end:
            raise DecompressionError(f"snappy: xerial block of {block_bytes} bytes overruns data")
        chunk = _snappy_raw_decompress(view[position : position + block_bytes], max_bytes)
        max_bytes -= len(chunk)
        chunks.append(chunk)
        position += block_bytes
    return b"".join(chunks)


_COMPRESSORS: dict[CompressionType, Callable[[Bytes], bytes]] = {
    CompressionType.NONE: bytes,
    CompressionType.GZIP: lambda data: bytes(cramjam.gzip.compress(data, level=GZIP_LEVEL)),
    CompressionType.SNAPPY: lambda data: bytes(cramjam.snappy.compress_raw(data)),
    CompressionType.LZ4: _lz4_compress,
    CompressionType.ZSTD: lambda data: bytes(cramjam.zstd.compress(data, level=ZSTD_LEVEL)),
}
_DECOMPRESSORS_INTO: dict[CompressionType, DecompressInto] = {
    CompressionType.GZIP: cramjam.gzip.decompress_into,
    CompressionType.LZ4: cramjam.lz4.decompress_into,
    CompressionType.ZSTD: cramjam.zstd.decompress_into,
}
