"""The admin client: topics, topic configs, partition offsets, consumer groups and ACLs.

Requests go where Kafka's admin clients send them: topic creation and deletion and added
partitions to the controller, ListOffsets to each partition's leader, a group's requests
(DescribeGroups, OffsetFetch, OffsetCommit, DeleteGroups) to its coordinator as FindCoordinator
names it, ListGroups to every broker (each lists the groups it coordinates), everything else
(Metadata, DescribeConfigs, IncrementalAlterConfigs of topics, the ACL requests) to any broker.
Connections and metadata come from the client's shared `BrokerPool`.

Each operation retries what a retry can fix (the controller, a leader or a group's coordinator
moved or is loading, a connection dropped) with the pool's exponential backoff, for at most
`request_timeout_ms` in all; before any broker has answered, a connection failure is raised at
once (a wrong bootstrap address should not look like a slow cluster). Every other error is
raised at once as its `riverbed.errors` class, carrying the broker's code and message; unknown
topics are not retried (the admin asks about the cluster as it is).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple, Protocol, TypeVar

from riverbed.client import acls as acl_wire
from riverbed.client.cluster_metadata import ClusterMetadata
from riverbed.client.connection import BrokerConnection
from riverbed.client.group.consumer_protocol import NO_GENERATION, PROTOCOL_TYPE, decode_assignment
from riverbed.client.lifecycle import AsyncClient
from riverbed.client.pool import BrokerPool
from riverbed.client.settings import AdminSettings
from riverbed.client.types import OffsetAndMetadata, TopicPartition
from riverbed.common.backoff import backoff_ms
from riverbed.errors import (
    CoordinatorError,
    KafkaError,
    KafkaStorageError,
    KafkaTimeoutError,
    LeadershipError,
    NetworkError,
    OffsetNotAvailableError,
    RequestTimedOutError,
    error_for,
)
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.security.acl import ANY_BINDING, AclBinding, AclBindingFilter, binding_order

T = TypeVar("T")
V = TypeVar("V")

RESOURCE_TOPIC: Final = 2
RESOURCE_BROKER: Final = 4
# ListOffsets' special timestamps (Kafka's ListOffsetsRequest constants).
LATEST_TIMESTAMP: Final = -1
EARLIEST_TIMESTAMP: Final = -2
MAX_TIMESTAMP: Final = -3
EARLIEST_LOCAL_TIMESTAMP: Final = -4  # KIP-405, ListOffsets v8
LATEST_TIERED_TIMESTAMP: Final = -5  # KIP-1005, ListOffsets v9
OFFSET_SPECS: Final[Mapping[str, int]] = {
    "earliest": EARLIEST_TIMESTAMP,
    "latest": LATEST_TIMESTAMP,
    "max_timestamp": MAX_TIMESTAMP,
    "earliest_local": EARLIEST_LOCAL_TIMESTAMP,
    "latest_tiered": LATEST_TIERED_TIMESTAMP,
}
# ListOffsets from a client, not a follower replica.
CONSUMER_REPLICA_ID: Final = -1
READ_UNCOMMITTED: Final = 0
READ_COMMITTED: Final = 1
# IncrementalAlterConfigs' operations (Kafka's AlterConfigOp.OpType ids).
SET: Final = 0
DELETE: Final = 1
# What a retry can fix: the request reached the wrong broker, or the network failed.
RETRIABLE: Final = (
    LeadershipError,
    KafkaStorageError,  # a disk, or the remote tier, unreadable for now (Kafka retries it too)
    NetworkError,
    RequestTimedOutError,
    ConnectionError,
    TimeoutError,
)
# ListOffsets also retries OFFSET_NOT_AVAILABLE: a new leader whose high watermark has not yet
# reached the start of its epoch (KIP-207) answers it until its followers catch up, briefly.
LIST_OFFSETS_RETRIABLE: Final = (*RETRIABLE, OffsetNotAvailableError)
# A group's requests also retry a coordinator that moved, is not up yet or is loading its groups.
GROUP_RETRIABLE: Final = (*RETRIABLE, CoordinatorError)
# OffsetFetch requiring stable offsets also retries UNSTABLE_OFFSET_COMMIT (an
# OffsetNotAvailableError): a transaction holds the offset pending until its markers are written.
STABLE_OFFSETS_RETRIABLE: Final = (*GROUP_RETRIABLE, OffsetNotAvailableError)
# FindCoordinator's key type for a group id (1 is a transactional id).
GROUP_KEY_TYPE: Final = 0
# First versions answering in the batched shape (KIP-699, KIP-709) and filtering by state (KIP-518).
FIND_COORDINATOR_BATCHED_VERSION: Final = 4
OFFSET_FETCH_BATCHED_VERSION: Final = 8
LIST_GROUPS_STATES_VERSION: Final = 4
# An OffsetCommit from outside the group, as Kafka's admin sends it: no generation, no member.
NO_MEMBER_ID: Final = ""
# OffsetCommit v2-4's retention time: -1 leaves it to the broker's offsets.retention.minutes.
BROKER_RETENTION: Final = -1
NO_LEADER_EPOCH: Final = -1
# What a group error means when the request came from outside the group (the admin's only kind).
GROUP_ERROR_REASONS: Final[Mapping[ErrorCode, str]] = {
    ErrorCode.GROUP_ID_NOT_FOUND: "the group does not exist",
    ErrorCode.NON_EMPTY_GROUP: "the group has active members",
    ErrorCode.UNKNOWN_MEMBER_ID: "the group has active members (its offsets can be altered only "
    "while it is empty)",
    ErrorCode.REBALANCE_IN_PROGRESS: "the group is rebalancing (its offsets can be altered only "
    "while it is empty)",
}

OffsetSpec = Literal["earliest", "latest", "max_timestamp", "earliest_local", "latest_tiered"] | int


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
    """A topic's id, partitions (in order), effective config values and where each value comes
    from (`config_sources`: the topic's override, the broker, or the default)."""

    name: str
    topic_id: uuid.UUID
    partitions: tuple[PartitionDescription, ...]
    configs: dict[str, str | None] = field(default_factory=dict)
    config_sources: dict[str, ConfigSource] = field(default_factory=dict)


class OffsetAndTimestamp(NamedTuple):
    """A ListOffsets answer. Both are -1 when no record has a timestamp at or after the one
    asked for; `timestamp_ms` is -1 for "earliest" and "latest" (Kafka sends none)."""

    offset: int
    timestamp_ms: int


class GroupState(enum.StrEnum):
    """A group's state as its coordinator reports it (Kafka's classic group states, with their
    wire names); UNKNOWN for a state this client does not know."""

    UNKNOWN = "Unknown"
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    @classmethod
    def parse(cls, name: str) -> GroupState:
        """The state called `name`, ignoring case (as Kafka's ConsumerGroupState.parse)."""
        for state in cls:
            if state.value.lower() == name.lower():
                return state
        return cls.UNKNOWN


@dataclass(frozen=True, slots=True)
class GroupListing:
    """One group as ListGroups reports it. `protocol_type` is "consumer" for consumer groups and
    "" for a group that only holds offsets committed from outside it."""

    group_id: str
    protocol_type: str
    state: GroupState


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """One member of a described group. `assignment` is decoded for consumer groups (protocol
    type "consumer"; empty until the member's first assignment) and None for other protocols,
    whose assignment bytes this client cannot read."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    assignment: tuple[TopicPartition, ...] | None


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A group's state, protocol and members, from its coordinator (broker id `coordinator`).

    `protocol` is the assignor the members agreed on (e.g. "range"; Kafka fills it only while
    the group is Stable). A group the coordinator does not know is DEAD with no members, as
    Kafka's coordinator describes it."""

    group_id: str
    state: GroupState
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...]
    coordinator: int


@dataclass(frozen=True, slots=True)
class BrokerDescription:
    node_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    """The cluster as Metadata shows it: its brokers, controller and every partition."""

    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerDescription, ...]
    partitions: dict[TopicPartition, PartitionDescription]

    def under_replicated(self) -> list[TopicPartition]:
        return sorted(tp for tp, p in self.partitions.items() if len(p.isr) < len(p.replicas))

    def offline(self) -> list[TopicPartition]:
        return sorted(tp for tp, p in self.partitions.items() if p.leader < 0)


@dataclass(frozen=True, slots=True)
class ReplicaLogDir:
    """One replica in a broker's data directory (DescribeLogDirs). The cold-tier sizes are
    Riverbed's: known for partitions the broker leads on tiered topics, else -1."""

    size_bytes: int
    offset_lag: int
    remote_size_bytes: int = -1
    tiering_backlog_bytes: int = -1


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    path: str
    error: KafkaError | None
    total_bytes: int  # -1: unknown
    usable_bytes: int
    replicas: dict[TopicPartition, ReplicaLogDir]


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """A reassignment in progress: the full replica set (target replicas first) and what moves."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]

    @property
    def target_replicas(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing_replicas)


# Per partition of a reassignment or election: None where it succeeded, else the error.
PartitionErrors = dict[TopicPartition, KafkaError | None]
# KIP-460's election types.
ELECTION_TYPES: Final[Mapping[str, int]] = {"preferred": 0, "unclean": 1}


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
        # Group id -> node id of its coordinator, kept until a request there fails.
        self._coordinators: dict[str, int] = {}

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

    async def create_partitions(
        self,
        name: str,
        *,
        partitions: int,
        replicas: Sequence[Sequence[int]] | None = None,
        validate_only: bool = False,
    ) -> None:
        """Add partitions to a topic, up to `partitions` in all; return once the controller
        knows their leaders. `replicas` gives each new partition's brokers (preferred leader
        first; as many replicas as the topic's partition 0 has), else the controller places
        them. With `validate_only` the controller checks and adds nothing. TopicError
        (INVALID_PARTITIONS) unless `partitions` is more than the topic has,
        UnknownTopicOrPartitionError if there is no such topic."""
        request = m.CreatePartitionsRequest(
            topics=[
                m.CreatePartitionsRequest.CreatePartitionsTopic(
                    name=name,
                    count=partitions,
                    assignments=None
                    if replicas is None
                    else [
                        m.CreatePartitionsRequest.CreatePartitionsAssignment(list(brokers))
                        for brokers in replicas
                    ],
                )
            ],
            timeout_ms=self.settings.request_timeout_ms,
            validate_only=validate_only,
        )

        async def attempt() -> m.CreatePartitionsResponse.CreatePartitionsTopicResult:
            response = await self._call_controller(request, m.CreatePartitionsResponse)
            return _retry_unless_controller(response.results[0])

        result = await self._retrying(f"adding partitions to topic {name!r}", attempt)
        if not validate_only:
            self._pool.cluster.mark_stale(f"partitions added to {name!r}")
        _raise_for(result.error_code, result.error_message)

    async def list_topics(self) -> list[str]:
        """The names of every topic in the cluster, sorted."""
        metadata = await self._metadata(None)
        return sorted(t.name for t in metadata.topics if t.name is not None)

    async def topic_partitions(self, name: str) -> list[TopicPartition]:
        """The topic's partitions, from Metadata alone (DESCRIBE on the topic is enough).
        Raises the topic's error: UnknownTopicOrPartitionError, AuthorizationError, ..."""
        metadata = await self._metadata([name])
        topic = metadata.topics[0]
        _raise_for(topic.error_code, f"topic {name!r}")
        return sorted(TopicPartition(name, p.partition_index) for p in topic.partitions)

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
            config_sources={key: entry.source for key, entry in configs.items()},
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
        await self._incremental_alter(
            RESOURCE_TOPIC, topic, set or {}, delete, validate_only, f"the configs of {topic!r}"
        )

    async def alter_broker_configs(
        self,
        *,
        set: Mapping[str, str] | None = None,  # Kafka's name for the operation
        delete: Collection[str] = (),
        validate_only: bool = False,
    ) -> None:
        """Change the cluster-wide dynamic broker configs (Kafka's default broker entity), e.g.
        `follower.replication.throttled.rate`; as `alter_configs` does a topic's."""
        await self._incremental_alter(
            RESOURCE_BROKER, "", set or {}, delete, validate_only, "the dynamic broker configs"
        )

    async def _incremental_alter(
        self,
        resource_type: int,
        name: str,
        to_set: Mapping[str, str],
        delete: Collection[str],
        validate_only: bool,
        what: str,
    ) -> None:
        both = sorted(to_set.keys() & frozenset(delete))
        if both:
            raise ValueError(f"config keys in both set and delete: {', '.join(both)}")
        Config = m.IncrementalAlterConfigsRequest.AlterableConfig
        request = m.IncrementalAlterConfigsRequest(
            resources=[
                m.IncrementalAlterConfigsRequest.AlterConfigsResource(
                    resource_type=resource_type,
                    resource_name=name,
                    configs=[
                        *(Config(name=k, config_operation=SET, value=v) for k, v in to_set.items()),
                        *(Config(name=k, config_operation=DELETE, value=None) for k in delete),
                    ],
                )
            ],
            validate_only=validate_only,
        )
        response = await self._retrying(
            f"altering {what}", lambda: self._call_any(request, m.IncrementalAlterConfigsResponse)
        )
        result = response.responses[0]
        _raise_for(result.error_code, result.error_message)

    # -- offsets --------------------------------------------------------------------------
    async def list_offsets(
        self,
        specs: Mapping[TopicPartition, OffsetSpec],
        *,
        isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted",
    ) -> dict[TopicPartition, OffsetAndTimestamp]:
        """For each partition, the offset of "earliest" (the log start), "latest" (the high
        watermark), "max_timestamp" (the record with the largest timestamp), "earliest_local"
        (the start of the leader's local log, KIP-405), "latest_tiered" (the last offset in the
        cold tier, -1 if none, KIP-1005) or, for an int timestamp in ms, the first record at or
        after it. Asks each partition's leader; OFFSET_NOT_AVAILABLE (a new leader still
        catching up, KIP-207) is retried like a moved leader, up to request_timeout_ms. At
        `isolation_level="read_committed"` (Kafka's ListOffsetsOptions) "latest" is the last
        stable offset, and timestamps find only records below it."""
        timestamps = {tp: _timestamp_of(tp, spec) for tp, spec in specs.items()}
        code = READ_COMMITTED if isolation_level == "read_committed" else READ_UNCOMMITTED
        return await self._at_leaders(
            "listing offsets",
            timestamps,
            functools.partial(self._list_offsets_at, isolation_level=code),
            LIST_OFFSETS_RETRIABLE,
        )

    async def delete_records(
        self, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Delete every record below `offsets[tp]` (-1: below the high watermark) by moving
        each partition's log start there (DeleteRecords), from both tiers; returns each
        partition's low watermark, its new log start on every in-sync replica. Raises
        OffsetOutOfRangeError past the high watermark, ConfigError (POLICY_VIOLATION) on a
        topic whose cleanup.policy has no 'delete'."""
        return await self._at_leaders("deleting records", offsets, self._delete_records_at)

    async def _at_leaders(
        self,
        what: str,
        wanted: Mapping[TopicPartition, V],
        call: Callable[
            [BrokerConnection, dict[TopicPartition, V]], Awaitable[dict[TopicPartition, T]]
        ],
        retriable: tuple[type[BaseException], ...] = RETRIABLE,
    ) -> dict[TopicPartition, T]:
        """`call(connection, partitions)` at each partition's leader at once, again (after a
        metadata refresh) for the partitions that failed retriably."""
        found: dict[TopicPartition, T] = {}

        async def attempt() -> None:
            by_leader: dict[BrokerConnection, dict[TopicPartition, V]] = {}
            for tp, value in wanted.items():
                if tp not in found:
                    connection = await self._pool.leader_connection(tp)
                    by_leader.setdefault(connection, {})[tp] = value
            answers = await asyncio.gather(
                *(call(c, partitions) for c, partitions in by_leader.items()),
                return_exceptions=True,
            )
            errors = [a for a in answers if isinstance(a, BaseException)]
            for answer in answers:
                if not isinstance(answer, BaseException):
                    found.update(answer)
            if errors:
                raise errors[0]

        await self._retrying(what, attempt, retriable)
        return {tp: found[tp] for tp in wanted}

    async def _delete_records_at(
        self, connection: BrokerConnection, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """One DeleteRecords request to one leader; errors as in `_list_offsets_at`."""
        request = m.DeleteRecordsRequest(
            topics=[
                m.DeleteRecordsRequest.DeleteRecordsTopic(
                    name=topic,
                    partitions=[
                        m.DeleteRecordsRequest.DeleteRecordsPartition(
                            partition_index=index, offset=offsets[TopicPartition(topic, index)]
                        )
                        for index in indexes
                    ],
                )
                for topic, indexes in _partitions_by_topic(offsets)
            ],
            timeout_ms=self.settings.request_timeout_ms,
        )
        response = await connection.call(
            request, m.DeleteRecordsResponse, timeout_ms=2 * self.settings.request_timeout_ms
        )
        return _answered_or_raise(
            self._pool.cluster,
            "DeleteRecords",
            (
                (TopicPartition(topic.name, p.partition_index), p.error_code, p.low_watermark)
                for topic in response.topics
                for p in topic.partitions
            ),
        )

    async def _list_offsets_at(
        self,
        connection: BrokerConnection,
        wanted: Mapping[TopicPartition, int],
        *,
        isolation_level: int,
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
            isolation_level=isolation_level,
            topics=[
                m.ListOffsetsRequest.ListOffsetsTopic(name=name, partitions=partitions)
                for name, partitions in topics.items()
            ],
        )
        response = await connection.call(
            request, m.ListOffsetsResponse, timeout_ms=self.settings.request_timeout_ms
        )
        return _answered_or_raise(
            self._pool.cluster,
            "ListOffsets",
            (
                (
                    TopicPartition(topic.name, p.partition_index),
                    p.error_code,
                    OffsetAndTimestamp(p.offset, p.timestamp),
                )
                for topic in response.topics
                for p in topic.partitions
            ),
        )

    # -- consumer groups ------------------------------------------------------------------
    async def describe_cluster(self) -> ClusterDescription:
        """Brokers, controller and every partition's leader, replicas and ISR (Metadata)."""
        metadata = await self._metadata(None)
        partitions = {
            TopicPartition(t.name, p.partition_index): PartitionDescription(
                partition=p.partition_index,
                leader=p.leader_id,
                leader_epoch=p.leader_epoch,
                replicas=tuple(p.replica_nodes),
                isr=tuple(p.isr_nodes),
            )
            for t in metadata.topics
            if t.name is not None
            for p in t.partitions
        }
        return ClusterDescription(
            cluster_id=metadata.cluster_id,
            controller_id=metadata.controller_id,
            brokers=tuple(
                BrokerDescription(b.node_id, b.host, b.port, b.rack)
                for b in sorted(metadata.brokers, key=lambda b: b.node_id)
            ),
            partitions=dict(sorted(partitions.items())),
        )

    async def describe_log_dirs(
        self, topics: Collection[str] | None = None, brokers: Collection[int] | None = None
    ) -> dict[int, list[LogDirDescription]]:
        """Each broker's data directories and the replicas in them (of `topics`, or all)."""
        cluster = await self.describe_cluster()
        targets = sorted(brokers) if brokers is not None else [b.node_id for b in cluster.brokers]
        wanted = None
        if topics is not None:
            wanted = [
                m.DescribeLogDirsRequest.DescribableLogDirTopic(
                    topic=topic,
                    partitions=[tp.partition for tp in cluster.partitions if tp.topic == topic],
                )
                for topic in sorted(topics)
            ]
        request = m.DescribeLogDirsRequest(topics=wanted)

        async def at(node_id: int) -> list[LogDirDescription]:
            async def attempt() -> m.DescribeLogDirsResponse:
                connection = await self._pool.connection_for(node_id)
                return await connection.call(
                    request, m.DescribeLogDirsResponse, timeout_ms=self.settings.request_timeout_ms
                )

            response = await self._retrying(f"describing the log dirs of broker {node_id}", attempt)
            _raise_for(response.error_code, f"broker {node_id}")
            return [_log_dir(result) for result in response.results]

        answers = await asyncio.gather(*(at(node_id) for node_id in targets))
        return dict(zip(targets, answers, strict=True))

    async def alter_partition_reassignments(
        self, moves: Mapping[TopicPartition, Sequence[int] | None]
    ) -> PartitionErrors:
        """Start moving each partition to its target replicas (None cancels its move). Returns
        once the controller has written the moves; `list_partition_reassignments` shows them
        until they finish."""
        request = m.AlterPartitionReassignmentsRequest(
            timeout_ms=self.settings.request_timeout_ms,
            topics=[
                m.AlterPartitionReassignmentsRequest.ReassignableTopic(
                    name=topic,
                    partitions=[
                        m.AlterPartitionReassignmentsRequest.ReassignablePartition(
                            partition_index=index,
                            replicas=None if moves[tp] is None else list(moves[tp] or ()),
                        )
                        for tp, index in ((TopicPartition(topic, i), i) for i in indexes)
                    ],
                )
                for topic, indexes in _partitions_by_topic(moves)
            ],
        )

        async def attempt() -> m.AlterPartitionReassignmentsResponse:
            response = await self._call_controller(request, m.AlterPartitionReassignmentsResponse)
            return _retry_unless_controller(response)

        response = await self._retrying("reassigning partitions", attempt)
        _raise_for(response.error_code, response.error_message)
        return {
            TopicPartition(topic.name, p.partition_index): _error_or_none(
                p.error_code, p.error_message
            )
            for topic in response.responses
            for p in topic.partitions
        }

    async def list_partition_reassignments(
        self, partitions: Collection[TopicPartition] | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        """The reassignments in progress (of `partitions`, or all)."""
        request = m.ListPartitionReassignmentsRequest(
            timeout_ms=self.settings.request_timeout_ms,
            topics=None
            if partitions is None
            else [
                m.ListPartitionReassignmentsRequest.ListPartitionReassignmentsTopics(
                    name=topic, partition_indexes=indexes
                )
                for topic, indexes in _partitions_by_topic(partitions)
            ],
        )

        async def attempt() -> m.ListPartitionReassignmentsResponse:
            response = await self._call_controller(request, m.ListPartitionReassignmentsResponse)
            return _retry_unless_controller(response)

        response = await self._retrying("listing reassignments", attempt)
        _raise_for(response.error_code, response.error_message)
        return {
            TopicPartition(topic.name, p.partition_index): PartitionReassignment(
                tuple(p.replicas), tuple(p.adding_replicas), tuple(p.removing_replicas)
            )
            for topic in response.topics
            for p in topic.partitions
        }

    async def elect_leaders(
        self,
        partitions: Collection[TopicPartition] | None = None,
        *,
        election: Literal["preferred", "unclean"] = "preferred",
    ) -> PartitionErrors:
        """Elect leaders for `partitions` (None: every partition): the preferred (first)
        replica, or with "unclean" any live replica where none leads. A partition that needs no
        election reports an error with code ELECTION_NOT_NEEDED."""
        if election not in ELECTION_TYPES:
            raise ValueError(f"election must be one of {', '.join(ELECTION_TYPES)}")
        request = m.ElectLeadersRequest(
            election_type=ELECTION_TYPES[election],
            topic_partitions=None
            if partitions is None
            else [
                m.ElectLeadersRequest.TopicPartitions(topic=topic, partition_id=indexes)
                for topic, indexes in _partitions_by_topic(partitions)
            ],
            timeout_ms=self.settings.request_timeout_ms,
        )

        async def attempt() -> m.ElectLeadersResponse:
            response = await self._call_controller(request, m.ElectLeadersResponse)
            return _retry_unless_controller(response)

        response = await self._retrying("electing leaders", attempt)
        _raise_for(response.error_code, None)
        return {
            TopicPartition(topic.topic, p.partition_id): _error_or_none(
                p.error_code, p.error_message
            )
            for topic in response.replica_election_results
            for p in topic.partition_result
        }

    async def list_groups(self, states: Collection[GroupState] | None = None) -> list[GroupListing]:
        """Every group in the cluster, sorted by id (each broker lists the groups it
        coordinates, so every broker is asked); with `states`, only groups in one of them."""
        request = m.ListGroupsRequest(states_filter=sorted(state.value for state in states or ()))
        listed: dict[int, list[GroupListing]] = {}  # by the broker that answered

        async def attempt() -> None:
            await self._pool.refresh()
            missing = [node_id for node_id in self._pool.cluster.brokers if node_id not in listed]
            answers = await asyncio.gather(
                *(self._list_groups_at(node_id, request) for node_id in missing),
                return_exceptions=True,
            )
            for node_id, answer in zip(missing, answers, strict=True):
                if not isinstance(answer, BaseException):
                    listed[node_id] = answer
            errors = [answer for answer in answers if isinstance(answer, BaseException)]
            if errors:
                raise errors[0]

        await self._retrying("listing groups", attempt, GROUP_RETRIABLE)
        groups = {group.group_id: group for answer in listed.values() for group in answer}
        return [groups[group_id] for group_id in sorted(groups)]

    async def _list_groups_at(
        self, node_id: int, request: m.ListGroupsRequest
    ) -> list[GroupListing]:
        connection = await self._pool.connection_for(node_id)
        version = connection.version_for(m.ListGroupsRequest.API_KEY)
        if request.states_filter and version < LIST_GROUPS_STATES_VERSION:
            raise error_for(
                ErrorCode.UNSUPPORTED_VERSION,
                f"broker {node_id} cannot list groups by state (ListGroups v{version})",
            )
        response = await connection.call(
            request, m.ListGroupsResponse, timeout_ms=self.settings.request_timeout_ms
        )
        _raise_for(response.error_code, f"listing the groups of broker {node_id}")
        return [
            GroupListing(g.group_id, g.protocol_type, GroupState.parse(g.group_state))
            for g in response.groups
        ]

    async def describe_groups(self, group_ids: Collection[str]) -> dict[str, GroupDescription]:
        """State, protocol and members of each group, by id (see GroupDescription)."""
        ids = list(dict.fromkeys(group_ids))
        return dict(zip(ids, await _each(ids, self._describe_group), strict=True))

    async def _describe_group(self, group_id: str) -> GroupDescription:
        request = m.DescribeGroupsRequest(groups=[group_id])

        async def attempt(connection: BrokerConnection, node_id: int) -> GroupDescription:
            response = await connection.call(
                request, m.DescribeGroupsResponse, timeout_ms=self.settings.request_timeout_ms
            )
            (group,) = response.groups
            _raise_for_group(group.error_code, group_id, "describing")
            return _group_description(group, node_id)

        return await self._at_coordinator(group_id, f"describing group {group_id!r}", attempt)

    async def list_group_offsets(
        self,
        group_id: str,
        partitions: Collection[TopicPartition] | None = None,
        *,
        require_stable: bool = False,
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets in `partitions`, or (None) in every partition it has
        committed, sorted by partition. Partitions without a committed offset are left out.
        With `require_stable` (Kafka's ListConsumerGroupOffsetsOptions.requireStable, KIP-447)
        an offset that a transaction still holds pending is waited for (UNSTABLE_OFFSET_COMMIT
        is retried, up to request_timeout_ms) rather than answered with the last one before."""
        by_topic = None if partitions is None else _partitions_by_topic(partitions)
        Fetch = m.OffsetFetchRequest
        request = Fetch(
            group_id=group_id,
            topics=None
            if by_topic is None
            else [
                Fetch.OffsetFetchRequestTopic(name=t, partition_indexes=ps) for t, ps in by_topic
            ],
            groups=[
                Fetch.OffsetFetchRequestGroup(
                    group_id=group_id,
                    topics=None
                    if by_topic is None
                    else [
                        Fetch.OffsetFetchRequestTopics(name=t, partition_indexes=ps)
                        for t, ps in by_topic
                    ],
                )
            ],
            require_stable=require_stable,
        )

        async def attempt(
            connection: BrokerConnection, node_id: int
        ) -> dict[TopicPartition, OffsetAndMetadata]:
            response = await connection.call(
                request, m.OffsetFetchResponse, timeout_ms=self.settings.request_timeout_ms
            )
            if connection.version_for(Fetch.API_KEY) >= OFFSET_FETCH_BATCHED_VERSION:
                (group,) = response.groups
                _raise_for_group(group.error_code, group_id, "fetching the offsets of")
                return _committed_offsets(group_id, group.topics)
            _raise_for_group(response.error_code, group_id, "fetching the offsets of")
            return _committed_offsets(group_id, response.topics)

        return await self._at_coordinator(
            group_id,
            f"fetching the offsets of group {group_id!r}",
            attempt,
            STABLE_OFFSETS_RETRIABLE if require_stable else GROUP_RETRIABLE,
        )

    async def alter_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, OffsetAndMetadata | int]
    ) -> None:
        """Commit `offsets` for the group from outside it, as Kafka's admin does (OffsetCommit
        with no generation and no member id). The coordinator takes such a commit only while the
        group has no members: otherwise GroupError UNKNOWN_MEMBER_ID (REBALANCE_IN_PROGRESS while
        it rebalances). A group that does not exist is created, empty, with these offsets."""
        committed = {
            tp: o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(o)
            for tp, o in offsets.items()
        }
        if not committed:
            return
        Commit = m.OffsetCommitRequest
        by_topic: dict[str, list[m.OffsetCommitRequest.OffsetCommitRequestPartition]] = {}
        for tp, offset in sorted(committed.items()):
            by_topic.setdefault(tp.topic, []).append(
                Commit.OffsetCommitRequestPartition(
                    partition_index=tp.partition,
                    committed_offset=offset.offset,
                    committed_leader_epoch=NO_LEADER_EPOCH
                    if offset.leader_epoch is None
                    else offset.leader_epoch,
                    committed_metadata=offset.metadata,
                )
            )
        request = Commit(
            group_id=group_id,
            generation_id=NO_GENERATION,
            member_id=NO_MEMBER_ID,
            group_instance_id=None,
            retention_time_ms=BROKER_RETENTION,
            topics=[
                Commit.OffsetCommitRequestTopic(name=topic, partitions=partitions)
                for topic, partitions in by_topic.items()
            ],
        )

        async def attempt(connection: BrokerConnection, node_id: int) -> None:
            response = await connection.call(
                request, m.OffsetCommitResponse, timeout_ms=self.settings.request_timeout_ms
            )
            for topic in response.topics:
                for p in topic.partitions:
                    doing = f"committing {topic.name}-{p.partition_index} for"
                    _raise_for_group(p.error_code, group_id, doing)

        await self._at_coordinator(group_id, f"committing offsets for group {group_id!r}", attempt)

    async def delete_groups(self, group_ids: Collection[str]) -> None:
        """Delete each group and its committed offsets. Only a group without members can be
        deleted (GroupError NON_EMPTY_GROUP otherwise; GROUP_ID_NOT_FOUND for one that does not
        exist). The groups are deleted independently: when some fail, the others are still
        deleted and the first failure is raised."""
        await _each(list(dict.fromkeys(group_ids)), self._delete_group)

    async def _delete_group(self, group_id: str) -> None:
        request = m.DeleteGroupsRequest(groups_names=[group_id])

        async def attempt(connection: BrokerConnection, node_id: int) -> None:
            response = await connection.call(
                request, m.DeleteGroupsResponse, timeout_ms=self.settings.request_timeout_ms
            )
            (result,) = response.results
            _raise_for_group(result.error_code, group_id, "deleting")

        await self._at_coordinator(group_id, f"deleting group {group_id!r}", attempt)

    async def _at_coordinator(
        self,
        group_id: str,
        what: str,
        attempt: Callable[[BrokerConnection, int], Awaitable[T]],
        retriable: tuple[type[BaseException], ...] = GROUP_RETRIABLE,
    ) -> T:
        """`attempt(connection, node_id)` at the group's coordinator, retried (see `_retrying`)
        while the coordinator is unknown, moving or loading, or fails with another of the
        `retriable` errors. A coordinator that failed for any other retriable reason is looked
        up again with FindCoordinator."""

        async def routed() -> T:
            try:
                node_id = await self._coordinator(group_id)
                return await attempt(await self._pool.connection_for(node_id), node_id)
            except GROUP_RETRIABLE as error:
                loading = (
                    isinstance(error, CoordinatorError)
                    and error.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
                )
                if not loading:  # it moved, or its broker is gone: ask again
                    self._coordinators.pop(group_id, None)
                raise

        return await self._retrying(what, routed, retriable)

    async def _coordinator(self, group_id: str) -> int:
        """The node id of the group's coordinator: the one found before, else FindCoordinator's
        answer. Metadata is refreshed when that broker is not known yet."""
        node_id = self._coordinators.get(group_id)
        if node_id is None:
            request = m.FindCoordinatorRequest(
                key=group_id, key_type=GROUP_KEY_TYPE, coordinator_keys=[group_id]
            )
            connection = await self._pool.any_connection()
            response = await connection.call(
                request, m.FindCoordinatorResponse, timeout_ms=self.settings.request_timeout_ms
            )
            batched = connection.version_for(request.API_KEY) >= FIND_COORDINATOR_BATCHED_VERSION
            found = response.coordinators[0] if batched else response
            reason = f": {found.error_message}" if found.error_message else ""
            _raise_for(found.error_code, f"finding the coordinator of group {group_id!r}{reason}")
            node_id = self._coordinators[group_id] = found.node_id
        if self._pool.cluster.broker(node_id) is None:
            await self._pool.refresh()
        return node_id

    # -- ACLs ---------------------------------------------------------------------------------
    async def create_acls(self, bindings: Sequence[AclBinding]) -> None:
        """Add ACL bindings (any broker writes them to ZooKeeper; every broker follows). Raises
        the typed error of the first binding refused (SecurityDisabledError without an
        authorizer, AuthorizationError without ALTER on the cluster, InvalidRequestError for a
        binding the broker finds invalid); the others are added regardless."""
        if not bindings:
            return
        request = acl_wire.create_request(bindings)
        response = await self._retrying(
            "creating ACLs", lambda: self._call_any(request, m.CreateAclsResponse)
        )
        for error in acl_wire.creation_errors(bindings, response):
            if error is not None:
                raise error

    async def describe_acls(self, wanted: AclBindingFilter = ANY_BINDING) -> list[AclBinding]:
        """The ACL bindings `wanted` matches (all of them by default), ordered by resource
        type, pattern type, name, then principal, host, operation and permission."""
        request = acl_wire.describe_request(wanted)
        response = await self._retrying(
            "describing ACLs", lambda: self._call_any(request, m.DescribeAclsResponse)
        )
        return sorted(acl_wire.described_bindings(response), key=binding_order)

    async def delete_acls(self, filters: Sequence[AclBindingFilter]) -> list[AclBinding]:
        """Remove every ACL binding one of `filters` matches; returns the bindings removed.
        Raises the typed error of a refused filter (as `create_acls` does)."""
        if not filters:
            return []
        request = acl_wire.delete_request(filters)
        response = await self._retrying(
            "deleting ACLs", lambda: self._call_any(request, m.DeleteAclsResponse)
        )
        return acl_wire.deleted_bindings(filters, response)

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

    async def _retrying(
        self,
        what: str,
        attempt: Callable[[], Awaitable[T]],
        retriable: tuple[type[BaseException], ...] = RETRIABLE,
    ) -> T:
        """`attempt()`, again after a backoff while it fails with a `retriable` error, for at
        most request_timeout_ms; then KafkaTimeoutError with the last failure as its cause.
        Until some request has been answered, connection failures are raised at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.request_timeout_ms / 1000
        failures = 0
        while True:
            try:
                result = await attempt()
            except retriable as error:
                if not self._answered and isinstance(error, ConnectionError | TimeoutError):
                    # No broker ever answered: most likely a wrong address, so say so at once
                    # rather than after request_timeout_ms (as kafka-python's NoBrokersAvailable).
                    raise
                failures += 1
                self._pool.cluster.mark_stale(f"{what}: {error}")
                wait_ms = backoff_ms(
                    failures, self.settings.retry_backoff_ms, self.settings.retry_backoff_max_ms
                )
                remaining_s = deadline - loop.time()
                if remaining_s <= 0:
                    raise KafkaTimeoutError(
                        f"{what} did not succeed within request_timeout_ms="
                        f"{self.settings.request_timeout_ms} (last error: {error})"
                    ) from error
                # The last wait is cut short so the final attempt comes at the deadline, not a
                # whole backoff before it.
                await asyncio.sleep(min(wait_ms / 1000, remaining_s))
            else:
                self._answered = True
                return result


class _TopicResult(Protocol):
    error_code: int


_Result = TypeVar("_Result", bound=_TopicResult)


async def _each(group_ids: Sequence[str], operation: Callable[[str], Awaitable[T]]) -> list[T]:
    """`operation(group_id)` for every group at once (each at its own coordinator), in order;
    the first failure is raised once every operation has finished."""
    answers = await asyncio.gather(*(operation(g) for g in group_ids), return_exceptions=True)
    results: list[T] = []
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
        results.append(answer)
    return results


def _answered_or_raise(
    cluster: ClusterMetadata, api: str, results: Iterable[tuple[TopicPartition, int, T]]
) -> dict[TopicPartition, T]:
    """A per-partition answer's values; if a partition failed, its error is raised once every
    partition was looked at (retriable ones mark the metadata stale first: a leader moved)."""
    answered: dict[TopicPartition, T] = {}
    first_error: Exception | None = None
    for tp, error_code, value in results:
        if error_code == ErrorCode.NONE:
            answered[tp] = value
        elif first_error is None:
            first_error = error_for(error_code, f"{tp.topic}-{tp.partition}")
    if first_error is not None:
        if isinstance(first_error, RETRIABLE):
            cluster.mark_stale(f"{api}: {first_error}")
        raise first_error
    return answered


def _partitions_by_topic(partitions: Iterable[TopicPartition]) -> list[tuple[str, list[int]]]:
    """The partitions grouped by topic, both sorted (as requests list them)."""
    by_topic: dict[str, set[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, set()).add(tp.partition)
    return [(topic, sorted(by_topic[topic])) for topic in sorted(by_topic)]


class _FetchedPartition(Protocol):
    partition_index: int
    committed_offset: int
    committed_leader_epoch: int
    metadata: str | None
    error_code: int


class _FetchedTopic(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def partitions(self) -> Sequence[_FetchedPartition]: ...


def _committed_offsets(
    group_id: str, topics: Sequence[_FetchedTopic]
) -> dict[TopicPartition, OffsetAndMetadata]:
    """An OffsetFetch answer (either shape) as offsets; -1 means nothing committed there."""
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    for topic in topics:
        for p in topic.partitions:
            _raise_for_group(
                p.error_code, group_id, f"fetching {topic.name}-{p.partition_index} of"
            )
            if p.committed_offset >= 0:
                offsets[TopicPartition(topic.name, p.partition_index)] = OffsetAndMetadata(
                    offset=p.committed_offset,
                    metadata=p.metadata or "",
                    leader_epoch=None
                    if p.committed_leader_epoch == NO_LEADER_EPOCH
                    else p.committed_leader_epoch,
                )
    return dict(sorted(offsets.items()))


def _group_description(
    group: m.DescribeGroupsResponse.DescribedGroup, coordinator: int
) -> GroupDescription:
    consumer = group.protocol_type == PROTOCOL_TYPE
    return GroupDescription(
        group_id=group.group_id,
        state=GroupState.parse(group.group_state),
        protocol_type=group.protocol_type,
        protocol=group.protocol_data,
        members=tuple(
            MemberDescription(
                member_id=member.member_id,
                group_instance_id=member.group_instance_id,
                client_id=member.client_id,
                client_host=member.client_host,
                assignment=tuple(decode_assignment(member.member_assignment).partitions)
                if consumer
                else None,
            )
            for member in group.members
        ),
        coordinator=coordinator,
    )


def _raise_for_group(error_code: int, group_id: str, doing: str) -> None:
    """Raise `error_code` (unless NONE) as "<doing> group 'g': <what it means>"."""
    if error_code != ErrorCode.NONE:
        reason = GROUP_ERROR_REASONS.get(ErrorCode(error_code))
        message = f"{doing} group {group_id!r}" + (f": {reason}" if reason else "")
        raise error_for(error_code, message)


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


def _log_dir(result: m.DescribeLogDirsResponse.DescribeLogDirsResult) -> LogDirDescription:
    return LogDirDescription(
        path=result.log_dir,
        error=_error_or_none(result.error_code, result.log_dir),
        total_bytes=result.total_bytes,
        usable_bytes=result.usable_bytes,
        replicas={
            TopicPartition(topic.name, p.partition_index): ReplicaLogDir(
                p.partition_size, p.offset_lag, p.remote_log_size, p.tiering_backlog_bytes
            )
            for topic in result.topics
            for p in topic.partitions
        },
    )


def _error_or_none(error_code: int, message: str | None) -> KafkaError | None:
    return None if error_code == ErrorCode.NONE else error_for(error_code, message)


def _raise_for(error_code: int, message: str | None) -> None:
    if error_code != ErrorCode.NONE:
        raise error_for(error_code, message)
