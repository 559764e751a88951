"""Kafka's documented topic configs, written down from Kafka's documentation, not from Riverbed's
config table: the tests hold Riverbed's table against this list.

The set is Kafka 4.1's "Topic-Level Configs" plus the three that Kafka 3.9 still documented and
4.0 removed (message.format.version, message.downconversion.enable,
message.timestamp.difference.max.ms): Riverbed keeps its metadata in ZooKeeper, as Kafka 3.x
did, so tooling written for 3.x clusters talks to it. Each name has a value Kafka accepts and
one its validator refuses (wrong type, out of range, or not among the allowed values).
"""

from __future__ import annotations

from typing import Final, NamedTuple


class Probe(NamedTuple):
    valid: str
    invalid: str


KAFKA_TOPIC_CONFIGS: Final[dict[str, Probe]] = {
    "cleanup.policy": Probe("compact,delete", "forever"),
    "compression.gzip.level": Probe("5", "10"),
    "compression.lz4.level": Probe("12", "18"),
    "compression.type": Probe("zstd", "brotli"),
    "compression.zstd.level": Probe("-5", "23"),
    "delete.retention.ms": Probe("3600000", "-1"),
    "file.delete.delay.ms": Probe("12345", "-1"),
    "flush.messages": Probe("1000", "0"),
    "flush.ms": Probe("5000", "-1"),
    "follower.replication.throttled.replicas": Probe("0:1,0:2", "0-1"),
    "index.interval.bytes": Probe("8192", "-1"),
    "leader.replication.throttled.replicas": Probe("*", "leader"),
    "local.retention.bytes": Probe("1048576", "-3"),
    "local.retention.ms": Probe("60000", "-3"),
    "max.compaction.lag.ms": Probe("86400000", "0"),
    "max.message.bytes": Probe("2097152", "-1"),
    "message.downconversion.enable": Probe("false", "maybe"),
    "message.format.version": Probe("2.8", "latest"),
    "message.timestamp.after.max.ms": Probe("3600000", "-1"),
    "message.timestamp.before.max.ms": Probe("86400000", "-1"),
    "message.timestamp.difference.max.ms": Probe("60000", "-1"),
    "message.timestamp.type": Probe("LogAppendTime", "AppendTime"),
    "min.cleanable.dirty.ratio": Probe("0.25", "1.5"),
    "min.compaction.lag.ms": Probe("1000", "-1"),
    "min.insync.replicas": Probe("2", "0"),
    "preallocate": Probe("true", "yes"),
    "remote.log.copy.disable": Probe("true", "1"),
    "remote.log.delete.on.disable": Probe("true", "on"),
    "remote.storage.enable": Probe("false", "sometimes"),
    "retention.bytes": Probe("1073741824", "ten"),
    "retention.ms": Probe("86400000", "-2"),
    "segment.bytes": Probe("1048576", "10"),
    "segment.index.bytes": Probe("1048576", "3"),
    "segment.jitter.ms": Probe("10", "-1"),
    "segment.ms": Probe("3600000", "0"),
    "unclean.leader.election.enable": Probe("true", "always"),
}
