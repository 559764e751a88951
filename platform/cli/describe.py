"""`riverbed cluster describe`, `riverbed topics describe` and `riverbed topics tier`: what the
cluster and a topic look like, as rich tables or `--json`.

`topics describe` shows per partition its leader, replicas and ISR (Metadata), its log start,
local log start, high watermark and last tiered offset (ListOffsets: earliest, earliest-local
KIP-405, latest, latest-tiered KIP-1005, asked of the leader), and the leader's hot (local) and
cold (remote) bytes (DescribeLogDirs with Riverbed's tagged extension); then every config with
its value and source. `topics tier` turns tiering on for a topic and, with `--wait`, shows the
upload of its sealed segments until none is left.

Each action is an `async def (admin, args) -> exit status` run by `riverbed.cli.main`.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Final

from rich.progress import DownloadColumn
from riverbed.cli.render import print_json, print_table, progress_bar, stdout_console
from riverbed.client.admin import (
    Admin,
    ClusterDescription,
    ConfigSource,
    OffsetSpec,
    PartitionDescription,
    ReplicaLogDir,
)
from riverbed.client.types import TopicPartition
from riverbed.errors import KafkaTimeoutError

# ListOffsets asked of each partition's leader, and the column each fills.
OFFSET_COLUMNS: Final[Mapping[str, OffsetSpec]] = {
    "log_start_offset": "earliest",
    "local_log_start_offset": "earliest_local",
    "high_watermark": "latest",
    "last_tiered_offset": "latest_tiered",
}
TIER_POLL_INTERVAL_S: Final = 0.5
TIER_WAIT_DEFAULT_S: Final = 600.0
SOURCE_NAMES: Final = {
    ConfigSource.DYNAMIC_TOPIC_CONFIG: "topic",
    ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG: "cluster",
    ConfigSource.STATIC_BROKER_CONFIG: "broker",
    ConfigSource.DEFAULT_CONFIG: "default",
}


@dataclass(frozen=True, slots=True)
class PartitionView:
    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    log_start_offset: int | None
    local_log_start_offset: int | None
    high_watermark: int | None
    last_tiered_offset: int | None
    hot_bytes: int | None
    cold_bytes: int | None
    tiering_backlog_bytes: int | None


async def describe_cluster(admin: Admin, args: argparse.Namespace) -> int:
    cluster = await admin.describe_cluster()
    under = cluster.under_replicated()
    offline = cluster.offline()
    if args.json:
        print_json(
            {
                "cluster_id": cluster.cluster_id,
                "controller_id": cluster.controller_id,
                "brokers": [
                    {"id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
                    for b in cluster.brokers
                ],
                "under_replicated_partitions": _partition_list(cluster, under),
                "offline_partitions": _partition_list(cluster, offline),
            }
        )
        return 0
    console = stdout_console()
    console.print(f"Cluster {cluster.cluster_id}  controller {cluster.controller_id}")
    print_table(
        console,
        f"Brokers ({len(cluster.brokers)})",
        ("id", "host", "port", "rack", "controller"),
        (
            (b.node_id, b.host, b.port, b.rack, "yes" if b.node_id == cluster.controller_id else "")
            for b in cluster.brokers
        ),
    )
    for title, found in (("Under-replicated", under), ("Offline", offline)):
        print_table(
            console,
            f"{title} partitions ({len(found)} of {len(cluster.partitions)})",
            ("topic", "partition", "leader", "replicas", "isr"),
            _partition_rows(cluster, found),
        )
    return 0


async def describe_topic(admin: Admin, args: argparse.Namespace) -> int:
    topic = await admin.describe_topic(args.name)
    views = await _partition_views(admin, args.name, topic.partitions)
    sources = {name: _source_name(source) for name, source in topic.config_sources.items()}
    if args.json:
        print_json(
            {
                "name": topic.name,
                "topic_id": str(topic.topic_id),
                "partitions": [asdict(view) for view in views],
                "configs": topic.configs,
                "config_sources": sources,
            }
        )
        return 0
    console = stdout_console()
    console.print(f"Topic {topic.name}  id {topic.topic_id}  partitions {len(views)}")
    print_table(
        console,
        "Partitions",
        (
            "partition",
            "leader",
            "epoch",
            "replicas",
            "isr",
            "log start",
            "local start",
            "high watermark",
            "last tiered",
            "hot bytes",
            "cold bytes",
        ),
        (
            (
                v.partition,
                v.leader,
                v.leader_epoch,
                v.replicas,
                v.isr,
                v.log_start_offset,
                v.local_log_start_offset,
                v.high_watermark,
                v.last_tiered_offset,
                v.hot_bytes,
                v.cold_bytes,
            )
            for v in views
        ),
    )
    print_table(
        console,
        "Configs",
        ("name", "value", "source"),
        ((name, value, sources[name]) for name, value in sorted(topic.configs.items())),
    )
    return 0


async def tier_topic(admin: Admin, args: argparse.Namespace) -> int:
    await admin.alter_configs(args.name, set={"remote.storage.enable": "true"})
    if not args.wait:
        print(f"tiering {args.name}: sealed segments upload in the background")
        return 0
    description = await admin.describe_topic(args.name)
    with progress_bar(f"tiering {args.name}", DownloadColumn()) as progress:
        bar = progress.add_task("tiering", total=None)
        try:
            async with asyncio.timeout(args.timeout_s):
                while True:
                    leaders = await _leader_replicas(admin, args.name, description.partitions)
                    known = [r for r in leaders.values() if r is not None]
                    cold = sum(max(r.remote_size_bytes, 0) for r in known)
                    backlog = sum(max(r.tiering_backlog_bytes, 0) for r in known)
                    progress.update(bar, completed=cold, total=cold + backlog)
                    measured = len(known) == len(leaders) and all(
                        r.tiering_backlog_bytes >= 0 for r in known
                    )
                    if measured and backlog == 0:
                        break
                    await asyncio.sleep(TIER_POLL_INTERVAL_S)
        except TimeoutError:
            raise KafkaTimeoutError(
                f"{args.name} still has sealed segments to upload after {args.timeout_s:g} s; "
                "tiering goes on"
            ) from None
    print(f"tiered {args.name}: {cold} bytes in the cold tier, nothing sealed left to upload")
    return 0


# ---- gathering ------------------------------------------------------------------------------


async def _partition_views(
    admin: Admin, topic: str, partitions: tuple[PartitionDescription, ...]
) -> list[PartitionView]:
    led = [TopicPartition(topic, p.partition) for p in partitions if p.leader >= 0]
    offsets: dict[str, dict[TopicPartition, int]] = {}
    for column, spec in OFFSET_COLUMNS.items():
        found = await admin.list_offsets(dict.fromkeys(led, spec)) if led else {}
        offsets[column] = {tp: answer.offset for tp, answer in found.items()}
    leaders = await _leader_replicas(admin, topic, partitions)
    views = []
    for p in partitions:
        tp = TopicPartition(topic, p.partition)
        replica = leaders.get(p.partition)
        views.append(
            PartitionView(
                partition=p.partition,
                leader=p.leader,
                leader_epoch=p.leader_epoch,
                replicas=list(p.replicas),
                isr=list(p.isr),
                **{column: offsets[column].get(tp) for column in OFFSET_COLUMNS},
                hot_bytes=None if replica is None else replica.size_bytes,
                cold_bytes=_known(replica.remote_size_bytes) if replica else None,
                tiering_backlog_bytes=_known(replica.tiering_backlog_bytes) if replica else None,
            )
        )
    return views


async def _leader_replicas(
    admin: Admin, topic: str, partitions: tuple[PartitionDescription, ...]
) -> dict[int, ReplicaLogDir | None]:
    """What each partition's leader's DescribeLogDirs says of it (None: no leader)."""
    leader_ids = {p.leader for p in partitions if p.leader >= 0}
    dirs = await admin.describe_log_dirs([topic], leader_ids) if leader_ids else {}
    found: dict[int, ReplicaLogDir | None] = {}
    for p in partitions:
        tp = TopicPartition(topic, p.partition)
        found[p.partition] = next(
            (d.replicas[tp] for d in dirs.get(p.leader, []) if tp in d.replicas), None
        )
    return found


def _known(value: int) -> int | None:
    return None if value < 0 else value


def _partition_rows(
    cluster: ClusterDescription, found: list[TopicPartition]
) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for tp in found:
        p = cluster.partitions[tp]
        rows.append((tp.topic, tp.partition, p.leader, p.replicas, p.isr))
    return rows


def _partition_list(cluster: ClusterDescription, found: list[TopicPartition]) -> list[object]:
    return [
        dict(zip(("topic", "partition", "leader", "replicas", "isr"), row, strict=True))
        | {
            "replicas": list(cluster.partitions[tp].replicas),
            "isr": list(cluster.partitions[tp].isr),
        }
        for tp, row in zip(found, _partition_rows(cluster, found), strict=True)
    ]


def _source_name(source: ConfigSource) -> str:
    """Where a value comes from, in the words `topics describe` uses."""
    return SOURCE_NAMES.get(source, source.name.lower())
