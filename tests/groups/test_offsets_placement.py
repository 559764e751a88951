"""Which `__consumer_offsets` partition holds a group: Kafka's `Utils.abs(groupId.hashCode) % n`.

The expected values were computed with Java (`String.hashCode`, then Kafka's `Utils.abs`, which
maps Integer.MIN_VALUE to 0), so a group lives in the same partition as on a Kafka cluster.
"""

from __future__ import annotations

import pytest
from riverbed.broker.groups.offsets_topic import offsets_topic_configs, partition_for
from riverbed.configs import BrokerConfig
from riverbed.protocol.java_hash import java_string_hash


@pytest.mark.parametrize(
    ("group_id", "hash_code", "of_3", "of_50"),
    [
        ("", 0, 0, 0),
        ("a", 97, 1, 47),
        ("hello", 99162322, 1, 22),
        ("test-group", 627841412, 2, 12),
        # Negative hash codes: Kafka takes the absolute value (a `& 0x7fffffff` mask would put
        # "my-group" in partition 36 of 50, not 12).
        ("my-group", -1906497762, 0, 12),
        ("consumer-group", -1738392088, 1, 38),
        # Integer.MIN_VALUE has no absolute value: Kafka's Utils.abs answers 0.
        ("polygenelubricants", -(2**31), 0, 0),
        # Outside the BMP a character is two UTF-16 code units (a surrogate pair).
        ("\N{GRINNING FACE}x", 54959989, 1, 39),
    ],
)
def test_partition_matches_kafka(group_id: str, hash_code: int, of_3: int, of_50: int) -> None:
    assert java_string_hash(group_id) == hash_code
    assert partition_for(group_id, 3) == of_3
    assert partition_for(group_id, 50) == of_50


def test_topic_configs_are_kafkas() -> None:
    config = BrokerConfig.from_mapping(
        {"zookeeper.connect": "127.0.0.1:2181", "offsets.topic.segment.bytes": "1048576"}
    )
    assert offsets_topic_configs(config) == {
        "cleanup.policy": "compact",
        "segment.bytes": "1048576",
        "compression.type": "producer",
    }
