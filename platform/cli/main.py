"""The `riverbed` command: run brokers and a local development cluster, manage topics,
consumer groups (`riverbed groups ...`, in riverbed.cli.groups), ACLs (`riverbed acls ...`,
in riverbed.cli.acls) and SASL users (`riverbed users ...`, in riverbed.cli.users).

Every failure a user can cause (bad flag, bad config, unreachable broker, Kafka error) ends in one
line on stderr naming the problem and a non-zero exit; tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from riverbed.cli import acls as cli_acls
from riverbed.cli import connect as cli_connect
from riverbed.cli import describe as cli_describe
from riverbed.cli import groups as cli_groups
from riverbed.cli import partitions as cli_partitions
from riverbed.cli import truncate as cli_truncate
from riverbed.cli import users as cli_users
from riverbed.cli.env_config import settings_from_env
from riverbed.cli.local_cluster import (
    COLD_TIER_DIR,
    DEFAULT_PORT_BASE,
    DEMO_PARTITIONS,
    DEMO_REPLICATION_FACTOR_MAX,
    ClusterError,
    ClusterSpec,
)
from riverbed.cli.local_cluster import run as run_cluster
from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.producer import Producer
from riverbed.client.types import Record
from riverbed.common import log_events
from riverbed.common.allocator import keep_freed_blocks
from riverbed.common.gc_tuning import freeze_started_objects, tune_collector
from riverbed.common.scheduling import apply_scheduling_policy
from riverbed.configs import BrokerConfig, parse_properties
from riverbed.coordination.embedded_zk import ZooKeeperNotInstalledError, ZooKeeperStartError
from riverbed.coordination.metadata import BrokerIdConflictError
from riverbed.coordination.zk import ZkError
from riverbed.hot.storage.log_manager import DataDirLockedError
from riverbed.protocol.errors import KafkaError

log = logging.getLogger("riverbed")

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
EXIT_USAGE = 2
EXIT_FAILURE = 1
# `riverbed consume` without --idle-timeout-ms: how long one poll waits (it loops forever).
CONSUME_POLL_MS = 1000


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


# Failures a user can cause or fix (flags, configs, ZooKeeper, data dir, Kafka errors): printed as
# one line. Anything else is a bug and keeps its traceback.
USER_ERRORS = (
    CliError,
    ClusterError,
    KafkaError,  # includes riverbed.configs.ConfigError
    ValueError,
    OSError,
    ZkError,
    ZooKeeperNotInstalledError,
    ZooKeeperStartError,
    BrokerIdConflictError,
    DataDirLockedError,
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.log_format not in log_events.LOG_FORMATS:  # from RIVERBED_LOG_FORMAT
        parser.error(f"--log-format must be one of {', '.join(log_events.LOG_FORMATS)}")
    log_events.configure(args.log_level, args.log_format)
    # `cluster up`'s brokers are children: they log in the same format.
    os.environ["RIVERBED_LOG_FORMAT"] = args.log_format
    try:
        command: Callable[[argparse.Namespace], int] = args.command
        sys.exit(command(args))
    except USER_ERRORS as error:
        print(f"riverbed: error: {_describe(error)}", file=sys.stderr)
        sys.exit(EXIT_FAILURE)
    except KeyboardInterrupt:
        sys.exit(130)


def _describe(error: BaseException) -> str:
    # A KafkaError's text already starts with its code's name.
    return str(error)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="riverbed", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("RIVERBED_LOG_LEVEL", "INFO"))
    parser.add_argument(
        "--log-format",
        choices=log_events.LOG_FORMATS,
        default=os.environ.get("RIVERBED_LOG_FORMAT", "text"),
        help="one line per event: key=value text or JSON (docs/logging.md)",
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    broker = commands.add_parser(
        "broker",
        help="run one broker",
        description="Run one broker. Settings, lowest precedence first: defaults, --config, "
        "RIVERBED_* environment variables, --set, the dedicated flags (--id, --listen, ...).",
        epilog="Environment: RIVERBED_<NAME> sets the broker setting NAME lower-cased, with ___ "
        "-> '-', __ -> '_', _ -> '.' (RIVERBED_LOG_RETENTION_MS=3600000 sets log.retention.ms); "
        "a RIVERBED_* variable that names no broker setting is an error. RIVERBED_LOG_LEVEL and "
        "RIVERBED_LOG_FORMAT are --log-level's and --log-format's defaults, not broker settings.",
    )
    broker.add_argument("--id", type=int, dest="broker_id", help="broker.id")
    broker.add_argument(
        "--listen",
        action="append",
        metavar="[NAME://]HOST:PORT",
        help="a listener, in Kafka's syntax (SASL_SSL://127.0.0.1:9094); HOST:PORT alone is "
        "PLAINTEXT; repeat for several (together they set `listeners`)",
    )
    broker.add_argument("--data-dir", metavar="DIR", help="log.dirs: where partition logs live")
    broker.add_argument("--zookeeper", metavar="HOST:PORT[/CHROOT]", help="zookeeper.connect")
    broker.add_argument("--config", metavar="FILE", help="a .properties file with the same keys")
    broker.add_argument(
        "--object-store",
        metavar="URL",
        help="remote.storage.url: the cold tier, file:///path or s3://bucket/prefix",
    )
    broker.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="any broker setting"
    )
    broker.set_defaults(command=_run_broker)

    cluster = commands.add_parser("cluster", help="run a local cluster of brokers")
    cluster_commands = cluster.add_subparsers(required=True, metavar="ACTION")
    up = cluster_commands.add_parser(
        "up", help="start ZooKeeper and N brokers on 127.0.0.1 until Ctrl-C (`make run`)"
    )
    up.add_argument("--brokers", type=int, required=True, metavar="N", help="broker ids 1..N")
    up.add_argument(
        "--data-dir", required=True, metavar="DIR", help="state: DIR/broker-<id>, DIR/zookeeper"
    )
    up.add_argument(
        "--zookeeper", metavar="HOST:PORT[/CHROOT]", help="use this ZooKeeper, not a local one"
    )
    up.add_argument(
        "--port-base",
        type=int,
        default=DEFAULT_PORT_BASE,
        metavar="P",
        help="broker <id> listens on P + id - 1",
    )
    up.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a setting for every broker"
    )
    up.add_argument(
        "--demo-topic",
        metavar="NAME",
        help="create this topic (tiered: remote.storage.enable=true) unless it exists",
    )
    up.set_defaults(command=_cluster_up)
    cluster_describe = cluster_commands.add_parser(
        "describe", help="brokers, controller, under-replicated and offline partitions"
    )
    cluster_describe.add_argument("--json", action="store_true", help="machine-readable output")
    cluster_describe.add_argument(
        "--bootstrap-server", default=DEFAULT_BOOTSTRAP, metavar="HOST:PORT"
    )
    cluster_describe.set_defaults(command=_admin_action, admin_action=cli_describe.describe_cluster)

    topics = commands.add_parser("topics", help="create, list, describe and delete topics")
    topic_commands = topics.add_subparsers(required=True, metavar="ACTION")
    create = topic_commands.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=-1)
    create.add_argument("--replication-factor", type=int, default=-1)
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    create.set_defaults(command=_topics_create)
    listing = topic_commands.add_parser("list", help="list topics")
    listing.set_defaults(command=_topics_list)
    describe = topic_commands.add_parser(
        "describe", help="partitions (replicas, offsets, hot and cold bytes) and configs"
    )
    describe.add_argument("name")
    describe.add_argument("--json", action="store_true", help="machine-readable output")
    describe.set_defaults(command=_admin_action, admin_action=cli_describe.describe_topic)
    tier = topic_commands.add_parser(
        "tier", help="turn tiering on (remote.storage.enable) and show the upload"
    )
    tier.add_argument("name")
    tier.add_argument(
        "--wait", action="store_true", help="show progress until no sealed segment is left"
    )
    tier.add_argument("--timeout-s", type=float, default=cli_describe.TIER_WAIT_DEFAULT_S)
    tier.set_defaults(command=_admin_action, admin_action=cli_describe.tier_topic)
    truncate = topic_commands.add_parser(
        "truncate", help="delete the records below an offset, from both tiers (DeleteRecords)"
    )
    cli_truncate.add_arguments(truncate)
    truncate.set_defaults(command=_admin_action, admin_action=cli_truncate.truncate_topic)
    alter = topic_commands.add_parser(
        "alter", help="set or remove a topic's config overrides (applied live), add partitions"
    )
    alter.add_argument("name")
    alter.add_argument(
        "--partitions",
        type=int,
        metavar="N",
        help="add partitions up to N in all (CreatePartitions)",
    )
    alter.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    alter.add_argument(
        "--delete", action="append", default=[], metavar="KEY", help="back to the default"
    )
    alter.set_defaults(command=_topics_alter)
    delete = topic_commands.add_parser("delete", help="delete a topic")
    delete.add_argument("name")
    delete.set_defaults(command=_topics_delete)
    for sub in (create, listing, describe, tier, truncate, alter, delete):
        cli_connect.add_connection_flags(sub, DEFAULT_BOOTSTRAP)

    produce = commands.add_parser("produce", help="produce stdin's lines to a topic")
    produce.add_argument("topic")
    produce.add_argument("--key-separator", metavar="SEP", help="split KEY<SEP>VALUE per line")
    produce.add_argument("--partition", type=int)
    produce.add_argument("--acks", default="all", choices=["0", "1", "all"])
    produce.add_argument(
        "--compression-type", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"]
    )
    produce.set_defaults(command=_produce)

    consume = commands.add_parser("consume", help="print a topic's records")
    consume.add_argument("topic")
    consume.add_argument("--from-beginning", action="store_true", help="else only new records")
    consume.add_argument("--max", type=int, metavar="N", help="stop after N records")
    consume.add_argument(
        "--idle-timeout-ms", type=int, metavar="MS", help="stop when nothing came for MS"
    )
    consume.add_argument("--format", choices=["text", "json"], default="text")
    consume.set_defaults(command=_consume)
    for sub in (produce, consume):
        cli_connect.add_connection_flags(sub, DEFAULT_BOOTSTRAP)

    groups = cli_groups.add_parser(commands, DEFAULT_BOOTSTRAP)
    groups.set_defaults(command=_admin_action)
    for replicas in cli_partitions.add_parsers(commands, DEFAULT_BOOTSTRAP):
        replicas.set_defaults(command=_admin_action)
    cli_users.add_parser(commands)  # its actions set their own `command`
    cli_acls.add_parser(commands, DEFAULT_BOOTSTRAP)
    return parser


def _parse_pairs(pairs: Sequence[str], what: str) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"{what} {pair!r} is not KEY=VALUE")
        result[key.strip()] = value.strip()
    return result


def broker_config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> BrokerConfig:
    """Merge the config file, then RIVERBED_* variables of `environ` (riverbed.cli.env_config), then
    --set pairs, then the dedicated flags (highest precedence)."""
    settings: dict[str, str] = {}
    if args.config:
        settings.update(parse_properties(Path(args.config).read_text()))
    settings.update(settings_from_env(environ))
    settings.update(_parse_pairs(args.set, "--set"))
    if args.broker_id is not None:
        settings["broker.id"] = str(args.broker_id)
    if args.listen:
        settings["listeners"] = ",".join(
            entry if "://" in entry else f"PLAINTEXT://{entry}" for entry in args.listen
        )
    if args.data_dir:
        settings["log.dirs"] = args.data_dir
    if args.zookeeper:
        settings["zookeeper.connect"] = args.zookeeper
    if args.object_store:
        settings["remote.storage.url"] = args.object_store
    return BrokerConfig.from_mapping(settings)


def _run_broker(args: argparse.Namespace) -> int:
    from riverbed.broker.broker import Broker  # keeps `topics` commands light

    config = broker_config_from_args(args)
    # Both before the broker starts its threads (they inherit the policy).
    keep_freed_blocks()
    apply_scheduling_policy(config.process_scheduling_policy)
    tune_collector()

    async def serve() -> None:
        broker = Broker(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await broker.start()
        except BaseException:
            await broker.stop()
            raise
        freeze_started_objects()
        await stop.wait()
        log.info("shutting down broker %d", config.broker_id)
        await broker.stop()

    asyncio.run(serve())
    return 0


def _cluster_up(args: argparse.Namespace) -> int:
    spec = ClusterSpec(
        broker_count=args.brokers,
        data_dir=Path(args.data_dir),
        port_base=args.port_base,
        zookeeper_connect=args.zookeeper,
        settings=_parse_pairs(args.set, "--set"),
        demo_topic=args.demo_topic,
    )

    def announce(zookeeper_connect: str) -> None:
        print(_cluster_banner(spec, zookeeper_connect), flush=True)

    status = run_cluster(spec, announce)
    print("riverbed: stopped", file=sys.stderr)
    return status


def _cluster_banner(spec: ClusterSpec, zookeeper_connect: str) -> str:
    data_dir = spec.data_dir.resolve()
    replicas = min(spec.broker_count, DEMO_REPLICATION_FACTOR_MAX)
    # Any one broker is enough to bootstrap from: clients learn the others from its metadata.
    server = f"--bootstrap-server {spec.bootstrap.split(',')[0]}"
    topic = spec.demo_topic or "demo"
    demo = create = ""
    if spec.demo_topic is not None:
        demo = f"  demo topic:        {topic} (tiered to the cold tier)\n"
    else:
        create = (
            f"  .venv/bin/riverbed topics create {topic} --partitions {DEMO_PARTITIONS} "
            f"--replication-factor {replicas} \\\n"
            f"      --config remote.storage.enable=true {server}\n"
        )
    return f"""
Riverbed is running: {spec.broker_count} broker(s).
  bootstrap servers: {spec.bootstrap}
  zookeeper:         {zookeeper_connect}
  state:             {data_dir}  (broker logs: {data_dir}/broker-<id>.log)
  cold tier:         {spec.settings.get("remote.storage.url", f"file://{data_dir / COLD_TIER_DIR}")}
{demo}Try it (in another terminal):
{create}  .venv/bin/riverbed topics describe {topic} {server}
  seq 1 5 | .venv/bin/riverbed produce {topic} {server}
  .venv/bin/riverbed consume {topic} --from-beginning --max 5 {server}
  (or any Kafka client, e.g. kcat -C -b {spec.bootstrap} -t {topic} -e)
Press Ctrl-C to stop.
"""


def _admin_command(args: argparse.Namespace, action: Callable[[Admin], Awaitable[int]]) -> int:
    async def run() -> int:
        async with Admin(**cli_connect.client_settings(args)) as admin:
            return await action(admin)

    return asyncio.run(run())


def _topics_create(args: argparse.Namespace) -> int:
    configs = _parse_pairs(args.config, "--config")

    async def action(admin: Admin) -> int:
        await admin.create_topic(
            args.name,
            partitions=args.partitions,
            replication_factor=args.replication_factor,
            configs=configs,
        )
        print(f"created topic {args.name}")
        return 0

    return _admin_command(args, action)


def _topics_list(args: argparse.Namespace) -> int:
    async def action(admin: Admin) -> int:
        for name in await admin.list_topics():
            print(name)
        return 0

    return _admin_command(args, action)


def _topics_alter(args: argparse.Namespace) -> int:
    """Configs first, then partitions, as Kafka's kafka-topics.sh --alter does."""
    to_set = _parse_pairs(args.set, "--set")
    if not to_set and not args.delete and args.partitions is None:
        raise CliError(
            "topics alter: nothing to change (give --set KEY=VALUE, --delete KEY or --partitions N)"
        )

    async def action(admin: Admin) -> int:
        if to_set or args.delete:
            await admin.alter_configs(args.name, set=to_set, delete=args.delete)
            print(f"altered topic {args.name}")
        if args.partitions is not None:
            await admin.create_partitions(args.name, partitions=args.partitions)
            print(f"topic {args.name} has {args.partitions} partitions")
        return 0

    return _admin_command(args, action)


def _topics_delete(args: argparse.Namespace) -> int:
    async def action(admin: Admin) -> int:
        await admin.delete_topic(args.name)
        print(f"deleted topic {args.name}")
        return 0

    return _admin_command(args, action)


def _admin_action(args: argparse.Namespace) -> int:
    """The admin actions of other modules (groups, partitions, leaders, describe, tier):
    `args.admin_action(admin, args)`."""
    action: cli_groups.GroupAction = args.admin_action
    return _admin_command(args, lambda admin: action(admin, args))


def _produce(args: argparse.Namespace) -> int:
    """Each stdin line (without its newline) is one record; `--key-separator` splits off a key."""
    separator = args.key_separator.encode() if args.key_separator else None

    async def run() -> int:
        count = 0
        async with Producer(
            **cli_connect.client_settings(args),
            acks=args.acks,
            compression_type=args.compression_type,
        ) as producer:
            for line in sys.stdin.buffer:
                value = line.rstrip(b"\n")
                key = None
                if separator is not None and separator in value:
                    key, value = value.split(separator, 1)
                await producer.send(args.topic, value, key=key, partition=args.partition)
                count += 1
            await producer.flush()
        print(f"produced {count} records to {args.topic}", file=sys.stderr)
        return 0

    return asyncio.run(run())


def _consume(args: argparse.Namespace) -> int:
    """Read every partition of the topic (no consumer group: partitions are assigned)."""

    async def run() -> int:
        # Metadata only (not describe_topic, which reads configs too): a reader needs no more
        # than READ and DESCRIBE on the topic.
        async with Admin(**cli_connect.client_settings(args)) as admin:
            partitions = await admin.topic_partitions(args.topic)
        printed = 0
        async with Consumer(**cli_connect.client_settings(args)) as consumer:
            consumer.assign(partitions)
            if args.from_beginning:
                await consumer.seek_to_beginning(*partitions)
            else:
                await consumer.seek_to_end(*partitions)
            while args.max is None or printed < args.max:
                wanted = None if args.max is None else args.max - printed
                batches = await consumer.getmany(
                    max_records=wanted, timeout_ms=args.idle_timeout_ms or CONSUME_POLL_MS
                )
                if not batches and args.idle_timeout_ms is not None:
                    break
                for records in batches.values():
                    for record in records:
                        _print_record(record, args.format)
                        printed += 1
                sys.stdout.flush()
        return 0

    return asyncio.run(run())


def _print_record(record: Record, output_format: str) -> None:
    if output_format == "text":
        sys.stdout.buffer.write((record.value or b"") + b"\n")
        return
    print(
        json.dumps(
            {
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "timestamp_ms": record.timestamp_ms,
                "timestamp_type": record.timestamp_type,
                "key": _text(record.key),
                "value": _text(record.value),
                "headers": [[name, _text(value)] for name, value in record.headers],
            }
        ),
        flush=False,
    )


def _text(data: bytes | None) -> str | None:
    """JSON has no bytes: UTF-8 text, with undecodable bytes as \\xNN escapes."""
    return None if data is None else data.decode("utf-8", errors="backslashreplace")
