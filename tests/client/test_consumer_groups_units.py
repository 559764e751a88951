"""The consumer's group machinery that needs no broker: the member's state machine, its timers,
subscriptions, the OffsetCommit / OffsetFetch shapes and the group settings."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from riverbed.client.group.assignors import RebalanceProtocol, assignor_for
from riverbed.client.group.heartbeat import HeartbeatTimers
from riverbed.client.group.member import (
    NO_GENERATION,
    TRANSITIONS,
    Generation,
    GroupMember,
    IllegalTransitionError,
    MemberEvent,
    MemberState,
)
from riverbed.client.group.offset_requests import (
    OffsetAndMetadata,
    commit_errors,
    commit_request,
    fetch_request,
    fetch_result,
)
from riverbed.client.group.rebalance import rebalance_protocol
from riverbed.client.group.subscription import TopicSubscription
from riverbed.client.settings import ConsumerSettings
from riverbed.protocol import messages as m
from riverbed.protocol.connection import ClientConnection, supported_api_versions
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import TopicPartition

BOOTSTRAP = "127.0.0.1:9092"
TP0 = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)


# -- the member's state machine ---------------------------------------------------------------
def test_a_member_goes_through_join_sync_and_stable_and_back_on_rejoin() -> None:
    member = GroupMember("g", None)
    assert member.state is MemberState.UNJOINED
    assert not member.heartbeating
    member.request_rejoin("subscribed")
    member.request_rejoin("later reasons do not overwrite the first")
    assert member.rejoin_reason == "subscribed"
    member.join_sent()
    assert member.state is MemberState.JOINING
    assert not member.rejoin_needed
    member.member_id_assigned("m-1")  # MEMBER_ID_REQUIRED: still joining, now with an id
    assert member.state is MemberState.JOINING
    assert member.generation == Generation(NO_GENERATION, "m-1")
    member.join_sent()
    member.joined(Generation(4, "m-1", "range"))
    assert member.state is MemberState.SYNCING
    assert member.heartbeating
    assert member.in_rebalance
    member.synced()
    assert member.state is MemberState.STABLE
    assert not member.in_rebalance
    member.join_sent()  # a rebalance: the generation stays until JoinGroup answers
    assert member.state is MemberState.JOINING
    assert member.generation.generation_id == 4


def test_a_reset_forgets_the_generation_and_keeps_the_member_id_only_when_asked() -> None:
    member = GroupMember("g", "instance-1")
    member.join_sent()
    member.joined(Generation(7, "m-1", "range"))
    member.synced()
    member.reset("ILLEGAL_GENERATION", keep_member_id=True)
    assert member.state is MemberState.UNJOINED
    assert member.generation == Generation(NO_GENERATION, "m-1")
    assert member.rejoin_reason == "ILLEGAL_GENERATION"
    member.reset(None)
    assert member.generation == Generation()
    assert not member.rejoin_needed
    assert member.static


@pytest.mark.parametrize("state", list(MemberState))
@pytest.mark.parametrize("event", list(MemberEvent))
def test_every_transition_outside_the_table_raises(state: MemberState, event: MemberEvent) -> None:
    member = GroupMember("g", None)
    member.state = state
    events: dict[MemberEvent, Callable[[], object]] = {
        MemberEvent.JOIN_SENT: member.join_sent,
        MemberEvent.JOINED: lambda: member.joined(Generation(1, "m", "range")),
        MemberEvent.SYNCED: member.synced,
        MemberEvent.RESET: lambda: member.reset("x"),
    }
    apply = events[event]
    target = TRANSITIONS.get((state, event))
    if target is None:
        with pytest.raises(IllegalTransitionError):
            apply()
        assert member.state is state
    else:
        apply()
        assert member.state is target


# -- timers ------------------------------------------------------------------------------------
def timers(now: float = 100.0) -> HeartbeatTimers:
    return HeartbeatTimers(
        session_timeout_ms=10_000,
        heartbeat_interval_ms=3_000,
        max_poll_interval_ms=60_000,
        retry_backoff_ms=100,
        now=now,
    )


def test_heartbeats_are_due_every_interval_and_sooner_after_a_failure() -> None:
    t = timers()
    assert t.until_next_heartbeat_s(100.0) == pytest.approx(3.0)
    t.sent(103.0)
    assert t.until_next_heartbeat_s(104.0) == pytest.approx(2.0)
    t.failed(104.0)
    assert t.until_next_heartbeat_s(104.0) == pytest.approx(0.1)


def test_the_session_expires_without_a_successful_heartbeat() -> None:
    t = timers()
    assert not t.session_expired(109.0)
    t.received(109.0)
    assert not t.session_expired(118.0)
    assert t.session_expired(119.5)


def test_the_poll_interval_counts_only_time_outside_getmany() -> None:
    t = timers()
    t.poll_started(100.0)
    assert t.until_poll_expiry_s(500.0) is None
    assert not t.poll_expired(500.0)
    t.poll_ended(500.0)
    assert t.until_poll_expiry_s(530.0) == pytest.approx(30.0)
    assert not t.poll_expired(559.0)
    assert t.poll_expired(561.0)


# -- subscriptions -----------------------------------------------------------------------------
def test_a_pattern_matches_whole_names_and_never_internal_topics() -> None:
    subscription = TopicSubscription(pattern=re.compile(r"orders-.*|__.*"))
    assert subscription.match(["orders-eu", "orders", "my-orders-eu", "__consumer_offsets"])
    assert subscription.topics == {"orders-eu"}
    assert not subscription.match(["orders-eu", "payments"])  # unchanged
    assert subscription.match(["orders-eu", "orders-us"])
    assert subscription.topics == {"orders-eu", "orders-us"}


def test_topic_subscriptions_do_not_change_with_the_cluster() -> None:
    subscription = TopicSubscription(["a", "b"])
    assert not subscription.match(["c"])
    assert subscription.topics == {"a", "b"}


@pytest.mark.parametrize(
    ("topics", "pattern"), [((), None), (("a",), re.compile("a")), (("",), None)]
)
def test_a_subscription_needs_topics_or_a_pattern(
    topics: tuple[str, ...], pattern: re.Pattern[str] | None
) -> None:
    with pytest.raises(ValueError, match="subscribe"):
        TopicSubscription(topics, pattern)


# -- committed offsets on the wire ---------------------------------------------------------
def test_a_commit_names_the_generation_and_encodes_at_every_version() -> None:
    request = commit_request(
        "g",
        Generation(5, "m-1", "range"),
        "instance-1",
        {TP1: OffsetAndMetadata(9, "done", 2), TP0: OffsetAndMetadata(3)},
    )
    assert (request.generation_id, request.member_id, request.group_instance_id) == (
        5,
        "m-1",
        "instance-1",
    )
    (topic,) = request.topics
    assert [
        (p.partition_index, p.committed_offset, p.committed_metadata) for p in topic.partitions
    ] == [
        (0, 3, ""),
        (1, 9, "done"),
    ]
    assert topic.partitions[1].committed_leader_epoch == 2
    assert_encodes_at_every_version(request)


def test_commit_errors_are_read_per_partition() -> None:
    response = m.OffsetCommitResponse(
        topics=[
            m.OffsetCommitResponse.OffsetCommitResponseTopic(
                "orders",
                [
                    m.OffsetCommitResponse.OffsetCommitResponsePartition(0, 0),
                    m.OffsetCommitResponse.OffsetCommitResponsePartition(
                        1, ErrorCode.ILLEGAL_GENERATION
                    ),
                ],
            )
        ]
    )
    assert commit_errors(response) == {TP1: ErrorCode.ILLEGAL_GENERATION}


def test_offset_fetch_requests_fill_both_shapes_and_encode_at_every_version() -> None:
    request = fetch_request("g", [TP1, TP0, TP1], require_stable=True)
    assert request.group_id == "g"
    assert [(t.name, t.partition_indexes) for t in request.topics or []] == [("orders", [0, 1])]
    (group,) = request.groups
    assert [(t.name, t.partition_indexes) for t in group.topics or []] == [("orders", [0, 1])]
    assert_encodes_at_every_version(request)


def test_offset_fetch_answers_are_read_in_either_shape() -> None:
    old = m.OffsetFetchResponse(
        topics=[
            m.OffsetFetchResponse.OffsetFetchResponseTopic(
                "orders",
                [
                    m.OffsetFetchResponse.OffsetFetchResponsePartition(0, 12, 3, "md", 0),
                    m.OffsetFetchResponse.OffsetFetchResponsePartition(1, -1, -1, None, 0),
                ],
            )
        ]
    )
    new = m.OffsetFetchResponse(
        groups=[
            m.OffsetFetchResponse.OffsetFetchResponseGroup(
                "other", [], ErrorCode.GROUP_AUTHORIZATION_FAILED
            ),
            m.OffsetFetchResponse.OffsetFetchResponseGroup(
                "g",
                [
                    m.OffsetFetchResponse.OffsetFetchResponseTopics(
                        "orders",
                        [
                            m.OffsetFetchResponse.OffsetFetchResponsePartitions(0, 12, 3, "md", 0),
                            m.OffsetFetchResponse.OffsetFetchResponsePartitions(
                                1, 0, -1, None, ErrorCode.UNSTABLE_OFFSET_COMMIT
                            ),
                        ],
                    )
                ],
            ),
        ]
    )
    read_old = fetch_result(old, "g")
    assert read_old.error == ErrorCode.NONE
    assert read_old.offsets == {TP0: OffsetAndMetadata(12, "md", 3), TP1: None}
    read_new = fetch_result(new, "g")
    assert read_new.offsets == {TP0: OffsetAndMetadata(12, "md", 3)}
    assert read_new.errors == {TP1: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    assert fetch_result(m.OffsetFetchResponse(error_code=ErrorCode.NOT_COORDINATOR), "g").error == (
        ErrorCode.NOT_COORDINATOR
    )


def assert_encodes_at_every_version(request: m.OffsetCommitRequest | m.OffsetFetchRequest) -> None:
    low, high = supported_api_versions()[request.API_KEY]
    connection = ClientConnection(client_id="test")
    for version in range(low, high + 1):
        _, data = connection.send_request(request, version)
        assert data


# -- settings and protocols ---------------------------------------------------------------
def test_group_settings_have_kafkas_names_and_defaults() -> None:
    settings = ConsumerSettings.from_kwargs({"bootstrap_servers": BOOTSTRAP, "group_id": "g"})
    assert settings.session_timeout_ms == 45_000
    assert settings.heartbeat_interval_ms == 3_000
    assert settings.max_poll_interval_ms == 300_000
    assert settings.partition_assignment_strategy == ("range", "cooperative-sticky")
    assert settings.enable_auto_commit is True
    assert settings.auto_commit_interval_ms == 5_000
    assert settings.group_instance_id is None
    assert settings.default_api_timeout_ms == 60_000


def test_assignment_strategies_are_named_in_a_string_or_a_list() -> None:
    parse = ConsumerSettings.from_kwargs
    settings = parse(
        {"bootstrap_servers": BOOTSTRAP, "partition_assignment_strategy": "roundrobin, range"}
    )
    assert settings.partition_assignment_strategy == ("roundrobin", "range")
    settings = parse(
        {"bootstrap_servers": BOOTSTRAP, "partition_assignment_strategy": ["cooperative-sticky"]}
    )
    assert settings.partition_assignment_strategy == ("cooperative-sticky",)
    for bad in ("sticky", "", ["range", "range"], 3):
        with pytest.raises(ValueError, match="partition_assignment_strategy"):
            parse({"bootstrap_servers": BOOTSTRAP, "partition_assignment_strategy": bad})


def test_auto_commit_gives_way_without_a_group_unless_asked_for() -> None:
    parse = ConsumerSettings.from_kwargs
    assert parse({"bootstrap_servers": BOOTSTRAP}).enable_auto_commit is False
    with pytest.raises(ValueError, match="enable_auto_commit=True needs a group_id"):
        parse({"bootstrap_servers": BOOTSTRAP, "enable_auto_commit": True})
    with pytest.raises(ValueError, match="group_instance_id needs a group_id"):
        parse({"bootstrap_servers": BOOTSTRAP, "group_instance_id": "i"})


def test_the_heartbeat_interval_must_be_below_the_session_timeout() -> None:
    with pytest.raises(ValueError, match="heartbeat_interval_ms"):
        ConsumerSettings.from_kwargs(
            {
                "bootstrap_servers": BOOTSTRAP,
                "group_id": "g",
                "session_timeout_ms": 3_000,
                "heartbeat_interval_ms": 3_000,
            }
        )


def test_the_protocol_is_cooperative_only_when_every_assignor_is() -> None:
    default = [assignor_for("range"), assignor_for("cooperative-sticky")]
    assert rebalance_protocol(default) is RebalanceProtocol.EAGER
    assert rebalance_protocol([assignor_for("cooperative-sticky")]) is RebalanceProtocol.COOPERATIVE
