"""Decompression bombs: a records section decompresses to at most DECOMPRESSED_BYTES_MAX (or the
caller's `max_bytes`), and decompression stops there instead of allocating the whole output.

The broker decompresses batches that clients produced (log cleaner, tiering, ListOffsets by
time) and consumers decompress what they fetch: a 32 KiB zstd frame of run-length blocks holds
1 GiB of zeros.
"""

from __future__ import annotations

import contextlib
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Callable

import pytest
from riverbed.client.fetched_records import PartitionFetch
from riverbed.client.types import TopicPartition
from riverbed.protocol.compression import (
    DECOMPRESSED_BYTES_MAX,
    XERIAL_MAGIC,
    CompressionType,
    DecompressionError,
    compress,
    decompress,
)
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records import (
    CorruptRecordError,
    decode_batch,
    parse_batch_header,
    validate_records,
)

from tools.fuzz.targets import build_batch

MIB = 1 << 20
CODECS = [CompressionType.GZIP, CompressionType.SNAPPY, CompressionType.LZ4, CompressionType.ZSTD]
# zstd: a frame without a content size, 128 KiB window; run-length blocks of at most 128 KiB.
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_WINDOW_128_KIB = 0x38
_ZSTD_RLE_BLOCK = 1
_ZSTD_BLOCK_BYTES_MAX = 128 * 1024


def zstd_bomb(size_bytes: int, fill: int = 0) -> bytes:
    """A zstd frame of `size_bytes` bytes of `fill`, 4 bytes per 128 KiB: a 1 GiB bomb is 32 KiB."""
    frame = bytearray(_ZSTD_MAGIC + bytes([0, _ZSTD_WINDOW_128_KIB]))
    while size_bytes > 0:
        block = min(size_bytes, _ZSTD_BLOCK_BYTES_MAX)
        size_bytes -= block
        last = 1 if size_bytes == 0 else 0
        frame += (block << 3 | _ZSTD_RLE_BLOCK << 1 | last).to_bytes(3, "little") + bytes([fill])
    return bytes(frame)


def traced_peak(function: Callable[[], object]) -> int:
    """Python heap bytes allocated at the peak of calling `function` (it may raise)."""
    tracemalloc.start()
    try:
        with contextlib.suppress(DecompressionError, CorruptRecordError):
            function()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_zstd_bomb_is_what_it_claims() -> None:
    assert decompress(CompressionType.ZSTD, zstd_bomb(300_000, fill=7)) == b"\x07" * 300_000
    assert len(zstd_bomb(1 << 30)) == 6 + 4 * 8192


@pytest.mark.parametrize("codec", CODECS)
def test_a_bomb_stops_at_max_bytes(codec: CompressionType) -> None:
    bomb = compress(codec, bytes(32 * MIB))
    with pytest.raises(DecompressionError, match="over"):
        decompress(codec, bomb, max_bytes=MIB)
    # The output that would have been is never built (before the limit: all 32 MiB of it).
    assert traced_peak(lambda: decompress(codec, bomb, max_bytes=MIB)) < 2 * MIB


@pytest.mark.parametrize("codec", [*CODECS, CompressionType.NONE])
@pytest.mark.parametrize("size", [0, 1, 65_535, 65_536, 200_000])
def test_output_of_exactly_max_bytes_is_accepted_and_one_more_refused(
    codec: CompressionType, size: int
) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    compressed = compress(codec, data)
    assert decompress(codec, compressed, max_bytes=size) == data
    if size:
        with pytest.raises(DecompressionError):
            decompress(codec, compressed, max_bytes=size - 1)


def test_snappy_judges_the_declared_length_before_allocating() -> None:
    # A raw snappy preamble of 2**32-1 bytes, and nothing behind it.
    with pytest.raises(DecompressionError, match="over the limit"):
        decompress(CompressionType.SNAPPY, b"\xff\xff\xff\xff\x0f" + bytes(8))


def test_xerial_blocks_share_one_budget() -> None:
    block = compress(CompressionType.SNAPPY, bytes(600))
    framed = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
    framed += (struct.pack(">i", len(block)) + block) * 4
    assert decompress(CompressionType.SNAPPY, framed, max_bytes=2400) == bytes(2400)
    with pytest.raises(DecompressionError, match="over the limit"):
        decompress(CompressionType.SNAPPY, framed, max_bytes=2399)


@pytest.mark.processes
def test_the_default_limit_bounds_memory_not_just_the_result() -> None:
    """In a child process (peak RSS is per process): a 1 GiB bomb under the default limit.
    Decompressed whole it would take 1 GiB (2 with the copy into bytes)."""
    script = textwrap.dedent(
        """
        import resource, sys
        from riverbed.protocol.compression import CompressionType, DecompressionError, decompress
        bomb = sys.stdin.buffer.read()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            decompress(CompressionType.ZSTD, bomb)
            print("decompressed")
        except DecompressionError:
            print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        input=zstd_bomb(1 << 30),
        capture_output=True,
        check=True,
        timeout=120,
    )
    growth_kib = int(result.stdout)
    assert growth_kib * 1024 < DECOMPRESSED_BYTES_MAX + 32 * MIB


def test_a_bomb_in_a_produced_batch_is_refused_wherever_it_is_decoded() -> None:
    """validate_records reads headers only, so the broker stores the batch; every reader that
    decompresses it later answers CORRUPT_MESSAGE without building the 1 GiB."""
    header_fields = struct.pack(">qiibIhiqqqhii", 0, 0, 0, 2, 0, 0, 0, 1, 1, -1, -1, -1, 1)
    batch = build_batch(header_fields, zstd_bomb(1 << 30), CompressionType.ZSTD, False)
    assert len(validate_records(memoryview(bytearray(batch)), max_message_bytes=MIB)) == 1

    tp, header = TopicPartition("t", 0), parse_batch_header(batch)
    with pytest.raises(CorruptRecordError) as refused:
        decode_batch(tp, batch, 0, header)
    assert refused.value.code == ErrorCode.CORRUPT_MESSAGE
    assert traced_peak(lambda: decode_batch(tp, batch, 0, header)) < 4 * MIB

    fetch = PartitionFetch(TopicPartition("t", 0), batch, 0, 0)
    with pytest.raises(CorruptRecordError) as refused:
        fetch.take(10)
    assert refused.value.code == ErrorCode.CORRUPT_MESSAGE
    fetch = PartitionFetch(TopicPartition("t", 0), batch, 0, 0)
    assert traced_peak(lambda: fetch.take(10)) < 4 * MIB
