"""The broker's Prometheus endpoint (`metrics.port`) on a real broker process, driven by
librdkafka (confluent-kafka): after producing and consuming, the counters match what was sent
and what the log holds; a group's lag is the records it has not committed; requests are counted
and timed per API; a bad scrape gets an HTTP error and the broker serves on."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
import uuid

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import HOST, BrokerFactory, BrokerProcess
from tests.support.metrics import WITH_METRICS, metrics_port, metrics_url, scrape

SETTINGS = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "1",
    "offsets.topic.replication.factor": "1",
}
PARTITIONS = 2
RECORDS = 2_000  # per partition
COMMITTED = 1_500  # the group commits this far in partition 0, nothing in partition 1
FLUSH_TIMEOUT_S = 30
CONSUME_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 10.0


def produce(broker: BrokerProcess, topic: str) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5}
    )
    for partition in range(PARTITIONS):
        for i in range(RECORDS):
            producer.produce(topic, f"value-{i}".encode(), key=str(i).encode(), partition=partition)
    assert producer.flush(FLUSH_TIMEOUT_S) == 0


def consume_all_and_commit(broker: BrokerProcess, topic: str, group: str) -> int:
    """Read every record once with a librdkafka consumer of `group`, commit COMMITTED in
    partition 0; the records read."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        read = 0
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while read < PARTITIONS * RECORDS:
            assert time.monotonic() < deadline, f"read {read} records"
            for message in consumer.consume(1000, timeout=1.0):
                assert message.error() is None, message.error()
                read += 1
        consumer.commit(
            offsets=[confluent_kafka.TopicPartition(topic, 0, COMMITTED)], asynchronous=False
        )
        return read
    finally:
        consumer.close()


def log_bytes(broker: BrokerProcess, topic: str, partition: int) -> int:
    return sum(f.stat().st_size for f in broker.segment_files(topic, partition))


async def test_counters_match_what_librdkafka_produced_and_consumed(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory({**SETTINGS, **WITH_METRICS})
    topic = f"metrics-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()

    produce(broker, topic)
    group = f"g-{uuid.uuid4().hex[:6]}"
    assert consume_all_and_commit(broker, topic, group) == PARTITIONS * RECORDS
    metrics = scrape(broker)

    assert metrics.value("riverbed_topic_records_in_total", topic=topic) == PARTITIONS * RECORDS
    # Bytes in are the batches appended: exactly what the log files hold.
    on_disk = sum(log_bytes(broker, topic, p) for p in range(PARTITIONS))
    assert metrics.value("riverbed_topic_bytes_in_total", topic=topic) == on_disk
    # One consumer read each batch once.
    assert metrics.value("riverbed_topic_bytes_out_total", topic=topic, reader="consumer") == (
        on_disk
    )
    assert metrics.value("riverbed_topic_records_out_total", topic=topic, reader="consumer") == (
        PARTITIONS * RECORDS
    )
    # Lag: what the group has not committed, per partition it committed in.
    assert metrics.value(
        "riverbed_consumer_group_lag", group=group, topic=topic, partition="0"
    ) == (RECORDS - COMMITTED)

    for api in ("Produce", "Fetch", "Metadata", "CreateTopics", "OffsetCommit"):
        requests = metrics.value("riverbed_requests_total", api=api)
        timed = metrics.value("riverbed_request_duration_seconds_count", api=api)
        # Timed when answered: the closed consumer's last long-poll fetch may still be parked.
        assert 1 <= timed <= requests, api
        if api != "Fetch":
            assert timed == requests, api
    assert metrics.value("riverbed_leader_partitions") == PARTITIONS + 1  # + __consumer_offsets
    assert metrics.value("riverbed_under_replicated_partitions") == 0
    assert metrics.value("riverbed_offline_partitions") == 0
    assert metrics.value("riverbed_active_controller") == 1
    assert metrics.value("riverbed_produce_purgatory_size") == 0

    # Scrapes read the state again, and the counters only go up.
    produce(broker, topic)
    again = scrape(broker)
    assert again.value("riverbed_topic_records_in_total", topic=topic) == 2 * PARTITIONS * RECORDS
    assert again.value("riverbed_consumer_group_lag", group=group, topic=topic, partition="0") == (
        2 * RECORDS - COMMITTED
    )


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def raw_exchange(broker: BrokerProcess, payload: bytes) -> bytes:
    with socket.create_connection((HOST, metrics_port(broker)), timeout=HTTP_TIMEOUT_S) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def test_bad_scrapes_get_http_errors_and_the_broker_serves_on(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(WITH_METRICS)
    assert http_status(metrics_url(broker, "/nothing-here")) == 404
    assert raw_exchange(broker, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    # Garbage and an endless request head: the connection is closed, nothing is answered.
    assert raw_exchange(broker, b"\x00\xff" * 100) == b""
    assert raw_exchange(broker, b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 4000) == b""

    assert http_status(metrics_url(broker)) == 200
    listed = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert listed.list_topics(timeout=10).brokers  # the Kafka listener serves on


async def test_no_metrics_endpoint_unless_configured(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    with pytest.raises(LookupError):
        metrics_url(broker)


def test_request_time_includes_sending_the_response(broker_factory: BrokerFactory) -> None:
    """A fetch whose reader does not read: the request is timed until its last byte is written
    (Kafka's TotalTimeMs), not until its response is encoded."""
    from riverbed.protocol import messages as m
    from riverbed.protocol.connection import ClientConnection

    broker = broker_factory({**WITH_METRICS, **SETTINGS})
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    value = b"x" * 100_000
    for _ in range(240):  # 24 MB: more than the kernel's socket buffers hold
        producer.produce("big", value, partition=0)
    assert producer.flush(FLUSH_TIMEOUT_S) == 0
    fetch = m.FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=64 * 1024 * 1024,
        topics=[
            m.FetchRequest.FetchTopic(
                topic="big",
                partitions=[
                    m.FetchRequest.FetchPartition(
                        partition=0, fetch_offset=0, partition_max_bytes=64 * 1024 * 1024
                    )
                ],
            )
        ],
    )
    _, request = ClientConnection(client_id="slow-reader").send_request(fetch, 4)
    slow_s = 2.0
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.connect((HOST, broker.port))
        sock.sendall(request)
        time.sleep(slow_s)  # the broker's send stalls on the full buffers meanwhile
        sock.settimeout(30)
        received = 0
        while received < len(value) * 240:
            chunk = sock.recv(1 << 20)
            assert chunk, "the broker closed the connection"
            received += len(chunk)
    deadline = time.monotonic() + 10
    while True:  # the observation follows the last byte's write
        metrics = scrape(broker)
        try:
            count = metrics.value("riverbed_request_duration_seconds_count", api="Fetch")
            under = metrics.value("riverbed_request_duration_seconds_bucket", api="Fetch", le="1.0")
            break
        except KeyError:
            assert time.monotonic() < deadline, "no Fetch was timed"
        time.sleep(0.1)
    assert count >= 1, (count, under)
    assert count - under >= 1, (count, under)
