"""Znode JSON codecs (strict), topic names and replica assignment: no ZooKeeper needed."""

import random
import uuid
from collections import Counter

import pytest
from riverbed.common.uuids import decode_uuid, encode_uuid
from riverbed.coordination import layout
from riverbed.coordination.assignment import (
    assign_added_replicas,
    assign_replicas,
    check_manual_replicas,
)
from riverbed.coordination.layout import (
    BrokerRegistration,
    MalformedZnodeError,
    PartitionState,
    TopicAssignment,
    TopicConfigOverrides,
)


def test_round_trips() -> None:
    broker = BrokerRegistration(3, "127.0.0.1", 9092, rack="r1", timestamp_ms=17)
    assert BrokerRegistration.decode(3, broker.encode()) == BrokerRegistration(
        3, "127.0.0.1", 9092, ("PLAINTEXT://127.0.0.1:9092",), "r1", 17
    )
    assignment = TopicAssignment(uuid.uuid4(), {0: (1, 2), 1: (2, 1)})
    assert TopicAssignment.decode("t", assignment.encode()) == assignment
    moving = TopicAssignment(uuid.uuid4(), {0: (3, 2, 1)}, adding={0: (3,)}, removing={0: (1,)})
    assert TopicAssignment.decode("t", moving.encode()) == moving
    state = PartitionState(leader=2, leader_epoch=5, isr=(2, 1), controller_epoch=3)
    assert PartitionState.decode("/p", state.encode()) == state
    overrides = TopicConfigOverrides({"retention.ms": "5"})
    assert TopicConfigOverrides.decode("t", overrides.encode()) == overrides
    assert layout.decode_controller(layout.encode_controller(4, 99)) == 4
    assert layout.decode_controller_epoch(layout.encode_controller_epoch(12)) == 12
    topic_id = uuid.uuid4()
    assert len(encode_uuid(topic_id)) == 22
    assert decode_uuid(encode_uuid(topic_id)) == topic_id


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"not json", "not JSON"),
        (b"[]", "expected a JSON object"),
        (b'{"version":1,"leader":"1","leader_epoch":0,"isr":[1],"controller_epoch":0}', "'leader'"),
        (b'{"version":1,"leader":1,"leader_epoch":0,"isr":[true],"controller_epoch":0}', "'isr'"),
        (b'{"version":1,"leader":1,"isr":[1],"controller_epoch":0}', "'leader_epoch'"),
    ],
)
def test_malformed_partition_state_names_path_and_field(data: bytes, fragment: str) -> None:
    with pytest.raises(MalformedZnodeError, match=fragment) as caught:
        PartitionState.decode("/brokers/topics/t/partitions/0/state", data)
    assert "/brokers/topics/t/partitions/0/state" in str(caught.value)


def test_malformed_assignment_and_registration() -> None:
    good_id = encode_uuid(uuid.uuid4())
    with pytest.raises(MalformedZnodeError, match=r"numbered 0\.\.n-1"):
        TopicAssignment.decode("t", b'{"topic_id":"%s","partitions":{"1":[1]}}' % good_id.encode())
    with pytest.raises(MalformedZnodeError, match="base64url"):
        TopicAssignment.decode("t", b'{"topic_id":"nope","partitions":{"0":[1]}}')
    with pytest.raises(MalformedZnodeError, match=r"/brokers/ids/1: .*port"):
        BrokerRegistration.decode(1, b'{"host":"h","port":0,"endpoints":[],"timestamp":"1"}')


@pytest.mark.parametrize(
    ("name", "legal"),
    [("orders", True), ("a.b_c-D9", True), ("x" * 249, True), ("x" * 250, False),
     ("", False), (".", False), ("..", False), ("a/b", False), ("a b", False), ("ü", False)],
)  # fmt: skip
def test_topic_name_rule(name: str, legal: bool) -> None:
    assert (layout.topic_name_error(name) is None) is legal


def test_assignment_spreads_leaders_and_replicas() -> None:
    for seed in range(20):
        assignment = assign_replicas([3, 1, 2], 6, 2, random.Random(seed))
        assert sorted(assignment) == list(range(6))
        assert all(len(set(replicas)) == 2 for replicas in assignment.values())
        leaders = Counter(replicas[0] for replicas in assignment.values())
        assert leaders == {1: 2, 2: 2, 3: 2}
        followers = Counter(replicas[1] for replicas in assignment.values())
        assert followers == {1: 2, 2: 2, 3: 2}
    with pytest.raises(ValueError, match="replication factor 4"):
        assign_replicas([1, 2, 3], 1, 4)


def test_added_partitions_continue_the_round_robin() -> None:
    """Preferred leaders go on round the brokers from partition 0's, as the topic's own did, so
    a grown topic leads evenly; every new partition has partition 0's replication factor."""
    for seed in range(20):
        existing = assign_replicas([3, 1, 2], 4, 2, random.Random(seed))
        added = assign_added_replicas([1, 2, 3], existing, 9)
        assert sorted(added) == list(range(4, 9))
        both = {**existing, **added}
        leaders = [both[p][0] for p in range(9)]
        assert leaders == [[1, 2, 3][(p + leaders[0] - 1) % 3] for p in range(9)]
        assert Counter(leaders) == {1: 3, 2: 3, 3: 3}
        assert all(len(set(replicas)) == 2 for replicas in added.values())


def test_added_partitions_start_from_the_broker_at_or_after_partition_0s_leader() -> None:
    # Broker 2 (partition 0's preferred leader) is gone: the round starts at broker 3.
    added = assign_added_replicas([1, 3, 4], {0: (2, 3)}, 4)
    assert [added[p][0] for p in (1, 2, 3)] == [4, 1, 3]
    # Partition 0's leader above every live broker: the round starts at the first one.
    assert assign_added_replicas([1, 2], {0: (9,)}, 3) == {1: (2,), 2: (1,)}
    with pytest.raises(ValueError, match=r"replication factor 3 must be in 1\.\.2"):
        assign_added_replicas([1, 2], {0: (1, 2, 3)}, 2)


@pytest.mark.parametrize(
    ("replicas", "error"),
    [
        ([[1, 2], []], "replica list 1 is empty"),
        ([[1, 1]], r"replica list 0 names a broker twice: \[1, 1\]"),
        ([[1, 7]], r"unknown or stopped brokers \[7\] \(live: \[1, 2, 3\]\)"),
        ([[2, 3], [1]], "replica list 1 has 1 replicas; the topic's partitions have 2"),
    ],
)
def test_manual_replicas_are_checked(replicas: list[list[int]], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        check_manual_replicas(replicas, 2, {1, 2, 3})


def test_manual_replicas_that_fit() -> None:
    check_manual_replicas([[3, 1], [1, 2]], 2, {1, 2, 3})


def test_an_assignment_cannot_move_replicas_it_does_not_have() -> None:
    bad = (
        b'{"version":3,"topic_id":"' + encode_uuid(uuid.uuid4()).encode() + b'",'
        b'"partitions":{"0":[1,2]},"adding_replicas":{"0":[3]},"removing_replicas":{}}'
    )
    with pytest.raises(layout.MalformedZnodeError, match="moves replicas it does not have"):
        TopicAssignment.decode("t", bad)
    # Kafka's version 1 assignments have no adding/removing fields.
    old = b'{"version":1,"topic_id":"' + encode_uuid(uuid.uuid4()).encode() + b'",'
    assert TopicAssignment.decode("t", old + b'"partitions":{"0":[1]}}').adding == {}


def test_a_partition_state_path_is_told_from_the_other_topic_znodes() -> None:
    path = layout.partition_state_path("orders.v2", 17)
    assert layout.parse_partition_state_path(path) == ("orders.v2", 17)
    for other in (
        layout.topic_path("orders"),
        layout.partitions_path("orders"),
        layout.partition_path("orders", 3),
        "/brokers/topics/orders/partitions/x/state",
        "/brokers/topics/orders/state",
        "/config/topics/orders/partitions/3/state",
    ):
        assert layout.parse_partition_state_path(other) is None
