"""FindCoordinator: the broker coordinating a consumer group (key type 0) or a transactional id
(key type 1), v4+ several at once.

The coordinator of a group is the leader of its `__consumer_offsets` partition, that of a
transactional id the leader of its `__transaction_state` partition; the first lookup of each key
type creates its topic (see riverbed.coordination.internal_topics).
"""

from __future__ import annotations

from typing import Final

from riverbed.broker.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AUTHORIZATION_ERRORS, AclOperation, ResourceType

Coordinator = m.FindCoordinatorResponse.Coordinator

KEY_TYPE_GROUP: Final = 0
KEY_TYPE_TRANSACTION: Final = 1
_RESOURCES: Final = {
    KEY_TYPE_GROUP: ResourceType.GROUP,
    KEY_TYPE_TRANSACTION: ResourceType.TRANSACTIONAL_ID,
}


async def handle_find_coordinator(
    ctx: BrokerContext,
    request: m.FindCoordinatorRequest,
    version: int,
    access: Access,
    listener: str,
) -> m.FindCoordinatorResponse:
    """Needs DESCRIBE on the group (GROUP_AUTHORIZATION_FAILED) or transactional id
    (TRANSACTIONAL_ID_AUTHORIZATION_FAILED). Coordinators are named by their address on
    `listener`, the one the request came in on."""
    keys = request.coordinator_keys if version >= 4 else [request.key]
    found = [await _find(ctx, request.key_type, key, access, listener) for key in keys]
    if version >= 4:
        return m.FindCoordinatorResponse(coordinators=found)
    (only,) = found
    return m.FindCoordinatorResponse(
        error_code=only.error_code,
        error_message=only.error_message,
        node_id=only.node_id,
        host=only.host,
        port=only.port,
    )


async def _find(
    ctx: BrokerContext, key_type: int, key: str, access: Access, listener: str
) -> Coordinator:
    try:
        _check_describe(access, key_type, key)
        if key_type == KEY_TYPE_TRANSACTION:
            broker = await ctx.transactions.find(key)
        elif key_type == KEY_TYPE_GROUP:
            broker = await ctx.groups.find(key)
        else:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"unknown coordinator key type {key_type}")
        endpoint = broker.endpoint(listener)
        if endpoint is None:
            raise KafkaError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"the coordinator (broker {broker.broker_id}) has no listener {listener}",
            )
    except KafkaError as error:
        return Coordinator(
            key=key,
            node_id=-1,
            host="",
            port=-1,
            error_code=error.code,
            error_message=error.message,
        )
    host, port = endpoint
    return Coordinator(key=key, node_id=broker.broker_id, host=host, port=port, error_message=None)


def _check_describe(access: Access, key_type: int, key: str) -> None:
    resource = _RESOURCES.get(key_type)
    if resource is not None and not access.allows(AclOperation.DESCRIBE, resource, key):
        code = AUTHORIZATION_ERRORS[resource]
        raise KafkaError(code, f"not authorized to describe {resource.kafka_name} {key!r}")
