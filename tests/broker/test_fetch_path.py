"""The fetch path seen from the wire: long-polling, KIP-74 and zero-copy sendfile."""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Final

from riverbed.client.admin import Admin
from riverbed.client.connection import BrokerConnection
from riverbed.protocol import messages as m
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import encode_batch

from tests.support.batches import records_in
from tests.support.broker import HOST, BrokerProcess

# How long a fetch with nothing to return must stay unanswered: an answer at once (min_bytes not
# honoured) arrives within a round trip; the wait is the subject, not a condition to poll for.
PARKED_S: Final = 1.0
# strace attaches to each thread of the broker in turn (ptrace), then says so.
STRACE_ATTACH_TIMEOUT_S: Final = 30.0
STRACE_STOP_TIMEOUT_S: Final = 10.0


async def _produce(connection: BrokerConnection, topic: str, values: list[bytes]) -> int:
    batch = encode_batch([(None, v, (), int(time.time() * 1000)) for v in values])
    response = await connection.request(
        m.ProduceRequest(
            acks=-1,
            timeout_ms=5000,
            topic_data=[
                m.ProduceRequest.TopicProduceData(
                    name=topic,
                    partition_data=[m.ProduceRequest.PartitionProduceData(index=0, records=batch)],
                )
            ],
        )
    )
    partition = response.responses[0].partition_responses[0]
    assert partition.error_code == 0, partition
    base_offset: int = partition.base_offset
    return base_offset


def _fetch(
    topic: tuple[str, uuid.UUID],
    offset: int,
    *,
    max_wait_ms: int,
    min_bytes: int = 1,
    partition_max_bytes: int,
) -> m.FetchRequest:
    # Both name (Fetch v4-12) and id (v13+): the connection picks the version.
    return m.FetchRequest(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=partition_max_bytes,
        session_epoch=-1,
        topics=[
            m.FetchRequest.FetchTopic(
                topic=topic[0],
                topic_id=topic[1],
                partitions=[
                    m.FetchRequest.FetchPartition(
                        partition=0, fetch_offset=offset, partition_max_bytes=partition_max_bytes
                    )
                ],
            )
        ],
    )


async def _create_topic(broker: BrokerProcess, name: str) -> tuple[str, uuid.UUID]:
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        return name, await admin.create_topic(name, partitions=1)


def _fetched_records(response: m.FetchResponse) -> bytes:
    records = response.responses[0].partitions[0].records
    assert isinstance(records, (bytes, memoryview))
    return bytes(records)


async def test_fetch_parks_until_data_arrives(broker: BrokerProcess) -> None:
    topic = await _create_topic(broker, "parked")
    connection = await BrokerConnection.open(HOST, broker.port)
    consumer = await BrokerConnection.open(HOST, broker.port)
    try:
        started = time.monotonic()
        # The broker must hold this request (min_bytes=1, nothing there) rather than answer.
        waiting = asyncio.create_task(
            consumer.request(_fetch(topic, 0, max_wait_ms=20_000, partition_max_bytes=1 << 20))
        )
        await asyncio.sleep(PARKED_S)
        assert not waiting.done(), waiting.result()
        await _produce(connection, "parked", [b"wake up"])
        response = await asyncio.wait_for(waiting, 5)
        assert time.monotonic() - started < 10, "woken by the append, not by max_wait_ms"
        records = records_in(TopicPartition(topic[0], 0), _fetched_records(response))
        assert [r.value for r in records] == [b"wake up"]
    finally:
        await connection.close()
        await consumer.close()


async def test_fetch_with_no_data_answers_at_max_wait(broker: BrokerProcess) -> None:
    topic = await _create_topic(broker, "idle")
    connection = await BrokerConnection.open(HOST, broker.port)
    try:
        started = time.monotonic()
        response = await connection.request(
            _fetch(topic, 0, max_wait_ms=700, partition_max_bytes=1 << 20)
        )
        elapsed_s = time.monotonic() - started
        assert 0.6 <= elapsed_s < 5, elapsed_s
        assert _fetched_records(response) == b""
        assert response.responses[0].partitions[0].high_watermark == 0
    finally:
        await connection.close()


async def test_a_batch_larger_than_max_bytes_is_returned_whole(broker: BrokerProcess) -> None:
    topic = await _create_topic(broker, "big")
    connection = await BrokerConnection.open(HOST, broker.port)
    try:
        big_value = bytes(range(256)) * 400  # ~100 KiB, one batch
        await _produce(connection, "big", [big_value])
        response = await connection.request(
            _fetch(topic, 0, max_wait_ms=0, min_bytes=0, partition_max_bytes=1024)
        )
        records = records_in(TopicPartition(topic[0], 0), _fetched_records(response))
        assert [r.value for r in records] == [big_value]
    finally:
        await connection.close()


def wait_until_attached(tracer: subprocess.Popen[bytes]) -> None:
    """Return once strace reports it is attached: it says so once every thread of the process
    is (`Process N attached with M threads`), so no system call after that goes untraced."""
    assert tracer.stderr is not None
    said = b""
    deadline = time.monotonic() + STRACE_ATTACH_TIMEOUT_S
    while b" attached" not in said:
        remaining_s = deadline - time.monotonic()
        assert remaining_s > 0, f"strace not attached in {STRACE_ATTACH_TIMEOUT_S} s: {said!r}"
        if select.select([tracer.stderr], [], [], remaining_s)[0]:
            chunk = os.read(tracer.stderr.fileno(), 4096)
            assert chunk, f"strace exited before attaching: {said!r}"
            said += chunk


def test_fetched_record_bytes_go_through_sendfile(broker: BrokerProcess, tmp_path: Path) -> None:
    """Attach strace to the broker and check the consumed bytes left through sendfile(2)."""
    lines = [b"%08d" % i + b"x" * 92 for i in range(50_000)]  # 100-byte values, ~5 MB
    subprocess.run(
        ["kcat", "-P", "-b", broker.bootstrap, "-t", "zero-copy", "-z", "none"],
        input=b"\n".join(lines) + b"\n",
        check=True,
        timeout=60,
    )
    trace = tmp_path / "strace.out"
    tracer = subprocess.Popen(
        ["strace", "-f", "-e", "trace=sendfile", "-p", str(broker.pid), "-o", str(trace)],
        stderr=subprocess.PIPE,
    )
    try:
        wait_until_attached(tracer)
        consumed = subprocess.run(
            [
                "kcat",
                "-C",
                "-b",
                broker.bootstrap,
                "-t",
                "zero-copy",
                "-o",
                "beginning",
                "-e",
                "-q",
            ],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.communicate(timeout=STRACE_STOP_TIMEOUT_S)  # its detach messages drained
    assert consumed.splitlines() == lines
    sent_bytes = sum(int(n) for n in re.findall(r"sendfile\(.*\) = (\d+)", trace.read_text()))
    assert sent_bytes >= 5_000_000, f"only {sent_bytes} bytes went through sendfile"
