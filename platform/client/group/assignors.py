"""The partition assignors a consumer group's leader runs: `range`, `roundrobin` and
`cooperative-sticky`, with Kafka's names and Kafka's results. Pure functions of their input.

The leader gets every member's `Subscription` in its JoinGroup response and the partition count
of each subscribed topic from metadata; `assign` answers every member's `Assignment`, which the
leader sends back in SyncGroup. The leader may be any client of the group (Java, librdkafka,
Riverbed), so each assignor follows Kafka's protocol exactly:

- `range` and `roundrobin` are deterministic and give exactly what Java's `RangeAssignor`
  (without its rack-aware variant) and `RoundRobinAssignor` give: members sort by
  `group.instance.id` first (static members ahead of dynamic ones), then by member id, in Java's
  string order (UTF-16 code units).
- `cooperative-sticky` follows Java's `CooperativeStickyAssignor` (KIP-429): balanced, keeps each
  member's owned partitions where balance allows, and never hands a partition to a new owner in
  the rebalance that takes it from its current owner: that partition is only revoked, the owner
  gives it up and rejoins, and the follow-up rebalance assigns it. Ownership claims are judged by
  generation: of members claiming one partition, the one with the highest generation owns it;
  a tie at the highest generation invalidates every claim (and the partition waits one round).
  When all members subscribe to the same topics the result is Java's (its "constrained"
  algorithm); otherwise it is a balanced, sticky assignment by a simpler procedure than Java's
  (results need not match across implementations, only the protocol).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Collection, Iterable, Mapping
from typing import Final, Protocol

from riverbed.client.group.consumer_protocol import NO_GENERATION, Assignment, Subscription
from riverbed.protocol.java_hash import java_string_hash
from riverbed.protocol.record_types import TopicPartition

RANGE: Final = "range"
ROUNDROBIN: Final = "roundrobin"
COOPERATIVE_STICKY: Final = "cooperative-sticky"

# Java's CooperativeStickyAssignor puts its generation in the subscription's user data as well
# (schema "generation: int32"), for leaders older than subscription v2's GenerationId field.
_GENERATION_USER_DATA: Final = struct.Struct(">i")

_MASK_32: Final = 0xFFFFFFFF
_JAVA_HASH_MAP_CAPACITY_DEFAULT: Final = 16  # java.util.HashMap's, grown at 0.75 full


class RebalanceProtocol(enum.StrEnum):
    """How members give up partitions: all of them before every rebalance (eager), or only those
    the new assignment takes away (cooperative, KIP-429)."""

    EAGER = "eager"
    COOPERATIVE = "cooperative"


class Assignor(Protocol):
    """One `partition.assignment.strategy`: its JoinGroup protocol name, its rebalance protocol,
    the user data its members send, and the leader's assignment."""

    @property
    def name(self) -> str: ...

    @property
    def rebalance_protocol(self) -> RebalanceProtocol: ...

    def subscription_user_data(self, topics: Collection[str], generation_id: int) -> bytes | None:
        """The `user_data` of this member's subscription; `generation_id` is the member's
        current generation (-1 before it first joined)."""
        ...

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        """Every member's assignment (members without partitions get an empty one).

        `partitions_per_topic` holds the partition count of each subscribed topic that metadata
        knows; topics missing from it are not assigned. `subscriptions` is keyed by member id.
        """
        ...


def _java_order(value: str) -> bytes:
    """A sort key that orders strings as Java's `String.compareTo` does (by UTF-16 code unit)."""
    return value.encode("utf-16-be", "surrogatepass")


def _java_hash_map_order(keys: list[str]) -> list[str]:
    """The order in which a `java.util.HashMap` (default capacity and load factor) iterates
    `keys` put into it in this order: by bucket, then by insertion within a bucket."""
    capacity = _JAVA_HASH_MAP_CAPACITY_DEFAULT
    while len(keys) > capacity * 3 // 4:
        capacity *= 2

    def bucket(key: str) -> int:
        hash_value = java_string_hash(key) & _MASK_32
        return (hash_value ^ (hash_value >> 16)) & (capacity - 1)

    return sorted(keys, key=bucket)  # stable: insertion order within a bucket


def _member_order(member_id: str, subscription: Subscription) -> tuple[int, bytes]:
    # Java's AbstractPartitionAssignor.MemberInfo.compareTo: static members (group.instance.id)
    # first, by instance id; then dynamic members by member id.
    if subscription.group_instance_id is not None:
        return (0, _java_order(subscription.group_instance_id))
    return (1, _java_order(member_id))


def _sorted_members(subscriptions: Mapping[str, Subscription], members: Iterable[str]) -> list[str]:
    return sorted(members, key=lambda member: _member_order(member, subscriptions[member]))


def _assignments(partitions: Mapping[str, list[TopicPartition]]) -> dict[str, Assignment]:
    return {member: Assignment(tuple(sorted(tps))) for member, tps in partitions.items()}


class RangeAssignor:
    """Per topic, the partitions in order are cut into contiguous ranges over the topic's
    subscribers in member order; the first `partitions % subscribers` members get one more.

    Java's documented example: topics t0, t1 with 3 partitions each, members C0 and C1 →
    C0: [t0p0, t0p1, t1p0, t1p1], C1: [t0p2, t1p2].
    """

    name: Final = RANGE
    rebalance_protocol: Final = RebalanceProtocol.EAGER

    def subscription_user_data(self, topics: Collection[str], generation_id: int) -> bytes | None:
        return None

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        result: dict[str, list[TopicPartition]] = {member: [] for member in subscriptions}
        for topic, count in partitions_per_topic.items():
            subscribers = [m for m, s in subscriptions.items() if topic in s.topics]
            if count <= 0 or not subscribers:
                continue
            per_member, extra = divmod(count, len(subscribers))
            start = 0
            for index, member in enumerate(_sorted_members(subscriptions, subscribers)):
                end = start + per_member + (1 if index < extra else 0)
                result[member].extend(TopicPartition(topic, p) for p in range(start, end))
                start = end
        return _assignments(result)


class RoundRobinAssignor:
    """All subscribed topic-partitions, sorted by topic then partition, dealt one by one to the
    members in member order, skipping members not subscribed to the partition's topic.

    Java's documented example: topics t0, t1 with 3 partitions each, members C0 and C1 →
    C0: [t0p0, t0p2, t1p1], C1: [t0p1, t1p0, t1p2].
    """

    name: Final = ROUNDROBIN
    rebalance_protocol: Final = RebalanceProtocol.EAGER

    def subscription_user_data(self, topics: Collection[str], generation_id: int) -> bytes | None:
        return None

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        result: dict[str, list[TopicPartition]] = {member: [] for member in subscriptions}
        members = _sorted_members(subscriptions, subscriptions)
        subscribed = {member: frozenset(s.topics) for member, s in subscriptions.items()}
        topics = sorted(
            {t for s in subscribed.values() for t in s if partitions_per_topic.get(t, 0) > 0},
            key=_java_order,
        )
        turn = 0  # Java's CircularIterator over the sorted members
        for topic in topics:
            for partition in range(partitions_per_topic[topic]):
                # Some member subscribes to `topic`, so this ends within one lap.
                while topic not in subscribed[members[turn % len(members)]]:
                    turn += 1
                result[members[turn % len(members)]].append(TopicPartition(topic, partition))
                turn += 1
        return _assignments(result)


class _Ownership:
    """Who owns what, as the members' subscriptions claim it, judged by generation.

    `owned` holds each member's valid claims on existing partitions; `contested` the partitions
    that several members claim in the same (highest) generation: no claim on them is kept, and
    they are handed to nobody in this rebalance (Java's partitionsWithMultiplePreviousOwners).
    """

    def __init__(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> None:
        claims: dict[TopicPartition, list[tuple[int, str]]] = {}
        for member, subscription in subscriptions.items():
            generation = member_generation(subscription)
            for tp in set(subscription.owned_partitions):
                if 0 <= tp.partition < partitions_per_topic.get(tp.topic, 0):
                    claims.setdefault(tp, []).append((generation, member))
        self.owner: dict[TopicPartition, str] = {}
        self.contested: set[TopicPartition] = set()
        for tp, claimants in claims.items():
            newest = max(generation for generation, _ in claimants)
            winners = [member for generation, member in claimants if generation == newest]
            if len(winners) == 1:
                self.owner[tp] = winners[0]
            else:
                self.contested.add(tp)
        self.owned: dict[str, list[TopicPartition]] = {member: [] for member in subscriptions}
        for tp, member in self.owner.items():
            self.owned[member].append(tp)

    def in_transfer(self, tp: TopicPartition, member: str) -> bool:
        """Whether giving `tp` to `member` now would overlap with another member still owning
        it: such a partition must first be revoked (KIP-429)."""
        return tp in self.contested or self.owner.get(tp, member) != member


def member_generation(subscription: Subscription) -> int:
    """The generation a member's owned partitions are from: subscription v2's GenerationId, else
    the generation in Java's cooperative-sticky user data (-1 when neither says)."""
    if subscription.generation_id >= 0:
        return subscription.generation_id
    user_data = subscription.user_data
    if user_data is not None and len(user_data) >= _GENERATION_USER_DATA.size:
        (generation,) = _GENERATION_USER_DATA.unpack_from(user_data)
        return int(generation)
    return NO_GENERATION


class CooperativeStickyAssignor:
    """KIP-429's incremental cooperative rebalancing over KIP-54's sticky assignment."""

    name: Final = COOPERATIVE_STICKY
    rebalance_protocol: Final = RebalanceProtocol.COOPERATIVE

    def subscription_user_data(self, topics: Collection[str], generation_id: int) -> bytes | None:
        return _GENERATION_USER_DATA.pack(generation_id)

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, Assignment]:
        subscribed = {topic for s in subscriptions.values() for topic in s.topics}
        counts = {t: n for t, n in partitions_per_topic.items() if n > 0 and t in subscribed}
        ownership = _Ownership(counts, subscriptions)
        topic_sets = {frozenset(s.topics) for s in subscriptions.values()}
        if len(topic_sets) <= 1:
            sticky = _assign_constrained(counts, ownership.owned)
        else:
            sticky = _assign_general(counts, subscriptions, ownership.owned)
        _check_complete(counts, subscriptions, sticky)
        # A partition changing owner is only revoked in this round (Java's adjustAssignment).
        cooperative = {
            member: [tp for tp in sticky[member] if not ownership.in_transfer(tp, member)]
            for member in subscriptions
        }
        return _assignments(cooperative)


def _all_partitions(counts: Mapping[str, int], topics: Iterable[str]) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for topic in topics for p in range(counts[topic])]


def _assign_constrained(
    counts: Mapping[str, int], owned: Mapping[str, list[TopicPartition]]
) -> dict[str, list[TopicPartition]]:
    """Java's ConstrainedAssignmentBuilder (all members subscribe to the same topics), without
    rack awareness: each member keeps up to its quota of owned partitions, then the rest are
    dealt round robin to members under quota.

    `owned` lists the members in JoinGroup order; they are walked in the order Java's HashMap
    iterates them, as that decides which members keep one partition over the minimum quota.
    """
    members = _java_hash_map_order(list(owned))
    total = sum(counts.values())
    min_quota, members_over_min_expected = divmod(total, len(members)) if members else (0, 0)
    max_quota = min_quota + (1 if members_over_min_expected else 0)
    members_over_min = 0
    assignment: dict[str, list[TopicPartition]] = {member: [] for member in members}
    under_min: list[str] = []  # may take partitions up to min_quota (then maybe one more)
    exactly_min: list[str] = []  # at min_quota, may take one more while members_over_min allows
    for member in members:
        kept = sorted(owned[member], key=lambda tp: (tp.partition, _java_order(tp.topic)))
        if len(kept) < min_quota:
            assignment[member] = kept
            under_min.append(member)
        elif len(kept) >= max_quota and members_over_min < members_over_min_expected:
            members_over_min += 1
            if members_over_min == members_over_min_expected:
                exactly_min.clear()
            assignment[member] = kept[:max_quota]
        else:
            assignment[member] = kept[:min_quota]
            if members_over_min < members_over_min_expected:
                exactly_min.append(member)

    assigned = {tp for tps in assignment.values() for tp in tps}
    topics = sorted(counts, key=_java_order)
    unassigned = [tp for tp in _all_partitions(counts, topics) if tp not in assigned]
    under_min.sort(key=_java_order)
    exactly_min.sort(key=_java_order)
    cursor = 0  # Java's iterator over under_min, which drops members as they reach min_quota
    for tp in unassigned:
        if under_min:
            cursor %= len(under_min)
            member = under_min[cursor]
            assignment[member].append(tp)
            if len(assignment[member]) == min_quota:
                del under_min[cursor]
                exactly_min.append(member)
            else:
                cursor += 1
        elif exactly_min:  # the quota counts leave exactly as many partitions as takers here
            assignment[exactly_min.pop(0)].append(tp)
        else:
            raise RuntimeError(f"cooperative-sticky: no member left to take {tp} (assignor bug)")
    return assignment


def _assign_general(
    counts: Mapping[str, int],
    subscriptions: Mapping[str, Subscription],
    owned: Mapping[str, list[TopicPartition]],
) -> dict[str, list[TopicPartition]]:
    """Balanced and sticky when members subscribe to different topics: keep every owned
    partition of a still-subscribed topic, give each free partition (topics with the fewest
    subscribers first) to its least loaded subscriber, then move partitions from a member to a
    subscriber holding at least two fewer until no such move is left. Each move lowers the sum of
    squared loads, so this ends; it moves newly placed partitions before owned ones.
    """
    subscribed = {member: frozenset(s.topics) for member, s in subscriptions.items()}
    candidates: dict[str, list[str]] = {topic: [] for topic in counts}
    for member in sorted(subscriptions, key=_java_order):
        for topic in subscribed[member]:
            if topic in candidates:
                candidates[topic].append(member)
    assignment = {
        member: [tp for tp in owned[member] if tp.topic in subscribed[member]]
        for member in subscriptions
    }
    holder = {tp: member for member, tps in assignment.items() for tp in tps}

    def least_loaded(topic: str) -> str:
        return min(candidates[topic], key=lambda m: (len(assignment[m]), _java_order(m)))

    topics = sorted(
        (t for t in counts if candidates[t]),
        key=lambda t: (len(candidates[t]), _java_order(t)),
    )
    free = [tp for tp in _all_partitions(counts, topics) if tp not in holder]
    for tp in free:
        member = least_loaded(tp.topic)
        assignment[member].append(tp)
        holder[tp] = member

    fresh = set(free)
    movable = free + [
        tp
        for tp in _all_partitions(counts, topics)
        if tp not in fresh and len(candidates[tp.topic]) > 1
    ]
    moved = True
    while moved:
        moved = False
        for tp in movable:
            source, target = holder[tp], least_loaded(tp.topic)
            if len(assignment[source]) > len(assignment[target]) + 1:
                assignment[source].remove(tp)
                assignment[target].append(tp)
                holder[tp] = target
                moved = True
    return assignment


def _check_complete(
    counts: Mapping[str, int],
    subscriptions: Mapping[str, Subscription],
    assignment: Mapping[str, list[TopicPartition]],
) -> None:
    # Every partition of a subscribed topic goes to exactly one of its subscribers: a broken
    # assignment would make the group lose or double-consume records, so check it always.
    subscribed_topics = {t for s in subscriptions.values() for t in s.topics if t in counts}
    expected = _all_partitions(counts, subscribed_topics)
    given = [tp for tps in assignment.values() for tp in tps]
    if sorted(given) != sorted(expected):
        raise RuntimeError("cooperative-sticky assigned partitions not exactly once (assignor bug)")
    for member, tps in assignment.items():
        if any(tp.topic not in subscriptions[member].topics for tp in tps):
            raise RuntimeError(f"cooperative-sticky gave {member} an unsubscribed topic (bug)")


ASSIGNORS: Final[Mapping[str, Assignor]] = {
    assignor.name: assignor
    for assignor in (RangeAssignor(), RoundRobinAssignor(), CooperativeStickyAssignor())
}


def assignor_for(name: str) -> Assignor:
    """The assignor named `name` (a `partition.assignment.strategy` entry)."""
    try:
        return ASSIGNORS[name]
    except KeyError:
        known = ", ".join(ASSIGNORS)
        raise ValueError(
            f"unknown partition assignment strategy {name!r} (known: {known})"
        ) from None
