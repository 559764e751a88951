"""ZooKeeper work done for a client's request: bounded in time, and answered with an error code.

While ZooKeeper is unreachable, kazoo keeps a request queued until it reconnects, and a request in
flight when the connection drops (or the session expires) fails. A handler that awaited either
as it is would hold its client's connection for as long as the outage lasts, or raise out of
the handler and get the connection closed. Instead, a handler wraps its ZooKeeper work in
`zookeeper_bound`, and the client gets a Kafka error code it knows how to retry:

- no answer within the bound: `timed_out` (REQUEST_TIMED_OUT unless the API has a better one).
  As with Kafka's REQUEST_TIMED_OUT, the change may still be applied once ZooKeeper is back;
- the connection or session was lost mid-call: `lost` (e.g. NOT_CONTROLLER for the controller's
  APIs, since a broker whose session expired may no longer be the controller).

The bound is the request's own timeout when it has one, and never more than
zookeeper.session.timeout.ms: past that, ZooKeeper has expired the session of a broker that
could not reach it, so waiting longer is waiting for a new session, not riding out a blip.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from riverbed.configs import BrokerConfig
from riverbed.coordination.zk import ZkConnectionError
from riverbed.protocol.errors import ErrorCode, KafkaError


@contextlib.asynccontextmanager
async def zookeeper_bound(
    config: BrokerConfig,
    what: str,
    *,
    timeout_ms: int | None = None,
    started_s: float | None = None,
    timed_out: ErrorCode = ErrorCode.REQUEST_TIMED_OUT,
    lost: ErrorCode = ErrorCode.REQUEST_TIMED_OUT,
    waiting_for: str = "ZooKeeper",
) -> AsyncIterator[None]:
    """Run the block within the bound; KafkaError(`timed_out`) after it, KafkaError(`lost`) on
    a lost connection or session. `what` names the work in the error message ("creating topic
    'orders'"). `timeout_ms` <= 0 or None: the session timeout alone. The bound runs from
    `started_s` (loop time; now by default): a request doing several pieces of ZooKeeper work
    (CreateTopics of many topics) passes when it started, so together they keep to its timeout.
    `waiting_for` names who did not answer: "the controller" for work handed to the controller's
    task (which goes on with it: only the wait for its answer ends)."""
    bound_ms = config.zookeeper_session_timeout_ms
    if timeout_ms is not None and timeout_ms > 0:
        bound_ms = min(bound_ms, timeout_ms)
    if started_s is None:
        started_s = asyncio.get_running_loop().time()
    bound = asyncio.timeout_at(started_s + bound_ms / 1000)
    try:
        async with bound:
            yield
    except TimeoutError as error:
        if not bound.expired():
            raise
        raise KafkaError(
            timed_out,
            f"{what}: {waiting_for} did not answer within {bound_ms} ms (the change may still "
            "be applied when it does)",
        ) from error
    except ZkConnectionError as error:
        raise KafkaError(
            lost,
            f"{what}: the connection to ZooKeeper was lost ({error}); the change may or may "
            "not have been applied",
        ) from error
