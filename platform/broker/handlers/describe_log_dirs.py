"""DescribeLogDirs: this broker's data directory, the local size of each partition in it, and
(Riverbed's tagged extension) what the cold tier holds of the partitions it leads.

Kafka's fields: PartitionSize is the bytes of the partition's local segments, OffsetLag the log
end offset minus the high watermark, TotalBytes / UsableBytes the volume's size and free space
(v4). For a tiered partition led here, RemoteLogSize is the bytes of its readable remote
segments (from the manifest) and TieringBacklogBytes the sealed local bytes not uploaded yet (as
the offloader last measured); both stay -1 (absent on the wire) elsewhere, and when the
manifest cannot be read, so a store outage never fails the request.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from riverbed.broker.handlers.context import BrokerContext
from riverbed.hot.replication.partitions import Partition
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation

Result = m.DescribeLogDirsResponse.DescribeLogDirsResult
TopicResult = m.DescribeLogDirsResponse.DescribeLogDirsTopic
PartitionResult = m.DescribeLogDirsResponse.DescribeLogDirsPartition


async def handle_describe_log_dirs(
    ctx: BrokerContext, request: m.DescribeLogDirsRequest, access: Access
) -> m.DescribeLogDirsResponse:
    """Needs DESCRIBE on the cluster: CLUSTER_AUTHORIZATION_FAILED and no results otherwise
    (v1-2 have no top-level error: they just see no directory)."""
    if not access.allows_cluster(AclOperation.DESCRIBE):
        return m.DescribeLogDirsResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    wanted = (
        None
        if request.topics is None
        else {(t.topic, index) for t in request.topics for index in t.partitions}
    )
    topics: dict[str, list[PartitionResult]] = {}
    for partition in sorted(ctx.partitions, key=lambda p: (p.topic, p.index)):
        if wanted is None or (partition.topic, partition.index) in wanted:
            topics.setdefault(partition.topic, []).append(await _describe(ctx, partition))
    # One realpath per request, on the loop as the broker's log writes and its statvfs are.
    log_dir = Path(ctx.config.log_dir).resolve()  # noqa: ASYNC240
    result = Result(
        error_code=ErrorCode.NONE,
        log_dir=str(log_dir),
        topics=[TopicResult(name=name, partitions=found) for name, found in topics.items()],
    )
    try:
        usage = shutil.disk_usage(log_dir)
    except OSError:  # the directory cannot be read: the code says so
        result.error_code = ErrorCode.KAFKA_STORAGE_ERROR
        result.topics = []
    else:
        result.total_bytes, result.usable_bytes = usage.total, usage.free
    return m.DescribeLogDirsResponse(error_code=ErrorCode.NONE, results=[result])


async def _describe(ctx: BrokerContext, partition: Partition) -> PartitionResult:
    partition_log = partition.log
    described = PartitionResult(
        partition_index=partition.index,
        partition_size=partition_log.size_bytes,
        offset_lag=max(partition_log.log_end_offset - partition_log.high_watermark, 0),
        is_future_key=False,
    )
    tiering = ctx.tiering
    if tiering is not None and partition.is_leader and tiering.enabled_for(partition.topic):
        try:
            _, described.remote_log_size = await tiering.tiered_summary(partition)
        except KafkaError:
            return described  # the store is unreachable: sizes unknown, not an error
        described.tiering_backlog_bytes = tiering.backlog_bytes(partition)
    return described
