"""The admin client: create, delete, list and describe topics.

Topic changes go to the controller named in Metadata (as Kafka's admin clients do); reads go to
any broker. Errors come back as `KafkaError` carrying the broker's code and message.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from types import TracebackType

from riverbed.client.connection import BrokerConnection
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError

RESOURCE_TOPIC = 2
DEFAULT_TIMEOUT_MS = 30_000


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    topic_id: uuid.UUID
    partitions: tuple[PartitionDescription, ...]
    configs: dict[str, str | None] = field(default_factory=dict)


def parse_bootstrap(bootstrap_servers: str) -> list[tuple[str, int]]:
    """`host:port[,host:port...]` -> [(host, port)], with a clear error for a malformed entry."""
    servers = []
    for entry in bootstrap_servers.split(","):
        host, sep, port = entry.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bootstrap server {entry!r} is not HOST:PORT")
        servers.append((host, int(port)))
    return servers


class Admin:
    """Async context manager: `async with Admin(bootstrap_servers="127.0.0.1:9092") as admin:`."""

    def __init__(self, bootstrap_servers: str, *, request_timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self._bootstrap = parse_bootstrap(bootstrap_servers)
        self._timeout_ms = request_timeout_ms
        self._connections: dict[tuple[str, int], BrokerConnection] = {}

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        connections, self._connections = self._connections, {}
        for connection in connections.values():
            await connection.close()

    async def create_topic(
        self,
        name: str,
        *,
        partitions: int = -1,
        replication_factor: int = -1,
        configs: dict[str, str] | None = None,
    ) -> uuid.UUID:
        request = m.CreateTopicsRequest(
            topics=[
                m.CreateTopicsRequest.CreatableTopic(
                    name=name,
                    num_partitions=partitions,
                    replication_factor=replication_factor,
                    configs=[
                        m.CreateTopicsRequest.CreatableTopicConfig(name=k, value=v)
                        for k, v in (configs or {}).items()
                    ],
                )
            ],
            timeout_ms=self._timeout_ms,
        )
        response = await (await self._controller()).request(request, timeout_ms=self._timeout_ms)
        result = response.topics[0]
        _raise_for(result.error_code, result.error_message)
        topic_id: uuid.UUID = result.topic_id
        return topic_id

    async def delete_topic(self, name: str) -> None:
        request = m.DeleteTopicsRequest(
            topics=[m.DeleteTopicsRequest.DeleteTopicState(name=name)],
            topic_names=[name],
            timeout_ms=self._timeout_ms,
        )
        response = await (await self._controller()).request(request, timeout_ms=self._timeout_ms)
        result = response.responses[0]
        _raise_for(result.error_code, result.error_message)

    async def list_topics(self) -> list[str]:
        metadata = await self._metadata(None)
        return sorted(t.name for t in metadata.topics if t.name is not None)

    async def describe_topic(self, name: str) -> TopicDescription:
        metadata = await self._metadata([name])
        topic = metadata.topics[0]
        _raise_for(topic.error_code, f"topic {name!r}")
        configs_response = await (await self._any()).request(
            m.DescribeConfigsRequest(
                resources=[
                    m.DescribeConfigsRequest.DescribeConfigsResource(
                        resource_type=RESOURCE_TOPIC, resource_name=name, configuration_keys=None
                    )
                ]
            ),
            timeout_ms=self._timeout_ms,
        )
        result = configs_response.results[0]
        _raise_for(result.error_code, result.error_message)
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
            configs={c.name: c.value for c in result.configs},
        )

    async def _metadata(self, names: list[str] | None) -> m.MetadataResponse:
        topics = (
            None
            if names is None
            else [m.MetadataRequest.MetadataRequestTopic(name=n) for n in names]
        )
        request = m.MetadataRequest(topics=topics, allow_auto_topic_creation=False)
        response: m.MetadataResponse = await (await self._any()).request(
            request, timeout_ms=self._timeout_ms
        )
        return response

    async def _controller(self) -> BrokerConnection:
        metadata = await self._metadata([])
        for broker in metadata.brokers:
            if broker.node_id == metadata.controller_id:
                return await self._connect(broker.host, broker.port)
        raise KafkaError(ErrorCode.NOT_CONTROLLER, "the cluster has no controller right now")

    async def _any(self) -> BrokerConnection:
        errors = []
        for host, port in self._bootstrap:
            try:
                return await self._connect(host, port)
            except OSError as error:
                errors.append(f"{host}:{port}: {error}")
        raise ConnectionError("no bootstrap server reachable (" + "; ".join(errors) + ")")

    async def _connect(self, host: str, port: int) -> BrokerConnection:
        connection = self._connections.get((host, port))
        if connection is None:
            connection = await BrokerConnection.open(host, port, timeout_ms=self._timeout_ms)
            self._connections[(host, port)] = connection
        return connection


def _raise_for(error_code: int, message: str | None) -> None:
    if error_code != ErrorCode.NONE:
        code = ErrorCode(error_code)
        raise KafkaError(code, message or code.name)
