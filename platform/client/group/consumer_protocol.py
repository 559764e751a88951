"""The consumer protocol inside the group APIs: what a member subscribes to (JoinGroup protocol
metadata) and what the leader assigns it (SyncGroup assignment), and their bytes.

The bytes are Kafka's `ConsumerProtocolSubscription` / `ConsumerProtocolAssignment` data
schemas (versions 0-3), each prefixed by its int16 version. We send version 3 of both, as
Kafka's Java client does since 3.5 (`ConsumerProtocol` serializes at the schemas' highest
version for every assignor) and as librdkafka 2.x does: owned partitions (v1+) and the
generation they are from (v2+) travel in every subscription, whatever the assignor.

Reading follows Java's `ConsumerProtocol`: a version newer than 3 is read as version 3 (later
versions only append fields, and what follows is ignored), and an empty SyncGroup assignment
(the broker's answer for a member the leader left out) is an empty assignment, as librdkafka
reads it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, TypeVar

from riverbed.protocol.data_messages import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.versioned import decode_consumer_protocol, encode_versioned

PROTOCOL_TYPE: Final = "consumer"  # JoinGroup's protocol_type for consumer groups
SUBSCRIPTION_VERSION: Final = 3
ASSIGNMENT_VERSION: Final = 3
NO_GENERATION: Final = -1  # Java's DEFAULT_GENERATION: not from any generation


@dataclass(frozen=True, slots=True)
class Subscription:
    """One member's subscription, as its JoinGroup protocol metadata carries it.

    `owned_partitions` are the partitions the member holds from generation `generation_id` (-1:
    none / unknown). `group_instance_id` is not part of the bytes: the leader takes it from the
    member's entry in the JoinGroup response (it orders static members in range/roundrobin).
    """

    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = NO_GENERATION
    rack_id: str | None = None
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    """The partitions the leader gives one member, as SyncGroup carries them."""

    partitions: tuple[TopicPartition, ...]
    user_data: bytes | None = None


_TopicPartitions = TypeVar(
    "_TopicPartitions",
    ConsumerProtocolSubscription.TopicPartition,
    ConsumerProtocolAssignment.TopicPartition,
)


def encode_subscription(subscription: Subscription, version: int = SUBSCRIPTION_VERSION) -> bytes:
    """The JoinGroup protocol metadata of `subscription`, as Java's `ConsumerProtocol` writes it:
    topics sorted, owned partitions sorted and grouped by topic (fields `version` lacks are
    left out)."""
    data = ConsumerProtocolSubscription(
        topics=sorted(subscription.topics),
        user_data=subscription.user_data,
        owned_partitions=_by_topic(
            sorted(subscription.owned_partitions), ConsumerProtocolSubscription.TopicPartition
        ),
        generation_id=subscription.generation_id,
        rack_id=subscription.rack_id,
    )
    return encode_versioned(data, version)


def decode_subscription(
    metadata: bytes | bytearray | memoryview, group_instance_id: str | None = None
) -> Subscription:
    """A member's subscription from its JoinGroup protocol metadata; `group_instance_id` is
    the member's, from the same JoinGroup response entry. Raises ProtocolDecodeError."""
    data = decode_consumer_protocol(ConsumerProtocolSubscription, metadata)
    return Subscription(
        topics=tuple(data.topics),
        user_data=data.user_data,
        owned_partitions=_flattened(data.owned_partitions),
        generation_id=data.generation_id,
        rack_id=data.rack_id or None,  # Java reads an empty rack id as none
        group_instance_id=group_instance_id,
    )


def encode_assignment(assignment: Assignment, version: int = ASSIGNMENT_VERSION) -> bytes:
    """A member's SyncGroup assignment: partitions grouped by topic in the order they come."""
    data = ConsumerProtocolAssignment(
        assigned_partitions=_by_topic(
            assignment.partitions, ConsumerProtocolAssignment.TopicPartition
        ),
        user_data=assignment.user_data,
    )
    return encode_versioned(data, version)


def decode_assignment(member_assignment: bytes | bytearray | memoryview) -> Assignment:
    """This member's assignment from its SyncGroup response. Raises ProtocolDecodeError."""
    if len(member_assignment) == 0:
        return Assignment(())
    data = decode_consumer_protocol(ConsumerProtocolAssignment, member_assignment)
    return Assignment(_flattened(data.assigned_partitions), data.user_data)


def _by_topic(
    partitions: Iterable[TopicPartition], struct: type[_TopicPartitions]
) -> list[_TopicPartitions]:
    grouped: dict[str, _TopicPartitions] = {}
    for tp in partitions:
        grouped.setdefault(tp.topic, struct(topic=tp.topic)).partitions.append(tp.partition)
    return list(grouped.values())


def _flattened(
    grouped: Iterable[ConsumerProtocolSubscription.TopicPartition]
    | Iterable[ConsumerProtocolAssignment.TopicPartition],
) -> tuple[TopicPartition, ...]:
    return tuple(TopicPartition(entry.topic, p) for entry in grouped for p in entry.partitions)
