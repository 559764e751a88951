"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups and DeleteGroups.

Each is a thin route to the group coordinator (riverbed.broker.groups.coordinator), which answers
the calls of the groups this broker coordinates; a group it cannot answer for (not its coordinator,
still loading, an invalid group id) raises the KafkaError the client must see, turned here into
each API's error response.

Authorization, as in Kafka: a member's calls (join, sync, heartbeat, leave) need READ on the
group, DescribeGroups DESCRIBE, DeleteGroups DELETE (GROUP_AUTHORIZATION_FAILED otherwise);
ListGroups lists every group to a principal that may DESCRIBE the cluster, else only the groups
it may DESCRIBE.
"""

from __future__ import annotations

from riverbed.broker.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

DescribedGroup = m.DescribeGroupsResponse.DescribedGroup
DeletableGroupResult = m.DeleteGroupsResponse.DeletableGroupResult


def check_group(access: Access, operation: AclOperation, group_id: str) -> None:
    """GROUP_AUTHORIZATION_FAILED unless the principal may do `operation` on the group."""
    if not access.allows(operation, ResourceType.GROUP, group_id):
        raise KafkaError(
            ErrorCode.GROUP_AUTHORIZATION_FAILED,
            f"not authorized to {operation.kafka_name} group {group_id!r}",
        )


async def handle_join_group(
    ctx: BrokerContext,
    request: m.JoinGroupRequest,
    version: int,
    client_id: str,
    client_host: str,
    access: Access,
) -> m.JoinGroupResponse:
    try:
        check_group(access, AclOperation.READ, request.group_id)
        return await ctx.groups.join(request, version, client_id, client_host)
    except KafkaError as error:
        return m.JoinGroupResponse(
            error_code=error.code,
            member_id=request.member_id,
            # Nullable from v7 on; before, "no protocol" is the empty string.
            protocol_name=None if version >= 7 else "",
        )


async def handle_sync_group(
    ctx: BrokerContext, request: m.SyncGroupRequest, version: int, access: Access
) -> m.SyncGroupResponse:
    try:
        check_group(access, AclOperation.READ, request.group_id)
        return await ctx.groups.sync(request, version)
    except KafkaError as error:
        return m.SyncGroupResponse(error_code=error.code)


async def handle_heartbeat(
    ctx: BrokerContext, request: m.HeartbeatRequest, access: Access
) -> m.HeartbeatResponse:
    try:
        check_group(access, AclOperation.READ, request.group_id)
        return ctx.groups.heartbeat(request)
    except KafkaError as error:
        return m.HeartbeatResponse(error_code=error.code)


async def handle_leave_group(
    ctx: BrokerContext, request: m.LeaveGroupRequest, version: int, access: Access
) -> m.LeaveGroupResponse:
    try:
        check_group(access, AclOperation.READ, request.group_id)
        return await ctx.groups.leave(request, version)
    except KafkaError as error:
        return m.LeaveGroupResponse(error_code=error.code)


async def handle_describe_groups(
    ctx: BrokerContext, request: m.DescribeGroupsRequest, access: Access
) -> m.DescribeGroupsResponse:
    described = []
    for group_id in request.groups:
        try:
            check_group(access, AclOperation.DESCRIBE, group_id)
            group = ctx.groups.describe(group_id)
        except KafkaError as error:
            described.append(DescribedGroup(error_code=error.code, group_id=group_id))
            continue
        if request.include_authorized_operations:
            group.authorized_operations = access.operations(ResourceType.GROUP, group_id)
        described.append(group)
    return m.DescribeGroupsResponse(groups=described)


async def handle_list_groups(
    ctx: BrokerContext, request: m.ListGroupsRequest, access: Access
) -> m.ListGroupsResponse:
    try:
        groups = ctx.groups.list_groups(request.states_filter)
    except KafkaError as error:
        return m.ListGroupsResponse(error_code=error.code)
    if not access.allows_cluster(AclOperation.DESCRIBE, log_denied=False):
        hidden = access.denied(
            AclOperation.DESCRIBE,
            ResourceType.GROUP,
            (g.group_id for g in groups),
            log_denied=False,
        )
        groups = [group for group in groups if group.group_id not in hidden]
    return m.ListGroupsResponse(groups=groups)


async def handle_delete_groups(
    ctx: BrokerContext, request: m.DeleteGroupsRequest, access: Access
) -> m.DeleteGroupsResponse:
    denied = access.denied(AclOperation.DELETE, ResourceType.GROUP, request.groups_names)
    results = await ctx.groups.delete_groups([g for g in request.groups_names if g not in denied])
    results.update(dict.fromkeys(denied, ErrorCode.GROUP_AUTHORIZATION_FAILED))
    return m.DeleteGroupsResponse(
        results=[
            DeletableGroupResult(group_id=group_id, error_code=results[group_id])
            for group_id in request.groups_names
        ]
    )
