"""A leader change in the middle of tiering, with three real brokers sharing one S3 bucket (moto's
server): the leader is frozen (SIGSTOP) after it committed a copy's COPY_STARTED and before the
object is written, a new leader is elected, continues from the manifest (cleaning up the copy it
inherited), and when the old leader wakes up it writes the object, too late, and its commit is
fenced. Nothing is lost, the manifest has no gap, no overlap and never goes back an epoch, and the
late object, referenced by no manifest, is deleted once remote.log.orphan.grace.ms has passed."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.producer import Producer
from riverbed.client.types import TopicPartition

from tests.support.cluster import ClusterFactory, partition_state, wait_for
from tests.support.moto_server import MotoServer
from tests.tiering.test_tiering_broker import TIERED_TOPIC, check_contiguous_from_zero
from tests.tiering.test_tiering_s3_broker import ROOT, S3_TIMEOUTS, Bucket

TOPIC = "handover"
CATCH_TIMEOUT_S = 60.0
ELECTION_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 60.0
VALUE_BYTES = 200
PUT_IN_FLIGHT_S = 0.2


def started_copy(bucket: Bucket) -> tuple[int, str] | None:
    """(version, key) of the latest manifest if its first copy started has no object yet: the
    leader is converting or uploading it, and a leader frozen there writes it after it wakes
    up, too late. Copies after it are recorded as started ahead of their turn; and when the
    first one's object is there, the leader is committing its COPY_FINISHED, a write that is
    only fenced (no late object)."""
    manifest = bucket.latest_manifest(TOPIC)
    if manifest is None:
        return None
    started = [s["key"] for s in manifest["segments"] if s["state"] == "COPY_STARTED"]
    if not started or started[0] in bucket.data_keys():
        return None
    return manifest["version"], started[0]


def manifest_epochs(bucket: Bucket) -> list[int]:
    """The leader epoch of every manifest version still in the bucket, oldest first."""
    keys = sorted(bucket.keys(f"{TOPIC}/0/manifest/"))
    return [
        json.loads(bucket.server.get_object(bucket.name, f"{ROOT}/{key}"))["leader_epoch"]
        for key in keys
    ]


async def test_a_new_leader_continues_from_the_manifest_and_the_old_ones_late_write_is_fenced(
    cluster_factory: ClusterFactory, moto_server: MotoServer, s3_bucket: str
) -> None:
    bucket = Bucket(moto_server, s3_bucket)
    cluster = await cluster_factory(
        3,
        {
            "remote.storage.url": f"s3://{s3_bucket}/{ROOT}",
            **moto_server.settings(**S3_TIMEOUTS),
            "remote.log.manager.task.interval.ms": "200",
            "remote.log.orphan.grace.ms": "1000",
            "zookeeper.session.timeout.ms": "6000",
        },
    )
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(
            TOPIC,
            partitions=1,
            replication_factor=3,
            configs={**TIERED_TOPIC, "min.insync.replicas": "2"},
        )
    before = await partition_state(cluster.bootstrap, TOPIC, 0)

    # Produce until the leader is caught with a copy started and not finished, then freeze it.
    values: list[bytes] = []
    async with Producer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=5) as producer:
        deadline = time.monotonic() + CATCH_TIMEOUT_S
        while True:
            assert time.monotonic() < deadline, "never caught the leader mid-copy"
            batch = [os.urandom(VALUE_BYTES // 2).hex().encode() for _ in range(200)]
            futures = [await producer.send(TOPIC, value, partition=0) for value in batch]
            await producer.flush()
            for future in futures:
                await future
            values += batch
            caught = await asyncio.to_thread(started_copy, bucket)
            if caught is None:
                continue
            cluster.pause(before.leader)
            await asyncio.sleep(PUT_IN_FLIGHT_S)  # a request sent in full still lands
            if await asyncio.to_thread(started_copy, bucket) == caught:
                break  # frozen with that copy unfinished
            cluster.resume(before.leader)

    async def new_leader() -> Any:
        state = await partition_state(cluster.bootstrap, TOPIC, 0)
        return state if state.leader not in (-1, before.leader) else None

    after = await wait_for(new_leader, ELECTION_TIMEOUT_S, what="a new leader")
    assert after.leader_epoch > before.leader_epoch

    # The new leader took over the manifest at its epoch and went on from where it ended.
    def taken_over() -> bool:
        manifest = bucket.latest_manifest(TOPIC)
        return manifest is not None and manifest["leader_epoch"] == after.leader_epoch

    await wait_for(taken_over, SETTLE_TIMEOUT_S, what="the manifest at the new epoch")

    cluster.resume(before.leader)
    old_log = cluster.brokers[before.leader].log_path
    await wait_for(
        lambda: "tiering fenced" in old_log.read_text(),
        SETTLE_TIMEOUT_S,
        what="the old leader's late write fenced",
    )

    # The old leader's late object, past the grace, is deleted by the new leader.
    new_log = cluster.brokers[after.leader].log_path
    await wait_for(
        lambda: "deleted 1 orphaned objects" in new_log.read_text(),
        SETTLE_TIMEOUT_S,
        what="the late object deleted as an orphan",
    )

    # Settled: every object in the bucket is in the manifest (a late object of the old leader
    # is deleted once past the grace), all of it finished, contiguous from 0.
    def settled() -> bool:
        manifest = bucket.latest_manifest(TOPIC)
        return (
            manifest is not None
            and bool(manifest["segments"])
            and all(s["state"] == "COPY_FINISHED" for s in manifest["segments"])
            and bucket.data_keys() == {s["key"] for s in manifest["segments"]}
        )

    await wait_for(settled, SETTLE_TIMEOUT_S, what="no orphan and no unfinished copy")
    check_contiguous_from_zero(bucket.latest_manifest(TOPIC), bucket.data_keys())
    epochs = manifest_epochs(bucket)
    assert epochs == sorted(epochs)
    assert epochs[-1] == after.leader_epoch

    # Every acknowledged record, once, in order, byte-exact, read from offset 0.
    seen: list[bytes | None] = []
    async with Consumer(bootstrap_servers=cluster.bootstrap) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        await consumer.seek_to_beginning()
        while len(seen) < len(values):
            batches = await consumer.getmany(timeout_ms=5000)
            assert batches, f"stalled after {len(seen)} records"
            for records in batches.values():
                assert [r.offset for r in records] == list(
                    range(len(seen), len(seen) + len(records))
                )
                seen += [r.value for r in records]
    assert seen == values
