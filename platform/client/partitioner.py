"""Which partition a record goes to: murmur2 of the key, or sticky for records without one.

Keyed records land where the Java client's default partitioner and librdkafka's
`murmur2_random` put them: `(murmur2(key) & 0x7fffffff) % partitions`, with Kafka's murmur2
(seed 0x9747b28c, 4-byte little-endian blocks, the tail mixed in byte by byte). Records without a
key stick to one partition until its batch is closed (KIP-480), then move to another chosen at
random, so unkeyed traffic fills whole batches instead of spreading one record per partition.
"""

from __future__ import annotations

import random
import struct
from typing import Final

MURMUR2_SEED: Final = 0x9747B28C
MURMUR2_M: Final = 0x5BD1E995
MURMUR2_R: Final = 24
MASK_32: Final = 0xFFFFFFFF
POSITIVE_MASK: Final = 0x7FFFFFFF
_BLOCKS = struct.Struct("<I")


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of `data` as a signed 32-bit int (Utils.murmur2 in the Java client)."""
    length = len(data)
    m = MURMUR2_M
    h = (MURMUR2_SEED ^ length) & MASK_32
    blocks_end = length - length % 4
    for (k,) in _BLOCKS.iter_unpack(data[:blocks_end]):
        k = (k * m) & MASK_32
        k ^= k >> MURMUR2_R
        k = (k * m) & MASK_32
        h = ((h * m) & MASK_32) ^ k
    tail = length % 4
    if tail == 3:
        h ^= data[blocks_end + 2] << 16
    if tail >= 2:
        h ^= data[blocks_end + 1] << 8
    if tail >= 1:
        h ^= data[blocks_end]
        h = (h * m) & MASK_32
    h ^= h >> 13
    h = (h * m) & MASK_32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partition_count: int) -> int:
    """The partition of a keyed record among `partition_count` partitions."""
    return (murmur2(key) & POSITIVE_MASK) % partition_count


class StickyPartitioner:
    """The current partition per topic for records without a key."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._current: dict[str, int] = {}

    def next_partition(self, topic: str, partition_count: int) -> int:
        """Move `topic` to another partition (its batch on the current one was closed)."""
        previous = self._current.get(topic)
        if partition_count == 1:
            chosen = 0
        elif previous is None or previous >= partition_count:
            chosen = self._rng.randrange(partition_count)
        else:  # any partition but the previous one, uniformly
            chosen = self._rng.randrange(partition_count - 1)
            chosen += chosen >= previous
        self._current[topic] = chosen
        return chosen
