"""One small, uniform driver per Kafka client library, so each interop test is written once.

A driver does what a user of that library would do (producer, assigned consumer without a group,
admin client) and hands back plain values: offsets, `Message`s and Kafka error codes. Every call
is bounded by `OPERATION_TIMEOUT_S`; a broker that never answers fails the test instead of hanging.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol, TypeVar

import aiokafka.errors
import confluent_kafka
import confluent_kafka.admin
import kafka
import kafka.admin
import kafka.errors
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

OPERATION_TIMEOUT_S: Final = 20.0
# The libraries' own timeouts expire first, so a failure carries their error, not ours.
REQUEST_TIMEOUT_MS: Final = 15_000
# Long enough that a test's records go out in a few large batches (what compression acts on).
LINGER_MS: Final = 20
POLL_INTERVAL_S: Final = 0.5
ERROR_UNKNOWN_TOPIC_OR_PARTITION: Final = 3

Headers = tuple[tuple[str, bytes | None], ...]
T = TypeVar("T")


@dataclass(frozen=True)
class Message:
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int


@dataclass(frozen=True)
class Consumed:
    offset: int
    message: Message


class ProduceFailedError(Exception):
    """The library reported that a record was not acknowledged."""


class Driver(Protocol):
    name: ClassVar[str]
    codecs: ClassVar[tuple[str, ...]]

    @staticmethod
    def can_produce(message: Message) -> bool:
        """False for a record the library's producer refuses to build."""
        ...

    def __init__(self, bootstrap: str, *, produce_timeout_ms: int = REQUEST_TIMEOUT_MS) -> None:
        """`produce_timeout_ms` bounds how long the producer waits for metadata and acks."""
        ...

    def produce(
        self, topic: str, partition: int, messages: Sequence[Message], compression: str = "none"
    ) -> list[int]:
        """Send with acks=all, wait for every acknowledgement; return the offsets in order."""
        ...

    def consume(self, topic: str, partition: int, start_offset: int, count: int) -> list[Consumed]:
        """Read exactly `count` records from `start_offset` (fails the test on timeout)."""
        ...

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """ListOffsets by timestamp: first offset with a timestamp >= it, None if there is none."""
        ...

    def earliest_latest(self, topic: str, partition: int) -> tuple[int, int]: ...

    def create_topic(
        self, topic: str, partitions: int, configs: dict[str, str] | None = None
    ) -> int:
        """CreateTopics through the admin client; return the topic's error code."""
        ...

    def delete_topic(self, topic: str) -> int:
        """DeleteTopics through the admin client; return the topic's error code."""
        ...

    def partition_count(self, topic: str) -> tuple[int, int]:
        """Metadata for one topic: (error code, partition count). Some libraries ask the broker to
        auto-create the topic in the same request, so call it where that cannot happen."""
        ...

    def topic_configs(self, topic: str) -> dict[str, str | None]:
        """DescribeConfigs for a topic: every config the broker returns."""
        ...


class ProgressDeadline:
    """A consume loop's bound: it gives up once no record has arrived for OPERATION_TIMEOUT_S.
    A stuck consumer is caught as surely as by a fixed deadline, and a long stream (records
    produced while it reads, on a slow machine) takes as long as it takes."""

    def __init__(self) -> None:
        self._seen = 0
        self._progress_s = time.monotonic()

    def passed(self, seen: int) -> bool:
        now_s = time.monotonic()
        if seen != self._seen:
            self._seen, self._progress_s = seen, now_s
        return now_s - self._progress_s > OPERATION_TIMEOUT_S

    def check(self, seen: int, count: int) -> None:
        if seen < count:
            raise AssertionError(
                f"consumed {seen} of {count} records; none more for {OPERATION_TIMEOUT_S} s"
            )


def _as_headers(pairs: Sequence[tuple[str, bytes | None]] | None) -> Headers:
    return tuple((name, value) for name, value in pairs or ())


def _as_bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def _has_key_or_value(message: Message) -> bool:
    return message.key is not None or message.value is not None


def _group_id() -> str:
    # librdkafka requires a group.id even for assign(); a fresh one never joins anything.
    return f"interop-{uuid.uuid4().hex}"


class ConfluentKafka:
    name: ClassVar[str] = "confluent-kafka"
    codecs: ClassVar[tuple[str, ...]] = ("none", "gzip", "snappy", "lz4", "zstd")

    @staticmethod
    def can_produce(message: Message) -> bool:
        return True

    def __init__(self, bootstrap: str, *, produce_timeout_ms: int = REQUEST_TIMEOUT_MS) -> None:
        self.bootstrap = bootstrap
        self.produce_timeout_ms = produce_timeout_ms

    def producer(self, **overrides: object) -> confluent_kafka.Producer:
        config: dict[str, object] = {
            "bootstrap.servers": self.bootstrap,
            "acks": "all",
            "linger.ms": LINGER_MS,
            "enable.idempotence": False,
            "message.timeout.ms": self.produce_timeout_ms,
            # librdkafka waits this long for a topic to appear before failing its messages.
            "topic.metadata.propagation.max.ms": 2_000,
        }
        config.update(overrides)
        return confluent_kafka.Producer(config)

    def produce(
        self, topic: str, partition: int, messages: Sequence[Message], compression: str = "none"
    ) -> list[int]:
        producer = self.producer(**{"compression.type": compression})
        reports: list[tuple[confluent_kafka.KafkaError | None, int | None]] = []
        for message in messages:
            producer.produce(
                topic,
                value=message.value,
                key=message.key,
                partition=partition,
                timestamp=message.timestamp_ms,
                headers=list(message.headers),
                on_delivery=lambda error, record: reports.append((error, record.offset())),
            )
        remaining = producer.flush(OPERATION_TIMEOUT_S)
        errors = [error for error, _ in reports if error is not None]
        if remaining or errors or len(reports) != len(messages):
            raise ProduceFailedError(f"{remaining} undelivered, errors: {errors[:3]}")
        return [offset for _, offset in reports if offset is not None]

    @contextmanager
    def consumer(self) -> Iterator[confluent_kafka.Consumer]:
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": _group_id(),
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "error",
            }
        )
        try:
            yield consumer
        finally:
            consumer.close()

    def consume(self, topic: str, partition: int, start_offset: int, count: int) -> list[Consumed]:
        out: list[Consumed] = []
        deadline = ProgressDeadline()
        with self.consumer() as consumer:
            consumer.assign([confluent_kafka.TopicPartition(topic, partition, start_offset)])
            while len(out) < count and not deadline.passed(len(out)):
                for record in consumer.consume(count - len(out), POLL_INTERVAL_S):
                    out.append(self._consumed(record))
        deadline.check(len(out), count)
        return out

    @staticmethod
    def _consumed(record: confluent_kafka.Message) -> Consumed:
        offset, headers = record.offset(), record.headers()
        if record.error() is not None or offset is None:
            raise AssertionError(f"consume error: {record.error()}")
        if not isinstance(headers, list | None):
            raise AssertionError(f"headers not a list: {headers!r}")
        message = Message(
            record.key(),
            record.value(),
            tuple((name, _as_bytes(value)) for name, value in headers or ()),
            record.timestamp()[1],
        )
        return Consumed(offset, message)

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        with self.consumer() as consumer:
            (found,) = consumer.offsets_for_times(
                [confluent_kafka.TopicPartition(topic, partition, timestamp_ms)],
                OPERATION_TIMEOUT_S,
            )
        if found.error is not None:
            raise AssertionError(f"offsets_for_times error: {found.error}")
        return None if found.offset < 0 else int(found.offset)

    def earliest_latest(self, topic: str, partition: int) -> tuple[int, int]:
        with self.consumer() as consumer:
            low, high = consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(topic, partition),
                timeout=OPERATION_TIMEOUT_S,
                cached=False,
            )
        return int(low), int(high)

    def admin(self) -> confluent_kafka.admin.AdminClient:
        return confluent_kafka.admin.AdminClient({"bootstrap.servers": self.bootstrap})

    @staticmethod
    def _error_code(future: Any) -> int:
        try:
            future.result(timeout=OPERATION_TIMEOUT_S)
        except confluent_kafka.KafkaException as error:
            code: int = error.args[0].code()
            return code
        return 0

    def create_topic(
        self, topic: str, partitions: int, configs: dict[str, str] | None = None
    ) -> int:
        new_topic = NewTopic(
            topic, num_partitions=partitions, replication_factor=1, config=configs or {}
        )
        admin = self.admin()  # must outlive the future: destroying it fails the request
        futures = admin.create_topics([new_topic], request_timeout=OPERATION_TIMEOUT_S)
        return self._error_code(futures[topic])

    def delete_topic(self, topic: str) -> int:
        admin = self.admin()
        futures = admin.delete_topics([topic], request_timeout=OPERATION_TIMEOUT_S)
        return self._error_code(futures[topic])

    def partition_count(self, topic: str) -> tuple[int, int]:
        metadata = self.admin().list_topics(topic, timeout=OPERATION_TIMEOUT_S)
        found = metadata.topics[topic]
        code = 0 if found.error is None else found.error.code()
        return code, len(found.partitions)

    def topic_configs(self, topic: str) -> dict[str, str | None]:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        admin = self.admin()
        futures = admin.describe_configs([resource], request_timeout=OPERATION_TIMEOUT_S)
        entries = futures[resource].result(timeout=OPERATION_TIMEOUT_S)
        return {name: entry.value for name, entry in entries.items()}


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one aiokafka operation to completion on a private event loop, bounded in time."""
    return asyncio.run(asyncio.wait_for(coroutine, OPERATION_TIMEOUT_S))


class AioKafka:
    name: ClassVar[str] = "aiokafka"
    codecs: ClassVar[tuple[str, ...]] = ("none", "gzip", "snappy", "lz4", "zstd")

    @staticmethod
    def can_produce(message: Message) -> bool:
        # AIOKafkaProducer.send asserts "Need at least one: key or value".
        return _has_key_or_value(message)

    def __init__(self, bootstrap: str, *, produce_timeout_ms: int = REQUEST_TIMEOUT_MS) -> None:
        self.bootstrap = bootstrap
        self.produce_timeout_ms = produce_timeout_ms

    def produce(
        self, topic: str, partition: int, messages: Sequence[Message], compression: str = "none"
    ) -> list[int]:
        return _run(self._produce(topic, partition, messages, compression))

    async def _produce(
        self, topic: str, partition: int, messages: Sequence[Message], compression: str
    ) -> list[int]:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            linger_ms=LINGER_MS,
            enable_idempotence=False,
            compression_type=None if compression == "none" else compression,
            request_timeout_ms=self.produce_timeout_ms,
        )
        await producer.start()
        try:
            results = await self._send_all(producer, topic, partition, messages)
        except aiokafka.errors.KafkaError as error:
            raise ProduceFailedError(repr(error)) from error
        finally:
            await producer.stop()
        errors = [result for result in results if isinstance(result, BaseException)]
        if errors:
            raise ProduceFailedError(f"{len(errors)} records failed: {errors[:3]}")
        return [result.offset for result in results if not isinstance(result, BaseException)]

    @staticmethod
    async def _send_all(
        producer: AIOKafkaProducer, topic: str, partition: int, messages: Sequence[Message]
    ) -> list[Any]:
        futures = [
            await producer.send(
                topic,
                value=message.value,
                key=message.key,
                partition=partition,
                timestamp_ms=message.timestamp_ms,
                headers=list(message.headers),
            )
            for message in messages
        ]
        return list(await asyncio.gather(*futures, return_exceptions=True))

    def _consumer(self) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
        )

    def consume(self, topic: str, partition: int, start_offset: int, count: int) -> list[Consumed]:
        # Bounded by its progress, not by _run's total time (see ProgressDeadline).
        return asyncio.run(self._consume(topic, partition, start_offset, count))

    async def _consume(
        self, topic: str, partition: int, start_offset: int, count: int
    ) -> list[Consumed]:
        consumer = self._consumer()
        await consumer.start()
        out: list[Consumed] = []
        deadline = ProgressDeadline()
        try:
            assigned = AioTopicPartition(topic, partition)
            consumer.assign([assigned])
            consumer.seek(assigned, start_offset)
            while len(out) < count and not deadline.passed(len(out)):
                batches = await consumer.getmany(assigned, timeout_ms=int(POLL_INTERVAL_S * 1000))
                for record in batches.get(assigned, []):
                    message = Message(
                        record.key, record.value, _as_headers(record.headers), record.timestamp
                    )
                    out.append(Consumed(record.offset, message))
        finally:
            await consumer.stop()
        deadline.check(len(out), count)
        return out[:count]

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        return _run(self._offset_for_time(topic, partition, timestamp_ms))

    async def _offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        consumer = self._consumer()
        await consumer.start()
        try:
            assigned = AioTopicPartition(topic, partition)
            found = await consumer.offsets_for_times({assigned: timestamp_ms})
        finally:
            await consumer.stop()
        entry = found[assigned]
        return None if entry is None else int(entry.offset)

    def earliest_latest(self, topic: str, partition: int) -> tuple[int, int]:
        return _run(self._earliest_latest(topic, partition))

    async def _earliest_latest(self, topic: str, partition: int) -> tuple[int, int]:
        consumer = self._consumer()
        await consumer.start()
        try:
            assigned = AioTopicPartition(topic, partition)
            earliest = await consumer.beginning_offsets([assigned])
            latest = await consumer.end_offsets([assigned])
        finally:
            await consumer.stop()
        return int(earliest[assigned]), int(latest[assigned])

    async def _admin_call(self, method: str, *args: Any) -> Any:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS
        )
        await admin.start()
        try:
            return await getattr(admin, method)(*args)
        finally:
            await admin.close()

    def create_topic(
        self, topic: str, partitions: int, configs: dict[str, str] | None = None
    ) -> int:
        new_topic = AioNewTopic(topic, partitions, 1, topic_configs=configs or {})
        response = _run(self._admin_call("create_topics", [new_topic]))
        (result,) = response.to_object()["topic_errors"]
        return int(result["error_code"])

    def delete_topic(self, topic: str) -> int:
        response = _run(self._admin_call("delete_topics", [topic]))
        (result,) = response.to_object()["topic_error_codes"]
        return int(result["error_code"])

    def partition_count(self, topic: str) -> tuple[int, int]:
        (found,) = _run(self._admin_call("describe_topics", [topic]))
        return int(found["error_code"]), len(found["partitions"])

    def topic_configs(self, topic: str) -> dict[str, str | None]:
        resource = AioConfigResource(AioConfigResourceType.TOPIC, topic)
        (response,) = _run(self._admin_call("describe_configs", [resource]))
        (result,) = response.to_object()["resources"]
        if result["error_code"] != 0:
            raise AssertionError(f"DescribeConfigs error: {result}")
        return {entry["config_names"]: entry["config_value"] for entry in result["config_entries"]}


class KafkaPython:
    name: ClassVar[str] = "kafka-python"
    codecs: ClassVar[tuple[str, ...]] = ("none", "gzip", "snappy", "lz4", "zstd")

    @staticmethod
    def can_produce(message: Message) -> bool:
        # KafkaProducer.send raises ValueError for a null key with a null value, and TypeError for
        # a null header value: both are valid records that other clients produce.
        no_null_header = all(value is not None for _, value in message.headers)
        return no_null_header and _has_key_or_value(message)

    def __init__(self, bootstrap: str, *, produce_timeout_ms: int = REQUEST_TIMEOUT_MS) -> None:
        self.bootstrap = bootstrap
        self.produce_timeout_ms = produce_timeout_ms

    def producer(self, **overrides: object) -> kafka.KafkaProducer:
        config: dict[str, object] = {
            "bootstrap_servers": self.bootstrap,
            "acks": "all",
            "linger_ms": LINGER_MS,
            "max_block_ms": self.produce_timeout_ms,
            "request_timeout_ms": self.produce_timeout_ms,
        }
        config.update(overrides)
        return kafka.KafkaProducer(**config)

    def produce(
        self, topic: str, partition: int, messages: Sequence[Message], compression: str = "none"
    ) -> list[int]:
        producer = self.producer(compression_type=None if compression == "none" else compression)
        try:
            futures = [
                producer.send(
                    topic,
                    value=message.value,
                    key=message.key,
                    headers=list(message.headers),
                    partition=partition,
                    timestamp_ms=message.timestamp_ms,
                )
                for message in messages
            ]
            producer.flush(timeout=OPERATION_TIMEOUT_S)
            return [future.get(timeout=OPERATION_TIMEOUT_S).offset for future in futures]
        except kafka.errors.KafkaError as error:
            raise ProduceFailedError(repr(error)) from error
        finally:
            producer.close(timeout=OPERATION_TIMEOUT_S)

    @contextmanager
    def consumer(self) -> Iterator[kafka.KafkaConsumer]:
        consumer = kafka.KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
        )
        try:
            yield consumer
        finally:
            consumer.close()

    def consume(self, topic: str, partition: int, start_offset: int, count: int) -> list[Consumed]:
        out: list[Consumed] = []
        deadline = ProgressDeadline()
        assigned = kafka.TopicPartition(topic, partition)
        with self.consumer() as consumer:
            consumer.assign([assigned])
            consumer.seek(assigned, start_offset)
            while len(out) < count and not deadline.passed(len(out)):
                batches = consumer.poll(timeout_ms=int(POLL_INTERVAL_S * 1000))
                for record in batches.get(assigned, []):
                    message = Message(
                        record.key, record.value, _as_headers(record.headers), record.timestamp
                    )
                    out.append(Consumed(record.offset, message))
        deadline.check(len(out), count)
        return out[:count]

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        assigned = kafka.TopicPartition(topic, partition)
        with self.consumer() as consumer:
            found = consumer.offsets_for_times({assigned: timestamp_ms})
        entry = found[assigned]
        return None if entry is None else int(entry.offset)

    def earliest_latest(self, topic: str, partition: int) -> tuple[int, int]:
        assigned = kafka.TopicPartition(topic, partition)
        with self.consumer() as consumer:
            earliest = consumer.beginning_offsets([assigned])
            latest = consumer.end_offsets([assigned])
        return int(earliest[assigned]), int(latest[assigned])

    @contextmanager
    def admin(self) -> Iterator[kafka.admin.KafkaAdminClient]:
        admin = kafka.admin.KafkaAdminClient(
            bootstrap_servers=self.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS
        )
        try:
            yield admin
        finally:
            admin.close()

    def create_topic(
        self, topic: str, partitions: int, configs: dict[str, str] | None = None
    ) -> int:
        spec = {"num_partitions": partitions, "replication_factor": 1, "configs": configs or {}}
        with self.admin() as admin:
            result = admin.create_topics({topic: spec}, raise_errors=False)
        (found,) = result["topics"]
        return int(found["error_code"])

    def delete_topic(self, topic: str) -> int:
        with self.admin() as admin:
            result = admin.delete_topics([topic], raise_errors=False)
        (found,) = result["topics"]
        return int(found["error_code"])

    def partition_count(self, topic: str) -> tuple[int, int]:
        with self.admin() as admin:
            (found,) = admin.describe_topics([topic])
        return int(found["error_code"]), len(found["partitions"])

    def topic_configs(self, topic: str) -> dict[str, str | None]:
        resource = kafka.admin.ConfigResource(kafka.admin.ConfigResourceType.TOPIC, topic)
        with self.admin() as admin:
            result = admin.describe_configs([resource], config_filter="all")
        return {name: entry["value"] for name, entry in result["topic"][topic].items()}


DRIVERS: Final[tuple[type[Driver], ...]] = (ConfluentKafka, AioKafka, KafkaPython)
