"""A leader's disk fails under acks=all: the broker stops itself at once, its leaderships move
without waiting for its ZooKeeper session to expire, no acknowledged record is lost, and once
the disk is back the broker recovers as after a crash and rejoins the ISR.

Every broker's data dir is a real ext4 that can fail (tests/faults/disks.py): `fail()` makes
the next fsync return EIO, as a dying disk does. Producers send sequence numbers with acks=all
(tests/replication/fault_support.py), so the log can be compared with what was acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Final

from riverbed.broker.broker import LOG_DIR_FAILURE_EXIT_CODE
from riverbed.hot.storage.log_manager import CLEAN_SHUTDOWN_FILE

from tests.faults.disks import FailingDisk
from tests.replication import fault_support
from tests.replication.fault_support import (
    broker_output,
    consume_all,
    create_replicated_topic,
    new_topic,
    producing,
    wait_for_acknowledgement,
    wait_for_new_leader,
    wait_in_isr,
)
from tests.support.cluster import ClusterFactory

# Long, so that a failover that waited for the failed broker's session to expire would show.
SESSION_TIMEOUT_MS: Final = 30_000
SETTINGS: Final = {
    **fault_support.SETTINGS,
    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
}
# The leader fsyncs every 100 ms while records arrive, so the failure is found at once.
TOPIC_CONFIGS: Final = {"min.insync.replicas": "2", "flush.ms": "100"}
# From fail() to a new leader in Metadata: the next fsync, one ZooKeeper round trip to close
# the session, the controller's election and the metadata reaching a broker. A few seconds on a
# busy machine; a third of the session timeout.
LEADER_MOVED_S_MAX: Final = 10.0
EXIT_TIMEOUT_S: Final = 10.0


async def test_a_leader_whose_disk_fails_stops_and_its_partitions_move_at_once(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(3, SETTINGS, start=False)
    with contextlib.ExitStack() as cleanup:
        disks = {
            broker_id: cleanup.enter_context(FailingDisk(broker.data_dir))
            for broker_id, broker in cluster.brokers.items()
        }
        cleanup.callback(cluster.kill_all)  # before the disks unmount: nothing holds a file
        await cluster.start()
        topic = new_topic("disk-failure")
        before = await create_replicated_topic(cluster, topic, TOPIC_CONFIGS)
        failed = cluster.brokers[before.leader]

        async with producing(cluster, topic) as acks:
            await wait_for_acknowledgement(cluster, acks)
            failed_at = time.monotonic()
            disks[before.leader].fail()
            exit_code = await asyncio.to_thread(failed.wait_exit, EXIT_TIMEOUT_S)
            exited_s = time.monotonic() - failed_at
            after = await wait_for_new_leader(cluster, topic, before)
            moved_s = time.monotonic() - failed_at
            resumed_at = await wait_for_acknowledgement(cluster, acks)
        print(
            f"leader {before.leader}'s disk failed: it exited after {exited_s:.2f} s, broker "
            f"{after.leader} led after {moved_s:.2f} s, acks resumed after "
            f"{resumed_at - failed_at:.2f} s ({acks.sent} records sent)"
        )

        assert exit_code == LOG_DIR_FAILURE_EXIT_CODE
        output = broker_output(cluster, before.leader)
        assert "level=CRITICAL" in output
        assert f"event=broker.log_dir_failed broker={before.leader}" in output
        assert "event=broker.stopped" not in output, "no clean shutdown"
        assert not (failed.data_dir / CLEAN_SHUTDOWN_FILE).exists()
        assert moved_s < LEADER_MOVED_S_MAX < SESSION_TIMEOUT_MS / 1000
        # Every send acknowledged at the offset of its sequence number, and the new leader
        # serves exactly those records: nothing lost, doubled or reordered.
        acks.check_all_acknowledged_in_order()
        assert await consume_all(cluster, topic) == list(range(acks.sent))

        disks[before.leader].heal()
        await cluster.restart(before.leader)
        assert "after an unclean shutdown" in broker_output(cluster, before.leader)
        await wait_in_isr(cluster, topic, before.leader)
