"""Riverbed against three Kafka client libraries written by others, each used as its docs say.

Every test runs once per library (see drivers.py); the round trip also reads each library's
records back with the other two, so an encoding only one library tolerates cannot hide.
"""

from __future__ import annotations

import random
import time

import pytest

from tests.interop.disk import read_partition
from tests.interop.drivers import (
    DRIVERS,
    ERROR_UNKNOWN_TOPIC_OR_PARTITION,
    Driver,
    Message,
    ProduceFailedError,
)
from tests.support.broker import BrokerFactory, BrokerProcess

ERROR_TOPIC_ALREADY_EXISTS = 36
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
HOUR_MS = 3_600_000
SETTLE_TIMEOUT_S = 10.0
NO_AUTO_CREATE = {"auto.create.topics.enable": "false"}
UNKNOWN_TOPIC_TIMEOUT_MS = 3_000

driver_classes = pytest.mark.parametrize("driver_class", DRIVERS, ids=lambda d: d.name)


def now_ms() -> int:
    return int(time.time() * 1000)


def sample_messages() -> list[Message]:
    """Edge cases of the record format, with explicit, deliberately unordered timestamps."""
    base = now_ms() - HOUR_MS
    rng = random.Random(7)
    return [
        Message(b"key", b"value", (), base),
        Message(None, b"no key", (), base + 1),
        Message(b"empty value", b"", (), base + 2),
        Message(b"tombstone", None, (), base + 3),
        Message(b"", b"empty key", (), base - 5_000),  # older than the previous ones
        Message(None, None, (), base + 4),
        Message(
            b"headers", b"v", (("a", b"1"), ("b", b""), ("unicode-\u00e9\u4e2d", b"\x00")), base + 5
        ),
        Message(b"repeated", b"v", (("dup", b"x"), ("dup", b"y"), ("dup", b"x")), base + 6),
        Message(bytes(range(256)), bytes(range(255, -1, -1)) * 64, (), base + 7),
        Message(b"large", rng.randbytes(300_000), (("size", b"300000"),), base + 8),
        Message(b"null header", b"v", (("n", None), ("n", b"v")), base + 9),
    ]


@driver_classes
def test_round_trip_is_exact(driver_class: type[Driver], broker: BrokerProcess, topic: str) -> None:
    producer = driver_class(broker.bootstrap)
    messages = [message for message in sample_messages() if producer.can_produce(message)]
    assert producer.create_topic(topic, 1) == 0

    offsets = producer.produce(topic, 0, messages)

    assert offsets == list(range(len(messages)))
    for reader_class in DRIVERS:
        consumed = reader_class(broker.bootstrap).consume(topic, 0, 0, len(messages))
        assert [record.offset for record in consumed] == offsets, reader_class.name
        assert [record.message for record in consumed] == messages, reader_class.name


def compressible_messages(count: int) -> list[Message]:
    base = now_ms()
    words = ["riverbed", "kafka", "segment", "offset", "batch", "tier"]
    rng = random.Random(count)
    return [
        Message(
            f"key-{i}".encode(),
            " ".join(rng.choice(words) for _ in range(150)).encode(),
            (("index", str(i).encode()),),
            base + i,
        )
        for i in range(count)
    ]


@pytest.mark.parametrize(
    ("driver_class", "codec"),
    [(driver, codec) for driver in DRIVERS for codec in driver.codecs],
    ids=lambda value: value if isinstance(value, str) else value.name,
)
def test_compressed_batches_are_stored_compressed(
    driver_class: type[Driver], codec: str, broker: BrokerProcess, topic: str
) -> None:
    driver = driver_class(broker.bootstrap)
    messages = compressible_messages(300)
    assert driver.create_topic(topic, 1) == 0

    offsets = driver.produce(topic, 0, messages, compression=codec)

    assert offsets == list(range(len(messages)))
    consumed = driver.consume(topic, 0, 0, len(messages))
    assert [record.message for record in consumed] == messages
    # The broker keeps the producer's batches as they came (compression.type=producer).
    batches = read_partition(broker.segment_files(topic, 0))
    assert batches, "no batch on disk"
    # librdkafka sends lz4 batches uncompressed unless the broker advertises FindCoordinator v0
    # (its "LZ4" feature is inferred from that API: rdkafka_feature.c).
    assert {batch.compression for batch in batches} == {CODEC_IDS[codec]}, "codec ids on disk"
    assert all(batch.crc_ok for batch in batches)
    assert [v for batch in batches for v in batch.values] == [m.value for m in messages]
    stored_bytes = sum(batch.size_bytes for batch in batches)
    raw_bytes = sum(len(m.value or b"") for m in messages)
    if codec == "none":
        assert stored_bytes > raw_bytes
    else:
        assert stored_bytes < raw_bytes / 2, (stored_bytes, raw_bytes)


@driver_classes
def test_list_offsets_earliest_latest_and_by_timestamp(
    driver_class: type[Driver], broker: BrokerProcess, topic: str
) -> None:
    driver = driver_class(broker.bootstrap)
    assert driver.create_topic(topic, 1) == 0
    assert driver.earliest_latest(topic, 0) == (0, 0)
    assert driver.offset_for_time(topic, 0, now_ms()) is None
    base = now_ms() - HOUR_MS

    # Two produce calls, so the search for a timestamp has to cross a batch boundary.
    for first in (0, 5):
        batch = [Message(None, b"%d" % i, (), base + 10 * i) for i in range(first, first + 5)]
        assert driver.produce(topic, 0, batch) == list(range(first, first + 5))

    assert driver.earliest_latest(topic, 0) == (0, 10)
    assert driver.offset_for_time(topic, 0, base - HOUR_MS) == 0
    assert driver.offset_for_time(topic, 0, base) == 0
    assert driver.offset_for_time(topic, 0, base + 15) == 2
    assert driver.offset_for_time(topic, 0, base + 20) == 2
    assert driver.offset_for_time(topic, 0, base + 45) == 5
    assert driver.offset_for_time(topic, 0, base + 90) == 9
    assert driver.offset_for_time(topic, 0, base + 91) is None


def wait_for_partition_count(driver: Driver, topic: str, expected: tuple[int, int]) -> None:
    """Topic creation and deletion may take effect just after the admin call returns."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while (found := driver.partition_count(topic)) != expected:
        assert time.monotonic() < deadline, f"metadata for {topic}: {found}, want {expected}"
        time.sleep(0.2)


@driver_classes
def test_create_and_delete_topics_with_errors(
    driver_class: type[Driver], broker_factory: BrokerFactory, topic: str
) -> None:
    # Without auto-creation, a metadata lookup after the delete cannot bring the topic back.
    driver = driver_class(broker_factory(NO_AUTO_CREATE).bootstrap)

    assert driver.create_topic(topic, 3) == 0
    assert driver.create_topic(topic, 3) == ERROR_TOPIC_ALREADY_EXISTS
    wait_for_partition_count(driver, topic, (0, 3))
    assert driver.produce(topic, 2, [Message(None, b"x", (), now_ms())]) == [0]

    assert driver.delete_topic(topic) == 0
    wait_for_partition_count(driver, topic, (ERROR_UNKNOWN_TOPIC_OR_PARTITION, 0))
    assert driver.delete_topic(f"{topic}-never") == ERROR_UNKNOWN_TOPIC_OR_PARTITION


@driver_classes
def test_describe_configs_of_a_topic(
    driver_class: type[Driver], broker_factory: BrokerFactory, topic: str
) -> None:
    broker = broker_factory({"log.segment.bytes": "1048576"})
    driver = driver_class(broker.bootstrap)
    assert driver.create_topic(topic, 1, {"retention.ms": "3600000"}) == 0

    configs = driver.topic_configs(topic)

    assert configs.get("retention.ms") == "3600000"  # set on the topic
    assert configs.get("segment.bytes") == "1048576"  # the broker's default for topics


@driver_classes
def test_producing_to_a_new_topic_creates_it(
    driver_class: type[Driver], broker_factory: BrokerFactory, topic: str
) -> None:
    driver = driver_class(broker_factory({"num.partitions": "3"}).bootstrap)

    assert driver.produce(topic, 0, [Message(b"k", b"v", (), now_ms())]) == [0]

    wait_for_partition_count(driver, topic, (0, 3))


@driver_classes
def test_unknown_topic_without_auto_create_fails_fast(
    driver_class: type[Driver], broker_factory: BrokerFactory, topic: str
) -> None:
    bootstrap = broker_factory(NO_AUTO_CREATE).bootstrap
    driver = driver_class(bootstrap, produce_timeout_ms=UNKNOWN_TOPIC_TIMEOUT_MS)
    started = time.monotonic()

    with pytest.raises(ProduceFailedError):
        driver.produce(topic, 0, [Message(b"k", b"v", (), now_ms())])

    # The library gives up after its own timeout (some retry metadata until then); no hang.
    assert time.monotonic() - started < UNKNOWN_TOPIC_TIMEOUT_MS / 1000 + SETTLE_TIMEOUT_S
    assert driver.partition_count(topic) == (ERROR_UNKNOWN_TOPIC_OR_PARTITION, 0)
