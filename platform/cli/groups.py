"""`riverbed groups ...`: list, describe, reset the offsets of and delete consumer groups.

The commands follow Kafka's `kafka-consumer-groups.sh`: `describe` shows the members and, per
partition, the committed offset, the log end offset (the high watermark) and the lag between
them; `reset-offsets` prints the plan and changes nothing unless `--execute` is given, and only
while the group has no members (the coordinator refuses a commit from outside a live group).

Each action is an `async def (admin, args) -> exit status` run by `riverbed.cli.main` with an Admin
connected to `--bootstrap-server`. Failures are raised as Kafka errors with their codes
(GROUP_ID_NOT_FOUND for an unknown group, NON_EMPTY_GROUP for a group with members) or as
ValueError for bad flags; `riverbed.cli.main` prints them as one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from riverbed.cli.connect import add_connection_flags
from riverbed.cli.render import NONE_CELL, plain_table
from riverbed.client.admin import (
    Admin,
    GroupDescription,
    GroupState,
    MemberDescription,
    OffsetSpec,
)
from riverbed.client.types import OffsetAndMetadata, TopicPartition
from riverbed.errors import GroupError, UnknownTopicOrPartitionError
from riverbed.protocol.errors import ErrorCode

GroupAction = Callable[[Admin, argparse.Namespace], Awaitable[int]]

# A group whose offsets may be reset: no members (Dead: it does not exist yet, or any more).
RESETTABLE_STATES: Final = frozenset({GroupState.EMPTY, GroupState.DEAD})


def add_parser(commands: Any, bootstrap_default: str) -> argparse.ArgumentParser:
    """Add `groups` and its actions to the `riverbed` subcommands; each action is set as the
    `admin_action` default of its parser."""
    groups: argparse.ArgumentParser = commands.add_parser(
        "groups", help="list, describe, reset the offsets of and delete consumer groups"
    )
    actions = groups.add_subparsers(required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="list the groups of the cluster")
    listing.add_argument(
        "--state",
        nargs="*",
        type=_state,
        metavar="STATE",
        help="show each group's state; with states, only groups in one of them "
        f"({', '.join(s.value for s in GroupState if s is not GroupState.UNKNOWN)})",
    )
    listing.set_defaults(admin_action=list_groups)

    describe = actions.add_parser(
        "describe", help="members, assignments, committed offsets and lag of a group"
    )
    describe.add_argument("group")
    describe.add_argument("--json", action="store_true", help="machine-readable output")
    describe.set_defaults(admin_action=describe_group)

    reset = actions.add_parser(
        "reset-offsets", help="move an empty group's committed offsets (a dry run by default)"
    )
    reset.add_argument("group")
    reset.add_argument(
        "--topic",
        action="append",
        required=True,
        metavar="TOPIC[:P,P...]",
        help="a topic (all its partitions, or the ones listed); repeatable",
    )
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start offset")
    to.add_argument("--to-latest", action="store_true", help="the log end offset")
    to.add_argument(
        "--to-datetime",
        type=_datetime_ms,
        metavar="ISO8601",
        help="the first record at or after this time (e.g. 2024-05-01T12:00:00Z; local time "
        "without a zone)",
    )
    to.add_argument(
        "--to-offset", type=int, metavar="N", help="offset N (kept within the log's range)"
    )
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    mode.add_argument("--dry-run", action="store_true", help="only print them (the default)")
    reset.set_defaults(admin_action=reset_offsets)

    delete = actions.add_parser("delete", help="delete an empty group and its offsets")
    delete.add_argument("group")
    delete.set_defaults(admin_action=delete_group)

    for sub in (listing, describe, reset, delete):
        add_connection_flags(sub, bootstrap_default)
    return groups


# -- list ---------------------------------------------------------------------------------
async def list_groups(admin: Admin, args: argparse.Namespace) -> int:
    if args.state is None:
        for listing in await admin.list_groups():
            print(listing.group_id)
        return 0
    listings = await admin.list_groups(args.state or None)
    print(plain_table(("GROUP", "STATE"), [(g.group_id, g.state.value) for g in listings]))
    return 0


# -- describe -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One row of `describe`: a partition the group is assigned or has committed."""

    partition: TopicPartition
    committed_offset: int | None
    log_end_offset: int | None  # None: the topic is gone
    member: MemberDescription | None

    @property
    def lag(self) -> int | None:
        if self.committed_offset is None or self.log_end_offset is None:
            return None
        return max(self.log_end_offset - self.committed_offset, 0)


async def describe_group(admin: Admin, args: argparse.Namespace) -> int:
    group = await _existing_group(admin, args.group)
    committed = await admin.list_group_offsets(group.group_id)
    owners = {tp: member for member in group.members for tp in member.assignment or ()}
    partitions = sorted(committed.keys() | owners.keys())
    log_ends = await _log_end_offsets(admin, partitions)
    rows = [
        PartitionLag(
            partition=tp,
            committed_offset=committed[tp].offset if tp in committed else None,
            log_end_offset=log_ends.get(tp),
            member=owners.get(tp),
        )
        for tp in partitions
    ]
    if args.json:
        print(json.dumps(_description_json(group, rows), indent=2))
    else:
        print(_description_text(group, rows))
    return 0


async def _existing_group(admin: Admin, group_id: str) -> GroupDescription:
    group = (await admin.describe_groups([group_id]))[group_id]
    if group.state is GroupState.DEAD:
        raise GroupError(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id!r} does not exist")
    return group


async def _log_end_offsets(
    admin: Admin, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, int]:
    """The high watermark of each partition; the partitions of deleted topics are left out."""

    async def of_topic(topic: str) -> dict[TopicPartition, int]:
        latest: dict[TopicPartition, OffsetSpec] = {
            tp: "latest" for tp in partitions if tp.topic == topic
        }
        try:
            found = await admin.list_offsets(latest)
        except UnknownTopicOrPartitionError:
            return {}
        return {tp: answer.offset for tp, answer in found.items()}

    topics = sorted({tp.topic for tp in partitions})
    answers = await asyncio.gather(*(of_topic(topic) for topic in topics))
    return {tp: offset for answer in answers for tp, offset in answer.items()}


def _description_text(group: GroupDescription, rows: Sequence[PartitionLag]) -> str:
    protocol = "/".join(p for p in (group.protocol_type, group.protocol) if p) or NONE_CELL
    lines = [
        f"Group: {group.group_id}  State: {group.state.value}  Protocol: {protocol}  "
        f"Coordinator: {group.coordinator}  Members: {len(group.members)}"
    ]
    if group.members:
        lines += ["", "Members:"]
        lines.append(
            plain_table(
                ("MEMBER-ID", "GROUP-INSTANCE-ID", "CLIENT-ID", "HOST", "ASSIGNMENT"),
                [
                    (
                        m.member_id,
                        m.group_instance_id or NONE_CELL,
                        m.client_id,
                        m.client_host,
                        _assignment_text(m.assignment),
                    )
                    for m in group.members
                ],
            )
        )
    lines += ["", "Offsets:"]
    lines.append(
        plain_table(
            ("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "MEMBER-ID"),
            [
                (
                    row.partition.topic,
                    str(row.partition.partition),
                    _cell(row.committed_offset),
                    _cell(row.log_end_offset),
                    _cell(row.lag),
                    row.member.member_id if row.member else NONE_CELL,
                )
                for row in rows
            ],
        )
    )
    return "\n".join(lines)


def _assignment_text(assignment: tuple[TopicPartition, ...] | None) -> str:
    """ "orders:0,1 payments:2", "" for none, "-" for a protocol other than consumer."""
    if assignment is None:
        return NONE_CELL
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(assignment):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return " ".join(f"{t}:{','.join(map(str, ps))}" for t, ps in by_topic.items())


def _description_json(group: GroupDescription, rows: Sequence[PartitionLag]) -> dict[str, Any]:
    return {
        "group_id": group.group_id,
        "state": group.state.value,
        "protocol_type": group.protocol_type,
        "protocol": group.protocol,
        "coordinator": group.coordinator,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "assignment": None
                if m.assignment is None
                else [{"topic": tp.topic, "partition": tp.partition} for tp in m.assignment],
            }
            for m in group.members
        ],
        "offsets": [
            {
                "topic": row.partition.topic,
                "partition": row.partition.partition,
                "committed_offset": row.committed_offset,
                "log_end_offset": row.log_end_offset,
                "lag": row.lag,
                "member_id": row.member.member_id if row.member else None,
            }
            for row in rows
        ],
    }


# -- reset-offsets ------------------------------------------------------------------------
async def reset_offsets(admin: Admin, args: argparse.Namespace) -> int:
    group = (await admin.describe_groups([args.group]))[args.group]
    if group.state not in RESETTABLE_STATES:
        raise GroupError(
            ErrorCode.NON_EMPTY_GROUP,
            f"offsets of group {args.group!r} can only be reset while it has no members; "
            f"its state is {group.state.value} with {len(group.members)} member(s)",
        )
    partitions = await _partitions(admin, args.topic)
    plan = await _new_offsets(admin, partitions, args)
    print(
        plain_table(
            ("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"),
            [(args.group, tp.topic, str(tp.partition), str(o)) for tp, o in plan.items()],
        )
    )
    if args.execute:
        await admin.alter_group_offsets(
            args.group, {tp: OffsetAndMetadata(offset) for tp, offset in plan.items()}
        )
        print(f"reset {len(plan)} offset(s) of group {args.group}", file=sys.stderr)
    else:
        print("dry run: nothing changed (add --execute to commit these offsets)", file=sys.stderr)
    return 0


async def _partitions(admin: Admin, topic_specs: Iterable[str]) -> list[TopicPartition]:
    """The partitions `--topic T` (all of T's) and `--topic T:0,2` name, sorted."""
    partitions: set[TopicPartition] = set()
    for spec in topic_specs:
        topic, _, listed = spec.partition(":")
        if not topic:
            raise ValueError(f"--topic {spec!r} names no topic")
        if listed:
            partitions.update(TopicPartition(topic, _partition(spec, p)) for p in listed.split(","))
        else:
            described = await admin.describe_topic(topic)
            partitions.update(TopicPartition(topic, p.partition) for p in described.partitions)
    return sorted(partitions)


def _partition(spec: str, text: str) -> int:
    try:
        partition = int(text)
    except ValueError:
        partition = -1
    if partition < 0:
        raise ValueError(f"--topic {spec!r}: {text!r} is not a partition number")
    return partition


async def _new_offsets(
    admin: Admin, partitions: Sequence[TopicPartition], args: argparse.Namespace
) -> dict[TopicPartition, int]:
    """Where each partition's committed offset goes, as Kafka's tool computes it: a time with no
    record at or after it goes to the log end; an offset outside the log is moved into it."""
    if args.to_earliest or args.to_latest:
        spec: OffsetSpec = "earliest" if args.to_earliest else "latest"
        return await _offsets(admin, partitions, spec)
    latest = await _offsets(admin, partitions, "latest")
    if args.to_datetime is not None:
        found = await _offsets(admin, partitions, args.to_datetime)
        return {tp: latest[tp] if found[tp] < 0 else found[tp] for tp in partitions}
    earliest = await _offsets(admin, partitions, "earliest")
    plan = {}
    for tp in partitions:
        plan[tp] = min(max(args.to_offset, earliest[tp]), latest[tp])
        if plan[tp] != args.to_offset:
            print(
                f"riverbed: {tp.topic}-{tp.partition}: offset {args.to_offset} is outside the "
                f"log ({earliest[tp]}..{latest[tp]}); using {plan[tp]}",
                file=sys.stderr,
            )
    return plan


async def _offsets(
    admin: Admin, partitions: Sequence[TopicPartition], spec: OffsetSpec
) -> dict[TopicPartition, int]:
    found = await admin.list_offsets(dict.fromkeys(partitions, spec))
    return {tp: answer.offset for tp, answer in found.items()}


# -- delete -------------------------------------------------------------------------------
async def delete_group(admin: Admin, args: argparse.Namespace) -> int:
    await admin.delete_groups([args.group])
    print(f"deleted group {args.group}")
    return 0


# -- formatting and flag parsing ----------------------------------------------------------
def _cell(value: int | None) -> str:
    return NONE_CELL if value is None else str(value)


def _state(text: str) -> GroupState:
    state = GroupState.parse(text)
    if state is GroupState.UNKNOWN:
        raise argparse.ArgumentTypeError(f"unknown group state {text!r}")
    return state


def _datetime_ms(text: str) -> int:
    """ISO 8601 as ms since the epoch; without a zone it is local time (as Kafka's tool)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 date-time (e.g. 2024-05-01T12:00:00Z)"
        ) from None
    return round(moment.timestamp() * 1000)  # a naive datetime's timestamp() is local time
