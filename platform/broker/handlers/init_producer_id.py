"""InitProducerId: give a producer its (producer id, epoch).

Without a transactional id (an idempotent producer) the broker's producer id issuer answers. With
one, the transaction coordinator does (riverbed.broker.transactions.coordinator): a new id gets
a producer id at epoch 0, a known one its next epoch, fencing (and aborting the open transaction
of) the producer before it. v3+ may name the producer's current (id, epoch) (KIP-360).
The response has no message field, so refusals are logged here.
"""

from __future__ import annotations

import logging
from typing import Final

from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.handlers.transactions import client_code
from riverbed.broker.handlers.zookeeper_bound import zookeeper_bound
from riverbed.broker.transactions.state import NO_PRODUCER_EPOCH, NO_PRODUCER_ID
from riverbed.coordination.layout import MalformedZnodeError
from riverbed.coordination.producer_ids import ProducerIdClaimError, ProducerIdsExhaustedError
from riverbed.coordination.zk import ZkError
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

log = logging.getLogger(__name__)

# InitProducerId answers PRODUCER_FENCED from v4 on, INVALID_PRODUCER_EPOCH before.
PRODUCER_FENCED_SINCE_INIT_VERSION: Final = 4


async def handle_init_producer_id(
    ctx: BrokerContext, request: m.InitProducerIdRequest, version: int, access: Access
) -> m.InitProducerIdResponse:
    """An idempotent producer needs IDEMPOTENT_WRITE on the cluster or (KIP-679) WRITE on some
    topic: CLUSTER_AUTHORIZATION_FAILED otherwise. A transactional one needs WRITE on its
    transactional id: TRANSACTIONAL_ID_AUTHORIZATION_FAILED otherwise."""
    transactional_id = request.transactional_id
    try:
        if transactional_id is None:
            producer_id, epoch = await _init_idempotent(ctx, request, access)
        else:
            producer_id, epoch = await _init_transactional(
                ctx, request, version, access, transactional_id
            )
    except KafkaError as error:
        log.info("InitProducerId (transactional id %r) refused: %s", transactional_id, error)
        return _error(error.code)
    except (ZkError, ProducerIdClaimError) as error:
        # Retriable for the client: it asks again, and a later claim may succeed.
        log.warning("could not claim a producer id block: %s", error)
        return _error(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    except (ProducerIdsExhaustedError, MalformedZnodeError) as error:
        log.error("%s", error)
        return _error(ErrorCode.UNKNOWN_SERVER_ERROR)
    return m.InitProducerIdResponse(
        error_code=ErrorCode.NONE, producer_id=producer_id, producer_epoch=epoch
    )


async def _init_idempotent(
    ctx: BrokerContext, request: m.InitProducerIdRequest, access: Access
) -> tuple[int, int]:
    if not (
        access.allows_cluster(AclOperation.IDEMPOTENT_WRITE, log_denied=False)
        or access.allows_any(AclOperation.WRITE, ResourceType.TOPIC)
    ):
        raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "no IDEMPOTENT_WRITE")
    async with zookeeper_bound(
        ctx.config,
        "claiming a producer id block",
        timed_out=ErrorCode.COORDINATOR_NOT_AVAILABLE,
        lost=ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ):
        return await ctx.producer_ids.init_producer(request.producer_id, request.producer_epoch)


async def _init_transactional(
    ctx: BrokerContext,
    request: m.InitProducerIdRequest,
    version: int,
    access: Access,
    transactional_id: str,
) -> tuple[int, int]:
    if not access.allows(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        raise KafkaError(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "no WRITE on the id")
    given = (request.producer_id, request.producer_epoch)
    if (given[0] == NO_PRODUCER_ID) != (given[1] == NO_PRODUCER_EPOCH):
        raise KafkaError(ErrorCode.INVALID_REQUEST, "a producer id without an epoch, or back")
    expected = None if given[0] == NO_PRODUCER_ID else given
    try:
        return await ctx.transactions.init_producer_id(
            transactional_id, request.transaction_timeout_ms, expected
        )
    except KafkaError as error:
        code = client_code(error.code, version, PRODUCER_FENCED_SINCE_INIT_VERSION)
        raise KafkaError(ErrorCode(code), error.message) from error


def _error(code: ErrorCode) -> m.InitProducerIdResponse:
    return m.InitProducerIdResponse(error_code=code, producer_id=-1, producer_epoch=-1)
