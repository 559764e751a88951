"""`riverbed groups ...` as a user runs it, on a group made by a kafka-python consumer."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from confluent_kafka import Producer
from kafka import KafkaConsumer

from tests.broker.test_cli import riverbed
from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.ports import free_port

GROUP_SETTINGS = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "3",
    "offsets.topic.replication.factor": "1",
}
BASE_TIMESTAMP_MS = 1_700_000_000_000
RECORDS = 5  # per partition, the record at offset i stamped BASE_TIMESTAMP_MS + 1000 * i
MORE_RECORDS = 2  # produced to partition 0 after the group committed: its lag
CLIENT_ID = "cli-groups-test"
CONSUME_TIMEOUT_S = 60.0
POLL_TIMEOUT_MS = 200
FLUSH_TIMEOUT_S = 30


def produce(broker: BrokerProcess, topic: str, partition: int, offsets: range) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for offset in offsets:
        producer.produce(
            topic, b"v", partition=partition, timestamp=BASE_TIMESTAMP_MS + 1000 * offset
        )
    assert producer.flush(FLUSH_TIMEOUT_S) == 0


def join_and_commit(broker: BrokerProcess, group: str, topic: str) -> KafkaConsumer:
    """A kafka-python member of `group` that consumed every record of `topic` and committed."""
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=group,
        client_id=CLIENT_ID,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        # kafka-python's leader assigns from its own metadata: a topic it has not fetched yet
        # gets no partitions, and 3.0.12 was seen not to rejoin once it had (a clean-clone run
        # consumed nothing for 60 s). So it learns the topic before it joins.
        assert consumer.partitions_for_topic(topic) == {0, 1}
        consumer.subscribe([topic])
        consumed = 0
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while consumed < 2 * RECORDS:
            assert time.monotonic() < deadline, f"consumed {consumed} records"
            batches = consumer.poll(timeout_ms=POLL_TIMEOUT_MS)
            consumed += sum(len(records) for records in batches.values())
        consumer.commit()
    except BaseException:
        # Left open, its background thread would retry the stopped broker for the rest of this
        # worker's tests (leaked sockets, `random` under Hypothesis).
        consumer.close()
        raise
    return consumer


def describe(broker: BrokerProcess, group: str) -> dict[str, Any]:
    result = riverbed("groups", "describe", group, "--json", "--bootstrap-server", broker.bootstrap)
    assert result.returncode == 0, result.stderr
    described: dict[str, Any] = json.loads(result.stdout)
    return described


def committed(broker: BrokerProcess, group: str) -> dict[int, int | None]:
    return {row["partition"]: row["committed_offset"] for row in describe(broker, group)["offsets"]}


def reset(broker: BrokerProcess, group: str, *flags: str) -> str:
    """Run reset-offsets; its stdout (the plan)."""
    result = riverbed(
        "groups", "reset-offsets", group, *flags, "--bootstrap-server", broker.bootstrap
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def iso(timestamp_ms: int, zone: timezone = UTC) -> str:
    return datetime.fromtimestamp(timestamp_ms / 1000, tz=zone).isoformat()


def assert_one_line_error(result: Any, *expected: str) -> None:
    assert result.returncode == 1, result.stdout
    assert result.stderr.startswith("riverbed: error:"), result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr


def test_list_describe_reset_and_delete_a_group(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(GROUP_SETTINGS)
    server = ("--bootstrap-server", broker.bootstrap)
    topic, group = f"orders-{uuid.uuid4().hex[:6]}", f"billing-{uuid.uuid4().hex[:6]}"
    assert riverbed("topics", "create", topic, "--partitions", "2", *server).returncode == 0
    for partition in (0, 1):
        produce(broker, topic, partition, range(RECORDS))

    consumer = join_and_commit(broker, group, topic)
    try:
        produce(broker, topic, 0, range(RECORDS, RECORDS + MORE_RECORDS))
        assert group in riverbed("groups", "list", *server).stdout.split()
        by_state = riverbed("groups", "list", "--state", "Stable", *server).stdout.splitlines()
        assert by_state[0].split() == ["GROUP", "STATE"]
        assert [group, "Stable"] in [line.split() for line in by_state]
        assert group not in riverbed("groups", "list", "--state", "Empty", *server).stdout

        live = describe(broker, group)
        assert (live["state"], live["protocol_type"]) == ("Stable", "consumer")
        assert live["coordinator"] == broker.broker_id
        (member,) = live["members"]
        assert member["client_id"] == CLIENT_ID
        assert sorted(tp["partition"] for tp in member["assignment"]) == [0, 1]
        assert live["offsets"] == [
            {
                "topic": topic,
                "partition": 0,
                "committed_offset": RECORDS,
                "log_end_offset": RECORDS + MORE_RECORDS,
                "lag": MORE_RECORDS,
                "member_id": member["member_id"],
            },
            {
                "topic": topic,
                "partition": 1,
                "committed_offset": RECORDS,
                "log_end_offset": RECORDS,
                "lag": 0,
                "member_id": member["member_id"],
            },
        ]
        text = riverbed("groups", "describe", group, *server).stdout
        assert "State: Stable" in text
        assert "CURRENT-OFFSET  LOG-END-OFFSET  LAG" in text
        assert CLIENT_ID in text
        assert f"{topic}:0,1" in text

        # A live group's offsets are not reset, nor is it deleted.
        busy = riverbed("groups", "reset-offsets", group, "--topic", topic, "--to-earliest",
                        "--execute", *server)  # fmt: skip
        assert_one_line_error(busy, "NON_EMPTY_GROUP", "Stable")
        assert_one_line_error(riverbed("groups", "delete", group, *server), "NON_EMPTY_GROUP")
        assert committed(broker, group) == {0: RECORDS, 1: RECORDS}
    finally:
        consumer.close()

    assert describe(broker, group)["state"] == "Empty"
    dry = riverbed("groups", "reset-offsets", group, "--topic", topic, "--to-earliest", *server)
    assert dry.returncode == 0
    assert "dry run" in dry.stderr
    assert [line.split() for line in dry.stdout.splitlines()] == [
        ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
        [group, topic, "0", "0"],
        [group, topic, "1", "0"],
    ]
    assert committed(broker, group) == {0: RECORDS, 1: RECORDS}

    reset(broker, group, "--topic", topic, "--to-earliest", "--execute")
    assert committed(broker, group) == {0: 0, 1: 0}
    # The first record stamped at or after the time; none after it: the log end.
    reset(broker, group, "--topic", topic, "--to-datetime", iso(BASE_TIMESTAMP_MS + 2500),
          "--execute")  # fmt: skip
    assert committed(broker, group) == {0: 3, 1: 3}
    plus_two = timezone(timedelta(hours=2))
    reset(broker, group, "--topic", topic, "--to-datetime",
          iso(BASE_TIMESTAMP_MS + 5500, plus_two), "--execute")  # fmt: skip
    assert committed(broker, group) == {0: RECORDS + 1, 1: RECORDS}
    reset(broker, group, "--topic", f"{topic}:1", "--to-offset", "1", "--execute")
    assert committed(broker, group) == {0: RECORDS + 1, 1: 1}
    clamped = riverbed("groups", "reset-offsets", group, "--topic", f"{topic}:0", "--to-offset",
                       "99", "--execute", *server)  # fmt: skip
    assert clamped.returncode == 0
    assert "outside the log" in clamped.stderr
    assert committed(broker, group) == {0: RECORDS + MORE_RECORDS, 1: 1}
    reset(broker, group, "--topic", topic, "--to-latest", "--execute")
    after = describe(broker, group)
    assert [(r["committed_offset"], r["lag"]) for r in after["offsets"]] == [
        (RECORDS + MORE_RECORDS, 0),
        (RECORDS, 0),
    ]
    assert after["members"] == []

    deleted = riverbed("groups", "delete", group, *server)
    assert deleted.returncode == 0
    assert deleted.stdout.strip() == f"deleted group {group}"
    assert group not in riverbed("groups", "list", *server).stdout.split()
    assert_one_line_error(riverbed("groups", "describe", group, *server), "GROUP_ID_NOT_FOUND")
    assert_one_line_error(riverbed("groups", "delete", group, *server), "GROUP_ID_NOT_FOUND")


def test_group_errors_are_one_line(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(GROUP_SETTINGS)
    server = ("--bootstrap-server", broker.bootstrap)
    unknown_topic = riverbed("groups", "reset-offsets", "g", "--topic", "nope", "--to-latest",
                             *server)  # fmt: skip
    assert_one_line_error(unknown_topic, "UNKNOWN_TOPIC_OR_PARTITION", "nope")
    bad_partition = riverbed("groups", "reset-offsets", "g", "--topic", "t:x", "--to-latest",
                             *server)  # fmt: skip
    assert_one_line_error(bad_partition, "'x' is not a partition number")

    bad_time = riverbed("groups", "reset-offsets", "g", "--topic", "t", "--to-datetime",
                        "yesterday", *server)  # fmt: skip
    assert bad_time.returncode == 2
    assert "ISO 8601" in bad_time.stderr
    no_target = riverbed("groups", "reset-offsets", "g", "--topic", "t", *server)
    assert no_target.returncode == 2
    assert "--to-earliest" in no_target.stderr

    nowhere = ("--bootstrap-server", f"127.0.0.1:{free_port()}")
    for action in (("list",), ("describe", "g"), ("delete", "g")):
        assert_one_line_error(riverbed("groups", *action, *nowhere))
