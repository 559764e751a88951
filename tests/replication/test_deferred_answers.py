"""acks=all answers that wait for a follower leave in request order on a real cluster: the fast
requests pipelined behind them on the same connection do not overtake them, and every one is
answered once the ISR lets the appends commit."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Final

from riverbed import Admin, Producer

from tests.interop import wire
from tests.support.cluster import ClusterFactory, partition_state

SETTINGS: Final = {
    # The frozen follower leaves the ISR after 2 s, which commits the waiting appends.
    "replica.lag.time.max.ms": "2000",
    "zookeeper.session.timeout.ms": "6000",
}
ROUNDS: Final = 3


async def test_answers_waiting_for_a_frozen_follower_keep_request_order(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(3, SETTINGS)
    topic = f"d-{uuid.uuid4().hex[:8]}"
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(topic, partitions=1, replication_factor=3)
    # A first record with acks=all: the leader leads and every follower copies before one is
    # frozen (the leader's own metadata can trail the controller's answer to CreateTopics, and
    # a produce reaching it before it leads is refused at once rather than deferred).
    async with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        await (await producer.send(topic, b"first", partition=0))
    state = await partition_state(cluster.bootstrap, topic, 0)
    follower = next(r for r in state.replicas if r != state.leader)
    batch = wire.record_batch([b"deferred"], timestamp_ms=int(time.time() * 1000))
    requests: list[bytes] = []
    produce_ids: list[int] = []
    for _ in range(ROUNDS):
        produce_ids.append(len(requests) + 1)
        requests += [
            wire.produce_request_v3(len(requests) + 1, topic, 0, batch),  # waits: deferred
            wire.api_versions_request(len(requests) + 2, 0),  # answered at once by itself
            wire.metadata_request_v1(len(requests) + 3),
        ]

    cluster.pause(follower)
    try:

        def exchange() -> tuple[list[tuple[int, bytes]], float]:
            with wire.connect(cluster.brokers[state.leader].bootstrap) as sock:
                started = time.monotonic()
                sock.sendall(b"".join(requests))
                first = wire.read_response(sock)
                waited_s = time.monotonic() - started
                return [first] + [wire.read_response(sock) for _ in requests[1:]], waited_s

        responses, waited_s = await asyncio.to_thread(exchange)
    finally:
        cluster.resume(follower)
    assert [correlation_id for correlation_id, _ in responses] == list(range(1, len(requests) + 1))
    # The first answer is the produce's, and it waited for the ISR to shrink.
    assert waited_s >= 1.0
    assert wire.produced(responses, produce_ids) == [
        [(wire.ERROR_NONE, offset)] for offset in range(1, ROUNDS + 1)
    ]
