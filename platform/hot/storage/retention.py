"""Deletion retention on the hot tier: whole sealed segments past `retention.ms` /
`retention.bytes`, with Kafka's rules (LogManager's cleanup of `cleanup.policy=delete` logs).

- By time: a segment goes when its newest record (its max timestamp) is older than
  `retention.ms`.
- By size: the oldest segments go while what stays still reaches `retention.bytes` (the
  partition's size counts every segment, the active one too).
- Never the active segment, and never a segment with offsets at or above `limit_offset`: the
  high watermark for a plain topic (records not yet committed stay), the end of what is uploaded
  for a tiered one (local retention, tiering/offloader.py).

`log_start_after_retention` is pure (segment statistics and a clock in, an offset out); the
broker's retention task (`apply_retention`) runs it every `log.retention.check.interval.ms` on
every partition this broker has, leader or follower, as Kafka does on every replica.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from riverbed.configs import TopicConfig
from riverbed.hot.storage.log import PartitionLog, SegmentStats

log = logging.getLogger(__name__)

UNLIMITED = -1  # retention.ms / retention.bytes: no limit


def log_start_after_retention(
    stats: Sequence[SegmentStats],
    *,
    retention_ms: int,
    retention_bytes: int,
    now_ms: int,
    limit_offset: int,
) -> int | None:
    """The first offset kept once the segments past retention are deleted; None if none is."""
    kept_bytes = sum(s.size_bytes for s in stats)
    start = None
    for segment in stats:
        if not segment.sealed or segment.next_offset > limit_offset:
            break
        too_old = retention_ms != UNLIMITED and now_ms - segment.max_timestamp_ms > retention_ms
        too_big = (
            retention_bytes != UNLIMITED and kept_bytes - segment.size_bytes >= retention_bytes
        )
        if not (too_old or too_big):
            break
        kept_bytes -= segment.size_bytes
        start = segment.next_offset
    return start


def apply_retention(
    logs: Iterable[tuple[str, PartitionLog]],
    topic_config: Callable[[str], TopicConfig | None],
    tiered: Callable[[str], bool],
    now_ms: int,
) -> int:
    """Delete what is past retention in every log (with its topic's name) whose topic has the
    delete policy and is not `tiered` (the offloader applies retention to those, deleting only
    what is uploaded). Returns the bytes freed."""
    freed = 0
    for topic, partition_log in logs:
        config = topic_config(topic)
        if config is None or not config.delete or tiered(topic):
            continue
        start = log_start_after_retention(
            partition_log.segment_stats(),
            retention_ms=config.retention_ms,
            retention_bytes=config.retention_bytes,
            now_ms=now_ms,
            limit_offset=partition_log.high_watermark,
        )
        if start is not None:
            freed += partition_log.delete_segments_below(start, reason="past retention")
    return freed
