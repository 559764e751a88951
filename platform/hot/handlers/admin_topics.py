"""CreateTopics and DeleteTopics, served by the controller like Kafka's admin clients expect.

Topic changes are conditional writes in ZooKeeper (a topic's znodes are created or removed in one
transaction); the answer waits, up to the request's `timeout_ms`, until this broker has applied
the change, so a client that creates a topic and produces right away finds it.
"""

from __future__ import annotations

import uuid

from riverbed.configs import ConfigError, validate_topic_configs
from riverbed.hot.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError

CreatableTopicResult = m.CreateTopicsResponse.CreatableTopicResult
DeletableTopicResult = m.DeleteTopicsResponse.DeletableTopicResult
ZERO_UUID = uuid.UUID(int=0)
# Bounds the wait of a request that asks for no timeout at all.
ADMIN_TIMEOUT_MS_MAX = 120_000


async def handle_create_topics(
    ctx: BrokerContext, request: m.CreateTopicsRequest
) -> m.CreateTopicsResponse:
    results = []
    created = []
    for topic in request.topics:
        result = CreatableTopicResult(name=topic.name, error_message=None)
        results.append(result)
        try:
            _check_controller(ctx)
            topic_id = await _create_topic(ctx, topic, validate_only=request.validate_only)
        except KafkaError as error:
            result.error_code = error.code
            result.error_message = str(error)
            continue
        result.topic_id = topic_id
        result.num_partitions = _partitions(ctx, topic)
        result.replication_factor = _replication_factor(ctx, topic)
        if not request.validate_only:
            created.append(topic.name)
    if created:
        await ctx.wait_until(
            lambda: all(ctx.topic_applied(name) for name in created), _timeout_s(request.timeout_ms)
        )
    return m.CreateTopicsResponse(topics=results)


async def _create_topic(
    ctx: BrokerContext, topic: m.CreateTopicsRequest.CreatableTopic, *, validate_only: bool
) -> uuid.UUID:
    if topic.assignments:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST, "manual replica assignments are not supported yet"
        )
    configs = {c.name: c.value for c in topic.configs if c.value is not None}
    try:
        validated = validate_topic_configs(configs)
    except ConfigError as error:
        raise KafkaError(ErrorCode.INVALID_CONFIG, str(error)) from error
    live = sorted(ctx.cache.brokers())
    num_partitions = _partitions(ctx, topic)
    replication_factor = _replication_factor(ctx, topic)
    if validate_only:
        ctx.store.check_new_topic(
            name=topic.name,
            num_partitions=num_partitions,
            replication_factor=replication_factor,
            live_broker_ids=live,
        )
        if ctx.cache.topic(topic.name) is not None:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {topic.name!r} already exists")
        return ZERO_UUID
    return await ctx.store.create_topic(
        topic.name,
        num_partitions=num_partitions,
        replication_factor=replication_factor,
        configs=validated,
        live_broker_ids=live,
    )


def _partitions(ctx: BrokerContext, topic: m.CreateTopicsRequest.CreatableTopic) -> int:
    return topic.num_partitions if topic.num_partitions != -1 else ctx.config.num_partitions


def _replication_factor(ctx: BrokerContext, topic: m.CreateTopicsRequest.CreatableTopic) -> int:
    if topic.replication_factor != -1:
        return topic.replication_factor
    return ctx.config.default_replication_factor


async def handle_delete_topics(
    ctx: BrokerContext, request: m.DeleteTopicsRequest, version: int
) -> m.DeleteTopicsResponse:
    wanted: list[tuple[str | None, uuid.UUID]] = (
        [(t.name, t.topic_id) for t in request.topics]
        if version >= 6
        else [(name, ZERO_UUID) for name in request.topic_names]
    )
    results = []
    deleted = []
    for name, topic_id in wanted:
        result = DeletableTopicResult(name=name, topic_id=topic_id)
        results.append(result)
        try:
            _check_controller(ctx)
            metadata = (
                ctx.cache.topic(name) if name is not None else ctx.cache.topic_by_id(topic_id)
            )
            if metadata is None:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if name else ErrorCode.UNKNOWN_TOPIC_ID
                raise KafkaError(code, f"unknown topic {name or topic_id}")
            result.name, result.topic_id = metadata.name, metadata.topic_id
            await ctx.store.delete_topic(metadata.name)
        except KafkaError as error:
            result.error_code = error.code
            result.error_message = str(error)
            continue
        deleted.append(metadata.name)
    if deleted:
        await ctx.wait_until(
            lambda: not any(ctx.partitions.hosts_topic(n) for n in deleted),
            _timeout_s(request.timeout_ms),
        )
    return m.DeleteTopicsResponse(responses=results)


def _check_controller(ctx: BrokerContext) -> None:
    if ctx.cache.controller_id != ctx.broker_id:
        raise KafkaError(ErrorCode.NOT_CONTROLLER, f"broker {ctx.broker_id} is not the controller")


def _timeout_s(timeout_ms: int) -> float:
    return min(max(timeout_ms, 0), ADMIN_TIMEOUT_MS_MAX) / 1000
