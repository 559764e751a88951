"""`riverbed cluster describe`, `topics describe` and `topics tier` against real brokers (with a
file:// cold tier), text and --json; and kafka-python's describe_log_dirs against the broker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient
from riverbed import Admin, Producer

from tests.support.cluster import ClusterFactory, TestCluster

TOPIC = "described"
RECORDS = 600
VALUE = b"v" * 300
WAIT_S = 60.0


def riverbed(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riverbed.cli", *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
        check=False,
    )


def rows(table: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines()]


async def cli(cluster: TestCluster, *args: str) -> subprocess.CompletedProcess[str]:
    done = await asyncio.to_thread(riverbed, *args, "--bootstrap-server", cluster.bootstrap)
    assert done.returncode == 0, done.stderr
    return done


async def start(cluster_factory: ClusterFactory, tmp_path: Path) -> TestCluster:
    cluster = await cluster_factory(
        2,
        {
            "zookeeper.session.timeout.ms": "4000",
            "remote.storage.url": f"file://{tmp_path / 'cold'}",
            "remote.log.manager.task.interval.ms": "200",
        },
    )
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(
            TOPIC, partitions=2, replication_factor=2, configs={"segment.bytes": "16384"}
        )
    async with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        for i in range(RECORDS):
            await producer.send(TOPIC, VALUE, partition=i % 2)
        await producer.flush()
    return cluster


async def test_topics_describe_and_tier_show_offsets_and_both_tiers(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    cluster = await start(cluster_factory, tmp_path)

    before = json.loads((await cli(cluster, "topics", "describe", TOPIC, "--json")).stdout)
    for p in before["partitions"]:
        assert p["high_watermark"] == RECORDS // 2
        assert p["log_start_offset"] == p["local_log_start_offset"] == 0
        assert p["last_tiered_offset"] == -1  # not tiered yet
        assert p["hot_bytes"] > RECORDS // 2 * len(VALUE)
        assert p["cold_bytes"] is None  # tiering is off for the topic
        assert sorted(p["replicas"]) == sorted(p["isr"]) == [1, 2]
    assert before["config_sources"]["segment.bytes"] == "topic"

    tiered = await cli(cluster, "topics", "tier", TOPIC, "--wait", "--timeout-s", "60")
    assert tiered.stdout.startswith(f"tiered {TOPIC}: ")

    after = json.loads((await cli(cluster, "topics", "describe", TOPIC, "--json")).stdout)
    for p in after["partitions"]:
        assert p["cold_bytes"] > 0
        assert p["tiering_backlog_bytes"] == 0
        # Everything below the active segment is in the cold tier.
        assert 0 < p["last_tiered_offset"] < p["high_watermark"] == RECORDS // 2
    text = (await cli(cluster, "topics", "describe", TOPIC)).stdout
    by_partition = {row[0]: row for row in rows(text) if row and row[0] in ("0", "1")}
    for p in after["partitions"]:
        row = by_partition[str(p["partition"])]
        assert row[1] == str(p["leader"])
        assert row[7] == str(RECORDS // 2)  # high watermark
        assert row[8] == str(p["last_tiered_offset"])
        assert row[10] == str(p["cold_bytes"])
    assert ["remote.storage.enable", "true", "topic"] in rows(text)


async def test_cluster_describe_names_under_replicated_partitions(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    cluster = await start(cluster_factory, tmp_path)
    healthy = json.loads((await cli(cluster, "cluster", "describe", "--json")).stdout)
    assert [b["id"] for b in healthy["brokers"]] == [1, 2]
    assert healthy["controller_id"] in (1, 2)
    assert healthy["under_replicated_partitions"] == healthy["offline_partitions"] == []

    cluster.kill(2)

    async def shrunk() -> dict[str, Any] | None:
        """Both partitions out of sync: one may shrink its ISR later than the other (its leader
        notices the lag; the controller moves a partition broker 2 led)."""
        described: dict[str, Any] = json.loads(
            (await cli(cluster, "cluster", "describe", "--json")).stdout
        )
        out = {
            (p["topic"], p["partition"])
            for p in described["under_replicated_partitions"]
            if 2 not in p["isr"]
        }
        return described if {(TOPIC, 0), (TOPIC, 1)} <= out else None

    degraded = await cluster.wait_for(shrunk, WAIT_S, what="broker 2 out of the ISRs")
    under = {(p["topic"], p["partition"]) for p in degraded["under_replicated_partitions"]}
    assert {(TOPIC, 0), (TOPIC, 1)} <= under
    assert all(p["isr"] == [1] for p in degraded["under_replicated_partitions"])
    text = (await cli(cluster, "cluster", "describe")).stdout
    assert [TOPIC, "0", "1", "1,2", "1"] in rows(text) or [TOPIC, "0", "1", "2,1", "1"] in rows(
        text
    )
    assert any(row[:1] == ["Under-replicated"] and f"({len(under)}" in row[2] for row in rows(text))


async def test_kafka_python_describes_log_dirs(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    cluster = await start(cluster_factory, tmp_path)

    def describe() -> Any:
        client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        try:
            return client.describe_log_dirs()
        finally:
            client.close()

    answer = await asyncio.to_thread(describe)
    text = repr(answer)
    assert TOPIC in text
    assert str(cluster.brokers[1].data_dir.resolve()) in text
