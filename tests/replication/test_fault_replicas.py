"""Replicas that fall behind or run ahead: a frozen follower leaves the ISR and catches up again;
a leader's divergent tail (records its followers never got) is truncated when it comes back.
Either way every replica ends with the same bytes as the leader."""

from __future__ import annotations

import asyncio
import time
from typing import Final

import pytest
from riverbed import Producer

from tests.replication.fault_support import (
    SESSION_TIMEOUT_MS,
    broker_output,
    consume_all,
    create_replicated_topic,
    encode,
    fully_in_sync,
    new_topic,
    producing,
    segment_digests,
    wait_for_acknowledgement,
    wait_for_new_leader,
    wait_for_state,
    wait_in_isr,
)
from tests.support.cluster import ClusterFactory

# -- a follower stopped past replica.lag.time.max.ms -----------------------------------------

# The leader drops a follower that has not caught up for this long (checked every half of it).
FOLLOWER_LAG_TIME_MAX_MS: Final = 1_500
FOLLOWER_SETTINGS: Final = {
    # A frozen follower's session outlives the freeze: the leader's lag check must act.
    "pause": {
        "zookeeper.session.timeout.ms": "15000",
        "replica.lag.time.max.ms": str(FOLLOWER_LAG_TIME_MAX_MS),
    },
    # A killed follower's session expires too: whoever comes first (leader or controller) acts.
    "kill": {
        "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
        "replica.lag.time.max.ms": str(FOLLOWER_LAG_TIME_MAX_MS),
    },
}
# How long the follower stays out of the ISR while records keep coming.
BEHIND_S: Final = 1.0


@pytest.mark.parametrize("how", ["pause", "kill"])
async def test_stopped_follower_leaves_the_isr_then_catches_up_byte_for_byte(
    cluster_factory: ClusterFactory, how: str
) -> None:
    cluster = await cluster_factory(3, FOLLOWER_SETTINGS[how])
    topic = new_topic(f"follower-{how}")
    before = await create_replicated_topic(cluster, topic)
    follower = next(b for b in before.replicas if b != before.leader)

    async with producing(cluster, topic) as acks:
        await wait_for_acknowledgement(cluster, acks)
        stopped_at = time.monotonic()
        if how == "pause":
            cluster.pause(follower)
        else:
            cluster.kill(follower)
        shrunk = await wait_for_state(
            cluster, topic, lambda s: follower not in s.isr, f"broker {follower} out of the ISR"
        )
        shrunk_s = time.monotonic() - stopped_at
        # Without it, acks=all goes on: the leader and the other follower suffice.
        await wait_for_acknowledgement(cluster, acks)
        await asyncio.sleep(BEHIND_S)
        back_at = time.monotonic()
        if how == "pause":
            cluster.resume(follower)
        else:
            await cluster.restart(follower)
        # Asked of the leader: the thawed follower's own (stale) cache still lists it.
        await wait_in_isr(cluster, topic, follower, via=before.leader)
        rejoined_s = time.monotonic() - back_at
    print(
        f"{how}: follower {follower} out of the ISR {shrunk_s:.2f} s after it stopped "
        f"(lag limit {FOLLOWER_LAG_TIME_MAX_MS} ms), back {rejoined_s:.2f} s after it was resumed "
        "or restarted"
    )

    assert shrunk.leader == before.leader
    if how == "pause":
        # The leader shrank the ISR (the controller would have started a new leader epoch).
        assert shrunk.leader_epoch == before.leader_epoch
    acks.check_all_acknowledged_in_order()
    # acks=all answered for the last record with the follower in the ISR: every replica has
    # every record, and the follower's files are the leader's, byte for byte.
    digests = segment_digests(cluster, topic)
    assert len(set(digests.values())) == 1, digests
    assert await consume_all(cluster, topic) == list(range(acks.sent))


# -- a leader with a tail its followers never got --------------------------------------------

DIVERGENCE_SETTINGS: Final = {
    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    # Long enough that followers frozen for a moment stay in the ISR.
    "replica.lag.time.max.ms": "10000",
}
COMMITTED_BEFORE: Final = 100  # acks=all, before the followers freeze
DIVERGENT: Final = 20  # acks=1 to the leader alone
COMMITTED_AFTER: Final = 50  # acks=all, to the new leader


async def produce_sequence(
    bootstrap: str, topic: str, sequences: range, **settings: object
) -> list[int]:
    """Send `sequences` one by one, each acknowledged before the next; their offsets."""
    offsets = []
    async with Producer(bootstrap_servers=bootstrap, **settings) as producer:
        for sequence in sequences:
            offsets.append(
                (await (await producer.send(topic, encode(sequence), partition=0))).offset
            )
    return offsets


async def test_divergent_tail_of_an_old_leader_is_truncated_when_it_returns(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(3, DIVERGENCE_SETTINGS)
    topic = new_topic("divergent")
    before = await create_replicated_topic(cluster, topic)
    old_leader = before.leader
    followers = [b for b in before.replicas if b != old_leader]
    committed = range(COMMITTED_BEFORE)
    divergent = range(committed.stop, committed.stop + DIVERGENT)
    later = range(divergent.stop, divergent.stop + COMMITTED_AFTER)
    assert await produce_sequence(cluster.bootstrap, topic, committed) == list(committed)

    # The followers freeze for a moment (far below the lag limit: they stay in the ISR) while
    # the leader takes acks=1 records, then the leader dies: only it ever had them.
    for follower in followers:
        cluster.pause(follower)
    leader_only = cluster.brokers[old_leader].bootstrap
    offsets = await produce_sequence(leader_only, topic, divergent, acks=1)
    assert offsets == list(range(COMMITTED_BEFORE, COMMITTED_BEFORE + DIVERGENT))
    cluster.kill(old_leader)
    for follower in followers:
        cluster.resume(follower)

    after = await wait_for_new_leader(cluster, topic, before)
    assert set(after.isr) <= set(followers)
    offsets = await produce_sequence(cluster.bootstrap, topic, later)
    # A follower's fetch parked at the leader when it froze may have carried the first divergent
    # records to it: the new leader keeps those (Kafka does the same). The rest is gone.
    kept = offsets[0] - COMMITTED_BEFORE
    assert 0 <= kept < DIVERGENT
    assert offsets == list(range(offsets[0], offsets[0] + COMMITTED_AFTER))

    await cluster.restart(old_leader)
    await wait_for_state(cluster, topic, fully_in_sync, f"broker {old_leader} back in sync")
    truncation = f"{topic}-0: truncating to {COMMITTED_BEFORE + kept} "
    assert truncation in broker_output(cluster, old_leader)
    digests = segment_digests(cluster, topic)
    assert len(set(digests.values())) == 1, digests
    # The log: what acks=all confirmed before and after, and what the new leader had.
    assert await consume_all(cluster, topic) == [*committed, *divergent[:kept], *later]
