"""Transactional offset commits in a real broker, driven by raw requests.

TxnOffsetCommit is sent as a transactional producer sends it (Riverbed's own connection, at the
version it negotiates: v3), and WriteTxnMarkers as a transaction coordinator sends it to the
leader of the group's `__consumer_offsets` partition; OffsetFetch (v8) then shows what a
consumer would see, with and without require_stable. Every error code stays visible this way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Final

from riverbed.broker.groups.offsets_topic import OFFSETS_TOPIC, partition_for
from riverbed.client.connection import BrokerConnection
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import TopicPartition

from tests.groups.test_coordinator_broker import (
    OFFSETS_PARTITIONS,
    ORDERS_0,
    ORDERS_1,
    SETTINGS,
    commit,
    connect,
    create_orders,
    fetch_when_ready,
    find_coordinator,
)
from tests.support.broker import BrokerFactory

GROUP: Final = "txn-group"
OFFSETS_INDEX: Final = partition_for(GROUP, OFFSETS_PARTITIONS)
COORDINATOR_EPOCH: Final = 0
NO_GENERATION: Final = -1

# (error, offset) per partition
Fetched = dict[TopicPartition, tuple[ErrorCode, int]]


async def txn_commit(
    connection: BrokerConnection,
    producer_id: int,
    offsets: Mapping[TopicPartition, int],
    *,
    producer_epoch: int = 0,
    group_id: str = GROUP,
) -> dict[TopicPartition, ErrorCode]:
    by_topic: dict[str, list[m.TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition]] = {}
    for tp, offset in offsets.items():
        by_topic.setdefault(tp.topic, []).append(
            m.TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition(
                partition_index=tp.partition, committed_offset=offset, committed_metadata="txn"
            )
        )
    request = m.TxnOffsetCommitRequest(
        transactional_id=f"tid-{producer_id}",
        group_id=group_id,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        generation_id=NO_GENERATION,
        topics=[
            m.TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name=name, partitions=partitions)
            for name, partitions in by_topic.items()
        ],
    )
    response = await connection.call(request, m.TxnOffsetCommitResponse)
    return {
        TopicPartition(topic.name, p.partition_index): ErrorCode(p.error_code)
        for topic in response.topics
        for p in topic.partitions
    }


async def write_marker(
    connection: BrokerConnection, producer_id: int, *, committed: bool, producer_epoch: int = 0
) -> ErrorCode:
    """WriteTxnMarkers for the group's __consumer_offsets partition, as a coordinator sends it."""
    request = m.WriteTxnMarkersRequest(
        markers=[
            m.WriteTxnMarkersRequest.WritableTxnMarker(
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                transaction_result=committed,
                topics=[
                    m.WriteTxnMarkersRequest.WritableTxnMarkerTopic(
                        name=OFFSETS_TOPIC, partition_indexes=[OFFSETS_INDEX]
                    )
                ],
                coordinator_epoch=COORDINATOR_EPOCH,
            )
        ]
    )
    response = await connection.call(request, m.WriteTxnMarkersResponse)
    ((code,),) = [[p.error_code for t in r.topics for p in t.partitions] for r in response.markers]
    return ErrorCode(code)


async def fetch(
    connection: BrokerConnection, partitions: Sequence[TopicPartition], *, require_stable: bool
) -> Fetched:
    request = m.OffsetFetchRequest(
        require_stable=require_stable,
        groups=[
            m.OffsetFetchRequest.OffsetFetchRequestGroup(
                group_id=GROUP,
                topics=[
                    m.OffsetFetchRequest.OffsetFetchRequestTopics(
                        name=tp.topic, partition_indexes=[tp.partition]
                    )
                    for tp in partitions
                ],
            )
        ],
    )
    response = await connection.call(request, m.OffsetFetchResponse)
    (group,) = response.groups
    assert group.error_code == ErrorCode.NONE
    return {
        TopicPartition(topic.name, p.partition_index): (ErrorCode(p.error_code), p.committed_offset)
        for topic in group.topics
        for p in topic.partitions
    }


async def start_coordinator(bootstrap: str) -> None:
    """FindCoordinator creates __consumer_offsets; return once the group's partition is loaded."""
    connection = await connect(bootstrap)
    try:
        assert (await find_coordinator(connection, GROUP)).error_code == ErrorCode.NONE
    finally:
        await connection.close()
    await fetch_when_ready(bootstrap, {GROUP: None})


async def offsets_seen(connection: BrokerConnection) -> tuple[Fetched, Fetched]:
    """(what a read_uncommitted consumer sees, what one requiring stable offsets sees)."""
    wanted = [ORDERS_0, ORDERS_1]
    return (
        await fetch(connection, wanted, require_stable=False),
        await fetch(connection, wanted, require_stable=True),
    )


OK: Final = ErrorCode.NONE
UNSTABLE: Final = ErrorCode.UNSTABLE_OFFSET_COMMIT


async def test_markers_decide_transactional_offsets(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SETTINGS)
    await create_orders(broker.bootstrap)
    await start_coordinator(broker.bootstrap)
    connection = await connect(broker.bootstrap)
    try:
        assert await commit(connection, GROUP, {ORDERS_1: 3}) == {ORDERS_1: OK}
        codes = await txn_commit(connection, 1000, {ORDERS_0: 5, ORDERS_1: 7})
        assert codes == {ORDERS_0: OK, ORDERS_1: OK}
        # Pending: the last committed offsets show; require_stable is told to retry.
        assert await offsets_seen(connection) == (
            {ORDERS_0: (OK, -1), ORDERS_1: (OK, 3)},
            {ORDERS_0: (UNSTABLE, -1), ORDERS_1: (UNSTABLE, -1)},
        )

        assert await write_marker(connection, 1000, committed=True) == OK
        committed = {ORDERS_0: (OK, 5), ORDERS_1: (OK, 7)}
        assert await offsets_seen(connection) == (committed, committed)

        # The producer's next transaction is aborted: nothing changes.
        assert await txn_commit(connection, 1000, {ORDERS_0: 9}) == {ORDERS_0: OK}
        assert (await offsets_seen(connection))[1][ORDERS_0] == (UNSTABLE, -1)
        assert await write_marker(connection, 1000, committed=False) == OK
        assert await offsets_seen(connection) == (committed, committed)

        # A producer fenced by a newer epoch of its id cannot commit offsets any more.
        assert await txn_commit(connection, 1001, {ORDERS_0: 1}, producer_epoch=1) == {ORDERS_0: OK}
        assert await txn_commit(connection, 1001, {ORDERS_0: 2}, producer_epoch=0) == {
            ORDERS_0: ErrorCode.INVALID_PRODUCER_EPOCH
        }
        assert await write_marker(connection, 1001, committed=False, producer_epoch=1) == OK

        # Unknown partitions are refused, an empty group id is invalid.
        unknown = {TopicPartition("no-such-topic", 0): 1, TopicPartition("orders", 9): 1}
        assert await txn_commit(connection, 1002, unknown) == dict.fromkeys(
            unknown, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )
        assert await txn_commit(connection, 1002, {ORDERS_0: 1}, group_id="") == {
            ORDERS_0: ErrorCode.INVALID_GROUP_ID
        }
    finally:
        await connection.close()


async def test_pending_offsets_survive_a_crash_of_the_coordinator(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(SETTINGS)
    await create_orders(broker.bootstrap)
    await start_coordinator(broker.bootstrap)
    connection = await connect(broker.bootstrap)
    try:
        assert await commit(connection, GROUP, {ORDERS_0: 4}) == {ORDERS_0: OK}
        assert await txn_commit(connection, 2000, {ORDERS_0: 11}) == {ORDERS_0: OK}
    finally:
        await connection.close()

    broker.kill()  # SIGKILL between the TxnOffsetCommit and its marker
    await asyncio.to_thread(broker.restart)
    await fetch_when_ready(broker.bootstrap, {GROUP: None})  # loaded again
    connection = await connect(broker.bootstrap)
    try:
        # The reload found the offsets pending (the transaction is still open).
        assert await fetch(connection, [ORDERS_0], require_stable=True) == {
            ORDERS_0: (UNSTABLE, -1)
        }
        assert await fetch(connection, [ORDERS_0], require_stable=False) == {ORDERS_0: (OK, 4)}

        assert await write_marker(connection, 2000, committed=True) == OK
        assert await fetch(connection, [ORDERS_0], require_stable=True) == {ORDERS_0: (OK, 11)}
    finally:
        await connection.close()
    # And a second crash replays the marker too.
    broker.kill()
    await asyncio.to_thread(broker.restart)
    fetched = await fetch_when_ready(broker.bootstrap, {GROUP: [ORDERS_0]})
    assert fetched[GROUP] == (OK, {ORDERS_0: (11, "txn")})
