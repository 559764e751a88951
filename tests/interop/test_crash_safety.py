"""What a crash may and may not lose: an acknowledged record survives `kill -9`, and a torn tail
is cut back to the last whole batch on restart."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import confluent_kafka
from confluent_kafka import KafkaError

from tests.interop.disk import read_batches, read_partition
from tests.interop.drivers import ConfluentKafka, Message
from tests.support.broker import BrokerProcess

ACKED_BEFORE_KILL_MIN = 2_000
PRODUCE_PHASE_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 15.0
RECORD_PADDING = b"." * 200

DeliveryCallback = Callable[[KafkaError | None, confluent_kafka.Message], None]


def record_value(index: int) -> bytes:
    return b"%08d" % index + RECORD_PADDING


def record_index(value: bytes | None) -> int:
    assert value is not None
    return int(value[:8])


def test_acknowledged_records_survive_kill_9(broker: BrokerProcess, topic: str) -> None:
    client = ConfluentKafka(broker.bootstrap)
    assert client.create_topic(topic, 1) == 0
    acked: dict[int, int] = {}  # record index -> offset the broker acknowledged
    failed: list[int] = []
    producer = client.producer(
        **{
            "acks": "all",
            "linger.ms": 1,
            # One request in flight: a retried batch cannot overtake a later one, so acknowledged
            # offsets must grow with the record index.
            "max.in.flight.requests.per.connection": 1,
            "message.timeout.ms": 5_000,
        }
    )

    def on_delivery(index: int) -> DeliveryCallback:
        def report(error: KafkaError | None, record: confluent_kafka.Message) -> None:
            offset = record.offset()
            if error is None and offset is not None:
                acked[index] = offset
            else:
                failed.append(index)

        return report

    deadline = time.monotonic() + PRODUCE_PHASE_TIMEOUT_S
    index = 0
    while len(acked) < ACKED_BEFORE_KILL_MIN:
        assert time.monotonic() < deadline, f"only {len(acked)} acks, failed: {failed[:5]}"
        try:
            producer.produce(
                topic, record_value(index), partition=0, on_delivery=on_delivery(index)
            )
            index += 1
        except BufferError:
            pass
        producer.poll(0.001 if index % 100 == 0 else 0)

    broker.kill()  # mid-stream: requests are in flight and the last batch may be half written
    producer.flush(DRAIN_TIMEOUT_S)  # the rest fail (message.timeout.ms) or were acked just now
    assert len(producer) == 0
    broker.restart()

    latest = client.earliest_latest(topic, 0)
    assert latest[0] == 0
    assert latest[1] >= len(acked)
    consumed = client.consume(topic, 0, 0, latest[1])
    assert [record.offset for record in consumed] == list(range(latest[1]))
    by_offset = {record.offset: record_index(record.message.value) for record in consumed}
    assert max(by_offset.values()) < index, "a record nobody produced"
    for acked_index, offset in acked.items():
        assert by_offset.get(offset) == acked_index, f"acked record {acked_index} at {offset}"
    acked_offsets = [acked[i] for i in sorted(acked)]
    assert acked_offsets == sorted(acked_offsets)
    assert client.produce(topic, 0, [Message(None, b"after", (), int(time.time() * 1000))]) == [
        latest[1]
    ]


def test_torn_tail_is_truncated_to_the_last_whole_batch(broker: BrokerProcess, topic: str) -> None:
    client = ConfluentKafka(broker.bootstrap)
    assert client.create_topic(topic, 1) == 0
    now_ms = int(time.time() * 1000)
    for batch in range(20):  # one produce call per batch
        messages = [Message(None, b"b%02d-%02d" % (batch, i), (), now_ms) for i in range(10)]
        assert client.produce(topic, 0, messages) == list(range(batch * 10, batch * 10 + 10))
    assert broker.terminate() == 0

    segment = broker.segment_files(topic, 0)[-1]
    batches, torn_bytes = read_batches(segment)
    assert torn_bytes == 0, "a clean shutdown left a partial batch"
    last = batches[-1]
    assert last.last_offset == 199
    with segment.open("r+b") as file:
        file.truncate(last.position + last.size_bytes // 2)
        os.fsync(file.fileno())

    broker.restart()

    assert client.earliest_latest(topic, 0) == (0, last.base_offset)
    consumed = client.consume(topic, 0, 0, last.base_offset)
    whole = [value for batch in batches[:-1] for value in batch.values]
    assert [record.message.value for record in consumed] == whole
    assert client.produce(topic, 0, [Message(None, b"after", (), now_ms)]) == [last.base_offset]
    # The torn bytes are gone, not skipped: the log reads back as whole batches end to end.
    stored = read_partition(broker.segment_files(topic, 0))
    assert all(batch.crc_ok for batch in stored)
    assert [batch.base_offset for batch in stored] == [
        *(batch.base_offset for batch in batches[:-1]),
        last.base_offset,
    ]
    assert stored[-1].values == (b"after",)
