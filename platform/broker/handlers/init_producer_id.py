"""InitProducerId: give an idempotent producer its (producer id, epoch).

Riverbed has no transactions. A request with a transactional id is answered with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED: every Kafka client treats it as fatal and says so at once
("transactional id authorization failed"), where a retriable code such as
COORDINATOR_NOT_AVAILABLE would have it retry until its timeout. The response has no message
field, so the reason is logged here.
"""

from __future__ import annotations

import logging

from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.handlers.zookeeper_bound import zookeeper_bound
from riverbed.coordination.layout import MalformedZnodeError
from riverbed.coordination.producer_ids import ProducerIdClaimError, ProducerIdsExhaustedError
from riverbed.coordination.zk import ZkError
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

log = logging.getLogger(__name__)


async def handle_init_producer_id(
    ctx: BrokerContext, request: m.InitProducerIdRequest, access: Access
) -> m.InitProducerIdResponse:
    """An idempotent producer needs IDEMPOTENT_WRITE on the cluster or (KIP-679) WRITE on some
    topic: CLUSTER_AUTHORIZATION_FAILED otherwise."""
    if request.transactional_id is not None:
        log.info(
            "refused InitProducerId for transactional id %r: transactions are not supported",
            request.transactional_id,
        )
        return _error(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not (
        access.allows_cluster(AclOperation.IDEMPOTENT_WRITE, log_denied=False)
        or access.allows_any(AclOperation.WRITE, ResourceType.TOPIC)
    ):
        return _error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    try:
        async with zookeeper_bound(
            ctx.config,
            "claiming a producer id block",
            timed_out=ErrorCode.COORDINATOR_NOT_AVAILABLE,
            lost=ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ):
            producer_id, epoch = await ctx.producer_ids.init_producer(
                request.producer_id, request.producer_epoch
            )
    except KafkaError as error:
        log.info("InitProducerId refused: %s", error)
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


def _error(code: ErrorCode) -> m.InitProducerIdResponse:
    return m.InitProducerIdResponse(error_code=code, producer_id=-1, producer_epoch=-1)
