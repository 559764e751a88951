"""Routes decoded requests to their handlers and encodes the responses."""

from __future__ import annotations

import asyncio
import functools

from riverbed.broker.handlers.acls import (
    handle_create_acls,
    handle_delete_acls,
    handle_describe_acls,
)
from riverbed.broker.handlers.admin_topics import (
    handle_create_partitions,
    handle_create_topics,
    handle_delete_topics,
)
from riverbed.broker.handlers.alter_configs import (
    handle_alter_configs,
    handle_incremental_alter_configs,
)
from riverbed.broker.handlers.api_versions import handle_api_versions
from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.handlers.controlled_shutdown import handle_controlled_shutdown
from riverbed.broker.handlers.delete_records import handle_delete_records
from riverbed.broker.handlers.describe_cluster import handle_describe_cluster
from riverbed.broker.handlers.describe_configs import handle_describe_configs
from riverbed.broker.handlers.describe_log_dirs import handle_describe_log_dirs
from riverbed.broker.handlers.describe_producers import handle_describe_producers
from riverbed.broker.handlers.fetch import handle_fetch
from riverbed.broker.handlers.find_coordinator import handle_find_coordinator
from riverbed.broker.handlers.groups import (
    handle_delete_groups,
    handle_describe_groups,
    handle_heartbeat,
    handle_join_group,
    handle_leave_group,
    handle_list_groups,
    handle_sync_group,
)
from riverbed.broker.handlers.init_producer_id import handle_init_producer_id
from riverbed.broker.handlers.list_offsets import handle_list_offsets
from riverbed.broker.handlers.metadata import handle_metadata
from riverbed.broker.handlers.offset_commit import handle_offset_commit
from riverbed.broker.handlers.offset_fetch import handle_offset_fetch
from riverbed.broker.handlers.offset_for_leader_epoch import handle_offset_for_leader_epoch
from riverbed.broker.handlers.produce import handle_produce
from riverbed.broker.handlers.reassignments import (
    handle_alter_partition_reassignments,
    handle_elect_leaders,
    handle_list_partition_reassignments,
)
from riverbed.broker.handlers.transactions import (
    handle_add_offsets_to_txn,
    handle_add_partitions_to_txn,
    handle_describe_transactions,
    handle_end_txn,
    handle_list_transactions,
)
from riverbed.broker.handlers.txn_offset_commit import handle_txn_offset_commit
from riverbed.broker.handlers.write_txn_markers import handle_write_txn_markers
from riverbed.broker.network.response_queue import Deferred, Response
from riverbed.protocol import messages as m
from riverbed.protocol.connection import RequestHeader, encode_response
from riverbed.protocol.messages import RequestBody, ResponseBody
from riverbed.security.access import Access
from riverbed.security.sasl_server import answer_when_not_authenticating
from riverbed.security.session import Session


class Dispatcher:
    """The server's request handler: one `match` over the request types we implement.

    The codec only yields request types of the APIs in our spec files, so a request that matches
    nothing here is a programming error (a spec file without a handler), not a client's fault.
    Every request is counted per API here (riverbed_requests_total); the server times each one
    from its arrival to the last byte of its response written, and reports it to
    `response_sent` (riverbed_request_duration_seconds), as Kafka's TotalTimeMs includes the
    send.
    """

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx

    async def __call__(
        self, header: RequestHeader, body: RequestBody, session: Session
    ) -> Response | Deferred:
        request_type = type(body).__name__
        self._ctx.metrics.api(request_type).requests.inc()
        access = self._ctx.access(session, request_type)
        if isinstance(body, m.ProduceRequest):
            outcome = await handle_produce(self._ctx, body, access)
            if isinstance(outcome, asyncio.Future):
                return Deferred(outcome, functools.partial(encode_response, header))
            return None if outcome is None else encode_response(header, outcome)
        response = await self._handle(header, body, session, access)
        if response is None:
            return None
        return encode_response(header, response)

    def response_sent(self, request_type: str, seconds: float) -> None:
        """The server wrote the last byte of a `request_type` response (or, for a request
        without one, finished it) `seconds` after the request arrived."""
        self._ctx.metrics.api(request_type).seconds.observe(seconds)

    async def _handle(
        self, header: RequestHeader, body: RequestBody, session: Session, access: Access
    ) -> ResponseBody | None:
        """Every handler but ApiVersions' gets the request's `access` and checks it first."""
        ctx, version = self._ctx, header.api_version
        match body:
            case m.FetchRequest():
                return await handle_fetch(ctx, body, version, access)
            case m.ListOffsetsRequest():
                return await handle_list_offsets(ctx, body, access)
            case m.MetadataRequest():
                return await handle_metadata(ctx, body, version, access, session.listener)
            case m.ApiVersionsRequest():
                return await handle_api_versions(body)
            case m.CreateTopicsRequest():
                return await handle_create_topics(ctx, body, access)
            case m.DeleteTopicsRequest():
                return await handle_delete_topics(ctx, body, version, access)
            case m.CreatePartitionsRequest():
                return await handle_create_partitions(ctx, body, access)
            case m.DescribeConfigsRequest():
                return await handle_describe_configs(ctx, body, version, access)
            case m.FindCoordinatorRequest():
                return await handle_find_coordinator(ctx, body, version, access, session.listener)
            case m.AlterConfigsRequest():
                return await handle_alter_configs(ctx, body, access)
            case m.IncrementalAlterConfigsRequest():
                return await handle_incremental_alter_configs(ctx, body, access)
            case m.InitProducerIdRequest():
                return await handle_init_producer_id(ctx, body, version, access)
            case m.AddPartitionsToTxnRequest():
                return await handle_add_partitions_to_txn(ctx, body, version, access)
            case m.AddOffsetsToTxnRequest():
                return await handle_add_offsets_to_txn(ctx, body, version, access)
            case m.EndTxnRequest():
                return await handle_end_txn(ctx, body, version, access)
            case m.DescribeTransactionsRequest():
                return await handle_describe_transactions(ctx, body, access)
            case m.ListTransactionsRequest():
                return await handle_list_transactions(ctx, body, access)
            case m.ControlledShutdownRequest():
                return await handle_controlled_shutdown(ctx, body, access)
            case m.OffsetForLeaderEpochRequest():
                return await handle_offset_for_leader_epoch(ctx, body, access)
            case m.OffsetCommitRequest():
                return await handle_offset_commit(ctx, body, access)
            case m.OffsetFetchRequest():
                return await handle_offset_fetch(ctx, body, version, access)
            case m.TxnOffsetCommitRequest():
                return await handle_txn_offset_commit(ctx, body, version, access)
            case m.JoinGroupRequest():
                # Kafka names a member's host as Java's InetAddress.toString() does: "/<ip>".
                client_id = header.client_id or ""
                return await handle_join_group(
                    ctx, body, version, client_id, f"/{session.client_host}", access
                )
            case m.SyncGroupRequest():
                return await handle_sync_group(ctx, body, version, access)
            case m.HeartbeatRequest():
                return await handle_heartbeat(ctx, body, access)
            case m.LeaveGroupRequest():
                return await handle_leave_group(ctx, body, version, access)
            case m.DescribeGroupsRequest():
                return await handle_describe_groups(ctx, body, access)
            case m.ListGroupsRequest():
                return await handle_list_groups(ctx, body, access)
            case m.DeleteGroupsRequest():
                return await handle_delete_groups(ctx, body, access)
            case m.AlterPartitionReassignmentsRequest():
                return await handle_alter_partition_reassignments(ctx, body, access)
            case m.ListPartitionReassignmentsRequest():
                return await handle_list_partition_reassignments(ctx, body, access)
            case m.ElectLeadersRequest():
                return await handle_elect_leaders(ctx, body, access)
            case m.DeleteRecordsRequest():
                return await handle_delete_records(ctx, body, access)
            case m.DescribeLogDirsRequest():
                return await handle_describe_log_dirs(ctx, body, access)
            case m.DescribeClusterRequest():
                return await handle_describe_cluster(ctx, body, access, session.listener)
            case m.DescribeAclsRequest():
                return await handle_describe_acls(ctx, body, access)
            case m.CreateAclsRequest():
                return await handle_create_acls(ctx, body, access)
            case m.DeleteAclsRequest():
                return await handle_delete_acls(ctx, body, access)
            case m.WriteTxnMarkersRequest():
                return await handle_write_txn_markers(ctx, body, access)
            case m.DescribeProducersRequest():
                return await handle_describe_producers(ctx, body, access)
            case m.SaslHandshakeRequest() | m.SaslAuthenticateRequest():
                # SASL listeners answer these in the server's authenticator; here they came on a
                # listener without SASL: ILLEGAL_SASL_STATE, as Kafka's request handlers answer.
                return answer_when_not_authenticating(body)
        raise TypeError(f"no handler for {type(body).__name__} (api key {header.api_key})")
