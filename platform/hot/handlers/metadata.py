"""Metadata: live brokers, the controller and topic/partition leadership, from the cache.

Auto-creation (`auto.create.topics.enable`): an unknown topic named in a Metadata request that
allows it is created in ZooKeeper with `num.partitions` and `default.replication.factor`. Like
Kafka, the answer for it is LEADER_NOT_AVAILABLE unless the new topic is already applied locally
when a short wait ends; clients retry Metadata on that error.
"""

from __future__ import annotations

from riverbed.hot.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError

Broker = m.MetadataResponse.MetadataResponseBroker
Topic = m.MetadataResponse.MetadataResponseTopic
Partition = m.MetadataResponse.MetadataResponsePartition

# Kafka's "authorized operations not requested" marker.
OPERATIONS_NOT_REQUESTED = -(2**31)
# Without ACLs (a later issue) every principal may do everything: READ(3) WRITE(4) CREATE(5)
# DELETE(6) ALTER(7) DESCRIBE(8) DESCRIBE_CONFIGS(10) ALTER_CONFIGS(11) on topics, and
# CREATE(5) ALTER(7) DESCRIBE(8) CLUSTER_ACTION(9) DESCRIBE_CONFIGS(10) ALTER_CONFIGS(11)
# IDEMPOTENT_WRITE(12) on the cluster.
TOPIC_OPERATIONS_ALL = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
CLUSTER_OPERATIONS_ALL = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))
# How long a Metadata request that auto-created topics waits for them to be applied.
AUTO_CREATE_WAIT_S = 1.0


async def handle_metadata(
    ctx: BrokerContext, request: m.MetadataRequest, version: int, listener: str
) -> m.MetadataResponse:
    """`listener` is the name of the listener the request came in on: every broker is
    described by its address on that listener (Kafka's rule), and a broker without one is left
    out."""
    names = _requested_names(ctx, request, version)
    allow_auto_create = request.allow_auto_topic_creation if version >= 4 else True
    created = await _auto_create(ctx, names, allow_auto_create)
    if created:
        await ctx.wait_until(lambda: all(ctx.topic_applied(n) for n in created), AUTO_CREATE_WAIT_S)
    live = ctx.cache.brokers()
    topics = []
    for name in names:
        topic = _describe_topic(ctx, name, set(live))
        if request.include_topic_authorized_operations:
            topic.topic_authorized_operations = TOPIC_OPERATIONS_ALL
        topics.append(topic)
    brokers = []
    for broker in sorted(live.values(), key=lambda b: b.broker_id):
        endpoint = broker.endpoint(listener)
        if endpoint is not None:
            host, port = endpoint
            brokers.append(Broker(node_id=broker.broker_id, host=host, port=port, rack=broker.rack))
    return m.MetadataResponse(
        brokers=brokers,
        cluster_id=ctx.cache.cluster_id,
        controller_id=ctx.cache.controller_id if ctx.cache.controller_id is not None else -1,
        topics=topics,
        cluster_authorized_operations=(
            CLUSTER_OPERATIONS_ALL
            if request.include_cluster_authorized_operations
            else OPERATIONS_NOT_REQUESTED
        ),
    )


def _requested_names(ctx: BrokerContext, request: m.MetadataRequest, version: int) -> list[str]:
    # v0: an empty list means all topics; v1+: null means all topics, empty means none.
    if request.topics is None or (version == 0 and not request.topics):
        return sorted(ctx.cache.topic_names())
    names = []
    for topic in request.topics:
        if topic.name is not None:
            names.append(topic.name)
        else:
            metadata = ctx.cache.topic_by_id(topic.topic_id)
            if metadata is not None:
                names.append(metadata.name)
    return names


async def _auto_create(ctx: BrokerContext, names: list[str], allowed: bool) -> list[str]:
    if not (allowed and ctx.config.auto_create_topics_enable):
        return []
    created = []
    for name in names:
        if ctx.cache.topic(name) is not None:
            continue
        try:
            await ctx.store.create_topic(
                name,
                num_partitions=ctx.config.num_partitions,
                replication_factor=ctx.config.default_replication_factor,
                configs={},
                live_broker_ids=sorted(ctx.cache.brokers()),
            )
        except KafkaError as error:
            if error.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                continue  # An illegal name: reported as unknown below, like Kafka.
        created.append(name)
    return created


def _describe_topic(ctx: BrokerContext, name: str, live: set[int]) -> Topic:
    metadata = ctx.cache.topic(name)
    if metadata is None:
        return Topic(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name)
    if not ctx.topic_applied(name):
        return Topic(
            error_code=ErrorCode.LEADER_NOT_AVAILABLE, name=name, topic_id=metadata.topic_id
        )
    partitions = []
    for index, state in sorted(metadata.partitions.items()):
        leader_live = state.leader in live
        partitions.append(
            Partition(
                error_code=ErrorCode.NONE if leader_live else ErrorCode.LEADER_NOT_AVAILABLE,
                partition_index=index,
                leader_id=state.leader if leader_live else -1,
                leader_epoch=state.leader_epoch,
                replica_nodes=list(state.replicas),
                isr_nodes=list(state.isr),
                offline_replicas=[r for r in state.replicas if r not in live],
            )
        )
    return Topic(
        error_code=ErrorCode.NONE,
        name=name,
        topic_id=metadata.topic_id,
        is_internal=name.startswith("__"),
        partitions=partitions,
    )
