"""`riverbed partitions ...` and `riverbed leaders elect`: move replicas between brokers and
elect preferred leaders (Kafka's kafka-reassign-partitions.sh and kafka-leader-election.sh).

`partitions reassign` takes one partition on the command line or a plan in Kafka's JSON format
(`{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2, 3]}]}`), asks
the controller to start the moves, and with `--wait` shows their progress until every one has
finished. `--throttle` caps the replication traffic of the moving replicas (bytes/second) for
the duration of the move, as Kafka's tool does, through the `*.replication.throttled.*` configs.

Each action is an `async def (admin, args) -> exit status` run by `riverbed.cli.main` with an Admin
connected to `--bootstrap-server`; per-partition failures are printed with their Kafka error
names and make the exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from rich.progress import MofNCompleteColumn, TextColumn
from riverbed.cli.connect import add_connection_flags
from riverbed.cli.render import progress_bar
from riverbed.client.admin import Admin, ConfigSource, PartitionErrors
from riverbed.client.types import TopicPartition
from riverbed.configs import FOLLOWER_RATE_CONFIG, FOLLOWER_REPLICAS_CONFIG
from riverbed.errors import KafkaError, KafkaTimeoutError
from riverbed.protocol.errors import ErrorCode

# How often `--wait` asks the controller which moves are still in progress.
REASSIGNMENT_POLL_INTERVAL_S: Final = 0.5
REASSIGNMENT_WAIT_DEFAULT_S: Final = 600.0
PLAN_VERSION: Final = 1


def add_parsers(commands: Any, bootstrap_default: str) -> list[argparse.ArgumentParser]:
    """Add `partitions` and `leaders` to the `riverbed` subcommands; each action is set as the
    `admin_action` default of its parser. Returns the parsers of the two commands."""
    partitions: argparse.ArgumentParser = commands.add_parser(
        "partitions", help="move partition replicas between brokers"
    )
    actions = partitions.add_subparsers(required=True, metavar="ACTION")
    reassign = actions.add_parser(
        "reassign", help="move replicas to other brokers (or cancel a move)"
    )
    what = reassign.add_mutually_exclusive_group(required=True)
    what.add_argument("--plan", type=Path, metavar="FILE", help="a Kafka reassignment JSON file")
    what.add_argument("--topic")
    reassign.add_argument("--partition", type=int, action="append", metavar="P")
    reassign.add_argument(
        "--replicas", type=_broker_ids, metavar="ID,ID...", help="target brokers, leader first"
    )
    reassign.add_argument(
        "--cancel", action="store_true", help="return the partitions to their replicas"
    )
    reassign.add_argument(
        "--wait", action="store_true", help="show progress until every move has finished"
    )
    reassign.add_argument(
        "--throttle",
        type=int,
        metavar="BYTES_PER_S",
        help="cap the copying of the new replicas while they catch up (needs --wait)",
    )
    reassign.add_argument("--timeout-s", type=float, default=REASSIGNMENT_WAIT_DEFAULT_S)
    reassign.add_argument("--json", action="store_true", help="machine-readable output")
    reassign.set_defaults(admin_action=reassign_partitions)
    ongoing = actions.add_parser("reassignments", help="list the moves in progress")
    ongoing.add_argument("--json", action="store_true", help="machine-readable output")
    ongoing.set_defaults(admin_action=list_reassignments)

    leaders: argparse.ArgumentParser = commands.add_parser(
        "leaders", help="elect partition leaders"
    )
    leader_actions = leaders.add_subparsers(required=True, metavar="ACTION")
    elect = leader_actions.add_parser("elect", help="elect preferred (or unclean) leaders")
    kind = elect.add_mutually_exclusive_group(required=True)
    kind.add_argument("--preferred", action="store_true", help="the first replica leads")
    kind.add_argument(
        "--unclean", action="store_true", help="any live replica leads where none does"
    )
    elect.add_argument("--topic", help="only this topic (default: every partition)")
    elect.add_argument("--partition", type=int, action="append", metavar="P")
    elect.add_argument("--json", action="store_true", help="machine-readable output")
    elect.set_defaults(admin_action=elect_leaders)

    for parser in (reassign, ongoing, elect):
        add_connection_flags(parser, bootstrap_default)
    return [partitions, leaders]


async def reassign_partitions(admin: Admin, args: argparse.Namespace) -> int:
    moves = _moves(args)
    restore: dict[str, str | None] = {}
    if args.throttle is not None:
        if not args.wait or args.cancel:
            raise ValueError("--throttle needs --wait: the throttle is lifted when moves finish")
        if args.throttle < 1:
            raise ValueError("--throttle must be at least 1 byte per second")
        restore = await _throttle(admin, moves, args.throttle)
    try:
        errors = await admin.alter_partition_reassignments(moves)
        started = [tp for tp, error in errors.items() if error is None]
        if args.wait and started and not args.cancel:
            await _wait_for_moves(admin, started, args.timeout_s, quiet=args.json)
    finally:
        if args.throttle is not None:
            await _unthrottle(admin, restore)
    if args.json:
        print(json.dumps(_errors_json(errors, {tp: moves[tp] for tp in errors})))
    else:
        for tp, error in sorted(errors.items()):
            target = moves.get(tp)
            done = "cancelled" if target is None else f"moving to {list(target)}"
            if args.wait and target is not None:
                done = f"moved to {list(target)}"
            print(f"{tp.topic}-{tp.partition}: {done if error is None else _error_text(error)}")
    return 0 if all(error is None for error in errors.values()) else 1


async def list_reassignments(admin: Admin, args: argparse.Namespace) -> int:
    ongoing = await admin.list_partition_reassignments()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "topic": tp.topic,
                        "partition": tp.partition,
                        "replicas": list(r.replicas),
                        "adding_replicas": list(r.adding_replicas),
                        "removing_replicas": list(r.removing_replicas),
                    }
                    for tp, r in sorted(ongoing.items())
                ]
            )
        )
        return 0
    if not ongoing:
        print("no reassignment in progress")
    for tp, r in sorted(ongoing.items()):
        print(
            f"{tp.topic}-{tp.partition}: replicas {list(r.replicas)}, adding "
            f"{list(r.adding_replicas)}, removing {list(r.removing_replicas)}"
        )
    return 0


async def elect_leaders(admin: Admin, args: argparse.Namespace) -> int:
    partitions = None
    if args.topic is not None:
        indexes = args.partition or await _partition_indexes(admin, args.topic)
        partitions = [TopicPartition(args.topic, index) for index in indexes]
    elif args.partition:
        raise ValueError("--partition needs --topic")
    errors = await admin.elect_leaders(
        partitions, election="unclean" if args.unclean else "preferred"
    )
    if args.json:
        print(json.dumps(_errors_json(errors, {})))
    else:
        for tp, error in sorted(errors.items()):
            outcome = "leader elected" if error is None else _error_text(error)
            print(f"{tp.topic}-{tp.partition}: {outcome}")
    failed = [
        e for e in errors.values() if e is not None and e.code != ErrorCode.ELECTION_NOT_NEEDED
    ]
    return 1 if failed else 0


# ---- helpers --------------------------------------------------------------------------------


def _moves(args: argparse.Namespace) -> dict[TopicPartition, Sequence[int] | None]:
    if args.plan is not None:
        if args.partition or args.replicas:
            raise ValueError("--plan names the partitions and replicas itself")
        planned = _read_plan(args.plan)
        return {tp: None for tp in planned} if args.cancel else dict(planned)
    if not args.partition:
        raise ValueError("--topic needs --partition")
    if args.cancel == (args.replicas is not None):
        raise ValueError("give --replicas, or --cancel to cancel a move")
    return {TopicPartition(args.topic, p): args.replicas for p in args.partition}


def _read_plan(path: Path) -> dict[TopicPartition, Sequence[int]]:
    """Kafka's reassignment JSON (what kafka-reassign-partitions.sh --generate prints)."""
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read the plan {path}: {error}") from error
    if not isinstance(plan, dict) or plan.get("version") != PLAN_VERSION:
        raise ValueError(f'{path}: expected an object with "version": {PLAN_VERSION}')
    moves: dict[TopicPartition, Sequence[int]] = {}
    for entry in plan.get("partitions", []):
        try:
            tp = TopicPartition(str(entry["topic"]), int(entry["partition"]))
            replicas = [int(r) for r in entry["replicas"]]
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}: bad partition entry {entry!r}") from error
        moves[tp] = replicas
    if not moves:
        raise ValueError(f"{path}: the plan names no partitions")
    return moves


async def _wait_for_moves(
    admin: Admin, moving: Sequence[TopicPartition], timeout_s: float, *, quiet: bool
) -> None:
    """Poll the reassignments in progress until none of `moving` is, with a progress bar on
    stderr (none with `quiet`, whose stdout is JSON)."""
    counts = (MofNCompleteColumn(), TextColumn("partitions"))
    with progress_bar("reassigning", *counts, quiet=quiet) as progress:
        bar = progress.add_task("reassigning", total=len(moving))
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    ongoing = await admin.list_partition_reassignments(moving)
                    progress.update(bar, completed=len(moving) - len(ongoing))
                    if not ongoing:
                        return
                    await asyncio.sleep(REASSIGNMENT_POLL_INTERVAL_S)
        except TimeoutError:
            raise KafkaTimeoutError(
                f"{len(moving)} moves did not finish within {timeout_s:g} s; they go on: "
                "see `riverbed partitions reassignments`"
            ) from None


async def _throttle(
    admin: Admin, moves: Mapping[TopicPartition, Sequence[int] | None], rate: int
) -> dict[str, str | None]:
    """Throttle the replicas the moves add (Kafka's follower.replication.throttled.* configs);
    returns each topic's previous override of the replica list (None: it had none)."""
    added: dict[str, set[str]] = {}
    for topic in sorted({tp.topic for tp in moves}):
        description = await admin.describe_topic(topic)
        current = {p.partition: p.replicas for p in description.partitions}
        added[topic] = {
            f"{tp.partition}:{broker}"
            for tp, target in moves.items()
            if tp.topic == topic and target is not None
            for broker in target
            if broker not in current.get(tp.partition, ())
        }
    previous: dict[str, str | None] = {}
    for topic, entries in added.items():
        entry = (await admin.describe_configs(topic))[FOLLOWER_REPLICAS_CONFIG]
        overridden = entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG
        previous[topic] = entry.value if overridden else None
        listed = {item for item in (entry.value or "").split(",") if item}
        value = ",".join(sorted(listed | entries))
        await admin.alter_configs(topic, set={FOLLOWER_REPLICAS_CONFIG: value})
    await admin.alter_broker_configs(set={FOLLOWER_RATE_CONFIG: str(rate)})
    return previous


async def _unthrottle(admin: Admin, previous: Mapping[str, str | None]) -> None:
    await admin.alter_broker_configs(delete=[FOLLOWER_RATE_CONFIG])
    for topic, value in previous.items():
        if value is None:
            await admin.alter_configs(topic, delete=[FOLLOWER_REPLICAS_CONFIG])
        else:
            await admin.alter_configs(topic, set={FOLLOWER_REPLICAS_CONFIG: value})


async def _partition_indexes(admin: Admin, topic: str) -> list[int]:
    description = await admin.describe_topic(topic)
    return [p.partition for p in description.partitions]


def _broker_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of broker ids") from None


def _error_text(error: KafkaError) -> str:
    name = error.code.name
    return f"{name}: {error.message}" if error.message and error.message != name else name


def _errors_json(
    errors: PartitionErrors, targets: Mapping[TopicPartition, Sequence[int] | None]
) -> list[dict[str, object]]:
    return [
        {
            "topic": tp.topic,
            "partition": tp.partition,
            **(
                {"replicas": None if (t := targets[tp]) is None else list(t)}
                if tp in targets
                else {}
            ),
            "error": None if error is None else error.code.name,
            "message": None if error is None else error.message,
        }
        for tp, error in sorted(errors.items())
    ]
