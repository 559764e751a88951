"""AlterPartitionReassignments, ListPartitionReassignments (KIP-455) and ElectLeaders
(KIP-183/KIP-460): replica moves and leader elections, decided by the active controller.

Changes are answered by the controller only (NOT_CONTROLLER elsewhere, so admin clients find
it); an alter returns once the moves are written, and their progress is what
ListPartitionReassignments shows, from this broker's metadata cache (any broker can answer).
"""

from __future__ import annotations

from collections.abc import Sequence

from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.handlers.zookeeper_bound import zookeeper_bound
from riverbed.coordination.controller import Controller, Outcomes
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation

ReassignableTopicResponse = m.AlterPartitionReassignmentsResponse.ReassignableTopicResponse
ReassignablePartitionResponse = m.AlterPartitionReassignmentsResponse.ReassignablePartitionResponse
OngoingTopicReassignment = m.ListPartitionReassignmentsResponse.OngoingTopicReassignment
OngoingPartitionReassignment = m.ListPartitionReassignmentsResponse.OngoingPartitionReassignment
ReplicaElectionResult = m.ElectLeadersResponse.ReplicaElectionResult
PartitionResult = m.ElectLeadersResponse.PartitionResult
# KIP-460's election types.
PREFERRED_ELECTION = 0
UNCLEAN_ELECTION = 1


async def handle_alter_partition_reassignments(
    ctx: BrokerContext, request: m.AlterPartitionReassignmentsRequest, access: Access
) -> m.AlterPartitionReassignmentsResponse:
    """Needs ALTER on the cluster (checked before NOT_CONTROLLER, as Kafka does)."""
    moves: dict[tuple[str, int], Sequence[int] | None] = {
        (topic.name, partition.partition_index): partition.replicas
        for topic in request.topics
        for partition in topic.partitions
    }
    refusal = _cluster_refusal(access, AclOperation.ALTER)
    if refusal is not None:
        # Kafka's error response names every partition with the error too.
        return _reassignment_response(request, dict.fromkeys(moves, refusal), refusal)
    try:
        async with zookeeper_bound(
            ctx.config,
            "reassigning partitions",
            timeout_ms=request.timeout_ms,
            waiting_for="the controller",
        ):
            outcomes = await _controller(ctx).alter_reassignments(moves)
    except KafkaError as error:
        return m.AlterPartitionReassignmentsResponse(
            error_code=error.code, error_message=_message(error)
        )
    return _reassignment_response(request, outcomes, None)


def _reassignment_response(
    request: m.AlterPartitionReassignmentsRequest, outcomes: Outcomes, error: KafkaError | None
) -> m.AlterPartitionReassignmentsResponse:
    return m.AlterPartitionReassignmentsResponse(
        error_code=_code(error),
        error_message=_message(error),
        responses=[
            ReassignableTopicResponse(
                name=topic.name,
                partitions=[
                    ReassignablePartitionResponse(
                        partition_index=p.partition_index,
                        error_code=_code(outcomes[(topic.name, p.partition_index)]),
                        error_message=_message(outcomes[(topic.name, p.partition_index)]),
                    )
                    for p in topic.partitions
                ],
            )
            for topic in request.topics
        ],
    )


async def handle_list_partition_reassignments(
    ctx: BrokerContext, request: m.ListPartitionReassignmentsRequest, access: Access
) -> m.ListPartitionReassignmentsResponse:
    """Needs DESCRIBE on the cluster."""
    refusal = _cluster_refusal(access, AclOperation.DESCRIBE)
    if refusal is not None:
        return m.ListPartitionReassignmentsResponse(
            error_code=refusal.code, error_message=_message(refusal)
        )
    wanted = (
        None
        if request.topics is None
        else {(t.name, index) for t in request.topics for index in t.partition_indexes}
    )
    topics = []
    for topic in sorted(ctx.cache.topics().values(), key=lambda t: t.name):
        ongoing = [
            OngoingPartitionReassignment(
                partition_index=index,
                replicas=list(state.replicas),
                adding_replicas=list(state.adding_replicas),
                removing_replicas=list(state.removing_replicas),
            )
            for index, state in sorted(topic.partitions.items())
            if (state.adding_replicas or state.removing_replicas)
            and (wanted is None or (topic.name, index) in wanted)
        ]
        if ongoing:
            topics.append(OngoingTopicReassignment(name=topic.name, partitions=ongoing))
    return m.ListPartitionReassignmentsResponse(
        error_code=ErrorCode.NONE, error_message=None, topics=topics
    )


async def handle_elect_leaders(
    ctx: BrokerContext, request: m.ElectLeadersRequest, access: Access
) -> m.ElectLeadersResponse:
    """Needs ALTER on the cluster (checked before NOT_CONTROLLER, as Kafka does)."""
    partitions = (
        None
        if request.topic_partitions is None
        else {(t.topic, index) for t in request.topic_partitions for index in t.partition_id}
    )
    try:
        refusal = _cluster_refusal(access, AclOperation.ALTER)
        if refusal is not None:
            raise refusal
        if request.election_type not in (PREFERRED_ELECTION, UNCLEAN_ELECTION):
            raise KafkaError(
                ErrorCode.INVALID_REQUEST, f"unknown election type {request.election_type}"
            )
        async with zookeeper_bound(
            ctx.config,
            "electing leaders",
            timeout_ms=request.timeout_ms,
            waiting_for="the controller",
        ):
            outcomes = await _controller(ctx).elect_leaders(
                partitions, unclean=request.election_type == UNCLEAN_ELECTION
            )
    except KafkaError as error:
        # v0 has no top-level error: every partition asked about carries it.
        failed: Outcomes = dict.fromkeys(sorted(partitions or ()), error)
        return m.ElectLeadersResponse(
            error_code=error.code, replica_election_results=_election_results(failed)
        )
    return m.ElectLeadersResponse(
        error_code=ErrorCode.NONE, replica_election_results=_election_results(outcomes)
    )


def _election_results(outcomes: Outcomes) -> list[ReplicaElectionResult]:
    by_topic: dict[str, list[PartitionResult]] = {}
    for (topic, index), outcome in sorted(outcomes.items()):
        by_topic.setdefault(topic, []).append(
            PartitionResult(
                partition_id=index, error_code=_code(outcome), error_message=_message(outcome)
            )
        )
    return [
        ReplicaElectionResult(topic=topic, partition_result=results)
        for topic, results in by_topic.items()
    ]


def _cluster_refusal(access: Access, operation: AclOperation) -> KafkaError | None:
    if access.allows_cluster(operation):
        return None
    return KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")


def _controller(ctx: BrokerContext) -> Controller:
    if ctx.controller is None or not ctx.controller.active:
        raise KafkaError(ErrorCode.NOT_CONTROLLER, f"broker {ctx.broker_id} is not the controller")
    return ctx.controller


def _code(outcome: KafkaError | None) -> int:
    return ErrorCode.NONE if outcome is None else outcome.code


def _message(outcome: KafkaError | None) -> str | None:
    return None if outcome is None else outcome.message or outcome.code.name
