"""Bytes no client would send: each bad connection is closed (or gets CORRUPT_MESSAGE), nothing is
appended, memory stays bounded, and a well-behaved client on another connection never notices."""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections.abc import Iterator

import confluent_kafka
import pytest

from tests.interop import wire
from tests.interop.drivers import ConfluentKafka
from tests.support.broker import BrokerFactory, BrokerProcess

MIB = 1 << 20
RSS_GROWTH_BYTES_MAX = 50 * MIB
FLOOD_BYTES = 64 * MIB  # more than the RSS bound: a broker that buffers it all fails the test
FLOOD_CHUNK_BYTES = MIB
TRAFFIC_INTERVAL_S = 0.02
TRAFFIC_STOP_TIMEOUT_S = 20.0
TRAFFIC_ACKS_PER_CHECK = 5
UNKNOWN_API_KEY = 32_000
RANDOM_SEEDS = range(8)


class HealthyTraffic:
    """A well-behaved producer on its own connection, sending while the test misbehaves."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.client = ConfluentKafka(bootstrap)
        self.topic = topic
        self.sent = 0
        self.acked: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="healthy-traffic", daemon=True)

    def __enter__(self) -> HealthyTraffic:
        self._thread.start()
        self.wait_for_more_acks()  # flowing before the first attack
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self.wait_for_more_acks()  # still flowing after the last one
        finally:
            self._stop.set()
            self._thread.join(TRAFFIC_STOP_TIMEOUT_S)

    def wait_for_more_acks(self) -> None:
        target = len(self.acked) + TRAFFIC_ACKS_PER_CHECK
        deadline = time.monotonic() + TRAFFIC_STOP_TIMEOUT_S
        while len(self.acked) < target:
            assert time.monotonic() < deadline, f"healthy producer stalled: {self.errors[:3]}"
            time.sleep(TRAFFIC_INTERVAL_S)

    def _run(self) -> None:
        producer = self.client.producer(**{"acks": "all", "linger.ms": 0})
        while not self._stop.is_set():
            producer.produce(self.topic, b"%d" % self.sent, partition=0, on_delivery=self._report)
            self.sent += 1
            producer.poll(TRAFFIC_INTERVAL_S)
        producer.flush(TRAFFIC_STOP_TIMEOUT_S)

    def _report(self, error: confluent_kafka.KafkaError | None, _: confluent_kafka.Message) -> None:
        if error is None:
            self.acked.append(1)
        else:
            self.errors.append(str(error))

    def check(self) -> None:
        """Every record was acknowledged and reads back in order."""
        assert not self._thread.is_alive(), "traffic thread did not stop"
        assert self.errors == []
        assert self.sent > 0
        assert len(self.acked) == self.sent
        consumed = self.client.consume(self.topic, 0, 0, self.sent)
        assert [record.message.value for record in consumed] == [
            b"%d" % i for i in range(self.sent)
        ]


@pytest.fixture
def traffic(broker: BrokerProcess, topic: str) -> Iterator[HealthyTraffic]:
    healthy_topic = f"{topic}-healthy"
    assert ConfluentKafka(broker.bootstrap).create_topic(healthy_topic, 1) == 0
    with HealthyTraffic(broker.bootstrap, healthy_topic) as running:
        yield running
    running.check()


@pytest.fixture
def bystander(broker: BrokerProcess) -> Iterator[socket.socket]:
    """A raw connection opened before the attacks; it must keep working through them."""
    with wire.connect(broker.bootstrap) as sock:
        yield sock


def assert_still_answers(sock: socket.socket, correlation_id: int) -> None:
    sock.sendall(wire.api_versions_request(correlation_id, 0))
    answered, body = wire.read_response(sock)
    assert answered == correlation_id
    assert wire.parse_api_versions_v0(body).error_code == wire.ERROR_NONE


def flood(sock: socket.socket, total_bytes: int) -> None:
    """Send zeros until `total_bytes` or until the peer stops taking them."""
    chunk = bytes(FLOOD_CHUNK_BYTES)
    sock.settimeout(wire.IO_TIMEOUT_S)
    try:
        for _ in range(total_bytes // FLOOD_CHUNK_BYTES):
            sock.sendall(chunk)
    except (ConnectionError, TimeoutError):
        pass


@pytest.mark.parametrize("size", [0x7FFFFFFF, -1, -0x80000000], ids=hex)
def test_absurd_length_prefix_closes_without_buffering(
    broker: BrokerProcess,
    traffic: HealthyTraffic,
    bystander: socket.socket,
    size: int,
) -> None:
    rss_before = broker.rss_bytes()
    with wire.connect(broker.bootstrap) as sock:
        sock.sendall(struct.pack(">i", size))
        flood(sock, FLOOD_BYTES)
        assert wire.closed_by_peer(sock)
    assert broker.rss_bytes() - rss_before < RSS_GROWTH_BYTES_MAX
    assert_still_answers(bystander, 1)


def test_length_over_socket_request_max_bytes_closes(broker_factory: BrokerFactory) -> None:
    limit = MIB
    broker = broker_factory({"socket.request.max.bytes": str(limit)})
    with wire.connect(broker.bootstrap) as sock:
        sock.sendall(struct.pack(">i", limit + 1))
        assert wire.closed_by_peer(sock)
    with wire.connect(broker.bootstrap) as sock:
        assert_still_answers(sock, 1)


def test_random_bytes_close_the_connection(
    broker: BrokerProcess, traffic: HealthyTraffic, bystander: socket.socket
) -> None:
    for seed in RANDOM_SEEDS:
        rng = random.Random(seed)
        with wire.connect(broker.bootstrap) as sock:
            sock.sendall(rng.randbytes(4096))
            sock.shutdown(socket.SHUT_WR)
            assert wire.closed_by_peer(sock), f"seed {seed}"
        # A plausible length, then garbage: the broker has the whole frame and must reject it.
        garbage = struct.pack(">hh", UNKNOWN_API_KEY, rng.randrange(1 << 15)) + rng.randbytes(200)
        with wire.connect(broker.bootstrap) as sock:
            sock.sendall(struct.pack(">i", len(garbage)) + garbage)
            assert wire.closed_by_peer(sock), f"seed {seed}"
        assert_still_answers(bystander, seed)


def test_truncated_frames_then_close(
    broker: BrokerProcess, traffic: HealthyTraffic, bystander: socket.socket
) -> None:
    whole = wire.api_versions_request(1, 0)
    for cut in (1, 3, 4, 6, 10, len(whole) - 1):
        with wire.connect(broker.bootstrap) as sock:
            sock.sendall(whole[:cut])
        assert_still_answers(bystander, cut)


def test_unknown_api_key_closes_the_connection(
    broker: BrokerProcess, traffic: HealthyTraffic, bystander: socket.socket
) -> None:
    with wire.connect(broker.bootstrap) as sock:
        sock.sendall(wire.request(UNKNOWN_API_KEY, 0, 1, b""))
        assert wire.closed_by_peer(sock)
    assert_still_answers(bystander, 2)


def test_produce_with_bad_crc_gets_corrupt_message_and_appends_nothing(
    broker: BrokerProcess, traffic: HealthyTraffic, topic: str
) -> None:
    client = ConfluentKafka(broker.bootstrap)
    assert client.create_topic(topic, 1) == 0
    batch = wire.record_batch([b"first", b"second"], timestamp_ms=int(time.time() * 1000))
    corrupt = batch[:-1] + bytes([batch[-1] ^ 0xFF])  # inside the CRC-covered records

    with wire.connect(broker.bootstrap) as sock:
        sock.sendall(wire.produce_request_v3(1, topic, 0, corrupt))
        correlation_id, body = wire.read_response(sock)
        assert correlation_id == 1
        (result,) = wire.parse_produce_response_v3(body)
        assert result.error_code == wire.ERROR_CORRUPT_MESSAGE
        assert client.earliest_latest(topic, 0) == (0, 0)

        # The connection is still in sync: the intact batch is taken, at offset 0.
        sock.sendall(wire.produce_request_v3(2, topic, 0, batch))
        correlation_id, body = wire.read_response(sock)
        assert correlation_id == 2
        (result,) = wire.parse_produce_response_v3(body)
        assert (result.error_code, result.base_offset) == (wire.ERROR_NONE, 0)
    assert client.earliest_latest(topic, 0) == (0, 2)
