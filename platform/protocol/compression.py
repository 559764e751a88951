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
import struct
from collections.abc import Callable

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

# The xerial (snappy-java SnappyOutputStream) framing: an 8-byte magic, then int32 version and
# int32 minimum compatible version, then blocks of [int32 compressed length][raw snappy chunk].
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER_BYTES = 16
_XERIAL_BLOCK_LENGTH = struct.Struct(">i")


Bytes = bytes | bytearray | memoryview


def compress(codec: CompressionType, data: Bytes) -> bytes:
    """Compress `data` as `codec`; NONE returns the bytes unchanged."""
    return _COMPRESSORS[codec](data)


def decompress(codec: CompressionType, data: Bytes) -> bytes:
    """Decompress `data` written by any Kafka client as `codec`.

    Raises DecompressionError when the bytes are not valid for the codec.
    """
    try:
        return _DECOMPRESSORS[codec](data)
    except cramjam.DecompressionError as error:
        raise DecompressionError(f"{codec.name.lower()}: {error}") from error


def _lz4_compress(data: Bytes) -> bytes:
    compressor = cramjam.lz4.Compressor(level=LZ4_LEVEL, content_checksum=False, block_linked=False)
    # Unlike the module-level functions, the streaming compressor refuses a memoryview.
    compressor.compress(data if isinstance(data, bytes) else bytes(data))
    return bytes(compressor.finish())


def _snappy_decompress(data: Bytes) -> bytes:
    view = memoryview(data)
    if view[: len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
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
        chunks.append(bytes(cramjam.snappy.decompress_raw(view[position : position + block_bytes])))
        position += block_bytes
    return b"".join(chunks)


_COMPRESSORS: dict[CompressionType, Callable[[Bytes], bytes]] = {
    CompressionType.NONE: bytes,
    CompressionType.GZIP: lambda data: bytes(cramjam.gzip.compress(data, level=GZIP_LEVEL)),
    CompressionType.SNAPPY: lambda data: bytes(cramjam.snappy.compress_raw(data)),
    CompressionType.LZ4: _lz4_compress,
    CompressionType.ZSTD: lambda data: bytes(cramjam.zstd.compress(data, level=ZSTD_LEVEL)),
}
_DECOMPRESSORS: dict[CompressionType, Callable[[Bytes], bytes]] = {
    CompressionType.NONE: bytes,
    CompressionType.GZIP: lambda data: bytes(cramjam.gzip.decompress(data)),
    CompressionType.SNAPPY: _snappy_decompress,
    CompressionType.LZ4: lambda data: bytes(cramjam.lz4.decompress(data)),
    CompressionType.ZSTD: lambda data: bytes(cramjam.zstd.decompress(data)),
}
