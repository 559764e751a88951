"""A full disk is not a failed disk: the broker answers KAFKA_STORAGE_ERROR to the produce that
does not fit and keeps serving, its flushes and checkpoints are tried again until there is room,
and then everything goes on. (A failed disk stops the broker:
tests/replication/test_fault_disk_failure.py.)

The broker's data dir is a real tmpfs that fills up (tests/faults/disks.py), so its writes get
ENOSPC from the kernel.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Final

from riverbed.client.admin import Admin
from riverbed.client.connection import BrokerConnection
from riverbed.hot.storage.checkpoint import read_offset_checkpoint
from riverbed.hot.storage.log_manager import RECOVERY_POINT_CHECKPOINT_FILE
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records import encode_batch

from tests.faults.disks import FullDisk
from tests.support.broker import HOST, BrokerProcess
from tests.support.cluster import wait_for

DISK_SIZE_BYTES: Final = 8 << 20
TOPIC: Final = "full"
# More than a page: a batch that needs room the full tmpfs does not have.
BIG_VALUE: Final = b"x" * 16384
# The broker checks due flushes every second and writes checkpoints every 5 s: each has failed
# on the full disk within this, and has succeeded again this long after room is back.
LOOP_FAILED_TIMEOUT_S: Final = 15.0


async def produce(connection: BrokerConnection, value: bytes) -> tuple[int, int]:
    """(error code, base offset) of one record produced to partition 0."""
    batch = encode_batch([(None, value, (), int(time.time() * 1000))])
    request = m.ProduceRequest(
        acks=-1,
        timeout_ms=5000,
        topic_data=[
            m.ProduceRequest.TopicProduceData(
                name=TOPIC,
                partition_data=[m.ProduceRequest.PartitionProduceData(index=0, records=batch)],
            )
        ],
    )
    response: m.ProduceResponse = await connection.request(request)
    partition = response.responses[0].partition_responses[0]
    return partition.error_code, partition.base_offset


async def test_a_full_disk_refuses_writes_and_the_broker_serves_on(
    zk_connect: str, tmp_path: Path
) -> None:
    broker = BrokerProcess(
        broker_id=1, zk_connect=zk_connect, data_dir=tmp_path / "data", log_dir=tmp_path
    )

    async def logged(text: str) -> bool:
        return text in broker.log_path.read_text(errors="replace")

    def recovery_point() -> int | None:
        checkpoint = read_offset_checkpoint(broker.data_dir / RECOVERY_POINT_CHECKPOINT_FILE)
        return checkpoint.get((TOPIC, 0))

    with FullDisk(broker.data_dir, DISK_SIZE_BYTES) as disk:
        broker.start()
        try:
            await asyncio.to_thread(broker.wait_ready)
            admin = Admin(bootstrap_servers=broker.bootstrap)
            connection = await BrokerConnection.open(HOST, broker.port)
            try:
                # No flush.ms yet: the record's leader epoch is in memory only, and the first
                # flush must write its checkpoint file, which the full disk refuses.
                await admin.create_topic(TOPIC, partitions=1, replication_factor=1)
                assert await produce(connection, b"before") == (ErrorCode.NONE, 0)
                disk.fill()
                code, _ = await produce(connection, BIG_VALUE)
                assert code == ErrorCode.KAFKA_STORAGE_ERROR
                await admin.alter_configs(TOPIC, set={"flush.ms": "100"})
                for failure in ("flush failed", "writing the checkpoints"):
                    await wait_for(lambda f=failure: logged(f), LOOP_FAILED_TIMEOUT_S, what=failure)
                assert broker.running, broker.describe_log()

                disk.free()
                await wait_for(
                    lambda: recovery_point() == 1,
                    LOOP_FAILED_TIMEOUT_S,
                    what="a flush and a checkpoint after room is back",
                )
                assert await produce(connection, b"after") == (ErrorCode.NONE, 1)
            finally:
                await connection.close()
                await admin.close()
            assert not await logged("log_dir_failed")
            assert not await logged("is offline")
        finally:
            broker.kill()  # before the unmount: the broker holds files there
