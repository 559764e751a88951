"""Compression codecs: round trips, and bytes that other Kafka clients' libraries read and write."""

import gzip
import struct
import warnings

import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import given
from hypothesis import strategies as st
from riverbed.protocol.compression import (
    XERIAL_HEADER_BYTES,
    XERIAL_MAGIC,
    CompressionType,
    DecompressionError,
    compress,
    decompress,
)

with warnings.catch_warnings():
    # kafka-python's package import reads its JSON schemas with a deprecated importlib API; the
    # warning is attributed to importlib, so pyproject's `kafka.*` filter does not catch it.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import codec as kafka_codec

PAYLOAD = b"riverbed " * 20_000 + bytes(range(256)) * 40  # several xerial and lz4 blocks


@given(codec=st.sampled_from(CompressionType), data=st.binary(max_size=5_000))
def test_round_trip(codec: CompressionType, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data


@pytest.mark.parametrize("codec", list(CompressionType))
def test_round_trip_of_memoryview_spanning_blocks(codec: CompressionType) -> None:
    assert decompress(codec, memoryview(compress(codec, memoryview(PAYLOAD)))) == PAYLOAD


def test_snappy_reads_xerial_framing_of_java_producers() -> None:
    framed = kafka_codec.snappy_encode(PAYLOAD, xerial_compatible=True, xerial_blocksize=32 * 1024)
    assert framed.startswith(XERIAL_MAGIC)
    assert decompress(CompressionType.SNAPPY, framed) == PAYLOAD


def test_snappy_writes_raw_snappy_that_others_read() -> None:
    written = compress(CompressionType.SNAPPY, PAYLOAD)
    assert not written.startswith(XERIAL_MAGIC)
    assert snappy.decompress(written) == PAYLOAD
    assert kafka_codec.snappy_decode(written) == PAYLOAD


def test_lz4_writes_independent_blocks_for_kafka() -> None:
    written = compress(CompressionType.LZ4, PAYLOAD)
    frame_flags = written[4]
    assert frame_flags & 0x20, "KafkaLZ4BlockInputStream rejects linked (dependent) blocks"
    assert lz4.frame.decompress(written) == PAYLOAD
    assert decompress(CompressionType.LZ4, lz4.frame.compress(PAYLOAD)) == PAYLOAD


def test_zstd_and_gzip_interoperate_with_reference_libraries() -> None:
    assert (
        zstandard.ZstdDecompressor()
        .decompressobj()
        .decompress(compress(CompressionType.ZSTD, PAYLOAD))
        == PAYLOAD
    )
    assert decompress(CompressionType.ZSTD, zstandard.ZstdCompressor().compress(PAYLOAD)) == PAYLOAD
    assert gzip.decompress(compress(CompressionType.GZIP, PAYLOAD)) == PAYLOAD
    assert decompress(CompressionType.GZIP, gzip.compress(PAYLOAD)) == PAYLOAD


@pytest.mark.parametrize(
    "codec",
    [CompressionType.GZIP, CompressionType.SNAPPY, CompressionType.LZ4, CompressionType.ZSTD],
)
def test_garbage_raises_decompression_error(codec: CompressionType) -> None:
    with pytest.raises(DecompressionError):
        decompress(codec, b"\x04\x22\x4d\x18 certainly not compressed data")


def test_truncated_xerial_frames_raise_decompression_error() -> None:
    framed = kafka_codec.snappy_encode(PAYLOAD, xerial_compatible=True)
    first_block_bytes = struct.unpack_from(">i", framed, XERIAL_HEADER_BYTES)[0]
    for cut in (
        XERIAL_HEADER_BYTES - 3,  # inside the header
        XERIAL_HEADER_BYTES + 2,  # inside a block length
        XERIAL_HEADER_BYTES + 4 + first_block_bytes // 2,  # inside a block
    ):
        with pytest.raises(DecompressionError):
            decompress(CompressionType.SNAPPY, framed[:cut])
