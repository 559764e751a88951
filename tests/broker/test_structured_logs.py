"""Structured logs (riverbed.common.log_events): the two formats line by line, and the events real
broker processes write when leaders, ISRs, segments and clients misbehave."""

from __future__ import annotations

import json
import logging
import socket
import struct
import sys
from pathlib import Path

import pytest
from riverbed import Admin, Producer
from riverbed.common.log_events import JsonFormatter, KeyValueFormatter, event

from tests.support.cluster import ClusterFactory, TestCluster, partition_state

WAIT_S = 60.0
TOPIC = "logged"


def record(message: str = "plain %s", *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("riverbed.test", logging.INFO, __file__, 1, message, args, None)
    made.created = 1_790_000_000.5
    for key, value in extra.items():
        setattr(made, key, value)
    return made


def event_record(name: str, **fields: object) -> logging.LogRecord:
    captured: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            captured.append(record)

    logger = logging.getLogger(f"riverbed.test.{name}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(Keep())
    event(logger, logging.INFO, name, **fields)  # type: ignore[arg-type]
    [made] = captured
    made.created = 1_790_000_000.5
    return made


def test_key_value_lines() -> None:
    line = KeyValueFormatter().format(
        event_record(
            "partition.leader_changed", topic="orders", partition=0, isr=[1, 2], note='a "b"=c'
        )
    )
    assert line == (
        "ts=2026-09-21T14:13:20.500Z level=INFO logger=riverbed.test.partition.leader_changed "
        'event=partition.leader_changed topic=orders partition=0 isr=1,2 note="a \\"b\\"=c"'
    )
    plain = KeyValueFormatter().format(record("two\nlines %d", 7))
    assert plain.endswith('msg="two\\nlines 7"')
    assert "\n" not in plain
    assert (
        KeyValueFormatter()
        .format(event_record("e", empty="", none=None, flag=True))
        .endswith('event=e empty="" none=null flag=true')
    )


@pytest.mark.parametrize(
    ("created", "expected"),
    [
        (1_790_000_000.5, "2026-09-21T14:13:20.500Z"),
        (1_790_000_000.999, "2026-09-21T14:13:20.999Z"),
        (1_790_000_001.0, "2026-09-21T14:13:21.000Z"),  # the next second: a new date prefix
        (1_790_000_000.001, "2026-09-21T14:13:20.001Z"),  # and back again
        (1_790_003_600.25, "2026-09-21T15:13:20.250Z"),
    ],
)
def test_timestamps_across_seconds(created: float, expected: str) -> None:
    made = record()
    made.created = created
    assert KeyValueFormatter().format(made).startswith(f"ts={expected} ")


def test_json_lines_keep_types_and_tracebacks() -> None:
    line = JsonFormatter().format(event_record("tiering.segment_uploaded", partition=3, isr=[1]))
    assert json.loads(line) == {
        "ts": "2026-09-21T14:13:20.500Z",
        "level": "INFO",
        "logger": "riverbed.test.tiering.segment_uploaded",
        "event": "tiering.segment_uploaded",
        "partition": 3,
        "isr": [1],
    }
    try:
        raise ValueError("boom")
    except ValueError:
        failed = record("failed", exc_info=sys.exc_info())
    for formatter in (JsonFormatter(), KeyValueFormatter()):
        text = formatter.format(failed)
        assert "\n" not in text
        assert "ValueError: boom" in text.replace("\\n", "\n")
    assert "Traceback" in json.loads(JsonFormatter().format(failed))["exc"]
    # A field named like a fixed key is kept, not lost.
    clash = json.loads(JsonFormatter().format(event_record("e", level="high")))
    assert clash["level"] == "INFO"
    assert clash["field.level"] == "high"


def events(cluster: TestCluster) -> list[dict[str, object]]:
    """Every line of every broker's output, parsed: each must be one JSON object."""
    parsed = []
    for broker in cluster.brokers.values():
        for line in broker.log_path.read_text(encoding="utf-8").splitlines():
            document = json.loads(line)
            assert isinstance(document, dict)
            assert {"ts", "level", "logger"} <= document.keys()
            document["broker_log"] = broker.broker_id
            parsed.append(document)
    return parsed


def find(cluster: TestCluster, name: str, **fields: object) -> list[dict[str, object]]:
    return [
        e
        for e in events(cluster)
        if e.get("event") == name and all(e.get(k) == v for k, v in fields.items())
    ]


async def wait_for_event(cluster: TestCluster, name: str, **fields: object) -> dict[str, object]:
    async def found() -> dict[str, object] | None:
        matches = find(cluster, name, **fields)
        return matches[0] if matches else None

    return await cluster.wait_for(found, WAIT_S, what=f"a {name} event with {fields}")


async def test_a_json_logged_incident_reads_as_events(
    cluster_factory: ClusterFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RIVERBED_LOG_FORMAT", "json")  # the brokers inherit it
    cluster = await cluster_factory(
        2,
        {
            "zookeeper.session.timeout.ms": "4000",
            "replica.lag.time.max.ms": "2000",
            "log.retention.check.interval.ms": "200",
            "remote.storage.url": f"file://{tmp_path / 'cold'}",
            "remote.log.manager.task.interval.ms": "200",
        },
    )
    assert find(cluster, "controller.elected")
    assert len(find(cluster, "broker.started")) == 2

    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(
            TOPIC,
            partitions=1,
            replication_factor=2,
            configs={"segment.bytes": "4096", "retention.bytes": "20000"},
        )
        await admin.create_topic(
            "tiered",
            partitions=1,
            replication_factor=1,
            configs={"segment.bytes": "4096", "remote.storage.enable": "true"},
        )
    before = await partition_state(cluster.bootstrap, TOPIC, 0)
    async with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        for _ in range(300):
            await producer.send(TOPIC, b"x" * 200, partition=0)
            await producer.send("tiered", b"y" * 200, partition=0)
        await producer.flush()

    # Retention deleted old segments; tiering uploaded sealed ones.
    deleted = await wait_for_event(cluster, "log.segments_deleted", topic=TOPIC, partition=0)
    assert deleted["level"] == "INFO"
    assert int(str(deleted["bytes"])) > 0
    uploaded = await wait_for_event(cluster, "tiering.segment_uploaded", topic="tiered")
    assert int(str(uploaded["records"])) > 0

    # A client sending garbage: one WARNING naming it; the broker serves on.
    leader_port = cluster.brokers[before.leader].port
    with socket.create_connection(("127.0.0.1", leader_port)) as garbage:
        local = garbage.getsockname()
        garbage.sendall(struct.pack(">i", 12) + b"\xff" * 12)
        garbage.settimeout(WAIT_S)
        assert garbage.recv(1) == b""  # closed by the broker
    closed = await wait_for_event(cluster, "client.connection_closed")
    assert closed["level"] == "WARNING"
    assert str(local[1]) in str(closed["client"])
    assert await partition_state(cluster.bootstrap, TOPIC, 0)

    # The leader dies: the controller's decision and the new leader's ISR shrink are events.
    survivor = next(b for b in cluster.brokers if b != before.leader)
    cluster.kill(before.leader)
    changed = await wait_for_event(
        cluster, "partition.leader_changed", topic=TOPIC, partition=0, leader=survivor
    )
    assert changed["previous_leader"] == before.leader
    assert changed["isr"] == [survivor]
    assert int(str(changed["leader_epoch"])) > before.leader_epoch
    await wait_for_event(cluster, "partition.leading", topic=TOPIC, partition=0)
