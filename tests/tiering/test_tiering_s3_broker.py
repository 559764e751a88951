"""Tiering end to end with a real broker process and a real S3 HTTP endpoint (moto's standalone
server, through the broker's aiobotocore store): segments become objects and manifest versions
in the bucket, consumers read from offset 0 byte-exact; the server stopped for a while costs
produce and hot reads nothing and loses nothing; a broker killed in the middle of a multipart
upload leaves, after its restart, neither a gap nor an orphan (object or multipart upload)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Mapping
from typing import Any

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.metrics import WITH_METRICS, scrape
from tests.support.moto_server import MotoServer
from tests.tiering.conftest import MotoServerFactory
from tests.tiering.test_tiering_broker import (
    EXPECTED,
    RECORDS,
    TIERED_TOPIC,
    check_contiguous_from_zero,
    consume_with_confluent,
    read_all_from_zero,
    tiered_topic,
    wait_until,
)

ROOT = "tiered"  # the store's prefix in the bucket
S3_TIMEOUTS = {
    # A stopped server is noticed within a second or two per call, not botocore's minutes.
    "connect_timeout_ms": "1000",
    "request_timeout_ms": "5000",
    "retries": "2",
    "retry_backoff_ms": "100",
    "retry_backoff_max_ms": "500",
}
BROKER_SETTINGS = {
    "remote.log.manager.task.interval.ms": "200",
    "offsets.topic.replication.factor": "1",
    "zookeeper.session.timeout.ms": "6000",  # a killed broker re-registers sooner
}


class Bucket:
    """The store as the tests see it: straight from moto, not through the broker."""

    def __init__(self, server: MotoServer, name: str) -> None:
        self.server = server
        self.name = name

    def keys(self, prefix: str = "") -> list[str]:
        root = f"{ROOT}/"
        return [
            key[len(root) :] for key in self.server.keys(self.name) if key.startswith(root + prefix)
        ]

    def latest_manifest(self, topic: str) -> dict[str, Any] | None:
        versions = sorted(self.keys(f"{topic}/0/manifest/"))
        if not versions:
            return None
        manifest: dict[str, Any] = json.loads(
            self.server.get_object(self.name, f"{ROOT}/{versions[-1]}")
        )
        return manifest

    def current_manifest(self, topic: str) -> dict[str, Any]:
        """The latest manifest, which must exist by now."""
        manifest = self.latest_manifest(topic)
        assert manifest is not None, f"{topic}: no manifest in the bucket"
        return manifest

    def data_keys(self) -> set[str]:
        return {key for key in self.keys() if key.endswith(".parquet")}


def s3_broker(
    broker_factory: BrokerFactory,
    server: MotoServer,
    bucket: str,
    settings: Mapping[str, str] | None = None,
    **s3: str,
) -> BrokerProcess:
    return broker_factory(
        {
            "remote.storage.url": f"s3://{bucket}/{ROOT}",
            **server.settings(**S3_TIMEOUTS, **s3),
            **BROKER_SETTINGS,
            **(settings or {}),
        }
    )


def local_start(broker: BrokerProcess, topic: str) -> int:
    return int(broker.segment_files(topic, 0)[0].stem)


async def test_a_broker_tiers_to_s3_and_consumers_read_from_offset_zero(
    broker_factory: BrokerFactory, moto_server: MotoServer, s3_bucket: str
) -> None:
    broker = s3_broker(broker_factory, moto_server, s3_bucket)
    bucket = Bucket(moto_server, s3_bucket)
    topic = await tiered_topic(broker)
    await wait_until(lambda: local_start(broker, topic) > RECORDS // 2, "tiered to S3")
    await wait_until(
        lambda: (
            bool(bucket.data_keys())
            and bucket.data_keys() == {s["key"] for s in bucket.current_manifest(topic)["segments"]}
        ),
        "every uploaded object in the manifest",
    )
    done = check_contiguous_from_zero(bucket.latest_manifest(topic), bucket.data_keys())
    assert done[-1]["last_offset"] + 1 >= local_start(broker, topic)
    assert await read_all_from_zero(broker, topic) == EXPECTED
    assert await asyncio.to_thread(consume_with_confluent, broker.bootstrap, topic) == EXPECTED


def reported_backlogs(broker: BrokerProcess) -> list[int]:
    """backlog_bytes of every tiering.upload_failed line the broker logged so far."""
    failures = re.findall(
        r"event=tiering\.upload_failed .* backlog_bytes=(\d+) ", broker.log_path.read_text()
    )
    return [int(found) for found in failures]


async def test_s3_down_for_a_while_costs_produce_and_hot_reads_nothing_and_loses_nothing(
    broker_factory: BrokerFactory, moto_server_factory: MotoServerFactory
) -> None:
    server = moto_server_factory()
    bucket = Bucket(server, server.create_bucket("riverbed-outage"))
    broker = s3_broker(broker_factory, server, bucket.name, WITH_METRICS)
    server.stop()  # an outage from before the first upload
    topic = await tiered_topic(broker)  # every record acknowledged (acks=all)
    assert await read_all_from_zero(broker, topic) == EXPECTED  # hot reads: all local

    # Nothing deleted locally; the backlog is reported (log and metrics), growing with the
    # sealed segments.
    # A round that failed while the records were still being produced reports what was sealed
    # then (on a slow machine, nothing): wait for one that failed after.
    await wait_until(
        lambda: any(backlog > 0 for backlog in reported_backlogs(broker)),
        "a failed round reporting a backlog",
    )
    assert local_start(broker, topic) == 0
    assert len(broker.segment_files(topic, 0)) > 5
    sealed_bytes = sum(f.stat().st_size for f in broker.segment_files(topic, 0)[:-1])
    await wait_until(lambda: backlog_metric(broker, topic) == sealed_bytes, "backlog = sealed")
    down = scrape(broker)
    assert down.value("riverbed_tiering_upload_failures_total") > 0
    assert down.value("riverbed_tiering_uploaded_segments_total") == 0
    assert down.value("riverbed_remote_fetches_total") == 0  # every read so far was hot

    server.start()  # same endpoint, the bucket again (moto keeps nothing: it is empty)
    await wait_until(lambda: local_start(broker, topic) > RECORDS // 2, "uploads resumed")
    await wait_until(
        lambda: all(
            s["state"] == "COPY_FINISHED" for s in bucket.current_manifest(topic)["segments"]
        ),
        "no copy left unfinished",
    )
    check_contiguous_from_zero(bucket.latest_manifest(topic), bucket.data_keys())
    await wait_until(lambda: backlog_metric(broker, topic) == 0, "the backlog metric back at 0")
    segments = len(bucket.current_manifest(topic)["segments"])
    assert scrape(broker).value("riverbed_tiering_uploaded_segments_total") == segments

    assert await read_all_from_zero(broker, topic) == EXPECTED  # now mostly cold
    up = scrape(broker)
    assert up.value("riverbed_remote_fetches_total") > 0
    assert up.value("riverbed_remote_fetch_errors_total") == 0
    assert up.value("riverbed_remote_fetch_duration_seconds_count") == up.value(
        "riverbed_remote_fetches_total"
    )
    assert up.value("riverbed_remote_cache_misses_total") > 0
    # Each read counts the offsets it hands out: two full reads from zero, hot then cold.
    assert up.value("riverbed_topic_records_out_total", topic=topic, reader="consumer") == (
        2 * RECORDS
    )


def backlog_metric(broker: BrokerProcess, topic: str) -> float:
    return scrape(broker).value("riverbed_tiering_backlog_bytes", topic=topic, partition="0")


# Segments of incompressible values: objects of ~segment size, uploaded in 5 MiB parts (S3's
# smallest but the last).
MULTIPART_SEGMENT_BYTES = 12 * 1024 * 1024
MULTIPART_RECORDS = 5 * MULTIPART_SEGMENT_BYTES // 4096  # about 5 segments of 4 KiB records
MIB = 1024 * 1024
CATCH_TIMEOUT_S = 60.0
# How long moto gets to finish requests a frozen broker had already sent (a CompleteMultipartUpload
# in flight would otherwise finish the upload the test thinks it caught open: a CI flake).
IN_FLIGHT_SETTLE_S = 1.0


async def test_a_broker_killed_mid_multipart_upload_leaves_no_gap_and_no_orphan(
    broker_factory: BrokerFactory, moto_server: MotoServer, s3_bucket: str
) -> None:
    from riverbed.client.admin import Admin
    from riverbed.client.producer import Producer

    bucket = Bucket(moto_server, s3_bucket)
    broker = s3_broker(
        broker_factory,
        moto_server,
        s3_bucket,
        multipart_threshold_bytes=str(5 * MIB),
        multipart_part_bytes=str(5 * MIB),
    )
    topic = "multipart"
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        configs = {**TIERED_TOPIC, "segment.bytes": str(MULTIPART_SEGMENT_BYTES)}
        await admin.create_topic(topic, partitions=1, replication_factor=1, configs=configs)
    values = [os.urandom(4096) for _ in range(MULTIPART_RECORDS)]
    async with Producer(
        bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5, batch_size=1 << 20
    ) as producer:
        for value in values:
            await producer.send(topic, value, partition=0)
        await producer.flush()

    # Freeze the broker while one of its multipart uploads is open, then kill it: whatever it
    # had sent of that upload stays on the server, unfinished.
    deadline = time.monotonic() + CATCH_TIMEOUT_S
    while True:
        assert time.monotonic() < deadline, "never caught a multipart upload in flight"
        if await asyncio.to_thread(moto_server.multipart_uploads, s3_bucket):
            os.kill(broker.pid, signal.SIGSTOP)
            await asyncio.sleep(IN_FLIGHT_SETTLE_S)
            if await asyncio.to_thread(moto_server.multipart_uploads, s3_bucket):
                break
            os.kill(broker.pid, signal.SIGCONT)  # it finished meanwhile: catch the next one
        await asyncio.sleep(0.005)
    broker.kill()
    broker.restart()

    await wait_until(
        lambda: len(broker.segment_files(topic, 0)) == 1, "every sealed segment tiered"
    )
    await wait_until(
        lambda: not moto_server.multipart_uploads(s3_bucket), "the unfinished upload aborted"
    )
    manifest = bucket.latest_manifest(topic)
    check_contiguous_from_zero(manifest, bucket.data_keys())
    assert "removed 1 unfinished uploads" in broker.log_path.read_text()

    read = await asyncio.to_thread(consume_values, broker.bootstrap, topic, len(values))
    assert read == values


def consume_values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "multipart", "enable.auto.commit": False}
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + CATCH_TIMEOUT_S
        while len(out) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            assert message.offset() == len(out)
            value = message.value()
            assert value is not None
            out.append(value)
        return out
    finally:
        consumer.close()
