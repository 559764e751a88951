"""FindCoordinator: no broker coordinates groups or transactions yet.

Consumer groups (and their `__consumer_offsets` coordinators) arrive in a later issue, and Riverbed
has no transactions. Until then every key gets COORDINATOR_NOT_AVAILABLE, which clients treat as
retriable — the truthful answer of a cluster whose coordinators are not up. The API is advertised
anyway because librdkafka enables LZ4 only for brokers that list FindCoordinator (its feature
table dates LZ4 to the broker release that introduced FindCoordinator).
"""

from __future__ import annotations

from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

Coordinator = m.FindCoordinatorResponse.Coordinator

NOT_AVAILABLE_MESSAGE = "Riverbed does not coordinate consumer groups or transactions yet"


async def handle_find_coordinator(
    request: m.FindCoordinatorRequest, version: int
) -> m.FindCoordinatorResponse:
    code = ErrorCode.COORDINATOR_NOT_AVAILABLE
    if version >= 4:
        return m.FindCoordinatorResponse(
            coordinators=[
                Coordinator(
                    key=key,
                    node_id=-1,
                    host="",
                    port=-1,
                    error_code=code,
                    error_message=NOT_AVAILABLE_MESSAGE,
                )
                for key in request.coordinator_keys
            ]
        )
    return m.FindCoordinatorResponse(
        error_code=code, error_message=NOT_AVAILABLE_MESSAGE, node_id=-1, host="", port=-1
    )
