"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups and DeleteGroups.

Each is a thin route to the group coordinator (riverbed.groups.coordinator), which answers the
calls of the groups this broker coordinates; a group it cannot answer for (not its coordinator,
still loading, an invalid group id) raises the KafkaError the client must see, turned here into
each API's error response.
"""

from __future__ import annotations

from typing import Final

from riverbed.hot.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.errors import KafkaError

DescribedGroup = m.DescribeGroupsResponse.DescribedGroup
DeletableGroupResult = m.DeleteGroupsResponse.DeletableGroupResult

# Without ACLs every principal may do everything Kafka allows on a group: READ(3), DELETE(6),
# DESCRIBE(8).
GROUP_OPERATIONS_ALL: Final = sum(1 << op for op in (3, 6, 8))


async def handle_join_group(
    ctx: BrokerContext,
    request: m.JoinGroupRequest,
    version: int,
    client_id: str,
    client_host: str,
) -> m.JoinGroupResponse:
    try:
        return await ctx.groups.join(request, version, client_id, client_host)
    except KafkaError as error:
        return m.JoinGroupResponse(
            error_code=error.code,
            member_id=request.member_id,
            # Nullable from v7 on; before, "no protocol" is the empty string.
            protocol_name=None if version >= 7 else "",
        )


async def handle_sync_group(
    ctx: BrokerContext, request: m.SyncGroupRequest, version: int
) -> m.SyncGroupResponse:
    try:
        return await ctx.groups.sync(request, version)
    except KafkaError as error:
        return m.SyncGroupResponse(error_code=error.code)


async def handle_heartbeat(ctx: BrokerContext, request: m.HeartbeatRequest) -> m.HeartbeatResponse:
    try:
        return ctx.groups.heartbeat(request)
    except KafkaError as error:
        return m.HeartbeatResponse(error_code=error.code)


async def handle_leave_group(
    ctx: BrokerContext, request: m.LeaveGroupRequest, version: int
) -> m.LeaveGroupResponse:
    try:
        return await ctx.groups.leave(request, version)
    except KafkaError as error:
        return m.LeaveGroupResponse(error_code=error.code)


async def handle_describe_groups(
    ctx: BrokerContext, request: m.DescribeGroupsRequest
) -> m.DescribeGroupsResponse:
    described = []
    for group_id in request.groups:
        try:
            group = ctx.groups.describe(group_id)
        except KafkaError as error:
            group = DescribedGroup(error_code=error.code, group_id=group_id)
        if request.include_authorized_operations:
            group.authorized_operations = GROUP_OPERATIONS_ALL
        described.append(group)
    return m.DescribeGroupsResponse(groups=described)


async def handle_list_groups(
    ctx: BrokerContext, request: m.ListGroupsRequest
) -> m.ListGroupsResponse:
    try:
        return m.ListGroupsResponse(groups=ctx.groups.list_groups(request.states_filter))
    except KafkaError as error:
        return m.ListGroupsResponse(error_code=error.code)


async def handle_delete_groups(
    ctx: BrokerContext, request: m.DeleteGroupsRequest
) -> m.DeleteGroupsResponse:
    results = await ctx.groups.delete_groups(request.groups_names)
    return m.DeleteGroupsResponse(
        results=[
            DeletableGroupResult(group_id=group_id, error_code=results[group_id])
            for group_id in request.groups_names
        ]
    )
