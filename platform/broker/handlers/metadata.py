"""Metadata: live brokers, the controller and topic/partition leadership, from the cache.

Auto-creation (`auto.create.topics.enable`): an unknown topic named in a Metadata request that
allows it is created in ZooKeeper with `num.partitions` and `default.replication.factor`. Like
Kafka, the answer for it is LEADER_NOT_AVAILABLE unless the new topic is already applied locally
when a short wait ends; clients retry Metadata on that error.
"""

from __future__ import annotations

from dataclasses import replace

from riverbed.broker.handlers.cluster_view import brokers_on, cluster_authorized_operations
from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.handlers.zookeeper_bound import zookeeper_bound
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

Broker = m.MetadataResponse.MetadataResponseBroker
Topic = m.MetadataResponse.MetadataResponseTopic

# How long a Metadata request that auto-created topics waits for them to be applied.
AUTO_CREATE_WAIT_S = 1.0


async def handle_metadata(
    ctx: BrokerContext,
    request: m.MetadataRequest,
    version: int,
    access: Access,
    listener: str,
) -> m.MetadataResponse:
    """With ACLs, as Kafka: listing every topic hides those the principal may not DESCRIBE;
    one named explicitly gets TOPIC_AUTHORIZATION_FAILED (without its id, unless it was asked
    by id), and so does an unknown one it may not auto-create (CREATE on the cluster or the
    topic). The authorized-operations fields report what the ACLs allow, when asked.
    `listener` is the name of the listener the request came in on: every broker is described
    by its address on that listener (Kafka's rule), and a broker without one is left out."""
    every_topic = request.topics is None or (version == 0 and not request.topics)
    wanted = _requested_names(ctx, request, version)
    allow_auto_create = request.allow_auto_topic_creation if version >= 4 else True
    allow_auto_create = allow_auto_create and ctx.config.auto_create_topics_enable
    refused = _refused(ctx, access, wanted, every_topic=every_topic, auto_create=allow_auto_create)
    names = [name for name, _ in wanted if name not in refused]
    created = await _auto_create(ctx, names, allow_auto_create)
    if created:
        await ctx.wait_until(lambda: all(ctx.topic_applied(n) for n in created), AUTO_CREATE_WAIT_S)
    live = ctx.cache.brokers()
    live_ids = frozenset(live)
    topics = []
    for name in names:
        topic = _describe_topic(ctx, name, live_ids)
        if request.include_topic_authorized_operations:
            operations = access.operations(ResourceType.TOPIC, name)
            topic = replace(topic, topic_authorized_operations=operations)
        topics.append(topic)
    if every_topic and not refused:
        ctx.topic_descriptions.keep_only(names)
    if not every_topic:  # a listing of everything just leaves them out
        topics.extend(_refusals(ctx, wanted, refused))
    brokers = [
        Broker(node_id=b.broker_id, host=b.host, port=b.port, rack=b.rack)
        for b in brokers_on(listener, live)
    ]
    return m.MetadataResponse(
        brokers=brokers,
        cluster_id=ctx.cache.cluster_id,
        controller_id=ctx.cache.controller_id if ctx.cache.controller_id is not None else -1,
        topics=topics,
        cluster_authorized_operations=cluster_authorized_operations(
            access, requested=request.include_cluster_authorized_operations
        ),
    )


def _refused(
    ctx: BrokerContext,
    access: Access,
    wanted: list[tuple[str, bool]],
    *,
    every_topic: bool,
    auto_create: bool,
) -> frozenset[str]:
    """The names the request may not see: no DESCRIBE, or unknown and no right to create."""
    if not access.enabled:
        return frozenset()
    names = [name for name, _ in wanted]
    # Listing everything filters quietly; a topic asked for by name is an attempt, logged.
    refused = access.denied(
        AclOperation.DESCRIBE, ResourceType.TOPIC, names, log_denied=not every_topic
    )
    unknown = [n for n in names if n not in refused and ctx.cache.topic(n) is None]
    if unknown and auto_create and not access.allows_cluster(AclOperation.CREATE, log_denied=False):
        refused |= access.denied(AclOperation.CREATE, ResourceType.TOPIC, unknown)
    return refused


def _refusals(
    ctx: BrokerContext, wanted: list[tuple[str, bool]], refused: frozenset[str]
) -> list[Topic]:
    """TOPIC_AUTHORIZATION_FAILED for each refused topic the request named (by name: without
    its id, so nothing is disclosed; by id: without its name)."""
    answered = set()
    refusals = []
    for name, by_id in wanted:
        if name not in refused or name in answered:
            continue
        answered.add(name)
        metadata = ctx.cache.topic(name)
        if by_id and metadata is not None:
            refusals.append(
                Topic(
                    error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    name=None,
                    topic_id=metadata.topic_id,
                )
            )
        else:
            refusals.append(Topic(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=name))
    return refusals


def _requested_names(
    ctx: BrokerContext, request: m.MetadataRequest, version: int
) -> list[tuple[str, bool]]:
    """(name, whether it was asked for by topic id) of every topic the request names."""
    # v0: an empty list means all topics; v1+: null means all topics, empty means none.
    if request.topics is None or (version == 0 and not request.topics):
        return [(name, False) for name in sorted(ctx.cache.topic_names())]
    names = []
    for topic in request.topics:
        if topic.name is not None:
            names.append((topic.name, False))
        else:
            metadata = ctx.cache.topic_by_id(topic.topic_id)
            if metadata is not None:
                names.append((metadata.name, True))
    return names


async def _auto_create(ctx: BrokerContext, names: list[str], allowed: bool) -> list[str]:
    if not allowed:
        return []
    created = []
    for name in names:
        if ctx.cache.topic(name) is not None:
            continue
        try:
            async with zookeeper_bound(ctx.config, f"auto-creating topic {name!r}"):
                await ctx.store.create_topic(
                    name,
                    num_partitions=ctx.config.num_partitions,
                    replication_factor=ctx.config.default_replication_factor,
                    configs={},
                    live_broker_ids=sorted(ctx.cache.brokers()),
                )
        except KafkaError as error:
            if error.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                # An illegal name, or ZooKeeper out of reach: reported as unknown below (the
                # client asks again), like Kafka.
                continue
        created.append(name)
    return created


def _describe_topic(ctx: BrokerContext, name: str, live: frozenset[int]) -> Topic:
    metadata = ctx.cache.topic(name)
    if metadata is None:
        return Topic(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name)
    if not ctx.topic_applied(name):
        return Topic(
            error_code=ErrorCode.LEADER_NOT_AVAILABLE, name=name, topic_id=metadata.topic_id
        )
    return ctx.topic_descriptions.describe(metadata, live)
