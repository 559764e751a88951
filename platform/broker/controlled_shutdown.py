"""The stopping broker's side of a controlled shutdown (Kafka's KafkaServer.controlledShutdown).

Before a broker stops on SIGTERM it asks the controller to move its leaderships away, so clients
see a new leader at once instead of after the ZooKeeper session times out. It sends
ControlledShutdown to the controller (or calls its own Controller when it is the controller) and
tries again, after a backoff, while the answer lists partitions it still leads or the request
failed (the controller moved, a connection was refused): `controlled.shutdown.max.retries`
attempts in all, after which it stops anyway. A controller whose ACLs refuse this broker
(CLUSTER_AUTHORIZATION_FAILED: the brokers' principal is not a super user) is not asked again.

While ZooKeeper is down no controller can write new leaders. A remote controller answers
REQUEST_TIMED_OUT once its ZooKeeper session timeout has passed; when this broker is the
controller, `local_bound_ms` (the broker passes the same session timeout) bounds its own
controller's work. So a SIGTERM during an outage stops the broker after at most
attempts x session timeout plus the backoffs, not attempts x the 30 s socket timeout.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from riverbed.coordination.controller import Controller, TopicPartition
from riverbed.coordination.metadata_cache import MetadataCache
from riverbed.hot.replication.inter_broker import InterBrokerDialer
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError, ProtocolDecodeError

log = logging.getLogger(__name__)

# Kafka's controlled.shutdown.max.retries (attempts in all, despite the name).
CONTROLLED_SHUTDOWN_ATTEMPTS_MAX: Final = 3
# Kafka's controlled.shutdown.retry.backoff.ms is 5000; Riverbed's controller answers once its
# writes are done, so a retry only waits for a follower to catch up or a controller to be elected.
CONTROLLED_SHUTDOWN_RETRY_BACKOFF_MS: Final = 1_000
# Kafka's controller.socket.timeout.ms: connecting to the controller and waiting for its answer.
CONTROLLER_SOCKET_TIMEOUT_MS: Final = 30_000
# Answers no retry changes.
NOT_RETRIED: Final = frozenset({ErrorCode.CLUSTER_AUTHORIZATION_FAILED})


async def request_controlled_shutdown(
    cache: MetadataCache,
    broker_id: int,
    local_controller: Controller,
    dialer: InterBrokerDialer,
    *,
    attempts_max: int = CONTROLLED_SHUTDOWN_ATTEMPTS_MAX,
    timeout_ms: int = CONTROLLER_SOCKET_TIMEOUT_MS,
    retry_backoff_ms: int = CONTROLLED_SHUTDOWN_RETRY_BACKOFF_MS,
    local_bound_ms: int | None = None,
) -> bool:
    """Ask the controller to move `broker_id`'s leaderships away; True once it leads no
    replicated partition, False if `attempts_max` attempts did not get there. `local_bound_ms`
    (None: `timeout_ms`) bounds an attempt that this broker's own controller answers."""
    if attempts_max < 1:
        raise ValueError(f"attempts_max must be >= 1, got {attempts_max}")
    for attempt in range(1, attempts_max + 1):
        bound_ms = timeout_ms
        if local_controller.active and local_bound_ms is not None:
            bound_ms = min(timeout_ms, local_bound_ms)
        try:
            async with asyncio.timeout(bound_ms / 1000):
                remaining = await _attempt(cache, broker_id, local_controller, dialer, timeout_ms)
        # ConnectionError (refused, closed) is an OSError; a garbled answer is worth a retry too.
        except (KafkaError, OSError, TimeoutError, ProtocolDecodeError) as error:
            if isinstance(error, KafkaError) and error.code in NOT_RETRIED:
                # No retry can change it: the controller's ACLs refuse this broker.
                log.warning(
                    "controlled shutdown of broker %d refused by the controller (%s): with the "
                    "authorizer on, the principal brokers connect as must be in super.users; "
                    "stopping without handing leaderships over",
                    broker_id,
                    error.code.name,
                )
                return False
            reason = f"no answer within {bound_ms} ms" if isinstance(error, TimeoutError) else error
            log.info("controlled shutdown attempt %d/%d failed: %s", attempt, attempts_max, reason)
        else:
            if not remaining:
                log.info("controlled shutdown of broker %d succeeded", broker_id)
                return True
            log.info(
                "controlled shutdown attempt %d/%d: broker %d still leads %d partitions",
                attempt,
                attempts_max,
                broker_id,
                len(remaining),
            )
        if attempt < attempts_max:
            await asyncio.sleep(retry_backoff_ms / 1000)
    log.warning("controlled shutdown of broker %d failed; stopping anyway", broker_id)
    return False


async def _attempt(
    cache: MetadataCache,
    broker_id: int,
    local_controller: Controller,
    dialer: InterBrokerDialer,
    timeout_ms: int,
) -> list[TopicPartition]:
    if local_controller.active:
        return await local_controller.controlled_shutdown(broker_id)
    controller_id = cache.controller_id
    if controller_id is None or controller_id == broker_id:
        # None elected yet, or our own election just ended: the next attempt finds the new one.
        raise KafkaError(ErrorCode.NOT_CONTROLLER, "no active controller to ask")
    connection = await dialer.open(
        controller_id, client_id=f"broker-{broker_id}-controlled-shutdown", timeout_ms=timeout_ms
    )
    try:
        response = await connection.call(
            m.ControlledShutdownRequest(broker_id=broker_id),
            m.ControlledShutdownResponse,
            timeout_ms=timeout_ms,
        )
    finally:
        await connection.close()
    if response.error_code != ErrorCode.NONE:
        code = ErrorCode(response.error_code)
        raise KafkaError(code, f"controller {controller_id} answered {code.name}")
    return [(p.topic_name, p.partition_index) for p in response.remaining_partitions]
