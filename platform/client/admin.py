"""The admin client: topics, topic configs and partition offsets.

Requests go where Kafka's admin clients send them: topic creation and deletion to the controller,
ListOffsets to each partition's leader, everything else (Metadata, DescribeConfigs,
IncrementalAlterConfigs of topics) to any broker. Connections and metadata come from the
client's shared `BrokerPool`.

Each operation retries what a retry can fix (the controller or a leader moved, a connection
dropped) with the pool's exponential backoff, for at most `request_timeout_ms` in all; before
any broker has answered, a connection failure is raised at once (a wrong bootstrap address
should not look like a slow cluster). Every other error is raised at once as its
`riverbed.errors` class, carrying the broker's code and message; unknown topics are not retried
(the admin asks about the cluster as it is).
"""

from __future__ import annotations

import asyncio
import enum
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple, Protocol, TypeVar

from riverbed.client.connection import BrokerConnection
from riverbed.client.lifecycle import AsyncClient
from riverbed.client.pool import BrokerPool, backoff_ms
from riverbed.client.settings import AdminSettings
from riverbed.client.types import TopicPartition
from riverbed.errors import (
    KafkaTimeoutError,
    LeadershipError,
    NetworkError,
    RequestTimedOutError,
    error_for,
)
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

T = TypeVar("T")

RESOURCE_TOPIC: Final = 2
# ListOffsets' special timestamps (Kafka's ListOffsetsRequest constants).
LATEST_TIMESTAMP: Final = -1
EARLIEST_TIMESTAMP: Final = -2
MAX_TIMESTAMP: Final = -3
OFFSET_SPECS: Final[Mapping[str, int]] = {
    "earliest": EARLIEST_TIMESTAMP,
    "latest": LATEST_TIMESTAMP,
    "max_timestamp": MAX_TIMESTAMP,
}
# ListOffsets from a client, not a follower replica.
CONSUMER_REPLICA_ID: Final = -1
READ_UNCOMMITTED: Final = 0
# IncrementalAlterConfigs' operations (Kafka's AlterConfigOp.OpType ids).
SET: Final = 0
DELETE: Final = 1
# What a retry can fix: the request reached the wrong broker, or the network failed.
RETRIABLE: Final = (
    LeadershipError,
    NetworkError,
    RequestTimedOutError,
    ConnectionError,
    TimeoutError,
)

OffsetSpec = Literal["earliest", "latest", "max_timestamp"] | int


class ConfigSource(enum.IntEnum):
    """Where a config's value comes from; the values are DescribeConfigs' wire ids."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    DYNAMIC_CLIENT_METRICS_CONFIG = 7
    DYNAMIC_GROUP_CONFIG = 8


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One config of a topic as DescribeConfigs reports it. `value` is None for a sensitive
    config (the broker never sends those) and for a config without a value."""

    name: str
    value: str | None
    source: ConfigSource
    read_only: bool
    sensitive: bool


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    """One partition of a described topic: its leader, epoch, replicas and in-sync replicas."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic's id, partitions (in order) and effective config values."""

    name: str
    topic_id: uuid.UUID
    partitions: tuple[PartitionDescription, ...]
    configs: dict[str, str | None] = field(default_factory=dict)


class OffsetAndTimestamp(NamedTuple):
    """A ListOffsets answer. Both are -1 when no record has a timestamp at or after the one
    asked for; `timestamp_ms` is -1 for "earliest" and "latest" (Kafka sends none)."""

    offset: int
    timestamp_ms: int


class Admin(AsyncClient):
    """Async context manager for cluster administration:

        async with Admin(bootstrap_servers="127.0.0.1:9092") as admin:
            await admin.create_topic("orders", partitions=3)

    Settings are keyword arguments with Kafka's names (dots as underscores), checked here:
    `client_id`, `request_timeout_ms`, `retry_backoff_ms`, `retry_backoff_max_ms`,
    `metadata_max_age_ms`, `socket_connection_setup_timeout_ms`.
    """

    def __init__(self, *, bootstrap_servers: str | Sequence[str], **settings: object) -> None:
        self.settings: AdminSettings = AdminSettings.from_kwargs(
            {"bootstrap_servers": bootstrap_servers, **settings}
        )
        # An admin asks about topics; it never creates one by looking.
        self._pool = BrokerPool(self.settings, allow_auto_topic_creation=False)
        self._answered = False  # whether any request of this admin got a response

    async def close(self) -> None:
        """Close every connection. Idempotent."""
        await self._pool.close()

    # -- topics ---------------------------------------------------------------------------
    async def create_topic(
        self,
        name: str,
        *,
        partitions: int = -1,
        replication_factor: int = -1,
        configs: Mapping[str, str] | None = None,
    ) -> uuid.UUID:
        """Create a topic (-1: the broker's num.partitions / default.replication.factor) and
        return its id once the controller has it. TopicAlreadyExistsError if it exists."""
        request = m.CreateTopicsRequest(
            topics=[
                m.CreateTopicsRequest.CreatableTopic(
                    name=name,
                    num_partitions=partitions,
                    replication_factor=replication_factor,
                    configs=[
                        m.CreateTopicsRequest.CreatableTopicConfig(name=key, value=value)
                        for key, value in (configs or {}).items()
                    ],
                )
            ],
            timeout_ms=self.settings.request_timeout_ms,
        )

        async def attempt() -> m.CreateTopicsResponse.CreatableTopicResult:
            response = await self._call_controller(request, m.CreateTopicsResponse)
            return _retry_unless_controller(response.topics[0])

        result = await self._retrying(f"creating topic {name!r}", attempt)
        _raise_for(result.error_code, result.error_message)
        topic_id: uuid.UUID = result.topic_id
        return topic_id

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and its data. UnknownTopicOrPartitionError if there is none."""
        request = m.DeleteTopicsRequest(
            topics=[m.DeleteTopicsRequest.DeleteTopicState(name=name)],
            topic_names=[name],
            timeout_ms=self.settings.request_timeout_ms,
        )

        async def attempt() -> m.DeleteTopicsResponse.DeletableTopicResult:
            response = await self._call_controller(request, m.DeleteTopicsResponse)
            return _retry_unless_controller(response.responses[0])

        result = await self._retrying(f"deleting topic {name!r}", attempt)
        self._pool.cluster.forget([name])
        _raise_for(result.error_code, result.error_message)

    async def list_topics(self) -> list[str]:
        """The names of every topic in the cluster, sorted."""
        metadata = await self._metadata(None)
        return sorted(t.name for t in metadata.topics if t.name is not None)

    async def describe_topic(self, name: str) -> TopicDescription:
        """The topic's id, partitions and effective configs."""
        metadata = await self._metadata([name])
        topic = metadata.topics[0]
        _raise_for(topic.error_code, f"topic {name!r}")
        configs = await self.describe_configs(name)
        return TopicDescription(
            name=name,
            topic_id=topic.topic_id,
            partitions=tuple(
                PartitionDescription(
                    partition=p.partition_index,
                    leader=p.leader_id,
                    leader_epoch=p.leader_epoch,
                    replicas=tuple(p.replica_nodes),
                    isr=tuple(p.isr_nodes),
                )
                for p in sorted(topic.partitions, key=lambda p: p.partition_index)
            ),
            configs={key: entry.value for key, entry in configs.items()},
        )

    # -- topic configs --------------------------------------------------------------------
    async def describe_configs(self, topic: str) -> dict[str, ConfigEntry]:
        """Every config of `topic` by name: its effective value and where that comes from."""
        request = m.DescribeConfigsRequest(
            resources=[
                m.DescribeConfigsRequest.DescribeConfigsResource(
                    resource_type=RESOURCE_TOPIC, resource_name=topic, configuration_keys=None
                )
            ]
        )
        response = await self._retrying(
            f"describing the configs of {topic!r}",
            lambda: self._call_any(request, m.DescribeConfigsResponse),
        )
        result = response.results[0]
        _raise_for(result.error_code, result.error_message)
        return {
            c.name: ConfigEntry(
                name=c.name,
                value=c.value,
                source=_config_source(c.config_source),
                read_only=c.read_only,
                sensitive=c.is_sensitive,
            )
            for c in result.configs
        }

    async def alter_configs(
        self,
        topic: str,
        *,
        set: Mapping[str, str] | None = None,  # Kafka's name for the operation
        delete: Collection[str] = (),
        validate_only: bool = False,
    ) -> None:
        """Change some of `topic`'s config overrides, leaving the others as they are: `set`
        overrides keys, `delete` removes overrides (the key goes back to its broker or built-in
        default). With `validate_only` the broker checks the change and applies nothing.
        ConfigError (INVALID_CONFIG, naming the key) for an unknown key or a bad value."""
        to_set = dict(set or {})
        both = sorted(to_set.keys() & frozenset(delete))
        if both:
            raise ValueError(f"config keys in both set and delete: {', '.join(both)}")
        Config = m.IncrementalAlterConfigsRequest.AlterableConfig
        request = m.IncrementalAlterConfigsRequest(
            resources=[
                m.IncrementalAlterConfigsRequest.AlterConfigsResource(
                    resource_type=RESOURCE_TOPIC,
                    resource_name=topic,
                    configs=[
                        *(Config(name=k, config_operation=SET, value=v) for k, v in to_set.items()),
                        *(Config(name=k, config_operation=DELETE, value=None) for k in delete),
                    ],
                )
            ],
            validate_only=validate_only,
        )
        response = await self._retrying(
            f"altering the configs of {topic!r}",
            lambda: self._call_any(request, m.IncrementalAlterConfigsResponse),
        )
        result = response.responses[0]
        _raise_for(result.error_code, result.error_message)

    # -- offsets --------------------------------------------------------------------------
    async def list_offsets(
        self, specs: Mapping[TopicPartition, OffsetSpec]
    ) -> dict[TopicPartition, OffsetAndTimestamp]:
        """For each partition, the offset of "earliest" (the log start), "latest" (the high
        watermark), "max_timestamp" (the record with the largest timestamp) or, for an int
        timestamp in ms, the first record at or after it. Asks each partition's leader."""
        timestamps = {tp: _timestamp_of(tp, spec) for tp, spec in specs.items()}
        found: dict[TopicPartition, OffsetAndTimestamp] = {}

        async def attempt() -> None:
            missing = {tp: ts for tp, ts in timestamps.items() if tp not in found}
            by_leader: dict[BrokerConnection, dict[TopicPartition, int]] = {}
            for tp, timestamp in missing.items():
                connection = await self._pool.leader_connection(tp)
                by_leader.setdefault(connection, {})[tp] = timestamp
            answers = await asyncio.gather(
                *(self._list_offsets_at(c, wanted) for c, wanted in by_leader.items()),
                return_exceptions=True,
            )
            errors = [a for a in answers if isinstance(a, BaseException)]
            for answer in answers:
                if not isinstance(answer, BaseException):
                    found.update(answer)
            if errors:
                raise errors[0]

        await self._retrying("listing offsets", attempt)
        return {tp: found[tp] for tp in specs}

    async def _list_offsets_at(
        self, connection: BrokerConnection, wanted: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp]:
        """One ListOffsets request to one leader. Partitions it answered with an error are left
        out and the first error is raised after the others are collected."""
        topics: dict[str, list[m.ListOffsetsRequest.ListOffsetsPartition]] = {}
        for tp, timestamp in wanted.items():
            topics.setdefault(tp.topic, []).append(
                m.ListOffsetsRequest.ListOffsetsPartition(
                    partition_index=tp.partition,
                    current_leader_epoch=self._pool.cluster.leader_epoch(tp),
                    timestamp=timestamp,
                )
            )
        request = m.ListOffsetsRequest(
            replica_id=CONSUMER_REPLICA_ID,
            isolation_level=READ_UNCOMMITTED,
            topics=[
                m.ListOffsetsRequest.ListOffsetsTopic(name=name, partitions=partitions)
                for name, partitions in topics.items()
            ],
        )
        response = await connection.call(
            request, m.ListOffsetsResponse, timeout_ms=self.settings.request_timeout_ms
        )
        answered: dict[TopicPartition, OffsetAndTimestamp] = {}
        first_error: Exception | None = None
        for topic in response.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition_index)
                if p.error_code == ErrorCode.NONE:
                    answered[tp] = OffsetAndTimestamp(p.offset, p.timestamp)
                elif first_error is None:
                    first_error = error_for(p.error_code, f"{tp.topic}-{tp.partition}")
        if first_error is not None:
            if isinstance(first_error, RETRIABLE):
                self._pool.cluster.mark_stale(f"ListOffsets: {first_error}")
            raise first_error
        return answered

    # -- routing and retries --------------------------------------------------------------
    async def _metadata(self, topics: list[str] | None) -> m.MetadataResponse:
        """Metadata of `topics` (None: all), folded into the pool's cluster state too."""
        request = m.MetadataRequest(
            topics=None
            if topics is None
            else [m.MetadataRequest.MetadataRequestTopic(name=name) for name in topics],
            allow_auto_topic_creation=False,
        )
        response = await self._retrying(
            "fetching metadata", lambda: self._call_any(request, m.MetadataResponse)
        )
        self._pool.cluster.update(response)
        return response

    async def _call_any(self, request: m.RequestBody, response_type: type[T]) -> T:
        connection = await self._pool.any_connection()
        return await connection.call(
            request, response_type, timeout_ms=self.settings.request_timeout_ms
        )

    async def _call_controller(self, request: m.RequestBody, response_type: type[T]) -> T:
        cluster = self._pool.cluster
        if cluster.stale or cluster.broker(cluster.controller_id) is None:
            await self._pool.refresh()
        if cluster.broker(cluster.controller_id) is None:
            raise error_for(ErrorCode.NOT_CONTROLLER, "the cluster has no controller right now")
        connection = await self._pool.connection_for(cluster.controller_id)
        return await connection.call(
            request, response_type, timeout_ms=self.settings.request_timeout_ms
        )

    async def _retrying(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()`, again after a backoff while it fails with a RETRIABLE error, for at most
        request_timeout_ms; then KafkaTimeoutError with the last failure as its cause. Until
        some request has been answered, connection failures are raised at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.request_timeout_ms / 1000
        failures = 0
        while True:
            try:
                result = await attempt()
            except RETRIABLE as error:
                if not self._answered and isinstance(error, ConnectionError | TimeoutError):
                    # No broker ever answered: most likely a wrong address, so say so at once
                    # rather than after request_timeout_ms (as kafka-python's NoBrokersAvailable).
                    raise
                failures += 1
                self._pool.cluster.mark_stale(f"{what}: {error}")
                wait_ms = backoff_ms(
                    failures, self.settings.retry_backoff_ms, self.settings.retry_backoff_max_ms
                )
                if loop.time() + wait_ms / 1000 >= deadline:
                    raise KafkaTimeoutError(
                        f"{what} did not succeed within request_timeout_ms="
                        f"{self.settings.request_timeout_ms} (last error: {error})"
                    ) from error
                await asyncio.sleep(wait_ms / 1000)
            else:
                self._answered = True
                return result


class _TopicResult(Protocol):
    error_code: int


_Result = TypeVar("_Result", bound=_TopicResult)


def _retry_unless_controller(result: _Result) -> _Result:
    """Raise NOT_CONTROLLER (retried at the new controller); other errors are the caller's."""
    if result.error_code == ErrorCode.NOT_CONTROLLER:
        raise error_for(ErrorCode.NOT_CONTROLLER, "the controller moved")
    return result


def _timestamp_of(tp: TopicPartition, spec: OffsetSpec) -> int:
    if isinstance(spec, str) and spec in OFFSET_SPECS:
        return OFFSET_SPECS[spec]
    if isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
        return spec
    raise ValueError(
        f"offset spec for {tp.topic}-{tp.partition} must be one of "
        f"{', '.join(OFFSET_SPECS)} or a timestamp in ms >= 0, got {spec!r}"
    )


def _config_source(wire_id: int) -> ConfigSource:
    try:
        return ConfigSource(wire_id)
    except ValueError:  # a source newer than this client
        return ConfigSource.UNKNOWN


def _raise_for(error_code: int, message: str | None) -> None:
    if error_code != ErrorCode.NONE:
        raise error_for(error_code, message)
