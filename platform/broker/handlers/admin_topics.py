"""CreateTopics, DeleteTopics and CreatePartitions, served by the controller like Kafka's admin
clients expect.

Topic changes are conditional writes in ZooKeeper (a topic's znodes are created or removed, or
its partitions added, in one transaction). As Kafka's controller does (DelayedCreatePartitions,
DelayedDeleteTopics), the answer waits, up to the request's `timeout_ms`, until this broker's own
metadata shows the change: a created topic, or a topic's added partitions, with their leaders
(and the partitions led here serving), a deleted topic gone from the cache and from the disk. So
a client that creates a topic or adds partitions and produces right away finds them, and one
that deletes a topic and asks this broker for Metadata no longer sees it. Other brokers may lag,
as in Kafka. A topic whose change is not visible when the timeout ends gets REQUEST_TIMED_OUT
(the change itself is made and will show); `timeout_ms` <= 0 answers at once, as Kafka's does.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from riverbed.broker.groups.offsets_topic import OFFSETS_TOPIC
from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.handlers.zookeeper_bound import zookeeper_bound
from riverbed.configs import ConfigError, effective_topic_config, validate_topic_configs
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

CreatableTopicResult = m.CreateTopicsResponse.CreatableTopicResult
CreatableTopicConfigs = m.CreateTopicsResponse.CreatableTopicConfigs
DeletableTopicResult = m.DeleteTopicsResponse.DeletableTopicResult
CreatePartitionsTopicResult = m.CreatePartitionsResponse.CreatePartitionsTopicResult
ZERO_UUID = uuid.UUID(int=0)
# Bounds the wait of a request whose timeout_ms is huge (INT32_MAX, meaning "no timeout").
ADMIN_TIMEOUT_MS_MAX = 120_000


async def handle_create_topics(
    ctx: BrokerContext, request: m.CreateTopicsRequest, access: Access
) -> m.CreateTopicsResponse:
    """Needs CREATE on the cluster, or on each topic (TOPIC_AUTHORIZATION_FAILED); topics the
    principal may not DESCRIBE_CONFIGS also get that code as their topic config error (v5+),
    as in Kafka. Checked on the controller only, after NOT_CONTROLLER."""
    started_s = asyncio.get_running_loop().time()
    results = []
    created = []
    denied, config_denied = _create_refusals(ctx, request, access)
    for topic in request.topics:
        result = CreatableTopicResult(name=topic.name, error_message=None)
        results.append(result)
        try:
            _check_controller(ctx)
            if topic.name in denied:
                raise KafkaError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
            if topic.name in config_denied:
                result.topic_config_error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            async with _topic_write(ctx, f"creating topic {topic.name!r}", request, started_s):
                topic_id, overrides = await _create_topic(
                    ctx, topic, validate_only=request.validate_only
                )
        except KafkaError as error:
            result.error_code = error.code
            result.error_message = error.message or None
            continue
        result.topic_id = topic_id
        if topic.name not in config_denied:
            result.configs = _described(ctx, overrides)
        result.num_partitions = _partitions(ctx, topic)
        result.replication_factor = _replication_factor(ctx, topic)
        if not request.validate_only:
            created.append(topic.name)
    await _answer_once_applied(
        ctx, results, created, ctx.topic_created, request.timeout_ms, "created; its leaders"
    )
    return m.CreateTopicsResponse(topics=results)


def _create_refusals(
    ctx: BrokerContext, request: m.CreateTopicsRequest, access: Access
) -> tuple[frozenset[str], frozenset[str]]:
    """(topics the principal may not create, topics whose configs it may not describe)."""
    if not access.enabled or ctx.cache.controller_id != ctx.broker_id:
        return frozenset(), frozenset()
    names = [topic.name for topic in request.topics]
    denied = (
        frozenset()
        if access.allows_cluster(AclOperation.CREATE, log_denied=False)
        else access.denied(AclOperation.CREATE, ResourceType.TOPIC, names)
    )
    config_denied = access.denied(
        AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, names, log_denied=False
    )
    return denied, config_denied


async def _create_topic(
    ctx: BrokerContext, topic: m.CreateTopicsRequest.CreatableTopic, *, validate_only: bool
) -> tuple[uuid.UUID, dict[str, str]]:
    """Create (or only check) one topic: its id (zero when only checked) and its overrides."""
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
        return ZERO_UUID, validated
    topic_id = await ctx.store.create_topic(
        topic.name,
        num_partitions=num_partitions,
        replication_factor=replication_factor,
        configs=validated,
        live_broker_ids=live,
    )
    return topic_id, validated


def _described(ctx: BrokerContext, overrides: dict[str, str]) -> list[CreatableTopicConfigs]:
    """The new topic's effective configs, as Kafka's CreateTopics v5+ answer carries them (its
    admin client returns them from CreateTopicsResult.config())."""
    return [
        CreatableTopicConfigs(
            name=value.name,
            value=value.value,
            read_only=value.read_only,
            config_source=value.source,
            is_sensitive=value.sensitive,
        )
        for value in effective_topic_config(ctx.config, overrides).values()
    ]


def _partitions(ctx: BrokerContext, topic: m.CreateTopicsRequest.CreatableTopic) -> int:
    return topic.num_partitions if topic.num_partitions != -1 else ctx.config.num_partitions


def _replication_factor(ctx: BrokerContext, topic: m.CreateTopicsRequest.CreatableTopic) -> int:
    if topic.replication_factor != -1:
        return topic.replication_factor
    return ctx.config.default_replication_factor


async def handle_delete_topics(
    ctx: BrokerContext, request: m.DeleteTopicsRequest, version: int, access: Access
) -> m.DeleteTopicsResponse:
    """Needs DELETE on each topic (TOPIC_AUTHORIZATION_FAILED, checked before whether the topic
    exists, as in Kafka); a topic named by id whose name the principal may not DESCRIBE is
    answered without its name."""
    wanted: list[tuple[str | None, uuid.UUID]] = (
        [(t.name, t.topic_id) for t in request.topics]
        if version >= 6
        else [(name, ZERO_UUID) for name in request.topic_names]
    )
    started_s = asyncio.get_running_loop().time()
    results = []
    deleted: dict[str, uuid.UUID] = {}
    for name, topic_id in wanted:
        result = DeletableTopicResult(name=name, topic_id=topic_id)
        results.append(result)
        try:
            _check_controller(ctx)
            metadata = (
                ctx.cache.topic(name) if name is not None else ctx.cache.topic_by_id(topic_id)
            )
            _check_delete_allowed(access, result, name if metadata is None else metadata.name)
            if metadata is None:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if name else ErrorCode.UNKNOWN_TOPIC_ID
                raise KafkaError(code, f"unknown topic {name or topic_id}")
            result.name, result.topic_id = metadata.name, metadata.topic_id
            async with _topic_write(ctx, f"deleting topic {metadata.name!r}", request, started_s):
                await ctx.store.delete_topic(metadata.name)
        except KafkaError as error:
            result.error_code = error.code
            result.error_message = error.message or None
            continue
        deleted[metadata.name] = metadata.topic_id

    def forgotten(name: str) -> bool:
        current = ctx.cache.topic(name)
        gone = current is None or current.topic_id != deleted[name]  # or created again since
        return gone and not ctx.partitions.hosts_topic(name)

    await _answer_once_applied(
        ctx, results, list(deleted), forgotten, request.timeout_ms, "deleted; its removal"
    )
    return m.DeleteTopicsResponse(responses=results)


async def handle_create_partitions(
    ctx: BrokerContext, request: m.CreatePartitionsRequest, access: Access
) -> m.CreatePartitionsResponse:
    """Adds partitions to topics (ClusterMetadataStore.add_partitions). As in Kafka: one result
    per topic named; NOT_CONTROLLER off the controller; a topic named twice gets
    INVALID_REQUEST; the others need ALTER on the topic (TOPIC_AUTHORIZATION_FAILED, before
    whether it exists). `__consumer_offsets` keeps its partition count (INVALID_REQUEST): a
    group's coordinator is the partition its id hashes to among them, so more partitions would
    move most groups away from their committed offsets."""
    started_s = asyncio.get_running_loop().time()
    named = Counter(topic.name for topic in request.topics)
    duplicates = {name for name, times in named.items() if times > 1}
    denied = _alter_refusals(ctx, [name for name in named if name not in duplicates], access)
    results: dict[str, CreatePartitionsTopicResult] = {}
    added: dict[str, frozenset[int]] = {}  # topic -> its new partitions
    for topic in request.topics:
        if topic.name in results:
            continue  # a duplicate, answered once
        result = results[topic.name] = CreatePartitionsTopicResult(name=topic.name)
        try:
            _check_controller(ctx)
            if topic.name in duplicates:
                raise KafkaError(ErrorCode.INVALID_REQUEST, "the topic is named more than once")
            if topic.name in denied:
                raise KafkaError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
            what = f"adding partitions to topic {topic.name!r}"
            async with _topic_write(ctx, what, request, started_s):
                placed = await _add_partitions(ctx, topic, validate_only=request.validate_only)
        except KafkaError as error:
            result.error_code = error.code
            result.error_message = error.message or None
            continue
        if not request.validate_only:
            added[topic.name] = frozenset(placed)

    await _answer_once_applied(
        ctx,
        results.values(),
        list(added),
        lambda name: ctx.topic_created(name, added[name]),
        request.timeout_ms,
        "given partitions; their leaders",
    )
    return m.CreatePartitionsResponse(results=list(results.values()))


def _alter_refusals(ctx: BrokerContext, names: list[str], access: Access) -> frozenset[str]:
    """The topics the principal may not ALTER (checked on the controller only)."""
    if not access.enabled or ctx.cache.controller_id != ctx.broker_id:
        return frozenset()
    return access.denied(AclOperation.ALTER, ResourceType.TOPIC, names)


async def _add_partitions(
    ctx: BrokerContext,
    topic: m.CreatePartitionsRequest.CreatePartitionsTopic,
    *,
    validate_only: bool,
) -> dict[int, tuple[int, ...]]:
    """The new partitions' replicas, written unless `validate_only`."""
    if topic.name == OFFSETS_TOPIC:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST,
            f"the partition count of {OFFSETS_TOPIC} cannot be changed: groups are placed on "
            "its partitions by it, and would lose their committed offsets",
        )
    manual = None if topic.assignments is None else [a.broker_ids for a in topic.assignments]
    return await ctx.store.add_partitions(
        topic.name, topic.count, sorted(ctx.cache.brokers()), manual, validate_only=validate_only
    )


class _TopicResult(Protocol):
    """A per-topic result of CreateTopics, DeleteTopics or CreatePartitions."""

    @property
    def name(self) -> str | None: ...

    error_code: int
    error_message: str | None


async def _answer_once_applied(
    ctx: BrokerContext,
    results: Iterable[_TopicResult],
    names: list[str],
    applied: Callable[[str], bool],
    timeout_ms: int,
    what: str,
) -> None:
    """Wait, within `timeout_ms`, until `applied(name)` holds for every name (Kafka answers at
    once when timeout_ms <= 0); a topic for which it still does not then gets REQUEST_TIMED_OUT
    (`what`: what was done, and what this broker has not seen yet)."""
    if not names or timeout_ms <= 0:
        return
    await ctx.wait_until(lambda: all(applied(name) for name in names), _timeout_s(timeout_ms))
    late = frozenset(name for name in names if not applied(name))
    for result in results:
        if result.name in late:
            result.error_code = ErrorCode.REQUEST_TIMED_OUT
            result.error_message = (
                f"topic {result.name!r}: {what} not yet seen by broker {ctx.broker_id} "
                f"within timeout_ms={timeout_ms}"
            )


def _check_delete_allowed(access: Access, result: DeletableTopicResult, name: str | None) -> None:
    if name is None or not access.enabled:
        return  # an unknown topic id: UNKNOWN_TOPIC_ID follows
    by_id = result.name is None
    if by_id and not access.allows(AclOperation.DESCRIBE, ResourceType.TOPIC, name):
        raise KafkaError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed.")
    if not access.allows(AclOperation.DELETE, ResourceType.TOPIC, name):
        result.name = name  # it may DESCRIBE the topic: its name is no secret
        raise KafkaError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed.")


def _topic_write(
    ctx: BrokerContext,
    what: str,
    request: m.CreateTopicsRequest | m.DeleteTopicsRequest | m.CreatePartitionsRequest,
    started_s: float,
) -> AbstractAsyncContextManager[None]:
    """The controller's ZooKeeper write for one topic of `request`: all of them together within
    its timeout_ms, counted from `started_s`; a lost session answers NOT_CONTROLLER (this broker
    may no longer be the controller: the client looks for it again)."""
    return zookeeper_bound(
        ctx.config,
        what,
        timeout_ms=request.timeout_ms,
        started_s=started_s,
        lost=ErrorCode.NOT_CONTROLLER,
    )


def _check_controller(ctx: BrokerContext) -> None:
    if ctx.cache.controller_id != ctx.broker_id:
        raise KafkaError(ErrorCode.NOT_CONTROLLER, f"broker {ctx.broker_id} is not the controller")


def _timeout_s(timeout_ms: int) -> float:
    return min(timeout_ms, ADMIN_TIMEOUT_MS_MAX) / 1000
