"""SIGTERM while ZooKeeper is down: the broker still stops, promptly and cleanly.

A stopping broker first asks the controller to move its leaderships away (controlled shutdown).
With ZooKeeper down the controller cannot write the new leaders, so every attempt must end
with an answer within the ZooKeeper session timeout, not wait for ZooKeeper to return; after
its attempts the broker stops anyway (Kafka's controlled.shutdown.max.retries) with exit code 0.
Both paths are tested: the stopping broker asks another broker's controller, and the stopping
broker is the controller itself. Once ZooKeeper is back, the broker that stayed up still has
every acknowledged record.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

import pytest
from riverbed import Consumer, Producer, TopicPartition
from riverbed.broker.controlled_shutdown import (
    CONTROLLED_SHUTDOWN_ATTEMPTS_MAX,
    CONTROLLED_SHUTDOWN_RETRY_BACKOFF_MS,
)
from riverbed.client.admin import Admin

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.cluster import wait_for
from tests.support.zookeeper import DedicatedZooKeeper, restart_proof_connect

SESSION_TIMEOUT_MS: Final = 4_000
TOPIC: Final = "kept"
VALUES: Final = [f"v{i}".encode() for i in range(20)]
# Every attempt answered within the session timeout, the backoffs between them, and what the
# rest of a stop takes on a loaded CI machine.
STOP_BOUND_S: Final = (
    CONTROLLED_SHUTDOWN_ATTEMPTS_MAX * SESSION_TIMEOUT_MS
    + (CONTROLLED_SHUTDOWN_ATTEMPTS_MAX - 1) * CONTROLLED_SHUTDOWN_RETRY_BACKOFF_MS
) / 1000 + 8.0
# Without the bound an attempt waits 30 s (controller.socket.timeout.ms): three are 90 s.
STOP_WAIT_S: Final = 120.0


@pytest.fixture
def zk_connect(own_zookeeper: DedicatedZooKeeper) -> str:
    return restart_proof_connect(own_zookeeper.server, "/stop-outage")


async def controller_id(bootstrap: str) -> int:
    async with Admin(bootstrap_servers=bootstrap) as admin:
        return (await admin.describe_cluster()).controller_id


async def read_all(broker: BrokerProcess) -> list[bytes]:
    read: list[bytes] = []
    async with Consumer(bootstrap_servers=broker.bootstrap) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        await consumer.seek_to_beginning()
        async with asyncio.timeout(60):
            while len(read) < len(VALUES):
                batches = await consumer.getmany(timeout_ms=500)
                read.extend(r.value or b"" for records in batches.values() for r in records)
    return read


@pytest.mark.parametrize("stopping", ["controller", "other"])
async def test_sigterm_while_zookeeper_is_down_stops_within_the_bound(
    broker_factory: BrokerFactory, own_zookeeper: DedicatedZooKeeper, stopping: str
) -> None:
    settings = {"zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS)}
    brokers = {i: broker_factory(settings, broker_id=i) for i in (1, 2)}
    bootstrap = brokers[1].bootstrap
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=1, replication_factor=2)
    async with Producer(bootstrap_servers=bootstrap, acks="all") as producer:
        for value in VALUES:
            await producer.send(TOPIC, value, partition=0)
        await producer.flush()

    async def elected() -> int | None:
        active = await controller_id(bootstrap)
        return active if active in brokers else None

    active = await wait_for(elected, 30, what="a controller among the brokers")
    stopped = active if stopping == "controller" else next(i for i in brokers if i != active)
    kept = next(i for i in brokers if i != stopped)

    await own_zookeeper.stop()
    started = time.monotonic()
    exit_code = await asyncio.to_thread(brokers[stopped].terminate, STOP_WAIT_S)
    took_s = time.monotonic() - started
    assert exit_code == 0, brokers[stopped].log_tail()
    log = brokers[stopped].log_tail(400)
    assert took_s < STOP_BOUND_S, (took_s, log)
    # Each attempt ended at the bound: the remote controller's answer, or our own controller's.
    # Our own controller may also see ZooKeeper go while an attempt's write is on the wire: kazoo
    # then fails it at once with ConnectionLoss, which ends that attempt early, not late.
    ended = (
        (f"no answer within {SESSION_TIMEOUT_MS} ms", "ZooKeeper connection lost mid-request")
        if stopping == "controller"
        else (f"controller {active} answered REQUEST_TIMED_OUT",)
    )
    attempts = [line for line in log.splitlines() if "controlled shutdown attempt" in line]
    assert len(attempts) == CONTROLLED_SHUTDOWN_ATTEMPTS_MAX, log
    assert all(any(reason in line for reason in ended) for line in attempts), log
    assert f"controlled shutdown of broker {stopped} failed; stopping anyway" in log

    await own_zookeeper.start()
    assert await read_all(brokers[kept]) == VALUES
